"""Feature declarations: malformed ones are refused with a SchemaError that names the
feature (its position too, for a caller that names the field), never a bare error."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier

from maps_core import (
    CounterfactualMaps,
    Feature,
    FeatureSchema,
    InvalidQueryError,
    SchemaError,
    check_schema,
)


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


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"mutable": "no"}, "mutable must be true or false"),
    ({"mutable": "false"}, "mutable must be true or false"),
    ({"mutable": None}, "mutable must be true or false"),
    ({"lower": True}, "lower must be a number or null, not True"),
    ({"upper": np.bool_(False)}, "upper must be a number or null"),
    ({"weight": True}, "weight must be a number or null"),
])
def test_values_of_the_wrong_kind_are_refused(kwargs, words):
    """"no" would read as a true ``mutable`` (the feature free to move), a boolean as a
    bound of 0 or 1: both are refused, not taken."""
    with pytest.raises(SchemaError, match=words):
        Feature("a", **kwargs)
    with pytest.raises(SchemaError, match=words) as exc:
        FeatureSchema.from_dicts([{"name": "b"}, {"name": "a", **kwargs}])
    assert exc.value.feature == 1


def test_numpy_scalars_are_the_numbers_they_hold():
    """Bounds taken from an array (``X[:, j].min()`` of an int column is ``np.int64``) are
    accepted as the Python numbers they hold, so the schema travels as JSON."""
    f = Feature("a", lower=np.int64(0), upper=np.float32(2.5), weight=np.float64(0.5),
                mutable=np.bool_(False))
    assert (f.lower, f.upper, f.weight, f.mutable) == (0, 2.5, 0.5, False)
    assert [type(v) for v in (f.lower, f.upper, f.weight, f.mutable)] == [int, float, float, bool]
    assert FeatureSchema((f,)).to_dicts() == FeatureSchema.from_dicts(
        FeatureSchema((f,)).to_dicts()).to_dicts()


@pytest.mark.parametrize("items", [None, "abc", {"name": "a"}, 5])
def test_a_schema_that_is_no_list_is_a_schema_error(items):
    with pytest.raises(SchemaError, match="must be a list of objects"):
        FeatureSchema.from_dicts(items)


class _Frame:
    """What the maps read of a pandas DataFrame (or, 1-D, a Series): named columns (its
    ``index`` for a Series) and the values in that order."""

    def __init__(self, values, labels):
        self.values, self.ndim = np.asarray(values, dtype=float), np.ndim(values)
        if self.ndim == 1:
            self.index = list(labels)
        else:
            self.columns = list(labels)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)


def _named_forest():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 3)) * [1, 10, 100]
    y = (X[:, 0] + X[:, 1] / 10 > 0.3).astype(int)
    model = RandomForestClassifier(8, max_depth=4, random_state=0).fit(X, y)
    model.feature_names_in_ = np.array(["income", "debt", "age"], dtype=object)
    return model, X


def test_named_columns_are_read_by_name():
    """A frame whose columns name the model's features in another order is read by name
    (read by position, income would be taken for debt); unknown or missing names are an
    InvalidQueryError; numbered columns and a model fitted without names go by position."""
    model, X = _named_forest()
    maps = CounterfactualMaps.build(model)
    order = [2, 0, 1]
    frame = _Frame(X[:20][:, order], ["age", "income", "debt"])
    assert (maps.predict(frame) == model.predict(X[:20])).all()
    got = maps.counterfactuals(frame)
    want = maps.counterfactuals(X[:20])
    assert [r.best.distance for r in got] == [r.best.distance for r in want]
    assert all(np.array_equal(a.best.x, b.best.x) for a, b in zip(got, want, strict=True))
    row = maps.counterfactual(_Frame(X[0, order], ["age", "income", "debt"]))
    assert row.best.distance == want[0].best.distance
    assert row.prediction == model.predict(X[:1])[0]
    for labels in (["age", "income", "salary"], ["income", "debt"]):
        with pytest.raises(InvalidQueryError, match="not the model's features") as exc:
            maps.predict(_Frame(X[:3][:, :len(labels)], labels))
        assert exc.value.field == "instance"
    assert (maps.predict(_Frame(X[:20], [0, 1, 2])) == model.predict(X[:20])).all()
    del model.feature_names_in_
    anonymous = CounterfactualMaps.build(model)
    assert (anonymous.predict(_Frame(X[:20], ["p", "q", "r"])) == model.predict(X[:20])).all()


def test_a_schema_that_names_the_model_s_columns_otherwise_is_refused():
    """The model's own names (``feature_names_in_``) and the schema's must agree, in order:
    a schema of the same names in another order would put each declaration (bounds,
    constraints) on another column."""
    model, _ = _named_forest()
    swapped = FeatureSchema.default(3, ["debt", "income", "age"])
    for call in (lambda: CounterfactualMaps.build(model, swapped),
                 lambda: check_schema(model, swapped)):
        with pytest.raises(SchemaError, match="feature 0 is named 'debt' in the schema but "
                                              "'income' in the model") as exc:
            call()
        assert exc.value.feature == 0
    CounterfactualMaps.build(model, FeatureSchema.default(3, ["income", "debt", "age"]))
