"""Seeded models shared by the core and app tests, and an independent brute force."""

from __future__ import annotations

import itertools
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


def raw_thresholds(model, f: int) -> np.ndarray:
    """Thresholds of feature ``f`` read straight from the sklearn trees (not from maps_core)."""
    ests = getattr(model, "estimators_", None)
    trees = [model] if ests is None else list(np.ravel(ests))
    ts = []
    for est in trees:
        tr = est.tree_
        ts.append(tr.threshold[(tr.children_left >= 0) & (tr.feature == f)])
    return np.unique(np.concatenate(ts)) if ts else np.zeros(0)


def f32_floor(t: np.ndarray) -> np.ndarray:
    f = np.asarray(t, dtype=np.float64).astype(np.float32)
    up = f.astype(np.float64) > t
    f[up] = np.nextafter(f[up], np.float32(-np.inf))
    return f.astype(np.float64)


def f32_real_boundary(s: np.ndarray) -> np.ndarray:
    """Where scikit-learn's split ``float32(x) <= t`` changes sides on the real line, for
    ``s = f32_floor(t)``: halfway to the next float32 (float32 rounds to nearest)."""
    up = np.nextafter(s.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    return (s + up) / 2.0  # 25 significant bits: exact in float64


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


def brute_force(model, x, target_index, weights, norm, classes=None):
    """Exact optimum over real inputs by enumerating every cell of the threshold grid (no
    maps_core code).

    Along a feature, the cells are the intervals between the real boundaries of the
    float32-floored thresholds (float32(x) is the same for every real x strictly between
    two of them); each cell is labelled by ``model.predict`` at a float32 point inside,
    and the infimum distance from ``x`` to the cell is computed in closed form (whichever
    side owns a boundary, the infimum is the same).
    """
    m = x.shape[0]
    cuts = [f32_floor(raw_thresholds(model, f)) for f in range(m)]
    cuts = [np.unique(c) for c in cuts]
    bounds = [f32_real_boundary(c) for c in cuts]
    lows = [np.concatenate([[-np.inf], b]) for b in bounds]
    highs = [np.concatenate([b, [np.inf]]) for b in bounds]
    reps = []
    for c in cuts:
        if c.size == 0:
            reps.append(np.array([0.0]))
            continue
        inner = c.astype(np.float64)  # closed upper ends are inside their cell
        last = np.nextafter(c[-1].astype(np.float32), np.float32(np.inf)).astype(np.float64)
        reps.append(np.concatenate([inner, [last]]))
    idx = np.array(list(itertools.product(*[range(len(r)) for r in reps])))
    pts = np.column_stack([reps[f][idx[:, f]] for f in range(m)])
    labels = model.predict(pts)
    cls = list(model.classes_) if classes is None else classes
    mask = labels == cls[target_index]
    if not mask.any():
        return np.inf
    lo = np.column_stack([lows[f][idx[mask, f]] for f in range(m)])
    hi = np.column_stack([highs[f][idx[mask, f]] for f in range(m)])
    delta = np.maximum(0.0, np.maximum(lo - x, x - hi)) * weights
    if norm == "l1":
        d = delta.sum(axis=1)
    elif norm == "l2":
        d = np.sqrt((delta**2).sum(axis=1))
    else:
        d = delta.max(axis=1)
    return float(d.min())


@pytest.fixture(scope="module", params=[("rf", 2), ("rf", 3), ("gb", 2), ("gb", 3)],
                ids=lambda p: f"{p[0]}-{p[1]}cls")
def budgeted(request):
    """A model, its data, its complete maps and maps stopped after 5 rectangles (mostly
    mixed). Forests big enough that searches split many boxes."""
    kind, n_classes = request.param
    X, y = synthetic(n_classes, 5, 4)
    if kind == "rf":
        model = RandomForestClassifier(n_estimators=30, max_depth=5, random_state=0)
    else:
        model = GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=0)
    model.fit(X, y)
    return model, X, CounterfactualMaps.build(model), CounterfactualMaps.build(model, max_rectangles=5)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "datasets").is_dir():
        pytest.fail(f"shared datasets not found at {SHARED} (set CFMAPS_SHARED)")
    return SHARED


# Search schedules, as settings of maps_core.query: the default (one round from the
# guess, mostly); the fixed start, as without a guess; many small rounds, most failing,
# some reaching the unbounded last round; one unbounded round; every round hard from its
# first box (the polish of the probe's cells and the probe-weighted cuts, which the
# default keeps for rounds past HARD_AFTER boxes, beyond these tests' small searches);
# every search in three parts at once and every batch in three threads (the default
# waits for long searches, which these tests' maps do not have; three parts run on the
# pool's one or more threads); searches in two parts with many rounds, some failing while
# the other part's target is known.
DEEPENING: dict[str, dict[str, object]] = {
    "default": {},
    "no-guess": {"DEEPEN_START": 0.1, "DEEPEN_GROWTH": 1.3, "GUESS_FIRST": False},
    "many-rounds": {"DEEPEN_START": 1e-3, "DEEPEN_GROWTH": 1.2, "GUESS_FIRST": False},
    "unbounded": {"DEEPEN_START": np.inf, "DEEPEN_GROWTH": 1.5, "GUESS_FIRST": False},
    "hard": {"HARD_AFTER": 0},
    "parallel": {"PARALLEL_SHARE": 0.0, "PARALLEL_SECONDS": 0.0, "default_threads": lambda: 3},
    "parallel-rounds": {"PARALLEL_SHARE": 0.0, "default_threads": lambda: 2,
                        "DEEPEN_START": 1e-3, "DEEPEN_GROWTH": 1.2, "GUESS_FIRST": False},
}


@pytest.fixture(params=sorted(DEEPENING))
def deepening(request, monkeypatch):
    for name, value in DEEPENING[request.param].items():
        monkeypatch.setattr(maps_core.query, name, value)
    return request.param
