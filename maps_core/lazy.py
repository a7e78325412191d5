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
  :func:`~maps_core._bounds.sweep_bound`), proves ``a`` wins everywhere in it and
  ``a`` is no target class;
* a candidate when the bound certifies it entirely of one target class (its distance is
  exact: the same :func:`~maps_core.distance.rect_dist` as for stored rectangles);
* narrowed and requeued at its new distance when ``a`` is no target class and the sweep's
  per-feature sums prove some end cells hold no target point (in two pieces when they
  prove it of a run of cells inside too);
* otherwise split at the cut of some tree's root-most undecided node, the one whose far
  side gains the most distance over the box (l1, l2; for linf and l0 the far side's own
  distance) weighted by the vote spread of the trees undecided at that same cut, and its
  children pushed with their distances. Once a round has popped ``hard_after`` boxes
  (:data:`maps_core.query.HARD_AFTER`), a two-class box that was probed weighs each tree
  instead by how far the sweep's cell lifts it above the worst leaf the bounds count
  (plus a fifth of its spread): the cut that removes the trees' largest contradiction.

Only entries nearer than the current k-th best are ever touched, so a query pays for the
part of a mixed region between it and its answer, not for the whole region. Single cells
whose scores nearly tie are handed back to the caller, which labels them with the model.

The k-th best starts at a bound: :func:`best_first` deepens rounds of
:func:`_bounded_search` over a growing radius, and under a finite bound every popped box
is first clipped to the cells that may lie nearer (:func:`clip_to_ball`). Without it the
bound stays infinite until the first candidate, which is usually the answer, and every
mixed box nearer than the answer is peeled split by split. The tighter the bound, the
fewer boxes, so upper bounds of the answer lower it as soon as they are known: with
``k = 1`` (l1, l2), a target cell guessed before the search
(:func:`~maps_core._incumbent.first_guess`) bounds the first round, which then
completes; the nearest certified target rectangles cap every round after the fourth;
and with ``k = 1`` a box the sweep bound cannot rule out offers the cell its sums point
to (:func:`_probe_sweep`); when the model's exact class there is a target, the bound
drops to just above that cell's distance, once the guesses' coordinate descent has
brought the cell as near ``x`` as it can (with ``k = 1`` and a first guess; Credit RF
100x5, 200 queries: l1 0.94x the boxes, l2 0.96x, distances identical).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from ._bounds import (
    ALL_CHANGED,
    SWEEP_REACH,
    bounds_workspace,
    feature_bit,
    interval_bound,
    label_cell,
    label_cell_leaves,
    spread_sum,
    sweep_bound,
    sweep_workspace,
)
from ._clock import clock
from ._heap import (
    grow,
    grow_to,
    is_kd,
    kd_entry,
    kd_node,
    kd_owner,
    pop,
    push,
    push_first,
    slot,
)
from ._incumbent import first_guess, polish_cell, with_polished
from ._norms import L0, L1, L2, LINF, accumulate_radius, fold
from .distance import NO_NRT, NOMINAL, box_dist, gap_term, nominal_gap, rect_dist

#: One query: the point ``x`` (shape (m,)), weights, norm code, constraint box
#: ``cmin..cmax``, integral mask, target classes ``tmask`` (shape (n_classes,)), ``k``, and
#: the one-hot groups in CSR form with x's category per group (see query.QueryOptions).
Query = namedtuple("Query", ["x", "w", "norm", "cmin", "cmax", "integral", "tmask", "k",
                             "gcol", "gstart", "gcols", "gcost", "xcat"])
#: The class KD-trees (:class:`maps_core.index.KDForest`) and the partition's boxes.
Forest = namedtuple("Forest", ["node_lo", "node_hi", "left", "right", "kstart", "kend",
                               "order", "class_root", "labels", "rlo", "rhi"])
#: The grid's cells: per-feature offsets, real bounds, and whether the lower and the upper
#: end are closed (:class:`maps_core.grid.Grid`).
Cells = namedtuple("Cells", ["coff", "clow", "cupp", "clcl", "cucl"])


@njit(**NO_NRT)
def _keep(best, c_lo, c_hi, c_lab, c_d, n_c, lo, hi, lab, d):
    """Record the candidate box ``lo..hi`` of class ``lab`` in row ``n_c`` of the candidate
    arrays (room made by the caller) and enter ``d`` in the sorted k best distances
    ``best`` (updated in place). Returns ``n_c + 1``: no array, so nothing to
    reference-count."""
    for f in range(lo.shape[0]):  # element by element: no temporary, no runtime needed
        c_lo[n_c, f] = lo[f]
        c_hi[n_c, f] = hi[f]
    c_lab[n_c] = lab
    c_d[n_c] = d
    j = best.shape[0] - 1
    while j > 0 and best[j - 1] > d:
        best[j] = best[j - 1]
        j -= 1
    best[j] = d
    return n_c + 1


@njit(**NO_NRT)
def clip_to_ball(x, w, norm, gcol, lo, hi, coff, clow, cupp, bound):
    """Drop the end cells of the box ``lo..hi`` (updated in place) that lie at least
    ``bound`` (accumulated form) from ``x`` whatever the other features.

    A cell's distance is bounded below by the box's own terms on the other features plus
    the cell's gap on this one; constraints, integral rounding and one-hot groups only
    add to a distance, so ignoring them keeps the cut conservative (group columns and l0
    are left alone). The cell nearest ``x`` on each feature always stays.
    Without a bound the search must peel the region beyond the answer split by split; with
    one (PD 100x5, oracle bound): 7x fewer boxes per test row, 9x per uniform query.
    """
    if norm != L1 and norm != L2 and norm != LINF:
        return
    m = x.shape[0]
    tot = 0.0  # the box's own key (l1, l2); linf needs none, each feature's room is bound
    for f in range(m if norm != LINF else 0):
        if gcol[f] >= 0:
            continue  # a group's cost is not a per-column gap; 0 is a lower bound
        tf = _own_gap(x, w, gcol, f, lo[f], hi[f], coff, clow, cupp)
        tot += tf if norm == L1 else tf * tf
    # A feature's own term never changes when the cells beyond the bound go (its nearest
    # cell stays), so recomputing it below matches the sum above.
    for f in range(m):
        if gcol[f] >= 0 or w[f] <= 0.0:
            continue
        if norm == LINF:
            room = bound
        else:
            tf = _own_gap(x, w, gcol, f, lo[f], hi[f], coff, clow, cupp)
            room = bound - (tot - (tf if norm == L1 else tf * tf))
            if room <= 0.0:
                continue
            if norm == L2:
                room = np.sqrt(room)
        if gcol[f] == NOMINAL:
            # every other code costs the weight: past the room, only x's own cell stays
            if w[f] >= room:
                c = lo[f]
                while c < hi[f] and cupp[coff[f] + c] < x[f]:
                    c += 1
                if clow[coff[f] + c] <= x[f] <= cupp[coff[f] + c]:
                    lo[f] = c
                    hi[f] = c
            continue
        # cells whose gap alone uses up the room hold no point nearer than bound
        while hi[f] > lo[f] and w[f] * (clow[coff[f] + hi[f]] - x[f]) >= room:
            hi[f] -= 1
        while lo[f] < hi[f] and w[f] * (x[f] - cupp[coff[f] + lo[f]]) >= room:
            lo[f] += 1


@njit(**NO_NRT)
def _own_gap(x, w, gcol, f, lo_f, hi_f, coff, clow, cupp):
    """Feature ``f``'s term of the box (:func:`~maps_core.distance.gap_term`, or
    :func:`~maps_core.distance.nominal_gap` for a nominal feature)."""
    if gcol[f] == NOMINAL:
        return nominal_gap(x, w, f, lo_f, hi_f, coff, clow, cupp)
    return gap_term(x, w, f, lo_f, hi_f, coff, clow, cupp)


