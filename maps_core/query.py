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

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from .distance import _rect_dist
from .exceptions import BudgetExceededError, InvalidQueryError
from .grid import _cells
from .lazy import best_first
from .partition import MIXED, Kernel, refine_region

if TYPE_CHECKING:  # pragma: no cover
    from .maps import CounterfactualMaps

NORMS = {"l1": 0, "l2": 1, "linf": 2, "l0": 3}


# --------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _locate(A, integral, dom_lower, dom_upper, thr_values, thr_offsets, node_lo, node_hi, left,
            right, start, end, order, class_root, rlo, rhi):
    """Rectangle containing each row of ``A`` (shape (n, m)), -1 where none does."""
    n, m = A.shape
    C = _cells(A, integral, thr_values, thr_offsets)
    P = np.empty(m)  # the row as the model sees it, inside the domain
    out = np.full(n, -1, dtype=np.int64)
    stack = np.empty(256, dtype=np.int64)
    for i in range(n):
        for f in range(m):
            # The model's view of a continuous value is float32(x), which may sit a
            # fraction of an ulp outside a domain bound that is not a float32; its cell is
            # still the edge one.
            v = A[i, f] if integral[f] else np.float64(np.float32(A[i, f]))
            P[f] = min(max(v, dom_lower[f]), dom_upper[f])
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
          rhi, coff, clow, cupp, clcl, with_mixed):
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
        out[r] = _rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp,
                            clcl, np.inf, gcol, gstart, gcols, gcost, xcat, a0, a1)
    return out


@njit(cache=True, nogil=True)
def _place(x, lo_cells, hi_cells, cmin, cmax, coff, clow, cupp, clcl, cucl, integral):
    """Region of the rectangle ``lo_cells..hi_cells`` (cell indices, shape (m,)) clipped to
    the constraint box ``cmin..cmax``, and the point of it nearest to ``x`` that the model
    sees inside it. Returns (point, lower, upper, lower_closed, upper_closed), shape (m,)."""
    m = x.shape[0]
    p = np.empty(m)
    lower = np.empty(m)
    upper = np.empty(m)
    lcl = np.empty(m, dtype=np.bool_)
    ucl = np.empty(m, dtype=np.bool_)
    for f in range(m):
        gl = coff[f] + lo_cells[f]
        gh = coff[f] + hi_cells[f]
        cell_lo = clow[gl]
        lo_f, hi_f = cell_lo, cupp[gh]
        lc, uc = clcl[gl], cucl[gh]
        if cmin[f] > lo_f:
            lo_f = cmin[f]
            lc = True
        if cmax[f] < hi_f:
            hi_f = cmax[f]
            uc = True
        if integral[f]:
            lo_f = math.ceil(lo_f) if np.isfinite(lo_f) else lo_f
            hi_f = math.floor(hi_f) if np.isfinite(hi_f) else hi_f
            lc = lc or np.isfinite(lo_f)
            uc = uc or np.isfinite(hi_f)
        lower[f], upper[f], lcl[f], ucl[f] = lo_f, hi_f, lc, uc
        v = x[f]
        pf = min(max(v, lo_f), hi_f)
        if not integral[f]:
            x32 = np.float64(np.float32(v))
            if (pf == v and (v > lo_f or lc) and (x32 > cell_lo or (clcl[gl] and x32 >= cell_lo))
                    and x32 <= cupp[gh]):
                # x's own value is in the region and the model's view of it in the cell:
                # leave the feature untouched (an immutable feature must not move by an ulp).
                p[f] = v
                continue
            # The model sees float32(p): make sure that value is inside the interval.
            v32 = np.float64(np.float32(pf))
            if v32 < lo_f or (v32 == lo_f and not lc):
                v32 = np.float64(np.nextafter(np.float32(lo_f), np.float32(np.inf)))
                if v32 < lo_f:  # lo_f not a float32: go one more step
                    v32 = np.float64(np.nextafter(np.float32(v32), np.float32(np.inf)))
                pf = v32
            elif v32 > hi_f:
                pf = np.float64(np.nextafter(np.float32(hi_f), np.float32(-np.inf)))
            elif pf != v:
                pf = v32
        p[f] = pf
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
        d = w[f] * abs(p[f] - x[f])
        changed += 1
        total += d * d if norm == 1 else d
        top = max(top, d)
    for g in range(gcost.shape[0]):
        for j in range(gstart[g], gstart[g + 1]):
            if p[gcols[j]] != x[gcols[j]]:
                d = gcost[g]
                changed += 1
                total += d * d if norm == 1 else d
                top = max(top, d)
                break
    if norm == 3:
        return float(changed)
    if norm == 1:
        return math.sqrt(total)
    return top if norm == 2 else total


