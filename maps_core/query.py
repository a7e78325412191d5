"""Exact counterfactual queries: best-first branch-and-bound over the class KD-trees.

The key of a KD-tree node is the distance from the query to the node's bounding box,
intersected with the query's constraint box; every rectangle below the node is inside that
box, so the key is an admissible lower bound and the first rectangle whose exact distance
no pending key can beat is the global optimum. Per-feature costs are monotone under
enlarging an interval, which is what keeps weights, norms and constraints exact:

* ``l1``: sum of ``w_f * delta_f``; ``l2``: root of the sum of squares; ``linf``: max;
* immutable features: the interval must contain ``x_f`` (constraint box ``[x_f, x_f]``);
* one-way changes: intersect with ``[x_f, inf)`` or ``(-inf, x_f]``;
* user bounds: intersect with ``[lower, upper]``;
* integral features: the interval is rounded inward to integers;
* one-hot groups: a box admits the categories whose column may be 1 while the others may
  be 0; switching category costs the group's constant (see :mod:`maps_core.distance`);
* ``l0``: the number of changed features (a group counts once), ties broken by weighted
  l1, as one lexicographic key.

The search itself (:func:`maps_core.lazy.best_first`) runs the KD-tree descent and the
refinement of mixed regions left by a budgeted build in one priority queue.

Rectangles of continuous features are open at a lower end that comes from a threshold
(``x > t``); the certified distance is the infimum, and the returned point is the nearest
float32 value strictly inside.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
from numba import njit

from ._clock import clock, watching
from ._memory import boxes_within, default_query_memory, usable_cpus
from ._norms import L0, L2, LINF, finish
from .distance import NOMINAL, rect_dist
from .engine import SearchEngine
from .exceptions import BudgetExceededError, InvalidQueryError, QueryCancelledError
from .grid import cells_kernel
from .lazy import (
    COMPLETE,
    OUT_OF_MEMORY,
    OUT_OF_TIME,
    Query,
    best_first,
    certified_only,
    guess_radius,
)
from .options import QueryOptions
from .partition import MIXED, refine_region
from .schema import MAX_COST_EXPONENT


# --------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _locate(A, integral, dom_lower, dom_upper, thr_values, thr_offsets, node_lo, node_hi, left,
            right, start, end, order, class_root, rlo, rhi, view32):
    """Rectangle containing each row of ``A`` (shape (n, m)), -1 where none does."""
    n, m = A.shape
    C = cells_kernel(A, integral, thr_values, thr_offsets, view32)
    P = np.empty(m)  # the row, inside the domain
    out = np.full(n, -1, dtype=np.int64)
    stack = np.empty(256, dtype=np.int64)
    for i in range(n):
        for f in range(m):
            # KD-tree boxes are closed boxes of real cell bounds, so they hold the row
            # itself (its cells C come from the model's view).
            P[f] = min(max(A[i, f], dom_lower[f]), dom_upper[f])
        found = -1
        for c in range(class_root.shape[0]):
            if class_root[c] < 0 or found >= 0:
                continue
            sp = 0
            stack[sp] = class_root[c]
            sp = 1
            while sp > 0 and found < 0:
                sp -= 1
                nd = stack[sp]
                inside = True
                for f in range(m):
                    if P[f] < node_lo[nd, f] or P[f] > node_hi[nd, f]:
                        inside = False
                        break
                if not inside:
                    continue
                if left[nd] < 0:
                    for j in range(start[nd], end[nd]):
                        r = order[j]
                        ok = True
                        for f in range(m):
                            if C[i, f] < rlo[r, f] or C[i, f] > rhi[r, f]:
                                ok = False
                                break
                        if ok:
                            found = r
                            break
                else:
                    if sp + 2 > stack.shape[0]:
                        s2 = np.empty(2 * stack.shape[0], dtype=np.int64)
                        s2[:sp] = stack[:sp]
                        stack = s2
                    stack[sp] = left[nd]
                    stack[sp + 1] = right[nd]
                    sp += 2
        out[i] = found
    return out


@njit(cache=True, nogil=True)
def _scan(x, w, norm, cmin, cmax, integral, tmask, gcol, gstart, gcols, gcost, xcat, labels, rlo,
          rhi, coff, clow, cupp, clcl, cucl, with_mixed):
    """Linear scan over every rectangle: distance per rectangle (inf if not a target;
    mixed ones get their distance when ``with_mixed``)."""
    n = labels.shape[0]
    out = np.full(n, np.inf)
    a0 = np.empty(x.shape[0], dtype=np.bool_)
    a1 = np.empty(x.shape[0], dtype=np.bool_)
    for r in range(n):
        lab = labels[r]
        if (lab < 0 and not (with_mixed and lab == -1)) or (lab >= 0 and not tmask[lab]):
            continue
        out[r] = rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp,
                           clcl, cucl, np.inf, gcol, gstart, gcols, gcost, xcat, a0, a1)
    return out


@njit(cache=True, nogil=True)
def _place(x, lo_cells, hi_cells, cmin, cmax, coff, clow, cupp, clcl, cucl, integral, gstart,
           gcols):
    """Region of the rectangle ``lo_cells..hi_cells`` (cell indices, shape (m,)) clipped to
    the constraint box ``cmin..cmax``, and the point of it nearest to ``x``. Returns
    (point, lower, upper, lower_closed, upper_closed), shape (m,).

    Cell bounds are real boundaries (:mod:`maps_core.splits`), so every real input of the
    region, up to its ends, gets the rectangle's class; the point is the nearest float64
    of the region: ``x`` clipped to it, one float64 inside an open end. One-hot groups
    (columns ``gcols[gstart[g]:gstart[g + 1]]``) stay on x's category when the region
    allows it, otherwise take the first category the region allows (all switches cost
    the same)."""
    m = x.shape[0]
    p = np.empty(m)
    lower = np.empty(m)
    upper = np.empty(m)
    lcl = np.empty(m, dtype=np.bool_)
    ucl = np.empty(m, dtype=np.bool_)
    for f in range(m):
        gl = coff[f] + lo_cells[f]
        gh = coff[f] + hi_cells[f]
        lo_f, hi_f = clow[gl], cupp[gh]
        lc, uc = clcl[gl], cucl[gh]
        if cmin[f] > lo_f:
            lo_f = cmin[f]
            lc = True
        if cmax[f] < hi_f:
            hi_f = cmax[f]
            uc = True
        if integral[f]:
            lo_f = np.ceil(lo_f)  # math.ceil would return an int64 in numba: overflows
            hi_f = np.floor(hi_f)
            lc = lc or np.isfinite(lo_f)
            uc = uc or np.isfinite(hi_f)
        lower[f], upper[f], lcl[f], ucl[f] = lo_f, hi_f, lc, uc
        # x's own value when it is inside (an immutable feature never moves by an ulp)
        pf = min(max(x[f], lo_f), hi_f)
        if pf == lo_f and not lc:
            pf = np.nextafter(lo_f, np.inf)
        elif pf == hi_f and not uc:
            pf = np.nextafter(hi_f, -np.inf)
        p[f] = pf
    for g in range(gstart.shape[0] - 1):
        s, e = gstart[g], gstart[g + 1]
        cur = s
        n_one = 0  # columns the region holds at 1 (at most one, or no category fits)
        for j in range(s, e):
            if x[gcols[j]] > x[gcols[cur]]:
                cur = j
            if lower[gcols[j]] > 0:
                n_one += 1
        pick = -1
        for j in range(s - 1, e):
            i = cur if j < s else j  # x's category first, then in order
            if upper[gcols[i]] >= 1 and n_one - (1 if lower[gcols[i]] > 0 else 0) == 0:
                pick = i
                break
        if pick < 0:
            raise AssertionError("a region holds no legal category of a one-hot group")
        for j in range(s, e):
            p[gcols[j]] = 0.0
        p[gcols[pick]] = 1.0
    return p, lower, upper, lcl, ucl


@njit(cache=True, nogil=True)
def _point_distance(x, p, w, norm, gcol, gstart, gcols, gcost):
    """Distance between two legal points of shape (m,): weighted per feature, a changed
    one-hot group costs its switching cost (and counts once in l0)."""
    total = 0.0
    top = 0.0
    changed = 0
    for f in range(x.shape[0]):
        if gcol[f] >= 0 or p[f] == x[f]:
            continue
        d = w[f] if gcol[f] == NOMINAL else w[f] * abs(p[f] - x[f])
        changed += 1
        total += d * d if norm == L2 else d
        top = max(top, d)
    for g in range(gcost.shape[0]):
        for j in range(gstart[g], gstart[g + 1]):
            if p[gcols[j]] != x[gcols[j]]:
                d = gcost[g]
                changed += 1
                total += d * d if norm == L2 else d
                top = max(top, d)
                break
    if norm == L0:
        return float(changed)
    if norm == L2:
        return math.sqrt(total)
    return top if norm == LINF else total


#: What :func:`_batch` did with a row: answered; near-tie boxes among its candidates
#: (the model must label them: the caller's per-row path); out of a budget (its
#: ``best_first`` status is in the counters); no candidate (infeasible: the caller's path
#: words the reason); out of a budget but answered with the best it found (``best_found``).
ANSWERED, NEAR_TIES, OUT_OF_BUDGET, NO_CANDIDATE, BEST_FOUND = 0, 1, 2, 3, 4


@njit(cache=True, nogil=True)
def _batch(X, cmins, cmaxs, tmasks, xcats, w, norm, integral, gcol, gstart, gcols, gcost, fo,
           ce, kern, max_pops, max_held, max_seconds, radius, probe, growth, max_rounds,
           best_found, guess, hard_after):
    """The nearest counterfactual (``k = 1``) of every row of ``X`` (shape (n, m)) in one
    compiled call: per row, :func:`~maps_core.lazy.best_first` under its constraint box
    (each row with its own budgets: ``max_pops`` boxes popped, ``max_held`` held at once and
    ``max_seconds``)
    (``cmins``, ``cmaxs``, shape (n, m)) and target mask (``tmasks``, shape (n, c)), with
    the deepening ``radius``, ``probe``, ``growth``, ``max_rounds``, ``guess`` and
    ``hard_after`` as there, then :func:`_place` and :func:`_point_distance` on its
    nearest candidate.

    Returns (status, distance, cf_distance, label, point, lower, upper, lower_closed,
    upper_closed, counters, seconds, low): ``status`` per row (:data:`ANSWERED`... ; the
    other outputs of a row are set only when answered), distances in accumulated form, the
    counters (KD nodes popped, rectangles evaluated, mixed boxes popped, the most held at
    once, and how ``best_first`` ended: shape (n, 5)),
    each row's wall-clock seconds, and for a row out of a budget, a lower bound of its
    optimum (accumulated form). With ``best_found``, such a row is answered with the
    nearest certified target box its search met (:data:`BEST_FOUND`), if any.

    A batch through :func:`search` paid about 60 us of Python a row around a 15 us kernel
    on CP (option arrays, one dispatch per compiled call, result objects); here the rows
    pay only the objects of their answers.
    """
    n, m = X.shape
    status = np.zeros(n, dtype=np.int8)
    dist = np.zeros(n)
    cfd = np.zeros(n)
    lab = np.zeros(n, dtype=np.int64)
    P = np.zeros((n, m))
    LO = np.zeros((n, m))
    HI = np.zeros((n, m))
    LC = np.zeros((n, m), dtype=np.bool_)
    UC = np.zeros((n, m), dtype=np.bool_)
    counters = np.zeros((n, 5), dtype=np.int64)
    seconds = np.zeros(n)
    low = np.zeros(n)
    t0 = clock()
    for i in range(n):
        q = Query(X[i], w, norm, cmins[i], cmaxs[i], integral, tmasks[i], 1, gcol, gstart,
                  gcols, gcost, xcats[i])
        (c_lo, c_hi, c_lab, c_d, _, _, t_d, kp, ev, po, done, i_lo, i_hi, i_lab, i_d, lb,
         hd) = best_first(q, fo, ce, kern, max_pops, max_held, radius, probe, growth,
                          max_rounds, max_seconds, best_found, guess, guess, hard_after,
                          np.full(1, np.inf), 0, 1)
        counters[i, 0] = kp
        counters[i, 1] = ev
        counters[i, 2] = po
        counters[i, 3] = hd
        counters[i, 4] = done
        low[i] = lb
        if done != COMPLETE and best_found and c_d.shape[0] + i_d.shape[0] > 0:
            status[i] = BEST_FOUND
            c_lo = np.concatenate((c_lo, i_lo))
            c_hi = np.concatenate((c_hi, i_hi))
            c_lab = np.concatenate((c_lab, i_lab))
            c_d = np.concatenate((c_d, i_d))
        elif done != COMPLETE:
            status[i] = OUT_OF_BUDGET
        elif t_d.shape[0] > 0:
            status[i] = NEAR_TIES
        elif c_d.shape[0] == 0:
            status[i] = NO_CANDIDATE
        if status[i] == ANSWERED or status[i] == BEST_FOUND:
            j = np.argmin(c_d)  # the first of equal distances, as a stable sort's
            p, lower, upper, lcl, ucl = _place(X[i], c_lo[j], c_hi[j], cmins[i], cmaxs[i],
                                               ce.coff, ce.clow, ce.cupp, ce.clcl, ce.cucl,
                                               integral, gstart, gcols)
            P[i] = p
            LO[i] = lower
            HI[i] = upper
            LC[i] = lcl
            UC[i] = ucl
            dist[i] = c_d[j]
            lab[i] = c_lab[j]
            cfd[i] = _point_distance(X[i], p, w, norm, gcol, gstart, gcols, gcost)
        t1 = clock()  # each row's own time, not the batch's mean
        seconds[i] = t1 - t0
        t0 = t1
    return status, dist, cfd, lab, P, LO, HI, LC, UC, counters, seconds, low


# --------------------------------------------------------------------------------------
# result assembly
# --------------------------------------------------------------------------------------
@dataclass
class Found:
    """One counterfactual before conversion to the public result type."""

    x: np.ndarray
    distance: float
    counterfactual_distance: float
    lower: np.ndarray
    upper: np.ndarray
    lower_closed: np.ndarray
    upper_closed: np.ndarray
    target: int


@dataclass
class SearchOutput:
    prediction: int
    found: list[Found] = field(default_factory=list)
    nodes_popped: int = 0
    rectangles_evaluated: int = 0
    regions_refined: int = 0
    peak_boxes: int = 0  # the most mixed-region boxes held at once
    unreachable: tuple[int, ...] = ()  # target class indices, when infeasible
    constraints: str = ""
    seconds: float = 0.0  # wall-clock time of the search
    # False when a budget stopped the search and ``found`` is the best it met
    # (``best_found``); ``lower_bound`` then bounds the nearest's optimum from below
    optimal: bool = True
    lower_bound: float | None = None


def assemble(
    engine: SearchEngine,
    x: np.ndarray,
    lo_cells: np.ndarray,
    hi_cells: np.ndarray,
    distance: float,
    target: int,
    cmin: np.ndarray,
    cmax: np.ndarray,
    opts: QueryOptions,
) -> Found:
    """Region of a rectangle clipped to the constraints, and the point to return in it."""
    g = engine.grid
    p, lower, upper, lcl, ucl = _place(
        x, np.ascontiguousarray(lo_cells, dtype=np.int32),
        np.ascontiguousarray(hi_cells, dtype=np.int32), cmin, cmax, g.cell_offsets,
        g.cell_lower, g.cell_upper, g.cell_lower_closed, g.cell_upper_closed, g.integral,
        opts.gstart, opts.gcols,
    )
    cfd = _point_distance(x, p, opts.weights, opts.norm_code, opts.gcol, opts.gstart,
                          opts.gcols, opts.gcost)
    return Found(
        x=p,
        distance=float(distance),
        counterfactual_distance=cfd,
        lower=lower,
        upper=upper,
        lower_closed=lcl,
        upper_closed=ucl,
        target=int(target),
    )


# --------------------------------------------------------------------------------------
# entry points used by the facade
# --------------------------------------------------------------------------------------
def locate_rect(engine: SearchEngine, A: np.ndarray) -> np.ndarray:
    """Id of the rectangle containing each row of ``A`` (shape (n, m)), shape (n,)."""
    g, ix, part = engine.grid, engine.index, engine.partition
    return _locate(A, g.integral, g.dom_lower, g.dom_upper, g.thr_values, g.thr_offsets,
                   ix.node_lo, ix.node_hi, ix.left, ix.right, ix.start, ix.end, ix.order,
                   ix.class_root, part.lo, part.hi, g.view32)


def locate(engine: SearchEngine, A: np.ndarray, rid: np.ndarray | None = None) -> np.ndarray:
    """Class index of every row: the label of its rectangle, the model's decision
    (:meth:`SearchEngine.classify`) in mixed ones. ``rid``: the rows' rectangle ids when
    the caller already has them (:func:`locate_rect`), so they are not looked up twice."""
    if rid is None:
        rid = locate_rect(engine, A)
    lab = np.asarray(engine.partition.labels)[rid].astype(np.int64)
    # A complete partition covers every legal point; rid < 0 would be a bug, and then the
    # ensemble's own arithmetic is the safe answer.
    mixed = (lab == MIXED) | (rid < 0)
    if mixed.any():
        lab[mixed] = engine.classify(A[mixed])
    return lab


def _piece_holding(
    engine: SearchEngine, cells: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Certified box containing the cell ``cells`` inside the mixed box ``lo..hi``."""
    lab = MIXED
    while lab == MIXED:  # refine a chunk, keep the piece holding the cell, repeat
        plo, phi, plab = refine_region(engine.kernel, lo, hi, 512)
        j = int(np.flatnonzero(np.all((plo <= cells) & (cells <= phi), axis=1))[0])
        lo, hi, lab = plo[j], phi[j], int(plab[j])
    return lo, hi


