"""A log that cannot be flooded: a dead disk fails every job, but the log stays readable."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class RateLimitedLog:
    """At most ``burst`` messages per ``window`` seconds, so a dead disk cannot flood the log.

    Suppressed messages are counted and the count is reported with the next one let through.
    """

    def __init__(self, logger: logging.Logger, burst: int = 10, window: float = 60.0) -> None:
        self._logger = logger
        self._burst = burst
        self._window = window
        self._lock = threading.Lock()
        self._window_start = -float("inf")
        self._emitted = 0
        self._suppressed = 0

    def error(self, msg: str, *args: Any) -> None:
        """Log at ERROR level (a failed job), unless the burst for this window is spent."""
        now = time.monotonic()
        with self._lock:
            if now - self._window_start >= self._window:
                self._window_start, self._emitted = now, 0
            if self._emitted >= self._burst:
                self._suppressed += 1
                return
            self._emitted += 1
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            self._logger.error("%d similar messages suppressed", suppressed)
        self._logger.error(msg, *args)
