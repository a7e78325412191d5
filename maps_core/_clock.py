"""A clock for compiled code (the deadlines of the search and of its guesses)."""

from __future__ import annotations

import time

from numba import njit, objmode


@njit(cache=True)
def clock():
    """``time.perf_counter()`` for compiled code: one call in object mode, which takes the
    GIL for its duration (about 1 us). A function of its own, compiled without ``nogil``:
    inside a ``nogil`` one, numba warns at every load that object mode runs serially."""
    with objmode(t="float64"):
        t = time.perf_counter()
    return t


__all__ = ["clock"]
