"""Weights and feature values far from 1: distances scale with them, exactly.

A weighted distance is homogeneous in the weights, and for float64-rule models in the
features' units too. l2 squares its costs, so before :func:`maps_core.query.kernel_units`
weights of 1e200 made every counterfactual "infeasible" (overflow) and 1e-170 gave a
distance of 0 and the wrong point (underflow).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.tree import DecisionTreeClassifier

from maps_core import CounterfactualMaps, InvalidQueryError

NORMS = ["l1", "l2", "linf"]
SCALES = [1e-200, 1e-170, 1e-160, 1e160, 1e200]


@pytest.fixture(scope="module")
def forest():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    model = RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0).fit(X, y)
    # a budgeted build too: the mixed-region search runs on the scaled costs as well
    return X, model, [CounterfactualMaps.build(model), CounterfactualMaps.build(model, max_rectangles=3)]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("scale", SCALES)
def test_scaled_weights_scale_the_distance_and_keep_the_point(forest, norm, scale):
    X, model, all_maps = forest
    w = np.array([1.0, 2.0, 0.5])
    for maps in all_maps:
        for x in X[:4]:
            t = 1 - int(model.predict(x[None])[0])
            ref = maps.counterfactual(x, t, norm=norm, weights=w).best
            got = maps.counterfactual(x, t, norm=norm, weights=w * scale)
            assert got.feasible and got.best is not None
            assert got.best.distance == pytest.approx(ref.distance * scale, rel=1e-9)
            assert got.best.counterfactual_distance == pytest.approx(
                ref.counterfactual_distance * scale, rel=1e-9)
            np.testing.assert_array_equal(got.best.x, ref.x)
            assert model.predict(got.best.x[None])[0] == t


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("scale", [1e-170, 1e160])
def test_features_in_extreme_units_give_the_scaled_answer(norm, scale):
    # HistGradientBoosting compares in float64, so its thresholds keep any scale
    rng = np.random.default_rng(0)
    X0 = rng.normal(size=(400, 2))
    y = (X0[:, 0] + X0[:, 1] > 0).astype(int)
    answers = []
    for s in (1.0, scale):
        model = HistGradientBoostingClassifier(max_iter=3, max_depth=2, random_state=0).fit(X0 * s, y)
        maps = CounterfactualMaps.build(model)
        x = X0[0] * s
        t = 1 - int(model.predict(x[None])[0])
        res = maps.counterfactual(x, t, norm=norm)
        assert res.feasible and res.best is not None
        assert model.predict(res.best.x[None])[0] == t
        answers.append(res.best.distance / s)
    assert answers[1] == pytest.approx(answers[0], rel=1e-9)


def test_l2_refuses_features_whose_scales_differ_beyond_squaring(forest):
    X, model, all_maps = forest
    t = 1 - int(model.predict(X[:1])[0])
    with pytest.raises(InvalidQueryError) as err:
        all_maps[0].counterfactual(X[0], t, norm="l2", weights=[1.0, 1e-150, 1.0])
    assert err.value.field == "weights.x1"  # the odd one out
    # l1 adds the costs as they are: the same weights answer
    assert all_maps[0].counterfactual(X[0], t, norm="l1", weights=[1.0, 1e-150, 1.0]).feasible


def test_costs_beyond_float64_are_refused(forest):
    X, model, all_maps = forest
    t = 1 - int(model.predict(X[:1])[0])
    with pytest.raises(InvalidQueryError) as err:
        all_maps[0].counterfactual(X[0], t, norm="l1", weights=[1e305, 1e305, 1e305])
    assert err.value.field.startswith("weights.")  # the weight at fault, by name


def _refusals(maps, x, t, cases, norm, match):
    """For each ``(options, field, row)`` of ``cases`` (``options["x"]``, a row or a batch,
    in place of ``x``): the InvalidQueryError the query raises, with the field and row
    expected."""
    for opts, field, row in cases:
        opts = dict(opts)
        A = opts.pop("x", x)
        with pytest.raises(InvalidQueryError, match=match) as err:
            if A.ndim == 2:
                maps.counterfactuals(A, t, norm=norm, **opts)
            else:
                maps.counterfactual(A, t, norm=norm, **opts)
        yield err.value, field, row


def test_the_cost_past_float64_is_named_where_it_comes_from():
    """Every cost past float64's range was blamed on 'weights, use smaller weights', even
    with no weights sent: a row's value, a group's switching cost or a bound may be it."""
    from maps_core import Feature, FeatureSchema

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.random(200), rng.integers(0, 2, 200), 0.0 * rng.random(200)])
    X[:, 2] = 1 - X[:, 1]
    y = (X[:, 0] + X[:, 1] > 1).astype(int)
    schema = FeatureSchema((Feature("u"), Feature("c=a", "categorical", group="c"),
                            Feature("c=b", "categorical", group="c")))
    # compares in float64 (a float32 model refuses values past 3.4e38 before any cost)
    model = HistGradientBoostingClassifier(max_iter=3, min_samples_leaf=5).fit(X, y)
    maps = CounterfactualMaps.build(model, schema)
    x = X[0].copy()
    t = 1 - int(model.predict(x[None])[0])
    far = x.copy()
    far[0] = 1e305
    cases = [({"x": far}, "u", 0), ({"x": np.vstack([x, far])}, "u", 1),
             ({"group_costs": {"c": 1e305}}, "group_costs.c", None),
             ({"bounds": {"u": [1e305, None]}}, "bounds.u", None),
             ({"weights": {"u": 1e305}}, "weights.u", None)]
    for err, field, row in _refusals(maps, x, t, cases, "l1", "float64"):
        assert (err.field, err.row) == (field, row)


def test_a_declared_weight_too_large_for_its_bounds_is_refused_at_build():
    """A spec weight of 1e300 on a feature bounded by 100 was accepted, then every query
    was refused for 'weights' the client never sent."""
    from maps_core import Feature, FeatureSchema, SchemaError

    X = np.random.default_rng(0).random((50, 1)) * 100
    model = DecisionTreeClassifier(max_depth=2, random_state=0).fit(X, X[:, 0] > 50)
    with pytest.raises(SchemaError, match="weight") as err:
        CounterfactualMaps.build(model, FeatureSchema((Feature("a", upper=100, weight=1e300),)))
    assert err.value.feature == 0
    ok = CounterfactualMaps.build(model, FeatureSchema((Feature("a", upper=100, weight=1e290),)))
    assert ok.counterfactual(np.array([10.0]), True).feasible
    # unbounded, the model's thresholds (about 50) set the scale: 1e308 was accepted, then
    # every query refused for weights the client never sent
    with pytest.raises(SchemaError, match="thresholds") as err:
        CounterfactualMaps.build(model, FeatureSchema((Feature("a", weight=1e308),)))
    assert err.value.feature == 0
    ok = CounterfactualMaps.build(model, FeatureSchema((Feature("a", weight=1e290),)))
    assert ok.counterfactual(np.array([10.0]), True).feasible


@pytest.mark.parametrize("norm", NORMS)
def test_bounds_that_force_a_far_move_are_measured(norm):
    """A bound can force a move past every cell bound and value of x: its cost counts in
    the scaling too (l2 squared a move to 1e200 into inf and answered "infeasible"), and a
    weight of a feature without splits stays finite once scaled (weights 1e270 and 1e-90
    made the first infinite)."""
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]] * 10, dtype=float)
    y = np.array([0, 1, 0, 1] * 10)
    hgb = HistGradientBoostingClassifier(max_iter=3, min_samples_leaf=2).fit(X, y)
    maps = CounterfactualMaps.build(hgb)
    x = np.zeros(2)
    for bounds, want in (({"b": [1e200, None]}, [0.0, 1e200]),
                         ({"a": [1e160, None], "b": [1e160, None]}, [1e160, 1e160])):
        bounds = {("x0", "x1")[ord(k) - ord("a")]: v for k, v in bounds.items()}
        res = maps.counterfactual(x, 1, norm=norm, bounds=bounds)
        assert res.feasible, res.reason
        d = np.abs(np.array(want))
        ref = {"l1": d.sum(), "l2": np.hypot(*d), "linf": d.max()}[norm]
        assert res.best.distance == pytest.approx(ref, rel=1e-9)
        assert hgb.predict(res.best.x[None])[0] == 1
    # one split on feature 1; feature 0's bound forces it from 0 to 1 at a weight of 1e270
    from sklearn.tree import DecisionTreeClassifier

    tree = DecisionTreeClassifier(random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(tree)
    opts = {"norm": norm, "weights": [1e270, 1e-90], "bounds": {"x0": [1.0, None]}}
    if norm == "l2":  # squared, costs 1e360 apart: refused by name, as in the test above
        with pytest.raises(InvalidQueryError, match="l2 cannot compare"):
            maps.counterfactual(x, 1, **opts)
        return
    res = maps.counterfactual(x, 1, **opts)
    assert res.feasible, res.reason
    assert res.best.distance == pytest.approx(1e270, rel=1e-9)
    assert tree.predict(res.best.x[None])[0] == 1


def test_l2_refusal_of_far_apart_scales_names_their_cause():
    """l2 refuses costs more than 2**400 apart; it named ``weights`` even when the client
    sent none and a row's value or a bound made the spread."""
    rng = np.random.default_rng(0)
    X = rng.random((200, 2))
    y = (X[:, 0] + X[:, 1] > 1).astype(int)
    model = HistGradientBoostingClassifier(max_iter=3, min_samples_leaf=5).fit(X, y)
    maps = CounterfactualMaps.build(model)
    x = X[0].copy()
    t = 1 - int(model.predict(x[None])[0])
    far = x.copy()
    far[1] = 1e150
    cases = [({"x": far}, "x1", 0), ({"x": np.vstack([x, far])}, "x1", 1),
             ({"bounds": {"x1": [1e150, None]}}, "bounds.x1", None),
             ({"weights": {"x0": 1.0, "x1": 1e150}}, "weights.x1", None)]
    for err, field, row in _refusals(maps, x, t, cases, "l2", "l2 cannot compare"):
        assert (err.field, err.row) == (field, row)
        assert "x0" in str(err) and "x1" in str(err)
    # the same queries in l1 answer
    assert maps.counterfactual(far, t, norm="l1").feasible