# Boxes a query may pop inside mixed regions, all deepening rounds together, before giving
# up (exactness is never traded: a query that needs more fails with BudgetExceededError).
# It was 5M per round, up to 25 rounds: a Credit RF 200x8 query took 3.5-8 minutes and a
# 2.5 GB queue to fail. The slowest Credit RF 100x5 queries that succeed pop ~1.1M boxes.
MAX_MIXED_POPS = 2_000_000

# Iterative deepening on maps with mixed regions: a search bounded by a distance clips
# every box to the cells that may lie nearer (``lazy.clip_to_ball``), which spares it the
# peeling of mixed regions beyond the answer, split by split. The first bound is this
# fraction of the typical weighted feature width, grown by DEEPEN_GROWTH until a round
# finds the k best (each round is exact below its bound); after DEEPEN_ROUNDS rounds the
# search runs unbounded. PD 100x5, 2k-rectangle maps, l2 kernel medians, same queries:
# 8.9 -> 2.4 ms (test rows), 2.6 -> 0.56 ms (uniform). Start and growth: on the 5M maps
# and the suite's 1000 queries, 0.1/1.3 against 0.05/1.5 gives means -7/-7/-3% (l2, l1,
# linf), medians within noise; 0.05/1.2, 0.025/1.3 and 0.1/1.5 are no better.
DEEPEN_START = 0.1
DEEPEN_GROWTH = 1.3
DEEPEN_ROUNDS = 24
# l1 and l2 bound the first round instead just past a guessed target cell's distance
# (k = 1 only; ``lazy.best_first``). 2,000 queries (1,000 test rows, 1,000 uniform), p50 /
# p99 ms without -> with: Credit GB 300x4 l1 2.03 / 13.7 -> 0.67 / 4.7, l2 1.72 / 13.2 ->
# 0.71 / 2.5; Adult GB 300x4 l1 1.37 / 26.7 -> 1.29 / 9.4, l2 1.38 / 21.3 -> 1.49 / 8.4
# (the guess costs 0.2-0.4 ms); Credit RF 100x5 (400 queries) l1 p50 / mean 24.2 / 101 ->
# 18.9 / 84 ms, 0.81x the boxes; PD 100x5 (5M maps, engine_ab) l1 0.75x, l2 0.99x. Not
# linf: its answers mostly lie near the fixed start there, so the guess cost more than it
# saved (PD p50 1.23x, Adult 1.05x; Credit GB 1.48 -> 0.76 ms, which meets its target
# either way). Distances identical in every run. Measured again on the engine of
# 2026-11-27 (same maps, 1,000 linf queries, 300 on Credit RF, half of them test rows,
# alternating runs): Credit GB
# 300x4 0.38x the time, its test rows' p50 3.0 -> 0.66 ms (their first round, bounded at
# 0.1, finds the answer in a ball far wider than it); but Credit RF 100x5 p50 1.1 -> 2.3
# ms (the guess costs 1.2-1.7 ms on that forest: past the 2 ms target) and Adult GB 300x4
# 0.86 -> 1.1 ms, each for 0.85x the time in all. Guessing only once a first round found
# nothing: Credit GB 1.00x (its first round does find the answer), Credit RF p50 2.5 ms.
# A guess that gives up after 0.3 ms: Credit GB 0.70x the time (test rows' p50 3.0 -> 0.7
# ms), Adult GB 0.94x, but Credit RF 1.05x (p50 1.12 -> 1.46 ms) and PD 1.16x at the
# median (0.58 -> 0.67 ms: its answers lie near the fixed start, so a guess buys nothing
# there; benchmarks/results/linf_guess.patch). linf gets a probe round instead (PROBE):
# Credit GB 0.34x, Adult GB 1.08-1.13x, Credit RF 0.98x, PD within noise.
GUESS_FIRST = True


