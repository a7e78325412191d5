"""Actionable recourse (issue 4): constrained queries against an independent brute force.

Every option -- ``immutable``, ``direction``, ``bounds``, legal values (integer, binary,
one-hot groups with per-group switching costs), the norms ``l0``/``l1``/``l2``/``linf`` with
per-feature weights, and ``k`` -- is checked three ways on small forests:

* optimality: the certified distance equals the optimum of a brute force that uses no
  maps_core code (it enumerates every cell of the threshold grid on the real line, as the
  model's library splits it, labels each with ``model.predict``, intersects it with the
  constraint box and rounds it inward to the legal values);
* validity: ``model.predict`` gives the target on every returned point, on the corners of
  every returned region and on random points inside it;
* constraints: they hold on every returned point and on every corner of its region.

The brute force, the data and the checks of one answer live in ``tests.recourse``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.tree import DecisionTreeClassifier

from maps_core import (
    BudgetExceededError,
    CounterfactualMaps,
    Feature,
    FeatureSchema,
    InvalidQueryError,
)
from tests.library_splits import f32_floor, raw_thresholds
from tests.recourse import (
    COLORS,
    FACTORIES,
    GROUPED,
    NORMS,
    OPTIONS,
    PLAIN,
    BruteForce,
    Suite,
    assert_legal_and_constrained,
    check_result,
    legal_points_of_region,
    make_data,
    make_suite,
    point_cost,
    random_options,
    schema_of,
    seed_of,
)

SUITES = [(k, c) for k in sorted(FACTORIES) for c in (2, 3)]


@pytest.fixture(scope="module", params=SUITES, ids=lambda p: f"{p[0]}-{p[1]}cls")
def suite(request: pytest.FixtureRequest) -> Suite:
    return make_suite(*request.param, PLAIN)


@pytest.fixture(scope="module", params=[("rf", 2), ("gb", 3), ("et", 3)],
                ids=lambda p: f"{p[0]}-{p[1]}cls")
def grouped(request: pytest.FixtureRequest) -> Suite:
    return make_suite(*request.param, GROUPED, seed=5)


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("norm", NORMS)
def test_optimal_valid_and_constrained(suite: Suite, norm: str, option: str) -> None:
    """Certified distance = brute-force optimum under the constraints; every answer and
    its region are valid and satisfy the constraints; infeasible requests say why."""
    rng = np.random.default_rng(seed_of(norm, option, suite.model))
    n_feasible = 0
    for x in suite.queries(rng):
        w = rng.uniform(0.2, 2.0, size=x.shape[0])
        opts = random_options(option, suite.cols, x, rng)
        for target in suite.targets(x):
            res = check_result(suite.maps, suite.bf, x, target, opts, w, norm, rng)
            n_feasible += res.feasible
    if option in ("none", "direction"):
        assert n_feasible > 0  # the suite exercises answers, not only refusals


@pytest.mark.parametrize("norm", NORMS)
def test_k_best_under_constraints(suite: Suite, norm: str) -> None:
    """k best: sorted, distinct regions, the first optimal, and no target cell closer than
    the k-th answer outside the returned regions (they are the k nearest rectangles)."""
    rng = np.random.default_rng(seed_of("k", norm))
    k = 4
    for x in suite.queries(rng, n_rows=2):
        w = rng.uniform(0.2, 2.0, size=x.shape[0])
        opts = random_options("direction", suite.cols, x, rng)
        res = check_result(suite.maps, suite.bf, x, None, opts, w, norm, rng, k=k)
        if not res.feasible:
            continue
        cfs = res.counterfactuals
        d = [c.distance for c in cfs]
        assert d == sorted(d) and 1 <= len(d) <= k
        boxes = {(tuple(c.region.lower), tuple(c.region.upper)) for c in cfs}
        assert len(boxes) == len(cfs), "two answers share a region"
        pred = int(np.searchsorted(suite.model.classes_, res.prediction))
        cells = suite.bf.solve(x, [c for c in range(len(suite.model.classes_)) if c != pred],
                               opts, w, norm)
        # the j-th answer comes from its own rectangle, so from a distinct cell
        ranked = np.sort(cells.dist)
        for j, dj in enumerate(d):
            assert dj >= ranked[j] - 1e-9
        limit = d[-1] - 1e-9 if len(d) == k else np.inf
        for p in cells.witness[cells.dist < limit]:
            assert any(c.region.contains(p) for c in cfs), (
                f"a target point at distance < {d[-1]} lies outside every returned region: {p}")


def test_everything_immutable_is_infeasible(suite: Suite) -> None:
    names = [c.name for c in suite.cols]
    for x in suite.X[:5]:
        res = suite.maps.counterfactual(x, immutable=names)
        assert res.feasible is False and res.best is None
        assert isinstance(res.reason, str) and res.reason.strip()
        assert res.prediction == suite.model.predict(x[None])[0]
        others = [c for c in suite.model.classes_ if c != res.prediction]
        assert sorted(res.unreachable) == others
        # no target asked for: the answer is about the other class when there is one only
        # (it was None, while the reason named the class)
        assert res.target == (others[0] if len(others) == 1 else None), res.target
        assert str(others[0]) in res.reason


def test_bounds_excluding_every_target_point_are_infeasible(suite: Suite) -> None:
    """Bounds pinning every feature to a point of the query's own class: nothing to find."""
    rng = np.random.default_rng(1)
    x = suite.X[0]
    pred = suite.model.predict(x[None])[0]
    same = suite.X[suite.model.predict(suite.X) == pred]
    z = same[rng.integers(len(same))]
    bounds = {c.name: [float(z[j]), float(z[j])] for j, c in enumerate(suite.cols)}
    for norm in NORMS:
        res = suite.maps.counterfactual(x, norm=norm, bounds=bounds)
        assert res.feasible is False and res.reason
        assert suite.bf.solve(x, [c for c in range(len(suite.model.classes_))
                                  if suite.model.classes_[c] != pred],
                              {"bounds": bounds}, np.ones(len(x)), norm).dist.size == 0