@njit(cache=True, nogil=True)
def reachable_cells(cmin, cmax, coff, clow, cupp):
    """Per feature, the first and last cell whose closure meets ``[cmin, cmax]`` (a
    superset of the cells holding admissible points; the exact test is ``rect_dist``'s),
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
def best_first(q, fo, ce, kern, max_pops, max_held, radius, probe, growth, max_rounds,
               max_seconds, keep_best, guess, polish, hard_after, gbest, part, n_parts):
    """The ``q.k`` nearest boxes of the target classes (``q.tmask``, shape (n_classes,)).

    ``q`` is a :data:`Query`, ``fo`` the :data:`Forest`, ``ce`` the :data:`Cells` and
    ``kern`` the ensemble's :class:`~maps_core.partition.Kernel`.
    ``max_pops`` bounds the mixed-region boxes of the whole query, all rounds together,
    ``max_held`` the boxes a round may hold at once (its memory: each takes
    :func:`~maps_core._memory.bytes_per_box` bytes), and
    ``max_seconds`` (``inf`` for none) its time, counted from here: not from the caller,
    whose first call compiles this function (tens of seconds on a new machine, which
    made the first query of a new service fail its 30 s budget).
    Iterative deepening: rounds bounded by ``radius`` (a distance; ``inf`` for a single
    unbounded round), grown by ``growth`` until a round finds the k best (each round is
    exact below its bound), the radius covers every point the constraints allow, or
    ``max_rounds`` rounds failed (then one unbounded round). With ``guess`` (and ``k = 1``),
    the first round is bounded instead by :func:`guess_radius`: that round completes.
    Without, a ``probe`` below 1 adds a first round bounded at ``probe * radius``, for maps
    whose answers often lie far nearer than ``radius`` (see :data:`maps_core.query.PROBE`);
    it counts in no schedule, which resumes at ``radius`` if it fails. With
    ``polish`` (and ``k = 1``), once a round has popped ``hard_after`` boxes, a target cell
    the sweep probe finds is first polished towards ``x``
    (:func:`~maps_core._incumbent.polish_cell`) before it lowers the bound; from then on a
    probed two-class box is also split where :func:`_probe_weights` says (see
    :data:`maps_core.query.HARD_AFTER`).

    One search may run as ``n_parts`` parts at once, in as many threads (``k = 1`` only):
    part ``part`` (0 .. n_parts - 1) searches the mixed regions whose index is ``part``
    modulo ``n_parts`` (each part still descends the whole KD forest and meets every
    certified rectangle), and the parts share ``gbest`` (shape (1,)): the distance of the
    nearest target any of them has met (a certified box, or a probe's target cell whose box
    its part will pop), ``inf`` at first. Each part prunes with it, so the parts' answers
    together are the search's, and a part whose round completes below it stops: a nearer
    target point of its regions would have been met. A single search passes a fresh
    ``gbest``, 0 and 1. Each round is
    :func:`_bounded_search`, whose outputs this returns, with the counters summed over
    rounds: (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kd_pops, evaluated, pops, status,
    i_lo, i_hi, i_lab, i_d, low, held), ``status`` one of :data:`COMPLETE`,
    :data:`OUT_OF_BOXES`, :data:`OUT_OF_TIME`, :data:`OUT_OF_MEMORY`, and ``held`` the most
    boxes a round held at once.

    A search that stops early (``status`` not :data:`COMPLETE`) also returns what it
    holds: incumbents ``i_*`` (certified target boxes it met but could not yet prove
    nearest: the sweep probe's cell, the cap's nearest certified rectangles, the
    candidates of the last round that completed; shapes (n_i, m) and (n_i,)) besides the
    candidates of the stopped round, and ``low``, a lower bound of the nearest target
    point's distance (accumulated form): every target point nearer than a completed
    round's bound, or than the least key in a stopped round's queue, is among that round's
    candidates or near-ties. A complete search returns no incumbent. With ``keep_best``, a
    search that stops having met no target box at all first looks for the nearest
    certified target rectangles (a KD descent that skips mixed regions, not timed: its
    cost is bounded by the maps' size), so that a caller taking the best found has one.
    """
    # Flat from here on: _bounded_search and its loop take every array as an argument
    # (borrowed: no reference counting; reading namedtuple fields in the loop cost FI
    # 100x5 l2 queries 2x).
    x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat = q
    node_lo, node_hi, left, right, kstart, kend, order, class_root, labels, rlo, rhi = fo
    coff, clow, cupp, clcl, cucl = ce
    nf, ncut, nl, nr, nv, roots, base, tie_high, tol, max_depth_nodes, _ = kern
    far = _farthest(q.x, q.w, q.norm, q.cmin, q.cmax, ce.coff, ce.clow, ce.cupp, q.gcol,
                    q.gstart, q.gcols, q.gcost)
    klo, khi = reachable_cells(q.cmin, q.cmax, ce.coff, ce.clow, ce.cupp)
    kd_pops = 0
    evaluated = 0
    pops = 0
    held = 0
    t0 = clock()
    # a search that answers with the best found leaves the last moments to its guesses
    reserve = min(GUESS_SHARE * max_seconds, GUESS_SECONDS) if keep_best else 0.0
    deadline = t0 + max_seconds - reserve if max_seconds < np.inf else np.inf
    cap = np.inf  # the k-th nearest certified target rectangle, once a round has failed
    # the nearest certified target rectangles (cap search), incumbents if the search stops
    e_lo = np.empty((0, q.x.shape[0]), dtype=np.int32)
    e_lab = np.empty(0, dtype=np.int64)
    e_d = np.empty(0)
    u_lo, u_hi, u_lab, u_d = e_lo, e_lo, e_lab, e_d
    proven = 0.0  # no target point is nearer (from the rounds that completed)
    r_lo, r_hi, r_lab, r_d = u_lo, u_hi, u_lab, u_d  # the last completed round's candidates
    have_cap = False
    # with k = 1 only: a round bounded by one target cell guarantees one candidate
    polish = polish and q.k == 1  # probes' target cells polished (_bounded_search)
    start = radius
    probing = 0
    if guess and q.k == 1 and radius < np.inf:
        radius = _guessed(q, ce, kern, klo, khi, radius, deadline)
    elif probe < 1.0 and radius < np.inf:
        probing = 1
        radius *= probe
    for it in range(max_rounds + 1 + probing):
        rnd = it - probing  # the probe's round is round -1
        if rnd == max_rounds or radius >= far:
            radius = np.inf
        bound = accumulate_radius(q.norm, radius)
        capped = bound >= cap
        if capped:
            bound = cap
        (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kp, ev, po, status, i_lo, i_hi, i_lab, i_d,
         low, hd) = _bounded_search(
            x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat,
            node_lo, node_hi, left, right, kstart, kend, order, class_root, labels, rlo, rhi,
            coff, clow, cupp, clcl, cucl, nf, ncut, nl, nr, nv, roots, base, tie_high, tol,
            max_depth_nodes, max_pops - pops, max_held, bound, klo, khi, True, deadline, q, ce,
            kern, polish, hard_after, gbest, part, n_parts)
        kd_pops += kp
        evaluated += ev
        pops += po
        held = max(held, hd)
        # Every target point nearer than the round's bound (complete) or its queue's least
        # key (stopped) is among its candidates or near-ties.
        low = min(low if status != COMPLETE else bound, _least(c_d), _least(t_d))
        if status != COMPLETE:
            # Stopped: a lower bound of the nearest target point's distance, and the
            # incumbents (the probe's cell, the certified rectangles of the cap search and
            # the candidates of the last round that completed), for a caller that takes
            # the best found.
            if keep_best:
                if not have_cap and c_d.shape[0] + i_d.shape[0] + r_d.shape[0] == 0:
                    u_lo, u_hi, u_lab, u_d, kp, ev = _nearest_certified(q, fo, ce, kern, klo,
                                                                        khi)
                    kd_pops += kp
                    evaluated += ev
                # A nearer target cell, when the guesses find one (Credit RF 100x5, l1,
                # stopped at 50 ms: see the README). Bounded by their work cap and by the
                # caller's time limit only, not by a clock of their own: the same query
                # on the same maps gets the same answer on a busy machine.
                i_lo, i_hi, i_lab, i_d = with_polished(
                    q, ce, kern, klo, khi, np.concatenate((c_lo, i_lo, u_lo, r_lo)),
                    np.concatenate((c_hi, i_hi, u_hi, r_hi)),
                    np.concatenate((c_d, i_d, u_d, r_d)), i_lo, i_hi, i_lab, i_d,
                    t0 + max_seconds)
            return (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kd_pops, evaluated, pops, status,
                    np.concatenate((i_lo, u_lo, r_lo)), np.concatenate((i_hi, u_hi, r_hi)),
                    np.concatenate((i_lab, u_lab, r_lab)), np.concatenate((i_d, u_d, r_d)),
                    max(low, proven), held)
        if c_d.shape[0] >= q.k or radius == np.inf or capped or gbest[0] < bound:
            # (the last: another part met a target nearer than this round's bound, and
            # every target point of this part's regions nearer than that is among its
            # candidates)
            return (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kd_pops, evaluated, pops, status,
                    e_lo, e_lo, e_lab, e_d, max(min(low, gbest[0]), proven), held)
        proven = max(proven, low)
        r_lo, r_hi, r_lab, r_d = c_lo, c_hi, c_lab, c_d
        if rnd == _CAP_ROUND:
            # The nearest certified target rectangles (KD trees only, no mixed region) bound
            # the answer from above. The cost of a round grows steeply with its bound (the
            # boxes are clipped to a looser ball): Credit RF 100x5, l1, hardest test rows,
            # boxes popped with the first bound at the answer's distance against 1.1x:
            # 25k / 77k, 3.9k / 20k. So no round goes past this one: over that benchmark's
            # 200 queries, 1.05M boxes popped instead of 1.29M, the slowest 130k not 235k.
            u_lo, u_hi, u_lab, u_d, kp, ev = _nearest_certified(q, fo, ce, kern, klo, khi)
            kd_pops += kp
            evaluated += ev
            have_cap = True
            if u_d.shape[0] >= q.k:
                # just past the k-th: the round's bound is strict, and those rectangles
                # must be found again at their own distance
                cap = np.sort(u_d)[q.k - 1]
                cap = cap + cap * 1e-12 + 1e-300
        radius = start if rnd < 0 else radius * growth
    raise AssertionError("unreachable: the last round is unbounded")


@njit(cache=True, nogil=True)
def _guessed(q, ce, kern, klo, khi, radius, deadline):
    """``radius``, or just past the distance of a target cell that
    :func:`~maps_core._incumbent.first_guess` finds by ``deadline``.

    A first bound at the answer's distance beats any fixed start: Credit GB 300x4's answers
    lie 1e-4 to 0.1 of a feature's width away (Adult's 0.01 to 1), and a round's boxes grow
    with its bound's overshoot (2,000 l1 queries, boxes popped with the first bound at the
    optimum against the shipped 0.1: 49k / 369k on Credit, 132k / 325k on Adult). The guess
    is certified, so the round finds a target point no farther; past it by 1e-9 relative,
    as a round's bound is strict."""
    u = first_guess(q, ce, kern, klo, khi, deadline)
    if u < np.inf:
        return max((np.sqrt(u) if q.norm == L2 else u) * (1.0 + 1e-9), 1e-150)
    return radius


