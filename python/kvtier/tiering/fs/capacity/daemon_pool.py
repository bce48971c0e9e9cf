"""DaemonPool: an executor whose threads never hold interpreter exit.

``concurrent.futures.ThreadPoolExecutor`` registers an exit hook that joins every worker of
every pool before the interpreter finalizes. An unlink stuck in the kernel on a stalled file
system (a frozen FUSE daemon, a hard NFS mount whose server is gone) never returns, and the
exit would wait for it for ever. These threads are daemon threads that nothing joins at exit,
and what they run holds only its own arguments (paths and sizes), so abandoning one there
frees nothing under it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Task = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonPool(Executor):
    """Up to ``workers`` daemon threads named ``name``, started as tasks arrive."""

    def __init__(self, workers: int, name: str) -> None:
        if workers < 1:
            raise ValueError(f"DaemonPool needs at least one worker, got {workers}")
        self._workers = workers
        self._name = name
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a task (under _lock)
        self._shut_down = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new tasks after shutdown")
            self._tasks.put((future, fn, args, kwargs))
            if self._idle > 0:
                self._idle -= 1  # that thread takes it: no new one
            elif len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once the queued tasks ran; ``wait``: join them (on the caller's
        thread, which must then tolerate one that is stuck in the kernel)."""
        with self._lock:
            if self._shut_down:
                threads: list[threading.Thread] = []
            else:
                self._shut_down = True
                threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    task[0].cancel()
        for _ in threads:
            self._tasks.put(None)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            future, fn, args, kwargs = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # handed to whoever waits on the future
                    future.set_exception(e)
            del task, future, fn, args, kwargs  # hold nothing of a task between tasks
            with self._lock:
                self._idle += 1


__all__ = ["DaemonPool"]