def test_integer_bounds_round_inward(suite: Suite) -> None:
    """Fractional bounds on integer features: answers stay on integers inside them."""
    rng = np.random.default_rng(2)
    for x in suite.queries(rng):
        opts = {"bounds": {"i1": [x[1] - 2.7, x[1] + 3.4], "i4": [x[4] - 1.5, x[4] + 0.5]}}
        w = np.ones(len(x))
        for norm in ("l1", "l0"):
            check_result(suite.maps, suite.bf, x, None, opts, w, norm, rng, k=2)


@pytest.mark.parametrize("costs", [None, {"color": 0.3}, {"color": 2.5}],
                         ids=["default-cost", "cheap-switch", "dear-switch"])
@pytest.mark.parametrize("option", ["none", "combined"])
@pytest.mark.parametrize("norm", NORMS)
def test_categorical_groups_and_switching_costs(grouped: Suite, norm: str, option: str,
                                                costs: dict[str, float] | None) -> None:
    """One-hot groups: answers keep exactly one category, a switch costs the group's cost
    (one change under l0), and the optimum matches the brute force."""
    rng = np.random.default_rng(seed_of("g", norm, option, costs))
    for x in grouped.queries(rng):
        w = rng.uniform(0.2, 2.0, size=x.shape[0])
        opts = random_options(option, grouped.cols, x, rng)
        for target in grouped.targets(x):
            check_result(grouped.maps, grouped.bf, x, target, opts, w, norm, rng,
                         group_costs=costs, k=2)


def test_a_weight_named_on_a_one_hot_column_is_refused(grouped: Suite) -> None:
    """A one-hot column's weight would go unused (a switch costs the group's cost): naming
    one is an error that points to group_costs, not a silent no-op."""
    x = next(iter(grouped.queries(np.random.default_rng(0))))
    with pytest.raises(InvalidQueryError, match="group_costs.color") as err:
        grouped.maps.counterfactual(x, weights={"color=red": 100.0})
    assert err.value.field == "weights.color=red"
    grouped.maps.counterfactual(x, weights={"c0": 2.0})  # the other columns take one