#: A round of a query's search is hard once it has popped this many mixed-region boxes;
#: from then on a target cell the sweep probe finds is polished towards x before it lowers
#: the bound, and a probed two-class box is split where the trees' largest contradiction
#: lies (:func:`~maps_core.lazy.best_first`'s ``hard_after``). Both cost more than they
#: save an easy search: polishing every probe's cell gave Credit GB 300x4 (2,000 queries)
#: 0.99x the boxes in 1.03x the time, and the probe-weighted cut from the first box 1.16x
#: the boxes (l1) and 1.19x (linf), against 1.01x after 256 boxes (64: 1.03x and 1.07x);
#: on Credit RF 100x5 (200 l1 probe queries) the cut gave 0.90x the boxes from either.
#: A module global read at each call, so a test can make every round hard.
HARD_AFTER = 256

#: A single query's search runs in ``SearchBudget.threads`` parts at once (k = 1) once at
#: least PARALLEL_SHARE of the recent searches on its maps under its norm popped
#: PARALLEL_AFTER mixed-region boxes or more (:class:`~maps_core.engine.SearchPace`); for
#: a shorter typical search, handing parts to threads costs more than it saves. Credit RF
#: 100x5, 200 l1 probe queries, in 2 parts against 1 on this 2-core machine: p50 18.3 ->
#: 11.7 ms, p90 77 -> 39 ms, the whole set 1.86x faster, the same distances and 0.99x the
#: boxes; Credit GB 300x4 (about 28 boxes a query) p50 0.60 -> 0.87 ms.
PARALLEL_AFTER = 256
PARALLEL_SHARE = 0.5

#: A search without a guess (linf; l1 and l2 with ``k > 1``) starts with a probe round
#: bounded at PROBE times the schedule's first bound (:func:`~maps_core.lazy.best_first`).
#: Where the answers lie far nearer than the fixed start, a round bounded there clips the
#: boxes around x to a ball far wider than the answer: Credit GB 300x4's linf test rows
#: lie 1e-5 to 1e-3 of a feature's width away (92% within 1e-3), and popped 182 boxes at
#: the median, 3.0 ms. Where they do not, the probe round costs its few boxes: 0.13 ms on
#: Adult GB 300x4, whatever its bound (measured in the README). Every such search probes,
#: rather than only on maps whose recent answers lay within the probe: that choice made a
#: query's answer depend on the queries before it (the point differed in 10% of Credit GB
#: 300x4's linf queries, the region in 36%, at the same distance).
PROBE = 0.01


def _guessing(opts: QueryOptions) -> bool:
    """Whether a query's search starts from a guess (:data:`GUESS_FIRST`)."""
    return GUESS_FIRST and opts.norm_code != LINF


def _constraints_text(engine: SearchEngine, opts: QueryOptions) -> str:
    """The active constraints in words, for infeasible answers."""
    names = engine.feature_names
    fixed = [names[j] for j in np.flatnonzero(opts.immutable)]
    oneway = [names[j] for j in np.flatnonzero(opts.direction != 0)]
    g = engine.grid
    narrowed = (opts.lower > g.dom_lower) | (opts.upper < g.dom_upper)
    bounded = [names[j] for j in np.flatnonzero(narrowed)]
    parts = []
    if fixed:
        parts.append("immutable: " + ", ".join(fixed))
    if oneway:
        parts.append("one-way: " + ", ".join(oneway))
    if bounded:
        parts.append("bounded: " + ", ".join(bounded))
    return "; ".join(parts)


def _stays(engine: SearchEngine, x: np.ndarray, rid: int, pred: int, cmin: np.ndarray,
           cmax: np.ndarray, opts: QueryOptions) -> SearchOutput:
    """The answer when x keeps its class and satisfies the constraints: x itself, in its
    rectangle (the certified piece of a mixed one)."""
    part = engine.partition
    lo_c, hi_c = np.asarray(part.lo[rid]), np.asarray(part.hi[rid])
    if int(part.labels[rid]) == MIXED:
        lo_c, hi_c = _piece_holding(engine, engine.grid.cells_of(x[None, :])[0], lo_c, hi_c)
    f = assemble(engine, x, lo_c, hi_c, 0.0, pred, cmin, cmax, opts)
    f.x = x.copy()
    f.counterfactual_distance = 0.0
    return SearchOutput(prediction=pred, found=[f], lower_bound=0.0)


