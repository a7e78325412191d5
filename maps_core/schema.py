"""Feature schema: what values each input may take, and how costly it is to change it.

The schema plays two roles.

* At build time it declares the *legal domain*. The partition only has to be faithful on
  inputs that can occur, so thresholds that are equivalent on that domain collapse: on an
  integer feature the splits ``x <= 1.5`` and ``x <= 1.9`` are the same test, and a binary
  feature needs at most one threshold. Thresholds outside ``[lower, upper]`` disappear.
  On Breast-Cancer (integer features 1..10) this shrinks the partition several-fold.
* At query time it supplies defaults: immutable features, one-way changes, and weights.
  The default weight of a feature is its explicit ``weight``; otherwise ``1 / (upper -
  lower)`` when both bounds are known, so that distances are unit-free; otherwise 1 (and
  1 for a nominal feature, whose every switch of code costs one weight).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .exceptions import SchemaError

FEATURE_TYPES = ("continuous", "integer", "binary", "categorical", "nominal")
DIRECTIONS = ("any", "increase", "decrease")


#: Binary exponent past which a weighted move ``w * |x' - x|`` is not measured: the search
#: adds such costs up (and squares them for l2, after a scale by a power of two), so a
#: weight times a feature's magnitude must stay below ``2**MAX_COST_EXPONENT``.
MAX_COST_EXPONENT = 1000
#: Longest feature or group name: names travel in URLs (``map.png?features=a,b``), headers
#: and logs, and the service caps model and class names the same.
MAX_NAME_LENGTH = 200


def control_character(text: str) -> str | None:
    """The first control character of ``text`` (C0, DEL or C1), or None: what no name may
    hold (a NUL or a newline could not be typed in the explorer page or a query string,
    and would split a log line)."""
    return next((c for c in text if ord(c) < 32 or 127 <= ord(c) < 160), None)


def _check_name(kind: str, name: object) -> None:
    """Refuse what cannot be a name: not a string, empty, longer than
    :data:`MAX_NAME_LENGTH`, or holding a control character (a NUL or a newline could not be
    typed in the explorer page or a query string, and would split a log line)."""
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{kind} name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise SchemaError(f"{kind} name {name[:40]!r}... has {len(name)} characters, more than "
                          f"{MAX_NAME_LENGTH}")
    bad = control_character(name)
    if bad is not None:
        raise SchemaError(f"{kind} name {name!r} holds the control character {bad!r}")


def _measurable(w: float, lo: float, hi: float) -> bool:
    """Whether ``w`` times twice the largest finite end of ``[lo, hi]`` (the longest move
    within the bounds) stays below ``2**MAX_COST_EXPONENT``. Exponents, since the product
    may overflow where the factors do not."""
    big = max((abs(v) for v in (lo, hi) if math.isfinite(v)), default=0.0)
    if w == 0 or big == 0:
        return True
    return math.frexp(w)[1] + math.frexp(big)[1] + 1 <= MAX_COST_EXPONENT


def _real(v: int | float) -> float:
    """``v`` as a float64; an integer past its range is infinite (and so refused where a
    finite number is due) rather than an ``OverflowError``."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


