"""Progress on stderr: a live line on a terminal, plain lines otherwise; elapsed time and ETA.

A step (one measurement of one run) can take a minute on slow storage, so the display must
not wait for the step to end to show that the run is alive: a ticker thread redraws the
terminal line every ``tick_s`` (elapsed time, time in the step, ETA). Without a terminal (CI
logs, pipes, files) each step prints one line, and a step that runs long prints a "still
running" line every ``heartbeat_s``, so logs stay readable and use no terminal control codes.

The ETA weighs the steps (a throughput step moves more data than a latency step): the time
per unit of weight measured on the finished steps, times the weight left, minus the time
already spent in the current step.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

_WIDTH = 100  # characters of the terminal line when the terminal does not say


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Counts the steps of a run and shows where it is, how long it took, how long is left.

    ``steps``: the number of steps (each of weight 1), or the weight of each step in order.
    """

    def __init__(
        self,
        steps: int | Sequence[float],
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        tick_s: float = 0.5,
        heartbeat_s: float = 15.0,
    ):
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        weights = [1.0] * steps if isinstance(steps, int) else [float(w) for w in steps]
        self._weights = weights or [1.0]
        self._total_weight = sum(self._weights)
        self._done = 0
        self._done_weight = 0.0
        self._start = time.monotonic()
        self._done_elapsed = 0.0  # elapsed time when the last step finished
        self._step_start = self._start
        self._label = ""
        self._last_line = self._start
        self._is_tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._width = _terminal_width(self._stream) if self._is_tty else _WIDTH
        self._bar_shown = False
        self._heartbeat_s = heartbeat_s
        # The ticker and the measuring thread both write: one line at a time.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if enabled:
            self._ticker = threading.Thread(
                target=self._tick, args=(tick_s,), name="kvtier-bench-progress", daemon=True
            )
            self._ticker.start()

    @property
    def done(self) -> int:
        return self._done

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left, estimated; None before the first step has finished."""
        if self._done_weight <= 0:
            return None
        now = time.monotonic() if now is None else now
        per_weight = self._done_elapsed / self._done_weight
        # The current step counts down from its estimate but never below zero, so a step that
        # runs long does not eat into the estimate for the steps after it.
        current = self._weights[self._done] if self._done < len(self._weights) else 0.0
        after = self._total_weight - self._done_weight - current
        in_step = now - self._step_start
        return per_weight * after + max(0.0, per_weight * current - in_step)

    def step(self, label: str) -> None:
        """Announce the step about to run."""
        with self._lock:
            self._label = label
            self._step_start = time.monotonic()
            if self._enabled:
                self._show(announce=True)

    def advance(self) -> None:
        """Mark the step announced last as finished."""
        with self._lock:
            if self._done < len(self._weights):
                self._done_weight += self._weights[self._done]
            self._done = min(len(self._weights), self._done + 1)
            now = time.monotonic()
            self._done_elapsed = now - self._start
            self._step_start = now
            self._label = ""
            if self._enabled and self._is_tty:
                self._show(announce=False)

    def message(self, text: str) -> None:
        """A line of information that must not be lost in the bar (skips, fallbacks)."""
        if not self._enabled:
            return
        with self._lock:
            redraw = self._bar_shown
            self._clear()
            print(f"kvtier bench: {text}", file=self._stream, flush=True)
            if redraw:
                self._show(announce=False)

    def close(self) -> None:
        """Stop the ticker and end the terminal line; idempotent."""
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
        with self._lock:
            if self._enabled and self._is_tty and self._bar_shown:
                self._label = "done"
                self._show(announce=False)
                self._stream.write("\n")
                self._stream.flush()
                self._bar_shown = False

    def _tick(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            with self._lock:
                if self._stop.is_set():
                    return
                now = time.monotonic()
                if self._is_tty:
                    if self._bar_shown:
                        self._show(announce=False)
                elif self._label and now - self._last_line >= self._heartbeat_s:
                    self._show(announce=False)

    def _timing(self, now: float, *, in_step: bool = False) -> str:
        elapsed = f"{format_duration(now - self._start)} elapsed"
        if in_step:
            elapsed += f" (this step {format_duration(now - self._step_start)})"
        eta = self.eta(now)
        left = "estimating time left" if eta is None else f"about {format_duration(eta)} left"
        return f"{elapsed}, {left}"

    def _show(self, *, announce: bool) -> None:
        """Draw the state (the caller holds the lock)."""
        now = time.monotonic()
        self._last_line = now
        if self._is_tty:
            fraction = self._done_weight / self._total_weight
            width = 12
            filled = int(round(width * fraction))
            bar = "#" * filled + "-" * (width - filled)
            timing = self._timing(now, in_step=bool(self._label) and self._label != "done")
            line = f"[{bar}] {fraction * 100:3.0f}% {timing}: {self._label}"
            self._stream.write("\r" + line[: self._width].ljust(self._width))
            self._stream.flush()
            self._bar_shown = True
            return
        position = f"[{self._done + 1}/{len(self._weights)}]"
        if announce:
            text = f"{position} {self._label} ({self._timing(now)})"
        else:
            in_step = format_duration(now - self._step_start)
            text = f"{position} still running after {in_step} ({self._timing(now)})"
        print(f"kvtier bench: {text}", file=self._stream, flush=True)

    def _clear(self) -> None:
        if self._is_tty and self._bar_shown:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._bar_shown = False


def _terminal_width(stream: TextIO) -> int:
    """Columns of the terminal behind ``stream``, less one (a full line would wrap)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return _WIDTH
    return max(40, columns - 1) if columns > 0 else _WIDTH  # 0: a terminal that does not say
