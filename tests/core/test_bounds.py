"""Purity certificates: the interval bound and the sweep bound are sound lower bounds of
the margin over a region, the sweep is never looser than the interval bound, and the box
the sweep narrows a region to keeps every target cell (the run of cells it reports inside
that box holds none); the search's box clipping (to the distance bound, to the constraint
box) never drops a cell it still needs.

The exact values come from enumerating every cell of small regions and scoring a point of
each with the flat ensemble's own prediction path (not with the bound kernels).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier

from maps_core import CounterfactualMaps, FeatureSchema, flatten_model
from maps_core._bounds import (
    ALL_CHANGED,
    GAP_MIN_CELLS,
    _target_hull,
    bounds_workspace,
    interval_bound,
    sweep_bound,
    sweep_workspace,
)
from maps_core._norms import L1
from maps_core.distance import rect_dist
from maps_core.grid import Grid
from maps_core.lazy import PSEUDO_COST_RELIABLE, _split_cut, clip_to_ball, reachable_cells
from maps_core.partition import Kernel
from tests.conftest import fit

M = 4  # features of the synthetic models


class Bounds:
    """A fitted model's kernel arrays, workspaces and the two bound kernels on whole trees
    (every tree live, from its root; the base scores as the constant part)."""

    def __init__(self, kind: str, n_classes: int, seed: int):
        model, _, _ = fit(kind, n_classes=n_classes, n_features=M, seed=seed)
        self.ens = flatten_model(model)
        self.grid = Grid.from_ensemble(self.ens, FeatureSchema.default(M))
        self.kern = k = Kernel.make(self.ens, self.grid)
        T, c, d = k.roots.shape[0], k.base.shape[0], k.max_depth_nodes
        self.ws = (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32),
                   np.empty(d, dtype=np.int32), np.empty(c), np.empty(c),
                   *bounds_workspace(k.nv.shape[0], T, c, d, True))
        self.sw = sweep_workspace(k.coff, M, c, d)
        self.act = np.arange(T, dtype=np.int32)
        self.nlo, self.nhi = np.empty(M, dtype=np.int32), np.empty(M, dtype=np.int32)

    def random_box(self, rng, max_width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lo, hi, every cell of lo..hi, shape (n, M))."""
        n = self.grid.n_cells
        lo = np.array([rng.integers(0, n[f]) for f in range(M)], dtype=np.int32)
        hi = np.minimum(lo + rng.integers(0, max_width + 1, size=M), n - 1).astype(np.int32)
        cells = np.array(list(itertools.product(*[range(lo[f], hi[f] + 1) for f in range(M)])))
        return lo, hi, cells

    def interval(self, lo, hi, a, chg=ALL_CHANGED, ws=None) -> tuple[float, np.ndarray]:
        """``chg``: see :func:`interval_bound`; ``ws`` another workspace than the sweep's."""
        k = self.kern
        ws = self.ws if ws is None else ws
        w = interval_bound(lo, hi, a, self.act, len(self.act), k.base, k.nf, k.ncut, k.nl, k.nr,
                           k.nv, k.roots, *ws, chg)
        return w, ws[0].copy()

    def workspace(self) -> tuple:
        k = self.kern
        T, c, d = k.roots.shape[0], k.base.shape[0], k.max_depth_nodes
        return (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32),
                np.empty(d, dtype=np.int32), np.empty(c), np.empty(c),
                *bounds_workspace(k.nv.shape[0], T, c, d, True))

    def sweep(self, lo, hi, a, tmask=None) -> tuple[float, np.ndarray, bool]:
        """Right after :meth:`interval` on the same box (it reads its per-tree records)."""
        k = self.kern
        lb, _, top_n, _, _, _, tfeat, _, rec = self.ws
        shrink = tmask is not None
        if tmask is None:
            tmask = np.zeros(self.ens.n_classes, dtype=bool)
        w, narrowed = sweep_bound(lo, hi, a, self.act, len(self.act), k.base, k.nv, k.nf,
                                    tfeat, top_n, rec, k.coff, lb, self.sw, shrink, tmask, k.tol,
                                    self.nlo, self.nhi)
        assert not self.sw[0].any() and not self.sw[1].any()  # handed back clean
        return w, lb.copy(), narrowed


