"""XGBoost, LightGBM and HistGradientBoosting on mixed-type data, through budgeted maps.

The other libraries' tests check complete maps of continuous features. Here the same
models meet what loan data brings: integers, a binary and a one-hot group, maps stopped
by a rectangle budget (so queries search mixed regions, whose cells and legal values
follow each library's own split rule) and every constraint option. The brute force of
``tests.recourse`` reads each library's splits from the library itself
(``tests.library_splits``) and labels every cell with the library's own ``predict``.
"""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np
import pytest
import xgboost as xgb
from sklearn.ensemble import HistGradientBoostingClassifier

from maps_core import CounterfactualMaps
from tests.library_splits import engine_model, split_rule
from tests.recourse import (
    GROUPED,
    NORMS,
    OPTIONS,
    PLAIN,
    BruteForce,
    Suite,
    check_result,
    make_data,
    random_options,
    schema_of,
    seed_of,
)

LIBRARIES: dict[str, Any] = {
    "xgboost": lambda s, c: xgb.XGBClassifier(n_estimators=6, max_depth=3, learning_rate=0.5,
                                              random_state=s),
    "xgboost-rf": lambda s, c: xgb.XGBRFClassifier(n_estimators=10, max_depth=4, random_state=s),
    "lightgbm": lambda s, c: lgb.LGBMClassifier(n_estimators=10, num_leaves=10, min_child_samples=5,
                                                verbose=-1, random_state=s),
    "hist-gb": lambda s, c: HistGradientBoostingClassifier(max_iter=10, max_depth=4,
                                                           random_state=s),
}


def _suite(kind: str, cols: list, n_classes: int, seed: int, budget: int) -> Suite:
    X, y = make_data(cols, n_classes, seed)
    model = LIBRARIES[kind](seed, n_classes).fit(X, y)
    maps = CounterfactualMaps.build(engine_model(model), schema_of(cols), max_rectangles=budget,
                                    on_budget="mixed")
    return Suite(model, X, cols, maps, BruteForce(model, cols))


def test_each_library_is_read_with_its_own_rule() -> None:
    """The brute force must not read every library as scikit-learn: each rule is its own."""
    X, y = make_data(PLAIN, 2, 0)
    rules = {k: split_rule(f(0, 2).fit(X, y)) for k, f in LIBRARIES.items()}
    assert rules == {"xgboost": "float32<", "xgboost-rf": "float32<", "lightgbm": "float64<=",
                     "hist-gb": "float64<="}


@pytest.mark.parametrize("kind", sorted(LIBRARIES))
@pytest.mark.parametrize("norm", NORMS)
def test_budgeted_maps_of_every_library_stay_exact(kind: str, norm: str) -> None:
    """Optimal, valid and constrained answers from mixed maps of each library's models,
    two and three classes, with and without a one-hot group. (The search's schedules,
    parts and threads are the same code for every library; ``test_constraints`` runs them
    all on scikit-learn's models, ``scripts/fuzz_mixed.py`` on these libraries' too.)"""
    for cols, n_classes, seed in ((PLAIN, 2, 3), (GROUPED, 3, 5)):
        suite = _suite(kind, cols, n_classes, seed, budget=6)
        assert suite.maps.stats.mixed_regions > 0
        rng = np.random.default_rng(seed_of("library", kind, norm, n_classes))
        for x in suite.queries(rng, n_rows=2):
            w = rng.uniform(0.2, 2.0, size=x.shape[0])
            opts = random_options(OPTIONS[int(rng.integers(len(OPTIONS)))], cols, x, rng)
            for target in suite.targets(x):
                check_result(suite.maps, suite.bf, x, target, opts, w, norm, rng, k=2)
