"""Certified extraction of a faithful partition into labeled rectangles.

A *region* is a box of grid cells: per feature an inclusive range ``lo[f]..hi[f]`` of cell
indices (see :mod:`maps_core.grid`). :func:`refine` turns a region into disjoint labeled
sub-regions whose union is the region, each *certified* single-class:

1. Label one cell of the region (its centre) exactly: candidate class ``a``.
2. Interval bound: for every other class ``b``, ``base_a - base_b + sum over trees of the
   minimum over the tree's reachable leaves of (v_a - v_b)``. If every bound exceeds a
   tolerance far above float64 rounding, the region is certified class ``a``. When it
   fails by not too much, the sweep bound (:func:`_sweep_bounds`) projects every live tree
   on one feature and sums the projections per feature before taking the minimum.
3. Otherwise sample a few cells and label them exactly. Two labels prove the region
   impure. If all agree, a small depth-first branch-and-bound over sub-boxes tries to
   *prove* purity exactly (the bound is loose because trees share features; proving
   avoids fragmenting a pure region into many pieces) or finds a counter-example cell.
4. Split at the split node that best separates the labelled cells (Gini), chosen among
   the root-most undecided node of every tree: splits land where the label actually
   changes and where the model itself cuts.

Single cells are always decidable: their scores are exact sums. Cells whose best and
second-best scores lie within the tolerance (near-ties, where float summation order could
matter) are labelled by the model itself afterwards, so no float disagreement can leak in.
Sampling only ever proves impurity, never purity.

The driver runs work items in parallel threads (the kernels release the GIL), honours
rectangle and time budgets, and can keep unresolved regions as *mixed* boxes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from .ensemble import FlatEnsemble
from .exceptions import BudgetExceededError
from .grid import Grid

MIXED = -1  # label of an unresolved region
NEAR_TIE = -2  # single cell whose scores nearly tie: labelled by the model afterwards

# Counter slots returned by the kernel.
(C_REGIONS, C_BOUND, C_PROVED, C_REFUTED, C_UNKNOWN, C_CELLS, C_TIES, C_PROOF_NODES,
 C_MERGED) = range(9)
COUNTER_NAMES = (
    "regions",
    "certified_by_bound",
    "certified_by_proof",
    "proofs_refuted",
    "proofs_unknown",
    "single_cells",
    "near_ties",
    "proof_nodes",
    "merged",
)


# --------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _decide(buf, tie_high):
    """Winning class of the score vector ``buf`` and its margin over the runner-up."""
    c = buf.shape[0]
    best = 0
    for k in range(1, c):
        if tie_high:
            if buf[k] >= buf[best]:
                best = k
        elif buf[k] > buf[best]:
            best = k
    margin = np.inf
    for k in range(c):
        if k != best and buf[best] - buf[k] < margin:
            margin = buf[best] - buf[k]
    return best, margin


@njit(cache=True, nogil=True)
def _label_active(cell, act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high, buf):
    """Exact class of one cell and its margin (best score minus runner-up).

    Only the trees in ``act[:n_act]`` are traversed, each from its node ``start[t]`` (a
    node on the path of every cell of the region); the other trees are constant on the
    region and already summed (with the base) in ``cs``."""
    c = cs.shape[0]
    for k in range(c):
        buf[k] = cs[k]
    for i in range(n_act):
        node = start[act[i]]
        while nf[node] >= 0:
            if cell[nf[node]] <= ncut[node]:
                node = nl[node]
            else:
                node = nr[node]
        for k in range(c):
            buf[k] += nv[node, k]
    return _decide(buf, tie_high)


@njit(cache=True, nogil=True)
def _bounds_on(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb, trange, top_n,
               stack, mn, mx, tfeat, tmin, rec):
    """Interval bound of the margin of class ``a`` over the region ``lo..hi``.

    Only the trees ``act[:n_act]`` are visited, each from ``start[t]``; ``cs`` holds the base
    plus the leaf values of every other tree (trees constant on an enclosing region stay
    constant inside it, and a node every cell of an enclosing region reaches is reached by
    every cell inside it). Fills ``lb[b]`` (lower bound of score_a - score_b), per tree the
    spread of its margin ``trange[t]`` and in ``top_n[t]`` its root-most undecided split
    node, or its only reachable leaf when the tree is constant on the region.

    It also records, per tree: ``tmin[t, b]``, its own minimum of the margin (plus
    ``trange[t]``, its maximum when there are two classes); and for :func:`_sweep_bounds`
    ``tfeat[t]``, the one feature all its undecided nodes test (-1 if none or several),
    and in ``rec`` = (slo, shi, lnode, llo, lhi, tleaf, tnleaf) its reachable
    leaves ``lnode[tleaf[t]:tleaf[t] + tnleaf[t]]`` with their cell intervals along the
    feature of ``top_n[t]`` (``llo``, ``lhi``; ``slo``, ``shi`` are DFS stacks). The
    leaf arrays need room for every leaf of the ensemble.
    Returns min over b != a of lb[b].
    """
    slo, shi, lnode, llo, lhi, tleaf, tnleaf = rec
    c = cs.shape[0]
    n_rec = 0
    for b in range(c):
        lb[b] = cs[a] - cs[b]
    for i in range(n_act):
        t = act[i]
        for b in range(c):
            mn[b] = np.inf
            mx[b] = -np.inf
        top = -1
        feat = -1
        ftop = -1
        tleaf[t] = n_rec
        stack[0] = start[t]
        sp = 1
        node = start[t]
        while sp > 0:
            sp -= 1
            node = stack[sp]
            c_lo = slo[sp]
            c_hi = shi[sp]
            f = nf[node]
            if f < 0:
                for b in range(c):
                    d = nv[node, a] - nv[node, b]
                    if d < mn[b]:
                        mn[b] = d
                    if d > mx[b]:
                        mx[b] = d
                if top >= 0:
                    lnode[n_rec] = node
                    llo[n_rec] = c_lo
                    lhi[n_rec] = c_hi
                    n_rec += 1
                continue
            cut = ncut[node]
            go_l = lo[f] <= cut
            go_r = hi[f] > cut
            if go_l and go_r:
                if top < 0:
                    # The only branching point above all others: intervals start here.
                    top = node
                    feat = f
                    ftop = f
                    c_lo = lo[f]
                    c_hi = hi[f]
                elif feat != f:
                    feat = -2
            if f == ftop:  # narrow the interval along the top node's feature
                if c_lo <= cut:
                    stack[sp] = nl[node]
                    slo[sp] = c_lo
                    shi[sp] = min(c_hi, cut)
                    sp += 1
                if c_hi > cut:
                    stack[sp] = nr[node]
                    slo[sp] = max(c_lo, cut + 1)
                    shi[sp] = c_hi
                    sp += 1
                continue
            if go_l:
                stack[sp] = nl[node]
                slo[sp] = c_lo
                shi[sp] = c_hi
                sp += 1
            if go_r:
                stack[sp] = nr[node]
                slo[sp] = c_lo
                shi[sp] = c_hi
                sp += 1
        tnleaf[t] = n_rec - tleaf[t]
        top_n[t] = top if top >= 0 else node  # constant tree: its only reachable leaf
        spread = 0.0
        for b in range(c):
            if b != a:
                lb[b] += mn[b]
                if mx[b] - mn[b] > spread:
                    spread = mx[b] - mn[b]
        trange[t] = spread
        tfeat[t] = feat if feat >= 0 else -1
        for b in range(c):
            tmin[t, b] = mn[b]
    worst = np.inf
    for b in range(c):
        if b != a and lb[b] < worst:
            worst = lb[b]
    return worst


# The sweep bound is tried only when the interval bound misses by less than this fraction
# of the live trees' summed spread: beyond it the sweep almost never certifies (PD 100x5,
# mixed-region search: same boxes popped, 30% less time than trying it on every box).
SWEEP_REACH = 0.25


@njit(cache=True, nogil=True)
def _spread_sum(act, n_act, trange):
    """Summed margin spread of the trees ``act[:n_act]`` (from :func:`_bounds_on`)."""
    total = 0.0
    for i in range(n_act):
        total += trange[act[i]]
    return total


@njit(cache=True, nogil=True)
def _bounds_workspace(n_nodes, T, c, max_depth_nodes):
    """Per-tree outputs and leaf records (``tfeat``, ``tmin``, ``rec``) of :func:`_bounds_on`."""
    d = max_depth_nodes
    rec = (np.zeros(d, dtype=np.int32), np.zeros(d, dtype=np.int32),
           np.empty(n_nodes, dtype=np.int32), np.empty(n_nodes, dtype=np.int32),
           np.empty(n_nodes, dtype=np.int32), np.empty(T, dtype=np.int32),
           np.empty(T, dtype=np.int32))
    return np.empty(T, dtype=np.int32), np.empty((T, c)), rec


@njit(cache=True, nogil=True)
def _sweep_workspace(coff, m, c, max_depth_nodes):
    """Workspace ``sw`` of :func:`_sweep_bounds`."""
    d = max_depth_nodes
    return (np.zeros((coff[-1] + m, c)), np.zeros(m, dtype=np.int32),
            np.empty(d, dtype=np.int32), np.empty((d, c)), np.empty((m, c)), np.empty(c))


@njit(cache=True, nogil=True)
def _sweep_bounds(lo, hi, a, act, n_act, cs, nv, nf, tfeat, top_n, rec, coff, lb, sw, shrink,
                  tmask, tol, nlo, nhi):
    """Lower bounds of the margin of class ``a`` over the region ``lo..hi``, tighter than
    :func:`_bounds_on`, from the per-tree results it recorded (``tfeat``, ``top_n``,
    ``rec``).

    The interval bound takes every tree's worst leaf on its own, as if the trees could
    disagree about where in the region x sits. Here every live tree is replaced by its
    projection on the feature F of its root-most undecided node: for each cell along F,
    its worst leaf over the rest of the region (exact for a tree whose undecided nodes all
    test F). The projections on the same feature are summed (prefix sums over its cells)
    before the minimum is taken, so those trees cannot disagree about x's position along
    F. For every x in the region, the sum of the trees' values is at least the sum of
    their projections at x's cells, which is at least the sum of the per-feature minima:
    the bound is sound, and never below the interval bound. The prefix sums round like
    any other float sum of the same terms, far below the certificates' tolerance.

    PD 100x5, boxes the interval bound leaves uncertain in the mixed-region search: 53
    live trees, 28 of them one-feature trees; pops per query (mean): 2.4k with the
    interval bound, 1.15k with one-feature trees summed, 0.75k with all projections.

    ``coff`` are the grid's per-feature cell offsets (shape (m + 1,)). ``sw`` is a workspace
    from :func:`_sweep_workspace`: ``diff`` (shape (n_cells + m, c); each feature owns one
    spare slot past its last cell) and ``touched`` (shape (m,)), both zero on entry and
    left zero, ``seg`` and ``segmin`` (segments of one tree), ``flow`` and ``run``. Fills
    ``lb[b]`` (shape (c,), lower bound of score_a - score_b).

    With ``shrink`` (and ``a`` not a target class of ``tmask``), the same sums also bound
    the margin per cell along each feature: a cell j of feature f where, for every target
    class b, ``lb[b] - (f's minimum) + (f's sum at j) > tol`` holds no target point (class
    a beats b there by more than the tolerance). ``nlo``, ``nhi`` (shape (m,)) receive the
    region narrowed, per feature, to the hull of the other cells: it holds every target
    point of the region.

    Returns (min over b != a of lb[b], whether the region was narrowed).
    """
    diff, touched, seg, segmin, flow, run_b = sw
    _, _, lnode, llo, lhi, tleaf, tnleaf = rec
    c = cs.shape[0]
    m = lo.shape[0]
    for b in range(c):
        lb[b] = cs[a] - cs[b]
    for i in range(n_act):
        t = act[i]
        if nf[top_n[t]] < 0:  # constant on the region: its one leaf (whatever ``a`` is)
            leaf = top_n[t]
            for b in range(c):
                lb[b] += nv[leaf, a] - nv[leaf, b]
            continue
        f0 = nf[top_n[t]]
        touched[f0] = 1
        j_base = coff[f0] + f0
        q0 = tleaf[t]
        q1 = q0 + tnleaf[t]
        if tfeat[t] >= 0:  # one-feature tree: its leaves tile the range along f0
            for q in range(q0, q1):
                node = lnode[q]
                j0 = j_base + llo[q]
                j1 = j_base + lhi[q] + 1
                for b in range(c):
                    v = nv[node, a] - nv[node, b]
                    diff[j0, b] += v
                    diff[j1, b] -= v
            continue
        # Projection: the leaves' interval starts cut the range into segments (every
        # interval end is followed by another leaf's start); on each segment, the minimum
        # over the leaves covering it.
        n_seg = 0
        for q in range(q0, q1):
            v0 = llo[q]
            pos = n_seg
            dup = False
            while pos > 0 and seg[pos - 1] >= v0:
                if seg[pos - 1] == v0:
                    dup = True
                    break
                pos -= 1
            if dup:
                continue
            for r in range(n_seg, pos, -1):
                seg[r] = seg[r - 1]
            seg[pos] = v0
            n_seg += 1
        for r in range(n_seg):
            for b in range(c):
                segmin[r, b] = np.inf
        for q in range(q0, q1):
            node = lnode[q]
            for r in range(n_seg):
                if seg[r] < llo[q]:
                    continue
                if seg[r] > lhi[q]:
                    break
                for b in range(c):
                    v = nv[node, a] - nv[node, b]
                    if v < segmin[r, b]:
                        segmin[r, b] = v
        for r in range(n_seg):
            j0 = j_base + seg[r]
            j1 = j_base + (seg[r + 1] if r + 1 < n_seg else hi[f0] + 1)
            for b in range(c):
                diff[j0, b] += segmin[r, b]
                diff[j1, b] -= segmin[r, b]
    for f in range(m):
        if touched[f] == 0:
            continue
        j0 = coff[f] + f
        for b in range(c):
            if b == a:  # its differences are all zero
                continue
            run = 0.0
            low = np.inf
            for j in range(j0 + lo[f], j0 + hi[f] + 1):
                run += diff[j, b]
                if run < low:
                    low = run
            flow[f, b] = low
            lb[b] += low
    worst = np.inf
    for b in range(c):
        if b != a and lb[b] < worst:
            worst = lb[b]
    narrowed = False
    for f in range(m):
        nlo[f] = lo[f]
        nhi[f] = hi[f]
        if touched[f] == 0:
            continue
        touched[f] = 0
        j0 = coff[f] + f
        if shrink and worst <= tol:
            first = -1
            last = -1
            for b in range(c):
                run_b[b] = 0.0
            for j in range(lo[f], hi[f] + 1):
                out = True
                for b in range(c):
                    run_b[b] += diff[j0 + j, b]
                    diff[j0 + j, b] = 0.0
                    if tmask[b] and b != a and lb[b] - flow[f, b] + run_b[b] <= tol:
                        out = False
                if not out:
                    if first < 0:
                        first = j
                    last = j
            if first > lo[f] or (first >= 0 and last < hi[f]):
                nlo[f] = first
                nhi[f] = last
                narrowed = True
        else:
            for j in range(j0 + lo[f], j0 + hi[f] + 1):
                for b in range(c):
                    diff[j, b] = 0.0
        for b in range(c):
            diff[j0 + hi[f] + 1, b] = 0.0
    return worst, narrowed


@njit(cache=True, nogil=True)
def _prove(lo0, hi0, a, budget, tol, act, n_act, cs, nf, ncut, nl, nr, nv, start, cex, ws):
    """Exact purity test by depth-first branch-and-bound.

    Returns (status, nodes): status 1 = every cell of the region is class ``a`` with a
    margin above ``tol``; 0 = counter-example cell written to ``cex``; -1 = budget spent.
    """
    (lb, trange, top_n, stack, mn, mx, slo, shi, tfeat, tmin, rec) = ws
    m = lo0.shape[0]
    sp = 0
    for f in range(m):
        slo[0, f] = lo0[f]
        shi[0, f] = hi0[f]
    sp = 1
    nodes = 0
    while sp > 0:
        if nodes >= budget:
            return -1, nodes
        sp -= 1
        lo = slo[sp].copy()
        hi = shi[sp].copy()
        nodes += 1
        worst = _bounds_on(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb, trange,
                           top_n, stack, mn, mx, tfeat, tmin, rec)
        if worst > tol:
            continue
        # Split at the root-most undecided node of the most uncertain tree.
        bt = -1
        br = -1.0
        for i in range(n_act):
            t = act[i]
            if nf[top_n[t]] >= 0 and trange[t] > br:
                br = trange[t]
                bt = t
        if bt < 0:
            # Single cell (no undecided split): the bound is the exact margin.
            for f in range(m):
                cex[f] = lo[f]
            return 0, nodes
        if sp + 2 > slo.shape[0]:
            return -1, nodes
        f = nf[top_n[bt]]
        cut = ncut[top_n[bt]]
        for g in range(m):
            slo[sp, g] = lo[g]
            shi[sp, g] = hi[g]
            slo[sp + 1, g] = lo[g]
            shi[sp + 1, g] = hi[g]
        shi[sp, f] = cut
        slo[sp + 1, f] = cut + 1
        sp += 2
    return 1, nodes


@njit(cache=True, nogil=True)
def _grow(a, n):
    out = np.empty((max(2 * a.shape[0], n),) + a.shape[1:], dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True, nogil=True)
def _refine(root_lo, root_hi, max_regions, prove_budget, n_samples, seed, tol,
            nf, ncut, nl, nr, nv, roots, base, tie_high, max_depth_nodes, coff):
    """Refine one region into certified labeled boxes (see module docs).

    Every pending region carries what its parent learnt about the trees: which trees are
    still undecided on it (``act``), the node each of them has certainly reached
    (``start``), and the summed leaf values of the decided ones (``cs``). Small regions deep
    in the recursion thus touch only the few sub-trees still alive.

    Returns (out_lo, out_hi, out_label, n_out, left_lo, left_hi, n_left, counters):
    certified boxes and, when ``max_regions`` ran out, the regions still to do.
    """
    np.random.seed(seed)
    m = root_lo.shape[0]
    c = base.shape[0]
    T = roots.shape[0]
    counters = np.zeros(9, dtype=np.int64)
    cap = 1024
    out_lo = np.empty((cap, m), dtype=np.int32)
    out_hi = np.empty((cap, m), dtype=np.int32)
    out_lab = np.empty(cap, dtype=np.int32)
    out_id = np.empty(cap, dtype=np.int32)
    n_out = 0
    # Split tree of this call: parent of every region (root 0), to merge siblings.
    par = np.empty(cap, dtype=np.int32)
    par[0] = -1
    n_ids = 1
    S = 256
    st_lo = np.empty((S, m), dtype=np.int32)
    st_hi = np.empty((S, m), dtype=np.int32)
    st_act = np.empty((S, T), dtype=np.int32)
    st_nact = np.empty(S, dtype=np.int32)
    st_start = np.empty((S, T), dtype=np.int32)
    st_cs = np.empty((S, c))
    st_id = np.empty(S, dtype=np.int32)
    st_id[0] = 0
    for f in range(m):
        st_lo[0, f] = root_lo[f]
        st_hi[0, f] = root_hi[f]
    for t in range(T):
        st_act[0, t] = t
        st_start[0, t] = roots[t]
    st_nact[0] = T
    for k in range(c):
        st_cs[0, k] = base[k]
    sp = 1
    lb = np.empty(c)
    trange = np.empty(T)
    top_n = np.empty(T, dtype=np.int32)
    stack = np.empty(max_depth_nodes, dtype=np.int32)
    mn = np.empty(c)
    mx = np.empty(c)
    buf = np.empty(c)
    ns = n_samples + 2
    samp = np.empty((ns, m), dtype=np.int32)
    slab = np.empty(ns, dtype=np.int32)
    cell = np.empty(m, dtype=np.int32)
    cex = np.empty(m, dtype=np.int32)
    pw = (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32),
          np.empty(max_depth_nodes, dtype=np.int32), np.empty(c), np.empty(c),
          np.empty((4096, m), dtype=np.int32), np.empty((4096, m), dtype=np.int32),
          *_bounds_workspace(nv.shape[0], T, c, max_depth_nodes))
    tfeat, tmin, rec = _bounds_workspace(nv.shape[0], T, c, max_depth_nodes)
    sw = _sweep_workspace(coff, m, c, max_depth_nodes)
    tm_none = np.zeros(c, dtype=np.bool_)  # the build does not narrow regions
    nlo = np.empty(m, dtype=np.int32)
    nhi = np.empty(m, dtype=np.int32)
    act = np.empty(T, dtype=np.int32)
    start = np.empty(T, dtype=np.int32)
    cs = np.empty(c)
    cnt_l = np.empty(c)
    cnt_r = np.empty(c)
    regions = 0
    while sp > 0 and regions < max_regions:
        sp -= 1
        lo = st_lo[sp].copy()
        hi = st_hi[sp].copy()
        rid = st_id[sp]
        n_act = st_nact[sp]
        for i in range(n_act):
            t = st_act[sp, i]
            act[i] = t
            start[t] = st_start[sp, t]
        for k in range(c):
            cs[k] = st_cs[sp, k]
        regions += 1
        # 1. candidate class from the centre cell
        single = True
        for f in range(m):
            cell[f] = (lo[f] + hi[f]) // 2
            if hi[f] > lo[f]:
                single = False
        a, marg = _label_active(cell, act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high, buf)
        label = -3
        best_t = -1
        if single:
            counters[C_CELLS] += 1
            label = a if marg > tol else -2
            if label == -2:
                counters[C_TIES] += 1
        else:
            worst = _bounds_on(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb,
                               trange, top_n, stack, mn, mx, tfeat, tmin, rec)
            if worst <= tol and worst > -SWEEP_REACH * _spread_sum(act, n_act, trange):
                worst, _ = _sweep_bounds(lo, hi, a, act, n_act, cs, nv, nf, tfeat, top_n, rec,
                                         coff, lb, sw, False, tm_none, tol, nlo, nhi)
            if worst > tol:
                label = a
                counters[C_BOUND] += 1
            else:
                # Trees now constant leave the active set; the others move down to their
                # root-most undecided node.
                k_act = 0
                for i in range(n_act):
                    t = act[i]
                    node = top_n[t]
                    if nf[node] >= 0:
                        act[k_act] = t
                        start[t] = node
                        k_act += 1
                    else:
                        for k in range(c):
                            cs[k] += nv[node, k]
                n_act = k_act
        if label == -3:
            # 2. sample cells; two labels prove impurity
            for f in range(m):
                samp[0, f] = cell[f]
            slab[0] = a
            n = 1
            mixed = marg <= tol
            for _ in range(n_samples):
                for f in range(m):
                    samp[n, f] = lo[f] + np.random.randint(0, hi[f] - lo[f] + 1)
                lab, mg = _label_active(samp[n], act, n_act, cs, nf, ncut, nl, nr, nv, start,
                                        tie_high, buf)
                slab[n] = lab
                if lab != a or mg <= tol:
                    mixed = True
                n += 1
            if not mixed and prove_budget > 0:
                status, pn = _prove(lo, hi, a, prove_budget, tol, act, n_act, cs, nf, ncut, nl,
                                    nr, nv, start, cex, pw)
                counters[C_PROOF_NODES] += pn
                if status == 1:
                    label = a
                    counters[C_PROVED] += 1
                elif status == 0:
                    counters[C_REFUTED] += 1
                    for f in range(m):
                        samp[n, f] = cex[f]
                    lab, mg = _label_active(cex, act, n_act, cs, nf, ncut, nl, nr, nv, start,
                                            tie_high, buf)
                    slab[n] = lab if mg > tol else c  # near-tie counts as its own label
                    n += 1
                else:
                    counters[C_UNKNOWN] += 1
            if label == -3:
                # Split at the root-most undecided node of one tree, the one whose cut best
                # separates the labelled cells (_prove uses private workspaces, so trange
                # is still the region's).
                best_gain = -1.0
                best_t = -1
                best_r = -1.0
                for i in range(n_act):
                    t = act[i]
                    if n == 1:  # nothing to separate: the most uncertain tree
                        if trange[t] > best_r:
                            best_t = t
                            best_r = trange[t]
                        continue
                    f = nf[start[t]]
                    cut = ncut[start[t]]
                    for k in range(c):
                        cnt_l[k] = 0.0
                        cnt_r[k] = 0.0
                    nL = 0.0
                    nR = 0.0
                    for s in range(n):
                        k = slab[s]
                        if k >= c:
                            k = a
                        if samp[s, f] <= cut:
                            cnt_l[k] += 1.0
                            nL += 1.0
                        else:
                            cnt_r[k] += 1.0
                            nR += 1.0
                    # Gini "purity" sum_k n_k^2 / n per side: larger is better.
                    g = 0.0
                    for k in range(c):
                        if nL > 0:
                            g += cnt_l[k] * cnt_l[k] / nL
                        if nR > 0:
                            g += cnt_r[k] * cnt_r[k] / nR
                    if g > best_gain + 1e-12 or (abs(g - best_gain) <= 1e-12 and trange[t] > best_r):
                        best_gain = g
                        best_t = t
                        best_r = trange[t]
            if label == -3 and best_t < 0:
                # Every tree is constant on the region: one score vector, a near-tie.
                # The model labels it (same leaves everywhere, so the same answer).
                label = -2
                counters[C_TIES] += 1
            if label == -3:
                f = nf[start[best_t]]
                cut = ncut[start[best_t]]
                if sp + 2 > st_lo.shape[0]:
                    st_lo = _grow(st_lo, sp + 2)
                    st_hi = _grow(st_hi, sp + 2)
                    st_act = _grow(st_act, sp + 2)
                    st_nact = _grow(st_nact, sp + 2)
                    st_start = _grow(st_start, sp + 2)
                    st_cs = _grow(st_cs, sp + 2)
                    st_id = _grow(st_id, sp + 2)
                if n_ids + 2 > par.shape[0]:
                    par = _grow(par, n_ids + 2)
                for j in range(sp, sp + 2):
                    st_id[j] = n_ids
                    par[n_ids] = rid
                    n_ids += 1
                    for g2 in range(m):
                        st_lo[j, g2] = lo[g2]
                        st_hi[j, g2] = hi[g2]
                    st_nact[j] = n_act
                    for i in range(n_act):
                        t = act[i]
                        st_act[j, i] = t
                        st_start[j, t] = start[t]
                    for k in range(c):
                        st_cs[j, k] = cs[k]
                st_lo[sp, f] = cut + 1  # right child popped second
                st_hi[sp + 1, f] = cut
                sp += 2
                continue
        if n_out >= out_lo.shape[0]:
            out_lo = _grow(out_lo, n_out + 1)
            out_hi = _grow(out_hi, n_out + 1)
            out_lab = _grow(out_lab, n_out + 1)
            out_id = _grow(out_id, n_out + 1)
        out_lo[n_out] = lo
        out_hi[n_out] = hi
        out_lab[n_out] = label
        out_id[n_out] = rid
        n_out += 1
        # Merge equal-label siblings back into their parent, repeatedly: a region's
        # subtree is emitted contiguously (depth first), so two siblings that each
        # collapsed to one box are the last two outputs. Their union is the parent box.
        while (n_out >= 2 and out_lab[n_out - 1] >= 0
               and out_lab[n_out - 1] == out_lab[n_out - 2]
               and par[out_id[n_out - 1]] == par[out_id[n_out - 2]]
               and par[out_id[n_out - 1]] >= 0):
            n_out -= 1
            for f in range(m):
                if out_lo[n_out, f] < out_lo[n_out - 1, f]:
                    out_lo[n_out - 1, f] = out_lo[n_out, f]
                if out_hi[n_out, f] > out_hi[n_out - 1, f]:
                    out_hi[n_out - 1, f] = out_hi[n_out, f]
            out_id[n_out - 1] = par[out_id[n_out]]
            counters[C_MERGED] += 1
    counters[C_REGIONS] = regions
    return (out_lo[:n_out].copy(), out_hi[:n_out].copy(), out_lab[:n_out].copy(), n_out,
            st_lo[:sp].copy(), st_hi[:sp].copy(), sp, counters)


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------
@dataclass(eq=False)
class Partition:
    """Disjoint labeled boxes of grid cells covering the legal domain.

    Attributes
    ----------
    lo, hi : ndarray of shape (n_rectangles, n_features), int32
        Inclusive cell-index ranges per feature.
    labels : ndarray of shape (n_rectangles,), int32
        Class index, or ``MIXED`` (-1) for an unresolved region.
    counters : dict
        Algorithm counters (see ``COUNTER_NAMES``).
    """

    lo: np.ndarray
    hi: np.ndarray
    labels: np.ndarray
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def n_rectangles(self) -> int:
        return int(self.labels.shape[0])

    @property
    def n_mixed(self) -> int:
        return int(np.count_nonzero(self.labels == MIXED))

    def counts(self, n_classes: int) -> np.ndarray:
        """Certified rectangles per class index, shape (n_classes,)."""
        lab = self.labels[self.labels >= 0]
        return np.bincount(lab, minlength=n_classes)


@dataclass(frozen=True, eq=False)
class Kernel:
    """The ensemble's arrays in the layout the kernels take."""

    nf: np.ndarray
    ncut: np.ndarray
    nl: np.ndarray
    nr: np.ndarray
    nv: np.ndarray
    roots: np.ndarray
    base: np.ndarray
    tie_high: bool
    tol: float
    max_depth_nodes: int
    coff: np.ndarray

    @classmethod
    def make(cls, ens: FlatEnsemble, grid: Grid) -> Kernel:
        nv = np.ascontiguousarray(ens.node_value, dtype=np.float64)
        # Float64 sums of at most a few thousand terms err by ~1e-13 relative; a margin
        # above this tolerance decides the class whatever the summation order.
        leaf = ens.node_feature < 0
        scale = float(np.abs(ens.base).max(initial=0.0))
        for r0, r1 in zip(ens.roots, list(ens.roots[1:]) + [ens.n_nodes], strict=True):
            sl = slice(int(r0), int(r1))
            scale += float(np.abs(nv[sl][leaf[sl]]).max(initial=0.0))
        sizes = np.diff(np.concatenate([ens.roots, [ens.n_nodes]]))
        return cls(
            nf=np.ascontiguousarray(ens.node_feature, dtype=np.int32),
            ncut=np.ascontiguousarray(grid.node_cut, dtype=np.int32),
            nl=np.ascontiguousarray(ens.node_left, dtype=np.int32),
            nr=np.ascontiguousarray(ens.node_right, dtype=np.int32),
            nv=nv,
            roots=np.ascontiguousarray(ens.roots, dtype=np.int32),
            base=np.ascontiguousarray(ens.base, dtype=np.float64),
            tie_high=ens.tie_break == "high",
            tol=1e-9 * (1.0 + scale),
            max_depth_nodes=int(sizes.max()) + 2,
            coff=np.ascontiguousarray(grid.cell_offsets, dtype=np.int64),
        )

    def refine(
        self, lo: np.ndarray, hi: np.ndarray, max_regions: int, prove_budget: int,
        n_samples: int, seed: int,
    ) -> tuple[Any, ...]:
        return _refine(
            lo, hi, max_regions, prove_budget, n_samples, seed, self.tol, self.nf, self.ncut,
            self.nl, self.nr, self.nv, self.roots, self.base, self.tie_high,
            self.max_depth_nodes, self.coff,
        )