@njit(cache=True, nogil=True)
def guess_radius(q, ce, kern, radius, max_seconds):
    """The first bound :func:`best_first` would start from with ``guess`` (``k = 1``),
    for a caller that runs one search as several parts: guessed once, then passed to each
    part with ``guess`` off. ``max_seconds`` as for :func:`best_first`."""
    if q.k != 1 or radius == np.inf:
        return radius
    klo, khi = reachable_cells(q.cmin, q.cmax, ce.coff, ce.clow, ce.cupp)
    deadline = clock() + max_seconds if max_seconds < np.inf else np.inf
    return _guessed(q, ce, kern, klo, khi, radius, deadline)


@njit(cache=True, nogil=True)
def _nearest_certified(q, fo, ce, kern, klo, khi):
    """The ``q.k`` nearest certified target rectangles: a round of :func:`_bounded_search`
    over the KD trees alone (no mixed region, no bound, no deadline; its cost is bounded by
    the maps' size). Returns (lo, hi, labels, distances, KD nodes popped, rectangles
    evaluated)."""
    x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat = q
    node_lo, node_hi, left, right, kstart, kend, order, class_root, labels, rlo, rhi = fo
    coff, clow, cupp, clcl, cucl = ce
    nf, ncut, nl, nr, nv, roots, base, tie_high, tol, max_depth_nodes, _ = kern
    lo, hi, lab, d, _, _, _, kp, ev, _, _, _, _, _, _, _, _ = _bounded_search(
        x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat, node_lo,
        node_hi, left, right, kstart, kend, order, class_root, labels, rlo, rhi, coff, clow,
        cupp, clcl, cucl, nf, ncut, nl, nr, nv, roots, base, tie_high, tol, max_depth_nodes, 0,
        _NO_LIMIT, np.inf, klo, khi, False, np.inf, q, ce, kern, False, _NO_LIMIT,
        np.full(1, np.inf), 0, 1)
    return lo, hi, lab, d, kp, ev


@njit(cache=True, nogil=True)
def certified_only(q, fo, ce, kern):
    """The search on maps without mixed regions: the KD descent alone, no bound, no
    clock, as :func:`_nearest_certified`. Returns (lo, hi, labels, distances, KD nodes
    popped, rectangles evaluated): six outputs where :func:`best_first` hands back
    seventeen, each a Python object to build (CP 100x5 single queries: 4-5 us of 60)."""
    klo, khi = reachable_cells(q.cmin, q.cmax, ce.coff, ce.clow, ce.cupp)
    return _nearest_certified(q, fo, ce, kern, klo, khi)


@njit(**NO_NRT)
def _least(d):
    """Least of the distances ``d`` (``inf`` when empty)."""
    low = np.inf
    for i in range(d.shape[0]):
        low = min(low, d[i])
    return low


# The failed rounds after which best_first looks for the nearest certified target
# rectangles. That KD descent has no bound: made after the first round it cost PD 100x5
# (5M rectangles) l1 queries ~40% at the median; after the fourth, PD's 300 queries pop
# 8/17/20% fewer mixed boxes (l1/l2/linf) for 77/38/7% more (cheap) KD nodes, and Credit
# RF 100x5, whose slow queries run ten rounds or more, keeps all of its gain.
_CAP_ROUND = 3

# The guesses of a search that stops and answers with the best found
# (:func:`~maps_core._incumbent.with_polished`) stop at their work cap (_incumbent._WORK,
# about GUESS_SECONDS on this machine); with a time
# limit, the search itself stops GUESS_SHARE of it (at most GUESS_SECONDS) early to leave
# them that time, so that the answer comes within the limit. On Credit's random forests
# (100x5, 200x8) they take 5-10 ms to come within a few percent of the optimum at the
# median (see _incumbent). The price is fewer proofs within a limit: Credit RF 100x5, l2,
# 50 ms, 127 of 200 answers proven instead of 149; a 10% share proved about as many as
# this one but left the 200x8 forest's guesses too little time (answers up to 244x).
GUESS_SECONDS = 0.01
GUESS_SHARE = 0.2


@njit(**NO_NRT)
def _farthest(x, w, norm, cmin, cmax, coff, clow, cupp, gcol, gstart, gcols, gcost):
    """Largest distance from ``x`` to a point of the domain inside the constraint box
    (``inf`` when the domain is unbounded along a feature); a group switch at full cost
    unless every column of the group is fixed, a nominal feature's weight unless it is.
    (Fixed ones counted, a query with every feature immutable ran every deepening round
    before it said infeasible.)"""
    total = 0.0
    for f in range(x.shape[0]):
        if gcol[f] >= 0:
            continue
        if gcol[f] == NOMINAL:  # another code, at most its weight
            if cmin[f] < cmax[f]:
                total = fold(norm, total, w[f])
            continue
        a = max(cmin[f], clow[coff[f]])
        b = min(cmax[f], cupp[coff[f + 1] - 1])
        total = fold(norm, total, w[f] * max(x[f] - a, b - x[f], 0.0))
    for g in range(gcost.shape[0]):
        for i in range(gstart[g], gstart[g + 1]):
            if cmin[gcols[i]] < cmax[gcols[i]]:
                total = fold(norm, total, gcost[g])
                break
    return total


# -- the steps of the search loop ----------------------------------------------------------
# Small named functions compiled without reference counting (distance.NO_NRT) and called
# from _search_loop, itself compiled without it: they take flat arrays and return no
# arrays, so nothing is reference-counted per popped box. Inlined (numba IR inlining) they
# measured slower (FI 100x5: 298 against 262 us a query), and CPython passes a call of
# over 30 arguments as *args, which numba cannot inline anyway.


@njit(**NO_NRT)
def _seed(x, w, norm, cmin, cmax, integral, tmask, gcol, gstart, gcols, gcost, xcat,
          class_root, node_lo, node_hi, keys, vals, a0, a1, with_mixed):
    """Push the root of every target class's KD-tree; returns the queue size. Only the
    first of them owns the mixed regions (each sits in every class tree); none does
    without ``with_mixed`` (certified rectangles only)."""
    n = 0
    owner = 1 if with_mixed else 0
    for cl in range(class_root.shape[0]):
        if tmask[cl] and class_root[cl] >= 0:
            nd = class_root[cl]
            d = box_dist(x, w, norm, cmin, cmax, integral, node_lo, node_hi, nd, gcol,
                         gstart, gcols, gcost, xcat, a0, a1)
            if d < np.inf:
                n = push(keys, vals, n, d, kd_entry(nd, owner))
            owner = 0
    return n


@njit(**NO_NRT)
def _room_needed(left, kstart, kend, s):
    """How many entries (queue entries, box slots, candidates) the pop of ``s`` may add:
    two children, or a KD leaf's rectangles."""
    if is_kd(s) and left[kd_node(s)] < 0:
        return max(2, kend[kd_node(s)] - kstart[kd_node(s)])
    return 2