def test_a_group_cost_must_be_a_number_as_a_weight_must(grouped: Suite) -> None:
    """``group_costs={"color": "1"}`` or ``True`` were taken for 1 (float() of them), where
    the same values as weights are refused (QA)."""
    x = next(iter(grouped.queries(np.random.default_rng(0))))
    for bad in ("1", True, [1.0], None, -1.0, np.inf):
        with pytest.raises(InvalidQueryError) as err:
            grouped.maps.counterfactual(x, group_costs={"color": bad})
        assert err.value.field == "group_costs.color", bad
    for ok in (1, 2.5, np.float32(0.5), np.int64(3)):
        assert grouped.maps.counterfactual(x, group_costs={"color": ok}).feasible


def test_immutable_category_is_kept(grouped: Suite) -> None:
    """A group whose every column is immutable keeps x's category."""
    rng = np.random.default_rng(4)
    opts = {"immutable": [f"color={c}" for c in COLORS]}
    for x in grouped.queries(rng):
        for norm in NORMS:
            res = check_result(grouped.maps, grouped.bf, x, None, opts, np.ones(len(x)), norm, rng)
            if res.feasible:
                assert np.array_equal(res.best.x[4:], x[4:])


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_constraints_ending_on_a_threshold(suite: Suite, norm: str) -> None:
    """Bounds and immutable values that sit exactly on a (float32) threshold ``s``: the cell
    above, ``x > s``, is open there, so [s, s] leaves it empty and [s, inf) only its
    infimum; the answer's float32 view must be on the right side."""
    rng = np.random.default_rng(seed_of("edge", norm))
    cont = [j for j, c in enumerate(suite.cols) if c.type == "continuous"]
    w = np.ones(len(suite.cols))
    n_checked = 0
    for j in cont:
        lo, hi = suite.cols[j].domain()
        cuts = f32_floor(raw_thresholds(suite.model, j))
        cuts = cuts[(cuts > lo) & (cuts < hi)]
        for s in rng.permutation(cuts)[:3]:
            name = suite.cols[j].name
            x = suite.X[rng.integers(len(suite.X))].copy()
            for opts in ({"bounds": {name: [s, s]}}, {"bounds": {name: [s, None]}},
                         {"bounds": {name: [None, s]}}):
                check_result(suite.maps, suite.bf, x, None, opts, w, norm, rng, k=2)
                n_checked += 1
            x[j] = s
            check_result(suite.maps, suite.bf, x, None, {"immutable": [name]}, w, norm, rng, k=2)
    assert n_checked > 0 or suite.model.__class__ is DecisionTreeClassifier


@pytest.mark.parametrize("option", OPTIONS[1:])
@pytest.mark.parametrize("norm", NORMS)
def test_budgeted_maps_stay_exact_under_constraints(norm: str, option: str, deepening: str) -> None:
    """Maps cut short by a rectangle budget keep mixed regions that queries refine on demand
    (clipped to the cells the constraints allow); constrained answers must stay optimal,
    valid and inside the constraints."""
    for cols, kind, seed in ((PLAIN, "rf", 3), (GROUPED, "et", 5)):
        X, y = make_data(cols, 3, seed)
        model = FACTORIES[kind](seed, 3).fit(X, y)
        maps = CounterfactualMaps.build(model, schema_of(cols), max_rectangles=20, on_budget="mixed")
        assert maps.stats.mixed_regions > 0
        suite = Suite(model, X, cols, maps, BruteForce(model, cols))
        rng = np.random.default_rng(seed_of("budget", norm, option, kind))
        for x in suite.queries(rng, n_rows=3):
            w = rng.uniform(0.2, 2.0, size=x.shape[0])
            opts = random_options(option, cols, x, rng)
            for target in suite.targets(x):
                check_result(maps, suite.bf, x, target, opts, w, norm, rng, k=2)