def test_l2_refusal_names_the_extreme_values_not_a_weight_never_sent():
    """Two features at 1e150 and one at its usual scale: the usual one is the odd one out
    of the three costs, and the refusal named its weight (``weights.x2``), which the
    client had not sent; it names the extreme value now."""
    rng = np.random.default_rng(0)
    X = rng.random((200, 3))
    y = (X.sum(axis=1) > 1.5).astype(int)
    maps = CounterfactualMaps.build(
        HistGradientBoostingClassifier(max_iter=3, min_samples_leaf=5).fit(X, y))
    far = np.array([1e150, -1e150, 0.5])
    with pytest.raises(InvalidQueryError, match="l2 cannot compare") as err:
        maps.counterfactual(far, norm="l2")
    assert err.value.field in ("x0", "x1") and err.value.row == 0, err.value.field


@pytest.mark.parametrize("norm", ["l1", "linf"])
@pytest.mark.parametrize("weights", [[1e130, 1e-200, 3e-200], [1e200, 3e-200, 1e-200],
                                     [1e-200, 3e-200, 1e200], [1e280, 1e-280, 3e-280]])
def test_l1_and_linf_measure_costs_far_apart(norm, weights):
    """Costs more than float64's range apart (1e130 beside 1e-200): scaled with the
    largest at unit size, the cheap ones became 0, and the answer was a distance of 0
    and the wrong one of two cheap moves. Each feature alone turns the tree's class."""
    X = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=float)
    model = DecisionTreeClassifier(random_state=0).fit(X, [0, 1, 1, 1])
    maps = CounterfactualMaps.build(model)
    one = maps.counterfactual(np.zeros(3), 1, norm=norm, weights=[1.0, 1.0, 1.0]).best
    res = maps.counterfactual(np.zeros(3), 1, norm=norm, weights=weights)
    cheapest = int(np.argmin(weights))
    assert res.best.distance == pytest.approx(one.distance * weights[cheapest], rel=1e-12)
    assert np.flatnonzero(res.best.x).tolist() == [cheapest]
    assert model.predict(res.best.x[None])[0] == 1


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_l1_and_linf_refuse_costs_no_float64_scale_holds(norm):
    X = np.array([[0, 0], [1, 0], [0, 1]], dtype=float)
    maps = CounterfactualMaps.build(DecisionTreeClassifier(random_state=0).fit(X, [0, 1, 1]))
    with pytest.raises(InvalidQueryError, match=f"{norm} cannot compare these costs") as err:
        maps.counterfactual(np.zeros(2), 1, norm=norm, weights=[1e300, 1e-300])
    assert err.value.field == "weights.x0" and "x1" in str(err.value)
    # l0 counts the changes: the same weights answer
    assert maps.counterfactual(np.zeros(2), 1, norm="l0", weights=[1e300, 1e-300]).feasible


