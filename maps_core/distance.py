"""Distance kernels shared by the KD-tree search and the mixed-region search.

Point-to-box distances under a constraint box (the per-coordinate terms are monotone under
enlarging an interval, which keeps every key an admissible bound), and a binary heap.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

# Kernels that never allocate are compiled without the runtime's reference counting
# (``_nrt=False``, numba's switch for code that needs no runtime allocation; a kernel that
# tried to allocate would fail to compile). Numba cannot prune the counting of array
# arguments in functions with loops and early exits (numba issues #2345, #2350): each
# call paid one atomic increment and decrement per array. ``_rect_dist`` costs 67 ns a
# call without them against 297 ns with them; on PD the counting took ~18% of the
# mixed-region search (perf).
NO_NRT: dict[str, Any] = {"cache": True, "nogil": True, "_nrt": False}


@njit(cache=True, nogil=True, inline="always")
def _acc(norm, total, term):
    if norm == 0 or norm == 3:
        return total + term
    if norm == 1:
        return total + term * term
    return max(total, term)


@njit(cache=True, nogil=True, inline="always")
def _key(norm, total, changes):
    """Search key: the accumulated cost, or for ``l0`` the pair (changes, weighted l1)
    folded into one float, ordered lexicographically: ``changes + l1 / (1 + l1)``.

    The fraction is kept below 1 so the number of changes is always exact. The l1
    tie-break is resolved to float64 precision of the folded key: two l1 values are told
    apart when they differ by more than about ``2e-16 * (1 + l1) ** 2`` (with the default
    unit-free weights l1 is at most a few units, so ties are broken exactly in practice).
    """
    if norm == 3:
        return changes + min(total / (1.0 + total), 0.9999999999999998)
    return total


@njit(**NO_NRT)
def _groups_cost(norm, total, changes, a0, a1, gstart, gcols, gcost, xcat):
    """Add the one-hot groups' switching costs given which values (0 / 1) each dummy
    column may take (``a0``, ``a1``). A group may stay on x's category when that column
    may be 1 and all others 0; otherwise it switches (one change, cost ``gcost[g]``) to a
    category whose column may be 1 while all others may be 0. Returns (total, changes,
    feasible)."""
    for g in range(gcost.shape[0]):
        forced = -1
        n_forced = 0
        any1 = False
        for i in range(gstart[g], gstart[g + 1]):
            j = gcols[i]
            if not a0[j]:
                forced = j
                n_forced += 1
            if a1[j]:
                any1 = True
        if n_forced > 1 or not any1:
            return total, changes, False
        cur = xcat[g]
        stay = forced == cur if n_forced == 1 else a1[cur]
        if not stay:
            total = _acc(norm, total, gcost[g])
            changes += 1
    return total, changes, True


@njit(**NO_NRT)
def _box_dist(x, w, norm, cmin, cmax, integral, lo, hi, gcol, gstart, gcols, gcost, xcat, a0, a1):
    """Distance from ``x`` to the closed box ``[lo, hi]`` within the constraint box."""
    total = 0.0
    changes = 0
    for f in range(x.shape[0]):
        a = max(lo[f], cmin[f])
        b = min(hi[f], cmax[f])
        if integral[f]:
            a = math.ceil(a)
            b = math.floor(b)
        if a > b:
            return np.inf
        if gcol[f] >= 0:
            a0[f] = a <= 0.0
            a1[f] = b >= 1.0
            continue
        v = x[f]
        if v < a:
            total = _acc(norm, total, w[f] * (a - v))
            changes += 1
        elif v > b:
            total = _acc(norm, total, w[f] * (v - b))
            changes += 1
    if gcost.shape[0]:
        total, changes, ok = _groups_cost(norm, total, changes, a0, a1, gstart, gcols, gcost, xcat)
        if not ok:
            return np.inf
    return _key(norm, total, changes)


@njit(**NO_NRT)
def _rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp, clcl, bound,
               gcol, gstart, gcols, gcost, xcat, a0, a1):
    """Exact (infimum) distance to rectangle ``r`` under the constraints; inf if empty.

    Stops early (returning inf) once the partial cost reaches ``bound``.
    """
    total = 0.0
    changes = 0
    for f in range(x.shape[0]):
        g = coff[f] + rlo[r, f]
        a = clow[g]
        is_open = not clcl[g]
        b = cupp[coff[f] + rhi[r, f]]
        if cmin[f] > a:
            a = cmin[f]
            is_open = False
        if cmax[f] < b:
            b = cmax[f]
            if is_open and not integral[f]:
                # The constraint may leave no float32 value above the open end.
                inside = np.float64(np.nextafter(np.float32(a), np.float32(np.inf)))
                if inside > b:
                    return np.inf
        if integral[f]:
            a = math.ceil(a)
            b = math.floor(b)
            is_open = False
        if a > b or (is_open and a >= b):
            return np.inf
        if gcol[f] >= 0:
            a0[f] = a <= 0.0
            a1[f] = b >= 1.0
            continue
        v = x[f]
        if v < a or (is_open and v == a):  # x at an open end must move (by an ulp)
            total = _acc(norm, total, w[f] * (a - v))
            changes += 1
        elif v > b:
            total = _acc(norm, total, w[f] * (v - b))
            changes += 1
        if _key(norm, total, changes) >= bound:
            return np.inf
    if gcost.shape[0]:
        total, changes, ok = _groups_cost(norm, total, changes, a0, a1, gstart, gcols, gcost, xcat)
        if not ok:
            return np.inf
    d = _key(norm, total, changes)
    return np.inf if d >= bound else d


@njit(**NO_NRT)
def _push(keys, vals, n, key, val):
    """Add ``key``, ``val`` to the binary heap of ``n`` entries (room for one more is the
    caller's job); returns the new size."""
    i = n
    keys[i] = key
    vals[i] = val
    while i > 0:
        p = (i - 1) // 2
        if keys[p] <= keys[i]:
            break
        keys[p], keys[i] = keys[i], keys[p]
        vals[p], vals[i] = vals[i], vals[p]
        i = p
    return n + 1


@njit(**NO_NRT)
def _pop(keys, vals, n):
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