@pytest.mark.parametrize("norm", NORMS)
def test_best_found_under_constraints_is_valid_and_bracketed(norm: str) -> None:
    """A search stopped after a few boxes (``on_budget="best"``) under constraints and
    one-hot groups answers with a legal, constrained point the model puts in the target
    class, everywhere in its region, and brackets the brute-force optimum between its
    ``lower_bound`` and its distance (equal when it says ``optimal``). Its guesses move
    features and switch categories, so this checks they never leave the constraints."""
    stopped = 0
    for cols, kind, seed in ((PLAIN, "rf", 3), (GROUPED, "et", 5), (GROUPED, "rf", 7)):
        X, y = make_data(cols, 3, seed)
        model = FACTORIES[kind](seed, 3).fit(X, y)
        maps = CounterfactualMaps.build(model, schema_of(cols), max_rectangles=20,
                                        on_budget="mixed")
        bf = BruteForce(model, cols)
        suite = Suite(model, X, cols, maps, bf)
        rng = np.random.default_rng(seed_of("best", norm, kind, seed))
        classes = list(model.classes_)
        for x in suite.queries(rng, n_rows=3):
            for option in OPTIONS:
                opts = random_options(option, cols, x, rng)
                w = rng.uniform(0.2, 2.0, size=x.shape[0])
                gc = {"color": 0.7} if cols is GROUPED and rng.random() < 0.5 else None
                kw: dict[str, Any] = dict(opts)
                if gc is not None:
                    kw["group_costs"] = gc
                for target in suite.targets(x):
                    where = f"x={x.tolist()} target={target} norm={norm} opts={opts} gc={gc}"
                    try:
                        res = maps.counterfactual(x, target, norm=norm, weights=w,
                                                  max_boxes=int(rng.integers(1, 4)),
                                                  on_budget="best", **kw)
                    except BudgetExceededError:
                        continue  # the search met no target box at all: a 422
                    pred = bf.predict_index(x)
                    targets = [classes.index(target)] if target is not None else [
                        c for c in range(len(classes)) if c != pred]
                    cells = bf.solve(x, targets, opts, w, norm, gc)
                    if cells.dist.size == 0:
                        assert res.feasible is False, where
                        continue
                    want = float(cells.dist.min())
                    d = res.best.distance
                    assert res.lower_bound <= want + 1e-9 and d >= want - 1e-9, (
                        res.lower_bound, want, d, where)
                    if res.optimal:
                        assert abs(d - want) <= 1e-9, where
                    else:
                        stopped += 1
                    cf = res.best
                    cmin, cmax = bf.box(x, opts)
                    P = np.vstack([cf.x[None], legal_points_of_region(bf, cf.region, x, rng,
                                                                     n_random=8)])
                    assert_legal_and_constrained(bf, P, cmin, cmax, x, opts)
                    assert not (model.predict(P) != cf.target).any(), where
                    assert cf.counterfactual_distance == pytest.approx(
                        point_cost(bf, x, cf.x, w, norm, gc), rel=1e-9, abs=1e-12), where
    assert stopped > 0  # some answers were the best found, not proven


def test_one_way_and_bounded_categories(grouped: Suite) -> None:
    """Constraints on one-hot columns: a column that may only decrease can't become the
    category; a column bounded to [0, 0] is ruled out; [1, 1] forces the category."""
    rng = np.random.default_rng(6)
    for x in grouped.queries(rng):
        for opts in ({"direction": {"color=blue": "decrease"}, "bounds": {"color=green": [0, 0]}},
                     {"bounds": {"color=red": [1, 1]}},
                     {"direction": {"color=red": "increase", "color=green": "increase"}}):
            for norm in NORMS:
                check_result(grouped.maps, grouped.bf, x, None, opts, np.ones(len(x)), norm, rng,
                             group_costs={"color": 0.7}, k=2)


def test_target_equal_to_prediction_respects_the_constraints() -> None:
    """Asking for the class x already has: x itself only when x satisfies the constraints;
    otherwise the nearest point of that class inside them (or infeasible)."""
    suite = make_suite("rf", 3, PLAIN)
    rng = np.random.default_rng(8)
    for x in suite.queries(rng):
        pred = suite.bf.predict_index(x)
        j = int(rng.integers(len(x)))
        c = suite.cols[j]
        lo, hi = c.domain()
        # a bound excluding x's own value (within the legal domain when there is room)
        if x[j] + 1 <= hi:
            opts = {"bounds": {c.name: [x[j] + 1, None]}}
        else:
            opts = {"bounds": {c.name: [None, x[j] - 1]}}
        w = np.ones(len(x))
        for norm in ("l1", "linf"):
            res = suite.maps.counterfactual(x, suite.model.classes_[pred], norm=norm, weights=w, **opts)
            cells = suite.bf.solve(x, [pred], opts, w, norm)
            where = f"x={x.tolist()} opts={opts} norm={norm}"
            if cells.dist.size == 0:
                assert res.feasible is False, where
                continue
            assert res.feasible, where
            cmin, cmax = suite.bf.box(x, opts)
            assert np.all(res.best.x >= cmin) and np.all(res.best.x <= cmax), (
                f"answer {res.best.x.tolist()} breaks the bounds: {where}")
            assert abs(res.best.distance - cells.dist.min()) <= 1e-9, where


