"""The dual bound: a lower bound of a class margin over a box that couples the trees.

:func:`~maps_core._bounds.interval_bound` lets every tree take its worst leaf on its own,
and :func:`~maps_core._bounds.sweep_bound` couples only the trees projected on the same
feature. On averaging ensembles (random forests on loan data) both stay far below the
true minimum: the trees' worst leaves ask for contradictory positions of x on several
features at once.

Here every live tree gets its own copy of x, and the copies are tied to one x per
feature by Lagrange multipliers (dual decomposition). For any multipliers
``theta[t, f](s)``, per tree ``t``, feature ``f`` it tests in the box and *segment* ``s``
of ``f`` (a run of cells between two consecutive cuts of that tree)::

    margin(x) = sum_t [v_t(x) + sum_f theta[t, f](x_f)] + sum_f [-sum_t theta[t, f](x_f)]
             >= sum_t min_leaf [v_leaf + sum_f min over the leaf's segments of theta[t, f]]
                + sum_f min_u [-sum_t theta[t, f](u)],

since the leaf a point reaches and the segments it lies in are among those minimised
over (``u`` runs over *atoms*: runs of cells between consecutive cuts of all the live
trees, on which every tree's segment is fixed). The bound holds for every choice of
``theta``; with ``theta = 0`` it is the interval bound. Block coordinate ascent over one
feature's multipliers at a time (the star update of max-product linear programming,
MPLP: each tree's min-marginal along ``f`` is replaced by an equal share of their sum,
then lowered to its least value over each of the tree's segments, which changes no
tree's term and can only raise the feature's) raises it towards the optimum of the
linear relaxation with leaf consistency. A tree's multipliers are kept per segment, and
a feature's sums over atoms are built with difference arrays and minimised over segments
with a sparse table, so a round costs about trees x segments, not trees x atoms.

With a distance bound (l1, l2) the search only needs the points nearer than ``bound``: a
multiplier ``lam >= 0`` on "the distance beyond the box's own term is at most ``room``" adds
``lam`` times each atom's extra distance to its feature's term and subtracts ``lam * room``.
That part is sound only for dropping a box (no point *within reach* is a target).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._norms import L1, L2
from .distance import gap_term

#: Capacity of the per-leaf and per-segment records of one dual bound; a box whose live
#: trees need more is left to the other bounds.
MAX_ENTRIES = 1 << 20


@njit(cache=True, nogil=True)
def dual_workspace(n_nodes, T, m, n_cells, max_depth_nodes):
    """Workspace ``dw`` of :func:`dual_bound`, allocated once per search round.

    ``n_nodes``: nodes of the ensemble; ``T`` trees; ``m`` features; ``n_cells`` the grid's
    cells (``coff[-1]``); ``max_depth_nodes`` room for a DFS stack over one tree."""
    n_at = n_cells + m  # atoms of all features together, at most
    ecap = max(min(T * m, MAX_ENTRIES), 1)  # (tree, feature) entries
    scap = max(min(n_nodes + ecap, MAX_ENTRIES), 1)  # segments: cuts + 1 per entry
    rcap = max(min(n_nodes * m, MAX_ENTRIES), 1)  # (leaf, feature) ranges
    lg = np.zeros(n_at + 2, dtype=np.int32)  # floor(log2(i))
    for i in range(2, n_at + 2):
        lg[i] = lg[i // 2] + 1
    return (
        np.empty(scap, dtype=np.int32),  # 0 fcut: each feature's live cuts, sorted
        np.empty(m + 1, dtype=np.int64),  # 1 foff: first of them, per feature
        np.empty(m + 1, dtype=np.int64),  # 2 aoff: first atom of each feature
        np.empty(n_at),  # 3 unary: lam x extra distance, per atom
        np.empty(n_at),  # 4 ext: extra distance, per atom
        np.empty(n_at + 1),  # 5 msum: one feature's sums over its atoms (scratch)
        np.empty(n_at + 1),  # 6 tsum: the trees' summed multipliers, per atom
        np.empty((lg[n_at + 1] + 1, n_at)),  # 7 sparse table of msum
        lg,  # 8
        np.empty(T + 1, dtype=np.int64),  # 9 tfe: live tree -> first entry
        np.empty(T + 1, dtype=np.int64),  # 10 tle: live tree -> first leaf record
        np.empty(ecap, dtype=np.int32),  # 11 ef: entry -> feature
        np.empty(ecap + 1, dtype=np.int64),  # 12 eseg: entry -> first segment
        np.empty(ecap, dtype=np.int32),  # 13 etree: entry -> live tree
        np.empty(ecap, dtype=np.int32),  # 14 eslot: entry -> slot in its tree's list
        np.empty(ecap, dtype=np.int64),  # 15 flist: entries grouped by feature
        np.empty(scap, dtype=np.int32),  # 16 cuts of each entry, sorted, then
        np.empty(scap, dtype=np.int32),  # 17 sg_lo: segment -> first atom
        np.empty(scap, dtype=np.int32),  # 18 sg_hi: segment -> last atom
        np.empty(scap),  # 19 theta: multipliers, per segment
        np.empty(scap),  # 20 mm: min-marginals, per segment (scratch)
        np.empty(n_nodes),  # 21 r: leaf record -> current adjusted margin
        np.empty(n_nodes + 1, dtype=np.int64),  # 22 lstart: leaf record -> first range
        np.empty(rcap, dtype=np.int32),  # 23 ralo: range -> first segment (of its entry)
        np.empty(rcap, dtype=np.int32),  # 24 rahi: range -> last segment
        np.empty(rcap),  # 25 rcon: range -> its least multiplier
        np.full(m, -1, dtype=np.int32),  # 26 fslot: feature -> entry (scratch, left -1)
        np.empty(max_depth_nodes, dtype=np.int32),  # 27 DFS stack: node
        np.empty(max_depth_nodes, dtype=np.int32),  # 28 DFS stack: depth
        np.empty(max_depth_nodes + 1, dtype=np.int32),  # 29 path from the start node
        np.empty(m + 1, dtype=np.int64),  # 30 fptr: feature -> first of its entries
        np.empty(T, dtype=np.int32),  # 31 ttree: live tree -> tree id
        np.empty(m, dtype=np.int32),  # 32 rlo: a leaf's first cell per listed feature
        np.empty(m, dtype=np.int32),  # 33 rhi: its last cell
        np.empty(max_depth_nodes, dtype=np.int32),  # 34 pe: one tree's cuts: entry
        np.empty(max_depth_nodes, dtype=np.int32),  # 35 pc: and cut
    )


@njit(cache=True, nogil=True)
def _scan_tree(t, lo, hi, nf, ncut, nl, nr, start, stack, fslot, ef, nef, pe, pc, ecut, eseg,
               nseg):
    """First pass over tree ``t``: list the features its undecided nodes test (entries
    appended to ``ef`` from ``nef``) and each entry's cuts, sorted and distinct (``ecut``
    from ``eseg[entry]``; the entry has one segment more than cuts).
    ``fslot`` is left all -1. Returns (nef, nseg), nef -1 when the records are full."""
    fstart = nef
    stack[0] = start[t]
    sp = 1
    n_p = 0
    full = False
    while sp > 0:
        sp -= 1
        node = stack[sp]
        f = nf[node]
        if f < 0:
            continue
        cut = ncut[node]
        go_l = lo[f] <= cut
        go_r = hi[f] > cut
        if go_l and go_r:
            if fslot[f] < 0:
                if nef >= ef.shape[0]:
                    full = True
                    break
                fslot[f] = nef
                ef[nef] = f
                nef += 1
            pe[n_p] = fslot[f]
            pc[n_p] = cut
            n_p += 1
        if go_l:
            stack[sp] = nl[node]
            sp += 1
        if go_r:
            stack[sp] = nr[node]
            sp += 1
    for k in range(fstart, nef):
        fslot[ef[k]] = -1
        if full:
            continue
        eseg[k] = nseg
        n_c = 0
        for q in range(n_p):  # this entry's cuts, sorted and distinct
            if pe[q] != k:
                continue
            if nseg + n_c + 1 >= ecut.shape[0]:
                full = True
                break
            n_c = _insert_distinct(ecut, nseg, n_c, pc[q])
        nseg += n_c + 1
    return (-1 if full else nef), nseg


@njit(cache=True, nogil=True)
def _insert_distinct(arr, base, n, c):
    """Insert ``c`` into the sorted, distinct run ``arr[base:base + n]`` (room for one more
    is the caller's); returns the run's new length."""
    pos = n
    while pos > 0 and arr[base + pos - 1] > c:
        pos -= 1
    if pos > 0 and arr[base + pos - 1] == c:
        return n
    for j in range(n, pos, -1):
        arr[base + j] = arr[base + j - 1]
    arr[base + pos] = c
    return n + 1


@njit(cache=True, nogil=True)
def _segment(ecut, s0, n_cut, cell):
    """Index of the segment holding ``cell`` among an entry's ``n_cut`` sorted cuts."""
    s = 0
    while s < n_cut and ecut[s0 + s] < cell:
        s += 1
    return s


@njit(cache=True, nogil=True)
def _record_leaves(t, lo, hi, a, b, nf, ncut, nl, nr, nv, start, stack, sdep, path, ef, f0, f1,
                   eseg, ecut, fslot, rlo, rhi, r, lstart, nleaf, ralo, rahi, rcon, nrange):
    """Second pass over tree ``t``: each reachable leaf's margin (into ``r``) and, per
    listed entry ``f0..f1``, the segments of the entry its cells span (``ralo``, ``rahi``;
    ``rcon`` zeroed). ``fslot``, ``rlo`` and ``rhi`` are scratch (shape (m,); ``fslot`` all
    -1 on entry and exit). Returns (nrange, nleaf), nrange -1 when the records are full."""
    cap = ralo.shape[0]
    for k in range(f0, f1):
        fslot[ef[k]] = k - f0
    stack[0] = start[t]
    sdep[0] = 0
    sp = 1
    while sp > 0:
        sp -= 1
        node = stack[sp]
        dep = sdep[sp]
        path[dep] = node
        f = nf[node]
        if f < 0:
            if nrange + (f1 - f0) > cap or nleaf >= r.shape[0]:
                nrange = -1
                break
            r[nleaf] = nv[node, a] - nv[node, b]
            lstart[nleaf] = nrange
            for k in range(f0, f1):
                rlo[k - f0] = lo[ef[k]]
                rhi[k - f0] = hi[ef[k]]
            for d in range(dep):  # the path's constraints on the listed features
                p = path[d]
                sl = fslot[nf[p]]
                if sl >= 0:
                    if path[d + 1] == nl[p]:
                        rhi[sl] = min(rhi[sl], ncut[p])
                    else:
                        rlo[sl] = max(rlo[sl], ncut[p] + 1)
            for k in range(f0, f1):
                s0 = eseg[k]
                n_cut = eseg[k + 1] - s0 - 1
                ralo[nrange] = _segment(ecut, s0, n_cut, rlo[k - f0])
                rahi[nrange] = _segment(ecut, s0, n_cut, rhi[k - f0])
                rcon[nrange] = 0.0
                nrange += 1
            nleaf += 1
            continue
        cut = ncut[node]
        if lo[f] <= cut:
            stack[sp] = nl[node]
            sdep[sp] = dep + 1
            sp += 1
        if hi[f] > cut:
            stack[sp] = nr[node]
            sdep[sp] = dep + 1
            sp += 1
    for k in range(f0, f1):
        fslot[ef[k]] = -1
    return nrange, nleaf


@njit(cache=True, nogil=True)
def _feature_cuts(m, ef, eseg, ecut, fptr, flist, fcut, foff, aoff):
    """Every feature's live cuts (the union of its entries' cuts, the entries grouped by
    ``fptr``, ``flist``), sorted and distinct, in ``fcut[foff[f]:foff[f] + n]``, and the
    first atom of each feature (``aoff``: a feature with n cuts has n + 1 atoms). Returns
    False when ``fcut`` is too small."""
    foff[0] = 0
    for f in range(m):
        foff[f + 1] = foff[f]
        for q in range(fptr[f], fptr[f + 1]):
            k = flist[q]
            foff[f + 1] += eseg[k + 1] - eseg[k] - 1
    if foff[m] > fcut.shape[0]:
        return False
    n_at = 0
    for f in range(m):
        aoff[f] = n_at
        n = 0
        base = foff[f]
        for qq in range(fptr[f], fptr[f + 1]):
            k = flist[qq]
            for q in range(eseg[k], eseg[k + 1] - 1):
                n = _insert_distinct(fcut, base, n, ecut[q])
        n_at += n + 1
        aoff[f + 1] = n_at
    return True


@njit(cache=True, nogil=True)
def _atom_of(f, cell, fcut, foff, aoff):
    """The atom of feature ``f`` holding ``cell``: how many of its live cuts lie before."""
    n_cut = aoff[f + 1] - aoff[f] - 1
    return np.searchsorted(fcut[foff[f]:foff[f] + n_cut], cell)


@njit(cache=True, nogil=True)
def _segments(n_e, ef, eseg, ecut, lo, hi, fcut, foff, aoff, theta, sg_lo, sg_hi):
    """Each entry's segments as atom ranges of its feature, multipliers zeroed."""
    for k in range(n_e):
        f = ef[k]
        s0 = eseg[k]
        n_cut = eseg[k + 1] - s0 - 1
        first = lo[f]
        for s in range(n_cut + 1):
            last = ecut[s0 + s] if s < n_cut else hi[f]
            sg_lo[s0 + s] = _atom_of(f, first, fcut, foff, aoff)
            sg_hi[s0 + s] = _atom_of(f, last, fcut, foff, aoff)
            theta[s0 + s] = 0.0
            first = last + 1


@njit(cache=True, nogil=True)
def _extras(lo, hi, x, w, norm, gcol, coff, clow, cupp, fcut, foff, aoff, bound, ext):
    """Per atom, its extra distance beyond the box's own term on its feature (into
    ``ext``; l1, l2 in accumulated form). Returns the room: ``bound`` less the box's own
    terms, group columns and integral rounding left out (both only add to a point's
    distance, so a point nearer than ``bound`` has extra distances summing to less than
    the room); 0 when there is no ball to use (another norm, or no bound)."""
    m = lo.shape[0]
    use = bound < np.inf and (norm == L1 or norm == L2)
    tot = 0.0
    for f in range(m):
        if gcol[f] == -1:  # a plain feature (a nominal one's term is left out too)
            gb = gap_term(x, w, f, lo[f], hi[f], coff, clow, cupp)
            tot += gb if norm == L1 else gb * gb
    room = bound - tot if use else 0.0
    for f in range(m):
        gb = gap_term(x, w, f, lo[f], hi[f], coff, clow, cupp)
        n_cut = aoff[f + 1] - aoff[f] - 1
        first = lo[f]
        for u in range(n_cut + 1):  # atom u: cells first..last
            last = fcut[foff[f] + u] if u < n_cut else hi[f]
            e = 0.0
            if room > 0.0 and gcol[f] == -1:
                g = gap_term(x, w, f, first, last, coff, clow, cupp)
                e = g - gb if norm == L1 else g * g - gb * gb
            ext[aoff[f] + u] = max(e, 0.0)
            first = last + 1
    return max(room, 0.0)


@njit(cache=True, nogil=True)
def _index_entries(m, n_tr, tfe, ef, fptr, flist, etree, eslot, fslot):
    """Group the entries by feature (``fptr``, ``flist``) and note each one's tree and
    slot within the tree's list."""
    for f in range(m + 1):
        fptr[f] = 0
    for i in range(n_tr):
        for k in range(tfe[i], tfe[i + 1]):
            fptr[ef[k] + 1] += 1
            etree[k] = i
            eslot[k] = k - tfe[i]
    for f in range(m):
        fptr[f + 1] += fptr[f]
    for f in range(m):
        fslot[f] = fptr[f]  # fill pointers
    for k in range(tfe[n_tr]):
        g = ef[k]
        flist[fslot[g]] = k
        fslot[g] += 1
    for f in range(m):
        fslot[f] = -1


@njit(cache=True, nogil=True)
def _feature_sums(f, fptr, flist, eseg, sg_lo, sg_hi, vals, out):
    """``out[u]`` (shape at least atoms of ``f`` + 1) = the sum over the entries of ``f`` of
    ``vals`` at the segment holding atom ``u``: one difference array."""
    na = 0
    for q in range(fptr[f], fptr[f + 1]):
        k = flist[q]
        na = max(na, sg_hi[eseg[k + 1] - 1] + 1)
    for u in range(na + 1):
        out[u] = 0.0
    for q in range(fptr[f], fptr[f + 1]):
        k = flist[q]
        for s in range(eseg[k], eseg[k + 1]):
            out[sg_lo[s]] += vals[s]
            out[sg_hi[s] + 1] -= vals[s]
    run = 0.0
    for u in range(na):
        run += out[u]
        out[u] = run


@njit(cache=True, nogil=True)
def _star_update(f, fptr, flist, etree, eslot, eseg, sg_lo, sg_hi, aoff, unary, msum, sp, lg,
                 theta, mm, tle, lstart, r, ralo, rahi, rcon):
    """The best multipliers of feature ``f`` given all others: each tree's min-marginal
    along ``f`` is replaced by an equal share of their sum (with the feature's unary),
    lowered to its least value over each of the tree's segments."""
    n_f = fptr[f + 1] - fptr[f]
    a0 = aoff[f]
    na = aoff[f + 1] - a0
    # min-marginals of the trees along f, without f's own multipliers
    for q in range(fptr[f], fptr[f + 1]):
        k = flist[q]
        i = etree[k]
        sl = eslot[k]
        s0 = eseg[k]
        for s in range(s0, eseg[k + 1]):
            mm[s] = np.inf
        for lf in range(tle[i], tle[i + 1]):
            e = lstart[lf] + sl
            v = r[lf] - rcon[e]
            for s in range(s0 + ralo[e], s0 + rahi[e] + 1):
                if v < mm[s]:
                    mm[s] = v
    _feature_sums(f, fptr, flist, eseg, sg_lo, sg_hi, mm, msum)
    # msum + unary, and its sparse table for the least value over any run of atoms
    for u in range(na):
        sp[0, u] = msum[u] + unary[a0 + u]
    j = 1
    while (1 << j) <= na:
        h = 1 << (j - 1)
        for u in range(na - (1 << j) + 1):
            sp[j, u] = min(sp[j - 1, u], sp[j - 1, u + h])
        j += 1
    share = 1.0 / (n_f + 1)
    for q in range(fptr[f], fptr[f + 1]):
        k = flist[q]
        i = etree[k]
        sl = eslot[k]
        s0 = eseg[k]
        for s in range(s0, eseg[k + 1]):
            ln = lg[sg_hi[s] - sg_lo[s] + 1]
            low = min(sp[ln, sg_lo[s]], sp[ln, sg_hi[s] - (1 << ln) + 1])
            theta[s] = low * share - mm[s]
        for lf in range(tle[i], tle[i + 1]):
            e = lstart[lf] + sl
            c = np.inf
            for s in range(s0 + ralo[e], s0 + rahi[e] + 1):
                if theta[s] < c:
                    c = theta[s]
            r[lf] += c - rcon[e]
            rcon[e] = c


@njit(cache=True, nogil=True)
def _tree_sums(m, fptr, flist, eseg, sg_lo, sg_hi, aoff, theta, msum, tsum):
    """``tsum[u]``: the trees' summed multipliers at every atom of every feature that
    some tree tests (``msum`` scratch)."""
    for f in range(m):
        if fptr[f + 1] == fptr[f]:
            continue
        _feature_sums(f, fptr, flist, eseg, sg_lo, sg_hi, theta, msum)
        for u in range(aoff[f + 1] - aoff[f]):
            tsum[aoff[f] + u] = msum[u]


@njit(cache=True, nogil=True)
def _dual_value(const, n_tr, tle, r, m, fptr, aoff, unary, tsum):
    """The bound for the current multipliers (``tsum`` from :func:`_tree_sums`): ``const``
    (with ``- lam * room``) plus the trees' least adjusted leaves plus, per feature, the
    least atom of its unary minus the trees' multipliers."""
    tot = const
    for i in range(n_tr):
        low = np.inf
        for lf in range(tle[i], tle[i + 1]):
            if r[lf] < low:
                low = r[lf]
        tot += low
    for f in range(m):
        if fptr[f + 1] == fptr[f]:
            continue  # no tree: its unary's least is 0 (the box's nearest cells)
        low = np.inf
        for u in range(aoff[f], aoff[f + 1]):
            low = min(low, unary[u] - tsum[u])
        tot += low
    return tot


@njit(cache=True, nogil=True)
def _best_lambda(m, fptr, aoff, ext, tsum, room, lam):
    """The multiplier of the distance budget that maximises the features' part of the
    bound for the trees' summed multipliers ``tsum``: ``sum_f min_u (lam ext[u] - tsum[u])
    - lam room`` is concave in ``lam`` and its slope (the minimisers' extras less the room)
    falls as ``lam`` grows, so bisection on the slope finds it (to about 1e-6 relative)."""
    lo_l = 0.0
    hi_l = max(2.0 * lam, 1.0 / room)
    while _slope(m, fptr, aoff, ext, tsum, hi_l, room) > 0.0 and hi_l < 1e12 / room:
        lo_l = hi_l
        hi_l *= 4.0
    for _ in range(20):
        mid = 0.5 * (lo_l + hi_l)
        if _slope(m, fptr, aoff, ext, tsum, mid, room) > 0.0:
            lo_l = mid
        else:
            hi_l = mid
    return lo_l


@njit(cache=True, nogil=True)
def _slope(m, fptr, aoff, ext, tsum, lam, room):
    """A subgradient in ``lam`` of the features' part of the bound (see _best_lambda)."""
    total = -room
    for f in range(m):
        if fptr[f + 1] == fptr[f]:
            continue  # no tree: the nearest atom (extra 0) is its minimiser
        low = np.inf
        arg = 0.0
        for u in range(aoff[f], aoff[f + 1]):
            v = lam * ext[u] - tsum[u]
            if v < low:
                low = v
                arg = ext[u]
        total += arg
    return total


@njit(cache=True, nogil=True)
def dual_bound(lo, hi, a, b, act, n_act, cs, nf, ncut, nl, nr, nv, start, x, w, norm, gcol, coff,
               clow, cupp, kappa, bound, sweeps, tol, dw):
    """Lower bound of ``score_a - score_b`` over the points of the box ``lo..hi`` (cells,
    shape (m,)) nearer than ``bound`` from ``x`` (weights ``w``, norm code ``norm``, group
    columns ``gcol``; accumulated form), after at most ``sweeps`` rounds of star updates.
    ``kappa`` sets the distance multiplier's first value (``kappa / room``; re-optimised
    after every round); with ``kappa = 0``, ``bound = inf`` or a norm other than l1 and l2
    the bound holds over the whole box. Stops early once it exceeds ``tol``, or when the
    last round's gain, kept up over the rounds left, could not get it there (with
    ``tol = inf``, after every round).

    ``act[:n_act]`` are the live trees, each from its node ``start[t]``; ``cs`` (shape
    (n_classes,)) the base plus the leaf values of the others; ``coff``, ``clow``,
    ``cupp`` the grid's cells. Returns ``-inf`` when the box's records do not fit the
    workspace ``dw`` (:func:`dual_workspace`)."""
    (fcut, foff, aoff, unary, ext, msum, tsum, sp, lg, tfe, tle, ef, eseg, etree, eslot,
     flist, ecut, sg_lo, sg_hi, theta, mm, r, lstart, ralo, rahi, rcon, fslot, stack, sdep,
     path, fptr, ttree, rlo, rhi, pe, pc) = dw
    m = lo.shape[0]
    const = cs[a] - cs[b]
    # -- pass 1: the live trees' undecided cuts and features; constant trees fold in
    nef = 0
    nseg = 0
    n_tr = 0
    for i in range(n_act):
        t = act[i]
        fstart = nef
        nef, nseg = _scan_tree(t, lo, hi, nf, ncut, nl, nr, start, stack, fslot, ef, nef, pe,
                               pc, ecut, eseg, nseg)
        if nef < 0:
            return -np.inf
        if nef == fstart:  # no undecided node: constant on the box
            leaf = _only_leaf(t, lo, nf, ncut, nl, nr, start)
            const += nv[leaf, a] - nv[leaf, b]
            continue
        ttree[n_tr] = t
        tfe[n_tr] = fstart
        n_tr += 1
    tfe[n_tr] = nef
    eseg[nef] = nseg
    _index_entries(m, n_tr, tfe, ef, fptr, flist, etree, eslot, fslot)
    if not _feature_cuts(m, ef, eseg, ecut, fptr, flist, fcut, foff, aoff):
        return -np.inf
    _segments(nef, ef, eseg, ecut, lo, hi, fcut, foff, aoff, theta, sg_lo, sg_hi)
    room = _extras(lo, hi, x, w, norm, gcol, coff, clow, cupp, fcut, foff, aoff, bound, ext)
    lam = kappa / room if room > 0.0 else 0.0
    for u in range(aoff[m]):
        unary[u] = lam * ext[u]
        tsum[u] = 0.0
    # -- pass 2: leaf records, per tree
    nrange = 0
    nleaf = 0
    for i in range(n_tr):
        tle[i] = nleaf
        nrange, nleaf = _record_leaves(ttree[i], lo, hi, a, b, nf, ncut, nl, nr, nv, start,
                                       stack, sdep, path, ef, tfe[i], tfe[i + 1], eseg, ecut,
                                       fslot, rlo, rhi, r, lstart, nleaf, ralo, rahi, rcon,
                                       nrange)
        if nrange < 0:
            return -np.inf
    tle[n_tr] = nleaf
    lstart[nleaf] = nrange
    # -- block coordinate ascent, one feature's multipliers at a time
    best = _dual_value(const - lam * room, n_tr, tle, r, m, fptr, aoff, unary, tsum)
    last = best
    for s in range(sweeps):
        if best > tol:
            break
        for f in range(m):
            if fptr[f + 1] > fptr[f]:
                _star_update(f, fptr, flist, etree, eslot, eseg, sg_lo, sg_hi, aoff, unary,
                             msum, sp, lg, theta, mm, tle, lstart, r, ralo, rahi, rcon)
        _tree_sums(m, fptr, flist, eseg, sg_lo, sg_hi, aoff, theta, msum, tsum)
        if lam > 0.0:  # the distance budget's multiplier, best for these theta
            lam = _best_lambda(m, fptr, aoff, ext, tsum, room, lam)
            for u in range(aoff[m]):
                unary[u] = lam * ext[u]
        val = _dual_value(const - lam * room, n_tr, tle, r, m, fptr, aoff, unary, tsum)
        best = max(best, val)
        gain = val - last
        last = val
        if tol < np.inf and gain * (sweeps - 1 - s) < tol - best:
            break  # it cannot get there at this pace
    return best


@njit(cache=True, nogil=True)
def _only_leaf(t, lo, nf, ncut, nl, nr, start):
    """The one leaf of tree ``t`` the box reaches (the tree is constant on it)."""
    node = start[t]
    while nf[node] >= 0:
        node = nl[node] if lo[nf[node]] <= ncut[node] else nr[node]
    return node


__all__ = ["MAX_ENTRIES", "dual_bound", "dual_workspace"]
