"""The one exception `kvtier bench` turns into a one-line error and exit code 2."""

from __future__ import annotations


class BenchError(Exception):
    """A problem the user can fix (bad argument, unusable root, too little space).

    The message is printed as ``kvtier bench: error: <message>``; it must be one line that
    says what was wrong and, where it helps, what to do.
    """
