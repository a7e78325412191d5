"""Purity certificates: the interval bound and the one-feature sweep bound are sound lower
bounds of the margin over a region, and the sweep is never looser than the interval bound.

The exact minimum comes from enumerating every cell of small regions and scoring a point of
each with the flat ensemble's own prediction path (not with the bound kernels).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from maps_core import FeatureSchema, flatten_model
from maps_core.grid import Grid
from maps_core.partition import (
    Kernel,
    _bounds_on,
    _bounds_workspace,
    _sweep_bounds,
    _sweep_workspace,
)
from tests.conftest import fit


def _workspaces(kern: Kernel, m: int):
    T, c = kern.roots.shape[0], kern.base.shape[0]
    d = kern.max_depth_nodes
    ws = (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32), np.empty(d, dtype=np.int32),
          np.empty(c), np.empty(c), *_bounds_workspace(kern.nv.shape[0], T, c, d))
    return ws, _sweep_workspace(kern.coff, m, c, d)


@pytest.mark.parametrize("kind,n_classes", [("rf", 2), ("rf", 3), ("gb", 2), ("gb", 3), ("et", 2)])
def test_sweep_bound_is_sound_and_tighter(kind, n_classes):
    model, X, _ = fit(kind, n_classes=n_classes, n_features=4, seed=3)
    ens = flatten_model(model)
    grid = Grid.from_ensemble(ens, FeatureSchema.default(4))
    kern = Kernel.make(ens, grid)
    m, T = 4, kern.roots.shape[0]
    ws, sw = _workspaces(kern, m)
    lb, trange, top_n, stack, mn, mx, tfeat, tmin, rec = ws
    lb2 = np.empty_like(lb)
    no_targets = np.zeros(ens.n_classes, dtype=bool)
    nlo, nhi = np.empty(m, dtype=np.int32), np.empty(m, dtype=np.int32)
    act = np.arange(T, dtype=np.int32)
    start = kern.roots.copy()
    rng = np.random.default_rng(0)
    n = grid.n_cells
    tighter = 0
    for _ in range(300):
        lo = np.array([rng.integers(0, n[f]) for f in range(m)], dtype=np.int32)
        width = rng.integers(0, 6, size=m)
        hi = np.minimum(lo + width, n - 1).astype(np.int32)
        cells = np.array(list(itertools.product(*[range(lo[f], hi[f] + 1) for f in range(m)])))
        scores = ens.decision_scores(grid.cell_points(cells))
        a = int(rng.integers(0, ens.n_classes))
        exact = (scores[:, [a]] - scores).min(axis=0)  # per class b: min of score_a - score_b
        w1 = _bounds_on(lo, hi, a, act, T, kern.base, kern.nf, kern.ncut, kern.nl, kern.nr,
                        kern.nv, start, lb, trange, top_n, stack, mn, mx, tfeat, tmin, rec)
        w2, _ = _sweep_bounds(lo, hi, a, act, T, kern.base, kern.nv, kern.nf, tfeat, tmin,
                              top_n, rec, kern.coff, lb2, sw, False, no_targets, kern.tol,
                              nlo, nhi)
        others = [b for b in range(ens.n_classes) if b != a]
        for b in others:
            assert lb[b] <= exact[b] + 1e-12
            assert lb2[b] <= exact[b] + 1e-12  # sound
            assert lb2[b] >= lb[b] - 1e-12  # never looser
        assert w1 == pytest.approx(min(lb[b] for b in others))
        assert w2 == pytest.approx(min(lb2[b] for b in others))
        tighter += w2 > w1 + 1e-12
        # the workspace is handed back clean for the next call
        assert not sw[0].any() and not sw[1].any()
    assert tighter > 0  # the sweep does decide something the interval bound cannot


@pytest.mark.parametrize("kind,n_classes", [("rf", 2), ("rf", 3), ("gb", 2), ("gb", 3)])
def test_narrowing_keeps_every_target_cell(kind, n_classes):
    """The box the sweep narrows to holds every cell of the region whose class (the
    model's own, through the flat ensemble) is a target; only cells it proves are not
    are cut."""
    model, X, _ = fit(kind, n_classes=n_classes, n_features=4, seed=5)
    ens = flatten_model(model)
    grid = Grid.from_ensemble(ens, FeatureSchema.default(4))
    kern = Kernel.make(ens, grid)
    m, T = 4, kern.roots.shape[0]
    ws, sw = _workspaces(kern, m)
    lb, trange, top_n, stack, mn, mx, tfeat, tmin, rec = ws
    nlo, nhi = np.empty(m, dtype=np.int32), np.empty(m, dtype=np.int32)
    act = np.arange(T, dtype=np.int32)
    start = kern.roots.copy()
    rng = np.random.default_rng(1)
    n = grid.n_cells
    narrowed_boxes = 0
    for _ in range(400):
        lo = np.array([rng.integers(0, n[f]) for f in range(m)], dtype=np.int32)
        hi = np.minimum(lo + rng.integers(1, 8, size=m), n - 1).astype(np.int32)
        cells = np.array(list(itertools.product(*[range(lo[f], hi[f] + 1) for f in range(m)])))
        labels = ens.predict_index(grid.cell_points(cells))
        a = int(rng.integers(0, ens.n_classes))
        tmask = np.ones(ens.n_classes, dtype=bool)
        tmask[a] = False
        if n_classes > 2 and rng.random() < 0.5:
            tmask[int(rng.choice(np.flatnonzero(tmask)))] = False  # a single target class
        _bounds_on(lo, hi, a, act, T, kern.base, kern.nf, kern.ncut, kern.nl, kern.nr, kern.nv,
                   start, lb, trange, top_n, stack, mn, mx, tfeat, tmin, rec)
        worst, narrowed = _sweep_bounds(lo, hi, a, act, T, kern.base, kern.nv, kern.nf, tfeat,
                                        tmin, top_n, rec, kern.coff, lb, sw, True, tmask,
                                        kern.tol, nlo, nhi)
        assert not sw[0].any() and not sw[1].any()
        if worst > kern.tol:
            assert not tmask[labels].any()  # certified class a everywhere
            continue
        assert np.all(lo <= nlo) and np.all(nhi <= hi)
        assert narrowed == bool(np.any(nlo > lo) or np.any(nhi < hi))
        target = cells[tmask[labels]]
        assert np.all((nlo <= target) & (target <= nhi))
        narrowed_boxes += narrowed
    assert narrowed_boxes > 0  # the check above is not vacuous
