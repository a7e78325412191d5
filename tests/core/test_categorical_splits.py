"""Categorical splits (LightGBM's ``categorical_feature``, XGBoost's
``enable_categorical``, HistGradientBoosting's ``categorical_features``): unfolded into
plain splits that decide every real input as the library does, and answered exactly.

The library is the reference throughout: its own ``predict`` on dense grids of real inputs
around every code, and the brute forces of ``tests.brute_force`` and ``tests.recourse``,
whose cells it labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier

from maps_core import CounterfactualMaps, FeatureSchema, UnsupportedModelError
from maps_core.adapters import flatten_model
from maps_core.adapters import lightgbm_text as lt
from maps_core.adapters import xgboost_json as xj
from maps_core.adapters._trees import code_set_cuts
from maps_core.adapters.lightgbm_text import parse_lightgbm
from maps_core.adapters.xgboost_json import parse_xgboost
from maps_core.schema import Feature
from tests.brute_force import brute_force
from tests.conftest import region_end_points
from tests.library_splits import engine_model
from tests.recourse import BruteForce, Col

lgb = pytest.importorskip("lightgbm")
xgb = pytest.importorskip("xgboost")

#: codes of the two categorical columns (0 and 2); column 1 is continuous
N_CODES = (12, 30)


def _data(n_classes: int, seed: int = 0, n: int = 3000):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(0, N_CODES[0], n), rng.normal(size=n),
                         rng.integers(0, N_CODES[1], n)]).astype(float)
    a = np.isin(X[:, 0], (0, 3, 7, 8))
    b = np.isin(X[:, 2], (1, 2, 3, 10, 20, 21))
    if n_classes == 2:
        y = (a ^ (X[:, 1] > 0.3) ^ b).astype(int)
    else:
        y = a.astype(int) + (b & (X[:, 1] > 0))
    return X, y


#: name -> (library, classes, estimator arguments)
KINDS = {
    # many-vs-many sets (codes sorted by gradient statistics, then split)
    "lgbm-binary": ("lightgbm", 2, dict(n_estimators=20, num_leaves=8)),
    # one-vs-rest splits on the 12-code column, sets on the 30-code one
    "lgbm-onehot": ("lightgbm", 2, dict(n_estimators=10, num_leaves=16, max_cat_to_onehot=16)),
    "lgbm-multiclass": ("lightgbm", 3, dict(n_estimators=8, num_leaves=6)),
    "lgbm-rf": ("lightgbm", 2, dict(boosting_type="rf", n_estimators=10, num_leaves=8,
                                    bagging_freq=1, bagging_fraction=0.7)),
    "xgb-binary": ("xgboost", 2, dict(n_estimators=15, max_depth=4)),
    "xgb-onehot": ("xgboost", 2, dict(n_estimators=10, max_depth=4, max_cat_to_onehot=16)),
    "xgb-multiclass": ("xgboost", 3, dict(n_estimators=6, max_depth=3)),
    "hgb-binary": ("hist-gb", 2, dict(max_iter=15, max_leaf_nodes=8)),
    "hgb-multiclass": ("hist-gb", 3, dict(max_iter=6, max_leaf_nodes=6)),
}


def _fit(library: str, n_classes: int, **kw: Any):
    """The library's classifier on :func:`_data`, columns 0 and 2 categorical."""
    X, y = _data(n_classes)
    if library == "lightgbm":
        clf = lgb.LGBMClassifier(verbose=-1, random_state=0, min_child_samples=5,
                                 min_data_per_group=5, cat_smooth=1, **kw)
        return clf.fit(X, y, categorical_feature=[0, 2]), X
    if library == "hist-gb":
        return HistGradientBoostingClassifier(categorical_features=[0, 2], random_state=0,
                                              **kw).fit(X, y), X
    clf = xgb.XGBClassifier(enable_categorical=True, feature_types=["c", "q", "c"],
                            random_state=0, n_jobs=1, **kw)
    return clf.fit(X, y), X


