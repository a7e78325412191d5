"""Nominal features: one column of category codes, where moving to another code costs the
feature's weight once, whatever the codes.

The references are ``tests.recourse.BruteForce`` (every cell of the model's grid labelled
by the model's own ``predict``, a nominal column's switch at its weight) and the model's
``predict`` for validity. Maps are built complete and budgeted (mixed regions, so the
mixed-region search and its clip to the ball meet nominal features too).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier

from maps_core import CounterfactualMaps, FeatureSchema, InvalidQueryError, SchemaError
from maps_core.adapters.lightgbm_text import parse_lightgbm
from maps_core.schema import Feature
from tests.recourse import BruteForce, Col, point_cost, region_distance

COLS = [Col("city", "nominal", 0, 7), Col("income", "continuous", -3.0, 3.0),
        Col("years", "integer", 0, 10), Col("plan", "nominal", 2, 6)]
NORMS = ["l1", "l2", "linf", "l0"]


def _data(seed: int = 0, n: int = 1500):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, 8, n), rng.uniform(-3, 3, n), rng.integers(0, 11, n),
                         rng.integers(2, 7, n)]).astype(float)
    y = (np.isin(X[:, 0], (1, 4, 6)) ^ (X[:, 1] + 0.3 * X[:, 2] > 1.5)
         ^ (X[:, 3] == 4)).astype(int)
    y[np.isin(X[:, 0], (2, 7)) & (X[:, 1] > 0)] = 2
    return X, y


def _schema(weights: dict[str, float] | None = None) -> FeatureSchema:
    weights = weights or {}
    return FeatureSchema(tuple(Feature(c.name, c.type, c.lower, c.upper, weight=weights.get(c.name))
                               for c in COLS))


def _forest():
    X, y = _data()
    return RandomForestClassifier(12, max_depth=5, random_state=0).fit(X, y), X


def _lightgbm():
    lgb = pytest.importorskip("lightgbm")
    X, y = _data(1)
    clf = lgb.LGBMClassifier(n_estimators=12, num_leaves=8, verbose=-1, random_state=0,
                             min_child_samples=5, min_data_per_group=5, cat_smooth=1)
    return clf.fit(X, y, categorical_feature=[0, 3]), X


@pytest.fixture(scope="module", params=["forest", "lightgbm-categorical"])
def model(request):
    clf, X = _forest() if request.param == "forest" else _lightgbm()
    engine_model = (clf if request.param == "forest"
                    else parse_lightgbm(clf.booster_.model_to_string()))
    return clf, engine_model, X, BruteForce(clf, COLS)


@pytest.mark.parametrize("budget", [None, 3])
@pytest.mark.parametrize("norm", NORMS)
def test_distances_equal_the_brute_force(model, norm, budget):
    """The optimum over legal inputs, a switch of code at its weight; the answer a legal
    code the model predicts as the target, at the distance it reports."""
    clf, engine_model, X, bf = model
    w_city = 0.35  # below and above the other features' typical costs
    schema = _schema({"city": w_city})
    maps = CounterfactualMaps.build(engine_model, schema, max_rectangles=budget)
    assert budget is None or maps.partition.n_mixed > 0
    w = schema.default_weights()
    assert w[0] == w_city and w[3] == 1.0  # a nominal feature's default weight: one switch
    rng = np.random.default_rng(7)
    for x in X[rng.choice(len(X), 6, replace=False)]:
        own = int(np.searchsorted(clf.classes_, clf.predict(x[None])[0]))
        for target in (t for t in range(len(clf.classes_)) if t != own):
            cells = bf.solve(x, [target], {}, w, norm)
            res = maps.counterfactual(x, target, norm=norm)
            assert res.feasible == bool(cells.dist.size)
            if not res.feasible:
                continue
            best = res.best
            assert best.distance == pytest.approx(cells.dist.min(), rel=1e-9, abs=1e-12)
            cf = best.x
            assert clf.predict(cf[None])[0] == clf.classes_[target]
            for j in (0, 2, 3):
                assert cf[j] == np.round(cf[j]) and COLS[j].lower <= cf[j] <= COLS[j].upper
            assert best.counterfactual_distance == pytest.approx(
                point_cost(bf, x, cf, w, norm, None), rel=1e-9, abs=1e-12)
            # the region's own distance: another code costs the weight once
            assert region_distance(bf, best.region, x, w, norm, None) == pytest.approx(
                best.distance, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_switch_cost_does_not_grow_with_the_codes(norm):
    """A forest that decides by the code alone: reaching the target code 7 from code 0
    costs one weight, as reaching code 1 does (an integer feature would cost 7x more)."""
    X = np.repeat(np.arange(8.0), 20)[:, None]
    for far in (1.0, 7.0):
        y = (X[:, 0] == far).astype(int)
        clf = RandomForestClassifier(3, random_state=0).fit(X, y)
        nominal = FeatureSchema((Feature("c", "nominal", 0, 7, weight=0.5),))
        integer = FeatureSchema((Feature("c", "integer", 0, 7, weight=0.5),))
        x = np.array([0.0])
        res = CounterfactualMaps.build(clf, nominal).counterfactual(x, 1, norm=norm)
        assert res.best.distance == 0.5 and res.best.x[0] == far
        res = CounterfactualMaps.build(clf, integer).counterfactual(x, 1, norm=norm)
        assert res.best.distance == 0.5 * far


def test_constraints_on_a_nominal_feature():
    """Immutable keeps the code; bounds restrict the codes; a direction is refused."""
    clf, X = _forest()
    schema = _schema()
    maps = CounterfactualMaps.build(clf, schema, max_rectangles=3)
    bf = BruteForce(clf, COLS)
    w = schema.default_weights()
    x = X[0]
    target = 1 - int(clf.predict(x[None])[0]) if clf.predict(x[None])[0] < 2 else 0
    for opts in ({"immutable": ["city"]}, {"bounds": {"city": [3, 5]}},
                 {"bounds": {"plan": [5, 6]}, "immutable": ["years"]}):
        cells = bf.solve(x, [target], opts, w, "l1")
        res = maps.counterfactual(x, target, norm="l1", **opts)
        assert res.feasible == bool(cells.dist.size)
        if res.feasible:
            assert res.best.distance == pytest.approx(cells.dist.min(), rel=1e-9, abs=1e-12)
            assert clf.predict(res.best.x[None])[0] == target
    with pytest.raises(InvalidQueryError, match="nominal") as err:
        maps.counterfactual(x, target, direction={"city": "increase"})
    assert err.value.field == "direction.city"


def test_schema_and_inputs_are_checked():
    with pytest.raises(SchemaError, match="finite lower and upper"):
        Feature("c", "nominal", 0, None)
    with pytest.raises(SchemaError, match="direction must be 'any'"):
        Feature("c", "nominal", 0, 3, direction="increase")
    # a group belongs to one-hot columns: on any other feature it would be ignored
    for kind in ("nominal", "binary", "integer", "continuous"):
        with pytest.raises(SchemaError, match="only categorical .one-hot. columns take a group"):
            Feature("c", kind, 0, 3, group="g")
    clf, X = _forest()
    maps = CounterfactualMaps.build(clf, _schema(), max_rectangles=3)
    x = X[0].copy()
    x[0] = 2.5  # not a code
    with pytest.raises(InvalidQueryError, match="= 2.5 must be an integer"):
        maps.counterfactual(x)
    x[0] = 8.0  # past the last code: whole numbers shown as such (was "8.0 ... [0.0, 5.0]")
    lo, hi = maps.schema.features[0].lower, maps.schema.features[0].upper
    with pytest.raises(InvalidQueryError,
                       match=rf"= 8 is above its legal range \[{lo:g}, {hi:g}\]$"):
        maps.counterfactual(x)
