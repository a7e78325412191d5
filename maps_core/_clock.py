"""A clock for compiled code (the deadlines of the search and of its guesses), which is
also how a search under way learns that its caller cancelled it: in a thread that
watches a cancel event (:func:`watching`), the clock jumps to :data:`CANCELLED` once the
event is set, so every deadline has passed and the search stops at its next reading, as
out of time (the caller then raises :class:`~maps_core.QueryCancelledError`)."""

from __future__ import annotations

import threading
import time

from numba import njit, objmode

#: The clock's reading in a thread whose cancel event is set: past any deadline
#: (``t0 + max_seconds`` from an earlier reading), and so far past that a deadline taken
#: from it (``CANCELLED + max_seconds``) rounds back to it and has passed too.
CANCELLED = 1e300

_watch = threading.local()


def _now() -> float:
    """``time.perf_counter()``, or :data:`CANCELLED` once this thread's event is set."""
    event = getattr(_watch, "cancel", None)
    if event is not None and event.is_set():
        return CANCELLED
    return time.perf_counter()


class watching:  # noqa: N801  (a context manager, named as a function is)
    """Within the block, :func:`clock` in this thread reads :data:`CANCELLED` once
    ``cancel`` is set (None: never). Each thread that runs a search sets its own. A class
    rather than a generator: entered around every search, it costs a fraction of a
    microsecond."""

    __slots__ = ("before", "cancel")

    def __init__(self, cancel: threading.Event | None) -> None:
        self.cancel = cancel
        self.before: threading.Event | None = None

    def __enter__(self) -> None:
        self.before = getattr(_watch, "cancel", None)
        _watch.cancel = self.cancel

    def __exit__(self, *exc: object) -> None:
        _watch.cancel = self.before


@njit(cache=True)
def clock():
    """``time.perf_counter()`` for compiled code (or :data:`CANCELLED`, see
    :func:`watching`): one call in object mode, which takes the GIL for its duration
    (about 1 us). A function of its own, compiled without ``nogil``: inside a ``nogil``
    one, numba warns at every load that object mode runs serially."""
    with objmode(t="float64"):
        t = _now()
    return t


__all__ = ["CANCELLED", "clock", "watching"]
