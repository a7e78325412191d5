"""LightGBM text models: parsed without LightGBM, exact for ``LGBMClassifier.predict``.

LightGBM itself is used only as the reference here: every check compares with its own
``predict`` on the booster the text file came from.
"""

from __future__ import annotations

import numpy as np
import pytest

from maps_core import CounterfactualMaps, InvalidQueryError, UnsupportedModelError
from maps_core.adapters.lightgbm_text import parse_lightgbm
from tests.brute_force import brute_force
from tests.conftest import region_end_points

lgb = pytest.importorskip("lightgbm")


def _data(n_classes: int, seed: int = 0, n: int = 800, m: int = 4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    if n_classes == 2:
        y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int)
    else:
        y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)
    return X, y


KINDS = {
    "binary": (2, dict(n_estimators=30, num_leaves=6)),
    "multiclass": (3, dict(n_estimators=15, num_leaves=5)),
    "multiclassova": (3, dict(objective="multiclassova", n_estimators=10, num_leaves=5)),
    "rf": (2, dict(boosting_type="rf", n_estimators=20, num_leaves=6, bagging_freq=1,
                   bagging_fraction=0.7)),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def fitted(request):
    n_classes, kw = KINDS[request.param]
    X, y = _data(n_classes)
    clf = lgb.LGBMClassifier(verbose=-1, random_state=0, **kw).fit(X, y)
    model = parse_lightgbm(clf.booster_.model_to_string())
    return clf, model, X, CounterfactualMaps.build(model)


def _edge_points(model, X, rng):
    rows = [X, rng.normal(scale=2.0, size=(100_000, X.shape[1]))]
    for f in range(X.shape[1]):
        t = np.unique(np.concatenate([tr.threshold[tr.split_feature == f] for tr in model.trees]))
        vals = np.concatenate([t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf)])
        P = X[rng.integers(0, len(X), size=vals.size)].copy()
        P[:, f] = vals
        rows.append(P)
    return np.vstack(rows)