@dataclass(frozen=True)
class SearchBudget:
    """What one instance's search of mixed regions may spend, and what it does past it.

    Attributes
    ----------
    max_boxes : int
        Boxes it may pop, all deepening rounds together.
    max_seconds : float
        Seconds it may take (``inf``: no limit); the clock is read about every
        :data:`~maps_core.lazy.CLOCK_SECONDS` of boxes.
    max_memory : int
        Bytes its pending boxes may take at once (:func:`~maps_core._memory.boxes_within`).
    best_found : bool
        Out of a budget, answer with the nearest certified target boxes met (not proven
        optimal) instead of raising :class:`BudgetExceededError`.
    threads : int
        Threads one search may run in at once (``k = 1``, once most of the maps' recent
        searches are long: :data:`PARALLEL_AFTER`); each then may pop ``max_boxes`` boxes
        and gets ``1 / threads`` of ``max_memory``. Default: 2, or 1 where the process
        may use a single processor (:func:`~maps_core._memory.usable_cpus`). The answers
        are the same in any number.
    cancel : threading.Event, optional
        Once set, the search under way stops at its next clock reading (about every
        :data:`~maps_core.lazy.CLOCK_SECONDS` of boxes; :func:`~maps_core._clock.watching`)
        and a batch before its next rows, with :class:`QueryCancelledError`.
    """

    max_boxes: int = MAX_MIXED_POPS
    max_seconds: float = math.inf
    max_memory: int = field(default_factory=default_query_memory)
    best_found: bool = False
    threads: int = field(default_factory=lambda: default_threads())
    cancel: threading.Event | None = None

    @classmethod
    def parse(cls, max_boxes: Any = None, max_seconds: Any = None, max_memory: Any = None,
              on_budget: Any = "error", threads: Any = None,
              cancel: threading.Event | None = None) -> SearchBudget:
        """The budget a caller's options ask for (``None``: the default), checked.

        Raises
        ------
        InvalidQueryError
            Naming the option that is not a positive number (an integer for the boxes, the
            bytes and the threads) or an ``on_budget`` other than ``"error"`` and ``"best"``.
        """
        if cancel is not None and not isinstance(cancel, threading.Event):
            raise InvalidQueryError(
                f"cancel must be a threading.Event, not {type(cancel).__name__}", "cancel")
        # counts past NO_LIMIT are no limit in effect, and the kernels count in int64
        boxes = min(int(_positive(max_boxes, "max_boxes", MAX_MIXED_POPS, "integer")), NO_LIMIT)
        seconds = _positive(max_seconds, "max_seconds", math.inf, "number")
        try:
            seconds = float(seconds)
        except OverflowError:  # an integer past float64's range: no limit, in effect
            seconds = math.inf
        memory = min(int(_positive(max_memory, "max_memory", default_query_memory(),
                                   "integer (bytes)")), NO_LIMIT)
        n_threads = int(_positive(threads, "threads", default_threads(), "integer"))
        if n_threads > MAX_THREADS:
            raise InvalidQueryError(f"threads must be at most {MAX_THREADS}", "threads")
        if on_budget not in ("error", "best"):
            raise InvalidQueryError(
                f"on_budget must be 'error' or 'best', not {on_budget!r}", "on_budget")
        return cls(max_boxes=boxes, max_seconds=seconds, max_memory=memory,
                   best_found=on_budget == "best", threads=n_threads, cancel=cancel)

    @property
    def kernel_seconds(self) -> float:
        """The time limit handed to the kernels: ``max_seconds``, or, with a cancel event
        and no limit, :data:`WATCHED_SECONDS`, so that they read the clock (and so learn
        of a cancel) as a timed search does."""
        if self.cancel is not None and self.max_seconds == math.inf:
            return WATCHED_SECONDS
        return self.max_seconds

    def check_cancelled(self) -> None:
        """Raise :class:`QueryCancelledError` when the caller has cancelled the query."""
        if self.cancel is not None and self.cancel.is_set():
            raise QueryCancelledError("the query was cancelled (its cancel event was set) "
                                      "before its search ended")

    def max_held(self, engine: SearchEngine) -> int:
        """The boxes a search on ``engine``'s maps may hold at once within ``max_memory``."""
        kern = engine.kernel
        return boxes_within(self.max_memory, engine.grid.n_features, len(kern.roots),
                            len(kern.base))

    def exceeded(self, status: int, engine: SearchEngine) -> BudgetExceededError:
        """The error of a search that ended with ``status`` (a ``best_first`` status other
        than ``COMPLETE``), naming the budget that ran out. With ``best_found`` the search
        met no counterfactual to answer with, and the message says so rather than
        suggest on_budget='best' again."""
        if status == OUT_OF_TIME:
            what = (f"ran out of its time ({self.max_seconds:g} s, its search budget "
                    "max_seconds)")
            fix = ("constraints that narrow the search (bounds, immutable features), or maps "
                   "built with a larger budget, make it faster")
        elif status == OUT_OF_MEMORY:
            what = (f"needed to hold more than {_boxes(self.max_held(engine))} of the regions "
                    "the build left unresolved at once, more than its memory budget "
                    f"({self.max_memory:,} bytes, max_memory) allows")
            fix = "rebuild the maps with a larger budget (max_seconds / max_rectangles)"
        else:
            what = (f"needed more than {_boxes(self.max_boxes)} of the regions the build left "
                    "unresolved (its search budget, max_boxes)")
            fix = "rebuild the maps with a larger budget (max_seconds / max_rectangles)"
        if self.best_found:
            return BudgetExceededError(
                f"this query's search {what} before it met any counterfactual that satisfies "
                f"the query's constraints, so there is no best found to answer with; a larger "
                f"budget may find one; {fix}"
            )
        return BudgetExceededError(
            f"this query's search {what} before it could prove an answer optimal; {fix}, and "
            "on_budget='best' takes the best counterfactual found within the budget"
        )


def _boxes(n: int) -> str:
    """``"1 box"``, ``"2,000 boxes"``."""
    return f"{n:,} box" if n == 1 else f"{n:,} boxes"


#: The time limit of a search that has none but may be cancelled (a year): a finite one
#: makes the kernels read the clock, which is how they learn of the cancel.
WATCHED_SECONDS = 3.2e7

#: Most threads one search may run in (:attr:`SearchBudget.threads`).
MAX_THREADS = 64


def default_threads() -> int:
    """Threads a search may run in by default (:attr:`SearchBudget.threads`): 2, or 1
    where the process may use a single processor. More than two split a search's regions
    further but each part still descends the whole KD forest, and none was measured."""
    return min(2, usable_cpus())


#: A box or byte budget at least this large is no limit (the kernels' counters are int64).
NO_LIMIT = 1 << 62


def _positive(value: Any, name: str, default: Any, what: str) -> Any:
    """``value`` of the budget option ``name``, ``default`` when None; ``what`` says which
    kind it must be: "integer..." (numpy's too) or "number" (also a float)."""
    if value is None:
        return default
    kind = numbers.Real if what == "number" else numbers.Integral  # numpy's scalars too
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok or not value > 0:
        raise InvalidQueryError(f"{name} must be a positive {what}", name)
    return value


def _first_radius(engine: SearchEngine, opts: QueryOptions) -> float:
    """The first bound of the deepening rounds (infinite: a single unbounded round)."""
    if opts.norm_code != L0 and engine.has_mixed:
        return DEEPEN_START * opts.scale
    return np.inf


#: Weighted per-feature costs whose binary exponents lie within +-_EXACT_EXP are summed
#: (and, for l2, squared) as they come; beyond, every weight and switching cost is scaled
#: by one power of two (exact in binary arithmetic) and the distances scaled back
#: (:func:`kernel_units`).
_EXACT_EXP = 200
#: l2 squares every cost: a move about 2**-53 of the largest magnitude of the smallest-
#: scaled feature must still square to a normal float, so the features' scales may differ
#: by at most 2**_L2_SPREAD_EXP.
_L2_SPREAD_EXP = 400
#: Where l2's largest cost is put when costs are scaled down: its square, 2**1000, and a
#: sum of such squares stay finite.
_L2_TOP_EXP = 500
#: l0 folds its tie-break, the weighted l1, into the key as ``changes + l1 / (1 + l1)``
#: (:func:`maps_core._norms.key`), which tells l1 values apart only near unit size: past
#: about 1e16 they all round to the same key, and below about 1e-16 they vanish next to
#: the count. So l0's costs are scaled to put the middle of the costs an answer may pay
#: within 2**+-_L0_EXP (:func:`_l0_exponent`).
_L0_EXP = 8
#: How far below l0's largest cost its scale may lie (:func:`_l0_exponent`).
_L0_TOP_SPAN = 26
#: l1 and linf add (or compare) costs as they are, but the cheapest must stay a normal
#: float once scaled: past ``2**_WIDE_EXP`` between the largest and the least, they are
#: scaled around their middle rather than with the largest at unit size (which made costs
#: 2**1100 below it 0: a distance of 0 and the wrong point), and past
#: ``2**_SPREAD_EXP`` no scale holds both (the largest at ``2**950`` leaves sums of 2**70
#: features finite).
_WIDE_EXP = 900
_SPREAD_EXP = 1900