def test_costs_below_float64s_normal_range_are_refused_by_name():
    """A float64 model on features at 1e-310: every cost is subnormal, and scaling them up
    to a unit size would push the weights past float64 (an OverflowError before)."""
    X = np.array([[0.0], [1e-310], [2e-310], [3e-310]] * 10)
    y = np.array([0, 0, 1, 1] * 10)
    maps = CounterfactualMaps.build(HistGradientBoostingClassifier(max_iter=2, min_samples_leaf=2).fit(X, y))
    for norm in ("l1", "l2", "linf", "l0"):
        with pytest.raises(InvalidQueryError, match="below float64's normal range") as err:
            maps.counterfactual(np.zeros(1), 1, norm=norm)
        assert err.value.field == "weights"
    # weights that bring the costs back into range answer
    res = maps.counterfactual(np.zeros(1), 1, norm="l1", weights=[1e300])
    assert res.feasible and res.best.distance > 0


@pytest.mark.parametrize("scale", [1e-30, 1e-12, 1.0, 1e8, 1e15, 1e17, 1e40])
def test_l0_breaks_ties_by_weighted_l1_at_any_scale(scale):
    """l0: among the answers with the fewest changes, the least weighted l1 wins. The tie
    is folded into the key as changes + l1 / (1 + l1); with weights of 1e17 every l1
    rounded to the same key and a 10x costlier one-change answer came back."""
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(600, 2))
    y = ((X[:, 0] > 1.0) | (X[:, 1] > 0.1)).astype(int)  # one move along either axis
    maps = CounterfactualMaps.build(DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y))
    x = np.array([0.0, 0.0])
    for base in ([1.0, 100.0], [10.0, 1.0]):
        w = np.array(base) * scale
        l1 = maps.counterfactual(x, 1, norm="l1", weights=w).best
        l0 = maps.counterfactual(x, 1, norm="l0", weights=w).best
        assert l0.distance == 1.0
        assert np.sum(w * np.abs(l0.x - x)) == pytest.approx(l1.distance, rel=1e-9)