def _raw(clf: Any, P: np.ndarray) -> np.ndarray:
    """The library's raw scores, shape (n, 1) for two classes, else (n, classes)."""
    if hasattr(clf, "booster_"):
        raw = clf.predict(P, raw_score=True)
    elif hasattr(clf, "get_booster"):
        raw = clf.predict(P, output_margin=True)
    else:
        raw = clf.decision_function(P)
    return raw[:, None] if raw.ndim == 1 else raw


@pytest.fixture(scope="module", params=sorted(KINDS))
def fitted(request):
    library, n_classes, kw = KINDS[request.param]
    clf, X = _fit(library, n_classes, **kw)
    model = engine_model(clf)
    if library == "hist-gb":
        assert any(np.any(p.nodes["is_categorical"]) for s in clf._predictors for p in s)  # noqa: SLF001
    else:
        assert any((t.categorical().any() if library == "lightgbm" else t.categories)
                   for t in model.trees)
    return clf, model, X


def _real_points(rng: np.random.Generator, n: int) -> np.ndarray:
    """Inputs on and around every code: integers, one float64 either side, quarters,
    negatives down to -3, values past the codes and past int32, +-0 and tiny values."""
    top = max(N_CODES) + 5.0
    ints = np.arange(-3.0, top)
    vals = np.concatenate([ints, np.nextafter(ints, np.inf), np.nextafter(ints, -np.inf),
                           np.arange(-3.0, top, 0.25),
                           [1e9, 2.0**31, 3e9, -3e9, 1e-40, -1e-40, 0.0, -0.0, -0.5, 0.999]])
    return np.column_stack([rng.choice(vals, n), rng.normal(size=n), rng.choice(vals, n)])