@pytest.mark.parametrize("kind,n_classes", [("rf", 2), ("rf", 3), ("gb", 2), ("gb", 3), ("et", 2)])
def test_sweep_bound_is_sound_and_tighter(kind, n_classes):
    bnd = Bounds(kind, n_classes, seed=3)
    rng = np.random.default_rng(0)
    tighter = 0
    for _ in range(300):
        lo, hi, cells = bnd.random_box(rng, 5)
        scores = bnd.ens.decision_scores(bnd.grid.cell_points(cells))
        a = int(rng.integers(0, n_classes))
        exact = (scores[:, [a]] - scores).min(axis=0)  # per class b: min of score_a - score_b
        w1, lb1 = bnd.interval(lo, hi, a)
        w2, lb2 = bnd.sweep(lo, hi, a)[:2]
        others = [b for b in range(n_classes) if b != a]
        for b in others:
            assert lb1[b] <= exact[b] + 1e-12
            assert lb2[b] <= exact[b] + 1e-12  # sound
            assert lb2[b] >= lb1[b] - 1e-12  # never looser
        assert w1 == pytest.approx(min(lb1[b] for b in others))
        assert w2 == pytest.approx(min(lb2[b] for b in others))
        tighter += w2 > w1 + 1e-12
    assert tighter > 0  # the sweep does decide something the interval bound cannot


def _tree_results(ws: tuple, act: np.ndarray) -> list[tuple]:
    """Per tree of ``act``, everything the bounds read after :func:`interval_bound`: its
    minima, spread, root-most undecided node, one feature and leaf records."""
    _, trange, top_n, _, _, _, tfeat, tmin, rec = ws
    lnode, llo, lhi, tleaf, tnleaf = rec[2:7]
    out = []
    for t in act:
        q = slice(tleaf[t], tleaf[t] + tnleaf[t])
        out.append((tmin[t].tobytes(), trange[t], top_n[t], tfeat[t], lnode[q].tolist(),
                    llo[q].tolist(), lhi[q].tolist()))
    return out


@pytest.mark.parametrize("kind,n_classes", [("rf", 2), ("rf", 3), ("gb", 2), ("et", 2)])
def test_interval_bound_walks_only_the_trees_a_piece_changes(kind, n_classes):
    """On a piece of the box bounded last (a split, or narrower ranges on a few features,
    as the search makes), walking only the trees that test a changed feature gives what a
    walk of every tree gives, bit for bit, and the sweep after it too; over chains of
    pieces long enough to fill the records and start them again."""
    bnd = Bounds(kind, n_classes, seed=5)
    k = bnd.kern
    rng = np.random.default_rng(1)
    fresh = bnd.workspace()
    n = bnd.grid.n_cells
    reused = walked = restarts = 0
    rend = bnd.ws[8][8]
    for _ in range(60):
        lo, hi = np.zeros(M, dtype=np.int32), (n - 1).astype(np.int32)
        a = int(rng.integers(0, n_classes))
        bnd.interval(lo, hi, a)
        for _ in range(12):  # a chain of pieces, each of the box before
            lo, hi = lo.copy(), hi.copy()
            chg = 0
            for f in rng.choice(M, size=int(rng.integers(1, 3)), replace=False):
                if hi[f] > lo[f]:
                    cut = int(rng.integers(lo[f], hi[f]))
                    if rng.random() < 0.5:
                        hi[f] = cut
                    else:
                        lo[f] = cut + 1
                    chg |= 1 << int(f)
            end = rend[0]
            w1, lb1 = bnd.interval(lo, hi, a, chg)
            restarts += rend[0] < end  # the records were full: every tree walked again
            w2, lb2 = bnd.interval(lo, hi, a, ws=fresh)
            assert (w1, lb1.tobytes()) == (w2, lb2.tobytes())
            assert _tree_results(bnd.ws, bnd.act) == _tree_results(fresh, bnd.act)
            tfm = bnd.ws[8][7]
            walked += sum(1 for t in bnd.act if tfm[t] & chg)
            reused += sum(1 for t in bnd.act if not tfm[t] & chg)
            # the sweep reads the records: the same bound and narrowing from both
            tm = np.ones(n_classes, dtype=bool)
            tm[a] = False
            s1 = bnd.sweep(lo, hi, a, tm)
            n1 = (bnd.nlo.copy(), bnd.nhi.copy())
            lb_f, trange, top_n, _, _, _, tfeat, _, rec = fresh
            s2 = sweep_bound(lo, hi, a, bnd.act, len(bnd.act), k.base, k.nv, k.nf, tfeat, top_n,
                             rec, k.coff, lb_f, bnd.sw, True, tm, k.tol, bnd.nlo, bnd.nhi)
            assert s1[0] == s2[0] and s1[1].tobytes() == lb_f.tobytes() and s1[2] == s2[1]
            assert np.array_equal(n1[0], bnd.nlo) and np.array_equal(n1[1], bnd.nhi)
    assert reused > walked > 0  # most trees are reused, and some are walked again
    assert restarts > 0


