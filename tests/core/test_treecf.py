"""Agreement with treecf, an independent exact solver, wherever it proves optimality.

treecf (PyPI ``treecf``, a branch-and-bound over the forest's leaves in Rust) minimises
``sum |x'_j - x_j| / sigma_j``, which is cfmaps' weighted l1 with ``weights = 1 / sigma``.
It reads scikit-learn's float32 thresholds as float64 splits, while cfmaps states the
optimum on the real line scikit-learn's ``float32(x) <= t`` induces, so on a feature
that moves the two optima may differ by a float32 spacing there. Beyond the brute force
of tests/conftest.py (every cell of a small grid), this checks forests whose grids are far
too large to enumerate, with complete maps and with budgeted maps searched lazily.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import treecf
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier

from maps_core import CounterfactualMaps

N_QUERIES = 12


@pytest.fixture(scope="module", params=[(0, 20, 4, 6), (1, 30, 4, 5)], ids=["rf20x4", "rf30x4"])
def forest(request):
    seed, trees, depth, m = request.param
    X, y = make_classification(n_samples=600, n_features=m, n_informative=4, n_redundant=0,
                               random_state=seed)
    model = RandomForestClassifier(trees, max_depth=depth, random_state=seed).fit(X, y)
    w = np.random.default_rng(seed).uniform(0.5, 2.0, m)
    return model, X, w


def _treecf_optimum(model, x, target, w):
    """treecf's proved optimum for ``x`` (its point), or None when it proves nothing."""
    explainer = treecf.Explainer(model, normalizers=1.0 / w)
    # sklearn predicts class 1 iff P(1) > P(0): the raw (mean probability) target range
    band = (0.5 + 1e-9, 2.0) if target == 1 else (-1.0, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = explainer.explain(x.copy(), target=treecf.Target.raw(range=band), backend="exact",
                                time_budget_s=20.0, warm_start=False, seed=0)
    if not isinstance(res, treecf.Counterfactual) or res.proof != "optimal":
        return None
    return np.asarray(res.x_cf, dtype=np.float64)


@pytest.mark.parametrize("budget", [None, 40], ids=["complete", "budgeted"])
def test_distances_match_treecf_where_it_proves_optimality(forest, budget):
    model, X, w = forest
    maps = CounterfactualMaps.build(model, max_rectangles=budget)
    if budget is not None:
        assert maps.stats.mixed_regions > 0  # the lazy search is what is checked
    compared = 0
    for x in X[:N_QUERIES]:
        target = 1 - int(model.predict(x[None])[0])
        res = maps.counterfactual(x, target=target, norm="l1", weights=w)
        assert res.best is not None
        assert model.predict(res.best.x[None])[0] == target
        z = _treecf_optimum(model, x, target, w)
        if z is None or model.predict(z[None])[0] != target:
            continue
        compared += 1
        d_peer = float(np.sum(w * np.abs(z - x)))
        d = res.best.distance
        # cfmaps' distance is the infimum over real inputs: never above a valid point's
        assert d <= d_peer * (1 + 1e-12)
        # and treecf's proved optimum is no farther than float32 rounding of its moves
        moved = z != x
        slack = float(np.sum(w[moved] * np.spacing(np.abs(z[moved]).astype(np.float32))))
        assert d_peer - d <= slack + 1e-12 * d_peer, (x, d, d_peer, slack)
    assert compared >= N_QUERIES * 3 // 4  # treecf proved (and placed validly) most of them