def test_unfolded_trees_decide_every_real_input_as_the_library(fitted):
    """The flat ensemble, the parsed model's own emulation and the maps built from it
    predict what the library predicts, on 100k real inputs around the codes and the rows."""
    clf, model, X = fitted
    P = np.vstack([X, _real_points(np.random.default_rng(1), 100_000)])
    want = clf.predict(P)
    assert np.array_equal(model.predict(P), want)
    ens = flatten_model(model)
    assert np.array_equal(ens.predict_index(P), np.searchsorted(clf.classes_, want))
    scores = ens.decision_scores(P)
    mine = scores[:, 1:] if len(clf.classes_) == 2 else scores
    if getattr(model, "average_output", False):  # raw_score is the trees' sum, the decision their mean
        mine = mine * (len(model.trees) // model.n_tree_per_iteration)
    # XGBoost sums in float32, the flat ensemble in float64
    assert np.allclose(mine, _raw(clf, P), rtol=0, atol=1e-4 if hasattr(clf, "get_booster") else 1e-9)
    maps = CounterfactualMaps.build(model, max_rectangles=20_000)
    assert np.array_equal(np.asarray(maps.predict(P[:20_000])), want[:20_000])


SMALL = {"lightgbm": dict(n_estimators=4, num_leaves=5), "xgboost": dict(n_estimators=3, max_depth=3),
         "hist-gb": dict(max_iter=4, max_leaf_nodes=5)}


@pytest.mark.parametrize("library", sorted(SMALL))
@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_distances_equal_the_brute_force_on_the_real_line(library, norm):
    """Every feature continuous (the codes' columns too): the optimum over real inputs,
    the answer valid by the library's predict up to its region's ends."""
    clf, X = _fit(library, 2, **SMALL[library])
    maps = CounterfactualMaps.build(engine_model(clf))
    rng = np.random.default_rng(4)
    for x in X[rng.choice(len(X), 6, replace=False)]:
        w = rng.uniform(0.3, 2.0, size=3)
        target = 1 - int(clf.predict(x[None])[0])
        res = maps.counterfactual(x, target, norm=norm, weights=w)
        assert res.best.distance == pytest.approx(brute_force(clf, x, target, w, norm),
                                                  rel=1e-9, abs=1e-12)
        assert clf.predict(res.best.x[None])[0] == target
        P = region_end_points(res.best.region, res.best.x)
        assert P.size == 0 or np.all(clf.predict(P) == target)


@pytest.mark.parametrize("library", sorted(SMALL))
@pytest.mark.parametrize("kind", ["integer", "nominal"])
@pytest.mark.parametrize("norm", ["l1", "l2", "linf", "l0"])
def test_codes_land_on_legal_codes(library, kind, norm):
    """The codes' columns declared integer or nominal over their codes: the optimum over
    legal inputs (``tests.recourse.BruteForce``), and every answer a legal code the library
    predicts as the target."""
    clf, X = _fit(library, 3, **SMALL[library])
    cols = [Col("a", kind, 0, N_CODES[0] - 1), Col("x", "continuous"),
            Col("b", kind, 0, N_CODES[1] - 1)]
    schema = FeatureSchema(tuple(Feature(c.name, c.type, c.lower, c.upper) for c in cols))
    maps = CounterfactualMaps.build(engine_model(clf), schema)
    bf = BruteForce(clf, cols)
    rng = np.random.default_rng(5)
    w = schema.default_weights()
    for x in X[rng.choice(len(X), 5, replace=False)]:
        own = int(clf.predict(x[None])[0])
        for target in (t for t in range(3) if t != own):
            cells = bf.solve(x, [target], {}, w, norm)
            res = maps.counterfactual(x, target, norm=norm)
            if cells.dist.size == 0:
                assert not res.feasible
                continue
            assert res.best.distance == pytest.approx(cells.dist.min(), rel=1e-9, abs=1e-12)
            cf = res.best.x
            assert cf[0] == np.round(cf[0]) and cf[2] == np.round(cf[2])
            assert 0 <= cf[0] < N_CODES[0] and 0 <= cf[2] < N_CODES[1]
            assert clf.predict(cf[None])[0] == target


def test_a_set_of_codes_becomes_one_interval_per_run():
    """Code 0 starts just above ``lowest``, code c >= 1 at c itself (``x > prev(c)``)."""
    cuts, inside = code_set_cuts(np.array([8, 0, 1, 5, 7]), strict=False, lowest=-1.0)
    below = np.nextafter
    assert cuts.tolist() == [-1.0, below(2.0, 0), below(5.0, 0), below(6.0, 0),
                             below(7.0, 0), below(9.0, 0)]
    assert inside.tolist() == [False, True, False, True, False, True, False]
    empty_cuts, empty_inside = code_set_cuts(np.zeros(0, dtype=np.int64), strict=False)
    assert empty_cuts.size == 0 and empty_inside.tolist() == [False]


def test_xgboost_refusals_name_the_problem(monkeypatch):
    import json

    clf, _ = _fit("xgboost", 2, n_estimators=2, max_depth=4)
    doc = json.loads(bytes(clf.get_booster().save_raw("json")))
    tree = doc["learner"]["gradient_booster"]["model"]["trees"][0]
    assert tree["categories_nodes"]
    good = json.dumps(doc).encode()
    tree["categories"] = [-1] + tree["categories"][1:]  # a negative code
    with pytest.raises(UnsupportedModelError, match="malformed categorical split"):
        parse_xgboost(json.dumps(doc).encode())
    tree["categories_nodes"] = tree["categories_nodes"][1:]  # a split without its codes
    with pytest.raises(UnsupportedModelError, match="malformed categorical split"):
        parse_xgboost(json.dumps(doc).encode())
    monkeypatch.setattr(xj, "MAX_UNFOLDED_NODES", 8)
    with pytest.raises(UnsupportedModelError, match="unfold to more than 8 nodes"):
        flatten_model(parse_xgboost(good))


def test_lightgbm_refusals_name_the_problem(monkeypatch):
    clf, _ = _fit("lightgbm", 2, n_estimators=2, num_leaves=8)
    text = clf.booster_.model_to_string()
    # the split's index into cat_boundaries out of range
    head, tail = text.split("Tree=0", 1)
    block, rest = tail.split("\n\n", 1)
    bad = block.replace("cat_boundaries=0", "cat_boundaries=1", 1)
    assert bad != block
    with pytest.raises(UnsupportedModelError, match="malformed categorical split"):
        parse_lightgbm(head + "Tree=0" + bad + "\n\n" + rest)
    # chains too long to unfold
    monkeypatch.setattr(lt, "MAX_UNFOLDED_NODES", 8)
    with pytest.raises(UnsupportedModelError, match="unfold to more than 8 nodes"):
        flatten_model(parse_lightgbm(text))


# What LightGBM and XGBoost store for a model fitted on pandas ``category`` columns (the
# formats as lightgbm 4.7 and xgboost 3.2 write them; pandas is no test dependency).
NUMBERS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]
CODES, STRINGS, SECOND = list(range(12)), list("abcdefghijkl"), list(range(30))


