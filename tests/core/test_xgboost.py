"""XGBoost JSON/UBJSON models: parsed without XGBoost, exact for ``XGBClassifier.predict``.

XGBoost is only the reference: every check compares with its own ``predict`` on a model
loaded from the very file cfmaps parsed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from maps_core import CounterfactualMaps, UnsupportedModelError
from maps_core.adapters.xgboost_json import parse_xgboost
from tests.brute_force import brute_force
from tests.conftest import region_end_points

xgb = pytest.importorskip("xgboost")


def _data(n_classes: int, seed: int = 0, n: int = 1200, m: int = 4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    y = ((X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int) if n_classes == 2
         else (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5))
    return X, y


KINDS = {
    "binary": (2, xgb.XGBClassifier, dict(n_estimators=30, max_depth=3)),
    "softprob": (3, xgb.XGBClassifier, dict(n_estimators=15, max_depth=3)),
    "softmax": (3, xgb.XGBClassifier, dict(objective="multi:softmax", n_estimators=10, max_depth=3)),
    "rf": (2, xgb.XGBRFClassifier, dict(n_estimators=20, max_depth=4)),
}


def _saved(clf, tmp: Path, ext: str):
    path = tmp / f"model.{ext}"
    clf.save_model(path)
    ref = type(clf)()
    ref.load_model(path)
    return ref, parse_xgboost(path.read_bytes())


@pytest.fixture(scope="module", params=[(k, e) for k in sorted(KINDS) for e in ("json", "ubj")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def fitted(request, tmp_path_factory):
    kind, ext = request.param
    n_classes, cls, kw = KINDS[kind]
    X, y = _data(n_classes)
    ref, model = _saved(cls(random_state=0, **kw).fit(X, y), tmp_path_factory.mktemp(kind), ext)
    return ref, model, X, CounterfactualMaps.build(model)


def test_faithful_to_xgboost_everywhere(fitted):
    """100k random points, the training rows, each float32 threshold and one float32 and
    one float64 step either side, each real boundary (halfway to the float32 below) and one
    float64 either side; the margins themselves are XGBoost's bit for bit."""
    ref, model, X, maps = fitted
    rng = np.random.default_rng(1)
    rows = [X, rng.normal(scale=2.0, size=(100_000, X.shape[1]))]
    for f in range(X.shape[1]):
        t = np.unique(np.concatenate([tr.value[(tr.left >= 0) & (tr.feature == f)] for tr in model.trees]))
        t64 = t.astype(np.float64)
        below = np.nextafter(t, np.float32(-np.inf)).astype(np.float64)
        b = (below + t64) / 2.0  # the real boundary: float32 rounding changes sides here
        vals = np.concatenate([t64, np.nextafter(t64, -np.inf), np.nextafter(t64, np.inf), below,
                               np.nextafter(t, np.float32(np.inf)).astype(np.float64),
                               b, np.nextafter(b, -np.inf), np.nextafter(b, np.inf)])
        P = X[rng.integers(0, len(X), size=vals.size)].copy()
        P[:, f] = vals
        rows.append(P)
    P = np.vstack(rows)
    want = ref.predict(P)
    assert np.array_equal(model.predict(P), want)
    assert np.array_equal(np.asarray(maps.predict(P)), want)
    margin = ref.predict(P[:5000], output_margin=True).reshape(5000, -1)
    assert np.array_equal(model.margins(P[:5000]), margin)