@pytest.mark.parametrize("opts", [
    {"bounds": {"i1": [20, 30]}},  # beyond the legal domain
    {"bounds": {"c3": [5.0, 6.0]}},
    {"bounds": {"i1": [3.2, 3.8]}},  # no integer inside
    {"bounds": {"b2": [0.2, 0.8]}},
    {"bounds": {"c0": [-1e30, 1e30]}},  # wider than anything
    {"bounds": {"i4": [-6, -6]}, "direction": {"i4": "increase"}},  # a single legal value
], ids=["beyond-domain", "beyond-bounded-domain", "no-integer", "no-binary", "huge", "pinned"])
def test_degenerate_constraint_boxes(suite: Suite, opts: dict[str, Any]) -> None:
    rng = np.random.default_rng(9)
    for x in suite.X[:3]:
        for norm in NORMS:
            check_result(suite.maps, suite.bf, x, None, opts, np.ones(len(x)), norm, rng, k=2)


@pytest.mark.parametrize("norm", NORMS)
def test_schema_defaults_are_constraints_too(norm: str) -> None:
    """Immutable and one-way features declared in the schema apply without query options,
    and the default weights are 1 / (upper - lower) (1 when unbounded)."""
    X, y = make_data(PLAIN, 3, 3)
    model = FACTORIES["rf"](3, 3).fit(X, y)
    feats = [Feature(name=c.name, type=c.type, lower=c.lower, upper=c.upper) for c in PLAIN]
    feats[0] = replace(feats[0], mutable=False)
    feats[1] = replace(feats[1], direction="increase")
    feats[3] = replace(feats[3], direction="decrease")
    maps = CounterfactualMaps.build(model, FeatureSchema(tuple(feats)))
    bf = BruteForce(model, PLAIN)
    w = np.array([1.0, 1 / 12, 1.0, 1 / 6, 1 / 12])
    declared = {"immutable": ["c0"], "direction": {"i1": "increase", "c3": "decrease"}}
    rng = np.random.default_rng(seed_of("defaults", norm))
    n_feasible = 0
    for x in X[rng.choice(len(X), 6, replace=False)]:
        res = maps.counterfactual(x, norm=norm, k=2)
        pred = bf.predict_index(x)
        cells = bf.solve(x, [c for c in range(3) if c != pred], declared, w, norm)
        if cells.dist.size == 0:
            assert res.feasible is False and res.reason
            continue
        n_feasible += 1
        assert abs(res.best.distance - cells.dist.min()) <= 1e-9
        # the same answer as spelling the declared constraints and weights out
        spelled = check_result(maps, bf, x, None, declared, w, norm, rng, k=2)
        assert spelled.best.distance == res.best.distance
        assert np.array_equal(spelled.best.x, res.best.x)
    assert n_feasible > 0


