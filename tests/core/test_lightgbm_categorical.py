"""LightGBM's categorical splits (``categorical_feature``): unfolded into plain splits that
decide every real input as LightGBM does, and answered exactly.

LightGBM is the reference throughout: its own ``predict`` on dense grids of real inputs
around every code, and the brute forces of ``tests.brute_force`` and ``tests.recourse``,
whose cells it labels.
"""

from __future__ import annotations

import numpy as np
import pytest

from maps_core import CounterfactualMaps, FeatureSchema, UnsupportedModelError
from maps_core.adapters import flatten_model
from maps_core.adapters import lightgbm_text as lt
from maps_core.adapters._trees import code_set_cuts
from maps_core.adapters.lightgbm_text import parse_lightgbm
from maps_core.schema import Feature
from tests.brute_force import brute_force
from tests.conftest import region_end_points
from tests.recourse import BruteForce, Col

lgb = pytest.importorskip("lightgbm")

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


KINDS = {
    # many-vs-many sets (codes sorted by gradient statistics, then split)
    "binary": (2, dict(n_estimators=20, num_leaves=8)),
    # one-vs-rest splits on the 12-code column, sets on the 30-code one
    "onehot-binary": (2, dict(n_estimators=10, num_leaves=16, max_cat_to_onehot=16)),
    "multiclass": (3, dict(n_estimators=8, num_leaves=6)),
    "rf": (2, dict(boosting_type="rf", n_estimators=10, num_leaves=8, bagging_freq=1,
                   bagging_fraction=0.7)),
}


def _fit(n_classes: int, **kw):
    X, y = _data(n_classes)
    clf = lgb.LGBMClassifier(verbose=-1, random_state=0, min_child_samples=5,
                             min_data_per_group=5, cat_smooth=1, **kw)
    return clf.fit(X, y, categorical_feature=[0, 2]), X


@pytest.fixture(scope="module", params=sorted(KINDS))
def fitted(request):
    n_classes, kw = KINDS[request.param]
    clf, X = _fit(n_classes, **kw)
    text = clf.booster_.model_to_string()
    assert "num_cat=0" not in text.split("Tree=0", 1)[1].split("\n\n", 1)[0]
    return clf, parse_lightgbm(text), X


def _real_points(rng: np.random.Generator, n: int) -> np.ndarray:
    """Inputs on and around every code: integers, one float64 either side, quarters,
    negatives down to -3, values past the codes and past int32, +-0 and tiny values."""
    top = max(N_CODES) + 5.0
    ints = np.arange(-3.0, top)
    vals = np.concatenate([ints, np.nextafter(ints, np.inf), np.nextafter(ints, -np.inf),
                           np.arange(-3.0, top, 0.25),
                           [1e9, 2.0**31, 3e9, -3e9, 1e-40, -1e-40, 0.0, -0.0, -0.5, 0.999]])
    return np.column_stack([rng.choice(vals, n), rng.normal(size=n), rng.choice(vals, n)])


def test_unfolded_trees_decide_every_real_input_as_lightgbm(fitted):
    """The flat ensemble, the parsed model's own emulation and the maps built from it
    predict what LightGBM predicts, on 100k real inputs around the codes and the rows."""
    clf, model, X = fitted
    P = np.vstack([X, _real_points(np.random.default_rng(1), 100_000)])
    want = clf.predict(P)
    assert np.array_equal(model.predict(P), want)
    ens = flatten_model(model)
    assert np.array_equal(ens.predict_index(P), np.searchsorted(clf.classes_, want))
    raw = clf.predict(P, raw_score=True)
    raw = raw[:, None] if raw.ndim == 1 else raw
    scores = ens.decision_scores(P)
    mine = scores[:, 1:] if clf.n_classes_ == 2 else scores
    if model.average_output:  # raw_score is the trees' sum, the decision their mean
        mine = mine * (len(model.trees) // model.n_tree_per_iteration)
    assert np.allclose(mine, raw, rtol=0, atol=1e-9)
    maps = CounterfactualMaps.build(model, max_rectangles=20_000)
    assert np.array_equal(np.asarray(maps.predict(P[:20_000])), want[:20_000])


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_distances_equal_the_brute_force_on_the_real_line(norm):
    """Every feature continuous (the codes' columns too): the optimum over real inputs,
    the answer valid by LightGBM's predict up to its region's ends."""
    clf, X = _fit(2, n_estimators=4, num_leaves=5)
    maps = CounterfactualMaps.build(parse_lightgbm(clf.booster_.model_to_string()))
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


@pytest.mark.parametrize("norm", ["l1", "l2", "linf", "l0"])
def test_codes_declared_integer_land_on_legal_codes(norm):
    """The codes' columns declared integer in their range: the optimum over legal inputs
    (``tests.recourse.BruteForce``), and every answer a legal code LightGBM predicts as
    the target."""
    clf, X = _fit(3, n_estimators=4, num_leaves=5)
    cols = [Col("a", "integer", 0, N_CODES[0] - 1), Col("x", "continuous"),
            Col("b", "integer", 0, N_CODES[1] - 1)]
    schema = FeatureSchema(tuple(Feature(c.name, c.type, c.lower, c.upper) for c in cols))
    maps = CounterfactualMaps.build(parse_lightgbm(clf.booster_.model_to_string()), schema)
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
    cuts, inside = code_set_cuts(np.array([8, 0, 1, 5, 7]), -1.0)
    below = np.nextafter
    assert cuts.tolist() == [-1.0, below(2.0, 0), below(5.0, 0), below(6.0, 0),
                             below(7.0, 0), below(9.0, 0)]
    assert inside.tolist() == [False, True, False, True, False, True, False]
    empty_cuts, empty_inside = code_set_cuts(np.zeros(0, dtype=np.int64), -1.0)
    assert empty_cuts.size == 0 and empty_inside.tolist() == [False]


def test_refusals_name_the_problem(monkeypatch):
    clf, _ = _fit(2, n_estimators=2, num_leaves=8)
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