@njit(cache=True, nogil=True)
def _cost_range(w, mag, A, lower, upper, immutable, gcost, gcol):
    """Least and largest cost bound ``w_f * 2 max(mag_f, |A_rf|)`` over the mutable
    features with a positive weight and span (``w_f`` for a nominal one), where the finite
    constraint bounds ``lower_f``, ``upper_f`` count too when some row lies outside them,
    and the positive switching costs ``gcost`` (inf when a product overflows, 0 when it
    underflows); (-1, -1) when there is none. Compiled: with numpy calls the check took
    about 50 us in a query's path."""
    low = np.inf
    top = -1.0
    for f in range(w.shape[0]):
        if immutable[f] or not w[f] > 0:
            continue
        if gcol[f] == NOMINAL:
            low = min(low, w[f])
            top = max(top, w[f])
            continue
        big = mag[f]
        outside = False
        for r in range(A.shape[0]):
            big = max(big, abs(A[r, f]))
            outside = outside or A[r, f] < lower[f] or A[r, f] > upper[f]
        # bounds that exclude x force a move as far as themselves, past every cell bound
        # (bounds that hold x force none: the domain's own bounds, say, may be huge)
        if outside and np.isfinite(lower[f]):
            big = max(big, abs(lower[f]))
        if outside and np.isfinite(upper[f]):
            big = max(big, abs(upper[f]))
        if big > 0:
            cost = w[f] * (2.0 * big)
            low = min(low, cost)
            top = max(top, cost)
    for g in range(gcost.shape[0]):
        if gcost[g] > 0:
            low = min(low, gcost[g])
            top = max(top, gcost[g])
    if top < 0:
        low = -1.0
    return low, top


#: An exponent that never wins a max (a cost that does not count).
_NO_EXP = np.iinfo(np.int64).min


def _cost_cause(engine: SearchEngine, opts: QueryOptions, A: np.ndarray, f: int,
                span: np.ndarray, bounds: np.ndarray) -> tuple[str, str, int | None]:
    """What makes feature f's largest cost what it is, as (words, field, row): a row's
    value (past every split and bound of its feature), a constraint bound, or else the
    feature's weight."""
    name = engine.feature_names[f]
    w = float(opts.weights[f])
    row_big = np.abs(A[:, f])
    if row_big.max() * 2.0 >= span[f]:  # a row's own value sets the span
        i = int(np.argmax(row_big))
        return f"{name} = {A[i, f]:g} at weight {w:g}", name, i
    if bounds[f] * 2.0 >= span[f]:
        return f"the bounds on {name} at weight {w:g}", f"bounds.{name}", None
    return f"weight {w:g} on {name}", f"weights.{name}", None


def _too_costly(engine: SearchEngine, opts: QueryOptions, A: np.ndarray, f_exp: np.ndarray,
                g_exp: np.ndarray, span: np.ndarray, bounds: np.ndarray) -> InvalidQueryError:
    """The error for a cost past ``2**MAX_COST_EXPONENT``, naming what makes it so: a
    group's switching cost or else :func:`_cost_cause` of the costliest feature. ``f_exp``
    and ``g_exp`` are the cost exponents of :func:`kernel_units`, ``_NO_EXP`` where a cost
    does not count."""
    if g_exp.size and g_exp.max() >= f_exp.max():
        g = int(np.argmax(g_exp))
        name = opts.group_names[g]
        return InvalidQueryError(
            f"the cost of switching {name!r} ({opts.gcost[g]:g}) passes float64's range for "
            "distances (about 1e301); use a smaller cost", f"group_costs.{name}")
    what, field, row = _cost_cause(engine, opts, A, int(np.argmax(f_exp)), span, bounds)
    return InvalidQueryError(
        f"{what} makes moves too costly to measure in float64 (past about 1e301)", field, row)


def _spread(engine: SearchEngine, opts: QueryOptions, A: np.ndarray, f_exp: np.ndarray,
            g_exp: np.ndarray, span: np.ndarray, bounds: np.ndarray, norm: str, limit: int,
            about: str, why: str) -> InvalidQueryError:
    """The error for costs too far apart for ``norm`` (more than ``2**limit``, ``about``
    that in decimal; ``why`` it cannot measure them), naming the costliest and the
    cheapest (exponents as in :func:`_too_costly`, ``_NO_EXP`` where a cost does not
    count). The field is the cause of the one farther from the median cost, the odd one
    out (the costliest on a tie): a row's value or the spec's weight may set it, not only
    the client's weights."""
    counted = np.concatenate([f_exp, g_exp])
    counted = counted[counted != _NO_EXP]
    mid = float(np.median(counted))

    def cause(top: bool) -> tuple[str, str, int | None]:
        e = counted.max() if top else counted.min()
        g = np.flatnonzero(g_exp == e)
        if g.size:
            name = opts.group_names[int(g[0])]
            return f"switching {name!r} ({opts.gcost[g[0]]:g})", f"group_costs.{name}", None
        return _cost_cause(engine, opts, A, int(np.flatnonzero(f_exp == e)[0]), span, bounds)

    (big, big_field, big_row), (small, small_field, small_row) = cause(True), cause(False)
    field, row = ((big_field, big_row) if counted.max() - mid >= mid - counted.min()
                  else (small_field, small_row))
    if row is None and field.startswith("weights.") and (big_row, small_row) != (None, None):
        # a weight is the odd one out only because several values are extreme (two
        # features at 1e300, one at 5: the 5's weight was named, though no weight was
        # sent); the extreme value is what a client would change
        field, row = (big_field, big_row) if big_row is not None else (small_field, small_row)
    return InvalidQueryError(
        f"{norm} cannot compare these costs: the moves of {big} cost more than 2**{limit} "
        f"(about {about}) times those of {small}, and {why}", field, row)


