"""Feature declarations: malformed ones are refused with a SchemaError that names the
feature (its position too, for a caller that names the field), never a bare error."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier

from maps_core import CounterfactualMaps, Feature, FeatureSchema, SchemaError


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"lower": 10**400}, "no number lies in its bounds"),
        ({"lower": math.inf}, "no number lies in its bounds"),
        ({"upper": -math.inf}, "no number lies in its bounds"),
        ({"upper": -(10**400)}, "no number lies in its bounds"),
        ({"lower": math.nan}, "lower must be a number or null"),
        ({"weight": 10**400}, "weight must be a finite number"),
        ({"type": "nominal", "lower": 0, "upper": 10**400}, "finite lower and upper"),
    ],
)
def test_bounds_and_weights_past_float64_are_schema_errors(kwargs, words):
    with pytest.raises(SchemaError, match=words):
        Feature("a", **kwargs)


@pytest.mark.parametrize("name, words", [
    ("a\x00b", "control character"), ("late\npayments", "control character"),
    ("\x7f", "control character"), ("a" * 201, "more than 200"), ("", "non-empty"),
])
def test_names_that_cannot_travel_are_refused(name, words):
    """A NUL, a newline or 10,000 characters in a feature's or group's name were accepted;
    such a name cannot be typed in the explorer page or a query string."""
    with pytest.raises(SchemaError, match=words):
        Feature(name)
    with pytest.raises(SchemaError, match=words) as err:
        FeatureSchema.from_dicts([{"name": "a"}, {"name": "c=1", "type": "categorical",
                                                  "group": name}])
    assert err.value.feature == 1
    # what a name may hold: any printable text up to 200 characters
    for ok in ("income, monthly", "Einkommen (€)", "a" * 200, "x[0] < 1", "日本"):
        assert Feature(ok).name == ok


def test_an_integer_bound_past_float64_on_the_open_side_is_an_infinity():
    f = Feature("a", lower=-(10**400), upper=3)
    assert f.domain() == (-math.inf, 3.0)


def test_errors_of_one_feature_carry_its_position():
    items = [{"name": "a"}, {"name": "b", "lower": 3, "upper": 1}]
    with pytest.raises(SchemaError) as err:
        FeatureSchema.from_dicts(items)
    assert err.value.feature == 1
    with pytest.raises(SchemaError) as err:
        FeatureSchema.from_dicts([{"name": "a"}, {"name": "b", "colour": 1}])
    assert err.value.feature == 1
    schema = FeatureSchema.from_dicts([{"name": "a"}, {"name": "b", "type": "integer",
                                                         "lower": 0.2, "upper": 0.8}])
    with pytest.raises(SchemaError, match="no integer") as err:
        schema.domains()
    assert err.value.feature == 1
    with pytest.raises(SchemaError) as err:  # about the list, not one feature
        FeatureSchema.from_dicts([{"name": "a"}, {"name": "a"}])
    assert err.value.feature is None


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 2))
    return X, (X[:, 0] > 0).astype(int)


@pytest.mark.parametrize("bounds", [(1e39, None), (None, -3.5e38)])
def test_bounds_past_float32_are_refused_for_a_model_that_reads_float32(bounds):
    """scikit-learn's trees read float32 and refuse any input whose float32 overflows: a
    feature declared to lie wholly out there has no input the model reads. A model that
    compares float64 (HistGradientBoosting) reads such values and builds."""
    X, y = _data()
    schema = FeatureSchema((Feature("a"), Feature("b", lower=bounds[0], upper=bounds[1])))
    forest = RandomForestClassifier(3, max_depth=2, random_state=0).fit(X, y)
    with pytest.raises(SchemaError, match="float32") as err:
        CounterfactualMaps.build(forest, schema)
    assert err.value.feature == 1
    hist = HistGradientBoostingClassifier(max_iter=3, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(hist, schema)
    x = np.array([0.5, 2e39 if bounds[0] else -4e38])
    assert maps.predict(x[None])[0] == hist.predict(x[None])[0]


@pytest.mark.parametrize("bounds", [(-1e308, 1e308), (0.0, 1e-320)])
def test_a_range_the_default_weight_cannot_measure_is_refused_at_build(bounds):
    """The default weight is 1/range: inf for a range of 1e-320 (every query refused),
    0 or a subnormal for one of 2e308 (moves free, or measured wrong)."""
    X, y = _data()
    schema = FeatureSchema((Feature("a"), Feature("b", lower=bounds[0], upper=bounds[1])))
    with pytest.raises(SchemaError, match="declare a weight") as err:
        CounterfactualMaps.build(HistGradientBoostingClassifier(max_iter=3).fit(X, y), schema)
    assert err.value.feature == 1
    # a declared weight measures it (small enough that moves across +-1e308 stay finite:
    # weight 1 there is refused too, see test_scales)
    weighted = FeatureSchema((Feature("a"), Feature("b", lower=bounds[0], upper=bounds[1],
                                                    weight=1e-10)))
    assert weighted.default_weights().tolist() == [1.0, 1e-10]
    model = HistGradientBoostingClassifier(max_iter=3).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the range's width overflowed to inf
        maps = CounterfactualMaps.build(model, weighted)
    assert np.isfinite(maps.engine.widths).all()


def test_the_default_weight_is_one_over_the_range_to_the_bit():
    rng = np.random.default_rng(0)
    for lo, hi in rng.normal(scale=1e3, size=(200, 2)):
        lo, hi = min(lo, hi), max(lo, hi)
        assert Feature("a", lower=float(lo), upper=float(hi)).default_weight() == 1.0 / (hi - lo)
