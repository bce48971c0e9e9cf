"""Progress on stderr: a live line on a terminal, plain lines otherwise; elapsed time and ETA.

A step (one measurement of one run) can take a minute on slow storage, so the display must
not wait for the step to end to show that the run is alive: a ticker thread redraws the
terminal line every ``tick_s`` (elapsed time, time in the step, ETA). Without a terminal (CI
logs, pipes, files) each step prints one line, and a step that runs long prints a "still
running" line every ``heartbeat_s``, so logs stay readable and use no terminal control codes.

The ETA adds up an estimate for every step left, minus the time already spent in the current
step. A step has a *kind* (``("throughput", "kvtier", "2 MiB")``: the measurement, the tier,
the block size); its estimate is the mean duration of the finished steps of the same kind,
else of the same measurement and tier at another block size, else of the same measurement. A
step whose measurement has not run yet has no estimate: the ETA is then a lower bound ("at
least"), because no rate measured on another measurement carries over (a throughput step's
time scales with the data moved, a scheduler-loop step's idle loop and a latency step's
one-at-a-time loads do not, which made the first estimates up to four times too short).
Steps without a kind (a plain count or weights) share the time per unit of weight measured on
the finished steps.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Step:
    """One step of a run: what it measures, most general first (``("latency", "vllm",
    "256 KiB")``), and its share of the progress bar."""

    kind: tuple[str, ...] = ()
    weight: float = 1.0


class Progress:
    """Counts the steps of a run and shows where it is, how long it took, how long is left.

    ``steps``: the number of steps (each of weight 1), the weight of each step in order, or
    each :class:`Step` in order. ``clock``: where the time comes from (tests pass their own).
    """

    def __init__(
        self,
        steps: int | Sequence[float] | Sequence[Step],
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        tick_s: float = 0.5,
        heartbeat_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._clock = clock
        if isinstance(steps, int):
            plan = [Step()] * steps
        else:
            plan = [s if isinstance(s, Step) else Step(weight=float(s)) for s in steps]
        plan = plan or [Step()]
        self._weights = [s.weight for s in plan]
        self._kinds = [s.kind for s in plan]
        self._total_weight = sum(self._weights)
        self._done = 0
        self._done_weight = 0.0
        self._start = clock()
        self._done_elapsed = 0.0  # elapsed time when the last step finished
        #: Durations of the finished steps, under each prefix of their kind.
        self._durations: dict[tuple[str, ...], list[float]] = {}
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
        """Seconds left, estimated; None before the first step has finished. A lower bound
        while some step left has no estimate yet (see :meth:`estimate`)."""
        estimate = self.estimate(now)
        return None if estimate is None else estimate[0]

    def estimate(self, now: float | None = None) -> tuple[float, bool] | None:
        """(seconds left, whether every step left had an estimate); None before the first
        step has finished. With False, the seconds are a lower bound."""
        if self._done == 0:
            return None
        now = self._clock() if now is None else now
        total, complete = 0.0, True
        for index in range(self._done, len(self._weights)):
            step_s = self._step_estimate(index)
            if step_s is None:
                complete = False
                continue
            if index == self._done:
                # The current step counts down from its estimate but never below zero, so a
                # step that runs long does not eat into the estimate for the steps after it.
                step_s = max(0.0, step_s - (now - self._step_start))
            total += step_s
        return total, complete

    def _step_estimate(self, index: int) -> float | None:
        kind = self._kinds[index]
        if not kind:  # no kind: the time per unit of weight of the finished steps
            if self._done_weight <= 0:
                return None
            return self._done_elapsed / self._done_weight * self._weights[index]
        for n in range(len(kind), 0, -1):
            durations = self._durations.get(kind[:n])
            if durations:
                return statistics.fmean(durations)
        return None

    def step(self, label: str) -> None:
        """Announce the step about to run."""
        with self._lock:
            self._label = label
            self._step_start = self._clock()
            if self._enabled:
                self._show(announce=True)

    def advance(self) -> None:
        """Mark the step announced last as finished."""
        with self._lock:
            now = self._clock()
            if self._done < len(self._weights):
                self._done_weight += self._weights[self._done]
                # From the end of the step before (the set-up between steps belongs to the
                # step it prepares), so the durations add up to the run's time.
                duration = now - self._start - self._done_elapsed
                kind = self._kinds[self._done]
                for n in range(1, len(kind) + 1):
                    self._durations.setdefault(kind[:n], []).append(duration)
            self._done = min(len(self._weights), self._done + 1)
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
                now = self._clock()
                if self._is_tty:
                    if self._bar_shown:
                        self._show(announce=False)
                elif self._label and now - self._last_line >= self._heartbeat_s:
                    self._show(announce=False)

    def _timing(self, now: float, *, in_step: bool = False) -> str:
        elapsed = f"{format_duration(now - self._start)} elapsed"
        if in_step:
            elapsed += f" (this step {format_duration(now - self._step_start)})"
        estimate = self.estimate(now)
        if estimate is None:
            left = "estimating time left"
        elif estimate[1]:
            left = f"about {format_duration(estimate[0])} left"
        else:  # some steps left have not run once: what is known so far, at least
            left = f"at least {format_duration(estimate[0])} left"
        return f"{elapsed}, {left}"

    def _show(self, *, announce: bool) -> None:
        """Draw the state (the caller holds the lock)."""
        now = self._clock()
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
