"""Query options: validated against the maps' schema, with the schema's defaults.

:func:`make_options` is the one validator of what a caller may ask for (norm, weights,
immutable features, one-way changes, bounds, ``k``, one-hot switching costs); every error
is an :class:`~maps_core.exceptions.InvalidQueryError` whose ``field`` is the dotted path
of the offending option (``weights.AGE``, ``bounds.AGE``, ``group_costs.G``, ``k``...).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from numbers import Real
from typing import Any

import numpy as np

from ._norms import NORM_NAMES, NORMS
from .distance import NOMINAL
from .engine import SearchEngine
from .exceptions import InvalidQueryError
from .schema import unknown_feature
from .splits import FLOAT32_MAX, FLOAT32_OVERFLOW


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
    # ``gcol[f]`` is f's group (-1 outside groups, distance.NOMINAL for a nominal feature),
    # ``gcost[g]`` its switching cost.
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
        """Kernel code of the norm (see :mod:`maps_core._norms`)."""
        return NORMS[self.norm]

    def group_args(self, x: np.ndarray, xcat: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """Kernel arguments for the groups: (gcol, gstart, gcols, gcost, xcat), where
        ``xcat[g]`` is the column of x's category (x validated by :func:`categories`
        unless the caller gives ``xcat``, its row of that function's output)."""
        if xcat is None:
            xcat = categories(self, x[None, :])[0]
        return self.gcol, self.gstart, self.gcols, self.gcost, xcat

    def constraint_box(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Box every counterfactual of ``x`` must lie in, two arrays of shape (m,)."""
        cmin, cmax = self.constraint_boxes(x[None, :])
        return cmin[0], cmax[0]

    def constraint_boxes(self, A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`constraint_box` of every row of ``A`` (shape (n, m)): two arrays of shape
        (n, m)."""
        n = A.shape[0]
        cmin = np.repeat(self.lower[None, :], n, axis=0)
        cmax = np.repeat(self.upper[None, :], n, axis=0)
        inc, dec = self._pinned
        if inc.size:
            cmin[:, inc] = np.maximum(cmin[:, inc], A[:, inc])
        if dec.size:
            cmax[:, dec] = np.minimum(cmax[:, dec], A[:, dec])
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
            raise InvalidQueryError(f"{what}: {unknown_feature(name, names)}", f"{what}.{name}")
        out[names.index(name)] = v
    return out


#: Most counterfactuals one query may ask for (``k``).
MAX_K = 1000


def make_options(
    engine: SearchEngine,
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
    if not isinstance(norm, str) or norm not in NORMS:
        raise InvalidQueryError(f"norm must be one of {sorted(NORMS)}, got {norm!r}", "norm")
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidQueryError(f"k must be an integer between 1 and {MAX_K}", "k")
    # The schema's defaults: built once per maps, norm and k (about 0.1 ms a query), then
    # shared by every query. Custom options copy only the arrays they change, so none
    # writes the shared ones (which stay writeable: a read-only flag would make numba
    # compile a second variant of every kernel).
    cache = engine.defaults
    base = cache.get((norm, int(k)))
    if base is None:
        base = cache.setdefault((norm, int(k)), _default_options(engine, norm, int(k)))
    if all(v is None for v in (weights, immutable, direction, bounds, group_costs)):
        return base  # the common case: no per-query work at all
    changes: dict[str, Any] = {}
    names = engine.feature_names
    if weights is not None:
        w = base.weights.copy()
        if isinstance(weights, Mapping):
            for j, v in _by_feature(names, weights, "weights").items():
                if base.gcol[j] >= 0:  # a one-hot column: its weight would go unused
                    g = base.group_names[int(base.gcol[j])]
                    raise InvalidQueryError(
                        f"{names[j]!r} is a column of the one-hot group {g!r}, whose switch of "
                        f"category costs the group's cost: set it with group_costs.{g}",
                        f"weights.{names[j]}")
                w[j] = _number(v, f"weight of {names[j]!r}", f"weights.{names[j]}")
        else:
            w = _number_array(weights, "weights")
            if w.shape != (engine.n_features,):
                raise InvalidQueryError(f"weights must have {engine.n_features} entries", "weights")
        _check_weights(w)
        changes.update(weights=w, scale=_typical_width(engine, w))
    if immutable is not None:
        if isinstance(immutable, str) or not isinstance(immutable, Sequence):
            raise InvalidQueryError("immutable must be a list of feature names", "immutable")
        imm = base.immutable.copy()
        for name in immutable:
            if name not in names:
                raise InvalidQueryError(f"immutable: {unknown_feature(name, names)}",
                                        f"immutable.{name}")
            imm[names.index(name)] = True
        changes["immutable"] = imm
    if direction is not None:
        dirs = base.direction.copy()
        for j, v in _by_feature(names, direction, "direction").items():
            if not isinstance(v, str) or v not in _DIRECTIONS:
                raise InvalidQueryError(
                    f"direction of {names[j]!r} must be any, increase or decrease",
                    f"direction.{names[j]}",
                )
            if v != "any" and base.gcol[j] == NOMINAL:
                raise InvalidQueryError(
                    f"{names[j]!r} is nominal: its codes have no order to increase or "
                    "decrease in (fix it with immutable, or restrict it with bounds)",
                    f"direction.{names[j]}",
                )
            want = _DIRECTIONS[v]
            if want and dirs[j] == -want:
                # the spec's one way and the query's other way: a restriction of a
                # restriction leaves the feature where it is (a query never lifts the spec's
                # direction, as it never lifts its immutables or bounds)
                imm = changes.setdefault("immutable", base.immutable.copy())
                imm[j] = True
            elif want:
                dirs[j] = want
        changes["direction"] = dirs
    if bounds is not None:
        lower, upper = base.lower.copy(), base.upper.copy()
        for j, v in _by_feature(names, bounds, "bounds").items():
            name = names[j]
            # a pair in order (not a set, not text) of numbers or None: "0.5" and True
            # are refused here as weights and group costs refuse them
            pair = (isinstance(v, Sequence | np.ndarray) and not isinstance(v, str | bytes)
                    and len(v) == 2)
            if not pair or not all(e is None or (isinstance(e, Real) and not isinstance(e, bool))
                                   for e in v):
                raise InvalidQueryError(
                    f"bounds of {name!r} must be [lower, upper] (numbers or null), got {v!r}",
                    f"bounds.{name}")
            try:
                lo_f = -np.inf if v[0] is None else float(v[0])
                hi_f = np.inf if v[1] is None else float(v[1])
            except OverflowError as exc:  # an integer past float64's range
                raise InvalidQueryError(
                    f"bounds of {name!r} must lie within float64's range", f"bounds.{name}"
                ) from exc
            if math.isnan(lo_f) or math.isnan(hi_f) or lo_f > hi_f:
                raise InvalidQueryError(
                    f"bounds of {name!r} must satisfy lower <= upper", f"bounds.{name}"
                )
            if engine.grid.view32 and (lo_f >= FLOAT32_OVERFLOW or hi_f <= -FLOAT32_OVERFLOW):
                # every such value reads as an infinity in float32, which the maps refuse
                # as input (the model's library refuses it, or reads it as no number)
                raise InvalidQueryError(
                    f"bounds of {name!r} admit no value the model can read: it reads features "
                    f"as float32, whose range ends at +-{FLOAT32_MAX:.8g}", f"bounds.{name}"
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
            # a number, as a weight must be ("1" and True were taken for 1)
            gcost[g] = _number(v, f"cost of group {gname!r}", f"group_costs.{gname}")
            if not math.isfinite(gcost[g]) or gcost[g] < 0:
                raise InvalidQueryError(
                    f"cost of group {gname!r} must be finite and >= 0", f"group_costs.{gname}"
                )
        changes["gcost"] = gcost
    return replace(base, **changes) if changes else base


_DIRECTIONS = {"any": 0, "increase": 1, "decrease": -1}


def _number(v: Any, what: str, field: str) -> float:
    """``v`` as a float, or :class:`InvalidQueryError` naming ``field`` (a string, a list,
    a complex, anything ``float`` refuses or would take for a number only by accident,
    like a bool). numpy's real scalars are :class:`numbers.Real` too."""
    if isinstance(v, bool) or not isinstance(v, Real):
        raise InvalidQueryError(f"{what} must be a number, got {v!r}", field)
    try:
        return float(v)
    except OverflowError:  # an integer past float64's range
        raise InvalidQueryError(f"{what} is beyond float64's range", field) from None


def _number_array(v: Any, field: str) -> np.ndarray:
    """A 1-d float64 array of numbers, or :class:`InvalidQueryError` naming ``field``."""
    try:
        a = np.asarray(v)
        ok = a.ndim == 1 and (a.dtype.kind in "iuf" or (a.dtype == object and all(
            not isinstance(e, bool) and isinstance(e, Real) for e in a)))
    except (TypeError, ValueError):  # ragged nesting
        ok = False
    if not ok:
        raise InvalidQueryError(f"{field} must be a list of numbers", field)
    try:
        return a.astype(np.float64)
    except OverflowError:  # an integer past float64's range
        raise InvalidQueryError(f"{field}: a number beyond float64's range", field) from None


def _check_weights(w: np.ndarray) -> None:
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise InvalidQueryError("weights must be finite and non-negative", "weights")


def _default_options(engine: SearchEngine, norm: str, k: int) -> QueryOptions:
    """The options a query without any gets: everything from the maps' schema."""
    schema = engine.schema
    w = schema.default_weights()
    _check_weights(w)
    groups = schema.groups()
    names = tuple(groups)
    costs = schema.default_group_costs()
    gcol = np.full(engine.n_features, -1, dtype=np.int64)
    for g, gname in enumerate(names):
        gcol[groups[gname]] = g
    gcol[[j for j, f in enumerate(schema) if f.type == "nominal"]] = NOMINAL
    sizes = [len(groups[g]) for g in names]
    return QueryOptions(
        norm=norm, weights=w, k=k,
        immutable=np.array([not f.mutable for f in schema], dtype=bool),
        direction=np.array([_DIRECTIONS[f.direction] for f in schema], dtype=np.int8),
        lower=engine.grid.dom_lower.copy(), upper=engine.grid.dom_upper.copy(),
        group_names=names, gcol=gcol,
        gstart=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        gcols=np.array([j for g in names for j in groups[g]], dtype=np.int64),
        gcost=np.array([costs[g] for g in names], dtype=np.float64),
        scale=_typical_width(engine, w),
    )


def _typical_width(engine: SearchEngine, weights: np.ndarray) -> float:
    """Median weighted width of the features' finite extent (domain bounds and thresholds),
    the scale of the first deepening bound (1.0 with the default weights 1/range)."""
    with np.errstate(over="ignore"):  # inf for weights near float64's end: refused later
        ww = [v for v in (weights * engine.widths).tolist() if v > 0]
    return statistics.median(ww) if ww else 1.0  # np.median costs ~50 us per query


__all__ = ["MAX_K", "NORM_NAMES", "QueryOptions", "categories", "make_options"]