def _volume(lo: np.ndarray, hi: np.ndarray) -> float:
    return float(np.prod((hi - lo + 1).astype(np.float64)))


def extract(
    ens: FlatEnsemble,
    grid: Grid,
    *,
    max_rectangles: int | None = None,
    max_seconds: float | None = None,
    on_budget: str = "mixed",
    progress: Callable[[float], None] | None = None,
    n_jobs: int = 1,
    labeler: Callable[[np.ndarray], np.ndarray] | None = None,
    item_regions: int = 2_000,
    prove_budget: int = 0,
    n_samples: int = 0,
) -> Partition:
    """Certified partition of the legal domain.

    Parameters
    ----------
    ens : FlatEnsemble
    grid : Grid
        Canonical thresholds of ``ens`` on the schema's domain.
    max_rectangles, max_seconds : optional
        Budgets. When one runs out, ``on_budget="mixed"`` keeps the regions not yet
        resolved as mixed boxes (label ``MIXED``), ``"error"`` raises
        :class:`BudgetExceededError`.
    progress : callable, optional
        Receives the fraction of grid cells certified so far, in [0, 1].
    n_jobs : int
        Worker threads.
    labeler : callable, optional
        ``labeler(points) -> class indices`` with the model itself, for near-tie cells.
        Defaults to :meth:`FlatEnsemble.predict_index`.
    item_regions, prove_budget, n_samples : int
        Regions per work item, node budget of each purity proof, cells sampled per region.
        By default no samples and no proofs: the interval bound alone certifies, splits go
        to the most uncertain tree's root-most undecided node, and equal-label siblings
        are merged back. Proofs and samples cut the rectangle count before merging (FI
        100x5: 5.9k instead of 11.4k rectangles) but cost more than they save in time
        (BC 100x5: 0.85M rectangles in 18 s with 16-node proofs against 0.90M in 6.6 s).

    Returns
    -------
    Partition
    """
    if on_budget not in ("mixed", "error"):
        raise ValueError("on_budget must be 'mixed' or 'error'")
    t0 = time.perf_counter()
    kern = Kernel.make(ens, grid)
    m = ens.n_features
    root_lo = np.zeros(m, dtype=np.int32)
    root_hi = (grid.n_cells - 1).astype(np.int32)
    total = _volume(root_lo, root_hi)
    done = 0.0
    counters = np.zeros(len(COUNTER_NAMES), dtype=np.int64)
    outs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n_rect = 0
    # Waves of work items processed in parallel; results kept in item order so that the
    # output does not depend on thread timing. The first wave is a single small item
    # whose leftover stack seeds the parallel waves.
    wave: list[tuple[np.ndarray, np.ndarray]] = [(root_lo, root_hi)]
    budget = 256
    seed = 0
    deadline = np.inf if max_seconds is None else t0 + max_seconds
    # Rectangles certified so far, updated by the workers themselves so that items of a
    # long wave that start after a budget ran out are skipped (left as they are).
    produced = [0]
    over: list[str] = []

    def work(lo: np.ndarray, hi: np.ndarray, n_regions: int, seed: int) -> tuple[Any, ...] | None:
        if time.perf_counter() > deadline:
            over.append("time")
            return None
        if max_rectangles is not None and produced[0] > max_rectangles:
            over.append("rectangle")
            return None
        res = kern.refine(lo, hi, n_regions, prove_budget, n_samples, seed)
        produced[0] += int(res[3])  # a lost update only delays the stop by one item
        return res

    last_report = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, n_jobs)) as pool:
        while wave and not over:
            futs = []
            for lo, hi in wave:
                seed += 1
                futs.append((lo, hi, pool.submit(work, lo, hi, budget, seed)))
            nxt: list[tuple[np.ndarray, np.ndarray]] = []
            for lo, hi, fut in futs:
                res = fut.result()
                if res is None:
                    nxt.append((lo, hi))
                    continue
                olo, ohi, olab, n_out, llo, lhi, n_left, cnt = res
                counters += cnt
                if n_out:
                    outs.append((olo, ohi, olab))
                    n_rect += n_out
                    done += float(np.prod((ohi - olo + 1).astype(np.float64), axis=1).sum())
                nxt.extend((llo[i], lhi[i]) for i in range(n_left))
                if progress is not None and time.perf_counter() - last_report > 0.5:
                    last_report = time.perf_counter()
                    progress(min(done / total, 1.0))
            wave = nxt
            budget = item_regions
    stopped = bool(wave)
    if progress is not None:
        progress(min(done / total, 1.0) if stopped else 1.0)
    if stopped:
        what = over[0] if over else "time"
        if on_budget == "error":
            raise BudgetExceededError(
                f"extraction exceeded its {what} budget with {n_rect} rectangles certified "
                f"and {len(wave)} regions unresolved ({100 * done / total:.4g}% of the grid "
                "certified)"
            )
        lo_m = np.stack([w[0] for w in wave]).astype(np.int32)
        hi_m = np.stack([w[1] for w in wave]).astype(np.int32)
        outs.append((lo_m, hi_m, np.full(len(wave), MIXED, dtype=np.int32)))
    if outs:
        lo = np.concatenate([o[0] for o in outs])
        hi = np.concatenate([o[1] for o in outs])
        lab = np.concatenate([o[2] for o in outs])
    else:  # pragma: no cover - the root always yields something
        lo = hi = np.zeros((0, m), dtype=np.int32)
        lab = np.zeros(0, dtype=np.int32)
    ties = np.flatnonzero(lab == NEAR_TIE)
    if ties.size:
        pts = grid.cell_points(lo[ties])
        lab[ties] = (labeler or ens.predict_index)(pts)
    info: dict[str, Any] = {k: int(v) for k, v in zip(COUNTER_NAMES, counters, strict=True)}
    info["extract_seconds"] = time.perf_counter() - t0
    info["budget_exhausted"] = stopped
    return Partition(lo=lo, hi=hi, labels=lab.astype(np.int32), counters=info)


def refine_region(
    kern: Kernel, lo: np.ndarray, hi: np.ndarray, max_regions: int = 2**62
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Refine one region (a mixed box, at query time) into disjoint pieces.

    Returns (lo, hi, labels) covering the region: certified pieces with their class,
    near-tie cells with ``NEAR_TIE`` (the caller labels them with the model), and, when
    ``max_regions`` ran out, the parts still unresolved with ``MIXED``.
    """
    olo, ohi, olab, _, llo, lhi, n_left, _ = kern.refine(
        lo.astype(np.int32), hi.astype(np.int32), max_regions, 0, 0, 1
    )
    if n_left:
        olo = np.concatenate([olo, llo])
        ohi = np.concatenate([ohi, lhi])
        olab = np.concatenate([olab, np.full(n_left, MIXED, dtype=np.int32)])
    return olo, ohi, olab


__all__ = ["MIXED", "Kernel", "Partition", "extract", "refine_region"]