@dataclass(frozen=True)
class Feature:
    """One input column.

    Parameters
    ----------
    name : str
        Column name, unique within the schema.
    type : {"continuous", "integer", "binary", "categorical", "nominal"}
        ``categorical`` marks one dummy (0/1) column of a one-hot group named by ``group``.
        ``binary`` and ``categorical`` columns take values in {0, 1}. ``nominal`` marks
        one column of category codes, the integers ``lower..upper`` (both required), as a
        model with categorical splits reads them (LightGBM's ``categorical_feature``):
        moving to another code costs the feature's weight once, whatever the codes, and
        it has no direction.
    lower, upper : float or None
        Legal range (inclusive). ``None`` means unbounded on that side.
    group : str or None
        One-hot group name, required for ``categorical`` columns.
    mutable : bool
        Whether a counterfactual may change this feature (query-time default).
    direction : {"any", "increase", "decrease"}
        Allowed direction of change (query-time default).
    weight : float or None
        Cost per unit of change (per switch of a ``nominal`` feature); ``None`` derives
        it from the bounds (see module docs), and is 1 for a ``nominal`` feature.
    """

    name: str
    type: str = "continuous"
    lower: float | None = None
    upper: float | None = None
    group: str | None = None
    mutable: bool = True
    direction: str = "any"
    weight: float | None = None

    def __post_init__(self) -> None:
        _check_name("feature", self.name)
        # numpy's scalars (X[:, j].min() of an int column) are the numbers they hold; a
        # boolean is no bound or weight, and "no" is no boolean (it would read as True)
        for key in ("lower", "upper", "weight"):
            v = getattr(self, key)
            if isinstance(v, np.integer | np.floating):
                object.__setattr__(self, key, v.item())
            elif isinstance(v, bool | np.bool_):
                raise SchemaError(f"feature {self.name!r}: {key} must be a number or null, "
                                  f"not {v!r}")
        if isinstance(self.mutable, np.bool_):
            object.__setattr__(self, "mutable", bool(self.mutable))
        if not isinstance(self.mutable, bool):
            raise SchemaError(f"feature {self.name!r}: mutable must be true or false, not "
                              f"{self.mutable!r}")
        if self.group is not None:
            _check_name(f"feature {self.name!r}: group", self.group)
        if self.type not in FEATURE_TYPES:
            raise SchemaError(
                f"feature {self.name!r}: type must be one of {FEATURE_TYPES}, got {self.type!r}"
            )
        if self.direction not in DIRECTIONS:
            raise SchemaError(
                f"feature {self.name!r}: direction must be one of {DIRECTIONS}, "
                f"got {self.direction!r}"
            )
        for side in ("lower", "upper"):
            v = getattr(self, side)
            if v is not None and (not isinstance(v, int | float) or math.isnan(_real(v))):
                raise SchemaError(f"feature {self.name!r}: {side} must be a number or null")
        if self.lower is not None and self.upper is not None and self.lower > self.upper:
            raise SchemaError(f"feature {self.name!r}: lower {self.lower} > upper {self.upper}")
        if (self.lower is not None and _real(self.lower) == math.inf) or (
                self.upper is not None and _real(self.upper) == -math.inf):
            raise SchemaError(f"feature {self.name!r}: no number lies in its bounds "
                              f"[{self.lower}, {self.upper}]")
        if self.weight is not None and (
            not isinstance(self.weight, int | float)
            or not math.isfinite(_real(self.weight))
            or self.weight < 0
        ):
            raise SchemaError(f"feature {self.name!r}: weight must be a finite number >= 0")
        if self.type == "categorical" and not self.group:
            raise SchemaError(f"feature {self.name!r}: categorical features need a group")
        if self.type != "categorical" and self.group is not None:
            # a group is a one-hot group's columns; elsewhere it would be silently ignored
            raise SchemaError(f"feature {self.name!r}: only categorical (one-hot) columns take "
                              f"a group; a {self.type} feature cannot be in {self.group!r}")
        if self.type == "nominal":
            if self.lower is None or self.upper is None or not (
                    math.isfinite(_real(self.lower)) and math.isfinite(_real(self.upper))):
                raise SchemaError(f"feature {self.name!r}: a nominal feature needs finite "
                                  "lower and upper bounds (its first and last code)")
            if self.direction != "any":
                raise SchemaError(f"feature {self.name!r}: a nominal feature's codes have no "
                                  "order, so its direction must be 'any'")
        if self.type in ("binary", "categorical"):
            lo = 0.0 if self.lower is None else self.lower
            hi = 1.0 if self.upper is None else self.upper
            if lo < 0 or hi > 1:
                raise SchemaError(f"feature {self.name!r}: binary bounds must lie in [0, 1]")

    @property
    def is_integral(self) -> bool:
        """True when the legal values are integers (integer, binary, categorical)."""
        return self.type != "continuous"

    def domain(self) -> tuple[float, float]:
        """Legal closed range ``(lower, upper)`` with infinities, integers rounded inward."""
        lo = -math.inf if self.lower is None else _real(self.lower)
        hi = math.inf if self.upper is None else _real(self.upper)
        if self.type in ("binary", "categorical"):
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        if self.is_integral:
            lo, hi = math.ceil(lo) if math.isfinite(lo) else lo, (
                math.floor(hi) if math.isfinite(hi) else hi
            )
            if lo > hi:
                raise SchemaError(f"feature {self.name!r}: no integer lies in its bounds")
        return float(lo), float(hi)

    def default_weight(self) -> float:
        """Cost per unit change used when a query gives no weight."""
        if self.weight is not None:
            w = float(self.weight)
            if self.type != "nominal" and not _measurable(w, *self.domain()):
                raise SchemaError(
                    f"feature {self.name!r}: weight {w:g} times its values (up to "
                    f"{max(map(abs, self.domain())):g}) passes float64's range for distances "
                    "(about 1e301); declare a smaller weight")
            return w
        if self.type == "nominal":
            return 1.0  # a switch, as a one-hot group's default cost
        lo, hi = self.domain()
        if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            w = 1.0 / (0.5 * hi - 0.5 * lo) * 0.5  # halves first: hi - lo may overflow
            if not sys.float_info.min <= w < math.inf:
                # 1e-320 wide, or 2e308: the weight would be inf or lose its precision
                # (a subnormal), and every query would be refused or measured wrong
                raise SchemaError(
                    f"feature {self.name!r}: its range [{lo}, {hi}] is too narrow or too wide "
                    "for the default weight 1/range; declare a weight")
            return w
        return 1.0


