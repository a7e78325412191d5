"""The constrained-query harness: declared columns and their mixed-type data, an
independent brute force under constraints, and the checks of one answer. Shared by
``tests/core/test_constraints.py`` (scikit-learn), ``tests/core/test_library_constraints.py``
(XGBoost, LightGBM, HistGradientBoosting) and ``scripts/fuzz_mixed.py``.

The brute force uses no maps_core code: it enumerates every cell of the threshold grid on
the real line, as the model's library splits it (:func:`tests.brute_force.cell_grid`),
labels each with ``model.predict``, intersects it with the constraint box and rounds it
inward to the legal values. ``check_result`` runs one query and checks its optimality,
validity (``model.predict`` on every returned point, region corner and random points
inside) and constraints.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from sklearn.ensemble import ExtraTreesClassifier, GradientBoostingClassifier, RandomForestClassifier
from sklearn.tree import DecisionTreeClassifier

from maps_core import CounterfactualMaps, Feature, FeatureSchema
from tests.brute_force import cell_grid

NORMS = ["l1", "l2", "linf", "l0"]
OPTIONS = ["none", "immutable", "direction", "bounds", "combined"]
FAR = 50.0  # how far past its finite end (or x) an unbounded region end is probed


# --------------------------------------------------------------------------------------
# models and schemas
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Col:
    """A column as the test declares it (the brute force reads these, never maps_core)."""

    name: str
    type: str
    lower: float | None = None
    upper: float | None = None
    group: str | None = None

    @property
    def integral(self) -> bool:
        return self.type != "continuous"

    def domain(self) -> tuple[float, float]:
        lo = -np.inf if self.lower is None else float(self.lower)
        hi = np.inf if self.upper is None else float(self.upper)
        if self.type in ("binary", "categorical"):
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        return lo, hi


PLAIN = [
    Col("c0", "continuous"),
    Col("i1", "integer", 0, 12),
    Col("b2", "binary", 0, 1),
    Col("c3", "continuous", -3.0, 3.0),
    Col("i4", "integer", -6, 6),
]
COLORS = ["red", "green", "blue"]
GROUPED = [
    Col("c0", "continuous"),
    Col("i1", "integer", 0, 12),
    Col("b2", "binary", 0, 1),
    Col("c3", "continuous", -3.0, 3.0),
    *[Col(f"color={c}", "categorical", 0, 1, group="color") for c in COLORS],
]

FACTORIES = {
    "dt": lambda s, c: DecisionTreeClassifier(max_depth=3, random_state=s),
    "rf": lambda s, c: RandomForestClassifier(n_estimators=8, max_depth=3, random_state=s),
    "et": lambda s, c: ExtraTreesClassifier(n_estimators=10, max_depth=3, random_state=s),
    "gb": lambda s, c: GradientBoostingClassifier(
        n_estimators=5 if c == 2 else 3, max_depth=3, random_state=s
    ),
}


def make_data(cols: list[Col], n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mixed-type data inside the declared domains, labels from a noisy score."""
    rng = np.random.default_rng(seed)
    n = 300
    columns: dict[str, np.ndarray] = {
        "c0": rng.normal(0, 1.5, n),
        "i1": rng.integers(0, 13, n).astype(float),
        "b2": rng.integers(0, 2, n).astype(float),
        "c3": np.clip(rng.normal(0, 1.2, n), -3, 3),
        "i4": rng.integers(-6, 7, n).astype(float),
    }
    cat = rng.integers(0, len(COLORS), n)
    for k, c in enumerate(COLORS):
        columns[f"color={c}"] = (cat == k).astype(float)
    X = np.column_stack([columns[c.name] for c in cols])
    score = (0.9 * columns["c0"] + 0.35 * (columns["i1"] - 6) + 1.1 * columns["b2"]
             - 0.8 * columns["c3"] + rng.normal(0, 0.6, n))
    if any(c.group for c in cols):
        score += np.array([-1.4, 0.2, 1.2])[cat]
    else:
        score += 0.3 * columns["i4"]
    y = np.digitize(score, np.quantile(score, np.linspace(0, 1, n_classes + 1)[1:-1]))
    return X, y


def schema_of(cols: list[Col]) -> FeatureSchema:
    return FeatureSchema(tuple(
        Feature(name=c.name, type=c.type, lower=c.lower, upper=c.upper, group=c.group) for c in cols
    ))