def kernel_units(engine: SearchEngine, opts: QueryOptions, A: np.ndarray) -> tuple[QueryOptions, int]:
    """Options whose weighted costs the kernels can add up without overflow or underflow
    for the rows of ``A`` (shape (n, m), validated), and the binary exponent ``e`` such
    that a caller's distance is the kernels' times ``2**e`` (0: the options unchanged).

    A cost is ``w_f |p_f - x_f|``, at most ``w_f`` times twice the largest magnitude of
    ``x_f``, of feature f's finite cell bounds and, when they exclude ``x_f``, of its finite
    constraint bounds (a bound at 1e200 forces a move that far), or a group's switching
    cost. With
    weights or values far from 1 (1e200, 1e-170), l2's squares overflowed to inf (a
    counterfactual reported infeasible) or underflowed to 0 (a distance of 0, the wrong
    point). l0's tie-break, the weighted l1, is folded into its key and told apart only
    near unit size: its costs are scaled around the middle of those an answer may pay.
    Scaling every cost by the same power of two changes no comparison and no
    rounding, so answers stay those of the caller's weights.

    Raises
    ------
    InvalidQueryError
        When the costs exceed float64's range even so, or, for l2, when the features'
        scales differ by more than ``2**400`` (about 1e120): squared, the smaller ones
        would vanish next to the larger. The field names the cause (a row's value, a
        bound, a weight or a group's switching cost).
    """
    w = opts.weights
    low, top = _cost_range(w, engine.grid.magnitudes, A, opts.lower, opts.upper, opts.immutable,
                           opts.gcost, opts.gcol)
    if top == -1.0:
        return opts, 0  # nothing costs anything
    l0 = opts.norm_code == L0
    if (2.0 ** -_EXACT_EXP <= low and top <= 2.0 ** _EXACT_EXP
            and (opts.norm_code != L2 or top / low <= 2.0 ** _L2_SPREAD_EXP)
            and (not l0 or (2.0 ** -_L0_EXP <= low and top <= 2.0 ** _L0_EXP))):
        return opts, 0  # the common case, in a few microseconds
    with np.errstate(over="ignore"):
        outside = np.any((A < opts.lower) | (A > opts.upper), axis=0)
        bounds = np.where(outside, np.maximum(
            np.where(np.isfinite(opts.lower), np.abs(opts.lower), 0.0),
            np.where(np.isfinite(opts.upper), np.abs(opts.upper), 0.0)), 0.0)
        span = 2.0 * np.maximum(np.maximum(engine.grid.magnitudes, np.abs(A).max(axis=0)),
                                bounds)
    free = ~opts.immutable & (w > 0) & (span > 0)
    if not np.all(np.isfinite(span)):
        raise InvalidQueryError("feature values beyond +-8.9e307 cannot be measured in float64",
                                "instance")
    # exponents, since the products may overflow or underflow where the factors do not:
    # per feature (its longest move's cost) and per group (its switch), computed once for
    # the range checks, the error's cause and l0's scale
    f_exp = (np.frexp(w)[1] + np.frexp(span)[1]).astype(np.int64)
    g_exp = np.frexp(opts.gcost)[1].astype(np.int64)
    switches = opts.gcost > 0
    e_all = np.concatenate([f_exp[free], g_exp[switches]])
    e_top, e_low = int(e_all.max()), int(e_all.min())
    causes = (engine, opts, A, np.where(free, f_exp, _NO_EXP),
              np.where(switches, g_exp, _NO_EXP), span, bounds)
    if opts.norm_code == L2 and e_top - e_low > _L2_SPREAD_EXP:
        raise _spread(*causes, "l2", _L2_SPREAD_EXP, "1e120", "squared, the smaller would "
                      "vanish next to the larger; use l1 or linf, or weights nearer 1/range")
    if not l0 and e_top - e_low > _SPREAD_EXP:
        raise _spread(*causes, opts.norm, _SPREAD_EXP, "1e572", "float64 holds no sum of "
                      "both; use weights nearer 1/range")
    if e_top > MAX_COST_EXPONENT:
        raise _too_costly(*causes)
    e = e_top
    if l0:
        # a feature no split cuts (no finite cell bound) that no bound forces to move
        # never moves in an answer
        movable = free & ((engine.grid.magnitudes > 0) | outside)
        e = _l0_exponent(np.concatenate([f_exp[movable], g_exp[switches]]), e_top)
        if abs(e) <= _L0_EXP:
            return opts, 0
    elif opts.norm_code != L2 and e_top - e_low > _WIDE_EXP:
        e = (e_top + e_low) // 2  # at most 2**950 either side of 1
    elif -_EXACT_EXP <= e_top <= _EXACT_EXP:
        return opts, 0
    elif opts.norm_code == L2 and e_top > 0:
        # l2 squares the costs: the largest at 2**_L2_TOP_EXP (its square well inside
        # float64), not at 1, so that moves 2**500 smaller still square to normal floats
        # (scaled to 1, a feature splitting near 5e299 made a move of 0.69 square to 0)
        e = max(e_top - _L2_TOP_EXP, 0)
        if e == 0:
            return opts, 0
    positive = np.concatenate([w[free], opts.gcost[opts.gcost > 0]])
    if e < 0 and positive.size and int(np.frexp(positive)[1].max()) - e > 1000:
        # scaled up to a unit size, the weights themselves would pass float64's range
        raise InvalidQueryError(
            "the costs of these moves (weight x feature value, at most about "
            f"{math.ldexp(1.0, e_top):.3g}) lie below float64's normal range, where "
            "they cannot be added up exactly; rescale the features or raise their weights",
            "weights")
    # A weight whose feature never moves (no span) may exceed float64 once scaled: kept
    # finite, so that it times a zero move stays zero
    big = np.finfo(np.float64).max
    with np.errstate(over="ignore"):
        return replace(opts, weights=np.minimum(np.ldexp(w, -e), big),
                       gcost=np.minimum(np.ldexp(opts.gcost, -e), big),
                       scale=float(min(np.ldexp(opts.scale, -e), big))), e


def _l0_exponent(exps: np.ndarray, e_top: int) -> int:
    """The power of two l0's costs are scaled by, so that its tie-break (the weighted l1,
    folded into the key as ``changes + l1 / (1 + l1)``, which tells l1 values apart only
    within about ``2**+-26`` of 1) resolves the costs an answer may pay (``exps``, each
    feature's or group's largest): their median, robust to one feature far from the rest
    (a LightGBM 0/1 column split at 1e-35 put the middle of the least and largest at
    2**-54, and every real move rounded away), raised to at most ``2**_L0_TOP_SPAN`` below
    the largest, whose moves decide most sums (a constant column at weight 1e20 had set the
    scale, and every real move vanished). At most ``2**900`` below the largest cost
    ``e_top``, so that no scaled cost overflows."""
    if not exps.size:
        return e_top
    e = max(int(np.median(exps)), int(exps.max()) - _L0_TOP_SPAN)
    return max(e, e_top - 900)


def _in_callers_units(out: SearchOutput, norm: int, e: int) -> SearchOutput:
    """``out`` with its distances scaled back by ``2**e`` (see :func:`kernel_units`); l0
    counts changes, which no scale touches."""
    if e == 0 or norm == L0:
        return out
    for f in out.found:
        f.distance = math.ldexp(f.distance, e)
        f.counterfactual_distance = math.ldexp(f.counterfactual_distance, e)
    if out.lower_bound is not None:
        out.lower_bound = math.ldexp(out.lower_bound, e)
    return out


# A batch of fewer rows goes through search() row by row: the compiled batch's fixed cost
# (its arguments' types checked at every call, eleven output arrays, two clock reads) is
# more than one query's Python (CP RF 100x5 single queries: 150 us through it, 106 us not).
_BATCH_MIN_ROWS = 2


def search_batch(engine: SearchEngine, A: np.ndarray, t_idx: int | None, opts: QueryOptions,
                 rids: np.ndarray, cats: np.ndarray,
                 budget: SearchBudget | None = None) -> list[SearchOutput]:
    """:func:`search` of every row of ``A`` (shape (n, m), validated), in order.

    With ``k = 1`` the searches run in one compiled call (:func:`_batch`); a row whose
    answer needs Python goes through :func:`search`: x itself (the target is its class),
    near-tie boxes the model must label, or no answer (the reason is worded there).
    ``rids`` and ``cats`` are the rows' rectangles and categories, and ``budget`` each row's
    budgets and what a row out of them gets, as for :func:`search`. With ``budget.cancel``
    the compiled searches run in chunks of rows (:func:`_chunks`), and the event is looked
    at before each chunk and each row searched alone: once it is set, the batch stops with
    :class:`QueryCancelledError`.
    """
    opts, e = kernel_units(engine, opts, A)
    return [_in_callers_units(out, opts.norm_code, e)
            for out in _search_batch(engine, A, t_idx, opts, rids, cats, budget)]


#: A batch's rows are dealt out among ``SearchBudget.threads`` threads, each of at least
#: PARALLEL_ROWS rows, when the rows' search is expected to take PARALLEL_SECONDS or more
#: (their number times the maps' running mean, :class:`~maps_core.engine.SearchPace`):
#: dealing them out costs about 0.15 ms. 1,024 rows in batches of 16, 1 -> 2 threads:
#: Credit GB 300x4 l1 (0.6 ms a row) 0.60 -> 0.40 s, PD 100x5 at 250k rectangles l2 (4 ms)
#: 4.1 -> 2.8 s; COMPAS RF 100x5, complete maps (30 us) 0.031 -> 0.042 s, hence the
#: threshold.
PARALLEL_ROWS = 4
PARALLEL_SECONDS = 0.002


