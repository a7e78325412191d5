"""The dual bound: a lower bound of a class margin over a box that couples the trees.

:func:`~maps_core._bounds.interval_bound` lets every tree take its worst leaf on its own,
and :func:`~maps_core._bounds.sweep_bound` couples only the trees projected on the same
feature. On averaging ensembles (random forests on loan data) both stay far below the
true minimum: the trees' worst leaves ask for contradictory positions of x on several
features at once.

Here every live tree gets its own copy of x, and the copies are tied to one x per
feature by Lagrange multipliers (dual decomposition). For any multipliers
``theta[t, f](u)`` (per tree ``t``, feature ``f`` it tests in the box, and *atom* ``u``: a
run of cells between two consecutive cuts of the live trees on ``f``)::

    margin(x) = sum_t [v_t(x) + sum_f theta[t, f](x_f)] + sum_f [-sum_t theta[t, f](x_f)]
             >= sum_t min_leaf [v_leaf + sum_f min over the leaf's atoms of theta[t, f]]
                + sum_f min_u [-sum_t theta[t, f](u)],

since the leaf a point reaches and the atoms it lies in are among those minimised over.
The bound holds for every choice of ``theta``; with ``theta = 0`` it is the interval bound.
Block coordinate ascent over one feature's multipliers at a time (the star update of
max-product linear programming, MPLP: each tree's min-marginal along ``f`` is replaced by
an equal share of their sum, the best choice for that block) raises it towards the
optimum of the linear relaxation with leaf consistency.

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

#: Capacity (entries) of the leaf-by-feature records of one dual bound; a box whose live
#: trees need more is left to the other bounds.
MAX_ENTRIES = 1 << 20


@njit(cache=True, nogil=True)
def dual_workspace(n_nodes, T, m, n_cells, max_depth_nodes):
    """Workspace ``dw`` of :func:`dual_bound`, allocated once per search round.

    ``n_nodes``: nodes of the ensemble; ``T`` trees; ``m`` features; ``n_cells`` the grid's
    cells (``coff[-1]``); ``max_depth_nodes`` room for a DFS stack over one tree."""
    cap = min(MAX_ENTRIES, max(n_nodes * m, 1))
    return (
        np.zeros(n_cells + m, dtype=np.int32),  # 0 mark: a live cut after this cell
        np.empty(n_cells + m, dtype=np.int32),  # 1 cell -> atom (within its feature)
        np.empty(m + 1, dtype=np.int64),  # 2 aoff: first atom of each feature
        np.empty(n_cells + m),  # 3 unary: lam x extra distance, per atom
        np.empty(n_cells + m),  # 4 ext: extra distance, per atom
        np.empty(n_cells + m),  # 5 msum: per atom, summed min-marginals (scratch)
        np.empty(T + 1, dtype=np.int64),  # 6 tfe: live tree -> first feature entry
        np.empty(T + 1, dtype=np.int64),  # 7 tle: live tree -> first leaf record
        np.empty(cap, dtype=np.int32),  # 8 ef: feature entry -> feature
        np.empty(cap, dtype=np.int64),  # 9 eth: feature entry -> first multiplier
        np.empty(cap),  # 10 theta: multipliers
        np.empty(n_nodes),  # 11 r: leaf record -> current adjusted margin
        np.empty(n_nodes + 1, dtype=np.int64),  # 12 lstart: leaf record -> first range
        np.empty(cap, dtype=np.int32),  # 13 ralo: range -> first atom
        np.empty(cap, dtype=np.int32),  # 14 rahi: range -> last atom
        np.empty(cap),  # 15 rcon: range -> its least multiplier
        np.full(m, -1, dtype=np.int32),  # 16 fslot: feature -> entry (scratch, left -1)
        np.empty(max_depth_nodes, dtype=np.int32),  # 17 DFS stack: node
        np.empty(max_depth_nodes, dtype=np.int32),  # 18 DFS stack: depth
        np.empty(max_depth_nodes + 1, dtype=np.int32),  # 19 path from the start node
        np.empty(m + 1, dtype=np.int64),  # 20 fptr: feature -> first of its entries
        np.empty(cap, dtype=np.int64),  # 21 flist: entries grouped by feature
        np.empty(cap, dtype=np.int32),  # 22 etree: entry -> live tree
        np.empty(cap, dtype=np.int32),  # 23 eslot: entry -> slot within its tree's list
        np.empty(T, dtype=np.int32),  # 24 ttree: live tree -> tree id
        np.empty(m, dtype=np.int32),  # 25 rlo: a leaf's first cell per listed feature
        np.empty(m, dtype=np.int32),  # 26 rhi: its last cell
    )


@njit(cache=True, nogil=True)
def _scan_tree(t, lo, hi, nf, ncut, nl, nr, start, stack, mark, coff, fslot, ef, nef):
    """First pass over tree ``t``: mark the cuts of its undecided nodes and list the
    features they test (appended to ``ef`` from ``nef``; ``fslot`` is left all -1).
    Returns the new ``nef``, -1 when ``ef`` is full."""
    fstart = nef
    cap = ef.shape[0]
    stack[0] = start[t]
    sp = 1
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
            mark[coff[f] + f + cut] = 1
            if fslot[f] < 0:
                if nef >= cap:
                    full = True
                    break
                fslot[f] = nef
                ef[nef] = f
                nef += 1
        if go_l:
            stack[sp] = nl[node]
            sp += 1
        if go_r:
            stack[sp] = nr[node]
            sp += 1
    for k in range(fstart, nef):
        fslot[ef[k]] = -1
    return -1 if full else nef


@njit(cache=True, nogil=True)
def _record_leaves(t, lo, hi, a, b, nf, ncut, nl, nr, nv, start, stack, sdep, path, coff,
                   cell2atom, ef, f0, f1, fslot, rlo, rhi, r, lstart, nleaf, ralo, rahi, rcon,
                   nrange):
    """Second pass over tree ``t``: each reachable leaf's margin (into ``r``) and, per
    listed feature ``ef[f0:f1]``, the atoms its cells span (``ralo``, ``rahi``; ``rcon``
    zeroed). ``fslot``, ``rlo`` and ``rhi`` are scratch (shape (m,); ``fslot`` all -1 on
    entry and exit). Returns (nrange, nleaf), nrange -1 when the records are full."""
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
                g = ef[k]
                ralo[nrange] = cell2atom[coff[g] + g + rlo[k - f0]]
                rahi[nrange] = cell2atom[coff[g] + g + rhi[k - f0]]
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
def _atoms(lo, hi, coff, mark, cell2atom, aoff):
    """Number the atoms of every feature (runs of cells between marked cuts), clearing the
    marks; returns the number of atoms."""
    m = lo.shape[0]
    n_at = 0
    for f in range(m):
        aoff[f] = n_at
        base_j = coff[f] + f
        for j in range(lo[f], hi[f] + 1):
            cell2atom[base_j + j] = n_at - aoff[f]
            if mark[base_j + j] == 1:
                mark[base_j + j] = 0
                if j < hi[f]:
                    n_at += 1
        n_at += 1
    aoff[m] = n_at
    return n_at


@njit(cache=True, nogil=True)
def _extras(lo, hi, x, w, norm, gcol, coff, clow, cupp, cell2atom, aoff, bound, ext):
    """Per atom, its extra distance beyond the box's own term on its feature (into
    ``ext``; l1, l2 in accumulated form). Returns the room: ``bound`` less the box's own
    terms, group columns and integral rounding left out (both only add to a point's
    distance, so a point nearer than ``bound`` has extra distances summing to less than
    the room); 0 when there is no ball to use (another norm, or no bound)."""
    m = lo.shape[0]
    use = bound < np.inf and (norm == L1 or norm == L2)
    tot = 0.0
    for f in range(m):
        if gcol[f] < 0:
            gb = gap_term(x, w, f, lo[f], hi[f], coff, clow, cupp)
            tot += gb if norm == L1 else gb * gb
    room = bound - tot if use else 0.0
    for f in range(m):
        gb = gap_term(x, w, f, lo[f], hi[f], coff, clow, cupp)
        base_j = coff[f] + f
        j0 = lo[f]
        for j in range(lo[f] + 1, hi[f] + 2):
            if j <= hi[f] and cell2atom[base_j + j] == cell2atom[base_j + j0]:
                continue
            u = aoff[f] + cell2atom[base_j + j0]  # the atom of cells j0..j-1
            e = 0.0
            if room > 0.0 and gcol[f] < 0:
                g = gap_term(x, w, f, j0, j - 1, coff, clow, cupp)
                e = g - gb if norm == L1 else g * g - gb * gb
            ext[u] = max(e, 0.0)
            j0 = j
    return max(room, 0.0)


@njit(cache=True, nogil=True)
def _best_lambda(m, fptr, flist, eth, theta, aoff, ext, room, lam, tsum):
    """The multiplier of the distance budget that maximises the features' part of the
    bound for the current ``theta``: ``sum_f min_u (lam ext[u] - tsum[u]) - lam room`` is
    concave in ``lam`` and its slope (the minimisers' extras less the room) falls as
    ``lam`` grows, so bisection on the slope finds it. ``tsum`` receives the trees'
    summed multipliers per atom."""
    for f in range(m):
        for u in range(aoff[f], aoff[f + 1]):
            v = 0.0
            for q in range(fptr[f], fptr[f + 1]):
                v += theta[eth[flist[q]] + u - aoff[f]]
            tsum[u] = v
    lo_l = 0.0
    hi_l = max(2.0 * lam, 1.0 / room)
    while _slope(m, fptr, aoff, ext, tsum, hi_l, room) > 0.0 and hi_l < 1e12 / room:
        lo_l = hi_l
        hi_l *= 4.0
    for _ in range(40):
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
def _index_entries(m, n_tr, tfe, ef, aoff, eth, theta, fptr, flist, etree, eslot, fslot):
    """Give every feature entry its multipliers (zeroed) and group the entries by
    feature (``fptr``, ``flist``). Returns False when ``theta`` is too small."""
    n_th = 0
    for f in range(m + 1):
        fptr[f] = 0
    for i in range(n_tr):
        for k in range(tfe[i], tfe[i + 1]):
            g = ef[k]
            na = aoff[g + 1] - aoff[g]
            if n_th + na > theta.shape[0]:
                return False
            eth[k] = n_th
            for u in range(na):
                theta[n_th + u] = 0.0
            n_th += na
            fptr[g + 1] += 1
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
    return True


@njit(cache=True, nogil=True)
def _star_update(f, fptr, flist, etree, eslot, eth, aoff, unary, msum, theta, tle, lstart, r,
                 ralo, rahi, rcon):
    """The best multipliers of feature ``f`` given all others: each tree's min-marginal
    along ``f`` is replaced by an equal share of their sum (with the feature's unary)."""
    n_f = fptr[f + 1] - fptr[f]
    a0 = aoff[f]
    na = aoff[f + 1] - a0
    for u in range(na):
        msum[u] = unary[a0 + u]
    # min-marginals (without this feature's own multipliers), kept in theta for now
    for q in range(fptr[f], fptr[f + 1]):
        k = flist[q]
        i = etree[k]
        sl = eslot[k]
        th0 = eth[k]
        for u in range(na):
            theta[th0 + u] = np.inf
        for lf in range(tle[i], tle[i + 1]):
            e = lstart[lf] + sl
            v = r[lf] - rcon[e]
            for u in range(ralo[e], rahi[e] + 1):
                if v < theta[th0 + u]:
                    theta[th0 + u] = v
        for u in range(na):
            msum[u] += theta[th0 + u]
    share = 1.0 / (n_f + 1)
    for q in range(fptr[f], fptr[f + 1]):
        k = flist[q]
        i = etree[k]
        sl = eslot[k]
        th0 = eth[k]
        for u in range(na):
            theta[th0 + u] = msum[u] * share - theta[th0 + u]
        for lf in range(tle[i], tle[i + 1]):
            e = lstart[lf] + sl
            c = np.inf
            for u in range(ralo[e], rahi[e] + 1):
                if theta[th0 + u] < c:
                    c = theta[th0 + u]
            r[lf] += c - rcon[e]
            rcon[e] = c


@njit(cache=True, nogil=True)
def _dual_value(const, n_tr, tle, r, m, fptr, flist, eth, theta, aoff, unary):
    """The bound for the current multipliers: ``const`` (with ``- lam * room``) plus the
    trees' least adjusted leaves plus, per feature, the least atom of its unary minus the
    trees' multipliers."""
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
        a0 = aoff[f]
        low = np.inf
        for u in range(aoff[f + 1] - a0):
            v = unary[a0 + u]
            for q in range(fptr[f], fptr[f + 1]):
                v -= theta[eth[flist[q]] + u]
            if v < low:
                low = v
        tot += low
    return tot


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
    (mark, cell2atom, aoff, unary, ext, msum, tfe, tle, ef, eth, theta, r, lstart, ralo, rahi,
     rcon, fslot, stack, sdep, path, fptr, flist, etree, eslot, ttree, rlo, rhi) = dw
    m = lo.shape[0]
    const = cs[a] - cs[b]
    # -- pass 1: the live trees' undecided cuts and features; constant trees fold in
    nef = 0
    n_tr = 0
    for i in range(n_act):
        t = act[i]
        fstart = nef
        nef = _scan_tree(t, lo, hi, nf, ncut, nl, nr, start, stack, mark, coff, fslot, ef, nef)
        if nef < 0:
            _atoms(lo, hi, coff, mark, cell2atom, aoff)  # clears the marks
            return -np.inf
        if nef == fstart:  # no undecided node: constant on the box
            leaf = _only_leaf(t, lo, nf, ncut, nl, nr, start)
            const += nv[leaf, a] - nv[leaf, b]
            continue
        ttree[n_tr] = t
        tfe[n_tr] = fstart
        n_tr += 1
    tfe[n_tr] = nef
    _atoms(lo, hi, coff, mark, cell2atom, aoff)
    room = _extras(lo, hi, x, w, norm, gcol, coff, clow, cupp, cell2atom, aoff, bound, ext)
    lam = kappa / room if room > 0.0 else 0.0
    for u in range(aoff[m]):
        unary[u] = lam * ext[u]
    # -- pass 2: leaf records, per tree
    nrange = 0
    nleaf = 0
    for i in range(n_tr):
        tle[i] = nleaf
        nrange, nleaf = _record_leaves(ttree[i], lo, hi, a, b, nf, ncut, nl, nr, nv, start,
                                       stack, sdep, path, coff, cell2atom, ef, tfe[i],
                                       tfe[i + 1], fslot, rlo, rhi, r, lstart, nleaf, ralo,
                                       rahi, rcon, nrange)
        if nrange < 0:
            return -np.inf
    tle[n_tr] = nleaf
    lstart[nleaf] = nrange
    if not _index_entries(m, n_tr, tfe, ef, aoff, eth, theta, fptr, flist, etree, eslot, fslot):
        return -np.inf
    # -- block coordinate ascent, one feature's multipliers at a time
    best = _dual_value(const - lam * room, n_tr, tle, r, m, fptr, flist, eth, theta, aoff,
                       unary)
    last = best
    for s in range(sweeps):
        if best > tol:
            break
        for f in range(m):
            if fptr[f + 1] > fptr[f]:
                _star_update(f, fptr, flist, etree, eslot, eth, aoff, unary, msum, theta, tle,
                             lstart, r, ralo, rahi, rcon)
        if lam > 0.0:  # the distance budget's multiplier, best for these theta
            lam = _best_lambda(m, fptr, flist, eth, theta, aoff, ext, room, lam, msum)
            for u in range(aoff[m]):
                unary[u] = lam * ext[u]
        val = _dual_value(const - lam * room, n_tr, tle, r, m, fptr, flist, eth, theta, aoff,
                          unary)
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