def _check_narrowing(kind: str, n_classes: int) -> int:
    """The box the sweep narrows to holds every cell of the region whose class (the
    model's own, through the flat ensemble) is a target; only cells it proves are not
    are cut, and so are the runs of cells it reports inside. Returns how many runs it
    reported."""
    bnd = Bounds(kind, n_classes, seed=5)
    rng = np.random.default_rng(1)
    narrowed_boxes = 0
    gaps = 0
    for _ in range(400):
        lo, hi, cells = bnd.random_box(rng, 20)
        labels = bnd.ens.predict_index(bnd.grid.cell_points(cells))
        a = int(rng.integers(0, n_classes))
        tmask = np.ones(n_classes, dtype=bool)
        tmask[a] = False
        if n_classes > 2 and rng.random() < 0.5:
            tmask[int(rng.choice(np.flatnonzero(tmask)))] = False  # a single target class
        bnd.interval(lo, hi, a)
        worst, _, narrowed = bnd.sweep(lo, hi, a, tmask)
        if worst > bnd.kern.tol:
            assert not tmask[labels].any()  # certified class a everywhere
            continue
        nlo, nhi = bnd.nlo, bnd.nhi
        gf, g0, g1 = bnd.sw[7]
        assert np.all(lo <= nlo) and np.all(nhi <= hi)
        assert narrowed == bool(np.any(nlo > lo) or np.any(nhi < hi) or gf >= 0)
        target = cells[tmask[labels]]
        assert np.all((nlo <= target) & (target <= nhi))
        if gf >= 0:  # a run of cells inside the narrowed box that holds no target either
            assert nlo[gf] < g0 and g1 < nhi[gf] and g1 - g0 + 1 >= GAP_MIN_CELLS
            assert not np.any((g0 <= target[:, gf]) & (target[:, gf] <= g1))
            gaps += 1
        narrowed_boxes += narrowed
    assert narrowed_boxes > 0  # the checks above are not vacuous
    return gaps


NARROWED = [("rf", 2), ("rf", 3), ("gb", 2), ("gb", 3)]


@pytest.mark.parametrize("kind,n_classes", NARROWED)
def test_narrowing_keeps_every_target_cell(kind, n_classes):
    _check_narrowing(kind, n_classes)


def test_narrowing_reports_runs_without_target_cells():
    # the checks of the runs above are not vacuous, with two classes and with more
    assert _check_narrowing("rf", 2) > 0
    assert _check_narrowing("rf", 3) > 0


@pytest.mark.parametrize("n_classes", [2, 3])
def test_target_hull_and_its_widest_inner_run(n_classes):
    # Per cell, the margin of class 0 over each class (running sums of diff): a target
    # may lie where it is <= tol, at cells 1, 5 and 7 (class 1 at 1, the last class at 5
    # and 7). The hull is 1..7; the widest run without a target inside it is 2..4.
    v = np.ones((9, n_classes))
    v[1, 1] = -1.0
    v[[5, 7], n_classes - 1] = -1.0
    v[:, 0] = 0.0
    diff = np.diff(v, axis=0, prepend=0.0)
    tmask = np.array([False] + [True] * (n_classes - 1))
    zeros = np.zeros(n_classes)
    got = _target_hull(diff, 0, zeros, zeros, np.empty(n_classes), tmask, 0.0)
    assert tuple(got) == (1, 7, 2, 4)
    v[3, 1] = -1.0  # now 2 and 4 are the widest runs, one cell each: the first is kept
    got = _target_hull(np.diff(v, axis=0, prepend=0.0), 0, zeros, zeros, np.empty(n_classes),
                       tmask, 0.0)
    assert tuple(got) == (1, 7, 2, 2)
    v[1:8, 1] = -1.0  # no run inside the hull
    got = _target_hull(np.diff(v, axis=0, prepend=0.0), 0, zeros, zeros, np.empty(n_classes),
                       tmask, 0.0)
    assert got[:2] == (1, 7) and got[3] - got[2] + 1 == 0