@pytest.mark.parametrize("norm", NORMS)
def test_query_directions_restrict_the_schemas_never_lift_them(norm: str) -> None:
    """README: a query's ``direction`` restricts the spec's. ``any`` keeps the spec's one
    way, and the opposite way leaves the feature fixed; it used to replace the spec's, so a
    client could move a feature the spec allows only to increase downwards."""
    X, y = make_data(PLAIN, 3, 3)
    model = FACTORIES["rf"](3, 3).fit(X, y)
    feats = [Feature(name=c.name, type=c.type, lower=c.lower, upper=c.upper) for c in PLAIN]
    feats[1] = replace(feats[1], direction="increase")
    feats[3] = replace(feats[3], direction="decrease")
    maps = CounterfactualMaps.build(model, FeatureSchema(tuple(feats)))
    bf = BruteForce(model, PLAIN)
    w = np.array([1.0, 1 / 12, 1.0, 1 / 6, 1 / 12])
    declared = {"direction": {"i1": "increase", "c3": "decrease"}}
    against = {"direction": {"i1": "increase", "c3": "decrease"}, "immutable": ["i1", "c3"]}
    rng = np.random.default_rng(seed_of("restrict", norm))
    n_differ = 0
    for x in X[rng.choice(len(X), 16, replace=False)]:
        pred = bf.predict_index(x)
        targets = [c for c in range(3) if c != pred]
        for asked, meant in (({"i1": "any", "c3": "any"}, declared),
                             ({"i1": "decrease", "c3": "increase"}, against)):
            res = maps.counterfactual(x, norm=norm, direction=asked)
            cells = bf.solve(x, targets, meant, w, norm)
            if cells.dist.size == 0:
                assert res.feasible is False and res.reason
                continue
            assert res.feasible, res.reason
            assert abs(res.best.distance - cells.dist.min()) <= 1e-9 * max(1.0, cells.dist.min())
            assert res.best.x[1] >= x[1] and res.best.x[3] <= x[3]
            if meant is against:
                assert res.best.x[1] == x[1] and res.best.x[3] == x[3]
        # what replacing the spec's directions answered
        replaced = bf.solve(x, targets, {"direction": {"i1": "decrease", "c3": "increase"}},
                            w, norm)
        fixed = bf.solve(x, targets, against, w, norm)
        n_differ += replaced.dist.size > 0 and (fixed.dist.size == 0
                                                or fixed.dist.min() > replaced.dist.min())
    assert n_differ > 0  # these rows tell the two readings apart


@pytest.mark.parametrize("scale, gap", [(1e3, 1e-3), (1e6, 1.0), (1e17, 1e10)],
                         ids=["tie-1e3", "tie-1e6", "count-1e17"])
def test_l0_in_large_units(scale: float, gap: float) -> None:
    """Features in large units (unbounded, so weight 1): l0 must still count the changes
    exactly and break ties by the smaller weighted l1. Class 1 iff x0 > ~scale + gap or
    x1 > ~scale; from the origin both are one change, x1 the cheaper.

    The tie-break is documented (maps_core.distance._key) to resolve l1 differences above
    ~2e-16 * (1 + l1)^2: at l1 ~ 1e17 only the count is asserted to be exact there."""
    X = np.array([[0, 0], [2 * (scale + gap), 0], [0, 2 * scale], [2 * (scale + gap), 2 * scale]])
    model = DecisionTreeClassifier(random_state=0).fit(X, [0, 1, 1, 1])
    maps = CounterfactualMaps.build(model)
    x = np.zeros(2)
    res = maps.counterfactual(x, norm="l0", weights=[1.0, 1.0])
    assert model.predict(res.best.x[None])[0] == 1
    assert np.count_nonzero(res.best.x != x) == 1
    assert res.best.distance == 1.0, res.best.distance
    if gap > 2e-16 * (1 + scale) ** 2:
        assert res.best.x[0] == 0.0 and res.best.x[1] > 0, f"tie broken the wrong way: {res.best.x}"


@pytest.mark.parametrize("norm", NORMS)
def test_every_feature_immutable_takes_one_box(norm: str) -> None:
    """The constraint box is x itself: the search learns that in its first box. The
    deepening rounds counted a one-hot group's switch as reachable though every column is
    fixed, and popped one box per round (10) before saying infeasible, so a budget of 3
    boxes was a BudgetExceededError even with on_budget="best"."""
    X, y = make_data(GROUPED, 3, 7)
    model = RandomForestClassifier(10, max_depth=4, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(model, schema_of(GROUPED), max_rectangles=4)
    assert maps.engine.has_mixed
    for x in X[:4]:
        res = maps.counterfactual(x, norm=norm, immutable=maps.feature_names, max_boxes=3,
                                  on_budget="best")
        assert not res.feasible and res.stats.regions_refined <= 1
