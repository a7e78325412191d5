"""The search's priority queue and growable buffers (numba kernels).

The queue is a binary min-heap of float keys with int64 values in two parallel arrays.
A value is either a *slot* (``>= 0``: a pending box of a mixed region, see
:mod:`maps_core.lazy`) or an encoded KD-tree node (:func:`kd_entry`), so one queue holds
both kinds of entry.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .distance import NO_NRT


@njit(**NO_NRT)
def push(keys, vals, n, key, val):
    """Add ``key``, ``val`` to the heap of ``n`` entries (room for one more is the caller's
    job); returns the new size."""
    return _push(keys, vals, n, key, val, False)


@njit(**NO_NRT)
def push_first(keys, vals, n, key, val):
    """:func:`push` ahead of the entries of an equal key: popped next when ``key`` is no
    larger than any other."""
    return _push(keys, vals, n, key, val, True)


@njit(inline="always")
def _push(keys, vals, n, key, val, first):
    i = n
    keys[i] = key
    vals[i] = val
    while i > 0:
        p = (i - 1) // 2
        if keys[p] < keys[i] or (keys[p] == keys[i] and not first):
            break
        keys[p], keys[i] = keys[i], keys[p]
        vals[p], vals[i] = vals[i], vals[p]
        i = p
    return n + 1


@njit(**NO_NRT)
def pop(keys, vals, n):
    """Remove the smallest entry; returns (key, value, new size)."""
    key = keys[0]
    val = vals[0]
    n -= 1
    keys[0] = keys[n]
    vals[0] = vals[n]
    i = 0
    while True:
        lft = 2 * i + 1
        if lft >= n:
            break
        c = lft
        if lft + 1 < n and keys[lft + 1] < keys[lft]:
            c = lft + 1
        if keys[i] <= keys[c]:
            break
        keys[c], keys[i] = keys[i], keys[c]
        vals[c], vals[i] = vals[i], vals[c]
        i = c
    return key, val, n


@njit(cache=True, nogil=True, inline="always")
def kd_entry(node, owner):
    """Queue value of KD-tree node ``node``; ``owner`` (0 or 1) marks the one class tree
    whose mixed regions are searched (each mixed region sits in every class tree)."""
    return -1 - (2 * node + owner)


@njit(cache=True, nogil=True, inline="always")
def is_kd(val):
    """Whether a queue value is a KD-tree node (else it is a slot)."""
    return val < 0


@njit(cache=True, nogil=True, inline="always")
def kd_node(val):
    """KD-tree node of a queue value made by :func:`kd_entry`."""
    return (-1 - val) >> 1


@njit(cache=True, nogil=True, inline="always")
def kd_owner(val):
    """Owner flag of a queue value made by :func:`kd_entry`."""
    return (-1 - val) & 1


@njit(cache=True, nogil=True)
def grow_to(a, n):
    """``a`` copied into a buffer of exactly ``n >= len(a)`` rows: for the box slots, whose
    count is a memory budget (:func:`grow` would double past it)."""
    out = np.empty((n,) + a.shape[1:], dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True, nogil=True)
def grow(a, n):
    """``a`` copied into a buffer with room for at least ``n`` rows (doubling)."""
    return grow_to(a, max(2 * a.shape[0], n))


@njit(**NO_NRT)
def slot(free, n_free, n_used):
    """A slot for a pending box: a recycled one, else the next new one (the caller has
    made room). Returns (slot, n_free, n_used)."""
    if n_free > 0:
        return free[n_free - 1], n_free - 1, n_used
    return n_used, n_free, n_used + 1


__all__ = ["grow", "grow_to", "is_kd", "kd_entry", "kd_node", "kd_owner", "pop", "push", "slot"]
