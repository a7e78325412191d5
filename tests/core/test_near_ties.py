"""Near-ties at query time: mixed regions and near-tie boxes are labelled exactly.

Models built so that scores tie exactly on whole regions: a random forest with an even
number of trees and pure leaves (2-2 votes, sent to the lowest class), and binary
gradient boosting whose raw score is exactly 0 on whole
leaves (sent to class 1). The budgeted maps get no time at all, so the whole domain is one
mixed region and every label comes from the query path; the reference is the model's own
``predict`` and the complete maps.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

from maps_core import ArtifactError, CounterfactualMaps


def _tie_data(seed: int):
    rng = np.random.default_rng(seed)
    X = np.round(rng.uniform(-2, 2, size=(240, 3)), 1)
    y = ((X[:, 0] + 0.5 * X[:, 1] > 0) ^ (rng.random(240) < 0.25)).astype(int)
    return X, y


def _balanced_leaves_data():
    """Where x1 == 1, every point comes twice with opposite labels: from a zero init the
    gradients there cancel, leaves holding only such pairs get a Newton step of exactly 0,
    and the raw score is exactly 0 on that half (sklearn sends it to class 1)."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, size=(300, 3))
    X[:, 1] = rng.integers(0, 2, 300)
    y = (X[:, 0] + 0.3 * X[:, 2] > 0).astype(int)
    pairs = X[:, 1] == 1
    return np.vstack([X, X[pairs]]), np.concatenate([y, 1 - y[pairs]])


MODELS = {
    "rf-even-pure": lambda: RandomForestClassifier(4, random_state=0).fit(*_tie_data(0)),
    "gb-zero-margin": lambda: GradientBoostingClassifier(
        n_estimators=10, max_depth=3, init="zero", random_state=0).fit(*_balanced_leaves_data()),
}


def _has_exact_ties(model, P) -> bool:
    if isinstance(model, GradientBoostingClassifier):
        return bool(np.any(model.decision_function(P) == 0.0))
    proba = model.predict_proba(P)
    return bool(np.any(proba[:, 0] == proba[:, 1]))


@pytest.fixture(scope="module", params=sorted(MODELS))
def tie_case(request):
    model = MODELS[request.param]()
    complete = CounterfactualMaps.build(model, n_jobs=1)
    # no time at all: the whole domain stays one mixed region, refined by every query
    budgeted = CounterfactualMaps.build(model, max_seconds=0.0, n_jobs=1)
    assert complete.stats.mixed_regions == 0 and budgeted.stats.mixed_regions > 0
    return request.param, model, complete, budgeted