def test_l0_breaks_ties_by_weighted_l1_beside_a_heavy_feature():
    """l0's costs were scaled by the largest one conceivable: a constant column at weight
    1e20 (no split, never moves), or a split feature in raw units up to 1e18, set it, every
    real move vanished from the tie-break, and a one-change answer 1,000x costlier than the
    least came back (QA helper)."""
    from sklearn.tree import DecisionTreeClassifier as Tree

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(600, 3))
    X[:, 2] = 7.0
    y = ((X[:, 0] > 1.0) | (X[:, 1] > 0.1)).astype(int)
    cases = [(Tree(max_depth=3, random_state=0).fit(X, y), np.array([0.0, 0.0, 7.0]),
              np.array([100.0, 1.0, 1e20]))]
    X2 = X.copy()
    X2[:, 2] = rng.uniform(0, 1e18, 600)
    y2 = ((X2[:, 0] > 1.0) | (X2[:, 1] > 0.1) | (X2[:, 2] > 9.5e17)).astype(int)
    cases.append((Tree(max_depth=4, random_state=0).fit(X2, y2), np.array([0.0, 0.0, 1e17]),
                  np.array([100.0, 1.0, 1.0])))
    for model, x, w in cases:
        maps = CounterfactualMaps.build(model)
        l1 = maps.counterfactual(x, 1, norm="l1", weights=w).best
        l0 = maps.counterfactual(x, 1, norm="l0", weights=w).best
        assert l0.distance == 1
        assert float(np.sum(w * np.abs(l0.x - x))) == pytest.approx(l1.distance, rel=1e-9)