@njit(**NO_NRT)
def _slots_needed(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost, xcat, left,
                  kstart, kend, order, labels, rlo, rhi, coff, clow, cupp, clcl, cucl, bound,
                  a0, a1, s):
    """How many slots the pop of ``s`` may take beyond the box's own: one for a box (it
    frees its own slot before its two children take theirs); for a KD leaf, the mixed
    regions :func:`_scan_leaf` will queue (its owner's, nearer than ``bound``); none for an
    inner KD node. Counted only when the slots are short, so that a search at its
    ``max_held`` stops only when it must."""
    if not is_kd(s):
        return 1
    nd = kd_node(s)
    if left[nd] >= 0 or kd_owner(s) == 0:
        return 0
    count = 0
    for i in range(kstart[nd], kend[nd]):
        r = order[i]
        if labels[r] < 0 and rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff,
                                       clow, cupp, clcl, cucl, bound, gcol, gstart, gcols,
                                       gcost, xcat, a0, a1) < bound:
            count += 1
    return count


@njit(**NO_NRT)
def _expand_inner(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost, xcat,
                  node_lo, node_hi, left, right, nd, own, bound, keys, vals, n, a0, a1):
    """Push the children of the inner KD node ``nd`` nearer than ``bound``; returns the
    queue size."""
    for ch in (left[nd], right[nd]):
        dd = box_dist(x, w, norm, cmin, cmax, integral, node_lo, node_hi, ch, gcol,
                      gstart, gcols, gcost, xcat, a0, a1)
        if dd < bound:
            n = push(keys, vals, n, dd, kd_entry(ch, own))
    return n


@njit(**NO_NRT)
def _scan_leaf(x, w, norm, cmin, cmax, integral, k, gcol, gstart, gcols, gcost, xcat, kstart,
               kend, order, labels, rlo, rhi, coff, clow, cupp, clcl, cucl, roots, base, nd,
               own, best, c_lo, c_hi, c_lab, c_d, n_c, keys, vals, n, p_lo, p_hi, p_start,
               p_cs, p_free, n_free, n_used, klo, khi, a0, a1, part, n_parts):
    """The rectangles of the KD leaf ``nd``: a certified one of the (target) class of its
    tree becomes a candidate at its exact distance; a mixed region owned by this tree (and
    by this part of the search: its index is ``part`` modulo ``n_parts``) enters the queue
    as a box clipped to the reachable cells ``klo..khi``, every tree at its root. The
    caller made room for all of them. Returns (n_c, n, n_free, n_used,
    rectangles evaluated): scalars only, see :func:`_bounded_search`."""
    evaluated = 0
    for i in range(kstart[nd], kend[nd]):
        r = order[i]
        lab = labels[r]
        if lab < 0 and (own == 0 or r % n_parts != part):
            continue
        evaluated += 1
        dd = rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi,
                       coff, clow, cupp, clcl, cucl, best[k - 1], gcol, gstart,
                       gcols, gcost, xcat, a0, a1)
        if dd >= best[k - 1]:
            continue
        if lab >= 0:  # a certified rectangle of this (target) class tree
            n_c = _keep(best, c_lo, c_hi, c_lab, c_d, n_c, rlo[r], rhi[r], lab, dd)
            continue
        s2, n_free, n_used = slot(p_free, n_free, n_used)
        for f in range(x.shape[0]):  # non-empty: the region meets the constraints (dd < inf)
            p_lo[s2, f] = max(rlo[r, f], klo[f])
            p_hi[s2, f] = min(rhi[r, f], khi[f])
        for t in range(roots.shape[0]):
            p_start[s2, t] = roots[t]
        for j in range(base.shape[0]):
            p_cs[s2, j] = base[j]
        n = push(keys, vals, n, dd, s2)
    return n_c, n, n_free, n_used, evaluated


@njit(**NO_NRT)
def _take_box(p_lo, p_hi, p_start, p_cs, s, lo, hi, start, act, cs, nf):
    """Copy the pending box in slot ``s`` into the working arrays (its live trees into
    ``act``); returns the number of live trees. The slot is not freed here."""
    for f in range(lo.shape[0]):  # into preallocated arrays: no allocation per box
        lo[f] = p_lo[s, f]
        hi[f] = p_hi[s, f]
    n_act = 0
    for t in range(start.shape[0]):
        start[t] = p_start[s, t]
        if nf[start[t]] >= 0:
            act[n_act] = t
            n_act += 1
    for j in range(cs.shape[0]):
        cs[j] = p_cs[s, j]
    return n_act


@njit(**NO_NRT)
def _changed(lo, hi, lo0, hi0, chg):
    """``chg`` with the bits (:func:`~maps_core._bounds.feature_bit`) of the features
    whose cell range ``lo..hi`` differs from ``lo0..hi0`` (shapes (m,))."""
    for f in range(lo.shape[0]):
        if lo[f] != lo0[f] or hi[f] != hi0[f]:
            chg |= feature_bit(f)
    return chg


@njit(**NO_NRT)
def _two_class_flip(a, worst, cs, act, n_act, tmin, trange, lb):
    """With two classes, the class nearer to certification: the lower bound of
    s1 - s0 = -(upper bound of s0 - s1) comes from the same walk (per tree, its minimum of
    s0 - s1 plus its spread is its maximum). Returns (a, worst)."""
    low1 = cs[1] - cs[0]
    for i in range(n_act):
        low1 -= tmin[act[i], 1] + trange[act[i]]
    if low1 > worst:
        lb[0] = low1
        return 1, low1
    return a, worst


@njit(**NO_NRT)
def _hopeless(tmask, lb, a, tol):
    """Class ``a`` (no target) beats every target class everywhere in the box."""
    if tmask[a]:
        return False
    for b in range(tmask.shape[0]):
        if tmask[b] and lb[b] <= tol:
            return False
    return True


@njit(**NO_NRT)
def _fill_slot(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost, xcat, coff, clow,
               cupp, clcl, cucl, p_lo, p_hi, p_start, p_cs, p_free, s2, n_free, start, cs, bound,
               a0, a1):
    """The distance of the box already written to slot ``s2``, and the given tree states
    written with it, when that is below ``bound``; otherwise the slot is freed and the
    distance is ``inf``. Returns (distance, n_free)."""
    dd = rect_dist(s2, x, w, norm, cmin, cmax, integral, p_lo, p_hi, coff, clow, cupp, clcl,
                   cucl, bound, gcol, gstart, gcols, gcost, xcat, a0, a1)
    if dd >= bound:
        p_free[n_free] = s2
        return np.inf, n_free + 1
    for t in range(start.shape[0]):
        p_start[s2, t] = start[t]
    for j in range(cs.shape[0]):
        p_cs[s2, j] = cs[j]
    return dd, n_free


@njit(**NO_NRT)
def _queue_halves(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost, xcat, coff,
                  clow, cupp, clcl, cucl, p_lo, p_hi, p_start, p_cs, p_free, n_free, n_used, keys,
                  vals, n, start, cs, bound, a0, a1, lo, hi, f, left_hi, right_lo):
    """Queue two pieces of the box ``lo..hi``, with the given tree states: along feature
    ``f``, its cells up to ``left_hi`` and from ``right_lo`` (a split when they are
    adjacent, a box less a run of cells otherwise), each at its own distance when that is
    below ``bound`` (:func:`_fill_slot`), the nearer ahead of equal keys
    (:func:`~maps_core._heap.push_first`). Returns (n, n_free, n_used, the slot of the
    nearer piece queued, -1 when neither was)."""
    near = -1
    near_d = np.inf
    other = -1
    other_d = np.inf
    for side in range(2):
        s2, n_free, n_used = slot(p_free, n_free, n_used)
        for ff in range(lo.shape[0]):
            p_lo[s2, ff] = lo[ff]
            p_hi[s2, ff] = hi[ff]
        if side == 0:
            p_hi[s2, f] = left_hi
        else:
            p_lo[s2, f] = right_lo
        dd, n_free = _fill_slot(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost,
                                xcat, coff, clow, cupp, clcl, cucl, p_lo, p_hi, p_start, p_cs,
                                p_free, s2, n_free, start, cs, bound, a0, a1)
        if dd < near_d:
            other, other_d = near, near_d
            near, near_d = s2, dd
        elif dd < np.inf:
            other, other_d = s2, dd
    if other >= 0:
        n = push(keys, vals, n, other_d, other)
    if near >= 0:
        n = push_first(keys, vals, n, near_d, near)
    return n, n_free, n_used, near


