"""Differential fuzz of the search on budgeted (mixed) maps against the independent brute
force of ``tests.recourse``.

Each seed trains a random forest, extra trees or gradient boosting (2-3 classes, 3-29
trees, depth 2-5; with ``KINDS``, also XGBoost, XGBoost's random forest, LightGBM and
HistGradientBoosting, each read with its own split rule) on that module's mixed-type
data (integers, a binary, with or without a one-hot group), builds maps stopped after
2-200 rectangles (so most keep mixed regions) and asks four queries (three rows and a
random legal point) with a random norm (l1, l2, linf), constraint kind, target and
weights, each twice: with the guessed first bound (``maps_core.query.GUESS_FIRST``) and
without. ``check_result`` checks the distance against the brute force's optimum, the
answer's validity with the model's own ``predict``, its region and its constraints. Run
from the repository's root (it imports the tests package)::

    PYTHONPATH=. python scripts/fuzz_mixed.py SEED SECONDS [KINDS]   # e.g. 600000 1500

``KINDS`` is a comma-separated list among rf, gb, et, xgb, xgbrf, lgbm, hgb (default
``rf,gb,et``). It prints a line per failure and a summary; it exits 1 if anything failed.
"""

from __future__ import annotations

import sys
import time

import lightgbm as lgb
import numpy as np
import xgboost as xgb
from sklearn.ensemble import (
    ExtraTreesClassifier,
    GradientBoostingClassifier,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
)

import maps_core.query
from maps_core import CounterfactualMaps
from tests.library_splits import engine_model
from tests.recourse import (
    GROUPED,
    OPTIONS,
    PLAIN,
    BruteForce,
    Suite,
    check_result,
    make_data,
    random_options,
    schema_of,
)


def _model(rng: np.random.Generator, seed: int, kinds: list[str]):
    kind = str(rng.choice(kinds))
    trees, depth = int(rng.integers(3, 30)), int(rng.integers(2, 6))
    if kind == "xgb":
        return xgb.XGBClassifier(n_estimators=max(2, trees // 3), max_depth=depth,
                                 learning_rate=float(rng.uniform(0.1, 1.0)), random_state=seed)
    if kind == "xgbrf":
        return xgb.XGBRFClassifier(n_estimators=trees, max_depth=depth, random_state=seed)
    if kind == "lgbm":
        return lgb.LGBMClassifier(n_estimators=max(2, trees // 3), num_leaves=2**depth,
                                  min_child_samples=int(rng.integers(2, 20)), verbose=-1,
                                  random_state=seed)
    if kind == "hgb":
        return HistGradientBoostingClassifier(max_iter=max(2, trees // 3), max_depth=depth,
                                              random_state=seed)
    if kind == "rf":
        return RandomForestClassifier(n_estimators=trees, max_depth=depth, random_state=seed)
    if kind == "et":
        return ExtraTreesClassifier(n_estimators=trees, max_depth=depth, random_state=seed)
    return GradientBoostingClassifier(n_estimators=max(2, trees // 3), max_depth=depth,
                                      random_state=seed)


def main(seed0: int, seconds: float, kinds: list[str]) -> int:
    stop = time.time() + seconds
    models = mixed = checks = failures = 0
    seed = seed0
    while time.time() < stop:
        rng = np.random.default_rng(seed)
        model = _model(rng, seed, kinds)
        cols = GROUPED if rng.random() < 0.5 else PLAIN
        X, y = make_data(cols, int(rng.choice([2, 3])), seed)
        model.fit(X, y)
        maps = CounterfactualMaps.build(engine_model(model), schema_of(cols),
                                        max_rectangles=int(rng.integers(2, 200)))
        suite = Suite(model, X, cols, maps, BruteForce(model, cols))
        models += 1
        mixed += maps.stats.mixed_regions > 0
        for x in suite.queries(rng, n_rows=3):
            norm = str(rng.choice(["l1", "l2", "linf"]))
            option = str(rng.choice(OPTIONS))
            w = (rng.uniform(0.2, 2.0, size=x.shape[0]) if rng.random() < 0.7
                 else maps.engine.schema.default_weights())
            opts = random_options(option, cols, x, rng)
            targets = suite.targets(x)
            target = targets[int(rng.integers(len(targets)))]
            for guess in (True, False):
                maps_core.query.GUESS_FIRST = guess
                checks += 1
                try:
                    check_result(maps, suite.bf, x, target, opts, w, norm, rng)
                except Exception as exc:  # every failure is reported, the fuzz goes on
                    failures += 1
                    print(f"FAIL seed {seed} {type(model).__name__} guess={guess} {norm} "
                          f"{option}: {exc!r:.300}", flush=True)
        seed += 1
    print(f"seeds {seed0}-{seed - 1}: {models} models ({mixed} with mixed regions), "
          f"{checks} checks, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]),
                  sys.argv[3].split(",") if len(sys.argv) > 3 else ["rf", "gb", "et"]))