def test_l2_measures_small_moves_beside_splits_near_float64s_end():
    """Splits near +-5e299 set l2's scale: scaled so that the largest cost was 1, the
    answer's moves of about 0.5 squared to 0 and its distance came back as 0 (QA helper)."""
    import lightgbm as lgb  # a test dependency: float64 splits where float32 has none
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(400, 2))
    y = ((X[:, 0] > 0.5) & (X[:, 1] > 0.5)).astype(int)
    X[:20, 0], X[20:40, 0], X[40:60, 1], X[60:80, 1] = 1e300, -1e300, 1e300, -1e300
    y[:80] = 1
    m = lgb.LGBMClassifier(n_estimators=5, num_leaves=8, min_child_samples=3, verbose=-1,
                           random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(m)
    assert maps.grid.magnitudes.min() > 1e299
    x = np.zeros(2)
    for norm in ("l1", "l2", "linf"):
        best = maps.counterfactual(x, 1, norm=norm).best
        d = np.abs(best.x - x)
        want = {"l1": d.sum(), "l2": float(np.hypot(*d)), "linf": d.max()}[norm]
        assert 0.4 < best.distance == pytest.approx(want, rel=1e-9), norm
        assert m.predict(best.x[None])[0] == 1


def test_l0_tie_break_beside_a_lightgbm_zero_threshold_and_far_apart_scales():
    """l0's costs were scaled around the middle of the least and largest feature costs: a
    LightGBM 0/1 column, split at its zero threshold 1e-35, put that middle at 2**-54 and
    every real move rounded away from the tie-break (a one-change answer 6x the l1 of the
    best one-change answer came back); so did one feature around 8e22 beside one at 1e-30.
    Now the median cost, at most 2**26 below the largest (QA)."""
    import lightgbm as lgb

    rng = np.random.default_rng(0)
    n = 2000
    X = np.column_stack([rng.uniform(0, 10, n), rng.uniform(0, 10, n),
                         rng.integers(0, 2, n)]).astype(float)
    y = ((X[:, 0] > 5.0) | (X[:, 1] > 8.0)).astype(int)
    y[(X[:, 2] == 1) & (X[:, 0] < 1)] = 1  # the 0/1 column matters, away from the query
    model = lgb.LGBMClassifier(n_estimators=20, num_leaves=8, verbose=-1,
                               random_state=0).fit(X, y)
    c0 = 8.388608e22
    Xs = np.column_stack([c0 + rng.uniform(-4e15, 4e15, 4000), rng.uniform(-1e-30, 1e-30, 4000)])
    ys = (((Xs[:, 0] > c0 + 1e15) | (Xs[:, 0] < c0 - 2e15)) & (Xs[:, 1] > 0)).astype(int)
    far = HistGradientBoostingClassifier(max_iter=20, random_state=0).fit(Xs, ys)
    for m, x in ((model, np.array([4.0, 2.0, 0.0])), (far, np.array([c0, 5e-31]))):
        maps = CounterfactualMaps.build(m)
        w = np.ones(x.size)
        l1 = maps.counterfactual(x, 1, norm="l1", weights=w).best
        l0 = maps.counterfactual(x, 1, norm="l0", weights=w).best
        assert l0.distance == 1.0
        assert m.predict(l0.x[None])[0] == 1
        # the least weighted l1 among one-change answers: the l1 optimum's (a one-change
        # answer here, or a two-change one at the same float64 distance, as scikit-learn
        # 1.4's HistGradientBoosting with a split at 4e-33 makes it)
        assert np.sum(w * np.abs(l0.x - x)) == pytest.approx(l1.distance, rel=1e-6)