#: Observations of a cut before its pseudo-cost steers :func:`_split_cut` (Credit RF
#: 100x5, 400 l1 queries, boxes against none: 3 0.79x, 5 0.79x, 8 0.81x; another 400: 2
#: 0.88x, 3 0.86x, 5 0.84x, 8 0.84x).
PSEUDO_COST_RELIABLE = 5
#: The share of a cut's weight it keeps whatever its pseudo-cost: the nearer child's
#: bound is not all a cut is worth (its far side may be dropped by distance, and the box
#: it leaves is smaller). Without it a few Adult GB 300x4 linf searches popped 65x the
#: boxes (3.4x over 600 queries); 0.1 1.22x, 0.3 1.05x, 0.5 1.03x; Credit RF 100x5 (400
#: l1 queries) 0.79x without, 0.80x at 0.3, 0.85x at 0.5.
PSEUDO_COST_FLOOR = 0.3


@njit(**NO_NRT)
def _split_cut(x, w, norm, gcol, coff, clow, cupp, nf, ncut, nv, lo, hi, act, n_act, start, cs,
               top_n, trange, weight, shared, pcost, use_pcost):
    """Move every live tree to its root-most undecided node (trees now constant fold
    into ``cs``) and choose the tree whose node's cut splits the box; returns it (-1
    when no tree is undecided: one score vector on the whole box, within rounding) and
    the summed weight of the trees at its cut.

    Cut where the far side lies farthest from x (it is then often beyond the k-th best and
    dropped) and where the votes it decides are uncertain: score = the far side's distance
    gain (below; a nominal feature's far side costs its weight, however far its codes) x
    the summed ``weight`` (per tree, shape (n_trees,): its spread
    ``trange``, or :func:`_probe_weights`) of every tree whose root-most undecided node is
    that same cut (random forests repeat cuts; PD 100x5, 2M rectangles: l2 p50 116 -> 35
    ms with one tree's spread; summing over trees that share the cut, 2k-rectangle maps:
    1.41M -> 1.02M boxes popped over 120 queries).

    With ``use_pcost``, a cut seen :data:`PSEUDO_COST_RELIABLE` times or more in this
    round has that weight scaled by its *pseudo-cost* (``pcost``, shape (2, cuts): summed
    and counted observations, see :func:`_search_loop`): the mean share ``g`` of the weight
    that the nearer child's interval bound actually gained over its parent's when the
    search cut there, as ``PSEUDO_COST_FLOOR + (1 - PSEUDO_COST_FLOOR) g``. A cut whose
    trees' spread rarely turns into a tighter bound falls behind; one never tried keeps
    its full weight, so it is tried (pseudo-costs, as in branch-and-bound for integer
    programs: Benichou et al. 1971).
    """
    for i in range(n_act):
        node = top_n[act[i]]
        if nf[node] >= 0:
            shared[coff[nf[node]] + ncut[node]] += weight[act[i]]
    bt = -1
    br = -1.0
    bg = -1.0
    bw = 0.0
    for i in range(n_act):
        t = act[i]
        node = top_n[t]
        start[t] = node
        if nf[node] >= 0:
            fz = nf[node]
            cz = ncut[node]
            up = cupp[coff[fz] + cz]
            if gcol[fz] == NOMINAL:
                # another code costs the weight, however far: the far side (never x's
                # code) costs w, and so does the box when x's code already lies outside
                gap = w[fz]
            elif x[fz] <= up:
                gap = w[fz] * (clow[coff[fz] + cz + 1] - x[fz])
            else:
                gap = w[fz] * (x[fz] - up)
            if (norm == L1 or norm == L2) and gcol[fz] == NOMINAL:
                tb = nominal_gap(x, w, fz, lo[fz], hi[fz], coff, clow, cupp)
                gap = max(gap * gap - tb * tb if norm == L2 else gap - tb, 0.0)
            elif norm == L1 or norm == L2:
                # l1, l2: what the far child's key gains over the box's (its term on fz
                # becomes the gap instead of the box's own term). PD 100x5, 130 queries:
                # boxes popped -31/-41% (l2) and -40% (l1) against the bare gap; for linf
                # it does worse.
                tb = 0.0
                if x[fz] < clow[coff[fz] + lo[fz]]:
                    tb = w[fz] * (clow[coff[fz] + lo[fz]] - x[fz])
                elif x[fz] > cupp[coff[fz] + hi[fz]]:
                    tb = w[fz] * (x[fz] - cupp[coff[fz] + hi[fz]])
                gap = max(gap * gap - tb * tb if norm == L2 else gap - tb, 0.0)
            ci = coff[fz] + cz
            wsum = shared[ci]
            if use_pcost and pcost[1, ci] >= PSEUDO_COST_RELIABLE:
                wsum *= PSEUDO_COST_FLOOR + (1.0 - PSEUDO_COST_FLOOR) * pcost[0, ci] / pcost[1, ci]
            gap = gap * wsum
            if gap > bg + 1e-15 or (abs(gap - bg) <= 1e-15 and trange[t] > br):
                bg = gap
                br = trange[t]
                bt = t
                bw = shared[ci]
        else:
            for j in range(cs.shape[0]):
                cs[j] += nv[node, j]
    for i in range(n_act):
        node = top_n[act[i]]
        if nf[node] >= 0:
            shared[coff[nf[node]] + ncut[node]] = 0.0
    return bt, bw


@njit(**NO_NRT)
def _probe_sweep(x, w, norm, cmin, cmax, integral, tmask, gcol, gstart, gcols, gcost, xcat, coff,
                 clow, cupp, clcl, cucl, nf, ncut, nl, nr, nv, tie_high, tol, lo, hi, a, lb,
                 amin, act, n_act, start, cs, xcell, pbox_lo, pbox_hi, buf, a0, a1, bound,
                 pleaf):
    """An upper bound of the answer's distance (k = 1) from a box the sweep bound could
    not rule out: the cell it points to (along each feature it projected trees on, the
    cell where the target class nearest to winning came nearest to it; elsewhere the
    box's cell nearest ``x``) holds target points at its own distance ``d`` when its
    exact class is a target with a margin beyond the tolerance. Returns the bound to
    search under: just above ``d`` (the box at ``d`` must still be popped and certified
    the usual way, so the answer and its region are the search's own), else ``bound``,
    and the cell's class (-1 when the bound stays): the cell, left in row 0 of ``pbox_lo``
    and ``pbox_hi``, is the search's incumbent should it stop before its answer.

    Best-first meets its answer only when it pops it; until then every box is clipped
    to the round's ball, often much wider than the answer's, and a looser clip costs
    many more boxes (Credit RF 100x5, l1, hardest test rows: 25k boxes with the answer's
    own distance as the first bound, 77k with 1.1x it). With this probe (after
    :func:`best_first`'s cap) the 200 queries of that benchmark popped 0.92M boxes
    instead of 1.05M, the slowest 111k instead of 130k. Labelling one cell walks the
    live trees once: a few percent of a box's bounds. Each live tree's leaf there is
    left in ``pleaf`` (shape (n_trees,)) for :func:`_probe_weights`.
    """
    c = lb.shape[0]
    tb = -1
    for b in range(c):
        if tmask[b] and b != a and (tb < 0 or lb[b] < lb[tb]):
            tb = b
    if tb < 0:
        return bound, -1
    for f in range(x.shape[0]):
        j = amin[f, tb]
        if j < 0:
            j = min(max(xcell[f], lo[f]), hi[f])
        pbox_lo[0, f] = j
        pbox_hi[0, f] = j
    b2, marg = label_cell_leaves(pbox_lo[0], act, n_act, cs, nf, ncut, nl, nr, nv, start,
                                 tie_high, buf, pleaf)
    if not tmask[b2] or marg <= tol:
        return bound, -1
    d = rect_dist(0, x, w, norm, cmin, cmax, integral, pbox_lo, pbox_hi, coff, clow, cupp, clcl,
                  cucl, bound, gcol, gstart, gcols, gcost, xcat, a0, a1)
    d = d + d * 1e-12 + 1e-300
    return (d, b2) if d < bound else (bound, -1)


#: The share of a tree's spread :func:`_probe_weights` adds to its lift (Credit RF 100x5,
#: 200 l1 queries: 0 -> 1.08x the boxes of spread weights, 0.15 0.89x, 0.25 0.90x, 0.5
#: 0.91x, 1 0.94x).
PROBE_SPREAD_SHARE = 0.2


