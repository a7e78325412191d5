"""A plain-text progress bar, shared by ``cfmaps build`` and ``cfmaps demo``."""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import IO

__all__ = ["ProgressBar"]


class ProgressBar:
    """A plain-text progress bar on a stream, safe to call from worker threads.

    On a terminal it redraws one line (at most ten times a second); otherwise it prints a
    line at every tenth of the way, so logs stay readable.
    """

    def __init__(self, label: str, stream: IO[str] | None = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._last_draw = 0.0
        self._last_step = -1
        self._frac = 0.0
        self._closed = False

    def __call__(self, fraction: float) -> None:
        try:
            frac = min(max(float(fraction), 0.0), 1.0)
        except (TypeError, ValueError):
            return
        with self._lock:
            if self._closed or not math.isfinite(frac):
                return
            self._frac = max(self._frac, frac)
            now = time.perf_counter()
            if self.tty:
                if now - self._last_draw >= 0.1 or self._frac >= 1.0:
                    self._draw(now)
            else:
                step = int(self._frac * 10)
                if step > self._last_step:
                    self._last_step = step
                    self._draw(now)

    def render(self, now: float | None = None) -> str:
        """The bar as text, e.g. ``building maps [#########.....]  60%  3.2s``."""
        elapsed = (time.perf_counter() if now is None else now) - self.t0
        filled = int(round(self._frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {self._frac * 100:3.0f}%  {elapsed:.1f}s"

    def _draw(self, now: float) -> None:
        self._last_draw = now
        if self.tty:
            self.stream.write("\r" + self.render(now))
        else:
            self.stream.write(self.render(now) + "\n")
        self.stream.flush()

    def close(self, done: bool = True) -> None:
        """Finish the bar (at 100 % when ``done``) and end its line."""
        with self._lock:
            if self._closed:
                return
            if done:
                self._frac = 1.0
            if self.tty or (done and self._last_step < 10):
                self._draw(time.perf_counter())
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()
            self._closed = True
