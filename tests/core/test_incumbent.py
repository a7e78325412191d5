"""The guesses (``maps_core._incumbent``) of a stopped search, and the first guess that
bounds a search's first round: the scores they move by along an axis are the model's own,
cell by cell; the first guess is a target point's distance, at or past the optimum.

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

import maps_core.query
from maps_core import FeatureSchema, flatten_model
from maps_core._incumbent import _label, _line_scores, _paths, _setup, first_guess, polish_cell
from maps_core._norms import finish
from maps_core.grid import Grid
from maps_core.lazy import Query, reachable_cells
from maps_core.options import categories, make_options
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


def _first_guess(maps, x, norm):
    """:func:`~maps_core._incumbent.first_guess` for ``x`` (any other class, no
    constraints), as a distance."""
    eng = maps.engine
    opts = make_options(eng, norm=norm)
    cmin, cmax = opts.constraint_box(x)
    tmask = np.ones(len(eng.classes), dtype=bool)
    tmask[int(eng.classify(x[None])[0])] = False
    q = Query(x, opts.weights, opts.norm_code, cmin, cmax, eng.grid.integral, tmask, 1,
              *opts.group_args(x, categories(opts, x[None])[0]))
    ce = eng.cells
    klo, khi = reachable_cells(cmin, cmax, ce.coff, ce.clow, ce.cupp)
    return finish(opts.norm_code, first_guess(q, ce, eng.kernel, klo, khi, np.inf))


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_first_guess_is_a_target_point_at_or_past_the_optimum(budgeted, norm):
    """The guess that bounds a search's first round is the distance of a target cell: never
    below the exact optimum (complete maps), often at it."""
    model, X, full, part = budgeted
    found = exact = 0
    for x in X[:30]:
        want = full.counterfactual(x, norm=norm).best.distance
        got = _first_guess(part, x, norm)
        assert got >= want * (1 - 1e-12)
        found += np.isfinite(got)
        exact += bool(np.isclose(got, want, rtol=1e-9, atol=0))
    assert found >= 25 and exact >= 5, (found, exact)


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_polish_cell_brings_a_target_cell_nearer_and_keeps_it_a_target(budgeted, norm):
    """What the search does with a target cell its probe finds: the polished cell is a
    target cell by the model's own predict, never farther than the cell it started from,
    never nearer than the exact optimum, and nearer on most queries (the cells start at
    random target points, far from x)."""
    model, X, full, part = budgeted
    eng = part.engine
    grid = eng.grid
    rng = np.random.default_rng(1)
    P = rng.uniform(X.min(axis=0), X.max(axis=0), size=(400, X.shape[1]))
    pred_p = model.predict(P)
    nearer = 0
    for x in X[:25]:
        pred = model.predict(x[None])[0]
        opts = make_options(eng, norm=norm)
        cmin, cmax = opts.constraint_box(x)
        tmask = np.array([c != pred for c in eng.classes])
        q = Query(x, opts.weights, opts.norm_code, cmin, cmax, grid.integral, tmask, 1,
                  *opts.group_args(x, categories(opts, x[None])[0]))
        ce, kern = eng.cells, eng.kernel
        klo, khi = reachable_cells(cmin, cmax, ce.coff, ce.clow, ce.cupp)
        start = grid.cells_of(P[pred_p != pred][:1])[0].astype(np.int32)
        _, _, lab_ws, _ = _setup(q, ce, kern, klo, khi)
        lab0, d0 = _label(q, ce, kern, start.copy(), lab_ws, np.zeros(2, dtype=np.int64))
        assert lab0 >= 0  # a target cell to start from
        cell = start.copy()
        lab, d = polish_cell(q, ce, kern, klo, khi, cell, np.inf)
        assert lab >= 0 and eng.classes[lab] != pred
        assert model.predict(grid.cell_points(cell[None]))[0] == eng.classes[lab]
        want = full.counterfactual(x, norm=norm).best.distance
        got, start_d = finish(opts.norm_code, d), finish(opts.norm_code, d0)
        assert want * (1 - 1e-12) <= got <= start_d * (1 + 1e-12)
        nearer += got < start_d * (1 - 1e-9)
    assert nearer >= 15, nearer


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
def test_first_guess_saves_boxes_and_keeps_the_answers(budgeted, norm, monkeypatch):
    """l1 and l2 searches whose first round is bounded by the guess pop fewer
    mixed-region boxes in all than with the fixed first bound (0.45x to 0.7x here), with
    the same exact answers, each predicted as its target by the model; linf searches make
    no guess (``query._guessing``), so they pop the same boxes."""
    model, X, full, part = budgeted
    pops = {}
    for guess in (False, True):
        monkeypatch.setattr(maps_core.query, "GUESS_FIRST", guess)
        rs = part.counterfactuals(X[:40], norm=norm)
        pops[guess] = sum(r.stats.regions_refined for r in rs)
        for r, x in zip(rs, X[:40], strict=True):
            want = full.counterfactual(x, norm=norm).best.distance
            assert r.best.distance == pytest.approx(want, rel=1e-9, abs=1e-12)
            assert model.predict(r.best.x[None])[0] == r.target
    if norm == "linf":
        assert pops[True] == pops[False], pops
    else:
        assert pops[True] < pops[False], pops