@njit(**NO_NRT)
def _probe_weights(a, act, n_act, nv, pleaf, tmin, trange, weight):
    """Per live tree of a two-class box, the weight :func:`_split_cut` sums over a cut
    (``weight``, shape (n_trees,)): how far the tree's leaf at the probe's cell
    (``pleaf``, from :func:`_probe_sweep`) lies above its worst reachable leaf, in the
    margin of ``a`` over the other class, plus :data:`PROBE_SPREAD_SHARE` of its spread.

    The bounds count every tree at its worst leaf, and the sweep's cell is where the
    target comes nearest to winning; a tree whose leaf there is far above its worst is a
    contradiction the bounds cannot see, and splitting at its undecided cut removes it.
    The spread alone weighs every uncertain tree alike."""
    b = 1 - a
    for i in range(n_act):
        t = act[i]
        node = pleaf[t]
        weight[t] = (nv[node, a] - nv[node, b] - tmin[t, b]
                     + PROBE_SPREAD_SHARE * trange[t])


@njit(**NO_NRT)
def _keep_tie(t_lo, t_hi, t_d, n_t, lo, hi, d):
    """Record a near-tie box in row ``n_t`` of the tie arrays (room made by the caller)
    for the caller to label; returns ``n_t + 1``."""
    for f in range(lo.shape[0]):
        t_lo[n_t, f] = lo[f]
        t_hi[n_t, f] = hi[f]
    t_d[n_t] = d
    return n_t + 1


#: Slots of the loop's state array (:func:`_search_loop`).
_QUEUED, _FREE, _USED, _CANDIDATES, _TIES, _POPS, _KD_POPS, _EVALUATED, _NEED, _INCUMBENT = (
    range(10))
_SLOTS = 10  # the new box slots the next pop may take, when the arrays lack them
_PROBED = 11  # the probe found a nearer target cell, for the caller to polish
_N_STATE = 12
#: ``max_held`` of a search that holds no mixed box (the KD descent of the cap search).
_NO_LIMIT = 1 << 62
#: What :func:`_search_loop` stopped for: done; more room needed (``st[_NEED]`` entries);
#: out of ``max_pops``.
_DONE, _NEED_ROOM, _OUT_OF_POPS, _POLISH = 0, 1, 2, 3
#: How a search ended (:func:`best_first`): every box it had to see was seen; out of its
#: box budget; out of its time; out of the boxes it may hold at once (its memory).
COMPLETE, OUT_OF_BOXES, OUT_OF_TIME, OUT_OF_MEMORY = 0, 1, 2, 3
#: Most mixed-region boxes popped between two clock readings when a search has a
#: deadline. A reading takes the GIL for about 1 us and a box costs 5 us (CP) to 1 ms (a
#: 200-tree forest of depth 8), so the clock is read about every CLOCK_SECONDS of boxes (at
#: the rate measured so far in the round), after one box at first: the check costs at most
#: 0.3%, and a search overruns its time by about a millisecond. With a fixed 64 boxes it
#: overran by 2 ms on Credit RF 100x5 and 64 ms on the 200x8 forest.
CLOCK_EVERY = 64
CLOCK_SECONDS = 0.001


@njit(cache=True, nogil=True)
def _bounded_search(x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost,
                    xcat, node_lo, node_hi, left, right, kstart, kend, order, class_root, labels,
                    rlo, rhi, coff, clow, cupp, clcl, cucl, nf, ncut, nl, nr, nv, roots, base,
                    tie_high, tol, max_depth_nodes, max_pops, max_held, bound, klo, khi,
                    with_mixed, deadline, q, ce, kern, polish, hard_after, gbest, part,
                    n_parts):
    """One round of :func:`best_first`: the k nearest boxes nearer than ``bound``
    (accumulated form, squared for l2; ``inf`` for no bound). Mixed regions are searched
    within the cells ``klo..khi`` (:func:`reachable_cells`), holding at most ``max_held``
    pending boxes at once (their arrays never grow past that); when ``deadline`` is finite,
    the clock is read at the start and about every :data:`CLOCK_SECONDS` of boxes.
    ``gbest``, ``part`` and ``n_parts`` as for :func:`best_first`.

    Returns (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, kd_pops, evaluated, pops, status,
    i_lo, i_hi, i_lab, i_d, low, held): candidate boxes (certified rectangles or certified
    sub-boxes of mixed regions, each of a target class, with their distances in
    accumulated form), a superset of the k best;
    near-tie boxes (every cell scores the same, within rounding, so the model's label of
    the centre holds for all) for the caller to label; KD-tree nodes popped; rectangles
    whose exact distance was computed; mixed-region boxes popped; :data:`OUT_OF_BOXES` if
    ``max_pops`` of the latter ran out first, :data:`OUT_OF_TIME` if the deadline passed,
    :data:`OUT_OF_MEMORY` if a pop could add more boxes than ``max_held`` allows, else
    :data:`COMPLETE`; when stopped early, the sweep probe's cell as an incumbent
    (0 or 1 row, with its class and distance); ``low``, the least of ``best[k - 1]``
    and the queue's least key (else ``best[k - 1]``); and ``held``, the most pending boxes
    held at once (slots are reused, so the slots ever used).

    Per popped entry: a KD node is expanded (:func:`_expand_inner`) or its leaf scanned
    (:func:`_scan_leaf`); a box of a mixed region is clipped to the ball of the k-th best
    (:func:`clip_to_ball`), given a hypothesis class ``a`` and bounded, then it is
    certified (a candidate, or dropped when ``a`` is no target), dropped as hopeless,
    narrowed and requeued, split (:func:`_split_cut`), or kept as a near-tie.
    """
    m = x.shape[0]
    c = base.shape[0]
    T = roots.shape[0]
    best = np.full(k, bound)
    # Pending boxes of mixed regions, in slots (rows): cell ranges, the node each tree has
    # surely reached, the base plus the leaf values of the trees constant on the box, and
    # the stack of recycled slots.
    rows = min(64, max_held)
    p_lo = np.empty((rows, m), dtype=np.int32)
    p_hi = np.empty((rows, m), dtype=np.int32)
    p_start = np.empty((rows, T), dtype=np.int32)
    p_cs = np.empty((rows, c))
    p_free = np.empty(rows, dtype=np.int64)
    keys = np.empty(max(64, class_root.shape[0]))
    vals = np.empty(keys.shape[0], dtype=np.int64)
    a0 = np.empty(m, dtype=np.bool_)
    a1 = np.empty(m, dtype=np.bool_)
    n = _seed(x, w, norm, cmin, cmax, integral, tmask, gcol, gstart, gcols, gcost, xcat,
              class_root, node_lo, node_hi, keys, vals, a0, a1, with_mixed)
    # candidate boxes (a superset of the k best) and near-tie boxes, with their distances
    c_lo = np.empty((16, m), dtype=np.int32)
    c_hi = np.empty((16, m), dtype=np.int32)
    c_lab = np.empty(16, dtype=np.int64)
    c_d = np.empty(16)
    t_lo = np.empty((4, m), dtype=np.int32)
    t_hi = np.empty((4, m), dtype=np.int32)
    t_d = np.empty(4)
    # workspaces of the bounds, allocated once per round
    act = np.empty(T, dtype=np.int32)
    start = np.empty(T, dtype=np.int32)
    cs = np.empty(c)
    cell = np.empty(m, dtype=np.int32)
    buf = np.empty(c)
    lb = np.empty(c)
    trange = np.empty(T)
    pleaf = np.empty(T, dtype=np.int32)  # the trees' leaves at the probe's cell
    pweight = np.empty(T)  # the trees' weights from them (_probe_weights)
    top_n = np.empty(T, dtype=np.int32)
    stack = np.empty(max_depth_nodes, dtype=np.int32)
    mn = np.empty(c)
    mx = np.empty(c)
    shared = np.zeros(coff[-1] + 1)  # summed spread per cut (cell boundary index)
    pcost = np.zeros((2, coff[-1] + 1))  # pseudo-costs per cut (_split_cut)
    sw = sweep_workspace(coff, m, c, max_depth_nodes)
    tfeat, tmin, rec = bounds_workspace(nv.shape[0], T, c, max_depth_nodes, True)
    lo = np.empty(m, dtype=np.int32)
    hi = np.empty(m, dtype=np.int32)
    nlo = np.empty(m, dtype=np.int32)
    nhi = np.empty(m, dtype=np.int32)
    # x's cell per feature (any cell at distance 0 from it) and the probe's one-cell box
    # (_probe_sweep)
    xcell = np.empty(m, dtype=np.int32)
    for f in range(m):
        j = coff[f]
        while j < coff[f + 1] - 1 and cupp[j] < x[f]:
            j += 1
        xcell[f] = j - coff[f]
    pbox_lo = np.empty((2, m), dtype=np.int32)  # row 1: the incumbent cell, if any
    pbox_hi = np.empty((2, m), dtype=np.int32)
    # State of the loop between calls: queue size, free and used slots, candidates, ties,
    # and the counters.
    st = np.zeros(_N_STATE, dtype=np.int64)
    st[_QUEUED] = n
    st[_INCUMBENT] = -1
    timed = deadline < np.inf
    code = _DONE
    full = False  # out of max_held
    # a round starts only within the time (the deepening rounds may be many short ones)
    t_start = clock() if timed and with_mixed else 0.0
    late = timed and with_mixed and t_start >= deadline
    every = 1  # boxes between two clock readings
    while not late:
        # with a deadline, the loop stops every few boxes to read the clock
        pause = min(max_pops, st[_POPS] + every) if timed else max_pops
        code = _search_loop(
            x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat,
            node_lo, node_hi, left, right, kstart, kend, order, labels, rlo, rhi, coff, clow,
            cupp, clcl, cucl, nf, ncut, nl, nr, nv, roots, base, tie_high, tol, pause,
            klo, khi, best, keys, vals, p_lo, p_hi, p_start, p_cs, p_free, c_lo, c_hi, c_lab,
            c_d, t_lo, t_hi, t_d, a0, a1, act, start, cs, cell, buf, lb, trange, top_n, stack,
            mn, mx, shared, pcost, sw, tfeat, tmin, rec, lo, hi, nlo, nhi, st, xcell, pbox_lo,
            pbox_hi, polish, hard_after, pleaf, pweight, gbest, part, n_parts, bound)
        if code == _OUT_OF_POPS and st[_POPS] < max_pops:
            now = clock()
            if now < deadline:
                per_box = (now - t_start) / max(st[_POPS], 1)
                every = max(1, min(CLOCK_EVERY, int(CLOCK_SECONDS / max(per_box, 1e-9))))
                continue
            late = True
            break
        if code == _POLISH:
            # The probe's target cell, brought nearer x by the guesses' coordinate descent
            # and labelled exactly, lowers the bound further (in this compiled function:
            # the descent allocates, the loop must not). Credit RF 100x5, 200 queries: l1
            # 0.94x the boxes (p99 1.15 -> 0.91 s), l2 0.96x; linf 0.99x, so not there
            # (no guess, ``best_first``). Distances identical.
            st[_PROBED] = 0
            pc = pbox_lo[1].copy()
            lab2, d2 = polish_cell(q, ce, kern, klo, khi, pc, deadline)
            if lab2 >= 0:
                d2 = d2 + d2 * 1e-12 + 1e-300
                if d2 < best[0]:
                    best[0] = d2
                    pbox_lo[1] = pc
                    pbox_hi[1] = pc
                    st[_INCUMBENT] = lab2
            continue
        if code != _NEED_ROOM:
            break
        # Room for everything the next pop may add, then carry on where the loop stopped.
        need = st[_NEED]
        n, n_used, n_c, n_t = st[_QUEUED], st[_USED], st[_CANDIDATES], st[_TIES]
        sneed = st[_SLOTS]
        if sneed > 0:
            if n_used + sneed > max_held:
                full = True
                break
            # doubling, but never past max_held: the slots are most of a search's memory
            rows = min(max(2 * p_lo.shape[0], n_used + sneed), max_held)
            p_lo = grow_to(p_lo, rows)
            p_hi = grow_to(p_hi, rows)
            p_start = grow_to(p_start, rows)
            p_cs = grow_to(p_cs, rows)
            p_free = grow_to(p_free, rows)
        if n + need > keys.shape[0]:
            keys = grow(keys, n + need)
            vals = grow(vals, n + need)
        if n_c + need > c_lo.shape[0]:
            c_lo = grow(c_lo, n_c + need)
            c_hi = grow(c_hi, n_c + need)
            c_lab = grow(c_lab, n_c + need)
            c_d = grow(c_d, n_c + need)
        if n_t + 1 > t_lo.shape[0]:
            t_lo = grow(t_lo, n_t + 1)
            t_hi = grow(t_hi, n_t + 1)
            t_d = grow(t_d, n_t + 1)
    _share(best, gbest, bound)
    n_c, n_t = st[_CANDIDATES], st[_TIES]
    # Stopped early: every target point nearer than the queue's least key is among the
    # candidates (best-first pops keys in order), and the probe's cell is an incumbent.
    stopped = late or code != _DONE
    low = best[k - 1]
    if stopped and st[_QUEUED] > 0:
        low = min(low, keys[0])
    n_i = 1 if stopped and st[_INCUMBENT] >= 0 else 0
    i_lab = np.full(n_i, st[_INCUMBENT])
    i_d = np.empty(n_i)
    if n_i:
        i_d[0] = rect_dist(1, x, w, norm, cmin, cmax, integral, pbox_lo, pbox_hi, coff, clow,
                           cupp, clcl, cucl, np.inf, gcol, gstart, gcols, gcost, xcat, a0, a1)
    return (c_lo[:n_c].copy(), c_hi[:n_c].copy(), c_lab[:n_c].copy(), c_d[:n_c].copy(),
            t_lo[:n_t].copy(), t_hi[:n_t].copy(), t_d[:n_t].copy(), st[_KD_POPS],
            st[_EVALUATED], st[_POPS],
            OUT_OF_TIME if late else OUT_OF_MEMORY if full
            else COMPLETE if code == _DONE else OUT_OF_BOXES,
            pbox_lo[1:1 + n_i].copy(), pbox_hi[1:1 + n_i].copy(), i_lab, i_d, low, st[_USED])


