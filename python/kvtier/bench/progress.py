"""Progress on stderr: a redrawn bar on a terminal, one plain line per step otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts the steps of a run and shows where it is.

    On a TTY the bar is redrawn in place (``\\r``); elsewhere (CI logs, pipes, files) each
    step prints one line, so logs stay readable and nothing depends on terminal control codes.
    """

    def __init__(self, total_steps: int, *, enabled: bool = True, stream: TextIO | None = None):
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._total = max(1, total_steps)
        self._done = 0
        self._start = time.monotonic()
        self._is_tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._bar_shown = False

    @property
    def done(self) -> int:
        return self._done

    def step(self, label: str) -> None:
        """Announce the step about to run."""
        if not self._enabled:
            return
        self._show(label)

    def advance(self) -> None:
        """Mark the step announced last as finished."""
        self._done = min(self._total, self._done + 1)
        if self._enabled and self._is_tty:
            self._show("")

    def message(self, text: str) -> None:
        """A line of information that must not be lost in the bar (skips, fallbacks)."""
        if not self._enabled:
            return
        self._clear()
        print(f"kvtier bench: {text}", file=self._stream, flush=True)

    def close(self) -> None:
        if self._enabled and self._is_tty and self._bar_shown:
            self._show("done")
            self._stream.write("\n")
            self._stream.flush()
            self._bar_shown = False

    def _show(self, label: str) -> None:
        elapsed = time.monotonic() - self._start
        fraction = self._done / self._total
        if self._is_tty:
            width = 28
            filled = int(round(width * fraction))
            bar = "#" * filled + "-" * (width - filled)
            line = f"[{bar}] {fraction * 100:3.0f}% {elapsed:5.0f}s {label}"
            self._stream.write("\r" + line[:100].ljust(100))
            self._stream.flush()
            self._bar_shown = True
        elif label:
            print(
                f"kvtier bench: [{self._done + 1}/{self._total}] {label} ({elapsed:.0f}s)",
                file=self._stream,
                flush=True,
            )

    def _clear(self) -> None:
        if self._is_tty and self._bar_shown:
            self._stream.write("\r" + " " * 100 + "\r")
            self._stream.flush()
            self._bar_shown = False
