"""The guesses of a stopped search (``maps_core._incumbent``): the scores they move by
along an axis are the model's own, cell by cell.

The guesses only offer candidates (every cell they return is labelled again by every tree,
and the search's own lower bound never depends on them; ``test_storage_and_budget`` and
``test_constraints`` check the answers of stopped searches against complete maps). What
is checked here is that the axis scores (:func:`~maps_core._incumbent._line_scores`, with
the trees constant along the axis taken from :func:`~maps_core._incumbent._paths`) equal
the flat ensemble's scores of each cell: wrong ones would silently steer the guesses.
"""

from __future__ import annotations

import numpy as np
import pytest

from maps_core import FeatureSchema, flatten_model
from maps_core._incumbent import _line_scores, _paths
from maps_core.grid import Grid
from maps_core.partition import Kernel
from tests.conftest import fit


@pytest.mark.parametrize("kind,n_classes,m", [("rf", 2, 4), ("rf", 3, 4), ("gb", 2, 4),
                                              ("gb", 3, 4), ("et", 2, 4), ("rf", 2, 70)])
def test_axis_scores_equal_the_scores_of_each_cell(kind, n_classes, m):
    """70 features: the trees' path masks take two 64-bit words."""
    model, _, _ = fit(kind, n_classes=n_classes, n_features=m, seed=5)
    ens = flatten_model(model)
    grid = Grid.from_ensemble(ens, FeatureSchema.default(m))
    k = Kernel.make(ens, grid)
    T, c, d = k.roots.shape[0], k.base.shape[0], k.max_depth_nodes
    n = grid.n_cells
    leaf, fmask = np.empty(T, dtype=np.int64), np.empty((T, (m + 63) // 64), dtype=np.int64)
    tot = np.empty(c)
    stack, slo, shi = (np.empty(d + 2, dtype=np.int32) for _ in range(3))
    sc = np.empty((int(n.max()) + 3, c))
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(20):
        cell = np.array([rng.integers(0, n[f]) for f in range(m)], dtype=np.int32)
        _paths(cell, k.nf, k.ncut, k.nl, k.nr, k.nv, k.roots, k.base, leaf, fmask, tot)
        np.testing.assert_allclose(tot, ens.decision_scores(grid.cell_points(cell[None]))[0],
                                   rtol=0, atol=1e-9)
        for f in rng.choice(m, size=min(m, 6), replace=False):
            if n[f] < 2:
                continue
            j0 = int(rng.integers(0, n[f]))
            j1 = int(rng.integers(j0, n[f]))
            _line_scores(cell, f, j0, j1, k.nf, k.ncut, k.nl, k.nr, k.nv, k.roots, leaf, fmask,
                         tot, stack, slo, shi, sc)
            cells = np.repeat(cell[None], j1 - j0 + 1, axis=0)
            cells[:, f] = np.arange(j0, j1 + 1)
            want = ens.decision_scores(grid.cell_points(cells))
            np.testing.assert_allclose(sc[:j1 - j0 + 1], want, rtol=0, atol=1e-9)
            checked += 1
    assert checked >= 40
