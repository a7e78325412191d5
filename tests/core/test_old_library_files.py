"""Model files of older XGBoost and LightGBM versions, read as the fitted model predicted.

The fixtures in ``tests/core/data`` were saved by the old libraries themselves, with the
class index the fitted model predicted on points at and either side of its thresholds
(``make.py`` beside them regenerates them; it needs those versions, so CI does not run
it). No library is asked here: the recorded predictions are the reference.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from maps_core import CounterfactualMaps, UnsupportedModelError
from maps_core.adapters.xgboost_json import _cuts_16, parse_xgboost

DATA = Path(__file__).parent / "data"
XGB_FILES = sorted(p for p in (DATA / "xgboost_old").glob("*.json") if "missing0" not in p.name)


def _indices(labels, predicted) -> np.ndarray:
    """Each predicted label's index in ``labels`` (numpy and Python scalars compare equal)."""
    labels = list(labels)
    return np.array([labels.index(v) for v in predicted])


@pytest.mark.parametrize("path", XGB_FILES, ids=lambda p: p.stem)
def test_old_xgboost_files_predict_as_the_fitted_model(path):
    """Forests and early stopping of XGBoost < 1.6 (no num_parallel_tree in the file),
    labels the 1.x wrapper encoded, 1.5's and 1.6's categorical rules and NaN split
    conditions (1.5's files crafted, then predicted by 1.5.2 itself: ``craft15.py``)."""
    ref = np.load(path.with_suffix(".npz"))
    X, expected = ref["X"], ref["pred"]
    model = parse_xgboost(path.read_bytes())
    labels = list(model.classes_)
    np.testing.assert_array_equal(_indices(labels, model.predict(X)), expected)
    maps = CounterfactualMaps.build(model)
    np.testing.assert_array_equal(_indices(labels, maps.predict(X)), expected)
    # an answer's point is of its target class by the same reference model
    for x in X[:: max(1, len(X) // 8)]:
        r = maps.counterfactual(x)
        assert r.best is not None
        assert model.predict(r.best.x[None])[0] == r.target


def test_xgboost_15_reads_minus_one_to_zero_as_code_zero():
    """XGBoost 1.5 cast a value to its code by C's truncation: -0.5 is code 0 there (in
    the set: right), where 1.6 and later call it invalid. The crafted file's root sends
    {0} right to +0.5 and the rest left to -0.5 (one tree, so the class flips)."""
    raw = (DATA / "xgboost_old/1.5.2_categorical_one_hot_zero.json").read_bytes()
    x = np.array([[v, 0.0] for v in (-0.99, -0.5, -1e-7, 0.0, 0.99)] + [[-1.0, 0.0], [1.0, 0.0]])
    np.testing.assert_array_equal(parse_xgboost(raw).predict(x), [1, 1, 1, 1, 1, 0, 0])
    maps = CounterfactualMaps.build(parse_xgboost(raw))
    np.testing.assert_array_equal(maps.predict(x), [1, 1, 1, 1, 1, 0, 0])
    # the same file as a later version wrote it: -0.5 is no category there
    later = parse_xgboost(_edited("1.5.2_categorical_one_hot_zero.json",
                                  lambda d: d.update(version=[2, 0, 3])))
    np.testing.assert_array_equal(later.predict(x), [0, 0, 0, 1, 1, 0, 0])


@pytest.mark.parametrize("version", [[1, 3, 3], [1, 4, 2]])
def test_xgboost_13_14_categorical_files_are_refused(version):
    """XGBoost 1.3 and 1.4 load a categorical split as a numeric one at its condition
    (probed: their predictions on the crafted files equal the same trees with numeric
    splits), later versions as a category set."""
    raw = _edited("1.5.2_categorical_two_sets.json", lambda d: d.update(version=version))
    with pytest.raises(UnsupportedModelError, match="reads it as a numeric split"):
        parse_xgboost(raw)


def test_old_xgboost_trees_per_round():
    """1.4.2: early stopping at round 22 of a 3-tree-per-round boosted forest keeps
    (22 + 1) x 3 trees (best_ntree_limit 69); 1.5.2: an XGBRFClassifier of 4 trees keeps
    all 4, not 1 (its best_iteration is 0)."""
    assert len(parse_xgboost((DATA / "xgboost_old/1.4.2_parallel3_early_stopped.json")
                             .read_bytes()).trees) == 69
    assert len(parse_xgboost((DATA / "xgboost_old/1.5.2_rf_binary.json").read_bytes()).trees) == 4


def test_old_xgboost_wrapper_labels():
    model = parse_xgboost((DATA / "xgboost_old/1.5.2_labels_3_7_11.json").read_bytes())
    assert list(model.classes_) == [3, 7, 11]
    assert CounterfactualMaps.build(model).classes == [3, 7, 11]


def _edited(name: str, edit) -> bytes:
    doc = json.loads((DATA / "xgboost_old" / name).read_text())
    edit(doc)
    return json.dumps(doc).encode()


def test_old_xgboost_wrapper_missing_is_refused():
    with pytest.raises(UnsupportedModelError, match=r"treats 0\.0 as missing"):
        parse_xgboost((DATA / "xgboost_old/1.5.2_missing0.json").read_bytes())


def test_old_xgboost_records_that_disagree_are_refused():
    def limit(doc):  # best_ntree_limit of 2 trees per round, the wrapper says 3
        doc["learner"]["attributes"]["best_ntree_limit"] = "46"

    with pytest.raises(UnsupportedModelError, match="best_ntree_limit 46"):
        parse_xgboost(_edited("1.4.2_parallel3_early_stopped.json", limit))

    def odd_limit(doc):
        doc["learner"]["attributes"]["best_ntree_limit"] = "70"

    with pytest.raises(UnsupportedModelError, match="best_ntree_limit 70"):
        parse_xgboost(_edited("1.4.2_parallel3_early_stopped.json", odd_limit))

    def no_wrapper(doc):  # a Booster's file: the limit alone tells 3 trees per round
        del doc["learner"]["attributes"]["scikit_learn"]

    assert len(parse_xgboost(_edited("1.4.2_parallel3_early_stopped.json", no_wrapper)).trees) == 69

    def bad_classes(doc):
        meta = json.loads(doc["learner"]["attributes"]["scikit_learn"])
        meta["classes_"] = [3, 7]
        doc["learner"]["attributes"]["scikit_learn"] = json.dumps(meta)

    with pytest.raises(UnsupportedModelError, match="classes_"):
        parse_xgboost(_edited("1.5.2_labels_3_7_11.json", bad_classes))

    def not_json(doc):
        doc["learner"]["attributes"]["scikit_learn"] = "{not json"

    with pytest.raises(UnsupportedModelError, match="scikit_learn"):
        parse_xgboost(_edited("1.5.2_labels_3_7_11.json", not_json))


def test_a_nan_condition_is_refused_on_numeric_splits_only():
    def nan_numeric(doc):
        tree = doc["learner"]["gradient_booster"]["model"]["trees"][0]
        node = tree["split_type"].index(0)  # the root: a numeric split
        tree["split_conditions"][node] = float("nan")

    with pytest.raises(UnsupportedModelError, match="malformed tree structure"):
        parse_xgboost(_edited("1.7.6_categorical.json", nan_numeric))


@pytest.mark.parametrize("default_left", [False, True])
def test_xgboost_1_6_categorical_rule(default_left):
    """Codes {1, 4, 7}: in the set right, out of it left, invalid (negative, or 32 and
    past: the bit set's one word) the default way (right unless default_left)."""
    cuts, right = _cuts_16(np.array([1, 4, 7]), default_left)
    np.testing.assert_array_equal(cuts, [0, 1, 2, 4, 5, 7, 8, 32])
    invalid = not default_left
    np.testing.assert_array_equal(
        right, [invalid, False, True, False, True, False, True, False, invalid])
    cuts, _ = _cuts_16(np.array([0, 31, 32]), default_left)
    assert cuts[-1] == 64  # the set takes two words


def test_the_1_6_rule_applies_to_1_6_files_only():
    """The same categorical file read as 1.7 would send negative codes left: the 1.6
    fixture's recorded predictions then disagree, so the version decides."""
    path = DATA / "xgboost_old/1.6.2_categorical.json"
    ref = np.load(path.with_suffix(".npz"))

    def as_17(doc):
        doc["version"] = [1, 7, 6]

    model = parse_xgboost(_edited(path.name, as_17))
    assert np.any(model.predict(ref["X"]) != ref["pred"])


def test_a_lightgbm_2_wrapper_pickle_is_read_with_its_labels():
    """LightGBM 2.3.1 pickled an LGBMClassifier whose attributes LightGBM 4 does not take
    for fitted (its booster_ and classes_ raise): read from its booster and labels."""
    joblib = pytest.importorskip("joblib")
    pytest.importorskip("lightgbm")
    with warnings.catch_warnings():  # scikit-learn warns of the LabelEncoder's version
        warnings.simplefilter("ignore")
        wrapper = joblib.load(DATA / "lightgbm_old/2.3.1_wrapper.joblib")
    ref = np.load(DATA / "lightgbm_old/2.3.1_wrapper.npz")
    maps = CounterfactualMaps.build(wrapper)
    assert maps.classes == ["no", "yes"]
    np.testing.assert_array_equal(_indices(maps.classes, maps.predict(ref["X"])), ref["pred"])


def test_a_dart_model_saved_as_gbtree_is_refused():
    """XGBoost 3.4 saves a dart model (deprecated there) under the name "gbtree", with its
    trees' weights in ``weight_drop``: read as plain trees it answered wrong."""
    def weighted(doc):
        n = len(doc["learner"]["gradient_booster"]["model"]["trees"])
        doc["learner"]["gradient_booster"]["model"]["weight_drop"] = [0.9] * (n - 1) + [1.0]

    with pytest.raises(UnsupportedModelError, match="dart"):
        parse_xgboost(_edited("1.7.6_categorical.json", weighted))

    def unweighted(doc):  # every weight 1: the plain trees' model
        n = len(doc["learner"]["gradient_booster"]["model"]["trees"])
        doc["learner"]["gradient_booster"]["model"]["weight_drop"] = [1.0] * n

    assert len(parse_xgboost(_edited("1.7.6_categorical.json", unweighted)).trees) == 6
