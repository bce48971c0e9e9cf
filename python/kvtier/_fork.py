"""What a forked child may do with the kvtier objects it inherited: nothing.

A child forked from a process that uses kvtier inherits its tiers but none of their threads
(the native workers, the lookup and capacity threads), and a lock that another thread held
at the fork stays locked in the child for ever. So an object made by another process
refuses to work in this one (:class:`~kvtier.errors.ForkedProcessError`, a ``RuntimeError``)
and its teardown does nothing (its threads, budget lease and files belong to the parent,
which goes on using them), and module-level state (locks, per-process registries) is reset
in the child through :func:`after_fork_in_child`. A child that needs a tier creates its own.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from kvtier.errors import ForkedProcessError

_pid = os.getpid()
_child_hooks: list[Callable[[], None]] = []

F = TypeVar("F", bound=Callable[..., Any])


def _in_forked_child() -> None:
    global _pid
    _pid = os.getpid()
    for hook in _child_hooks:
        hook()


os.register_at_fork(after_in_child=_in_forked_child)


def this_process() -> int:
    """This process's pid (no system call: refreshed at fork)."""
    return _pid


def inherited(owner_pid: int) -> bool:
    """Whether an object made by process ``owner_pid`` was inherited through fork()."""
    return owner_pid != _pid


def after_fork_in_child(hook: Callable[[], None]) -> Callable[[], None]:
    """Run ``hook`` in every child forked from now on, before anything else there uses
    kvtier (decorator)."""
    _child_hooks.append(hook)
    return hook


def refuse_inherited(what: str, owner_pid: int) -> NoReturn:
    """Raise the error for using ``what``, made by ``owner_pid``, in a forked child."""
    raise ForkedProcessError(
        f"{what} was created in process {owner_pid} and cannot be used in a process forked "
        f"from it (pid {_pid}): its threads do not exist here; create a new one in this "
        "process, or start child processes with the 'spawn' or 'forkserver' method"
    )


def owner_process_only(method: F) -> F:
    """Method decorator: refuse the call in a forked child (see the module's docstring).
    The instance records the process that made it in ``_owner_pid``."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._owner_pid != _pid:
            refuse_inherited(type(self).__name__, self._owner_pid)
        return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]


__all__ = [
    "after_fork_in_child",
    "inherited",
    "owner_process_only",
    "refuse_inherited",
    "this_process",
]
