"""LightGBM and XGBoost objects in memory (``LGBMClassifier``, ``lightgbm.Booster``,
``XGBClassifier``, ``XGBRFClassifier``, ``xgboost.Booster``) go straight into
``CounterfactualMaps.build``: read through their own model dumps, exactly as their files,
with a wrapper's ``classes_`` as the labels.

The libraries are the reference: every check compares with the object's own ``predict``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from maps_core import CounterfactualMaps, FeatureSchema, UnsupportedModelError, flatten_model
from maps_core.adapters import adapter_for, check_model, prepare_model
from maps_core.adapters.lightgbm_text import LightGBMModel
from maps_core.adapters.xgboost_json import XGBoostModel
from tests.conftest import synthetic
from tests.library_splits import engine_model

lgb = pytest.importorskip("lightgbm")
xgb = pytest.importorskip("xgboost")


def _lgbm_labels(X, y):
    names = np.array(["approve", "refuse"])
    return lgb.LGBMClassifier(n_estimators=25, num_leaves=6, verbose=-1, random_state=0).fit(
        X, names[y])


def _lgbm_multi(X, y):
    return lgb.LGBMClassifier(n_estimators=12, num_leaves=5, verbose=-1, random_state=0).fit(
        X, np.array([10, 20, 30])[y])


def _lgbm_early(X, y):
    clf = lgb.LGBMClassifier(n_estimators=400, num_leaves=8, learning_rate=0.3, verbose=-1,
                             random_state=0)
    held_out = X[300:], y[300:]
    # lightgbm 4.7 takes eval_X / eval_y and deprecates eval_set, which older versions need
    evals = (dict(eval_X=held_out[0], eval_y=held_out[1])
             if "eval_X" in inspect.signature(clf.fit).parameters else dict(eval_set=[held_out]))
    clf.fit(X[:300], y[:300], callbacks=[lgb.early_stopping(5, verbose=False)], **evals)
    assert 0 < clf.best_iteration_ < 400  # early stopping took effect
    return clf


def _lgbm_booster(X, y):
    return lgb.train({"objective": "binary", "num_leaves": 6, "verbose": -1}, lgb.Dataset(X, y),
                     num_boost_round=20)


def _xgb(X, y):
    return xgb.XGBClassifier(n_estimators=20, max_depth=3, random_state=0).fit(X, y)


def _xgb_early(X, y):
    clf = xgb.XGBClassifier(n_estimators=400, max_depth=3, learning_rate=0.5,
                            early_stopping_rounds=5, random_state=0)
    clf.fit(X[:300], y[:300], eval_set=[(X[300:], y[300:])], verbose=False)
    assert 0 < clf.best_iteration < 399
    return clf


def _xgb_rf(X, y):
    return xgb.XGBRFClassifier(n_estimators=15, max_depth=3, random_state=0).fit(X, y)


def _xgb_booster(X, y):
    return xgb.train({"objective": "binary:logistic", "max_depth": 3}, xgb.DMatrix(X, y),
                     num_boost_round=15)


# name -> (classes, fit, the parsed model's type)
OBJECTS = {
    "LGBMClassifier-labels": (2, _lgbm_labels, LightGBMModel),
    "LGBMClassifier-multiclass": (3, _lgbm_multi, LightGBMModel),
    "LGBMClassifier-early-stopping": (2, _lgbm_early, LightGBMModel),
    "lightgbm.Booster": (2, _lgbm_booster, LightGBMModel),
    "XGBClassifier-multiclass": (3, _xgb, XGBoostModel),
    "XGBClassifier-early-stopping": (2, _xgb_early, XGBoostModel),
    "XGBRFClassifier": (2, _xgb_rf, XGBoostModel),
    "xgboost.Booster": (2, _xgb_booster, XGBoostModel),
}


def _library_predict(obj, P: np.ndarray) -> np.ndarray:
    """The object's own decision: a wrapper's labels; a booster's class index (its
    ``predict`` gives the probability of class 1)."""
    if isinstance(obj, lgb.Booster):
        return (obj.predict(P) > 0.5).astype(int)
    if isinstance(obj, xgb.Booster):
        return (obj.predict(xgb.DMatrix(P)) > np.float32(0.5)).astype(int)
    return obj.predict(P)


@pytest.fixture(scope="module", params=sorted(OBJECTS))
def built(request):
    n_classes, fit, parsed_type = OBJECTS[request.param]
    X, y = synthetic(n_classes, 4, 0)
    obj = fit(X, y)
    schema = FeatureSchema.default(X.shape[1])
    return obj, parsed_type, X, CounterfactualMaps.build(obj, schema, n_jobs=1)


def test_prepared_as_the_parsed_file(built):
    """The object is read as its own file: the same flat trees as the file the service
    reads, and the wrapper's classes as labels (a booster's: 0..K-1)."""
    obj, parsed_type, _, maps = built
    parsed = prepare_model(obj)
    assert isinstance(parsed, parsed_type)
    from_file = flatten_model(engine_model(obj) if hasattr(obj, "fit") else _file_of(obj))
    ens = flatten_model(obj)
    for name in ("node_feature", "node_threshold", "node_left", "node_right", "node_value",
                 "roots", "base"):
        assert np.array_equal(getattr(ens, name), getattr(from_file, name)), name
    assert ens.split_rule == from_file.split_rule
    labels = list(getattr(obj, "classes_", range(from_file.n_classes)))
    assert list(maps.classes) == [c.item() if hasattr(c, "item") else c for c in labels]


def _file_of(booster):
    if isinstance(booster, lgb.Booster):
        from maps_core.adapters.lightgbm_text import parse_lightgbm

        return parse_lightgbm(booster.model_to_string())
    from maps_core.adapters.xgboost_json import parse_xgboost

    return parse_xgboost(bytes(booster.save_raw("json")))


def test_maps_decide_as_the_object(built):
    """Rows, wide random points, and every threshold with one float64 either side."""
    obj, _, X, maps = built
    rng = np.random.default_rng(1)
    ens = flatten_model(obj)
    rows = [X, rng.normal(scale=2.0, size=(20_000, X.shape[1]))]
    inner = ens.node_feature >= 0
    for f in range(X.shape[1]):
        t = np.unique(ens.node_threshold[inner & (ens.node_feature == f)])
        vals = np.concatenate([t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf)])
        P = X[rng.integers(0, len(X), size=vals.size)].copy()
        P[:, f] = vals
        rows.append(P)
    P = np.vstack(rows)
    expected = _library_predict(obj, P)
    got = np.asarray(maps.predict(P))
    assert np.array_equal(got, expected), int((got != expected).sum())


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_counterfactuals_are_valid_for_the_object(built, norm):
    """Every answer is the target by the object's own predict, named by its labels."""
    obj, _, X, maps = built
    for x in X[:6]:
        res = maps.counterfactual(x, norm=norm)
        assert res.optimal and res.best is not None
        assert res.target != res.prediction
        assert _library_predict(obj, res.best.x[None])[0] == res.target
        assert res.best.distance > 0


