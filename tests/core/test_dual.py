"""The dual bound (``maps_core._dual``) is a sound lower bound of a class margin over a
box, and over the part of the box within a distance bound; with no sweep it is the
interval bound, and its sweeps only raise it.

The exact values come from enumerating every cell of small boxes and scoring a point of
each with the flat ensemble's own prediction path (not with the bound kernels).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from maps_core import FeatureSchema, flatten_model
from maps_core._bounds import ALL_CHANGED, bounds_workspace, interval_bound
from maps_core._dual import dual_bound, dual_workspace
from maps_core._norms import L1, L2
from maps_core.grid import Grid
from maps_core.partition import Kernel
from tests.conftest import fit

M = 4  # features of the synthetic models


class Dual:
    """A fitted two-class model's kernel, every tree live from its root."""

    def __init__(self, kind: str, seed: int, n_features: int = M):
        model, X, _ = fit(kind, n_classes=2, n_features=n_features, seed=seed)
        self.X = X
        self.ens = flatten_model(model)
        self.grid = Grid.from_ensemble(self.ens, FeatureSchema.default(n_features))
        self.kern = k = Kernel.make(self.ens, self.grid)
        self.m = n_features
        T = k.roots.shape[0]
        self.act = np.arange(T, dtype=np.int32)
        self.dw = dual_workspace(k.nv.shape[0], T, n_features, int(k.coff[-1]),
                                 k.max_depth_nodes)

    def random_box(self, rng, max_width: int):
        n = self.grid.n_cells
        lo = np.array([rng.integers(0, n[f]) for f in range(self.m)], dtype=np.int32)
        hi = np.minimum(lo + rng.integers(0, max_width + 1, size=self.m), n - 1).astype(np.int32)
        cells = np.array(list(itertools.product(*[range(lo[f], hi[f] + 1)
                                                  for f in range(self.m)])))
        return lo, hi, cells

    def margins(self, cells, a):
        s = self.ens.decision_scores(self.grid.cell_points(cells))
        return s[:, a] - s[:, 1 - a]

    def bound(self, lo, hi, a, sweeps, x=None, w=None, norm=L1, kappa=0.0, radius=np.inf,
              dw=None):
        k = self.kern
        x = np.zeros(self.m) if x is None else x
        w = np.ones(self.m) if w is None else w
        return dual_bound(lo, hi, a, 1 - a, self.act, len(self.act), k.base.copy(), k.nf,
                          k.ncut, k.nl, k.nr, k.nv, k.roots.copy(), x, w, norm,
                          np.full(self.m, -1, dtype=np.int64), k.coff, self.grid.cell_lower,
                          self.grid.cell_upper, kappa, radius, sweeps, np.inf,
                          self.dw if dw is None else dw)


KINDS = [("rf", 0), ("rf", 5), ("et", 1), ("gb", 2)]


@pytest.mark.parametrize("kind,seed", KINDS)
def test_box_bound_is_sound_and_rises_with_sweeps(kind, seed):
    d = Dual(kind, seed)
    rng = np.random.default_rng(seed)
    raised = 0
    for _ in range(150):
        lo, hi, cells = d.random_box(rng, 6)
        a = int(rng.integers(2))
        exact = d.margins(cells, a).min()
        values = [d.bound(lo, hi, a, s) for s in (0, 1, 3, 12)]
        slack = 1e-9 * (1 + abs(exact))
        assert all(v <= exact + slack for v in values), (values, exact)
        assert all(b >= a_ - 1e-12 for a_, b in zip(values, values[1:], strict=False))
        raised += values[-1] > values[0] + 1e-9
    assert raised > 20  # the sweeps do tighten it


@pytest.mark.parametrize("kind,seed", KINDS)
def test_no_sweep_is_the_interval_bound(kind, seed):
    d = Dual(kind, seed)
    k = d.kern
    T, c, dd = k.roots.shape[0], 2, k.max_depth_nodes
    ws = (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32), np.empty(dd, dtype=np.int32),
          np.empty(c), np.empty(c), *bounds_workspace(k.nv.shape[0], T, c, dd))
    rng = np.random.default_rng(seed + 10)
    for _ in range(100):
        lo, hi, _ = d.random_box(rng, 6)
        a = int(rng.integers(2))
        interval_bound(lo, hi, a, d.act, T, k.base, k.nf, k.ncut, k.nl, k.nr, k.nv, k.roots,
                       *ws, ALL_CHANGED)
        assert d.bound(lo, hi, a, 0) == pytest.approx(ws[0][1 - a], abs=1e-12)


@pytest.mark.parametrize("norm", [L1, L2])
@pytest.mark.parametrize("kind,seed", KINDS)
def test_ball_bound_is_sound_for_points_within_reach(kind, seed, norm):
    """Over the cells that hold a point nearer than the bound, the margin never falls
    below the ball-aware bound (which may exceed the box's own minimum)."""
    d = Dual(kind, seed)
    rng = np.random.default_rng(seed + 20)
    above_box = 0
    clow, cupp = d.grid.cell_lower, d.grid.cell_upper
    coff = d.kern.coff
    for _ in range(150):
        lo, hi, cells = d.random_box(rng, 6)
        a = int(rng.integers(2))
        x = d.X[rng.integers(len(d.X))].astype(np.float64)
        w = rng.uniform(0.2, 2.0, d.m)
        gaps = np.zeros(len(cells))
        for f in range(d.m):
            left = clow[coff[f] + cells[:, f]]
            right = cupp[coff[f] + cells[:, f]]
            g = w[f] * np.maximum(np.maximum(left - x[f], x[f] - right), 0.0)
            gaps += g if norm == L1 else g * g
        radius = float(np.quantile(gaps, rng.uniform(0.05, 0.6))) + 1e-9
        near = gaps < radius
        if not near.any():
            continue
        exact = d.margins(cells[near], a).min()
        for kappa in (0.3, 2.0):
            v = d.bound(lo, hi, a, 8, x=x, w=w, norm=norm, kappa=kappa, radius=radius)
            assert v <= exact + 1e-9 * (1 + abs(exact)), (v, exact)
            above_box += v > d.margins(cells, a).min() + 1e-9
    assert above_box > 0  # the distance budget does rule out some cells' margins


def test_a_box_too_big_for_the_workspace_gets_no_bound():
    d = Dual("rf", 0)
    k = d.kern
    small = dual_workspace(1, k.roots.shape[0], d.m, int(k.coff[-1]), k.max_depth_nodes)
    lo = np.zeros(d.m, dtype=np.int32)
    hi = (d.grid.n_cells - 1).astype(np.int32)
    assert d.bound(lo, hi, 0, 4, dw=small) == -np.inf
    assert d.bound(lo, hi, 0, 4) > -np.inf  # the full workspace fits