@pytest.mark.parametrize("stored", ["numbers", "codes", "strings"])
def test_pandas_categories_other_than_their_codes_are_refused(stored):
    """The libraries' predict on a DataFrame maps each stored category to its position;
    numbers other than 0..n-1 would be read by cfmaps as codes they are not."""
    import json

    values = {"numbers": NUMBERS, "codes": CODES, "strings": STRINGS}[stored]
    clf, X = _fit("lightgbm", 2, n_estimators=2, num_leaves=8)
    text = clf.booster_.model_to_string()
    assert "\npandas_categorical:null" in text
    lgb_text = text.replace("pandas_categorical:null",
                            "pandas_categorical:" + json.dumps([values, SECOND]))
    xclf, _ = _fit("xgboost", 2, n_estimators=2, max_depth=4)
    doc = json.loads(bytes(xclf.get_booster().save_raw("json")))
    enc = ({"offsets": list(range(13)), "values": [ord(c) for c in values]} if stored == "strings"
           else {"type": 15, "values": values})
    doc["learner"]["gradient_booster"]["model"]["cats"] = {
        "enc": [enc, {"offsets": [], "values": []}, {"type": 15, "values": SECOND}],
        "feature_segments": [0, 12, 12, 42], "sorted_idx": list(range(42))}
    xgb_file = json.dumps(doc).encode()
    if stored == "numbers":
        for parse, data, where in ((parse_lightgbm, lgb_text, "categorical column #0"),
                                   (parse_xgboost, xgb_file, "feature #0")):
            with pytest.raises(UnsupportedModelError, match=f"{where}: the categories are the "
                               r"values \[10, 20, 30, 40, 50, 60, \.\.\.\]"):
                parse(data)
        return
    # codes 0..n-1 and strings (a query can only name them by their codes) are served as
    # codes, as the library's predict reads an array
    for model, data, parse in ((clf, lgb_text, parse_lightgbm), (xclf, xgb_file, parse_xgboost)):
        maps = CounterfactualMaps.build(parse(data), max_rectangles=1000)
        assert np.array_equal(maps.predict(X[:500]), model.predict(X[:500]))


def test_malformed_stored_categories_are_refused():
    import json

    clf, _ = _fit("lightgbm", 2, n_estimators=2, num_leaves=8)
    text = clf.booster_.model_to_string()
    for bad in ("[[1, 2", "{}", "[1, 2]"):
        with pytest.raises(UnsupportedModelError, match="malformed pandas_categorical"):
            parse_lightgbm(text.replace("pandas_categorical:null", "pandas_categorical:" + bad))
    xclf, _ = _fit("xgboost", 2, n_estimators=2, max_depth=4)
    doc = json.loads(bytes(xclf.get_booster().save_raw("json")))
    for bad in ({"enc": 3}, {"enc": [{"type": 15, "values": ["x", 2]}]}, [1]):
        doc["learner"]["gradient_booster"]["model"]["cats"] = bad
        with pytest.raises(UnsupportedModelError, match="malformed stored categories"):
            parse_xgboost(json.dumps(doc).encode())


@pytest.mark.parametrize("library", ["lightgbm", "xgboost"])
def test_the_libraries_objects_build_the_same_maps(library):
    """``CounterfactualMaps.build`` takes the fitted object itself (read through its own
    dump): the same flat trees as its parsed file, and the same answers."""
    clf, X = _fit(library, 2, **SMALL[library])
    direct = CounterfactualMaps.build(clf)
    parsed = CounterfactualMaps.build(engine_model(clf))
    assert direct.ensemble.fingerprint() == parsed.ensemble.fingerprint()
    res = direct.counterfactual(X[0])
    assert res.best.distance == parsed.counterfactual(X[0]).best.distance
    assert clf.predict(res.best.x[None])[0] == res.target