def test_faithful_to_lightgbm_everywhere(fitted):
    """100k random points, every training row, each threshold and one float64 either side."""
    clf, model, X, maps = fitted
    P = _edge_points(model, X, np.random.default_rng(1))
    want = clf.predict(P)
    assert np.array_equal(model.predict(P), want)
    assert np.array_equal(np.asarray(maps.predict(P)), want)
    assert np.allclose(model.predict_proba(P[:2000]), clf.predict_proba(P[:2000]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_distances_equal_the_brute_force(n_classes, norm):
    X, y = _data(n_classes, seed=3, m=3)
    clf = lgb.LGBMClassifier(n_estimators=5, num_leaves=4, verbose=-1, random_state=0).fit(X, y)
    model = parse_lightgbm(clf.booster_.model_to_string())
    maps = CounterfactualMaps.build(model)
    rng = np.random.default_rng(4)
    for x in X[rng.choice(len(X), 8, replace=False)]:
        w = rng.uniform(0.3, 2.0, size=3)
        for target in range(n_classes):
            res = maps.counterfactual(x, target, norm=norm, weights=w)
            want = brute_force(clf, x, target, w, norm)
            assert res.best.distance == pytest.approx(want, rel=1e-9, abs=1e-12)
            cf = res.best
            assert clf.predict(cf.x[None])[0] == target
            # every real input just inside the region's ends gets the target
            P = region_end_points(cf.region, cf.x)
            assert P.size == 0 or np.all(clf.predict(P) == target)


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_thresholds_near_1e300_are_read_exactly(norm):
    """Thresholds past 1e300: ``dump_model()`` writes them capped at +-1e300 (the tests'
    brute force read its cells from there), the model text and LightGBM's predict use
    the real value, and so do the maps."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    s = X @ rng.normal(size=3) + 0.7 * rng.normal(size=300)
    y = (s > np.median(s)).astype(int)
    X = X * 1e300
    clf = lgb.LGBMClassifier(n_estimators=3, num_leaves=5, verbose=-1, random_state=0).fit(X, y)
    assert any(abs(float(t)) > 1e300 for line in clf.booster_.model_to_string().splitlines()
               if line.startswith("threshold=") for t in line.split("=")[1].split())
    maps = CounterfactualMaps.build(parse_lightgbm(clf.booster_.model_to_string()))
    w = np.full(3, 1e-300)  # costs of a unit size
    for x in X[:12]:
        target = 1 - int(clf.predict(x[None])[0])
        res = maps.counterfactual(x, target, norm=norm, weights=w)
        assert res.best.distance == pytest.approx(brute_force(clf, x, target, w, norm),
                                                  rel=1e-9)
        assert clf.predict(res.best.x[None])[0] == target


def _missing_only_split_model() -> tuple[object, np.ndarray]:
    """A LightGBM model (trained with NaN values and zero sample weights) whose file holds
    a split of threshold +inf: missing values go right, every finite input left."""
    rng = np.random.default_rng(18)
    n = 250
    X = np.column_stack([rng.normal(0, 1.5, n), rng.integers(0, 13, n).astype(float)])
    y = np.digitize(X[:, 0] + 0.3 * X[:, 1] + rng.normal(0, 0.6, n), [0, 2, 4])
    X[rng.random(n) < 0.15, 1] = np.nan
    sw = rng.uniform(0, 3, n)
    sw[rng.random(n) < 0.2] = 0.0
    clf = lgb.LGBMClassifier(n_estimators=4, num_leaves=7, min_child_samples=9, verbose=-1,
                             random_state=0, n_jobs=1).fit(X, y, sample_weight=sw)
    return clf, np.nan_to_num(X)


def test_a_missing_only_split_is_read_as_its_left_child():
    clf, X = _missing_only_split_model()
    text = clf.booster_.model_to_string()
    assert any(line.startswith("threshold=") and "inf" in line.split()
               for line in text.replace("=", "= ").splitlines())
    model = parse_lightgbm(text)
    maps = CounterfactualMaps.build(model)
    P = _edge_points(model, X, np.random.default_rng(2))
    huge = [[1e308, 1e308], [-1e308, -1e308], [0.0, 1.7e308], [5e-324, -0.0]]
    P = np.vstack([P[np.isfinite(P).all(axis=1)], huge])
    want = clf.predict(P)
    assert np.array_equal(model.predict(P), want)
    assert np.array_equal(np.asarray(maps.predict(P)), want)
    for x in X[:6]:
        for target in range(3):
            res = maps.counterfactual(x, target, norm="l1")
            assert res.best.distance == pytest.approx(brute_force(clf, x, target, np.ones(2), "l1"),
                                                      rel=1e-9, abs=1e-12)
            assert clf.predict(res.best.x[None])[0] == target
    # -inf and NaN thresholds stay refused
    for bad in ("-inf", "nan"):
        with pytest.raises(UnsupportedModelError, match="-inf or NaN"):
            parse_lightgbm(text.replace(" inf\n", f" {bad}\n", 1))


def _text(**kw):
    X, y = _data(2)
    return lgb.LGBMClassifier(n_estimators=3, verbose=-1, **kw).fit(X, y).booster_.model_to_string()


def test_refusals_name_the_problem():
    X, y = _data(2)
    reg = lgb.LGBMRegressor(n_estimators=2, verbose=-1).fit(X, X[:, 0]).booster_.model_to_string()
    with pytest.raises(UnsupportedModelError, match="objective 'regression'"):
        parse_lightgbm(reg)
    with pytest.raises(UnsupportedModelError, match="zero_as_missing"):
        parse_lightgbm(_text(zero_as_missing=True))
    with pytest.raises(UnsupportedModelError, match="linear trees"):
        parse_lightgbm(_text(linear_tree=True))
    good = _text()
    with pytest.raises(UnsupportedModelError, match="truncated"):
        parse_lightgbm(good[: len(good) // 2])
    with pytest.raises(UnsupportedModelError, match="not a LightGBM"):
        parse_lightgbm("{}")
    bad = good.replace("left_child=", "left_child=5 ", 1)
    with pytest.raises(UnsupportedModelError, match="left_child"):
        parse_lightgbm(bad)


def test_raw_scores_an_ulp_apart_tie_in_probability():
    """Two multiclass raw scores one float64 ulp apart give equal probabilities, and
    ``LGBMClassifier.predict`` (the argmax of ``predict_proba``) takes the first of them,
    not the higher raw score (XGBoost's ``multi:softmax`` does the opposite; see
    test_xgboost). Every leaf of the model text is rewritten to its class's score, so the
    scores are the same everywhere; LightGBM's own booster, loading the text, is the
    reference."""
    import re

    X, y = _data(3)
    text = lgb.LGBMClassifier(n_estimators=1, num_leaves=2, verbose=-1,
                              random_state=0).fit(X, y).booster_.model_to_string()
    top = -0.23410137
    scores = [np.nextafter(top, -np.inf), -0.347812, top]
    head, *trees = text.split("Tree=")
    trees = [re.sub(r"leaf_value=([^\n]*)",
                    lambda mt, v=scores[i % 3]: "leaf_value=" + " ".join(
                        repr(float(v)) for _ in mt.group(1).split()), t, count=1)
             for i, t in enumerate(trees)]
    # the trees' byte sizes changed: without its tree_sizes line, LightGBM reads them in order
    text = re.sub(r"tree_sizes=[^\n]*\n", "", "Tree=".join([head, *trees]))
    booster = lgb.Booster(model_str=text)
    model = parse_lightgbm(text)
    P = X[:5]
    assert np.array_equal(model.raw_scores(P), booster.predict(P, raw_score=True))
    proba = booster.predict(P)
    assert proba[0, 0] == proba[0, 2]  # LightGBM's own probabilities tie
    want = np.argmax(proba, axis=1)  # what LGBMClassifier.predict returns
    assert set(want) == {0}
    assert np.array_equal(model.predict(P), want)
    assert np.array_equal(np.asarray(CounterfactualMaps.build(model).predict(P)), want)


def test_inputs_lightgbm_reads_as_zero():
    """LightGBM reads |x| <= 1e-35 (as a float32) as 0.0, and puts its splits between
    negative values and zero at -1e-35 itself: points in and around that zone must go
    where LightGBM sends them (found by the loan benchmark: a counterfactual at
    -1.0000000180025095e-35 was predicted another class)."""
    from maps_core.adapters.lightgbm_text import K_ZERO

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    X[:, 0] = rng.choice([-2.0, -1.0, 0.0, 0.0, 1.0, 2.0], size=2000)
    y = ((X[:, 0] == 0) ^ (X[:, 1] > 0.3)).astype(int)
    clf = lgb.LGBMClassifier(n_estimators=20, num_leaves=6, verbose=-1, random_state=0).fit(X, y)
    text = clf.booster_.model_to_string()
    assert "e-35" in text  # LightGBM did split at its zero threshold
    model = parse_lightgbm(text)
    maps = CounterfactualMaps.build(model)
    zone = np.array([0.0, -0.0, 1e-36, -1e-36, K_ZERO, -K_ZERO, np.nextafter(K_ZERO, 1),
                     np.nextafter(-K_ZERO, -1), 1e-30, -1e-30, 5e-324, -5e-324])
    P = np.repeat(X[:200], zone.size, axis=0)
    P[:, 0] = np.tile(zone, 200)
    want = clf.predict(P)
    assert np.array_equal(model.predict(P), want)
    assert np.array_equal(np.asarray(maps.predict(P)), want)
    # and the answers the search returns there are LightGBM's class too
    for x in P[::37]:
        for target in (0, 1):
            cf = maps.counterfactual(x, target, norm="l1").best
            assert clf.predict(cf.x[None])[0] == target


# -- hardening: hostile or out-of-range files -------------------------------------------
def test_integers_beyond_int64_are_malformed():
    good = _text()
    first = good.split("split_feature=", 1)[1].split(" ", 1)[0]
    bad = good.replace(f"split_feature={first}", "split_feature=100000000000000000000000", 1)
    with pytest.raises(UnsupportedModelError, match="'split_feature' is not numeric or out of range"):
        parse_lightgbm(bad)
    bad = good.replace("max_feature_idx=3", "max_feature_idx=100000000000000000000000", 1)
    with pytest.raises(UnsupportedModelError, match="features; cfmaps supports 0 to 100,000"):
        parse_lightgbm(bad)


@pytest.mark.parametrize("objective", ["binary", "multiclassova"])
@pytest.mark.parametrize("sigmoid", ["-1", "0", "-0.0", "nan", "inf", "-inf"])
def test_a_sigmoid_lightgbm_refuses_is_refused(objective, sigmoid):
    """LightGBM refuses a sigmoid <= 0 when it loads a file; a negative one would swap the
    classes, 0 or NaN make every probability 0.5 or NaN."""
    if objective == "binary":
        text = _text()
    else:
        X, y = _data(3)
        text = lgb.LGBMClassifier(objective="multiclassova", n_estimators=2, verbose=-1).fit(
            X, y).booster_.model_to_string()
    assert "sigmoid:1" in text
    bad = text.replace("sigmoid:1", f"sigmoid:{sigmoid}", 1)
    with pytest.raises(UnsupportedModelError, match="sigmoid .* is not a positive finite number"):
        parse_lightgbm(bad)
    parse_lightgbm(text.replace("sigmoid:1", "sigmoid:0.5", 1))  # positive: fine


def _many_classes(k: int) -> str:
    """A multiclass file of k classes, one single-leaf tree per class (a few bytes each)."""
    head = (f"tree\nversion=v4\nnum_class={k}\nnum_tree_per_iteration={k}\nlabel_index=0\n"
            f"max_feature_idx=0\nobjective=multiclass num_class:{k}\nfeature_names=a\n\n")
    tree = ("Tree={}\nnum_leaves=1\nnum_cat=0\nsplit_feature=\nthreshold=\ndecision_type=\n"
            "left_child=\nright_child=\nleaf_value=0.1\n\n")
    return head + "".join(tree.format(i) for i in range(k)) + "end of trees\n"


def test_classes_times_nodes_are_bounded():
    """k classes need k trees: the dense (nodes, classes) value matrix grows as k**2, so a
    file of 6,000 one-leaf trees (700 kB) would claim 288 MB; refused before flattening."""
    from maps_core.adapters import flatten_model

    assert flatten_model(parse_lightgbm(_many_classes(50))).n_classes == 50
    with pytest.raises(UnsupportedModelError, match="6000 tree nodes times 6000 classes"):
        parse_lightgbm(_many_classes(6000))
    with pytest.raises(UnsupportedModelError, match="20000 classes; cfmaps supports at most 10,000"):
        parse_lightgbm(_many_classes(20_000))


def test_multiclassova_scores_where_probabilities_merge_are_refused():
    """multiclassova: LGBMClassifier.predict is the argmax of per-class sigmoid
    probabilities, first on a tie. Where two classes' raw scores both pass about 37 their
    probabilities both read 1.0 and the first class wins, however far apart the scores
    (191 and 296): the maps, deciding by the larger score, disagreed with predict on 12%
    of a cube and returned invalid counterfactuals (QA). Such a model is refused; one whose
    scores stay where probabilities resolve builds and agrees with predict."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(400, 3))
    s = X[:, 0] + 0.5 * X[:, 1] + rng.normal(0, 0.7, 400)
    y = np.digitize(s, [-0.7, 0.0, 0.7])  # 4 classes
    hot = lgb.LGBMClassifier(objective="multiclassova", n_estimators=6, learning_rate=1.75,
                             num_leaves=8, min_child_samples=1, reg_lambda=0.0, max_bin=3,
                             verbose=-1, random_state=0).fit(X, y)
    P = rng.uniform(-3, 3, size=(20000, 3))
    raw = hot.predict(P, raw_score=True)
    assert (np.sort(raw, axis=1)[:, -2] > 37).any()  # the case: two scores past 37
    with pytest.raises(UnsupportedModelError, match="multiclassova .* round to the same"):
        CounterfactualMaps.build(hot)
    mild = lgb.LGBMClassifier(objective="multiclassova", n_estimators=20, learning_rate=0.1,
                              num_leaves=8, verbose=-1, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(mild)
    assert np.array_equal(maps.predict(P), mild.predict(P))


def test_names_lightgbm_rewrote_are_pointed_out():
    """LightGBM writes whitespace in feature names as '_': the names a client trained with
    ('credit limit') are not the model's ('credit_limit'), and the error said only
    "unknown feature"."""
    X, y = _data(2)
    clf = lgb.LGBMClassifier(n_estimators=5, num_leaves=4, verbose=-1).fit(
        X, y, feature_name=["credit limit", "b", "c", "d"])
    maps = CounterfactualMaps.build(clf)
    assert maps.feature_names[0] == "credit_limit"
    with pytest.raises(InvalidQueryError, match="the model names it 'credit_limit'"):
        maps.counterfactual(X[0], immutable=["credit limit"])
    with pytest.raises(InvalidQueryError, match="the model names it 'credit_limit'"):
        maps.counterfactual(X[0], weights={"credit limit": 2.0})
    with pytest.raises(InvalidQueryError, match=r"unknown feature 'zz'$"):
        maps.counterfactual(X[0], immutable=["zz"])
    res = maps.counterfactual(X[0], immutable=["credit_limit"])
    assert res.best is None or res.best.x[0] == X[0, 0]


def test_the_training_frame_of_renamed_columns_is_read_by_name():
    """A DataFrame whose column LightGBM wrote as 'credit_limit' ('credit limit') is the
    one the model was trained on, and LightGBM's predict takes it: so do the maps, in any
    order (they refused it). A renaming that is not one to one stays refused."""
    from tests.core.test_schema import _Frame

    X, y = _data(2)
    clf = lgb.LGBMClassifier(n_estimators=5, num_leaves=4, verbose=-1).fit(
        X, y, feature_name=["credit limit", "b", "c", "d"])
    maps = CounterfactualMaps.build(clf)
    frame = _Frame(X[:50][:, [1, 0, 2, 3]], ["b", "credit limit", "c", "d"])
    assert np.array_equal(maps.predict(frame), clf.predict(X[:50]))
    assert maps.counterfactual(_Frame(X[0], ["credit limit", "b", "c", "d"])).best.distance \
        == maps.counterfactual(X[0]).best.distance
    with pytest.raises(InvalidQueryError, match="the model names it 'credit_limit'"):
        maps.predict(_Frame(X[:3], ["credit limit", "credit_limit", "c", "d"]))