@pytest.mark.parametrize("norm", [0, 1, 2])  # l1, l2, linf (accumulated forms)
def test_clip_to_ball_drops_only_cells_at_or_beyond_the_bound(norm):
    """Every cell the clip removes lies at least ``bound`` from x (exact distance of the
    cell under the norm, accumulated form), and the box keeps its nearest cell, so a box
    whose own distance is below the bound keeps that distance."""
    bnd = Bounds("rf", 2, seed=4)
    g, k = bnd.grid, bnd.kern
    rng = np.random.default_rng(norm)
    no_group = np.full(M, -1, dtype=np.int64)
    lo_all, hi_all = g.cell_lower, g.cell_upper
    removed = 0
    for _ in range(300):
        lo, hi, cells = bnd.random_box(rng, max_width=6)
        x = rng.uniform(-3, 3, size=M)
        w = rng.uniform(0.2, 2.0, size=M)

        # exact distance of every cell (nearest point per feature, then the norm)
        a = lo_all[k.coff[:M] + cells]
        b = hi_all[k.coff[:M] + cells]
        t = w * np.maximum(np.maximum(a - x, x - b), 0.0)
        d_all = t.sum(1) if norm == 0 else (t * t).sum(1) if norm == 1 else t.max(1)
        bound = float(rng.uniform(d_all.min(), d_all.max() + 1e-9))
        clo, chi = lo.copy(), hi.copy()
        clip_to_ball(x, w, norm, no_group, clo, chi, k.coff, lo_all, hi_all, bound)
        kept = np.all((cells >= clo) & (cells <= chi), axis=1)
        assert np.all(d_all[~kept] >= bound - 1e-12)
        assert d_all[kept].min() == pytest.approx(d_all.min(), abs=1e-12)
        removed += int((~kept).sum())
    assert removed > 0


def _constraint_end(rng: np.random.Generator, thresholds: np.ndarray) -> float:
    """A threshold half the time (the edge case), else a value anywhere."""
    if thresholds.size and rng.random() < 0.5:
        return float(rng.choice(thresholds))
    return float(rng.uniform(-3, 3))