# --------------------------------------------------------------------------------------
# the independent brute force
# --------------------------------------------------------------------------------------
def constraint_box(names: list[str], lower: np.ndarray, upper: np.ndarray, x: np.ndarray,
                   opts: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The box a query's options allow (``bounds``, ``direction``, ``immutable``, as the
    API names them; features by ``names``) within the domain ``lower``, ``upper`` (shapes
    (m,)), around ``x`` (shape (m,)): (cmin, cmax), shapes (m,)."""
    cmin, cmax = np.array(lower, dtype=float), np.array(upper, dtype=float)
    for name, (lo, hi) in opts.get("bounds", {}).items():
        j = names.index(name)
        cmin[j] = max(cmin[j], -np.inf if lo is None else lo)
        cmax[j] = min(cmax[j], np.inf if hi is None else hi)
    for name, d in opts.get("direction", {}).items():
        j = names.index(name)
        if d == "increase":
            cmin[j] = max(cmin[j], x[j])
        elif d == "decrease":
            cmax[j] = min(cmax[j], x[j])
    for name in opts.get("immutable", []):
        j = names.index(name)
        cmin[j], cmax[j] = max(cmin[j], x[j]), min(cmax[j], x[j])
    return cmin, cmax


@dataclass
class Cells:
    """Feasible target cells of one query, clipped to the constraints."""

    dist: np.ndarray  # (n,) distance (l0: number of changes)
    tie: np.ndarray  # (n,) weighted l1 (the l0 tie-break)
    witness: np.ndarray  # (n, m) a legal point of the clipped cell nearest to x
    label: np.ndarray  # (n,) class index


class BruteForce:
    """Every cell of the threshold grid on the real line, labelled by ``model.predict`` at a
    point inside (the model is constant on a cell; :func:`tests.brute_force.cell_grid`,
    which reads the splits and their rule from the model's library), and the feasible
    target cells of a query under the columns' domains, integers, one-hot groups and
    constraints."""

    def __init__(self, model: Any, cols: list[Col]) -> None:
        self.model, self.cols = model, cols
        grid = cell_grid(model, len(cols), [c.integral for c in cols],
                         [c.domain() for c in cols])
        self.lo, self.hi, self.label = grid.lo, grid.hi, grid.label
        self.lo_open, self.hi_open = grid.lo_open, grid.hi_open
        self.integral = np.array([c.integral for c in cols])
        # nominal columns: codes, and another code costs the weight once
        self.nominal = np.array([c.type == "nominal" for c in cols])
        self.dom = np.array([c.domain() for c in cols])
        groups: dict[str, list[int]] = {}
        for j, c in enumerate(cols):
            if c.group:
                groups.setdefault(c.group, []).append(j)
        self.groups = groups
        self.in_group = np.zeros(len(cols), dtype=bool)
        self._pred: dict[bytes, int] = {}
        for js in groups.values():
            self.in_group[js] = True

    def predict_index(self, x: np.ndarray) -> int:
        """Class index of ``model.predict(x)`` (memoised: queries repeat across targets)."""
        key = x.tobytes()
        if key not in self._pred:
            self._pred[key] = int(np.searchsorted(self.model.classes_, self.model.predict(x[None])[0]))
        return self._pred[key]

    def box(self, x: np.ndarray, opts: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Constraint box: legal domain, user bounds, one-way changes, immutable features."""
        return constraint_box([c.name for c in self.cols], self.dom[:, 0], self.dom[:, 1], x,
                              opts)

    def solve(self, x: np.ndarray, targets: list[int], opts: dict[str, Any], w: np.ndarray,
              norm: str, group_costs: dict[str, float] | None = None) -> Cells:
        keep = np.isin(self.label, targets)
        lo, hi = self.lo[keep], self.hi[keep]
        cmin, cmax = self.box(x, opts)
        a_open = self.lo_open[keep] & (lo >= cmin)  # the cell's own open end survives
        b_open = self.hi_open[keep] & (hi <= cmax)
        a = np.maximum(lo, cmin)
        b = np.minimum(hi, cmax)
        integ = self.integral
        a = np.where(integ, np.ceil(a), a)
        b = np.where(integ, np.floor(b), b)
        ok = np.where(a_open | b_open, a < b, a <= b)
        feasible = ok.all(axis=1)
        changed = (x < a) | (x > b) | (a_open & (x == a)) | (b_open & (x == b))
        delta = np.where(x < a, a - x, np.where(x > b, x - b, 0.0)) * w
        delta = np.where(self.nominal, np.where(changed, w, 0.0), delta)
        plain = ~self.in_group
        terms = [delta[:, plain]]
        n_changed = changed[:, plain].sum(axis=1)
        witness = np.clip(x, a, b)
        witness = np.where(a_open & (witness == a), np.nextafter(a, np.inf), witness)
        witness = np.where(b_open & (witness == b), np.nextafter(b, -np.inf), witness)
        for g, js in self.groups.items():
            allow1 = (a[:, js] <= 1) & (b[:, js] >= 1)
            allow0 = (a[:, js] <= 0) & (b[:, js] >= 0)
            n0 = allow0.sum(axis=1)
            # category c is reachable iff column c may be 1 and every other column 0
            reach = allow1 & ((n0[:, None] - allow0) == len(js) - 1)
            own = int(np.argmax(x[js]))
            stay = reach[:, own]
            feasible &= reach.any(axis=1)
            cost = 1.0 if group_costs is None else group_costs.get(g, 1.0)
            terms.append(np.where(stay, 0.0, cost)[:, None])
            n_changed = n_changed + ~stay
            chosen = np.where(stay, own, np.argmax(reach, axis=1))
            witness[:, js] = (np.arange(len(js))[None, :] == chosen[:, None]).astype(float)
        t = np.hstack(terms)
        tie = t.sum(axis=1)
        if norm == "l1":
            dist = tie
        elif norm == "l2":
            dist = np.sqrt((t**2).sum(axis=1))
        elif norm == "linf":
            dist = t.max(axis=1, initial=0.0)
        else:
            dist = n_changed.astype(float)
        return Cells(dist[feasible], tie[feasible], witness[feasible], self.label[keep][feasible])


# --------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------
def group_terms(bf: BruteForce, x: np.ndarray, p: np.ndarray, w: np.ndarray,
                group_costs: dict[str, float] | None) -> tuple[np.ndarray, int]:
    """Per-feature/per-group cost terms of moving from ``x`` to ``p``, and the change count."""
    plain = ~bf.in_group
    terms = list(np.where(bf.nominal, w * (p != x), w * np.abs(p - x))[plain])
    n = int(np.sum(p[plain] != x[plain]))
    for g, js in bf.groups.items():
        if not np.array_equal(p[js], x[js]):
            terms.append(1.0 if group_costs is None else group_costs.get(g, 1.0))
            n += 1
    return np.array(terms), n


def point_cost(bf: BruteForce, x: np.ndarray, p: np.ndarray, w: np.ndarray, norm: str,
               group_costs: dict[str, float] | None) -> float:
    t, n = group_terms(bf, x, p, w, group_costs)
    if norm == "l0":
        return float(n)
    if norm == "l1":
        return float(t.sum())
    if norm == "l2":
        return float(np.sqrt((t**2).sum()))
    return float(t.max(initial=0.0))


def region_ends(region: Any, f: int, x_f: float, integral: bool) -> tuple[float, float]:
    """Smallest and largest values of feature ``f`` that the region holds (finite): an open
    end steps inwards to the next float64. (Not to the next float32: a region clipped at x
    by a constraint can be narrower than a float32 step, and a real end where a float32
    view changes sides lies halfway between two float32, so the next float64 is already
    read as the float32 inside.)"""
    lo, hi = float(region.lower[f]), float(region.upper[f])
    if np.isfinite(lo) and not region.lower_closed[f]:
        lo = lo + 1 if integral else float(np.nextafter(lo, np.inf))
    if np.isfinite(hi) and not region.upper_closed[f]:
        hi = hi - 1 if integral else float(np.nextafter(hi, -np.inf))
    if not np.isfinite(lo):
        lo = (hi if np.isfinite(hi) else x_f) - FAR
    if not np.isfinite(hi):
        hi = max(lo, x_f) + FAR
    return lo, hi


def legal_points_of_region(bf: BruteForce, region: Any, x: np.ndarray, rng: np.random.Generator,
                           n_random: int) -> np.ndarray:
    """Every corner of the region (each end of each feature, every reachable category of
    each group) and ``n_random`` random legal points inside it."""
    m = len(bf.cols)
    ends = [region_ends(region, f, x[f], bf.integral[f]) for f in range(m)]
    plain = [f for f in range(m) if not bf.in_group[f]]
    choices: list[list[tuple[list[int], list[float]]]] = []
    for f in plain:
        choices.append([([f], [v]) for v in sorted(set(ends[f]))])
    for js in bf.groups.values():
        cats = _reachable(region, js)
        assert cats, "a returned region holds no valid one-hot vector"
        choices.append([(js, [1.0 if i == k else 0.0 for i in range(len(js))]) for k in cats])
    pts = []
    for combo in itertools.product(*choices):
        p = np.empty(m)
        for js, vals in combo:
            p[js] = vals
        pts.append(p)
    for _ in range(n_random):
        p = np.empty(m)
        for f in plain:
            lo, hi = ends[f]
            p[f] = rng.integers(int(lo), int(hi) + 1) if bf.integral[f] else rng.uniform(lo, hi)
        for js, vals in (c[rng.integers(len(c))] for c in choices[len(plain):]):
            p[js] = vals
        pts.append(p)
    return np.array(pts)


def _reachable(region: Any, js: list[int]) -> list[int]:
    def holds(j: int, v: float) -> bool:
        lo_ok = v >= region.lower[j] if region.lower_closed[j] else v > region.lower[j]
        hi_ok = v <= region.upper[j] if region.upper_closed[j] else v < region.upper[j]
        return bool(lo_ok and hi_ok)

    return [k for k, j in enumerate(js) if holds(j, 1.0) and all(holds(i, 0.0) for i in js if i != j)]


def assert_legal_and_constrained(bf: BruteForce, P: np.ndarray, cmin: np.ndarray,
                                 cmax: np.ndarray, x: np.ndarray, opts: dict[str, Any]) -> None:
    P = np.atleast_2d(P)
    assert np.all(P >= cmin) and np.all(P <= cmax), "a point leaves the constraint box"
    names = [c.name for c in bf.cols]
    for name in opts.get("immutable", []):
        assert np.all(P[:, names.index(name)] == x[names.index(name)]), f"{name} changed"
    integ = bf.integral
    assert np.all(P[:, integ] == np.round(P[:, integ])), "an integral feature is not an integer"
    for g, js in bf.groups.items():
        assert np.all(np.isin(P[:, js], (0.0, 1.0))), g
        assert np.all(P[:, js].sum(axis=1) == 1), f"group {g} is not one-hot"


def region_distance(bf: BruteForce, region: Any, x: np.ndarray, w: np.ndarray, norm: str,
                    group_costs: dict[str, float] | None) -> float:
    """Infimum distance from x to the region (independent of the engine's arithmetic)."""
    lo, hi = np.asarray(region.lower), np.asarray(region.upper)
    inside = (np.where(region.lower_closed, x >= lo, x > lo)
              & np.where(region.upper_closed, x <= hi, x < hi))
    delta = np.where(x < lo, lo - x, np.where(x > hi, x - hi, 0.0)) * w
    delta = np.where(bf.nominal, np.where(inside, 0.0, w), delta)  # another code: the weight once
    plain = ~bf.in_group
    terms = list(delta[plain])
    n = int(np.sum(~inside[plain]))
    for g, js in bf.groups.items():
        if int(np.argmax(x[js])) not in _reachable(region, js):
            terms.append(1.0 if group_costs is None else group_costs.get(g, 1.0))
            n += 1
    t = np.array(terms)
    return {"l0": float(n), "l1": float(t.sum()), "l2": float(np.sqrt((t**2).sum())),
            "linf": float(t.max(initial=0.0))}[norm]


def check_result(maps: CounterfactualMaps, bf: BruteForce, x: np.ndarray, target: Any,
                 opts: dict[str, Any], w: np.ndarray, norm: str, rng: np.random.Generator,
                 group_costs: dict[str, float] | None = None, k: int = 1) -> Any:
    """Run one query and check it against the brute force; returns the result."""
    model = bf.model
    classes = list(model.classes_)
    kw: dict[str, Any] = dict(opts)
    if group_costs is not None:
        kw["group_costs"] = group_costs
    res = maps.counterfactual(x, target, norm=norm, weights=w, k=k, **kw)
    pred = bf.predict_index(x)
    assert res.prediction == classes[pred]
    targets = [classes.index(target)] if target is not None else [
        c for c in range(len(classes)) if c != pred]
    cells = bf.solve(x, targets, opts, w, norm, group_costs)
    where = f"x={x.tolist()} target={target} norm={norm} opts={opts} gc={group_costs}"
    if cells.dist.size == 0:
        assert res.feasible is False, f"brute force finds nothing but the engine answers: {where}"
        assert isinstance(res.reason, str) and res.reason.strip(), where
        assert res.best is None and res.counterfactuals == ()
        return res
    assert res.feasible is True, f"infeasible, brute force optimum {cells.dist.min()}: {where}"
    assert res.reason is None
    best = res.best
    want = float(cells.dist.min())
    assert abs(best.distance - want) <= 1e-9, (best.distance, want, where)
    if norm == "l0":
        # ties on the number of changes are broken by the weighted l1 distance
        tie = float(cells.tie[cells.dist == want].min())
        t, n = group_terms(bf, x, best.x, w, group_costs)
        assert n == want, (n, want, where)
        assert float(t.sum()) == pytest.approx(tie, rel=1e-6, abs=1e-5), where
    cmin, cmax = bf.box(x, opts)
    probes, wanted = [], []
    for cf in res.counterfactuals:
        assert cf.target != res.prediction
        if target is not None:
            assert cf.target == target
        assert_legal_and_constrained(bf, cf.x, cmin, cmax, x, opts)
        assert cf.region.contains(cf.x)
        got = point_cost(bf, x, cf.x, w, norm, group_costs)
        assert cf.counterfactual_distance == pytest.approx(got, rel=1e-9, abs=1e-12)
        assert cf.counterfactual_distance == pytest.approx(cf.distance, rel=1e-5, abs=1e-5)
        # the region is clipped to the constraints: its corners and random points inside it
        # satisfy them and get the target decision
        P = legal_points_of_region(bf, cf.region, x, rng, n_random=12)
        assert_legal_and_constrained(bf, P, cmin, cmax, x, opts)
        assert region_distance(bf, cf.region, x, w, norm, group_costs) == pytest.approx(
            cf.distance, abs=1e-9), where
        probes += [cf.x[None], P]
        wanted += [cf.target] * (1 + len(P))
    # validity: the model itself (one call for every answer, corner and random point)
    P = np.vstack(probes)
    labels = model.predict(P)
    bad = labels != np.array(wanted, dtype=labels.dtype)
    assert not bad.any(), (P[bad][:3], where)
    return res


def random_options(kind: str, cols: list[Col], x: np.ndarray, rng: np.random.Generator) -> dict:
    """Seeded options of one kind; bounds may exclude x (the answer must then move)."""
    plain = [j for j, c in enumerate(cols) if not c.group]
    opts: dict[str, Any] = {}
    if kind in ("immutable", "combined"):
        n = 2 if kind == "immutable" else 1
        opts["immutable"] = [cols[j].name for j in rng.choice(plain, n, replace=False)]
    if kind in ("direction", "combined"):
        free = [j for j in plain if cols[j].name not in opts.get("immutable", [])]
        picked = rng.choice(free, 3 if kind == "direction" else 2, replace=False)
        opts["direction"] = {cols[j].name: str(rng.choice(["increase", "decrease"])) for j in picked}
    if kind in ("bounds", "combined"):
        bounds: dict[str, list[float | None]] = {}
        for j in rng.choice(plain, 3 if kind == "bounds" else 2, replace=False):
            c = cols[j]
            if c.type == "binary":
                v = float(rng.integers(0, 2))
                bounds[c.name] = [v, v] if rng.random() < 0.5 else [0.0, 1.0]
                continue
            span = 2.0 if c.type == "continuous" else 3.0
            lo: float | None = x[j] - rng.uniform(0, span)
            hi: float | None = x[j] + rng.uniform(0, span)
            if rng.random() < 0.25:  # x outside the bounds
                lo, hi = x[j] + rng.uniform(0.2, 1.0) * span, x[j] + 2 * span
            side = rng.random()
            if side < 0.2:
                lo = None
            elif side < 0.4:
                hi = None
            bounds[c.name] = [lo, hi]
        opts["bounds"] = bounds
    return opts


# --------------------------------------------------------------------------------------
# suites
# --------------------------------------------------------------------------------------
@dataclass
class Suite:
    model: Any
    X: np.ndarray
    cols: list[Col]
    maps: CounterfactualMaps
    bf: BruteForce

    def queries(self, rng: np.random.Generator, n_rows: int = 2) -> np.ndarray:
        """A few training rows and one random legal point."""
        rows = self.X[rng.choice(len(self.X), n_rows, replace=False)]
        p = self.X[rng.integers(len(self.X))].copy()
        for j, c in enumerate(self.cols):
            if c.group:
                continue
            lo, hi = c.domain()
            lo, hi = max(lo, -4.0), min(hi, 4.0)
            if c.integral:
                p[j] = rng.integers(int(np.ceil(lo)), int(np.floor(hi)) + 1)
            else:
                p[j] = rng.uniform(lo, hi)
        return np.vstack([rows, p])

    def targets(self, x: np.ndarray) -> list[Any]:
        pred = self.bf.predict_index(x)
        return [None] + [c for i, c in enumerate(self.model.classes_) if i != pred]


def make_suite(kind: str, n_classes: int, cols: list[Col], seed: int = 3) -> Suite:
    X, y = make_data(cols, n_classes, seed)
    model = FACTORIES[kind](seed, n_classes).fit(X, y)
    maps = CounterfactualMaps.build(model, schema_of(cols))
    return Suite(model, X, cols, maps, BruteForce(model, cols))


def seed_of(*parts: Any) -> int:
    return sum((i + 1) * sum(map(ord, str(p))) for i, p in enumerate(parts))