def test_attach_the_object_to_loaded_maps(built, tmp_path):
    """Loaded maps take the object back (same fingerprint); its file with other labels is
    another model."""
    obj, _, X, maps = built
    maps.save(tmp_path / "m")
    loaded = CounterfactualMaps.load(tmp_path / "m")
    loaded.attach_model(obj)
    assert np.array_equal(np.asarray(loaded.predict(X)), _library_predict(obj, X))


def test_unfitted_objects_are_refused_by_name():
    for obj in (lgb.LGBMClassifier(), xgb.XGBClassifier()):
        with pytest.raises(UnsupportedModelError, match=f"the {type(obj).__name__} is not fitted"):
            CounterfactualMaps.build(obj)


def test_what_the_libraries_cannot_be_read_as_is_refused():
    """Regressors (by their objective), objects that are no model, dumps that fail in the
    library, and an XGBClassifier
    whose ``missing`` is a number: its predict sends that value the default way, which its
    file does not record."""
    X, y = synthetic(2, 4, 0)
    with pytest.raises(UnsupportedModelError, match="objective 'regression'"):
        flatten_model(lgb.LGBMRegressor(n_estimators=3, verbose=-1).fit(X, y))
    with pytest.raises(UnsupportedModelError, match="objective 'reg:squarederror'"):
        flatten_model(xgb.XGBRegressor(n_estimators=3).fit(X, y))
    with pytest.raises(UnsupportedModelError, match="unsupported LightGBM object 'Dataset'"):
        check_model(lgb.Dataset(X, y))
    assert adapter_for(xgb.DMatrix(X)).name == "xgboost"
    with pytest.raises(UnsupportedModelError, match="unsupported XGBoost object 'DMatrix'"):
        flatten_model(xgb.DMatrix(X))
    with pytest.raises(UnsupportedModelError, match="missing"):
        CounterfactualMaps.build(xgb.XGBClassifier(n_estimators=3, missing=0.0).fit(X, y))
    with pytest.raises(UnsupportedModelError, match="could not read the _Freed: freed"):
        flatten_model(_Freed())
    # NaN in any float type is the default, and is read
    clf = xgb.XGBClassifier(n_estimators=3, missing=np.float32("nan")).fit(X, y)
    assert isinstance(prepare_model(clf), XGBoostModel)


class _Freed:
    """A booster whose dump fails inside the library."""

    __module__ = "lightgbm.basic"

    def model_to_string(self):
        raise RuntimeError("freed")
