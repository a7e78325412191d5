"""Map slices (maps_core.slices): every pixel's class equals the model's own predict at
the pixel's centre, on complete and on budgeted maps (mixed regions decided exactly)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.tree import DecisionTreeClassifier

from maps_core import CounterfactualMaps, Feature, FeatureSchema, InvalidQueryError
from maps_core.slices import map_slice
from tests.conftest import fit, synthetic


def pixel_points(x, a, b, sl, integral=(False, False)):
    """The documented pixel centres, computed here from the extent alone."""
    a_lo, a_hi, b_lo, b_hi = sl.extent
    h, w = sl.labels.shape
    av = a_lo + (np.arange(w) + 0.5) * (a_hi - a_lo) / w
    bv = b_hi - (np.arange(h) + 0.5) * (b_hi - b_lo) / h
    if integral[0]:
        av = np.round(av)
    if integral[1]:
        bv = np.round(bv)
    P = np.repeat(x[None, :], h * w, axis=0)
    P[:, a] = np.tile(av, h)
    P[:, b] = np.repeat(bv, w)
    return P


MODELS = {
    "dt": lambda: DecisionTreeClassifier(max_depth=6, random_state=0),
    "rf": lambda: RandomForestClassifier(30, max_depth=4, random_state=0),
    "gb": lambda: GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=0),
}


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("budget", [None, 20])
def test_slice_labels_equal_predict_at_pixel_centres(kind, n_classes, budget):
    X, y = synthetic(n_classes, seed=3)
    model = MODELS[kind]().fit(X, y)
    maps = CounterfactualMaps.build(model, max_rectangles=budget)
    if budget is not None and kind != "dt":
        assert maps.stats.mixed_regions > 0  # the mixed-region path is exercised
    rng = np.random.default_rng(0)
    for x in X[rng.choice(len(X), 3, replace=False)]:
        a, b = rng.choice(X.shape[1], 2, replace=False)
        ra = (X[:, a].min() - 0.5, X[:, a].max() + 0.5)
        rb = (X[:, b].min() - 0.5, X[:, b].max() + 0.5)
        sl = map_slice(maps, x, int(a), int(b), 97, 61, ra, rb)
        assert sl.labels.shape == (61, 97) and sl.boxes.shape == (61, 97)
        want = np.searchsorted(model.classes_, model.predict(pixel_points(x, a, b, sl)))
        assert np.array_equal(sl.labels.ravel(), want)
        assert len(np.unique(sl.labels)) >= 1


def test_integer_axes_take_integer_values_and_default_extent_is_the_domain():
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.integers(0, 30, 500), rng.normal(0, 1, 500),
                         rng.integers(0, 5, 500)]).astype(float)
    y = ((X[:, 0] > 12) ^ (X[:, 1] > 0.3) | (X[:, 2] == 4)).astype(int)
    model = RandomForestClassifier(12, max_depth=4, random_state=0).fit(X, y)
    schema = FeatureSchema((Feature("n", "integer", 0, 29), Feature("z", "continuous", -4, 4),
                            Feature("k", "integer", 0, 4)))
    maps = CounterfactualMaps.build(model, schema)
    x = np.array([7.0, 0.1, 2.0])
    sl = map_slice(maps, x, 0, 2, 64, 40)
    assert sl.extent == (-0.5, 29.5, -0.5, 4.5)  # every integer gets an equal band
    assert np.all(sl.a_values == np.round(sl.a_values)) and np.all(sl.b_values == np.round(sl.b_values))
    want = model.predict(pixel_points(x, 0, 2, sl, integral=(True, True)))
    assert np.array_equal(sl.labels.ravel(), want)
    # 30 values of n over 64 columns, 5 of k over 40 rows: each band 2 or 3 columns, 8 rows
    assert set(np.unique(sl.a_values, return_counts=True)[1]) <= {2, 3}
    assert list(np.unique(sl.b_values, return_counts=True)[1]) == [8] * 5
    with pytest.raises(InvalidQueryError, match="legal range"):
        map_slice(maps, x, 0, 2, 10, 10, a_range=(-0.6, 3.0))
    # a narrow range: rounded centres stay inside it; a range with no integer is refused
    sl = map_slice(maps, x, 0, 1, 7, 5, a_range=(3.2, 4.6))
    assert set(sl.a_values) == {4.0}
    with pytest.raises(InvalidQueryError, match="no legal integer"):
        map_slice(maps, x, 0, 1, 7, 5, a_range=(3.2, 3.4))


def test_bad_slices_are_refused():
    model, X, _ = fit("rf")
    schema = FeatureSchema((Feature("a"), Feature("b"), Feature("c=0", "categorical", group="c"),
                            Feature("c=1", "categorical", group="c")))
    maps = CounterfactualMaps.build(model, schema)
    x = np.array([0.0, 0.0, 1.0, 0.0])
    with pytest.raises(InvalidQueryError, match="must differ"):
        map_slice(maps, x, 1, 1, 10, 10)
    with pytest.raises(InvalidQueryError, match="one-hot group"):
        map_slice(maps, x, 0, 2, 10, 10)
    with pytest.raises(InvalidQueryError, match="width"):
        map_slice(maps, x, 0, 1, 0, 10)
    with pytest.raises(InvalidQueryError, match="height"):
        map_slice(maps, x, 0, 1, 10, 100_000)
    with pytest.raises(InvalidQueryError, match="lo < hi"):
        map_slice(maps, x, 0, 1, 10, 10, a_range=(1.0, 1.0))
    # hi - lo is finite, but the pixel centres' (i + 0.5) * (hi - lo) would overflow
    with pytest.raises(InvalidQueryError, match="too wide for 10 pixels") as exc:
        map_slice(maps, x, 0, 1, 10, 10, b_range=(-8e307, 8e307))
    assert exc.value.field == "b_range"
    wide = map_slice(maps, x, 0, 1, 10, 1, a_range=(-1e306, 1e306))  # centres stay finite
    assert np.all(np.isfinite(wide.a_values)) and np.all(np.abs(wide.a_values) < 1e306)
    with pytest.raises(InvalidQueryError, match="no feature"):
        map_slice(maps, x, 0, 9, 10, 10)


def test_labelling_in_blocks_gives_the_same_picture(monkeypatch):
    X, y = synthetic(3, seed=4)
    model = GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(model, max_rectangles=30)
    x = X[7]
    whole = map_slice(maps, x, 0, 1, 83, 59, (-3.0, 3.0), (-3.0, 3.0))
    monkeypatch.setattr("maps_core.slices._BLOCK", 5)  # blocks of one row, ragged last block
    blocks = map_slice(maps, x, 0, 1, 83, 59, (-3.0, 3.0), (-3.0, 3.0))
    assert np.array_equal(whole.labels, blocks.labels)
    assert np.array_equal(whole.boxes, blocks.boxes)
    want = np.searchsorted(model.classes_, model.predict(pixel_points(x, 0, 1, whole)))
    assert np.array_equal(whole.labels.ravel(), want)


def test_a_default_range_too_wide_says_it_is_the_default():
    """An instance at 1e306 on a float64 model: the default range around it is too wide
    to draw, and the error quoted an a_range the caller never gave (QA)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    maps = CounterfactualMaps.build(
        HistGradientBoostingClassifier(max_iter=3).fit(X, (X[:, 0] > 0).astype(int)))
    with pytest.raises(InvalidQueryError, match="default range of 'x0' around the instance's "
                       "value 1e.306.* give a narrower a_range") as exc:
        map_slice(maps, np.array([1e306, 0.0]), 0, 1, 480, 10)
    assert exc.value.field == "a_range"