def _probe_points(model, complete, n: int = 3000) -> np.ndarray:
    """Random points plus a point at the closed upper end of every cell of every certified
    rectangle's lower corner (ties sit on whole cells)."""
    rng = np.random.default_rng(0)
    m = complete.n_features
    P = rng.uniform(-2.5, 2.5, size=(n, m))
    P[: n // 2, 1] = np.round(P[: n // 2, 1])  # on the GB's paired half (x1 == 1), too
    corners = complete.grid.cell_points(np.asarray(complete.partition.lo)[:500])
    return np.vstack([P, corners])


def test_labels_in_mixed_regions_equal_the_model(tie_case):
    name, model, complete, budgeted = tie_case
    P = _probe_points(model, complete)
    assert _has_exact_ties(model, P), f"{name}: the probe meets no exact tie (test is vacuous)"
    calls = []
    labeler = budgeted.engine.labeler
    assert labeler is not None

    def spy(points):
        calls.append(points.shape[0])
        return labeler(points)

    original = budgeted.engine
    budgeted.engine = replace(original, labeler=spy)
    try:
        want = model.predict(P)
        assert np.array_equal(budgeted.predict(P), want)
        assert np.array_equal(complete.predict(P), want)
    finally:
        budgeted.engine = original
    assert sum(calls) > 0, "no near-tie point reached the model: the route is not exercised"


def test_answers_near_ties_match_complete_maps(tie_case):
    name, model, complete, budgeted = tie_case
    rng = np.random.default_rng(1)
    Q = rng.uniform(-2.5, 2.5, size=(40, complete.n_features))
    for norm in ("l1", "l2", "linf"):
        for x in Q:
            for target in complete.classes:
                a = complete.counterfactual(x, target, norm=norm)
                b = budgeted.counterfactual(x, target, norm=norm)
                assert a.prediction == b.prediction == model.predict(x[None])[0]
                assert b.best.distance == pytest.approx(a.best.distance, rel=1e-12, abs=1e-12)
                assert model.predict(b.best.x[None])[0] == target, (name, norm, x, target)


def test_loaded_maps_decide_ties_by_the_attached_model(tie_case, tmp_path):
    """Maps loaded from disk have no model; attaching it restores the model's own
    decision on tie points, and a different model is refused."""
    name, model, _, budgeted = tie_case
    budgeted.save(tmp_path / "m")
    loaded = CounterfactualMaps.load(tmp_path / "m")
    assert loaded.engine.labeler is None
    loaded.attach_model(model)
    P = _probe_points(model, budgeted, n=1000)
    assert np.array_equal(loaded.predict(P), model.predict(P))
    other = RandomForestClassifier(2, max_depth=2, random_state=5).fit(*_tie_data(7))
    with pytest.raises(ArtifactError):
        loaded.attach_model(other)


def test_flat_arithmetic_is_exact_on_these_ties(tie_case):
    """Without the model, the fallback is still right here: gradient boosting sums the
    same terms in the same order as scikit-learn, and pure-leaf votes are integers, so
    their ties are exact in both (the module docs of maps_core.engine say where the
    fallback can differ: a forest's sums within an ulp)."""
    _, model, complete, _ = tie_case
    P = _probe_points(model, complete)
    flat = complete.ensemble.predict_index(P)
    assert np.array_equal(np.asarray(complete.classes)[flat], model.predict(P))


# -- the libraries' own probability arithmetic, where two classes nearly tie -------------
# Leaf values edited (seeded) so that near ties are common; the points are ones where two
# classes' probabilities tie to the last bit or one ulp apart (found by a QA fuzz).


def _edited_xgboost(seed: int):
    import json

    import xgboost as xgb

    vals = [1e-8, -1e-8, 3e-8, -3e-8, 5.96e-8, -5.96e-8, 1.2e-7, -1.2e-7, 0.1, -0.1, 0.25,
            -0.25, 0.0, 1.0, -1.0]
    rng = np.random.default_rng(seed)
    nc = int(rng.choice([2, 3, 4]))
    X = rng.normal(size=(300, 2))
    s = X[:, 0] + X[:, 1]
    y = np.digitize(s + rng.normal(0, 0.5, 300), np.quantile(s, np.linspace(0, 1, nc + 1)[1:-1]))
    obj = "binary:logistic" if nc == 2 else str(rng.choice(["multi:softprob", "multi:softmax"]))
    m = xgb.XGBClassifier(n_estimators=int(rng.integers(2, 5)), max_depth=2, objective=obj,
                          n_jobs=1, random_state=seed).fit(X, y)
    doc = json.loads(bytes(m.get_booster().save_raw("json")))
    for t in doc["learner"]["gradient_booster"]["model"]["trees"]:
        for i, left in enumerate(t["left_children"]):
            if left == -1:
                t["split_conditions"][i] = float(np.float32(rng.choice(vals)))
                t["base_weights"][i] = t["split_conditions"][i]
    lp = doc["learner"]["learner_model_param"]
    if nc == 2:
        lp["base_score"] = str(float(rng.choice([0.5, 0.5000001, 0.4999999])))
    elif rng.random() < 0.5:
        lp["base_score"] = "[" + ",".join(["0"] * nc) + "]"
    edited = xgb.XGBClassifier()
    edited.load_model(bytearray(json.dumps(doc).encode()))
    return edited, obj


def test_xgboost_softmax_sums_its_denominator_in_double():
    """XGBoost's Softmax adds the float32 exponentials in a double; summed in float32, the
    emulation broke this tie (classes 0 and 1) the other way."""
    from maps_core.adapters.xgboost_json import from_xgboost

    model, obj = _edited_xgboost(8)
    assert obj == "multi:softprob"
    p = np.array([[0.4378092798039275, -0.5673342692403718]])
    parsed = from_xgboost(model)
    assert np.array_equal(parsed.predict_proba(p), model.predict_proba(p))
    maps = CounterfactualMaps.build(model)
    assert maps.predict(p)[0] == parsed.predict(p)[0] == model.predict(p)[0]
    # asked for the class x already has, the answer is x itself, as XGBoost decides it
    res = maps.counterfactual(p[0], int(model.predict(p)[0]))
    assert res.best.distance == 0.0


def _edited_lightgbm(seed: int):
    import re

    import lightgbm as lgb

    vals = [1e-17, -1e-17, 5.551115123125783e-17, 0.1, 0.2, -0.3, 0.3, -0.1, 1e-16, -1e-16,
            0.0, 2.220446049250313e-16]
    rng = np.random.default_rng(seed)
    nc = int(rng.choice([2, 3, 4]))
    X = rng.normal(size=(300, 2))
    s = X[:, 0] + X[:, 1]
    y = np.digitize(s + rng.normal(0, 0.5, 300), np.quantile(s, np.linspace(0, 1, nc + 1)[1:-1]))
    kw = dict(n_estimators=int(rng.integers(2, 5)), num_leaves=4, min_child_samples=5,
              verbose=-1, random_state=seed, n_jobs=1)
    mode = str(rng.choice(["gbdt", "ova", "rf"]))
    if mode == "ova" and nc > 2:
        kw["objective"] = "multiclassova"
    if mode == "rf":
        kw.update(boosting_type="rf", bagging_freq=1, bagging_fraction=0.7)
    if nc == 2 and rng.random() < 0.5:
        kw["sigmoid"] = float(rng.choice([0.5, 3.0]))
    m = lgb.LGBMClassifier(**kw).fit(X, y)
    text = re.sub(r"leaf_value=([^\n]*)", lambda mt: "leaf_value=" + " ".join(
        repr(float(v)) for v in rng.choice(vals, len(mt.group(1).split()))),
        m.booster_.model_to_string())
    text = re.sub(r"\ntree_sizes=[^\n]*", "", text)
    m._Booster = lgb.Booster(model_str=text)  # LightGBM's own predict uses the edited trees
    return m, mode


@pytest.mark.parametrize(("seed", "point"), [(45, [0.08990692795487142, -0.7925331244379765]),
                                             (51, [0.889546517361941, -0.08251656497240516])])
def test_lightgbm_probabilities_use_the_c_library_exp(seed, point):
    """LightGBM computes std::exp; numpy's vectorised exp can be an ulp off, which broke
    these ties (multiclassova: class 3 against 0; random-forest mode: 1 against 2)."""
    from maps_core.adapters.lightgbm_text import parse_lightgbm

    model, _ = _edited_lightgbm(seed)
    p = np.array([point])
    parsed = parse_lightgbm(model.booster_.model_to_string())
    assert np.array_equal(parsed.predict_proba(p), model.predict_proba(p))
    maps = CounterfactualMaps.build(model)
    assert maps.predict(p)[0] == parsed.predict(p)[0] == model.predict(p)[0]