def test_reachable_cells_keep_every_cell_the_constraints_admit():
    """The cells mixed regions are clipped to before the search: every cell holding a
    point of the constraint box (the exact test of ``rect_dist``, integral features
    included) is kept, and a constraint end that falls on a threshold keeps the cell whose
    closed upper end it is (the test fails if a closed upper end is treated as open)."""
    bnd = Bounds("rf", 3, seed=5)
    g, k = bnd.grid, bnd.kern
    rng = np.random.default_rng(7)
    x = np.zeros(M)
    w = np.ones(M)
    no_group = np.full(M, -1, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    a0, a1 = np.empty(M, dtype=np.bool_), np.empty(M, dtype=np.bool_)
    integral = rng.random(M) < 0.5
    last = (k.coff[1:M + 1] - k.coff[:M] - 1).astype(np.int32)  # last cell per feature
    dropped = 0
    for _ in range(200):
        cmin, cmax = np.full(M, -np.inf), np.full(M, np.inf)
        for f in range(M):
            ends = g.cell_upper[k.coff[f]:k.coff[f + 1] - 1]  # the thresholds of f
            lo_f, hi_f = sorted(_constraint_end(rng, ends) for _ in range(2))
            if rng.random() < 0.3:
                hi_f = lo_f  # immutable-like: one value
            cmin[f], cmax[f] = (lo_f if rng.random() < 0.8 else -np.inf), hi_f
        klo, khi = reachable_cells(cmin, cmax, k.coff, g.cell_lower, g.cell_upper)
        for f in range(M):
            n_f = k.coff[f + 1] - k.coff[f]
            for j in range(n_f):
                # one-feature box [j, j] on f, whole range elsewhere: admissible points?
                lo = np.zeros((1, M), dtype=np.int32)
                hi = last[None, :].copy()
                lo[0, f] = hi[0, f] = j
                others = [e for e in range(M) if e != f]
                cm, cx = cmin.copy(), cmax.copy()
                cm[others], cx[others] = -np.inf, np.inf
                d = rect_dist(0, x, w, 0, cm, cx, integral, lo, hi, k.coff, g.cell_lower,
                               g.cell_upper, g.cell_lower_closed, g.cell_upper_closed, np.inf,
                               no_group, empty, empty, np.zeros(0), empty, a0, a1)
                if d < np.inf:
                    assert klo[f] <= j <= khi[f], (f, j, cmin[f], cmax[f])
            dropped += n_f - (khi[f] - klo[f] + 1)
    assert dropped > 0  # the check is not vacuous


def test_pseudo_costs_steer_the_cut():
    """A cut is scored by its far side's distance gain times the summed weight of the
    trees at it. Once seen ``PSEUDO_COST_RELIABLE`` times in a round, that weight is
    scaled by the mean share of it that the nearer child's bound gained there (never
    below ``PSEUDO_COST_FLOOR``): a cut that never gained is passed over for another, one
    that gained its whole weight keeps its place, every cut scaled alike keeps the plain
    order, and with fewer observations, or before the search is hard (``use_pcost``
    off), the choice is the plain one."""
    X, y = make_classification(n_samples=300, n_features=M, n_informative=3, n_redundant=0,
                               random_state=2)
    model = RandomForestClassifier(n_estimators=12, max_depth=4, random_state=2).fit(X, y)
    eng = CounterfactualMaps.build(model).engine
    k, (coff, clow, cupp, _, _) = eng.kernel, eng.cells
    T, c, d = k.roots.shape[0], k.base.shape[0], k.max_depth_nodes
    ws = (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32), np.empty(d, dtype=np.int32),
          np.empty(c), np.empty(c), *bounds_workspace(k.nv.shape[0], T, c, d, True))
    act = np.arange(T, dtype=np.int32)
    lo = np.zeros(M, dtype=np.int32)
    hi = (np.diff(coff) - 1).astype(np.int32)
    interval_bound(lo, hi, 0, act, T, k.base.copy(), k.nf, k.ncut, k.nl, k.nr, k.nv,
                   k.roots.copy(), *ws, ALL_CHANGED)
    trange, top_n = ws[1], ws[2]
    x, w = X[0].copy(), np.ones(M)
    gcol = np.full(M, -1, dtype=np.int64)  # no one-hot group, no nominal feature
    shared = np.zeros(coff[-1] + 1)

    def cut_of(pcost: np.ndarray, use: bool) -> int:
        bt, bw = _split_cut(x, w, L1, gcol, coff, clow, cupp, k.nf, k.ncut, k.nv, lo, hi, act,
                            T, k.roots.copy(), k.base.copy(), top_n, trange, trange, shared,
                            pcost, use)
        assert bt >= 0 and bw > 0.0 and not shared.any()  # scratch handed back clean
        node = top_n[bt]
        return int(coff[k.nf[node]] + k.ncut[node])

    pcost = np.zeros((2, coff[-1] + 1))
    plain = cut_of(pcost, True)
    pcost[1, plain] = PSEUDO_COST_RELIABLE  # seen enough, never gained
    other = cut_of(pcost, True)
    assert other != plain
    assert cut_of(pcost, False) == plain
    pcost[1, plain] = PSEUDO_COST_RELIABLE - 1
    assert cut_of(pcost, True) == plain
    pcost[:, plain] = PSEUDO_COST_RELIABLE  # every observation gained the whole weight
    assert cut_of(pcost, True) == plain
    pcost[0], pcost[1] = 0.0, PSEUDO_COST_RELIABLE  # no cut ever gained: the floor for all
    assert cut_of(pcost, True) == plain
