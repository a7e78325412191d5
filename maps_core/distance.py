"""Distance kernels shared by the KD-tree search and the mixed-region search.

Point-to-box distances under a constraint box (the per-coordinate terms are monotone under
enlarging an interval, which keeps every key an admissible bound), in the accumulated form
of :mod:`maps_core._norms`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from ._norms import acc, key

# Kernels that never allocate are compiled without the runtime's reference counting
# (``_nrt=False``, numba's switch for code that needs no runtime allocation; a kernel that
# tried to allocate would fail to compile). Numba cannot prune the counting of array
# arguments in functions with loops and early exits (numba issues #2345, #2350): each
# call paid one atomic increment and decrement per array. ``_rect_dist`` costs 67 ns a
# call without them against 297 ns with them; on PD the counting took ~18% of the
# mixed-region search (perf).
NO_NRT: dict[str, Any] = {"cache": True, "nogil": True, "_nrt": False}

#: ``gcol[f]`` of a nominal feature (:class:`maps_core.schema.Feature` ``type="nominal"``):
#: its values are category codes, and moving to another code costs its weight, once,
#: whatever the codes (a group column has its group's index, a plain feature -1).
NOMINAL = -2


@njit(**NO_NRT)
def gap_term(x, w, f, lo_f, hi_f, coff, clow, cupp):
    """Weighted distance from ``x[f]`` to the cells ``lo_f..hi_f`` of feature ``f`` (the
    grid's per-feature offsets ``coff`` and cell ends ``clow``, ``cupp``), ignoring
    integral rounding: a lower bound of any admissible point's term."""
    a = clow[coff[f] + lo_f]
    if x[f] < a:
        return w[f] * (a - x[f])
    b = cupp[coff[f] + hi_f]
    if x[f] > b:
        return w[f] * (x[f] - b)
    return 0.0


@njit(**NO_NRT)
def nominal_gap(x, w, f, lo_f, hi_f, coff, clow, cupp):
    """:func:`gap_term` of a nominal feature: 0 when ``x[f]`` lies in the cells
    ``lo_f..hi_f``, else its switching cost ``w[f]`` (a lower bound, as there)."""
    if clow[coff[f] + lo_f] <= x[f] <= cupp[coff[f] + hi_f]:
        return 0.0
    return w[f]


@njit(**NO_NRT)
def groups_cost(norm, total, changes, a0, a1, gstart, gcols, gcost, xcat):
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
            total = acc(norm, total, gcost[g])
            changes += 1
    return total, changes, True


@njit(**NO_NRT)
def box_dist(x, w, norm, cmin, cmax, integral, lo, hi, i, gcol, gstart, gcols, gcost, xcat, a0,
             a1):
    """Distance from ``x`` to the closed box ``[lo[i], hi[i]]`` within the constraint box.

    Takes the row index rather than the row: slicing ``lo[i]`` in the caller makes an
    array view, whose reference counting (an atomic increment and decrement each) took
    about half of a KD-tree descent's time (perf, FI 100x5)."""
    total = 0.0
    changes = 0
    for f in range(x.shape[0]):
        a = max(lo[i, f], cmin[f])
        b = min(hi[i, f], cmax[f])
        if integral[f]:
            a = np.ceil(a)  # not math.ceil: in numba it returns an int64, garbage at +-inf
            b = np.floor(b)
        if a > b:
            return np.inf
        if gcol[f] >= 0:
            a0[f] = a <= 0.0
            a1[f] = b >= 1.0
            continue
        v = x[f]
        if v < a or v > b:
            # a nominal feature switches code at its weight, however far the codes
            total = acc(norm, total, w[f] if gcol[f] == NOMINAL else
                        w[f] * (a - v if v < a else v - b))
            changes += 1
    if gcost.shape[0]:
        total, changes, ok = groups_cost(norm, total, changes, a0, a1, gstart, gcols, gcost, xcat)
        if not ok:
            return np.inf
    return key(norm, total, changes)


@njit(**NO_NRT)
def rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp, clcl, cucl, bound,
              gcol, gstart, gcols, gcost, xcat, a0, a1):
    """Exact (infimum over real inputs) distance to rectangle ``r`` under the constraints;
    inf if no legal input of it meets them.

    The rectangle's ends are the real cell bounds ``clow``/``cupp`` with their closed
    flags ``clcl``/``cucl`` (see :class:`maps_core.grid.Grid`); the constraint box is
    closed. Stops early (returning inf) once the partial cost reaches ``bound``.
    """
    total = 0.0
    changes = 0
    for f in range(x.shape[0]):
        g = coff[f] + rlo[r, f]
        h = coff[f] + rhi[r, f]
        a = clow[g]
        a_open = not clcl[g]
        b = cupp[h]
        b_open = not cucl[h]
        if cmin[f] > a:
            a = cmin[f]
            a_open = False
        if cmax[f] < b:
            b = cmax[f]
            b_open = False
        if integral[f]:
            a = np.ceil(a)  # not math.ceil: in numba it returns an int64, garbage at +-inf
            b = np.floor(b)
            a_open = b_open = False
        if a > b or ((a_open or b_open) and a >= b):
            return np.inf
        if a_open and b_open and np.nextafter(a, np.inf) >= b:
            return np.inf  # no float64 between the two open ends: nothing to return
        if gcol[f] >= 0:
            a0[f] = a <= 0.0
            a1[f] = b >= 1.0
            continue
        v = x[f]
        if gcol[f] == NOMINAL:  # integral: no open end left; another code costs its weight
            if v < a or v > b:
                total = acc(norm, total, w[f])
                changes += 1
        elif v < a or (a_open and v == a):  # x at an open end must move (by an ulp)
            total = acc(norm, total, w[f] * (a - v))
            changes += 1
        elif v > b or (b_open and v == b):
            total = acc(norm, total, w[f] * (v - b))
            changes += 1
        if key(norm, total, changes) >= bound:
            return np.inf
    if gcost.shape[0]:
        total, changes, ok = groups_cost(norm, total, changes, a0, a1, gstart, gcols, gcost, xcat)
        if not ok:
            return np.inf
    d = key(norm, total, changes)
    return np.inf if d >= bound else d


__all__ = ["NOMINAL", "NO_NRT", "box_dist", "gap_term", "groups_cost", "nominal_gap", "rect_dist"]
