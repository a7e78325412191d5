"""Certificates of a region's class: the kernels both extraction and the query-time
search use to bound the margin of a class over a box of grid cells.

* :func:`label_cell`: the exact class of one cell (and its margin), walking only the trees
  still live on the enclosing region (:func:`label_cell_leaves` also records their leaves);
* :func:`interval_bound`: per tree, the worst reachable leaf; summed, a lower bound of the
  margin of class ``a`` over the box. It also records what :func:`sweep_bound` needs;
* :func:`sweep_bound`: each live tree projected on one feature, projections on the same
  feature summed before the minimum: tighter, and it can narrow a box to where a target
  class may still win;
* workspaces (:func:`bounds_workspace`, :func:`sweep_workspace`) allocated once per
  kernel call, so the per-box bounds never allocate.

The margin of ``a`` over ``b`` is ``score_a - score_b``; a box is certified class ``a``
when every bound exceeds the tolerance of :class:`maps_core.partition.Kernel`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .distance import NO_NRT

# The per-box kernels below allocate nothing, so they are compiled without reference
# counting, like the search loop that calls them: with it, unpacking the workspace tuples
# and slicing per feature paid two atomic operations per array on every box (Credit GB
# 300x4, 2,000 l1 queries: 14% of the search in NRT_incref/NRT_decref; without, p50 2.50
# -> 2.18-2.30 ms, the same distances).


@njit(**NO_NRT)
def decide(buf, tie_high):
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


@njit(inline="always")
def _leaf(cell, node, nf, ncut, nl, nr):
    """The leaf one cell reaches from ``node``."""
    while nf[node] >= 0:
        if cell[nf[node]] <= ncut[node]:
            node = nl[node]
        else:
            node = nr[node]
    return node


@njit(**NO_NRT)
def label_cell(cell, act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high, buf):
    """Exact class of one cell and its margin (best score minus runner-up).

    Only the trees in ``act[:n_act]`` are traversed, each from its node ``start[t]`` (a
    node on the path of every cell of the region); the other trees are constant on the
    region and already summed (with the base) in ``cs``."""
    c = cs.shape[0]
    for k in range(c):
        buf[k] = cs[k]
    for i in range(n_act):
        node = _leaf(cell, start[act[i]], nf, ncut, nl, nr)
        for k in range(c):
            buf[k] += nv[node, k]
    return decide(buf, tie_high)


@njit(**NO_NRT)
def label_cell_leaves(cell, act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high, buf, leaves):
    """:func:`label_cell` that also records each live tree's leaf: ``leaves[t]`` for ``t``
    in ``act[:n_act]`` (shape (n_trees,))."""
    c = cs.shape[0]
    for k in range(c):
        buf[k] = cs[k]
    for i in range(n_act):
        node = _leaf(cell, start[act[i]], nf, ncut, nl, nr)
        leaves[act[i]] = node
        for k in range(c):
            buf[k] += nv[node, k]
    return decide(buf, tie_high)


@njit(**NO_NRT)
def push_sides(stack, slo, shi, sp, left, right, a, b, cut):
    """Push onto a DFS stack (nodes ``stack``, runs of cells ``slo..shi``, size ``sp``) the
    children ``left`` and ``right`` of a node that cuts the run ``a..b`` after cell
    ``cut``, each with its part of the run (a child whose part is empty is not pushed).
    Returns the new size."""
    if a <= cut:
        stack[sp] = left
        slo[sp] = a
        shi[sp] = min(b, cut)
        sp += 1
    if b > cut:
        stack[sp] = right
        slo[sp] = max(a, cut + 1)
        shi[sp] = b
        sp += 1
    return sp


#: ``chg`` of :func:`interval_bound` for a box none of whose trees' records may be reused.
ALL_CHANGED = -1


@njit(inline="always")
def feature_bit(f):
    """Bit of feature ``f`` in the masks of :func:`interval_bound` (features past 62
    share bit 62: a shared bit only walks more trees)."""
    return np.int64(1) << min(f, 62)


@njit(**NO_NRT)
def interval_bound(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb, trange, top_n,
                   stack, mn, mx, tfeat, tmin, rec, chg):
    """Interval bound of the margin of class ``a`` over the region ``lo..hi``.

    Only the trees ``act[:n_act]`` are visited, each from ``start[t]``; ``cs`` holds the base
    plus the leaf values of every other tree (trees constant on an enclosing region stay
    constant inside it, and a node every cell of an enclosing region reaches is reached by
    every cell inside it). Fills ``lb[b]`` (lower bound of score_a - score_b), per tree the
    spread of its margin ``trange[t]`` and in ``top_n[t]`` its root-most undecided split
    node, or its only reachable leaf when the tree is constant on the region.

    It also records, per tree: ``tmin[t, b]``, its own minimum of the margin (plus
    ``trange[t]``, its maximum when there are two classes); and for :func:`sweep_bound`
    ``tfeat[t]``, the one feature all its undecided nodes test (-1 if none or several),
    and in ``rec`` = (slo, shi, lnode, llo, lhi, tleaf, tnleaf, tfm, rend) its reachable
    leaves ``lnode[tleaf[t]:tleaf[t] + tnleaf[t]]`` with their cell intervals along the
    feature of ``top_n[t]`` (``llo``, ``lhi``; ``slo``, ``shi`` are DFS stacks; the leaf
    arrays come from :func:`bounds_workspace`), the bits (:func:`feature_bit`) of the
    features its undecided nodes test (``tfm[t]``) and, in ``rend[0]``, the records' end.

    When the box is a piece of the box last bounded, for the same ``a``, that differs from
    it only by narrower cell ranges on the features of the bits ``chg``, a tree none of
    whose undecided nodes tests one of those features reaches the same leaves with the
    same intervals: its results and records are left as they are, and only the other trees
    are walked again (their records appended). Every output is then what a walk of all the
    trees gives, bit for bit (the bounds are summed from ``tmin`` in the order of ``act``
    either way). ``chg`` = :data:`ALL_CHANGED` walks every tree, and so does any ``chg``
    once the records end past ``rend[1]``, where the other trees' might not fit (-1 in a
    workspace made without room for them, see :func:`bounds_workspace`).

    Returns min over b != a of lb[b].
    """
    slo, shi, lnode, llo, lhi, tleaf, tnleaf, tfm, rend = rec
    c = cs.shape[0]
    if chg == ALL_CHANGED or rend[0] > rend[1]:
        chg = ALL_CHANGED
        n_rec = 0  # records from the start
    else:
        n_rec = rend[0]
    for i in range(n_act):
        t = act[i]
        if chg != ALL_CHANGED and (tfm[t] & chg) == 0:
            continue
        fm = np.int64(0)
        for b in range(c):
            mn[b] = np.inf
            mx[b] = -np.inf
        mn[a] = 0.0
        mx[a] = 0.0
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
            while True:  # down the path, stacking only the left child of undecided nodes
                f = nf[node]
                if f < 0:
                    if c == 2:  # the other class alone (a's margin over itself stays 0)
                        b = 1 - a
                        d = nv[node, a] - nv[node, b]
                        if d < mn[b]:
                            mn[b] = d
                        if d > mx[b]:
                            mx[b] = d
                    else:
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
                    break
                cut = ncut[node]
                go_l = lo[f] <= cut
                go_r = hi[f] > cut
                if go_l and go_r:
                    fm |= feature_bit(f)
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
                    sp = push_sides(stack, slo, shi, sp, nl[node], nr[node], c_lo, c_hi, cut)
                    break
                if go_l and go_r:
                    stack[sp] = nl[node]
                    slo[sp] = c_lo
                    shi[sp] = c_hi
                    sp += 1
                    node = nr[node]  # the right child first, as popping the stack would
                elif go_l:
                    node = nl[node]
                else:
                    node = nr[node]
        tnleaf[t] = n_rec - tleaf[t]
        top_n[t] = top if top >= 0 else node  # constant tree: its only reachable leaf
        spread = 0.0
        for b in range(c):
            if b != a and mx[b] - mn[b] > spread:
                spread = mx[b] - mn[b]
        trange[t] = spread
        tfeat[t] = feat if feat >= 0 else -1
        tfm[t] = fm
        for b in range(c):
            tmin[t, b] = mn[b]
    rend[0] = n_rec
    for b in range(c):
        lb[b] = cs[a] - cs[b]
    for i in range(n_act):
        t = act[i]
        for b in range(c):
            if b != a:
                lb[b] += tmin[t, b]
    worst = np.inf
    for b in range(c):
        if b != a and lb[b] < worst:
            worst = lb[b]
    return worst


# The sweep bound is tried only when the interval bound misses by less than this fraction
# of the live trees' summed spread: beyond it the sweep almost never certifies (PD 100x5,
# mixed-region search: same boxes popped, 30% less time than trying it on every box).
SWEEP_REACH = 0.25


@njit(**NO_NRT)
def spread_sum(act, n_act, trange):
    """Summed margin spread of the trees ``act[:n_act]`` (from :func:`interval_bound`)."""
    total = 0.0
    for i in range(n_act):
        total += trange[act[i]]
    return total


@njit(cache=True, nogil=True)
def bounds_workspace(n_nodes, T, c, max_depth_nodes, reuse=False):
    """Per-tree outputs and leaf records (``tfeat``, ``tmin``, ``rec``) of
    :func:`interval_bound`, for an ensemble of ``n_nodes`` nodes in ``T`` trees. A walk of
    every tree records at most one entry per node. With ``reuse``, the records have room
    for the walks that keep other trees' records and append theirs (``chg``); without
    (a build's), every walk is a walk of all trees, in half the memory."""
    d = max_depth_nodes
    n_leaf = 2 * n_nodes + 2 if reuse else n_nodes
    rec = (np.zeros(d, dtype=np.int32), np.zeros(d, dtype=np.int32),
           np.empty(n_leaf, dtype=np.int32), np.empty(n_leaf, dtype=np.int32),
           np.empty(n_leaf, dtype=np.int32), np.empty(T, dtype=np.int32),
           np.empty(T, dtype=np.int32), np.zeros(T, dtype=np.int64),
           # the records' end, and the last end a walk of some trees may start from
           np.array([0, n_nodes + 1 if reuse else -1], dtype=np.int64))
    return np.empty(T, dtype=np.int32), np.empty((T, c)), rec


@njit(cache=True, nogil=True)
def sweep_workspace(coff, m, c, max_depth_nodes):
    """Workspace ``sw`` of :func:`sweep_bound`."""
    d = max_depth_nodes
    return (np.zeros((coff[-1] + m, c)), np.zeros(m, dtype=np.int32),
            np.empty(d, dtype=np.int32), np.empty((d, c)), np.empty((m, c)), np.empty(c),
            np.empty((m, c), dtype=np.int32), np.full(3, -1, dtype=np.int64))


@njit(**NO_NRT)
def sweep_bound(lo, hi, a, act, n_act, cs, nv, nf, tfeat, top_n, rec, coff, lb, sw, shrink,
                  tmask, tol, nlo, nhi):
    """Lower bounds of the margin of class ``a`` over the region ``lo..hi``, tighter than
    :func:`interval_bound`, from the per-tree results it recorded (``tfeat``, ``top_n``,
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
    from :func:`sweep_workspace`: ``diff`` (shape (n_cells + m, c); each feature owns one
    spare slot past its last cell) and ``touched`` (shape (m,)), both zero on entry and
    left zero, ``seg`` and ``segmin`` (segments of one tree), ``flow`` and ``run``, and ``amin``
    (shape (m, c)): per feature and class b, the cell where the summed projections of the
    margin over b are lowest (-1 on features no tree was projected on). Fills
    ``lb[b]`` (shape (c,), lower bound of score_a - score_b).

    With ``shrink`` (and ``a`` not a target class of ``tmask``), the same sums also bound
    the margin per cell along each feature: a cell j of feature f where, for every target
    class b, ``lb[b] - (f's minimum) + (f's sum at j) > tol`` holds no target point (class
    a beats b there by more than the tolerance). ``nlo``, ``nhi`` (shape (m,)) receive the
    region narrowed, per feature, to the hull of the other cells: it holds every target
    point of the region. ``gap`` (shape (3,)) receives the widest run of such cells inside
    one of those hulls, of at least :data:`GAP_MIN_CELLS` cells: its feature and its first
    and last cell (feature -1 when there is none); the narrowed box less that run still
    holds every target point.

    Returns (min over b != a of lb[b], whether the region was narrowed or holds a gap).
    """
    diff, touched, seg, segmin, flow, run_b, amin, gap = sw
    gap[0] = -1
    _, _, lnode, llo, lhi, tleaf, tnleaf, _, _ = rec
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
        if c == 2:
            # Two classes: only the margin over the other class (a's margin over itself
            # stays zero). On 39k boxes sampled from Credit RF 100x5 searches, the sweep's
            # share of a box went 4.7 -> 4.2 us.
            _project2(a, q0, q1, lnode, llo, lhi, nv, diff, j_base, hi[f0], tfeat[t] >= 0, seg,
                      segmin)
            continue
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
        n_seg = _segment_starts(q0, q1, llo, seg)
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
                    amin[f, b] = j - j0
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
            for b in range(c):
                amin[f, b] = -1
            continue
        touched[f] = 0
        j0 = coff[f] + f
        if shrink and worst <= tol:
            first, last, g0, g1 = _target_hull(diff[j0 + lo[f]:j0 + hi[f] + 1], a, lb,
                                               flow[f], run_b, tmask, tol)
            if first > 0 or (first >= 0 and last < hi[f] - lo[f]):
                nlo[f] = lo[f] + first
                nhi[f] = lo[f] + last
                narrowed = True
            if g1 - g0 + 1 >= GAP_MIN_CELLS and (gap[0] < 0 or g1 - g0 > gap[2] - gap[1]):
                gap[0] = f
                gap[1] = lo[f] + g0
                gap[2] = lo[f] + g1
                narrowed = True
        diff[j0 + lo[f]:j0 + hi[f] + 2] = 0.0
    return worst, narrowed


@njit(**NO_NRT)
def _project2(a, q0, q1, lnode, llo, lhi, nv, diff, j_base, last, one_feature, seg, segmin):
    """:func:`sweep_bound`'s projection of one tree, with two classes: its leaf records
    ``q0..q1`` added to the differences ``diff[:, 1 - a]`` from row ``j_base`` (the
    feature's cells, the last ``last``). A one-feature tree's leaves tile the range;
    otherwise the leaves' interval starts cut it into segments (every interval end is
    followed by another leaf's start), each at the least leaf covering it."""
    b1 = 1 - a
    if one_feature:
        for q in range(q0, q1):
            node = lnode[q]
            v = nv[node, a] - nv[node, b1]
            diff[j_base + llo[q], b1] += v
            diff[j_base + lhi[q] + 1, b1] -= v
        return
    n_seg = _segment_starts(q0, q1, llo, seg)
    for r in range(n_seg):
        segmin[r, b1] = np.inf
    for q in range(q0, q1):
        node = lnode[q]
        v = nv[node, a] - nv[node, b1]
        l0 = llo[q]
        l1 = lhi[q]
        for r in range(n_seg):
            sr = seg[r]
            if sr > l1:
                break
            if sr >= l0 and v < segmin[r, b1]:
                segmin[r, b1] = v
    for r in range(n_seg):
        j0 = j_base + seg[r]
        j1 = j_base + (seg[r + 1] if r + 1 < n_seg else last + 1)
        diff[j0, b1] += segmin[r, b1]
        diff[j1, b1] -= segmin[r, b1]


@njit(**NO_NRT)
def _segment_starts(q0, q1, llo, seg):
    """The distinct interval starts ``llo[q0:q1]``, sorted into ``seg``; returns how many."""
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
    return n_seg


# A run of at least this many cells that hold no target point, inside the hull a box is
# narrowed to, splits the narrowed box in two around it. Credit RF 100x5, 200 probe
# queries, same distances: l1 0.95x the boxes, 0.89x the time, the slowest 2.2 -> 1.6 s;
# l2 0.94x the boxes, 0.88x the time, p99 1.07 -> 0.66 s (medians unchanged). Runs of 1, 8
# or 16 cells did about as well.
GAP_MIN_CELLS = 4


@njit(cache=True, nogil=True)
def _target_hull(diff, a, lb, flow, run_b, tmask, tol):
    """Positions of the first and last of one feature's cells in a box (``diff``, shape
    (n, c): their sums' differences, row 0 the box's first cell) where the margin of ``a``
    over some target class ``b`` may be ``tol`` or less: ``lb[b] - flow[b]`` (the bound
    without the feature's own minimum ``flow``, shape (c,)) plus the feature's running
    sum; (-1, -1) when there is none. Then the first and last position of the widest run
    of other cells between those two; (-1, -2) when there is none (a run of 0 cells).
    Returns the four positions. ``run_b`` (shape (c,)) is scratch."""
    c = lb.shape[0]
    first = -1
    last = -1
    g0 = -1
    g1 = -2
    if c == 2:
        # One other class: no loop over the classes inside the loop over the cells. With
        # interval_bound's two-class branch, Credit RF 100x5 (19 l1 queries, the same
        # boxes) took 0.86-0.90x the time.
        b = 1 - a
        if tmask[b]:
            rest = lb[b] - flow[b]
            run = 0.0
            for j in range(diff.shape[0]):
                run += diff[j, b]
                if rest + run <= tol:
                    first, last, g0, g1 = _take_cell(j, first, last, g0, g1)
        return first, last, g0, g1
    for b in range(c):
        run_b[b] = 0.0
    for j in range(diff.shape[0]):
        out = True
        for b in range(c):
            run_b[b] += diff[j, b]
            if tmask[b] and b != a and lb[b] - flow[b] + run_b[b] <= tol:
                out = False
        if not out:
            first, last, g0, g1 = _take_cell(j, first, last, g0, g1)
    return first, last, g0, g1


@njit(inline="always")
def _take_cell(j, first, last, g0, g1):
    """:func:`_target_hull`'s step at a cell ``j`` that may hold a target: the hull
    ``first..last`` grows to it, and the run of other cells before it becomes ``g0..g1``
    when it is the widest yet. Returns (first, last, g0, g1)."""
    if first < 0:
        first = j
    elif j - last - 2 > g1 - g0:
        g0 = last + 1
        g1 = j - 1
    return first, j, g0, g1


__all__ = [
    "ALL_CHANGED",
    "GAP_MIN_CELLS",
    "SWEEP_REACH",
    "bounds_workspace",
    "decide",
    "feature_bit",
    "interval_bound",
    "label_cell",
    "label_cell_leaves",
    "push_sides",
    "spread_sum",
    "sweep_bound",
    "sweep_workspace",
]