@dataclass(frozen=True)
class FeatureSchema:
    """An ordered tuple of :class:`Feature`, one per model input column."""

    features: tuple[Feature, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise SchemaError(f"duplicate feature names: {dup}")
        groups: dict[str, int] = {}
        for f in self.features:
            if f.type == "categorical":
                assert f.group is not None
                groups[f.group] = groups.get(f.group, 0) + 1
        for g, n in groups.items():
            if n < 2:
                raise SchemaError(f"one-hot group {g!r} needs at least two categorical columns")

    # -- construction -------------------------------------------------------------------
    @classmethod
    def default(cls, n_features: int, names: Sequence[str] | None = None) -> FeatureSchema:
        """All-continuous, unbounded schema named ``x0..x{m-1}`` (or ``names``)."""
        if names is None:
            names = [f"x{i}" for i in range(n_features)]
        if len(names) != n_features:
            raise SchemaError(f"expected {n_features} feature names, got {len(names)}")
        return cls(tuple(Feature(name=str(n)) for n in names))

    @classmethod
    def from_dicts(cls, items: Iterable[Mapping[str, Any]]) -> FeatureSchema:
        """Build from JSON-like dicts with the fields of :class:`Feature`."""
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise SchemaError(f"the features must be a list of objects, not {type(items).__name__}")
        feats = []
        allowed = set(Feature.__dataclass_fields__)
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise SchemaError(f"features[{i}] must be an object", feature=i)
            unknown = set(item) - allowed
            if unknown:
                raise SchemaError(f"features[{i}]: unknown keys {sorted(unknown)}", feature=i)
            try:
                feats.append(Feature(**dict(item)))
            except SchemaError as exc:
                raise SchemaError(str(exc), feature=i) from None
            except TypeError as exc:
                raise SchemaError(f"features[{i}]: {exc}", feature=i) from exc
        return cls(tuple(feats))

    def to_dicts(self) -> list[dict[str, Any]]:
        """JSON-serialisable list of feature dicts (inverse of :meth:`from_dicts`)."""
        return [asdict(f) for f in self.features]

    @classmethod
    def infer(
        cls,
        X: np.ndarray,
        names: Sequence[str] | None = None,
        *,
        bounds: bool = True,
    ) -> FeatureSchema:
        """Infer types and bounds from training data.

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_features)
            Training inputs (numeric).
        names : sequence of str, optional
            Column names; defaults to ``x0..``.
        bounds : bool
            Record the observed min/max as the legal range.

        Columns whose values are all in {0, 1} become ``binary``, all-integral columns
        ``integer``, anything else ``continuous``.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise SchemaError("X must be two-dimensional")
        if names is None:
            names = [f"x{i}" for i in range(X.shape[1])]
        feats = []
        for j, name in enumerate(names):
            col = X[:, j]
            col = col[np.isfinite(col)]
            if col.size and np.all((col == 0) | (col == 1)):
                ftype = "binary"
            elif col.size and np.all(col == np.round(col)):
                ftype = "integer"
            else:
                ftype = "continuous"
            lo = float(col.min()) if (bounds and col.size) else None
            hi = float(col.max()) if (bounds and col.size) else None
            if ftype == "binary":
                lo, hi = 0.0, 1.0
            feats.append(Feature(name=str(name), type=ftype, lower=lo, upper=hi))
        return cls(tuple(feats))

    # -- accessors ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.features)

    def __iter__(self) -> Iterator[Feature]:
        return iter(self.features)

    def __getitem__(self, i: int) -> Feature:
        return self.features[i]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.features]

    def index(self, name: str) -> int:
        """Position of a feature by name; raises :class:`SchemaError` when unknown."""
        for i, f in enumerate(self.features):
            if f.name == name:
                return i
        raise SchemaError(f"unknown feature {name!r}")

    def domains(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-feature legal ranges, arrays of shape (n_features,) with infinities."""
        lo = np.empty(len(self), dtype=np.float64)
        hi = np.empty(len(self), dtype=np.float64)
        for i, f in enumerate(self.features):
            try:
                lo[i], hi[i] = f.domain()
            except SchemaError as exc:
                raise SchemaError(str(exc), feature=i) from None
        return lo, hi

    def integral_mask(self) -> np.ndarray:
        """Boolean array of shape (n_features,): True where legal values are integers."""
        return np.array([f.is_integral for f in self.features], dtype=bool)

    def default_weights(self) -> np.ndarray:
        """Array of shape (n_features,) of default per-unit costs."""
        out = np.empty(len(self), dtype=np.float64)
        for i, f in enumerate(self.features):
            try:
                out[i] = f.default_weight()
            except SchemaError as exc:
                raise SchemaError(str(exc), feature=i) from None
        return out

    def check_weights(self, magnitudes: np.ndarray) -> None:
        """Refuse a declared weight whose product with twice its feature's largest
        threshold magnitude (``magnitudes``, shape (n_features,), the grid's) passes
        ``2**MAX_COST_EXPONENT``: every query would then be refused for it (a weight of
        1e308 on an unbounded feature was accepted, and no query could be answered).

        Raises
        ------
        SchemaError
            Naming the feature, with its position.
        """
        for i, f in enumerate(self.features):
            if f.weight is None or f.type == "nominal":
                continue
            w, big = float(f.weight), float(magnitudes[i])
            if not _measurable(w, -big, big):
                raise SchemaError(
                    f"feature {f.name!r}: weight {w:g} times the model's thresholds on it (up "
                    f"to {big:g}) passes float64's range for distances (about 1e301); declare "
                    "a smaller weight", feature=i)

    def default_group_costs(self) -> dict[str, float]:
        """Cost of switching category per one-hot group: the largest ``weight`` declared
        on the group's columns, else 1 (the cost of flipping a binary feature, whose
        default weight is 1 / (1 - 0))."""
        out: dict[str, float] = {}
        for g, cols in self.groups().items():
            ws = [float(w) for j in cols if (w := self.features[j].weight) is not None]
            out[g] = max(ws) if ws else 1.0
        return out

    def groups(self) -> dict[str, list[int]]:
        """One-hot groups: group name -> column indices."""
        out: dict[str, list[int]] = {}
        for i, f in enumerate(self.features):
            if f.type == "categorical":
                assert f.group is not None
                out.setdefault(f.group, []).append(i)
        return out

    def with_names(self, names: Sequence[str]) -> FeatureSchema:
        """Copy with renamed features."""
        return FeatureSchema(tuple(replace(f, name=n) for f, n in zip(self.features, names, strict=True)))


def made_up_names(names: Sequence[str] | None) -> bool:
    """Whether a model's feature names say nothing about its columns: absent, or made up
    by its library when it was fitted without any (LightGBM's ``Column_0``...)."""
    return names is None or all(str(n) == f"Column_{i}" for i, n in enumerate(names))


def lightgbm_name(name: str) -> str:
    """The name LightGBM gives a feature named ``name``: it writes whitespace as ``_``."""
    return re.sub(r"\s", "_", name)


def unknown_feature(name: Any, names: Sequence[str]) -> str:
    """"unknown feature 'a b'", with a hint when the model names it otherwise: LightGBM
    writes whitespace in feature names as ``_`` (a DataFrame column ``'a b'`` is the
    model's ``'a_b'``), so the names a client trained with are not the model's."""
    text = f"unknown feature {name!r}"
    if isinstance(name, str):
        alias = lightgbm_name(name)
        if alias != name and alias in names:
            text += f" (the model names it {alias!r}: LightGBM writes whitespace in names as '_')"
    return text


def first_misnamed(names: Sequence[str], model_names: Sequence[str] | None) -> int | None:
    """Position of the first column that ``names`` (a schema's, or an input's) names
    otherwise than the model does (``model_names``, in its order), or None when they agree
    or the model's names are made up (:func:`made_up_names`)."""
    if made_up_names(model_names):
        return None
    assert model_names is not None
    for i, (a, b) in enumerate(zip(names, model_names, strict=False)):
        if a != str(b):
            return i
    return None