# --------------------------------------------------------------------------------------
# options and result assembly
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class QueryOptions:
    """Validated query options, per-feature arrays of shape (n_features,)."""

    norm: str
    weights: np.ndarray
    immutable: np.ndarray
    direction: np.ndarray  # +1 increase only, -1 decrease only, 0 any
    lower: np.ndarray
    upper: np.ndarray
    k: int = 1
    # One-hot groups in CSR form: ``gcols[gstart[g]:gstart[g + 1]]`` are group g's columns,
    # ``gcol[f]`` is f's group (-1 outside groups), ``gcost[g]`` its switching cost.
    group_names: tuple[str, ...] = ()
    gcol: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gstart: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    gcols: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gcost: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    # Median weighted feature width (see _typical_width): the scale of the first
    # deepening bound on maps with mixed regions.
    scale: float = 1.0

    @property
    def norm_code(self) -> int:
        return NORMS[self.norm]

    def group_args(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        """Kernel arguments for the groups: (gcol, gstart, gcols, gcost, xcat), where
        ``xcat[g]`` is the column of x's category (x validated by :func:`categories`)."""
        return self.gcol, self.gstart, self.gcols, self.gcost, categories(self, x[None, :])[0]

    def constraint_box(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Box every counterfactual of ``x`` must lie in, two arrays of shape (m,)."""
        cmin = self.lower.copy()
        cmax = self.upper.copy()
        inc, dec = self._pinned
        if inc.size:
            cmin[inc] = np.maximum(cmin[inc], x[inc])
        if dec.size:
            cmax[dec] = np.minimum(cmax[dec], x[dec])
        return cmin, cmax

    @cached_property
    def _pinned(self) -> tuple[np.ndarray, np.ndarray]:
        """Features that may not decrease, and those that may not increase."""
        return (np.flatnonzero((self.direction > 0) | self.immutable),
                np.flatnonzero((self.direction < 0) | self.immutable))


def categories(opts: QueryOptions, A: np.ndarray) -> np.ndarray:
    """Column of each row's category per one-hot group, shape (n, n_groups).

    Raises :class:`InvalidQueryError` naming the group when a row is not exactly one-hot
    there (the current category of such an input is undefined)."""
    G = opts.gcost.shape[0]
    out = np.empty((A.shape[0], G), dtype=np.int64)
    for g in range(G):
        cols = opts.gcols[opts.gstart[g]:opts.gstart[g + 1]]
        block = A[:, cols]
        ok = np.all((block == 0) | (block == 1), axis=1) & (block.sum(axis=1) == 1)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise InvalidQueryError(
                f"one-hot group {opts.group_names[g]!r} must have exactly one column equal to 1 "
                f"(instance {i} has {block[i].tolist()})",
                opts.group_names[g],
                row=i,
            )
        out[:, g] = cols[np.argmax(block, axis=1)]
    return out


def _by_feature(names: Sequence[str], value: Any, what: str) -> dict[int, Any]:
    """``value`` (an object keyed by feature name) keyed by feature position instead."""
    if not isinstance(value, Mapping):
        raise InvalidQueryError(f"{what} must be an object keyed by feature name", what)
    out = {}
    for name, v in value.items():
        if name not in names:
            raise InvalidQueryError(f"{what}: unknown feature {name!r}", f"{what}.{name}")
        out[names.index(name)] = v
    return out


def make_options(
    maps: CounterfactualMaps,
    *,
    norm: str = "l1",
    weights: Mapping[str, float] | Sequence[float] | np.ndarray | None = None,
    immutable: Sequence[str] | None = None,
    direction: Mapping[str, str] | None = None,
    bounds: Mapping[str, Sequence[float | None]] | None = None,
    k: int = 1,
    group_costs: Mapping[str, float] | None = None,
) -> QueryOptions:
    """Validate query options against the maps' schema (defaults from the schema)."""
    if norm not in NORMS:
        raise InvalidQueryError(f"norm must be one of {sorted(NORMS)}, got {norm!r}", "norm")
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or not 1 <= k <= 1000:
        raise InvalidQueryError("k must be an integer between 1 and 1000", "k")
    # The schema's defaults: built once per maps, norm and k (about 0.1 ms a query), then
    # shared by every query. Custom options copy only the arrays they change, so none
    # writes the shared ones (which stay writeable: a read-only flag would make numba
    # compile a second variant of every kernel).
    cache = maps.__dict__.setdefault("_default_options", {})
    base = cache.get((norm, int(k)))
    if base is None:
        base = cache.setdefault((norm, int(k)), _default_options(maps, norm, int(k)))
    if all(v is None for v in (weights, immutable, direction, bounds, group_costs)):
        return base  # the common case: no per-query work at all
    changes: dict[str, Any] = {}
    names = maps.feature_names
    if weights is not None:
        w = base.weights.copy()
        if isinstance(weights, Mapping):
            for j, v in _by_feature(names, weights, "weights").items():
                w[j] = v
        else:
            w = np.array(weights, dtype=np.float64)
            if w.shape != (maps.n_features,):
                raise InvalidQueryError(f"weights must have {maps.n_features} entries", "weights")
        _check_weights(w)
        changes.update(weights=w, scale=_typical_width(maps, w))
    if immutable is not None:
        if isinstance(immutable, str) or not isinstance(immutable, Sequence):
            raise InvalidQueryError("immutable must be a list of feature names", "immutable")
        imm = base.immutable.copy()
        for name in immutable:
            if name not in names:
                raise InvalidQueryError(f"immutable: unknown feature {name!r}", f"immutable.{name}")
            imm[names.index(name)] = True
        changes["immutable"] = imm
    if direction is not None:
        dirs = base.direction.copy()
        for j, v in _by_feature(names, direction, "direction").items():
            if v not in _DIRECTIONS:
                raise InvalidQueryError(
                    f"direction of {names[j]!r} must be any, increase or decrease",
                    f"direction.{names[j]}",
                )
            dirs[j] = _DIRECTIONS[v]
        changes["direction"] = dirs
    if bounds is not None:
        lower, upper = base.lower.copy(), base.upper.copy()
        for j, v in _by_feature(names, bounds, "bounds").items():
            name = names[j]
            try:
                lo_v, hi_v = v
                lo_f = -np.inf if lo_v is None else float(lo_v)
                hi_f = np.inf if hi_v is None else float(hi_v)
            except (TypeError, ValueError) as exc:
                raise InvalidQueryError(
                    f"bounds of {name!r} must be [lower, upper] (numbers or null)", f"bounds.{name}"
                ) from exc
            if math.isnan(lo_f) or math.isnan(hi_f) or lo_f > hi_f:
                raise InvalidQueryError(
                    f"bounds of {name!r} must satisfy lower <= upper", f"bounds.{name}"
                )
            lower[j] = max(lower[j], lo_f)
            upper[j] = min(upper[j], hi_f)
        changes.update(lower=lower, upper=upper)
    if group_costs is not None:
        if not isinstance(group_costs, Mapping):
            raise InvalidQueryError("group_costs must be an object keyed by group name", "group_costs")
        gcost = base.gcost.copy()
        for gname, v in group_costs.items():
            if gname not in base.group_names:
                raise InvalidQueryError(
                    f"group_costs: unknown one-hot group {gname!r}; groups are "
                    f"{list(base.group_names)}",
                    f"group_costs.{gname}",
                )
            g = base.group_names.index(gname)
            try:
                gcost[g] = float(v)
            except (TypeError, ValueError) as exc:
                raise InvalidQueryError(
                    f"cost of group {gname!r} must be a number", f"group_costs.{gname}"
                ) from exc
            if not math.isfinite(gcost[g]) or gcost[g] < 0:
                raise InvalidQueryError(
                    f"cost of group {gname!r} must be finite and >= 0", f"group_costs.{gname}"
                )
        changes["gcost"] = gcost
    return replace(base, **changes) if changes else base


_DIRECTIONS = {"any": 0, "increase": 1, "decrease": -1}


def _check_weights(w: np.ndarray) -> None:
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise InvalidQueryError("weights must be finite and non-negative", "weights")


def _default_options(maps: CounterfactualMaps, norm: str, k: int) -> QueryOptions:
    """The options a query without any gets: everything from the maps' schema."""
    schema = maps.schema
    w = schema.default_weights()
    _check_weights(w)
    groups = schema.groups()
    names = tuple(groups)
    costs = schema.default_group_costs()
    gcol = np.full(maps.n_features, -1, dtype=np.int64)
    for g, gname in enumerate(names):
        gcol[groups[gname]] = g
    sizes = [len(groups[g]) for g in names]
    return QueryOptions(
        norm=norm, weights=w, k=k,
        immutable=np.array([not f.mutable for f in schema], dtype=bool),
        direction=np.array([_DIRECTIONS[f.direction] for f in schema], dtype=np.int8),
        lower=maps.grid.dom_lower.copy(), upper=maps.grid.dom_upper.copy(),
        group_names=names, gcol=gcol,
        gstart=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        gcols=np.array([j for g in names for j in groups[g]], dtype=np.int64),
        gcost=np.array([costs[g] for g in names], dtype=np.float64),
        scale=_typical_width(maps, w),
    )


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
    unreachable: tuple[int, ...] = ()  # target class indices, when infeasible
    constraints: str = ""


def _finish(norm: str, acc: float) -> float:
    if norm == "l0":
        return float(math.floor(acc))  # the number of changes; the fraction is the tie-break
    return math.sqrt(acc) if norm == "l2" else float(acc)


def assemble(
    maps: CounterfactualMaps,
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
    g = maps.grid
    p, lower, upper, lcl, ucl = _place(
        x, np.ascontiguousarray(lo_cells, dtype=np.int32),
        np.ascontiguousarray(hi_cells, dtype=np.int32), cmin, cmax, g.cell_offsets,
        g.cell_lower, g.cell_upper, g.cell_lower_closed, g.cell_upper_closed, g.integral,
    )
    # One-hot groups: stay on x's category when the region allows it, otherwise take the
    # first category the region allows (all switches cost the same).
    for gi in range(opts.gcost.shape[0]):
        cols = opts.gcols[opts.gstart[gi]:opts.gstart[gi + 1]]
        may0 = lower[cols] <= 0
        may1 = upper[cols] >= 1
        cur = int(np.argmax(x[cols]))
        if may1[cur] and np.all(np.delete(may0, cur)):
            pick = cur
        else:
            pick = next(i for i in range(len(cols)) if may1[i] and np.all(np.delete(may0, i)))
        p[cols] = 0.0
        p[cols[pick]] = 1.0
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
def _arrays(maps: CounterfactualMaps) -> tuple[Any, ...]:
    ix, g, part = maps.index, maps.grid, maps.partition
    return (ix.node_lo, ix.node_hi, ix.left, ix.right, ix.start, ix.end, ix.order,
            ix.class_root, part.labels, part.lo, part.hi, g.cell_offsets, g.cell_lower,
            g.cell_upper, g.cell_lower_closed)


def locate_rect(maps: CounterfactualMaps, A: np.ndarray) -> np.ndarray:
    """Id of the rectangle containing each row of ``A`` (shape (n, m)), shape (n,)."""
    g, ix, part = maps.grid, maps.index, maps.partition
    return _locate(A, g.integral, g.dom_lower, g.dom_upper, g.thr_values, g.thr_offsets,
                   ix.node_lo, ix.node_hi, ix.left, ix.right, ix.start, ix.end, ix.order,
                   ix.class_root, part.lo, part.hi)


def locate(maps: CounterfactualMaps, A: np.ndarray) -> np.ndarray:
    """Class index of every row: the label of its rectangle (model itself in mixed ones)."""
    rid = locate_rect(maps, A)
    lab = np.asarray(maps.partition.labels)[rid].astype(np.int64)
    # A complete partition covers every legal point; rid < 0 would be a bug, and then the
    # ensemble's own arithmetic is the safe answer.
    mixed = (lab == MIXED) | (rid < 0)
    if mixed.any():
        lab[mixed] = maps.ensemble.predict_index(A[mixed])
    return lab


def _has_mixed(maps: CounterfactualMaps) -> bool:
    has = maps.__dict__.get("_has_mixed")
    if has is None:
        has = maps.__dict__.setdefault("_has_mixed", bool(maps.partition.n_mixed))
    return bool(has)


def _typical_width(maps: CounterfactualMaps, weights: np.ndarray) -> float:
    """Median weighted width of the features' finite extent (domain bounds and thresholds),
    the scale of the first deepening bound (1.0 with the default weights 1/range)."""
    width = maps.__dict__.get("_widths")
    if width is None:
        g = maps.grid
        width = np.zeros(g.n_features)
        for f in range(g.n_features):
            v = np.concatenate([g.thresholds(f), [g.dom_lower[f], g.dom_upper[f]]])
            v = v[np.isfinite(v)]
            if v.size:
                width[f] = v.max() - v.min()
        width = maps.__dict__.setdefault("_widths", width)
    ww = [v for v in (weights * width).tolist() if v > 0]
    return statistics.median(ww) if ww else 1.0  # np.median costs ~50 us per query


def _kernel(maps: CounterfactualMaps) -> Kernel:
    kern = maps.__dict__.get("_kernel")
    if kern is None:
        kern = maps.__dict__.setdefault("_kernel", Kernel.make(maps.ensemble, maps.grid))
    return kern


def _piece_holding(
    maps: CounterfactualMaps, cells: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Certified box containing the cell ``cells`` inside the mixed box ``lo..hi``."""
    lab = MIXED
    while lab == MIXED:  # refine a chunk, keep the piece holding the cell, repeat
        plo, phi, plab = refine_region(_kernel(maps), lo, hi, 512)
        j = int(np.flatnonzero(np.all((plo <= cells) & (cells <= phi), axis=1))[0])
        lo, hi, lab = plo[j], phi[j], int(plab[j])
    return lo, hi


# Boxes a query may pop inside mixed regions before giving up (exactness is never traded:
# a query that needs more fails with BudgetExceededError, suggesting a larger build budget).
MAX_MIXED_POPS = 5_000_000

# Iterative deepening on maps with mixed regions: a search bounded by a distance clips
# every box to the cells that may lie nearer (``lazy._clip_to_ball``), which spares it the
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


def _constraints_text(maps: CounterfactualMaps, opts: QueryOptions) -> str:
    """The active constraints in words, for infeasible answers."""
    fixed = [maps.feature_names[j] for j in np.flatnonzero(opts.immutable)]
    oneway = [maps.feature_names[j] for j in np.flatnonzero(opts.direction != 0)]
    g = maps.grid
    narrowed = (opts.lower > g.dom_lower) | (opts.upper < g.dom_upper)
    bounded = [maps.feature_names[j] for j in np.flatnonzero(narrowed)]
    parts = []
    if fixed:
        parts.append("immutable: " + ", ".join(fixed))
    if oneway:
        parts.append("one-way: " + ", ".join(oneway))
    if bounded:
        parts.append("bounded: " + ", ".join(bounded))
    return "; ".join(parts)


def search(maps: CounterfactualMaps, x: np.ndarray, t_idx: int | None, opts: QueryOptions) -> SearchOutput:
    """Run one query (``x`` already validated, shape (m,))."""
    part = maps.partition
    rid = int(locate_rect(maps, x[None, :])[0])
    pred = int(part.labels[rid]) if rid >= 0 else MIXED
    if pred == MIXED:
        pred = int(maps.ensemble.predict_index(x[None, :])[0])
    cmin, cmax = opts.constraint_box(x)
    groups = opts.group_args(x)
    c = len(maps.classes)
    if t_idx is not None and t_idx == pred and np.all((cmin <= x) & (x <= cmax)):
        # x keeps its class and satisfies the constraints: x itself, in its rectangle.
        lo_c, hi_c = np.asarray(part.lo[rid]), np.asarray(part.hi[rid])
        if int(part.labels[rid]) == MIXED:
            lo_c, hi_c = _piece_holding(maps, maps.grid.cells_of(x[None, :])[0], lo_c, hi_c)
        f = assemble(maps, x, lo_c, hi_c, 0.0, pred, cmin, cmax, opts)
        f.x = x.copy()
        f.counterfactual_distance = 0.0
        return SearchOutput(prediction=pred, found=[f])
    tmask = np.ones(c, dtype=bool)
    if t_idx is None:
        tmask[pred] = False
    else:
        tmask[:] = False
        tmask[t_idx] = True
    g, kern = maps.grid, _kernel(maps)
    args: tuple[Any, ...] = (
        np.ascontiguousarray(x, dtype=np.float64), opts.weights, opts.norm_code, cmin, cmax,
        g.integral, tmask, opts.k, *groups, *_arrays(maps), kern.nf, kern.ncut, kern.nl,
        kern.nr, kern.nv, kern.roots, kern.base, kern.tie_high, kern.tol, kern.max_depth_nodes,
        MAX_MIXED_POPS,
    )
    radius = np.inf
    if opts.norm != "l0" and _has_mixed(maps):
        radius = DEEPEN_START * opts.scale
    call: tuple[Any, ...] = (*args, radius, DEEPEN_GROWTH, DEEPEN_ROUNDS)
    c_lo, c_hi, c_lab, c_d, t_lo, t_hi, t_d, popped, evaluated, refined, complete = best_first(*call)
    if not complete:
        raise BudgetExceededError(
            f"this query needed more than {MAX_MIXED_POPS:,} boxes of the regions the build "
            "left unresolved; rebuild the maps with a larger budget (max_seconds / "
            "max_rectangles)"
        )
    if t_d.size:  # near-tie boxes: the model labels their centre, valid for all cells
        t_lab = maps.ensemble.predict_index(g.cell_points((t_lo + t_hi) // 2))
        keep = tmask[t_lab]
        c_lo, c_hi = np.concatenate([c_lo, t_lo[keep]]), np.concatenate([c_hi, t_hi[keep]])
        c_lab, c_d = np.concatenate([c_lab, t_lab[keep]]), np.concatenate([c_d, t_d[keep]])
    # candidates are a superset of the k best, in the order found
    cands = [(float(c_d[i]), c_lo[i], c_hi[i], int(c_lab[i]))
             for i in np.argsort(c_d, kind="stable")[:opts.k]]
    out = SearchOutput(
        prediction=pred, nodes_popped=int(popped), rectangles_evaluated=int(evaluated),
        regions_refined=refined,
    )
    for d, lo_c, hi_c, lab_c in cands:
        out.found.append(
            assemble(maps, x, lo_c, hi_c, _finish(opts.norm, d), lab_c, cmin, cmax, opts)
        )
    if not out.found:
        out.unreachable = tuple(int(i) for i in np.flatnonzero(tmask))
        out.constraints = _constraints_text(maps, opts)
    return out


def linear_scan(maps: CounterfactualMaps, x: np.ndarray, t_idx: int, opts: QueryOptions) -> tuple[float, int]:
    """Reference: (distance, rectangle id) of the nearest target rectangle by brute force
    over every certified rectangle. Used by tests and benchmarks."""
    cmin, cmax = opts.constraint_box(x)
    tmask = np.zeros(len(maps.classes), dtype=bool)
    tmask[t_idx] = True
    g, part = maps.grid, maps.partition
    rects: tuple[Any, ...] = (part.labels, part.lo, part.hi, g.cell_offsets, g.cell_lower, g.cell_upper,
             g.cell_lower_closed, False)
    d = _scan(np.ascontiguousarray(x, dtype=np.float64), opts.weights, opts.norm_code, cmin, cmax,
              g.integral, tmask, *opts.group_args(x), *rects)
    r = int(np.argmin(d))
    return _finish(opts.norm, float(d[r])), r
