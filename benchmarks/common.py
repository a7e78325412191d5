"""Shared helpers for the benchmarks: datasets, models and the schema a user would declare."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import train_test_split

from maps_core import CounterfactualMaps, FeatureSchema, load_csv

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CFMAPS_SHARED", ROOT.parent / "shared"))
DATASETS = {
    "BC": "Breast-Cancer-Wisconsin.csv",
    "CP": "COMPAS-ProPublica.csv",
    "FI": "FICO.csv",
    "PD": "Pima-Diabetes.csv",
}


def load(name: str, seed: int = 0):
    """(X_train, X_test, y_train, y_test, schema) with an 80/20 split."""
    # The schema a user would declare: the file's type codes, with F columns that only
    # hold whole numbers (Pima's counts, glucose, age...) declared integer.
    ds = load_csv(SHARED / "datasets" / DATASETS[name], whole_floats_as_integers=True)
    schema = ds.schema
    Xtr, Xte, ytr, yte = train_test_split(ds.X, ds.y, test_size=0.2, random_state=seed)
    return Xtr, Xte, ytr, yte, schema


def warm_up(X: Any, y: Any, schema: FeatureSchema, x: Any) -> None:
    """Compile the engine's kernels before anything is timed: a tiny forest's maps stopped
    after one rectangle, so that the mixed-region search compiles too, and its complete
    maps (which only descend the KD trees), asked ``x`` in every norm. On a fresh numba
    cache, a benchmark's first mixed query otherwise counts 30-70 s of compiling."""
    warm = RandomForestClassifier(4, max_depth=4, random_state=0).fit(X[:500], y[:500])
    # and complete maps, whose queries take the KD descent alone (certified_only): FICO's
    # first l1 query otherwise counted its compile (a 4.9 s maximum, 2026-11-27)
    for budget in (1, None):
        maps = CounterfactualMaps.build(warm, schema, max_rectangles=budget)
        for norm in ("l1", "l2", "linf"):
            maps.counterfactual(x, norm=norm)
