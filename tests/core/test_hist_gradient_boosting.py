"""scikit-learn's HistGradientBoostingClassifier: raw float64 splits (x <= t), its baseline,
and its own predict as the reference."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier

from maps_core import CounterfactualMaps, UnsupportedModelError, flatten_model
from tests.brute_force import brute_force
from tests.library_splits import split_values


def _data(n_classes: int, seed: int = 0, n: int = 1500, m: int = 4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    y = ((X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int) if n_classes == 2
         else (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5))
    return X, y


@pytest.mark.parametrize("n_classes", [2, 3])
def test_faithful_to_predict_everywhere(n_classes):
    X, y = _data(n_classes)
    model = HistGradientBoostingClassifier(max_iter=30, max_depth=3, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(model)
    assert flatten_model(model).split_rule == "float64<="
    rng = np.random.default_rng(1)
    rows = [X, rng.normal(scale=2.0, size=(100_000, 4))]
    for f, t in enumerate(split_values(model, 4)[0]):  # each feature's thresholds
        vals = np.concatenate([t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf)])
        P = X[rng.integers(0, len(X), size=vals.size)].copy()
        P[:, f] = vals
        rows.append(P)
    P = np.vstack(rows)
    assert np.array_equal(np.asarray(maps.predict(P)), model.predict(P))


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_distances_equal_the_brute_force(norm):
    X, y = _data(2, seed=3, m=3)
    model = HistGradientBoostingClassifier(max_iter=4, max_depth=2, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(model)
    rng = np.random.default_rng(4)
    for x in X[rng.choice(len(X), 8, replace=False)]:
        w = rng.uniform(0.3, 2.0, size=3)
        for target in (0, 1):
            want = brute_force(model, x, target, w, norm)
            res = maps.counterfactual(x, target, norm=norm, weights=w)
            assert res.best.distance == pytest.approx(want, rel=1e-9, abs=1e-12)
            assert model.predict(res.best.x[None])[0] == target


def test_categories_that_are_not_numbers_are_refused():
    """String categories cannot come in a numeric query (numeric ones are supported: see
    test_categorical_splits)."""
    rng = np.random.default_rng(0)
    X = np.empty((1000, 2), dtype=object)
    X[:, 0] = rng.choice(["own", "rent", "other"], 1000)
    X[:, 1] = rng.normal(size=1000)
    y = (X[:, 0] == "rent").astype(int)
    model = HistGradientBoostingClassifier(max_iter=3, categorical_features=[0], random_state=0).fit(X, y)
    with pytest.raises(UnsupportedModelError, match="not numbers"):
        flatten_model(model)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_fitted_with_missing_values(n_classes):
    """A split on the missing-value bin stores threshold +inf (missing values right): every
    finite input goes left, so the node is its left child. Faithful to predict on finite
    inputs, huge ones included, and counterfactuals are valid."""
    rng = np.random.default_rng(0)
    X, y = _data(n_classes, m=3)
    missing = rng.random(len(X)) < 0.3
    X[missing, 1] = np.nan
    y[missing] = (y[missing] + 1) % n_classes  # informative missingness: split on it
    model = HistGradientBoostingClassifier(max_iter=15, max_depth=3, random_state=0).fit(X, y)
    assert any(np.isinf(p.nodes["num_threshold"][p.nodes["is_leaf"] == 0]).any()
               for stage in model._predictors for p in stage)
    maps = CounterfactualMaps.build(model)
    P = rng.normal(scale=2.0, size=(20_000, 3))
    huge = rng.random(P.shape) < 0.1
    P[huge] = rng.choice([1e39, -1e39, 1e308, -1e308, 3.5e38], size=int(huge.sum()))
    assert np.array_equal(np.asarray(flatten_model(model).predict_index(P)), np.searchsorted(
        model.classes_, model.predict(P)))
    Q = rng.normal(scale=2.0, size=(20_000, 3))
    assert np.array_equal(np.asarray(maps.predict(Q)), model.predict(Q))
    for x in Q[:10]:
        for target in range(n_classes):
            res = maps.counterfactual(x, target)
            assert model.predict(res.best.x[None])[0] == target


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_a_feature_split_only_on_missing_values_matches_the_brute_force(norm):
    """A feature whose finite values are all equal, with informative missingness: its only
    split is the missing-value one (threshold +inf), which no finite input crosses. The
    brute force (the oracle of every differential test) kept that threshold, made a cell
    whose representative point was inf - inf = NaN, read the missing side's label for it,
    and reported distance 0 where the nearest other decision is 0.95 away."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2))
    y = (X[:, 0] > 0).astype(int)
    X[:, 1] = 0.0
    missing = rng.random(400) < 0.3
    X[missing, 1] = np.nan
    y[missing] = 1 - y[missing]
    model = HistGradientBoostingClassifier(max_iter=2, max_depth=2, min_samples_leaf=40,
                                           random_state=0).fit(X, y)
    thresholds = [p.nodes["num_threshold"][(p.nodes["is_leaf"] == 0)
                                           & (p.nodes["feature_idx"] == 1)]
                  for stage in model._predictors for p in stage]
    assert np.isinf(np.concatenate(thresholds)).any()  # the case this test is about
    assert split_values(model, 2)[0][1].size == 0  # no boundary on the real line
    maps = CounterfactualMaps.build(model)
    for x in (np.array([1.0, 0.5]), np.array([-0.3, -2.0]), np.array([0.05, 1e300])):
        pred = int(model.predict(x[None])[0])
        res = maps.counterfactual(x, 1 - pred, norm=norm)
        assert model.predict(res.best.x[None])[0] == 1 - pred
        want = brute_force(model, x, 1 - pred, np.ones(2), norm)
        assert res.best.distance == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert want > 0


def test_minus_inf_or_nan_thresholds_stay_refused():
    X, y = _data(2)
    model = HistGradientBoostingClassifier(max_iter=2, max_depth=2, random_state=0).fit(X, y)
    for bad in (-np.inf, np.nan):
        nodes = model._predictors[0][0].nodes
        nodes["num_threshold"][0] = bad
        with pytest.raises(UnsupportedModelError, match="threshold of -inf or NaN"):
            flatten_model(model)


def test_a_categorical_split_without_categorical_features_is_refused():
    """A crafted node marked categorical in a model without categorical features would be
    read as a threshold split: refused instead."""
    X, y = _data(2)
    model = HistGradientBoostingClassifier(max_iter=2, max_depth=2, random_state=0).fit(X, y)
    model._predictors[0][0].nodes["is_categorical"][0] = 1  # noqa: SLF001
    with pytest.raises(UnsupportedModelError, match="categorical split in a model without"):
        flatten_model(model)