def test_a_probability_that_rounds_to_one_half_is_class_0(tmp_path):
    """XGBoost predicts class 1 only when the float32 probability exceeds 0.5, so a small
    positive margin whose probability rounds to 0.5 is class 0. Model files whose leaves
    all hold the same tiny value (base score 0.5: margin 0) put every margin there;
    XGBoost itself, loading each file, is the reference."""
    import json

    X, y = _data(2)
    xgb.XGBClassifier(n_estimators=1, max_depth=2, random_state=0).fit(X, y).save_model(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["learner"]["learner_model_param"]["base_score"] = "[5E-1]"
    tree = doc["learner"]["gradient_booster"]["model"]["trees"][0]
    seen = set()
    for v in (1e-9, 1e-8, 2e-8, 3e-8, 4e-8, 6e-8, 1e-7, 1e-6):
        tree["split_conditions"] = [float(np.float32(v)) if left == -1 else c
                                    for c, left in zip(tree["split_conditions"], tree["left_children"],
                                                       strict=True)]
        (tmp_path / "p.json").write_text(json.dumps(doc))
        ref = xgb.XGBClassifier()
        ref.load_model(tmp_path / "p.json")
        model = parse_xgboost((tmp_path / "p.json").read_bytes())
        want = ref.predict(X[:3])
        assert ref.predict(X[:3], output_margin=True)[0] > 0  # a positive margin, always
        assert np.array_equal(model.predict(X[:3]), want), v
        assert np.array_equal(np.asarray(CounterfactualMaps.build(model).predict(X[:3])), want), v
        seen.add(int(want[0]))
    assert seen == {0, 1}  # both sides of the rounding were exercised


@pytest.mark.parametrize("objective", ["multi:softmax", "multi:softprob"])
def test_scores_an_ulp_apart_follow_the_objective(objective, tmp_path):
    """Two class scores one float32 ulp apart round to the same float32 probability:
    ``multi:softmax`` takes the higher score (its argmax is over the scores), while
    ``multi:softprob`` takes the first of the tied probabilities. Found by a fuzz round
    (an XGBoost 3-class model whose maps labelled such a point as the other class). The
    files hold no split that matters (every leaf 0), so the base scores are the scores;
    XGBoost itself, loading each file, is the reference."""
    import json

    X, y = _data(3)
    xgb.XGBClassifier(objective=objective, n_estimators=1, max_depth=1,
                      random_state=0).fit(X, y).save_model(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    top = np.float32(-0.23410137)
    scores = [np.nextafter(top, np.float32(-np.inf)), np.float32(-0.347812), top]
    doc["learner"]["learner_model_param"]["base_score"] = (
        "[" + ",".join(repr(float(v)) for v in scores) + "]")
    for tree in doc["learner"]["gradient_booster"]["model"]["trees"]:
        tree["split_conditions"] = [0.0 if left == -1 else c for c, left
                                    in zip(tree["split_conditions"], tree["left_children"],
                                           strict=True)]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    ref = xgb.XGBClassifier()
    ref.load_model(tmp_path / "p.json")
    model = parse_xgboost((tmp_path / "p.json").read_bytes())
    P = X[:5]
    want = ref.predict(P)
    assert np.array_equal(model.margins(P), ref.predict(P, output_margin=True))
    proba = model.predict_proba(P)
    assert proba[0, 0] == proba[0, 2]  # the float32 probabilities tie
    assert set(want) == ({2} if objective == "multi:softmax" else {0})
    assert np.array_equal(model.predict(P), want)
    assert np.array_equal(np.asarray(CounterfactualMaps.build(model).predict(P)), want)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_distances_equal_the_brute_force(n_classes, norm, tmp_path):
    X, y = _data(n_classes, seed=3, m=3)
    ref, model = _saved(xgb.XGBClassifier(n_estimators=4, max_depth=2, random_state=0).fit(X, y),
                        tmp_path, "json")
    maps = CounterfactualMaps.build(model)
    rng = np.random.default_rng(4)
    for x in X[rng.choice(len(X), 8, replace=False)]:
        w = rng.uniform(0.3, 2.0, size=3)
        for target in range(n_classes):
            res = maps.counterfactual(x, target, norm=norm, weights=w)
            want = brute_force(ref, x, target, w, norm)
            assert res.best.distance == pytest.approx(want, rel=1e-9, abs=1e-12)
            cf = res.best
            assert ref.predict(cf.x[None])[0] == target
            P = region_end_points(cf.region, cf.x)
            assert P.size == 0 or np.all(ref.predict(P) == target)


def test_refusals_name_the_problem(tmp_path):
    X, y = _data(2)
    reg = xgb.XGBRegressor(n_estimators=2).fit(X, X[:, 0])
    reg.save_model(tmp_path / "reg.json")
    with pytest.raises(UnsupportedModelError, match="objective 'reg:squarederror'"):
        parse_xgboost((tmp_path / "reg.json").read_bytes())
    one = xgb.XGBClassifier(n_estimators=2).fit(X, np.zeros(len(X), dtype=int))
    one.save_model(tmp_path / "one.json")
    with pytest.raises(UnsupportedModelError, match="fitted on a single class"):
        parse_xgboost((tmp_path / "one.json").read_bytes())
    dart = xgb.XGBClassifier(booster="dart", n_estimators=2).fit(X, y)
    dart.save_model(tmp_path / "dart.json")
    with pytest.raises(UnsupportedModelError, match="dart"):
        parse_xgboost((tmp_path / "dart.json").read_bytes())
    good = xgb.XGBClassifier(n_estimators=2).fit(X, y)
    good.save_model(tmp_path / "good.json")
    data = (tmp_path / "good.json").read_bytes()
    with pytest.raises(UnsupportedModelError, match="truncated or malformed"):
        parse_xgboost(data[: len(data) // 2])
    good.save_model(tmp_path / "good.ubj")
    ubj = (tmp_path / "good.ubj").read_bytes()
    with pytest.raises(UnsupportedModelError, match="truncated"):
        parse_xgboost(ubj[: len(ubj) // 2])
    # a categorical split without its codes (test_categorical_splits: the real ones)
    import json

    doc = json.loads(data)
    tree = doc["learner"]["gradient_booster"]["model"]["trees"][0]
    tree["split_type"][0] = 1
    tree["categories_nodes"] = [0]
    with pytest.raises(UnsupportedModelError, match="malformed categorical split"):
        parse_xgboost(json.dumps(doc).encode())


# -- hardening: early stopping, file layouts, hostile files ------------------------------
def _doc(tmp_path: Path, n_classes: int = 2, **kw):
    """A small fitted model's JSON document (seeded)."""
    import json

    X, y = _data(n_classes, n=300)
    xgb.XGBClassifier(n_estimators=3, max_depth=2, random_state=0, **kw).fit(X, y).save_model(
        tmp_path / "m.json")
    return json.loads((tmp_path / "m.json").read_bytes())


@pytest.mark.parametrize("ext", ["json", "ubj"])
@pytest.mark.parametrize("n_classes, parallel", [(2, 1), (3, 2)])
def test_early_stopping_uses_the_best_iteration(ext, n_classes, parallel, tmp_path):
    """The file keeps every round; XGBClassifier.predict uses rounds 0..best_iteration, so
    must cfmaps (a round: n_groups x num_parallel_tree trees)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = (X[:, 0] + 0.5 * rng.normal(size=600) > 0).astype(int)
    if n_classes == 3:
        y = y + (X[:, 1] + 0.5 * rng.normal(size=600) > 0.5)
    clf = xgb.XGBClassifier(n_estimators=200, max_depth=3, learning_rate=0.5, early_stopping_rounds=3,
                            num_parallel_tree=parallel, random_state=0)
    clf.fit(X[:300], y[:300], eval_set=[(X[300:], y[300:])], verbose=False)
    ref, model = _saved(clf, tmp_path, ext)
    rounds = clf.get_booster().num_boosted_rounds()
    assert ref.best_iteration + 1 < rounds  # the stored model has rounds predict skips
    groups = 1 if n_classes == 2 else n_classes
    assert len(model.trees) == (ref.best_iteration + 1) * groups * parallel
    P = rng.normal(scale=1.5, size=(20_000, 3))
    want = ref.predict(P)
    assert np.array_equal(model.predict(P), want)
    assert np.array_equal(np.asarray(CounterfactualMaps.build(model).predict(P)), want)
    margin = ref.predict(P[:2000], output_margin=True).reshape(2000, -1)
    assert np.array_equal(model.margins(P[:2000]), margin)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_a_booster_after_early_stopping_is_read_with_every_tree(n_classes):
    """``xgb.train`` with early stopping returns a Booster whose ``predict`` uses every
    tree (unless given an iteration_range), though it stores best_iteration: the maps
    follow that object's own predict, while its wrapper's stop at the best round."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = (X[:, 0] + 0.8 * rng.normal(size=600) > 0).astype(int)
    if n_classes == 3:
        y = y + (X[:, 1] + 0.5 * rng.normal(size=600) > 0.5)
    params = {"objective": "binary:logistic", "max_depth": 3, "eta": 0.8, "seed": 0}
    if n_classes == 3:
        params.update(objective="multi:softprob", num_class=3)
    bst = xgb.train(params, xgb.DMatrix(X[:300], y[:300]), 200, verbose_eval=False,
                    evals=[(xgb.DMatrix(X[300:], y[300:]), "va")], early_stopping_rounds=3)
    assert bst.best_iteration + 1 < bst.num_boosted_rounds()  # rounds past the best
    P = rng.normal(scale=1.5, size=(20_000, 3))
    proba = bst.predict(xgb.DMatrix(P))
    own = (proba > 0.5).astype(int) if n_classes == 2 else np.argmax(proba, axis=1)
    best = bst.predict(xgb.DMatrix(P), iteration_range=(0, bst.best_iteration + 1))
    best = (best > 0.5).astype(int) if n_classes == 2 else np.argmax(best, axis=1)
    assert np.any(own != best)  # the case under test: the two readings differ somewhere
    maps = CounterfactualMaps.build(bst)
    assert np.array_equal(np.asarray(maps.predict(P)).astype(int), own)
    for x in P[:5]:
        res = maps.counterfactual(x)
        p = bst.predict(xgb.DMatrix(res.best.x[None]))
        got = int(p[0] > 0.5) if n_classes == 2 else int(np.argmax(p[0]))
        assert got == res.best.target != res.prediction


def test_best_iteration_edge_values(tmp_path):
    """-1 is every round (XGBoost's iteration_range (0, 0)); a round the file does not have
    is refused (XGBoost's predict fails on it); files without iteration_indptr (XGBoost < 2)
    count rounds of n_groups x num_parallel_tree trees."""
    import json

    doc = _doc(tmp_path, n_classes=3)
    doc["learner"]["attributes"]["best_iteration"] = "-1"
    assert len(parse_xgboost(json.dumps(doc).encode()).trees) == 9
    doc["learner"]["attributes"]["best_iteration"] = "1"
    assert len(parse_xgboost(json.dumps(doc).encode()).trees) == 6
    del doc["learner"]["gradient_booster"]["model"]["iteration_indptr"]
    assert len(parse_xgboost(json.dumps(doc).encode()).trees) == 6
    for bad, words in (("3", "best_iteration 3 is not one of its 3 rounds"), ("x", "malformed")):
        doc["learner"]["attributes"]["best_iteration"] = bad
        with pytest.raises(UnsupportedModelError, match=words):
            parse_xgboost(json.dumps(doc).encode())


def test_multi_output_trees_are_named(tmp_path):
    X, y = _data(3, n=300)
    clf = xgb.XGBClassifier(n_estimators=2, max_depth=2, tree_method="hist",
                            multi_strategy="multi_output_tree", random_state=0).fit(X, y)
    for ext in ("json", "ubj"):
        clf.save_model(tmp_path / f"m.{ext}")
        with pytest.raises(UnsupportedModelError, match="multi-output trees"):
            parse_xgboost((tmp_path / f"m.{ext}").read_bytes())


def test_pretty_printed_json_is_json(tmp_path):
    """Whitespace, a newline or a UTF-8 byte order mark before or inside the opening of a
    JSON file: still JSON, not UBJSON."""
    import json

    from maps_core.adapters.xgboost_json import is_json

    doc = _doc(tmp_path)
    compact = parse_xgboost(json.dumps(doc).encode())
    P = np.random.default_rng(0).normal(size=(500, 4))
    for blob in (json.dumps(doc, indent=2).encode(), b"\n  " + json.dumps(doc, indent=4).encode(),
                 b"\xef\xbb\xbf" + json.dumps(doc, indent="\t").encode()):
        assert is_json(blob)
        assert np.array_equal(parse_xgboost(blob).margins(P), compact.margins(P))
    xgb.XGBClassifier(n_estimators=2).fit(*_data(2, n=100)).save_model(tmp_path / "m.ubj")
    assert not is_json((tmp_path / "m.ubj").read_bytes())


def test_integers_beyond_int64_are_malformed(tmp_path):
    import json

    doc = _doc(tmp_path)
    doc["learner"]["gradient_booster"]["model"]["trees"][0]["split_indices"][0] = 10**30
    with pytest.raises(UnsupportedModelError, match="malformed tree 0"):
        parse_xgboost(json.dumps(doc).encode())
    doc = _doc(tmp_path)
    doc["learner"]["gradient_booster"]["model"]["trees"][0]["split_conditions"][0] = 10**400
    with pytest.raises(UnsupportedModelError, match="malformed tree 0"):
        parse_xgboost(json.dumps(doc).encode())
    # past Python's limit on an integer's digits (4,300), json.loads raises a ValueError
    with pytest.raises(UnsupportedModelError, match="truncated or malformed"):
        parse_xgboost(b'{"learner": {"x": ' + b"9" * 5000 + b"}}")
    doc = _doc(tmp_path)
    doc["learner"]["learner_model_param"]["num_feature"] = 1e400  # Infinity in the file
    with pytest.raises(UnsupportedModelError, match="out of range"):
        parse_xgboost(json.dumps(doc).encode())


@pytest.mark.parametrize("bad", [2.5, 2.0, "2", True])
@pytest.mark.parametrize("key", ["categories", "left_children", "split_indices"])
def test_integers_that_are_not_json_integers_are_malformed(key, bad, tmp_path):
    """XGBoost's loader refuses a number, string or bool where it reads an integer; numpy
    would truncate 2.5 to 2 and parse "2", loading a model XGBoost does not have."""
    import json

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.integers(0, 6, 300), rng.normal(size=300)]).astype(float)
    y = ((X[:, 0] % 2 == 0) ^ (X[:, 1] > 0)).astype(int)
    xgb.XGBClassifier(n_estimators=2, max_depth=2, enable_categorical=True, feature_types=["c", "q"],
                      max_cat_to_onehot=1, random_state=0).fit(X, y).save_model(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_bytes())
    i, tree = next((i, t) for i, t in enumerate(doc["learner"]["gradient_booster"]["model"]["trees"])
                   if t["categories"])
    parse_xgboost(json.dumps(doc).encode())  # as written: loads
    tree[key][0] = bad
    with pytest.raises(UnsupportedModelError, match=f"malformed tree {i}"):
        parse_xgboost(json.dumps(doc).encode())


def test_hostile_ubjson_and_nesting_are_refused_at_once():
    import struct
    import time

    t0 = time.perf_counter()
    for typ in (b"Z", b"T", b"F"):  # elements that read no bytes: 2**62 of them in 20 bytes
        with pytest.raises(UnsupportedModelError, match="container of 4611686018427387904 elements"):
            parse_xgboost(b"{U\x07learner[$" + typ + b"#L" + struct.pack(">q", 2**62) + b"}")
    with pytest.raises(UnsupportedModelError, match="negative length"):
        parse_xgboost(b"{U\x07learner[#i\xff]}")
    with pytest.raises(UnsupportedModelError, match="negative length"):
        parse_xgboost(b"{i\xfflearner}")
    with pytest.raises(UnsupportedModelError, match="length of type"):
        parse_xgboost(b"{U\x07learner[#d" + struct.pack(">f", float("nan")) + b"]}")
    for deep in (b'{"learner": ' + b"[" * 100_000, b"{U\x07learner" + b"[" * 100_000):
        with pytest.raises(UnsupportedModelError, match="nested too deeply|truncated"):
            parse_xgboost(deep)
    assert time.perf_counter() - t0 < 5.0


def test_size_limits_are_checked_before_allocating(tmp_path):
    import json

    from maps_core.adapters._trees import MAX_NODE_VALUES

    doc = _doc(tmp_path)
    doc["learner"]["learner_model_param"]["num_feature"] = "1000000000"
    with pytest.raises(UnsupportedModelError, match="1000000000 features; cfmaps supports 0 to 100,000"):
        parse_xgboost(json.dumps(doc).encode())
    doc = _doc(tmp_path)
    doc["learner"]["learner_model_param"]["num_class"] = str(10**6)
    doc["learner"]["objective"]["name"] = "multi:softprob"
    with pytest.raises(UnsupportedModelError, match="1000000 classes; cfmaps supports at most 10,000"):
        parse_xgboost(json.dumps(doc).encode())
    # 10,000 classes are fine, but not with trees whose nodes times classes pass the bound
    doc = _doc(tmp_path)
    model = doc["learner"]["gradient_booster"]["model"]
    k, tree = 10_000, model["trees"][0]
    n = MAX_NODE_VALUES // (k * len(tree["left_children"])) + 1
    doc["learner"]["learner_model_param"].update(num_class=str(k), base_score="0")
    doc["learner"]["objective"]["name"] = "multi:softprob"
    model.update(trees=[tree] * n, tree_info=[0] * n, iteration_indptr=[0, n])
    with pytest.raises(UnsupportedModelError, match="times 10000 classes is more than the 33,554,432"):
        parse_xgboost(json.dumps(doc).encode())
    model.update(trees=[tree] * 10, tree_info=[0] * 10, iteration_indptr=[0, 10])
    assert parse_xgboost(json.dumps(doc).encode()).n_classes == k


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_split_conditions_of_infinity_are_read(sign):
    """``tree_method="exact"`` on values near float32's largest stores the overflowing
    midpoint as a split condition of +inf or -inf; XGBoost predicts with it, and the model
    was refused as "malformed". ``float32(x) < inf`` holds for every input the maps take
    (within float32's range), ``< -inf`` for none."""
    import json

    big = float(np.finfo(np.float32).max)
    near = big * (1 - 2.0**-23)
    rng = np.random.default_rng(1)
    x0 = sign * rng.choice([near, big], 300)
    X = np.column_stack([x0, rng.normal(size=300)])
    y = ((X[:, 1] > 0.0) | ((x0 == sign * big) & (X[:, 1] > -1))).astype(int)
    model = xgb.XGBClassifier(n_estimators=4, max_depth=3, learning_rate=1.0,
                              tree_method="exact", random_state=0).fit(X, y)
    trees = json.loads(bytes(model.get_booster().save_raw("json")))[
        "learner"]["gradient_booster"]["model"]["trees"]
    conds = [c for t in trees for c, left in zip(t["split_conditions"], t["left_children"],
                                                 strict=True) if left >= 0]
    assert not np.all(np.isfinite(conds))  # the case under test
    maps = CounterfactualMaps.build(model)
    vals = [big, -big, near, -near, 0.0, 1e38, -1e38]
    vals += [float(np.nextafter(v, d)) for v in vals for d in (np.inf, -np.inf)]
    P = np.array([[v, w] for v in vals if abs(v) <= big for w in (-1.0, 0.5, 1.0, 1.5, 3.0)])
    np.testing.assert_array_equal(maps.predict(P), model.predict(P))
    assert np.unique(model.predict(P)).size == 2
    for x in P:
        res = maps.counterfactual(x)
        assert res.best is not None, res
        assert model.predict(res.best.x[None])[0] == res.best.target