@njit(**NO_NRT)
def _share(best, gbest, bound):
    """Exchange the nearest target met with the search's other parts (``k = 1``): take
    theirs when nearer, else offer this part's when it came from a target (below the
    round's ``bound``, which is no target's distance). Unsynchronised: a part may read a
    stale value or overwrite a nearer one with its own, and each is still the distance of
    a target some part will answer with, so it only prunes less."""
    if best.shape[0] != 1:
        return
    if gbest[0] < best[0]:
        best[0] = gbest[0]
    elif best[0] < gbest[0] and best[0] < bound:
        gbest[0] = best[0]


@njit(**NO_NRT)
def _search_loop(x, w, norm, cmin, cmax, integral, tmask, k, gcol, gstart, gcols, gcost, xcat,
                 node_lo, node_hi, left, right, kstart, kend, order, labels, rlo, rhi, coff,
                 clow, cupp, clcl, cucl, nf, ncut, nl, nr, nv, roots, base, tie_high, tol,
                 max_pops, klo, khi, best, keys, vals, p_lo, p_hi, p_start, p_cs, p_free, c_lo,
                 c_hi, c_lab, c_d, t_lo, t_hi, t_d, a0, a1, act, start, cs, cell, buf, lb, trange,
                 top_n, stack, mn, mx, shared, pcost, sw, tfeat, tmin, rec, lo, hi, nlo, nhi, st,
                 xcell, pbox_lo, pbox_hi, polish, hard_after, pleaf, pweight, gbest, part, n_parts,
                 bound):
    """The popping loop of :func:`_bounded_search`, compiled without reference counting:
    it allocates nothing, so no array it touches is ever counted (with counting, the
    atomic increments and decrements took about half of the search's time, perf on
    FI 100x5). It stops with :data:`_NEED_ROOM` before a pop whose additions might not
    fit, and (with ``polish``) with :data:`_POLISH` after a box whose probe found a nearer
    target cell; the caller grows the arrays, or polishes the cell, and calls it again.
    State lives in ``st``; ``bound`` is the round's, ``gbest`` shared with the search's
    other parts (:func:`_share`)."""
    n, n_free, n_used = st[_QUEUED], st[_FREE], st[_USED]
    n_c, n_t = st[_CANDIDATES], st[_TIES]
    pops, kd_pops, evaluated = st[_POPS], st[_KD_POPS], st[_EVALUATED]
    m = x.shape[0]
    c = base.shape[0]
    code = _DONE
    # The box queued last that is a piece of the box bounded last (a split's nearer child,
    # a narrowed box): when it is the next pop, as best-first makes likely, the interval
    # bound walks again only the trees that test a feature whose range changed.
    carry = -1
    carry_chg = 0  # those features' bits (feature_bit)
    carry_a = -1  # the class the box was bounded for
    # When the carried box is a split's nearer child: the cut's index, the parent's
    # interval bound and the summed weight of the trees at the cut, so that the child's
    # bound teaches the cut's pseudo-cost (pcost[0] the gains as shares of that weight,
    # pcost[1] their count; _split_cut). The nearer child is the one that must be
    # certified where the far one is dropped by distance, so its gain is the cut's worth.
    carry_cut = -1
    carry_worst = 0.0
    carry_w = 0.0
    while n > 0:
        _share(best, gbest, bound)
        if st[_PROBED]:
            code = _POLISH
            break
        if keys[0] >= best[k - 1]:  # the heap's minimum
            break
        need = _room_needed(left, kstart, kend, vals[0])
        sneed = 0  # new slots the pop takes, when the arrays have no room for them
        if n_free < need and n_used + need > p_lo.shape[0]:
            sneed = _slots_needed(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols,
                                  gcost, xcat, left, kstart, kend, order, labels, rlo, rhi,
                                  coff, clow, cupp, clcl, cucl, best[k - 1], a0, a1,
                                  vals[0]) - n_free
            if n_used + sneed <= p_lo.shape[0]:
                sneed = 0  # the slots there are will do
        if (n + need > keys.shape[0] or sneed > 0 or n_c + need > c_lo.shape[0]
                or n_t + 1 > t_lo.shape[0]):
            st[_NEED] = need
            st[_SLOTS] = sneed
            code = _NEED_ROOM
            break
        if not is_kd(vals[0]) and pops >= max_pops:
            code = _OUT_OF_POPS
            break
        d, s, n = pop(keys, vals, n)
        chg = carry_chg if s == carry else ALL_CHANGED
        learn = carry_cut if s == carry else -1
        carry = -1
        carry_cut = -1
        if is_kd(s):
            kd_pops += 1
            nd = kd_node(s)
            own = kd_owner(s)
            if left[nd] >= 0:
                n = _expand_inner(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost,
                                  xcat, node_lo, node_hi, left, right, nd, own, best[k - 1],
                                  keys, vals, n, a0, a1)
            else:
                n_c, n, n_free, n_used, ev = _scan_leaf(
                    x, w, norm, cmin, cmax, integral, k, gcol, gstart, gcols, gcost, xcat,
                    kstart, kend, order, labels, rlo, rhi, coff, clow, cupp, clcl, cucl,
                    roots, base, nd, own, best, c_lo, c_hi, c_lab, c_d, n_c, keys, vals, n,
                    p_lo, p_hi, p_start, p_cs, p_free, n_free, n_used, klo, khi, a0, a1,
                    part, n_parts)
                evaluated += ev
            continue
        pops += 1
        # -- a box of a mixed region: trim it to the ball, then bound its margin
        n_act = _take_box(p_lo, p_hi, p_start, p_cs, s, lo, hi, start, act, cs, nf)
        p_free[n_free] = s
        n_free += 1
        if best[k - 1] < np.inf:
            clip_to_ball(x, w, norm, gcol, lo, hi, coff, clow, cupp, best[k - 1])
        if chg != ALL_CHANGED:  # the slot still holds the box before the clip
            chg = _changed(lo, hi, p_lo[s], p_hi[s], chg)
        single = True
        for f in range(m):
            cell[f] = (lo[f] + hi[f]) // 2
            if hi[f] > lo[f]:
                single = False
        if single or c != 2:
            a, marg = label_cell(cell, act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high,
                                 buf)
        else:
            # Two classes: no need to label a cell first, the one walk below bounds the
            # margin from both sides and picks the class nearer to certification
            # (PD: same boxes, 15-23% less time).
            a = 0
            marg = 0.0
        if single:
            if marg <= tol:
                n_t = _keep_tie(t_lo, t_hi, t_d, n_t, lo, hi, d)
            elif tmask[a]:
                n_c = _keep(best, c_lo, c_hi, c_lab, c_d, n_c, lo, hi, a, d)
            continue
        if a != carry_a:
            chg = ALL_CHANGED
        worst = interval_bound(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb,
                               trange, top_n, stack, mn, mx, tfeat, tmin, rec, chg)
        if learn >= 0 and a == carry_a:
            pcost[0, learn] += (worst - carry_worst) / carry_w
            pcost[1, learn] += 1.0
        a_walk = a
        worst_walk = worst
        if c == 2 and worst <= tol:
            a, worst = _two_class_flip(a, worst, cs, act, n_act, tmin, trange, lb)
        narrowed = False
        swept = False
        if worst <= tol and worst > -SWEEP_REACH * spread_sum(act, n_act, trange):
            swept = True
            # The interval bound failed, but not by far: the sweep bound often decides.
            # With a of no target class it also narrows the box to where a target may be.
            worst, narrowed = sweep_bound(lo, hi, a, act, n_act, cs, nv, nf, tfeat, top_n,
                                          rec, coff, lb, sw, not tmask[a], tmask, tol, nlo,
                                          nhi)
        # -- leaf: certified, or nothing to find
        if worst > tol:
            if tmask[a]:
                n_c = _keep(best, c_lo, c_hi, c_lab, c_d, n_c, lo, hi, a, d)
            continue
        if _hopeless(tmask, lb, a, tol):
            continue
        probed = False
        if swept and k == 1 and norm != L0:
            # with two classes and a no target, the probe always labels its cell
            probed = c == 2 and not tmask[a]
            best[0], b2 = _probe_sweep(x, w, norm, cmin, cmax, integral, tmask, gcol, gstart,
                                       gcols, gcost, xcat, coff, clow, cupp, clcl, cucl, nf, ncut,
                                       nl, nr, nv, tie_high, tol, lo, hi, a, lb, sw[6], act,
                                       n_act, start, cs, xcell, pbox_lo, pbox_hi, buf, a0, a1,
                                       best[0], pleaf)
            if b2 >= 0:  # the nearest target cell seen yet: kept in row 1
                for f in range(m):
                    pbox_lo[1, f] = pbox_lo[0, f]
                    pbox_hi[1, f] = pbox_hi[0, f]
                st[_INCUMBENT] = b2
                if polish and pops >= hard_after:
                    st[_PROBED] = 1
        # -- narrow: the rest of the box holds no target point; requeue the narrowed box
        # at its own (larger or equal) distance, with the same tree states, in two pieces
        # when a run of cells inside it holds none either (sw[7], see sweep_bound).
        if narrowed:
            gap = sw[7]
            carry_a = a_walk
            carry_chg = _changed(nlo, nhi, lo, hi, 0)
            if gap[0] >= 0:
                n, n_free, n_used, carry = _queue_halves(
                    x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost, xcat, coff,
                    clow, cupp, clcl, cucl, p_lo, p_hi, p_start, p_cs, p_free, n_free, n_used,
                    keys, vals, n, start, cs, best[k - 1], a0, a1, nlo, nhi, gap[0],
                    gap[1] - 1, gap[2] + 1)
                carry_chg |= feature_bit(gap[0])
                continue
            s2, n_free, n_used = slot(p_free, n_free, n_used)
            for f in range(m):
                p_lo[s2, f] = nlo[f]
                p_hi[s2, f] = nhi[f]
            dd, n_free = _fill_slot(x, w, norm, cmin, cmax, integral, gcol, gstart, gcols,
                                    gcost, xcat, coff, clow, cupp, clcl, cucl, p_lo, p_hi,
                                    p_start, p_cs, p_free, s2, n_free, start, cs, best[k - 1],
                                    a0, a1)
            if dd < np.inf:
                n = push_first(keys, vals, n, dd, s2)
                carry = s2
            continue
        # -- split at one live tree's root-most undecided cut
        weight = trange
        if probed and pops >= hard_after:
            _probe_weights(a, act, n_act, nv, pleaf, tmin, trange, pweight)
            weight = pweight
        bt, bw = _split_cut(x, w, norm, gcol, coff, clow, cupp, nf, ncut, nv, lo, hi, act,
                            n_act, start, cs, top_n, trange, weight, shared, pcost,
                            pops >= hard_after)
        if bt < 0:
            n_t = _keep_tie(t_lo, t_hi, t_d, n_t, lo, hi, d)  # one score vector on the box
            continue
        cut = ncut[start[bt]]
        n, n_free, n_used, carry = _queue_halves(
            x, w, norm, cmin, cmax, integral, gcol, gstart, gcols, gcost, xcat, coff, clow,
            cupp, clcl, cucl, p_lo, p_hi, p_start, p_cs, p_free, n_free, n_used, keys, vals, n,
            start, cs, best[k - 1], a0, a1, lo, hi, nf[start[bt]], cut, cut + 1)
        carry_chg = feature_bit(nf[start[bt]])
        carry_a = a_walk
        if bw > 0.0:
            carry_cut = coff[nf[start[bt]]] + cut
            carry_worst = worst_walk
            carry_w = bw
    st[_QUEUED], st[_FREE], st[_USED] = n, n_free, n_used
    st[_CANDIDATES], st[_TIES] = n_c, n_t
    st[_POPS], st[_KD_POPS], st[_EVALUATED] = pops, kd_pops, evaluated
    return code


__all__ = ["COMPLETE", "OUT_OF_BOXES", "OUT_OF_MEMORY", "OUT_OF_TIME", "Cells", "Forest", "Query",
           "best_first", "certified_only", "clip_to_ball", "guess_radius", "reachable_cells"]
