"""Answers are stated on the real line, where clients' float64 inputs live.

scikit-learn compares ``float32(x) <= t``: the real inputs a split sends left end halfway
between two float32 values, not at a float32. These tests check the promises made to a
client against the model's own ``predict`` only:

* every real input of a returned region, right up to its ends, gets the target: the
  first float64 inside each end (the end itself when closed) and the end rounded to 6
  digits when that lies inside;
* the maps label every input as ``model.predict`` does at each real boundary and one
  float64 either side of it;
* the returned point gets the target and lies in its region, and its distance is the
  certified one (to an ulp at an open end).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.tree import DecisionTreeClassifier

from maps_core import CounterfactualMaps
from tests.conftest import fit, region_end_points
from tests.library_splits import f32_floor, f32_real_boundary, raw_thresholds

NORMS = ("l1", "l2", "linf")


@pytest.fixture(scope="module", params=["dt", "rf", "gb"])
def small(request):
    model, X, _ = fit(request.param, n_classes=2, seed=3)
    return model, X, CounterfactualMaps.build(model)


@pytest.mark.parametrize("norm", NORMS)
def test_every_input_of_a_region_gets_the_target(small, norm):
    model, X, maps = small
    rng = np.random.default_rng(0)
    checked = 0
    for x in X[rng.choice(len(X), 25, replace=False)]:
        res = maps.counterfactual(x, norm=norm, k=3)
        for cf in res.counterfactuals:
            assert model.predict(cf.x[None])[0] == cf.target
            assert cf.region.contains(cf.x)
            # the point is the nearest float64 of the region: its distance is the infimum,
            # up to the ulp an open end costs
            assert cf.counterfactual_distance == pytest.approx(cf.distance, rel=1e-12, abs=1e-12)
            # the region is x's own cell clipped, not x: start from the returned point
            P = region_end_points(cf.region, cf.x)
            if P.size:
                assert np.all(model.predict(P) == cf.target), cf.region
                checked += len(P)
    assert checked > 100


def test_the_float32_rounding_example():
    """A split at 1.68 (stored as the float32 1.6799999475479126): 1.68 itself goes left,
    so a region of the right side must not claim it."""
    X = np.array([[1.66], [1.67], [1.68], [1.7], [1.8], [1.9]])
    y = np.array([0, 0, 0, 1, 1, 1])
    model = DecisionTreeClassifier(random_state=0).fit(X, y)
    t = model.tree_.threshold[0]
    assert np.float32(1.68) <= t  # 1.68 goes left, although 1.68 > float32(1.68)
    maps = CounterfactualMaps.build(model)
    res = maps.counterfactual(np.array([1.5]), 1)
    r = res.best.region
    b = f32_real_boundary(f32_floor(np.array([t])))[0]
    assert r.lower[0] == b and 1.68 < b
    assert not r.contains(np.array([1.68])) and model.predict([[1.68]])[0] == 0
    assert res.best.distance == pytest.approx(b - 1.5, rel=1e-15)
    inside = np.nextafter(b, np.inf) if not r.lower_closed[0] else b
    assert model.predict([[inside]])[0] == 1 and res.best.x[0] == inside


@pytest.mark.parametrize("kind", ["rf", "gb", "et"])
def test_maps_label_each_side_of_every_real_boundary(kind):
    model, X, _ = fit(kind, n_classes=3, seed=1)
    maps = CounterfactualMaps.build(model)
    rng = np.random.default_rng(2)
    rows = []
    for f in range(X.shape[1]):
        b = f32_real_boundary(f32_floor(raw_thresholds(model, f)))
        vals = np.concatenate([b, np.nextafter(b, -np.inf), np.nextafter(b, np.inf)])
        P = X[rng.integers(0, len(X), size=vals.size)].copy()
        P[:, f] = vals
        rows.append(P)
    P = np.vstack(rows)
    assert np.array_equal(maps.predict(P), model.predict(P))


def test_distance_is_the_real_infimum_not_the_float32_one():
    """The distance to the right side of the split is b - x with b the real boundary,
    which differs from the float32 threshold by more than 1e-9."""
    X = np.array([[0.0], [0.1], [0.2], [0.3]])
    y = np.array([0, 0, 1, 1])
    model = RandomForestClassifier(3, random_state=0, bootstrap=False).fit(X, y)
    maps = CounterfactualMaps.build(model)
    s = f32_floor(np.unique(raw_thresholds(model, 0)))
    b = f32_real_boundary(s)
    res = maps.counterfactual(np.array([0.0]), 1)
    want = min(bi for bi, si in zip(b, s, strict=True) if model.predict([[np.nextafter(bi, np.inf)]])[0] == 1)
    assert abs(res.best.distance - want) <= 1e-15
    assert abs(res.best.distance - s.min()) > 1e-9


def test_gradient_boosting_region_promise():
    model = GradientBoostingClassifier(n_estimators=20, max_depth=2, random_state=0)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 3)) * np.array([1e-3, 1.0, 1e4])  # wide range of float32 spacing
    y = (X[:, 0] * 1e3 + X[:, 1] + X[:, 2] * 1e-4 > 0).astype(int)
    model.fit(X, y)
    maps = CounterfactualMaps.build(model)
    for x in X[:30]:
        for norm in NORMS:
            cf = maps.counterfactual(x, norm=norm).best
            P = region_end_points(cf.region, cf.x)
            assert model.predict(cf.x[None])[0] == cf.target
            if P.size:
                assert np.all(model.predict(P) == cf.target)


@pytest.mark.parametrize("norm", ("l1", "l2", "linf", "l0"))
def test_integers_past_two_to_the_24_follow_float32_rounding(norm):
    """Past 2**24 float32 cannot hold every integer: ``float32(x) <= t`` sends an integer
    left or right as it rounds (ties to even), so the last integer sent left may lie
    above the last float32 sent left. Distances equal the brute force, whose integer
    cells come from the real boundaries, and every answer is an integer the model gives
    the target."""
    from tests.recourse import BruteForce, Col, check_result, schema_of

    base = 2**25
    rng = np.random.default_rng(0)
    X = rng.integers(base - 40, base + 40, size=(600, 2)).astype(np.float64)
    y = (((X[:, 0] - base) // 6 + (X[:, 1] - base) // 10) % 2).astype(int)
    model = RandomForestClassifier(n_estimators=6, max_depth=4, random_state=0).fit(X, y)
    assert np.unique(model.predict(X)).size == 2
    cols = [Col("a", "integer", base - 40, base + 40), Col("b", "integer", base - 40, base + 40)]
    maps = CounterfactualMaps.build(model, schema=schema_of(cols))
    bf = BruteForce(model, cols)
    w = np.array([1.0, 0.5])
    for x in X[:25]:
        check_result(maps, bf, x, None, {}, w, norm, rng)


@pytest.mark.parametrize("kind", ["hgb", "dt"])
def test_integers_past_two_to_the_53(kind):
    """Past 2**53 every float64 is an integer and ``t + 1`` rounds back to ``t`` (a
    nanosecond timestamp, about 1.7e18, has 256 between neighbours): the integer cell
    above a cut began at the cut itself, which the model sends below, so answers there
    were the other class. Checked with the model's own ``predict``: the answer and its
    region's ends get the target, and the float64 next to the answer towards x does not
    (the classes are two half-lines)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from maps_core import Feature, FeatureSchema

    B = 2.0**60  # float64s are 256 apart above, 128 below; float32s 2**37 above
    if kind == "hgb":  # x <= t in float64
        step = 256.0
        X = np.repeat((B + step * np.arange(-8, 8)).reshape(-1, 1), 20, axis=0)
        model = HistGradientBoostingClassifier(max_iter=3, min_samples_leaf=1,
                                               random_state=0)
    else:  # float32(x) <= t
        step = 2.0**37
        X = (B + step * np.arange(-8, 8)).reshape(-1, 1)
        model = DecisionTreeClassifier(random_state=0)
    model.fit(X, (X[:, 0] > B).astype(int))
    lo, hi = B - 16 * step, B + 16 * step
    maps = CounterfactualMaps.build(
        model, FeatureSchema((Feature("ts", "integer", lower=lo, upper=hi),)))
    xs = np.concatenate([X[::3, 0], [B, np.nextafter(B, np.inf), np.nextafter(B, -np.inf)]])
    checked = 0
    for x0 in xs:
        x = np.array([x0])
        for norm in NORMS:
            cf = maps.counterfactual(x, norm=norm, weights=[1.0]).best
            assert model.predict(cf.x[None])[0] == cf.target
            ends = [v for v in (cf.region.lower[0], cf.region.upper[0]) if np.isfinite(v)]
            assert np.all(model.predict(np.array(ends)[:, None]) == cf.target)
            assert cf.distance == abs(cf.x[0] - x0)
            if cf.x[0] != x0:
                nearer = np.nextafter(cf.x[0], x0)
                assert model.predict([[nearer]])[0] != cf.target
                checked += 1
    assert checked >= len(xs)  # every x is one class: its answer moves
