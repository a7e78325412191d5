"""Best-first search of one query: the class KD-trees and, inside them, mixed regions.

One priority queue holds both kinds of entry, keyed by an admissible lower bound of the
distance from ``x``:

* KD-tree nodes of the target classes (key: distance to the node's bounding box). A leaf's
  certified rectangles of a target class are candidates at their exact distance; its
  mixed regions (left unresolved by a budgeted build) join the queue as boxes;
* sub-boxes of mixed regions (key: distance to the box).

The search therefore stops at the true answer's distance: a mixed region near ``x`` that
holds a target point ends the KD-tree descent as soon as that point is found, instead of
after the nearest *certified* target rectangle (PD 100x5 at 5M rectangles, uniform
queries: that descent alone cost 0.75 ms at the median).

A popped box is given a hypothesis class ``a`` (with two classes, the one its bounds come
nearer to certifying; otherwise the exact class of its centre cell), and it is

* dropped when the interval bound, or failing that the sweep bound (each live tree
  projected on one feature, projections on a feature summed before the minimum; see
  :func:`~maps_core.partition._sweep_bounds`), proves ``a`` wins everywhere in it and
  ``a`` is no target class;
* a candidate when the bound certifies it entirely of one target class (its distance is
  exact: the same :func:`~maps_core.distance._rect_dist` as for stored rectangles);
* narrowed and requeued at its new distance when ``a`` is no target class and the sweep's
  per-feature sums prove some end cells hold no target point;
* otherwise split at the cut of some tree's root-most undecided node, the one whose far
  side gains the most distance over the box (l1, l2; for linf and l0 the far side's own
  distance) weighted by the vote spread of the trees undecided at that same cut, and its
  children pushed with their distances.

Only entries nearer than the current k-th best are ever touched, so a query pays for the
part of a mixed region between it and its answer, not for the whole region. Single cells
whose scores nearly tie are handed back to the caller, which labels them with the model.

The k-th best starts at a bound: :func:`best_first` deepens rounds of
:func:`_bounded_search` over a growing radius, and under a finite bound every popped box
is first clipped to the cells that may lie nearer (:func:`_clip_to_ball`). Without it the
bound stays infinite until the first candidate, which is usually the answer, and every
mixed box nearer than the answer is peeled split by split.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .distance import NO_NRT, _box_dist, _pop, _push, _rect_dist
from .partition import (
    SWEEP_REACH,
    _bounds_on,
    _bounds_workspace,
    _grow,
    _label_active,
    _spread_sum,
    _sweep_bounds,
    _sweep_workspace,
)


@njit(cache=True, nogil=True)
def _keep(best, c_lo, c_hi, c_lab, c_d, n_c, lo, hi, lab, d):
    """Record the candidate box ``lo..hi`` of class ``lab`` and enter ``d`` in the sorted
    k best distances ``best`` (updated in place)."""
    if n_c >= c_lo.shape[0]:
        c_lo = _grow(c_lo, n_c + 1)
        c_hi = _grow(c_hi, n_c + 1)
        c_lab = _grow(c_lab, n_c + 1)
        c_d = _grow(c_d, n_c + 1)
    c_lo[n_c] = lo
    c_hi[n_c] = hi
    c_lab[n_c] = lab
    c_d[n_c] = d
    j = best.shape[0] - 1
    while j > 0 and best[j - 1] > d:
        best[j] = best[j - 1]
        j -= 1
    best[j] = d
    return c_lo, c_hi, c_lab, c_d, n_c + 1


@njit(**NO_NRT)
def _clip_to_ball(x, w, norm, gcol, lo, hi, coff, clow, cupp, bound):
    """Drop the end cells of the box ``lo..hi`` (updated in place) that lie at least
    ``bound`` (accumulated form) from ``x`` whatever the other features.

    A cell's distance is bounded below by the box's own terms on the other features plus
    the cell's gap on this one; constraints, integral rounding and one-hot groups only
    add to a distance, so ignoring them keeps the cut conservative (group columns and l0
    are left alone). The cell nearest ``x`` on each feature always stays.
    Without a bound the search must peel the region beyond the answer split by split; with
    one (PD 100x5, oracle bound): 7x fewer boxes per test row, 9x per uniform query.
    """
    if norm > 2:
        return
    m = x.shape[0]
    tot = 0.0  # the box's own key (l1, l2); linf needs none, each feature's room is bound
    for f in range(m if norm != 2 else 0):
        if gcol[f] >= 0:
            continue  # a group's cost is not a per-column gap; 0 is a lower bound
        tf = _gap_term(x, w, f, lo[f], hi[f], coff, clow, cupp)
        tot += tf if norm == 0 else tf * tf
    # A feature's own term never changes when the cells beyond the bound go (its nearest
    # cell stays), so recomputing it below matches the sum above.
    for f in range(m):
        if gcol[f] >= 0 or w[f] <= 0.0:
            continue
        if norm == 2:
            room = bound
        else:
            tf = _gap_term(x, w, f, lo[f], hi[f], coff, clow, cupp)
            room = bound - (tot - (tf if norm == 0 else tf * tf))
            if room <= 0.0:
                continue
            if norm == 1:
                room = np.sqrt(room)
        # cells whose gap alone uses up the room hold no point nearer than bound
        while hi[f] > lo[f] and w[f] * (clow[coff[f] + hi[f]] - x[f]) >= room:
            hi[f] -= 1
        while lo[f] < hi[f] and w[f] * (x[f] - cupp[coff[f] + lo[f]]) >= room:
            lo[f] += 1


@njit(**NO_NRT)
def _gap_term(x, w, f, lo_f, hi_f, coff, clow, cupp):
    """Weighted distance from ``x[f]`` to the cells ``lo_f..hi_f`` of feature ``f``."""
    a = clow[coff[f] + lo_f]
    if x[f] < a:
        return w[f] * (a - x[f])
    b = cupp[coff[f] + hi_f]
    if x[f] > b:
        return w[f] * (x[f] - b)
    return 0.0


@njit(**NO_NRT)
def _slot(free, n_free, n_used):
    """A slot for a pending box: a recycled one, else the next new one (the caller has
    made room). Returns (slot, n_free, n_used)."""
    if n_free > 0:
        return free[n_free - 1], n_free - 1, n_used
    return n_used, n_free, n_used + 1


@njit(cache=True, nogil=True)
def _reachable_cells(cmin, cmax, coff, clow, cupp):
    """Per feature, the first and last cell whose closure meets ``[cmin, cmax]`` (a
    superset of the cells holding admissible points; the exact test is ``_rect_dist``'s),
    two arrays of shape (m,).

    Mixed regions enter the queue clipped to them, so the bounds and the cuts never deal
    with cells no answer can lie in: with immutable features, the trees that cut on them
    are decided at once (PD 100x5, BMI and Age immutable, l2: p99 867 -> 10 ms).
    """
    m = cmin.shape[0]
    klo = np.empty(m, dtype=np.int32)
    khi = np.empty(m, dtype=np.int32)
    for f in range(m):
        j = coff[f]
        while j < coff[f + 1] - 1 and cupp[j] < cmin[f]:
            j += 1
        klo[f] = j - coff[f]
        j = coff[f + 1] - 1
        while j > coff[f] and clow[j] > cmax[f]:
            j -= 1
        khi[f] = j - coff[f]
    return klo, khi


@njit(cache=True, nogil=True)
def best_first(x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat,
               node_lo, node_hi, left, right, kstart, kend, order, class_root, labels, rlo, rhi,
               coff, clow, cupp, clcl,
               nf, ncut, nl, nr, nv, roots, base, tie_high, tol, max_depth_nodes, max_pops,
               radius, growth, max_rounds):
    """The ``k`` nearest boxes of the target classes (``tmask``, shape (n_classes,)).

    ``node_lo..class_root`` are the KD-forest arrays, ``labels``, ``rlo``, ``rhi`` the
    partition's, ``nf..max_depth_nodes`` the ensemble's (:class:`~maps_core.partition.Kernel`).
    Iterative deepening: rounds bounded by ``radius`` (a distance; ``inf`` for a single
    unbounded round), grown by ``growth`` until a round finds the k best (each round is
    exact below its bound), the radius covers every point the constraints allow, or
    ``max_rounds`` rounds failed (then one unbounded round). Each round is
    :func:`_bounded_search`, whose outputs this returns, with the counters summed over
    rounds: (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kd_pops, evaluated, pops, complete).
    """
    far = _farthest(x, w, norm, cmin, cmax, coff, clow, cupp, gcol, gcost)
    klo, khi = _reachable_cells(cmin, cmax, coff, clow, cupp)
    kd_pops = 0
    evaluated = 0
    pops = 0
    for rnd in range(max_rounds + 1):
        if rnd == max_rounds or radius >= far:
            radius = np.inf
        bound = radius * radius if norm == 1 else radius  # accumulated form
        c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kp, ev, po, complete = _bounded_search(
            x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat,
            node_lo, node_hi, left, right, kstart, kend, order, class_root, labels, rlo, rhi,
            coff, clow, cupp, clcl, nf, ncut, nl, nr, nv, roots, base, tie_high, tol,
            max_depth_nodes, max_pops, bound, klo, khi)
        kd_pops += kp
        evaluated += ev
        pops += po
        if not complete or c_d.shape[0] >= k or radius == np.inf:
            return c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kd_pops, evaluated, pops, complete
        radius *= growth
    raise AssertionError("unreachable: the last round is unbounded")


@njit(**NO_NRT)
def _farthest(x, w, norm, cmin, cmax, coff, clow, cupp, gcol, gcost):
    """Largest distance from ``x`` to a point of the domain inside the constraint box
    (``inf`` when the domain is unbounded along a feature); group switches at full cost."""
    total = 0.0
    for f in range(x.shape[0]):
        if gcol[f] >= 0:
            continue
        a = max(cmin[f], clow[coff[f]])
        b = min(cmax[f], cupp[coff[f + 1] - 1])
        d = w[f] * max(x[f] - a, b - x[f], 0.0)
        total = total + d if norm == 0 else max(total, d) if norm == 2 else math.hypot(total, d)
    for g in range(gcost.shape[0]):
        d = gcost[g]
        total = total + d if norm == 0 else max(total, d) if norm == 2 else math.hypot(total, d)
    return total


@njit(cache=True, nogil=True)
def _bounded_search(x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost,
                    xcat, node_lo, node_hi, left, right, kstart, kend, order, class_root, labels,
                    rlo, rhi, coff, clow, cupp, clcl, nf, ncut, nl, nr, nv, roots, base,
                    tie_high, tol, max_depth_nodes, max_pops, bound, klo, khi):
    """One round of :func:`best_first`: the k nearest boxes nearer than ``bound``
    (accumulated form, squared for l2; ``inf`` for no bound). Mixed regions are searched
    within the cells ``klo..khi`` (:func:`_reachable_cells`).

    Returns (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kd_pops, evaluated, pops, complete):
    candidate boxes (certified rectangles or certified sub-boxes of mixed regions, each of
    a target class, with their distances in accumulated form), a superset of the k best;
    near-tie boxes (every cell scores the same, within rounding, so the model's label of
    the centre holds for all) for the caller to label; KD-tree nodes popped; rectangles
    whose exact distance was computed; mixed-region boxes popped; False if ``max_pops`` of
    the latter ran out first.

    While the k-th best distance is finite (``bound`` or a candidate's), every popped box is
    first clipped to the cells that may lie nearer (:func:`_clip_to_ball`).
    """
    m = x.shape[0]
    c = base.shape[0]
    T = roots.shape[0]
    best = np.full(k, bound)
    # Pending boxes live in slots; a popped box's slot is recycled. Queue values: a slot
    # (>= 0), or -1 - (2 * node + owner) for a KD-tree node, where owner marks the one
    # class tree whose mixed regions are searched (each sits in every class tree).
    blo = np.empty((64, m), dtype=np.int32)
    bhi = np.empty((64, m), dtype=np.int32)
    bstart = np.empty((64, T), dtype=np.int32)  # node each tree has surely reached
    bcs = np.empty((64, c))  # base + leaf values of the trees constant on the box
    free = np.empty(64, dtype=np.int64)
    n_free = 0
    n_used = 0
    keys = np.empty(max(64, class_root.shape[0]))
    vals = np.empty(keys.shape[0], dtype=np.int64)
    n = 0
    a0 = np.empty(m, dtype=np.bool_)
    a1 = np.empty(m, dtype=np.bool_)
    owner = 1
    for cl in range(class_root.shape[0]):
        if tmask[cl] and class_root[cl] >= 0:
            nd = class_root[cl]
            d = _box_dist(x, w, norm, cmin, cmax, integral, node_lo[nd], node_hi[nd], gcol,
                          gstart, gcols, gcost, xcat, a0, a1)
            if d < np.inf:
                n = _push(keys, vals, n, d, -1 - (2 * nd + owner))
            owner = 0
    c_lo = np.empty((16, m), dtype=np.int32)
    c_hi = np.empty((16, m), dtype=np.int32)
    c_lab = np.empty(16, dtype=np.int64)
    c_d = np.empty(16)
    n_c = 0
    t_lo = np.empty((4, m), dtype=np.int32)
    t_hi = np.empty((4, m), dtype=np.int32)
    t_d = np.empty(4)
    n_t = 0
    act = np.empty(T, dtype=np.int32)
    start = np.empty(T, dtype=np.int32)
    cs = np.empty(c)
    cell = np.empty(m, dtype=np.int32)
    buf = np.empty(c)
    lb = np.empty(c)
    trange = np.empty(T)
    top_n = np.empty(T, dtype=np.int32)
    stack = np.empty(max_depth_nodes, dtype=np.int32)
    mn = np.empty(c)
    mx = np.empty(c)
    shared = np.zeros(coff[-1] + 1)  # summed spread per cut (cell boundary index)
    sw = _sweep_workspace(coff, m, c, max_depth_nodes)
    tfeat, tmin, rec = _bounds_workspace(nv.shape[0], T, c, max_depth_nodes)
    lo = np.empty(m, dtype=np.int32)
    hi = np.empty(m, dtype=np.int32)
    nlo = np.empty(m, dtype=np.int32)
    nhi = np.empty(m, dtype=np.int32)
    pl = np.empty((1, m), dtype=np.int32)
    ph = np.empty((1, m), dtype=np.int32)
    pops = 0
    kd_pops = 0
    evaluated = 0
    complete = True
    while n > 0:
        d, s, n = _pop(keys, vals, n)
        if d >= best[k - 1]:
            break
        # Room first for every entry this pop may add (two children, or a KD leaf's
        # rectangles): the pushes below then return no arrays, whose reference counting
        # numba could not prune (see distance.NO_NRT).
        need = 2
        if s < 0 and left[(-1 - s) >> 1] < 0:
            need = max(2, kend[(-1 - s) >> 1] - kstart[(-1 - s) >> 1])
        if n + need > keys.shape[0]:
            keys = _grow(keys, n + need)
            vals = _grow(vals, n + need)
        if n_free < need and n_used + need > blo.shape[0]:
            blo = _grow(blo, n_used + need)
            bhi = _grow(bhi, n_used + need)
            bstart = _grow(bstart, n_used + need)
            bcs = _grow(bcs, n_used + need)
            free = _grow(free, n_used + need)
        if s < 0:
            kd_pops += 1
            nd = (-1 - s) >> 1
            own = (-1 - s) & 1
            if left[nd] >= 0:
                for ch in (left[nd], right[nd]):
                    dd = _box_dist(x, w, norm, cmin, cmax, integral, node_lo[ch], node_hi[ch],
                                   gcol, gstart, gcols, gcost, xcat, a0, a1)
                    if dd < best[k - 1]:
                        n = _push(keys, vals, n, dd, -1 - (2 * ch + own))
                continue
            for i in range(kstart[nd], kend[nd]):
                r = order[i]
                lab = labels[r]
                if lab < 0 and own == 0:
                    continue
                evaluated += 1
                dd = _rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp,
                                clcl, best[k - 1], gcol, gstart, gcols, gcost, xcat, a0, a1)
                if dd >= best[k - 1]:
                    continue
                if lab >= 0:  # a certified rectangle of this (target) class tree
                    c_lo, c_hi, c_lab, c_d, n_c = _keep(best, c_lo, c_hi, c_lab, c_d, n_c,
                                                        rlo[r], rhi[r], lab, dd)
                    continue
                s2, n_free, n_used = _slot(free, n_free, n_used)
                for f in range(m):  # non-empty: the region meets the constraints (dd < inf)
                    blo[s2, f] = max(rlo[r, f], klo[f])
                    bhi[s2, f] = min(rhi[r, f], khi[f])
                bstart[s2] = roots
                bcs[s2] = base
                n = _push(keys, vals, n, dd, s2)
            continue
        if pops >= max_pops:
            complete = False
            break
        pops += 1
        for f in range(m):  # into preallocated arrays: no allocation per box
            lo[f] = blo[s, f]
            hi[f] = bhi[s, f]
        if best[k - 1] < np.inf:
            _clip_to_ball(x, w, norm, gcol, lo, hi, coff, clow, cupp, best[k - 1])
        n_act = 0
        for t in range(T):
            start[t] = bstart[s, t]
            if nf[start[t]] >= 0:
                act[n_act] = t
                n_act += 1
        for j in range(c):
            cs[j] = bcs[s, j]
        free[n_free] = s
        n_free += 1
        single = True
        for f in range(m):
            cell[f] = (lo[f] + hi[f]) // 2
            if hi[f] > lo[f]:
                single = False
        if single or c != 2:
            a, marg = _label_active(cell, act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high,
                                    buf)
        else:
            # Two classes: no need to label a cell first, the one walk below bounds the
            # margin from both sides and picks the class nearer to certification
            # (PD: same boxes, 15-23% less time).
            a = 0
            marg = 0.0
        label = -1
        tie = False
        if single:
            if marg <= tol:
                tie = True
            else:
                label = a
        else:
            worst = _bounds_on(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb,
                               trange, top_n, stack, mn, mx, tfeat, tmin, rec)
            if c == 2 and worst <= tol:
                # Lower bound of s1 - s0 = -(upper bound of s0 - s1): per tree, its minimum
                # of s0 - s1 plus its spread is its maximum.
                low1 = cs[1] - cs[0]
                for i in range(n_act):
                    low1 -= tmin[act[i], 1] + trange[act[i]]
                if low1 > worst:
                    a = 1
                    worst = low1
                    lb[0] = low1
            narrowed = False
            if worst <= tol and worst > -SWEEP_REACH * _spread_sum(act, n_act, trange):
                # The interval bound failed, but not by far: the sweep bound often decides.
                # With a of no target class it also narrows the box to where a target may be.
                worst, narrowed = _sweep_bounds(lo, hi, a, act, n_act, cs, nv, nf, tfeat, top_n,
                                                rec, coff, lb, sw, not tmask[a], tmask, tol,
                                                nlo, nhi)
            if worst > tol:
                label = a
            else:
                if not tmask[a]:
                    # a beats every target class everywhere in the box: nothing to find
                    hopeless = True
                    for b in range(c):
                        if tmask[b] and lb[b] <= tol:
                            hopeless = False
                            break
                    if hopeless:
                        continue
                if narrowed:
                    # The rest of the box holds no target point: requeue the narrowed box
                    # at its own (larger or equal) distance, with the same tree states.
                    pl[0] = nlo
                    ph[0] = nhi
                    dd = _rect_dist(0, x, w, norm, cmin, cmax, integral, pl, ph, coff, clow,
                                    cupp, clcl, best[k - 1], gcol, gstart, gcols, gcost, xcat,
                                    a0, a1)
                    if dd < best[k - 1]:
                        s2, n_free, n_used = _slot(free, n_free, n_used)
                        blo[s2] = nlo
                        bhi[s2] = nhi
                        bstart[s2] = start
                        bcs[s2] = cs
                        n = _push(keys, vals, n, dd, s2)
                    continue
                # Trees now constant fold into cs, the others move down to their
                # root-most undecided node; split at one of these nodes' cuts. Cut where
                # the far side lies farthest from x (it is then often beyond the k-th best
                # and dropped) and where the votes it decides are uncertain: score = the
                # far side's distance gain (below) x the summed spread of every tree
                # whose root-most undecided node is that same cut (random forests repeat
                # cuts; PD 100x5, 2M rectangles: l2 p50 116 -> 35 ms with one tree's
                # spread; summing over trees that share the cut, 2k-rectangle maps:
                # 1.41M -> 1.02M boxes popped over 120 queries).
                for i in range(n_act):
                    node = top_n[act[i]]
                    if nf[node] >= 0:
                        shared[coff[nf[node]] + ncut[node]] += trange[act[i]]
                bt = -1
                br = -1.0
                bg = -1.0
                for i in range(n_act):
                    t = act[i]
                    node = top_n[t]
                    start[t] = node
                    if nf[node] >= 0:
                        fz = nf[node]
                        cz = ncut[node]
                        up = cupp[coff[fz] + cz]
                        if x[fz] <= up:
                            gap = w[fz] * (clow[coff[fz] + cz + 1] - x[fz])
                        else:
                            gap = w[fz] * (x[fz] - up)
                        if norm <= 1:
                            # l1, l2: what the far child's key gains over the box's (its
                            # term on fz becomes the gap instead of the box's own term).
                            # PD 100x5, 130 queries: boxes popped -31/-41% (l2) and
                            # -40% (l1) against the bare gap; for linf it does worse.
                            tb = 0.0
                            if x[fz] < clow[coff[fz] + lo[fz]]:
                                tb = w[fz] * (clow[coff[fz] + lo[fz]] - x[fz])
                            elif x[fz] > cupp[coff[fz] + hi[fz]]:
                                tb = w[fz] * (x[fz] - cupp[coff[fz] + hi[fz]])
                            gap = max(gap * gap - tb * tb if norm == 1 else gap - tb, 0.0)
                        gap = gap * shared[coff[fz] + cz]
                        if gap > bg + 1e-15 or (abs(gap - bg) <= 1e-15 and trange[t] > br):
                            bg = gap
                            br = trange[t]
                            bt = t
                    else:
                        for j in range(c):
                            cs[j] += nv[node, j]
                for i in range(n_act):
                    node = top_n[act[i]]
                    if nf[node] >= 0:
                        shared[coff[nf[node]] + ncut[node]] = 0.0
                if bt < 0:
                    tie = True  # one score vector on the whole box, within rounding
                else:
                    f = nf[start[bt]]
                    cut = ncut[start[bt]]
                    for side in range(2):
                        s2, n_free, n_used = _slot(free, n_free, n_used)
                        blo[s2] = lo
                        bhi[s2] = hi
                        if side == 0:
                            bhi[s2, f] = cut
                        else:
                            blo[s2, f] = cut + 1
                        dd = _rect_dist(s2, x, w, norm, cmin, cmax, integral, blo, bhi, coff, clow,
                                        cupp, clcl, best[k - 1], gcol, gstart, gcols, gcost, xcat,
                                        a0, a1)
                        if dd >= best[k - 1]:
                            free[n_free] = s2
                            n_free += 1
                            continue
                        bstart[s2] = start
                        bcs[s2] = cs
                        n = _push(keys, vals, n, dd, s2)
                    continue
        if tie:
            if n_t >= t_lo.shape[0]:
                t_lo = _grow(t_lo, n_t + 1)
                t_hi = _grow(t_hi, n_t + 1)
                t_d = _grow(t_d, n_t + 1)
            t_lo[n_t] = lo
            t_hi[n_t] = hi
            t_d[n_t] = d
            n_t += 1
            continue
        if not tmask[label]:
            continue
        c_lo, c_hi, c_lab, c_d, n_c = _keep(best, c_lo, c_hi, c_lab, c_d, n_c, lo, hi, label, d)
    return (c_lo[:n_c].copy(), c_hi[:n_c].copy(), c_lab[:n_c].copy(), c_d[:n_c].copy(),
            t_lo[:n_t].copy(), t_hi[:n_t].copy(), t_d[:n_t].copy(), kd_pops, evaluated, pops,
            complete)
