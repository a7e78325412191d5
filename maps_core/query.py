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
* integral features: the interval is rounded inward to integers.

Rectangles of continuous features are open at a lower end that comes from a threshold
(``x > t``); the certified distance is the infimum, and the returned point is the nearest
float32 value strictly inside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from .exceptions import InvalidQueryError
from .partition import MIXED, Kernel, refine_region

if TYPE_CHECKING:  # pragma: no cover
    from .maps import CounterfactualMaps

NORMS = {"l1": 0, "l2": 1, "linf": 2}


# --------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------
@njit(cache=True, nogil=True, inline="always")
def _acc(norm, total, term):
    if norm == 0:
        return total + term
    if norm == 1:
        return total + term * term
    return max(total, term)


@njit(cache=True, nogil=True)
def _box_dist(x, w, norm, cmin, cmax, integral, lo, hi):
    """Distance from ``x`` to the closed box ``[lo, hi]`` within the constraint box."""
    total = 0.0
    for f in range(x.shape[0]):
        a = max(lo[f], cmin[f])
        b = min(hi[f], cmax[f])
        if integral[f]:
            a = math.ceil(a)
            b = math.floor(b)
        if a > b:
            return np.inf
        v = x[f]
        if v < a:
            total = _acc(norm, total, w[f] * (a - v))
        elif v > b:
            total = _acc(norm, total, w[f] * (v - b))
    return total


@njit(cache=True, nogil=True)
def _rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp, clcl, bound):
    """Exact (infimum) distance to rectangle ``r`` under the constraints; inf if empty.

    Stops early (returning inf) once the partial cost reaches ``bound``.
    """
    total = 0.0
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
        v = x[f]
        if v < a:
            total = _acc(norm, total, w[f] * (a - v))
        elif v > b:
            total = _acc(norm, total, w[f] * (v - b))
        if total >= bound:
            return np.inf
    return total


@njit(cache=True, nogil=True)
def _push(keys, vals, n, key, val):
    if n >= keys.shape[0]:
        k2 = np.empty(2 * keys.shape[0])
        v2 = np.empty(2 * keys.shape[0], dtype=np.int64)
        k2[:n] = keys[:n]
        v2[:n] = vals[:n]
        keys = k2
        vals = v2
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
    return keys, vals, n + 1


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def _search(x, w, norm, cmin, cmax, integral, tmask, k, node_lo, node_hi, left, right, start,
            end, order, class_root, labels, rlo, rhi, coff, clow, cupp, clcl):
    """Best-first branch-and-bound for the ``k`` nearest rectangles of the target classes.

    Returns (best_ids, best_d, mixed_ids, mixed_d, popped, evaluated); distances are in
    the accumulated form (squared for l2). Mixed regions closer than the k-th best at the
    time they are met are reported separately for refinement.
    """
    keys = np.empty(64)
    vals = np.empty(64, dtype=np.int64)
    n = 0
    for c in range(class_root.shape[0]):
        if tmask[c] and class_root[c] >= 0:
            nd = class_root[c]
            d = _box_dist(x, w, norm, cmin, cmax, integral, node_lo[nd], node_hi[nd])
            if d < np.inf:
                keys, vals, n = _push(keys, vals, n, d, nd)
    best_d = np.full(k, np.inf)
    best_id = np.full(k, -1, dtype=np.int64)
    mixed_ids = np.empty(16, dtype=np.int64)
    mixed_d = np.empty(16)
    n_mixed = 0
    popped = 0
    evaluated = 0
    while n > 0:
        key, nd, n = _pop(keys, vals, n)
        if key >= best_d[k - 1]:
            break
        popped += 1
        if left[nd] < 0:
            for i in range(start[nd], end[nd]):
                r = order[i]
                lab = labels[r]
                if lab >= 0 and not tmask[lab]:
                    continue
                evaluated += 1
                d = _rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp,
                               clcl, best_d[k - 1])
                if d >= best_d[k - 1]:
                    continue
                if lab == -1:
                    if n_mixed >= mixed_ids.shape[0]:
                        t1 = np.empty(2 * n_mixed, dtype=np.int64)
                        t2 = np.empty(2 * n_mixed)
                        t1[:n_mixed] = mixed_ids[:n_mixed]
                        t2[:n_mixed] = mixed_d[:n_mixed]
                        mixed_ids = t1
                        mixed_d = t2
                    mixed_ids[n_mixed] = r
                    mixed_d[n_mixed] = d
                    n_mixed += 1
                    continue
                # insert into the sorted top-k (rectangles are distinct: each certified
                # rectangle sits in exactly one class tree)
                j = k - 1
                while j > 0 and best_d[j - 1] > d:
                    best_d[j] = best_d[j - 1]
                    best_id[j] = best_id[j - 1]
                    j -= 1
                best_d[j] = d
                best_id[j] = r
        else:
            for ch in (left[nd], right[nd]):
                d = _box_dist(x, w, norm, cmin, cmax, integral, node_lo[ch], node_hi[ch])
                if d < best_d[k - 1]:
                    keys, vals, n = _push(keys, vals, n, d, ch)
    return best_id, best_d, mixed_ids[:n_mixed].copy(), mixed_d[:n_mixed].copy(), popped, evaluated


