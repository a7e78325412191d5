"""Faithfulness: the label of the rectangle containing x equals model.predict(x).

Checked on at least 100k random legal points per model, on every training row, and on
points one float32 step (or one integer) either side of every threshold of the model.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from sklearn.ensemble import (
    ExtraTreesClassifier,
    GradientBoostingClassifier,
    RandomForestClassifier,
)
from sklearn.tree import DecisionTreeClassifier

from maps_core import CounterfactualMaps, FeatureSchema
from maps_core.query import locate_rect
from tests.conftest import ROOT, synthetic
from tests.library_splits import raw_thresholds

sys.path.insert(0, str(ROOT / "benchmarks"))
from common import load  # noqa: E402

MODELS = {
    "rf5x4": lambda: RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0),
    "rf20x3": lambda: RandomForestClassifier(n_estimators=20, max_depth=3, random_state=1),
    "et10x3": lambda: ExtraTreesClassifier(n_estimators=10, max_depth=3, random_state=0),
    "gb10x3": lambda: GradientBoostingClassifier(n_estimators=10, max_depth=3, random_state=0),
    "dt6": lambda: DecisionTreeClassifier(max_depth=6, random_state=0),
}


def domain_points(schema: FeatureSchema, X: np.ndarray, n: int, rng) -> np.ndarray:
    lo, hi = schema.domains()
    span = X.max(axis=0) - X.min(axis=0) + 1.0
    lo = np.where(np.isfinite(lo), lo, X.min(axis=0) - 0.5 * span)
    hi = np.where(np.isfinite(hi), hi, X.max(axis=0) + 0.5 * span)
    P = rng.uniform(lo, hi, size=(n, X.shape[1]))
    integ = schema.integral_mask()
    P[:, integ] = np.round(P[:, integ])
    return np.clip(P, lo, hi)


def threshold_points(model, schema: FeatureSchema, X: np.ndarray, rng) -> np.ndarray:
    lo, hi = schema.domains()
    integ = schema.integral_mask()
    rows = []
    for f in range(X.shape[1]):
        for t in raw_thresholds(model, f):
            if integ[f]:
                vals = [np.floor(t), np.floor(t) + 1]
            else:
                t32 = np.float32(t)
                vals = [float(np.nextafter(t32, np.float32(-np.inf))), float(t32),
                        float(np.nextafter(t32, np.float32(np.inf))), float(t)]
            for v in vals:
                if lo[f] <= v <= hi[f]:
                    base = X[rng.integers(len(X))].copy()
                    base[f] = v
                    rows.append(base)
    return np.array(rows)


def check(maps: CounterfactualMaps, model, P: np.ndarray) -> None:
    assert np.all(locate_rect(maps.engine, P) >= 0), "a legal point is not covered"
    got = maps.predict(P)
    want = model.predict(P)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} mismatches, e.g. at {P[bad[:3]]}"


@pytest.mark.parametrize("dataset", ["BC", "CP", "FI", "PD"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_faithful_on_paper_datasets(dataset, model_name, shared_dir):
    Xtr, Xte, ytr, _, schema = load(dataset)
    model = MODELS[model_name]().fit(Xtr, ytr)
    maps = CounterfactualMaps.build(model, schema)
    assert maps.stats.mixed_regions == 0
    rng = np.random.default_rng(0)
    check(maps, model, domain_points(schema, Xtr, 100_000, rng))
    check(maps, model, np.vstack([Xtr, Xte]))
    check(maps, model, threshold_points(model, schema, Xtr, rng))


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_faithful_on_real_valued_data_without_schema(model_name, n_classes):
    X, y = synthetic(n_classes=n_classes, n_features=5, seed=3)
    model = MODELS[model_name]().fit(X, y)
    maps = CounterfactualMaps.build(model)
    schema = maps.schema
    rng = np.random.default_rng(1)
    check(maps, model, domain_points(schema, X, 100_000, rng))
    check(maps, model, X)
    check(maps, model, threshold_points(model, schema, X, rng))
    # Far outside the data: the outer cells extend to infinity.
    check(maps, model, rng.normal(scale=1e3, size=(1000, 5)))


@pytest.mark.parametrize("prove_budget,n_samples", [(0, 0), (32, 16), (64, 64)])
@pytest.mark.parametrize("dataset", ["BC", "synthetic3"])
def test_every_extraction_mode_certifies_exactly(dataset, prove_budget, n_samples, shared_dir):
    """Sampling and purity proofs are optional (off by default): every mode must give a
    complete partition whose every cell carries the model's label."""
    from maps_core.adapters import flatten_model
    from maps_core.grid import Grid
    from maps_core.partition import extract

    if dataset == "BC":
        X, _, y, _, schema = load("BC")
    else:
        X, y = synthetic(n_classes=3, n_features=5, seed=3)
        schema = FeatureSchema.infer(X)
    model = RandomForestClassifier(n_estimators=20, max_depth=4, random_state=2).fit(X, y)
    ens = flatten_model(model)
    grid = Grid.from_ensemble(ens, schema)
    part = extract(ens, grid, prove_budget=prove_budget, n_samples=n_samples, n_jobs=2)
    assert part.n_mixed == 0
    # Complete and disjoint: the volumes add up to the whole grid, and every cell sampled
    # below lies in exactly one rectangle.
    vol = np.prod((part.hi - part.lo + 1).astype(np.float64), axis=1).sum()
    assert vol == np.prod(grid.n_cells.astype(np.float64))
    rng = np.random.default_rng(4)
    cells = np.vstack([part.lo, part.hi, rng.integers(part.lo, part.hi + 1)])
    labels = np.concatenate([part.labels] * 3)
    assert np.array_equal(model.predict(grid.cell_points(cells)), model.classes_[labels])
    inside = (part.lo[None] <= cells[:2000, None]) & (cells[:2000, None] <= part.hi[None])
    assert np.all(inside.all(axis=2).sum(axis=1) == 1)
