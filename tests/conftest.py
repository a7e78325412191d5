"""Seeded models shared by the core and app tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.ensemble import (
    ExtraTreesClassifier,
    GradientBoostingClassifier,
    RandomForestClassifier,
)
from sklearn.tree import DecisionTreeClassifier

import maps_core.query
from maps_core import CounterfactualMaps

ROOT = Path(__file__).resolve().parent.parent

# The test process starts hundreds of apps: each gc.freeze() would cost a full collection
# and keep every earlier app's cycles; tests/app/test_settings.py checks the freeze itself.
os.environ.setdefault("CFMAPS_GC_FREEZE", "false")
SHARED = Path(os.environ.get("CFMAPS_SHARED", ROOT.parent / "shared"))

MODEL_FACTORIES = {
    "dt": lambda s: DecisionTreeClassifier(max_depth=4, random_state=s),
    "rf": lambda s: RandomForestClassifier(n_estimators=8, max_depth=3, random_state=s),
    "et": lambda s: ExtraTreesClassifier(n_estimators=8, max_depth=3, random_state=s),
    "gb": lambda s: GradientBoostingClassifier(n_estimators=8, max_depth=2, random_state=s),
}


def synthetic(n_classes: int = 2, n_features: int = 4, seed: int = 0):
    X, y = make_classification(
        n_samples=400,
        n_features=n_features,
        n_informative=min(3, n_features),
        n_redundant=0,
        n_classes=n_classes,
        n_clusters_per_class=1,
        random_state=seed,
    )
    return X, y


def fit(kind: str, n_classes: int = 2, n_features: int = 4, seed: int = 0):
    X, y = synthetic(n_classes, n_features, seed)
    return MODEL_FACTORIES[kind](seed).fit(X, y), X, y


def region_end_points(region, x):
    """Points of ``region`` next to each finite end of each feature, the other features at
    ``x``: the end itself when closed, else the first float64 inside, and the end rounded to
    6 digits when that lies inside. Every one must get the region's class."""
    pts = []
    for f in range(x.shape[0]):
        for end, closed, inward in ((region.lower[f], region.lower_closed[f], np.inf),
                                    (region.upper[f], region.upper_closed[f], -np.inf)):
            if not np.isfinite(end):
                continue
            for v in (end if closed else np.nextafter(end, inward), round(float(end), 6)):
                p = x.copy()
                p[f] = v
                if region.contains(p):
                    pts.append(p)
    return np.array(pts).reshape(-1, x.shape[0])


def complete_maps(model):
    """The model's complete maps, the reference of the budgeted ones: built without a size
    budget (these forests need more rectangles than the default) and asserted complete."""
    maps = CounterfactualMaps.build(model, max_rectangles=None)
    assert maps.stats.mixed_regions == 0
    return maps


@pytest.fixture(scope="module", params=[("rf", 2), ("rf", 3), ("gb", 2), ("gb", 3)],
                ids=lambda p: f"{p[0]}-{p[1]}cls")
def budgeted(request):
    """A model, its data, its complete maps and maps stopped after 100 rectangles (mostly
    mixed). Forests big enough that searches split many boxes."""
    kind, n_classes = request.param
    X, y = synthetic(n_classes, 5, 4)
    if kind == "rf":
        model = RandomForestClassifier(n_estimators=30, max_depth=5, random_state=0)
    else:
        model = GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=0)
    model.fit(X, y)
    return model, X, complete_maps(model), CounterfactualMaps.build(model, max_rectangles=100)


@pytest.fixture(scope="module")
def mixed_forest():
    """A forest whose budgeted maps leave most of the space mixed, so that every search
    splits boxes of several regions: the model, its data, its complete maps and maps
    stopped after 100 rectangles (built once per test module, so that no module's searches
    shape another's pace)."""
    X, y = synthetic(2, 5, 11)
    model = RandomForestClassifier(n_estimators=40, max_depth=6, random_state=0).fit(X, y)
    return model, X, complete_maps(model), CounterfactualMaps.build(model, max_rectangles=100)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "datasets").is_dir():
        pytest.fail(f"shared datasets not found at {SHARED} (set CFMAPS_SHARED)")
    return SHARED


# Search schedules, as settings of maps_core.query: the default (one round from the
# guess, mostly); the fixed start, as without a guess (after the probe round, as every
# search without a guess); many small rounds, most failing, some reaching the unbounded
# last round; one unbounded round; every round hard from its first box (the polish of the
# probe's cells and the probe-weighted cuts, which the default keeps for rounds past
# HARD_AFTER boxes, beyond these tests' small searches); every search without a guess
# (here every one) starting with a probe round at a tenth of the first bound rather than
# a hundredth, so that more answers lie within it; every search in three parts at once
# and every batch in three threads (the default waits for long searches, which these
# tests' maps do not have; three parts run on the pool's one or more threads); searches
# in two parts with many rounds, some failing while the other part's target is known.
DEEPENING: dict[str, dict[str, object]] = {
    "default": {},
    "no-guess": {"DEEPEN_START": 0.1, "DEEPEN_GROWTH": 1.3, "GUESS_FIRST": False},
    "many-rounds": {"DEEPEN_START": 1e-3, "DEEPEN_GROWTH": 1.2, "GUESS_FIRST": False},
    "unbounded": {"DEEPEN_START": np.inf, "DEEPEN_GROWTH": 1.5, "GUESS_FIRST": False},
    "hard": {"HARD_AFTER": 0},
    "probe": {"PROBE": 0.1, "GUESS_FIRST": False},
    "parallel": {"PARALLEL_SHARE": 0.0, "PARALLEL_SECONDS": 0.0, "default_threads": lambda: 3},
    "parallel-rounds": {"PARALLEL_SHARE": 0.0, "default_threads": lambda: 2,
                        "DEEPEN_START": 1e-3, "DEEPEN_GROWTH": 1.2, "GUESS_FIRST": False},
}


@pytest.fixture(params=sorted(DEEPENING))
def deepening(request, monkeypatch):
    for name, value in DEEPENING[request.param].items():
        monkeypatch.setattr(maps_core.query, name, value)
    return request.param