@njit(cache=True, nogil=True)
def _locate(P, C, node_lo, node_hi, left, right, start, end, order, class_root, rlo, rhi):
    """Rectangle containing each row: ``P`` model-view points, ``C`` their cell indices."""
    n, m = P.shape
    out = np.full(n, -1, dtype=np.int64)
    stack = np.empty(256, dtype=np.int64)
    for i in range(n):
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
                    if P[i, f] < node_lo[nd, f] or P[i, f] > node_hi[nd, f]:
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
def _scan(x, w, norm, cmin, cmax, integral, tmask, labels, rlo, rhi, coff, clow, cupp, clcl):
    """Linear scan over every rectangle: distance per rectangle (inf if not a target)."""
    n = labels.shape[0]
    out = np.full(n, np.inf)
    for r in range(n):
        lab = labels[r]
        if lab < 0 or not tmask[lab]:
            continue
        out[r] = _rect_dist(r, x, w, norm, cmin, cmax, integral, rlo, rhi, coff, clow, cupp,
                            clcl, np.inf)
    return out


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

    @property
    def norm_code(self) -> int:
        return NORMS[self.norm]

    def constraint_box(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Box every counterfactual of ``x`` must lie in, two arrays of shape (m,)."""
        cmin = self.lower.copy()
        cmax = self.upper.copy()
        inc = (self.direction > 0) | self.immutable
        dec = (self.direction < 0) | self.immutable
        cmin[inc] = np.maximum(cmin[inc], x[inc])
        cmax[dec] = np.minimum(cmax[dec], x[dec])
        return cmin, cmax


def _by_feature(maps: CounterfactualMaps, value: Any, what: str) -> dict[int, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidQueryError(f"{what} must be an object keyed by feature name", what)
    out = {}
    names = maps.feature_names
    for name, v in value.items():
        if name not in names:
            raise InvalidQueryError(f"{what}: unknown feature {name!r}", name)
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
) -> QueryOptions:
    """Validate query options against the maps' schema (defaults from the schema)."""
    m = maps.n_features
    schema = maps.schema
    if norm not in NORMS:
        raise InvalidQueryError(f"norm must be one of {sorted(NORMS)}, got {norm!r}", "norm")
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or not 1 <= k <= 1000:
        raise InvalidQueryError("k must be an integer between 1 and 1000", "k")
    w = schema.default_weights()
    if weights is not None:
        if isinstance(weights, Mapping):
            for j, v in _by_feature(maps, weights, "weights").items():
                w[j] = v
        else:
            arr = np.asarray(weights, dtype=np.float64)
            if arr.shape != (m,):
                raise InvalidQueryError(f"weights must have {m} entries", "weights")
            w = arr.copy()
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise InvalidQueryError("weights must be finite and non-negative", "weights")
    imm = np.array([not f.mutable for f in schema], dtype=bool)
    if immutable is not None:
        if isinstance(immutable, str) or not isinstance(immutable, Sequence):
            raise InvalidQueryError("immutable must be a list of feature names", "immutable")
        for name in immutable:
            if name not in maps.feature_names:
                raise InvalidQueryError(f"immutable: unknown feature {name!r}", str(name))
            imm[maps.feature_names.index(name)] = True
    dirs = np.array(
        [{"any": 0, "increase": 1, "decrease": -1}[f.direction] for f in schema], dtype=np.int8
    )
    for j, v in _by_feature(maps, direction, "direction").items():
        if v not in ("any", "increase", "decrease"):
            raise InvalidQueryError(
                f"direction of {maps.feature_names[j]!r} must be any, increase or decrease",
                maps.feature_names[j],
            )
        dirs[j] = {"any": 0, "increase": 1, "decrease": -1}[v]
    lower = maps.grid.dom_lower.copy()
    upper = maps.grid.dom_upper.copy()
    for j, v in _by_feature(maps, bounds, "bounds").items():
        name = maps.feature_names[j]
        try:
            lo_v, hi_v = v
            lo_f = -np.inf if lo_v is None else float(lo_v)
            hi_f = np.inf if hi_v is None else float(hi_v)
        except (TypeError, ValueError) as exc:
            raise InvalidQueryError(
                f"bounds of {name!r} must be [lower, upper] (numbers or null)", name
            ) from exc
        if math.isnan(lo_f) or math.isnan(hi_f) or lo_f > hi_f:
            raise InvalidQueryError(f"bounds of {name!r} must satisfy lower <= upper", name)
        lower[j] = max(lower[j], lo_f)
        upper[j] = min(upper[j], hi_f)
    return QueryOptions(
        norm=norm, weights=w, immutable=imm, direction=dirs, lower=lower, upper=upper, k=int(k)
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
    reason: str | None = None


def _finish(norm: str, acc: float) -> float:
    return math.sqrt(acc) if norm == "l2" else float(acc)


def point_distance(x: np.ndarray, p: np.ndarray, w: np.ndarray, norm: str) -> float:
    """Weighted distance between two points of shape (m,)."""
    d = w * np.abs(p - x)
    if norm == "l1":
        return float(d.sum())
    if norm == "l2":
        return float(np.sqrt((d * d).sum()))
    return float(d.max(initial=0.0))


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
    off = g.cell_offsets[:-1]
    lower = g.cell_lower[lo_cells + off].copy()
    upper = g.cell_upper[hi_cells + off].copy()
    lcl = g.cell_lower_closed[lo_cells + off].copy()
    ucl = g.cell_upper_closed[hi_cells + off].copy()
    raise_lo = cmin > lower
    lower[raise_lo] = cmin[raise_lo]
    lcl[raise_lo] = True
    cut_hi = cmax < upper
    upper[cut_hi] = cmax[cut_hi]
    ucl[cut_hi] = True
    integ = g.integral
    with np.errstate(invalid="ignore"):
        lower[integ] = np.ceil(lower[integ])
        upper[integ] = np.floor(upper[integ])
    lcl[integ & np.isfinite(lower)] = True
    ucl[integ & np.isfinite(upper)] = True
    cell_lo = g.cell_lower[lo_cells + off]
    cell_hi = g.cell_upper[hi_cells + off]
    cell_lcl = g.cell_lower_closed[lo_cells + off]
    p = np.clip(x, lower, upper)
    for f in np.flatnonzero(~integ):
        x32 = float(np.float32(x[f]))
        if (
            p[f] == x[f]
            and (x[f] > lower[f] or lcl[f])
            and (x32 > cell_lo[f] or (cell_lcl[f] and x32 >= cell_lo[f]))
            and x32 <= cell_hi[f]
        ):
            # x's own value is in the region and the model's view of it in the cell:
            # leave the feature untouched (an immutable feature must not move by an ulp).
            continue
        # The model sees float32(p): make sure that value is inside the interval.
        v32 = float(np.float32(p[f]))
        lo_f, hi_f = lower[f], upper[f]
        if v32 < lo_f or (v32 == lo_f and not lcl[f]):
            v32 = float(np.nextafter(np.float32(lo_f), np.float32(np.inf)))
            if v32 < lo_f:  # lo_f not a float32: go one more step
                v32 = float(np.nextafter(np.float32(v32), np.float32(np.inf)))
            p[f] = v32
        elif v32 > hi_f:
            p[f] = float(np.nextafter(np.float32(hi_f), np.float32(-np.inf)))
        elif p[f] != x[f]:
            p[f] = v32
    cfd = point_distance(x, p, opts.weights, opts.norm)
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
    g = maps.grid
    # The model's view of a continuous value is float32(x), which may sit a fraction of
    # an ulp outside a domain bound that is not a float32; its cell is still the edge one.
    P = np.where(g.integral, A, A.astype(np.float32).astype(np.float64))
    P = np.clip(P, g.dom_lower, g.dom_upper)
    C = g.cells_of(A)
    ix, part = maps.index, maps.partition
    return _locate(P, C, ix.node_lo, ix.node_hi, ix.left, ix.right, ix.start, ix.end, ix.order,
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


def _kernel(maps: CounterfactualMaps) -> Kernel:
    kern = getattr(maps, "_kernel_cache", None)
    if kern is None:
        kern = Kernel.make(maps.ensemble, maps.grid)
        maps._kernel_cache = kern  # type: ignore[attr-defined]
    return kern


def _refined(maps: CounterfactualMaps, rid: int) -> tuple[np.ndarray, ...]:
    """Certified sub-boxes of mixed region ``rid``, cached on the maps object."""
    cache: dict[int, tuple[np.ndarray, ...]] = maps.__dict__.setdefault("_refine_cache", {})
    if rid not in cache:
        part = maps.partition
        lo, hi, lab = refine_region(_kernel(maps), np.asarray(part.lo[rid]), np.asarray(part.hi[rid]))
        ties = lab < 0
        if ties.any():
            lab[ties] = maps.ensemble.predict_index(maps.grid.cell_points(lo[ties]))
        cache[rid] = (lo, hi, lab)
    return cache[rid]


def search(maps: CounterfactualMaps, x: np.ndarray, t_idx: int | None, opts: QueryOptions) -> SearchOutput:
    """Run one query (``x`` already validated, shape (m,))."""
    rid = int(locate_rect(maps, x[None, :])[0])
    pred = int(locate(maps, x[None, :])[0])
    cmin, cmax = opts.constraint_box(x)
    c = len(maps.classes)
    part = maps.partition
    if t_idx is not None and t_idx == pred:
        lab_rid = int(part.labels[rid])
        if lab_rid == MIXED:
            lo, hi, lab = _refined(maps, rid)
            cells = maps.grid.cells_of(x[None, :])[0]
            j = int(np.flatnonzero(np.all((lo <= cells) & (cells <= hi), axis=1))[0])
            lo_c, hi_c = lo[j], hi[j]
        else:
            lo_c, hi_c = np.asarray(part.lo[rid]), np.asarray(part.hi[rid])
        f = assemble(maps, x, lo_c, hi_c, 0.0, pred, np.minimum(cmin, x), np.maximum(cmax, x), opts)
        f.x = x.copy()
        f.counterfactual_distance = 0.0
        return SearchOutput(prediction=pred, found=[f])
    tmask = np.ones(c, dtype=bool)
    if t_idx is None:
        tmask[pred] = False
    else:
        tmask[:] = False
        tmask[t_idx] = True
    integral = maps.grid.integral
    x_w = np.ascontiguousarray(x, dtype=np.float64)
    k = opts.k
    best_id, best_d, mixed_ids, mixed_d, popped, evaluated = _search(
        x_w, opts.weights, opts.norm_code, cmin, cmax, integral, tmask, k, *_arrays(maps)
    )
    cands: list[tuple[float, np.ndarray, np.ndarray, int]] = [
        (float(d), np.asarray(part.lo[r]), np.asarray(part.hi[r]), int(part.labels[r]))
        for r, d in zip(best_id, best_d, strict=True)
        if r >= 0
    ]
    refined = 0
    if mixed_ids.size:
        # Refine mixed regions that could still beat the k-th best, nearest first.
        order = np.argsort(mixed_d, kind="stable")
        seen: set[int] = set()
        for j in order:
            r = int(mixed_ids[j])
            kth = cands[k - 1][0] if len(cands) >= k else np.inf
            if r in seen or mixed_d[j] >= kth:
                continue
            seen.add(r)
            lo, hi, lab = _refined(maps, r)
            refined += 1
            d_all = _scan(x_w, opts.weights, opts.norm_code, cmin, cmax, integral, tmask,
                          lab, lo, hi, maps.grid.cell_offsets, maps.grid.cell_lower,
                          maps.grid.cell_upper, maps.grid.cell_lower_closed)
            for i in np.flatnonzero(np.isfinite(d_all)):
                cands.append((float(d_all[i]), lo[i], hi[i], int(lab[i])))
            cands.sort(key=lambda t: t[0])
            del cands[k:]
    out = SearchOutput(
        prediction=pred, nodes_popped=int(popped), rectangles_evaluated=int(evaluated),
        regions_refined=refined,
    )
    for d, lo_c, hi_c, lab_c in cands:
        out.found.append(
            assemble(maps, x, lo_c, hi_c, _finish(opts.norm, d), lab_c, cmin, cmax, opts)
        )
    if not out.found:
        names = [str(maps.classes[i]) for i in np.flatnonzero(tmask)]
        out.reason = (
            f"no input satisfying the constraints is classified as {' or '.join(names)}"
        )
    return out


def linear_scan(maps: CounterfactualMaps, x: np.ndarray, t_idx: int, opts: QueryOptions) -> tuple[float, int]:
    """Reference: (distance, rectangle id) of the nearest target rectangle by brute force
    over every certified rectangle. Used by tests and benchmarks."""
    cmin, cmax = opts.constraint_box(x)
    tmask = np.zeros(len(maps.classes), dtype=bool)
    tmask[t_idx] = True
    g, part = maps.grid, maps.partition
    d = _scan(np.ascontiguousarray(x, dtype=np.float64), opts.weights, opts.norm_code, cmin, cmax,
              g.integral, tmask, part.labels, part.lo, part.hi, g.cell_offsets, g.cell_lower,
              g.cell_upper, g.cell_lower_closed)
    r = int(np.argmin(d))
    return _finish(opts.norm, float(d[r])), r