def _batch_rows(engine: SearchEngine, opts: QueryOptions, budget: SearchBudget, A: np.ndarray,
                cmins: np.ndarray, cmaxs: np.ndarray, tmasks: np.ndarray,
                cats: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`_batch`'s outputs for the rows of ``A`` (shape (n, m); the other arrays
    row-aligned), in up to ``budget.threads`` threads of at least :data:`PARALLEL_ROWS`
    rows each when they are expected to take :data:`PARALLEL_SECONDS` or more: thread
    ``p`` answers rows ``p, p + n, ...``, one at a time, each within
    ``1 / n`` of the memory budget (the instances a request's threads search at once hold
    at most what one may); their other budgets are each row's own."""
    g = engine.grid
    n = 1
    if A.shape[0] * engine.pace.seconds[opts.norm_code] >= PARALLEL_SECONDS:
        n = max(1, min(budget.threads, A.shape[0] // PARALLEL_ROWS))
    held = budget.max_held(engine)
    # Complete maps: the KD descent always ends, and a single query runs it without a time
    # limit (certified_only, in _run); the batch's rows must answer as those do (with a
    # limit, they stopped "out of time" where alone they answer). A cancel is still seen.
    seconds = (budget.kernel_seconds if engine.has_mixed
               else WATCHED_SECONDS if budget.cancel is not None else math.inf)

    def run(sel: Any, max_held: int) -> tuple[np.ndarray, ...]:
        with watching(budget.cancel):
            return _batch(
                A[sel], cmins[sel], cmaxs[sel], tmasks[sel], cats[sel], opts.weights,
                opts.norm_code, g.integral, opts.gcol, opts.gstart, opts.gcols, opts.gcost,
                engine.forest, engine.cells, engine.kernel, budget.max_boxes, max_held,
                seconds, _first_radius(engine, opts), PROBE, DEEPEN_GROWTH,
                DEEPEN_ROUNDS, budget.best_found, _guessing(opts), HARD_AFTER)

    if n == 1:
        return run(slice(None), held)
    sels = [np.arange(p, A.shape[0], n) for p in range(n)]
    outs = _in_threads(lambda p: run(sels[p], _share_of(held, n, p)), n)
    merged = []
    for j, first in enumerate(outs[0]):
        out = np.empty((A.shape[0], *first.shape[1:]), dtype=first.dtype)
        for sel, o in zip(sels, outs, strict=True):
            out[sel] = o[j]
        merged.append(out)
    return tuple(merged)


def _search_batch(engine: SearchEngine, A: np.ndarray, t_idx: int | None, opts: QueryOptions,
                  rids: np.ndarray, cats: np.ndarray,
                  budget: SearchBudget | None = None) -> list[SearchOutput]:
    """:func:`search_batch` in the kernels' units."""
    n = A.shape[0]
    budget = budget or SearchBudget()
    if opts.k != 1 or n < _BATCH_MIN_ROWS:
        return [_search_row(engine, A, i, t_idx, opts, rids, cats, budget) for i in range(n)]
    A = np.ascontiguousarray(A, dtype=np.float64)
    pred = locate(engine, A, rids)
    cmins, cmaxs = opts.constraint_boxes(A)
    tmasks = np.zeros((n, len(engine.classes)), dtype=bool)
    if t_idx is None:
        tmasks[:] = True
        tmasks[np.arange(n), pred] = False
        fast = np.ones(n, dtype=bool)
    else:
        tmasks[:, t_idx] = True
        fast = ~((pred == t_idx) & np.all((cmins <= A) & (A <= cmaxs), axis=1))
    outs: list[SearchOutput | None] = [None] * n
    for rows in _chunks(np.flatnonzero(fast), engine, opts.norm_code, budget):
        budget.check_cancelled()
        (status, dist, cfd, lab, P, LO, HI, LC, UC, counters, seconds, low) = _batch_rows(
            engine, opts, budget, A[rows], cmins[rows], cmaxs[rows], tmasks[rows], cats[rows])
        # a chunk that the cancel stopped reads as out of time: no answers, no budget error
        budget.check_cancelled()
        out_of = np.flatnonzero(status == OUT_OF_BUDGET)
        if out_of.size:
            # the first such row names the budget it ran out of, as the row-by-row path
            exc = budget.exceeded(int(counters[out_of[0], 4]), engine)
            exc.row = int(rows[out_of[0]])
            raise exc
        norm = opts.norm_code
        for r, i in enumerate(rows.tolist()):
            engine.pace.record(norm, int(counters[r, 2]), float(seconds[r]), PARALLEL_AFTER)
            if status[r] != ANSWERED and status[r] != BEST_FOUND:
                continue
            kp, ev, po, hd, _ = counters[r].tolist()
            d = finish(norm, float(dist[r]))
            proven = status[r] == ANSWERED or low[r] >= dist[r]
            outs[i] = SearchOutput(
                prediction=int(pred[i]), nodes_popped=kp, rectangles_evaluated=ev,
                regions_refined=po, peak_boxes=hd, seconds=float(seconds[r]),
                found=[Found(x=P[r], distance=d,
                             counterfactual_distance=float(cfd[r]), lower=LO[r], upper=HI[r],
                             lower_closed=LC[r], upper_closed=UC[r], target=int(lab[r]))],
                optimal=bool(proven),
                lower_bound=d if proven else finish(norm, float(low[r])))
    return [out if out is not None
            else _search_row(engine, A, i, t_idx, opts, rids, cats, budget)
            for i, out in enumerate(outs)]


#: With a cancel event (:attr:`SearchBudget.cancel`), a batch's compiled searches run in
#: chunks of rows expected to take about this many seconds (the maps' running mean per
#: row, :class:`~maps_core.engine.SearchPace`), so that a cancel waits for about that plus
#: the rows under way; a chunk's fixed cost is tens of microseconds.
CANCEL_SECONDS = 0.1


def _chunks(rows: np.ndarray, engine: SearchEngine, norm: int,
            budget: SearchBudget) -> Iterator[np.ndarray]:
    """``rows`` (row indices, shape (n,)) in consecutive chunks: all at once without a
    cancel event; with one, chunks of about :data:`CANCEL_SECONDS` of expected search, and
    at least :data:`PARALLEL_ROWS` rows per thread so that they are still dealt out. The
    size is read afresh before each chunk, as the pace learns from the chunks before."""
    start = 0
    while start < rows.size:
        size = rows.size
        if budget.cancel is not None:
            pace = engine.pace.seconds[norm]
            size = max(PARALLEL_ROWS * budget.threads,
                       int(CANCEL_SECONDS / pace) if pace > 0 else 0)
        yield rows[start:start + size]
        start += size


def _search_row(engine: SearchEngine, A: np.ndarray, i: int, t_idx: int | None,
                opts: QueryOptions, rids: np.ndarray, cats: np.ndarray,
                budget: SearchBudget) -> SearchOutput:
    """:func:`search` of row ``i`` of a batch, unless the batch was cancelled; a budget
    that runs out names the row."""
    budget.check_cancelled()
    try:
        return search(engine, A[i], t_idx, opts, int(rids[i]), cats[i], budget)
    except BudgetExceededError as exc:
        exc.row = i
        raise


def search(engine: SearchEngine, x: np.ndarray, t_idx: int | None, opts: QueryOptions,
           rid: int, xcat: np.ndarray, budget: SearchBudget | None = None) -> SearchOutput:
    """Run one query (``x`` already validated, shape (m,)) within ``budget`` (default
    :class:`SearchBudget`), else :class:`BudgetExceededError`; with ``budget.best_found``,
    a search out of a budget answers with the nearest certified target boxes it met
    instead (``optimal`` False unless its lower bound reaches the nearest), and raises
    only when it met none.

    ``rid`` is x's rectangle (:func:`locate_rect`) and ``xcat`` x's category per one-hot
    group (:func:`~maps_core.options.categories`): the caller finds both for a whole batch
    at once, since each is a compiled call whose dispatch costs a few microseconds, a few
    percent of a query on the paper's maps."""
    t0 = time.perf_counter()
    out = _search(engine, x, t_idx, opts, rid, xcat, budget or SearchBudget())
    out.seconds = time.perf_counter() - t0
    return out


def _run(engine: SearchEngine, q: Query, opts: QueryOptions,
         budget: SearchBudget) -> tuple[Any, ...]:
    """:func:`~maps_core.lazy.best_first`'s outputs for the query ``q``, in
    ``budget.threads`` parts at once once most of the maps' recent searches under its norm
    were long (:data:`PARALLEL_AFTER`). Maps without mixed regions need none of its budgets, rounds
    or incumbents: the KD descent alone (:func:`~maps_core.lazy.certified_only`) answers,
    with fewer arrays to hand back."""
    if engine.has_mixed:
        guess = _guessing(opts)
        norm = opts.norm_code
        n = budget.threads if q.k == 1 and engine.pace.long[norm] >= PARALLEL_SHARE else 1
        t0 = time.perf_counter()
        if n == 1:
            with watching(budget.cancel):
                out = best_first(q, engine.forest, engine.cells, engine.kernel,
                                 budget.max_boxes, budget.max_held(engine),
                                 _first_radius(engine, opts), PROBE, DEEPEN_GROWTH,
                                 DEEPEN_ROUNDS, budget.kernel_seconds, budget.best_found,
                                 guess, guess, HARD_AFTER, np.full(1, np.inf), 0, 1)
        else:
            out = _run_parts(engine, q, opts, budget, n, guess)
        budget.check_cancelled()  # stopped as out of time: neither an answer nor a pace
        engine.pace.record(norm, out[9], time.perf_counter() - t0, PARALLEL_AFTER)
        return out
    lo, hi, lab, d, popped, evaluated = certified_only(q, engine.forest, engine.cells,
                                                       engine.kernel)
    none, nolab, nod = lo[:0], lab[:0], d[:0]
    return (lo, hi, lab, d, none, none, nod, popped, evaluated, 0, COMPLETE, none, none, nolab,
            nod, math.inf, 0)


def _run_parts(engine: SearchEngine, q: Query, opts: QueryOptions, budget: SearchBudget,
               n: int, guess: bool) -> tuple[Any, ...]:
    """:func:`_run` as ``n`` parts in as many threads (``k = 1``): each part searches
    every ``n``-th mixed region, all of them share the nearest target met
    (:func:`~maps_core.lazy.best_first`), and their outputs are merged as one search's.

    The guess is made once, before the parts start. Each part gets ``1 / n`` of the
    memory budget (the shares sum to it), the whole box budget (it bounds each thread's
    work, as it does one thread's: split, a part with most of the work ran out of boxes
    on Credit RF 100x5 where one thread would not have) and the time left; the search has
    stopped early when any part has. Easy searches do not pay: parts cost 0.1-0.3 ms
    more (the hand-off to a thread, a second dispatch, each part's KD descent, and one
    part with nearly all the work), more than a typical Credit GB 300x4 search."""
    radius = _first_radius(engine, opts)
    seconds = budget.kernel_seconds
    if guess:
        t0 = time.perf_counter()
        with watching(budget.cancel):
            radius = guess_radius(q, engine.cells, engine.kernel, radius, seconds)
        seconds = max(seconds - (time.perf_counter() - t0), 0.0)  # inf stays inf
    shared = np.full(1, math.inf)
    held = budget.max_held(engine)

    def part(p: int) -> tuple[Any, ...]:
        # the memory budget dealt out: part p's share, the remainder to the first parts
        with watching(budget.cancel):
            return best_first(q, engine.forest, engine.cells, engine.kernel,
                              budget.max_boxes, _share_of(held, n, p), radius,
                              PROBE if not guess else 1.0, DEEPEN_GROWTH, DEEPEN_ROUNDS,
                              seconds, budget.best_found, False, guess, HARD_AFTER, shared,
                              p, n)

    outs = _in_threads(part, n)
    # best_first's outputs: candidates and near-ties (0-6) concatenated, the counters
    # (7-9) summed, the first status that is not COMPLETE (10), the incumbents (11-14)
    # concatenated, the least lower bound (15) and the boxes held, summed (16)
    cat = np.concatenate
    status = next((o[10] for o in outs if o[10] != COMPLETE), COMPLETE)
    return (*(cat([o[j] for o in outs]) for j in range(7)),
            *(sum(o[j] for o in outs) for j in (7, 8, 9)), status,
            *(cat([o[j] for o in outs]) for j in range(11, 15)),
            min(o[15] for o in outs), sum(o[16] for o in outs))


T = TypeVar("T")


def _in_threads(work: Callable[[int], T], n: int) -> list[T]:
    """``[work(0), ..., work(n - 1)]``: ``work(0)`` in the calling thread, the others at
    once on the pool (:func:`_threads`)."""
    others = [_threads().submit(work, p) for p in range(1, n)]
    return [work(0)] + [f.result() for f in others]


def _share_of(total: int, n: int, p: int) -> int:
    """Part ``p``'s share of ``total`` dealt out among ``n`` parts (the shares sum to it)."""
    return total // n + (1 if p < total % n else 0)


@functools.cache
def _threads() -> ThreadPoolExecutor:
    """The threads that run the other parts of a search (:func:`_run_parts`) and of a
    batch (:func:`_batch_rows`), started on first use and shared by every query of the
    process. As many as a service runs queries in (``min(32, processors + 4)``), not one
    per processor: with fewer, a query's second part would queue behind another query's
    long one while its first part had finished, instead of sharing the processors as
    the queries' own threads do."""
    return ThreadPoolExecutor(max_workers=min(32, usable_cpus() + 4),
                              thread_name_prefix="cfmaps-search")


def _search(engine: SearchEngine, x: np.ndarray, t_idx: int | None, opts: QueryOptions,
            rid: int, xcat: np.ndarray, budget: SearchBudget) -> SearchOutput:
    part = engine.partition
    pred = int(part.labels[rid]) if rid >= 0 else MIXED
    if pred == MIXED:
        pred = int(engine.classify(x[None, :])[0])
    cmin, cmax = opts.constraint_box(x)
    if t_idx is not None and t_idx == pred and np.all((cmin <= x) & (x <= cmax)):
        return _stays(engine, x, rid, pred, cmin, cmax, opts)
    tmask = np.ones(len(engine.classes), dtype=bool)
    if t_idx is None:
        tmask[pred] = False
    else:
        tmask[:] = False
        tmask[t_idx] = True
    g = engine.grid
    q = Query(np.ascontiguousarray(x, dtype=np.float64), opts.weights, opts.norm_code, cmin,
              cmax, g.integral, tmask, opts.k, *opts.group_args(x, xcat))
    (c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, popped, evaluated, refined, done, i_lo, i_hi,
     i_lab, i_d, low, held) = _run(engine, q, opts, budget)
    stopped = done != COMPLETE
    if stopped and budget.best_found and c_d.size + i_d.size:
        # the best met: the stopped round's candidates and the incumbents, each box once
        # (a box may be both), its near-ties left out (the model has not labelled them)
        c_lo, c_hi = np.concatenate([c_lo, i_lo]), np.concatenate([c_hi, i_hi])
        c_lab, c_d = np.concatenate([c_lab, i_lab]), np.concatenate([c_d, i_d])
        _, first = np.unique(np.hstack([c_lo, c_hi, c_lab[:, None]]), axis=0,
                             return_index=True)
        first.sort()
        c_lo, c_hi, c_lab, c_d = c_lo[first], c_hi[first], c_lab[first], c_d[first]
        t_d = t_d[:0]
    elif stopped:
        raise budget.exceeded(done, engine)
    if t_d.size:  # near-tie boxes: the model labels their centre, valid for all cells
        t_lab = engine.classify(g.cell_points((t_lo + t_hi) // 2))
        keep = tmask[t_lab]
        c_lo, c_hi = np.concatenate([c_lo, t_lo[keep]]), np.concatenate([c_hi, t_hi[keep]])
        c_lab, c_d = np.concatenate([c_lab, t_lab[keep]]), np.concatenate([c_d, t_d[keep]])
    # candidates are a superset of the k best, in the order found
    cands = [(float(c_d[i]), c_lo[i], c_hi[i], int(c_lab[i]))
             for i in np.argsort(c_d, kind="stable")[:opts.k]]
    out = SearchOutput(
        prediction=pred, nodes_popped=int(popped), rectangles_evaluated=int(evaluated),
        regions_refined=refined, peak_boxes=int(held),
    )
    for d, lo_c, hi_c, lab_c in cands:
        out.found.append(
            assemble(engine, x, lo_c, hi_c, finish(opts.norm_code, d), lab_c, cmin, cmax, opts)
        )
    if out.found:
        # a stopped search proves at most its nearest answer (its alternatives may not be
        # the next best), so with k > 1 it is never optimal
        out.optimal = not stopped or (opts.k == 1 and low >= cands[0][0])
        out.lower_bound = (out.found[0].distance if out.optimal
                           else finish(opts.norm_code, float(low)))
    if not out.found:
        out.unreachable = tuple(int(i) for i in np.flatnonzero(tmask))
        out.constraints = _constraints_text(engine, opts)
    return out


def linear_scan(engine: SearchEngine, x: np.ndarray, t_idx: int, opts: QueryOptions) -> tuple[float, int]:
    """Reference: (distance, rectangle id) of the nearest target rectangle by brute force
    over every certified rectangle. Used by tests and benchmarks."""
    cmin, cmax = opts.constraint_box(x)
    tmask = np.zeros(len(engine.classes), dtype=bool)
    tmask[t_idx] = True
    g, part = engine.grid, engine.partition
    rects: tuple[Any, ...] = (part.labels, part.lo, part.hi, g.cell_offsets, g.cell_lower,
                              g.cell_upper, g.cell_lower_closed, g.cell_upper_closed, False)
    d = _scan(np.ascontiguousarray(x, dtype=np.float64), opts.weights, opts.norm_code, cmin, cmax,
              g.integral, tmask, *opts.group_args(x), *rects)
    r = int(np.argmin(d))
    return finish(opts.norm_code, float(d[r])), r


__all__ = [
    "DEEPEN_GROWTH",
    "DEEPEN_ROUNDS",
    "DEEPEN_START",
    "GUESS_FIRST",
    "HARD_AFTER",
    "MAX_MIXED_POPS",
    "MAX_THREADS",
    "PARALLEL_AFTER",
    "PARALLEL_SHARE",
    "PARALLEL_ROWS",
    "PARALLEL_SECONDS",
    "SearchBudget",
    "SearchOutput",
    "default_threads",
    "linear_scan",
    "locate",
    "locate_rect",
    "search",
    "search_batch",
]
