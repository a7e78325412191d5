"""How tight the dual bound (``maps_core._dual``) is on the regions the exact search of a
Credit random forest must rule out, against the interval bound, the linear relaxation and
the exact minimum.

    python -m benchmarks.exp_dual                       # RF 100x5, 6 test rows, 5 regions each
    python -m benchmarks.exp_dual --rows 2 --regions 3 --out benchmarks/results/dual.md

For each test row: its exact l1 counterfactual (schema default weights; distance ``d``),
then the mixed regions of the maps (the service's default budget) that come within
``1.1 d`` of it, each clipped to that ball (``lazy.clip_to_ball``), the widest first. On
each, lower bounds of the margin of x's class over the target class (votes: sums over the
trees of the class-probability difference) over the region's points within ``1.1 d``:

* ``interval``: every tree's worst reachable leaf (``dual_bound`` with no sweep);
* ``sweep``: the search's second bound (``_bounds.sweep_bound``: trees projected on one
  feature each, projections summed per feature);
* ``dual S``: ``dual_bound`` after at most S sweeps of star updates, over the whole box
  (``kappa = 0``) or over its part within the ball (``ball``, ``kappa = 0.5``);
* ``LP``: the linear relaxation the dual bound climbs towards, solved exactly (HiGHS,
  through SciPy): leaf indicators, one cumulative variable per cut, consistency of every
  tree's leaves with the cuts, and the l1 room;
* ``MILP``: the same with the cut variables integral: the exact minimum.

A region is ruled out when its bound exceeds 0 (the kernel's tolerance, in fact). The
search itself does not use the dual bound yet: see the README on why (its cost per box).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import train_test_split

from benchmarks.common import SHARED
from maps_core import CounterfactualMaps, load_csv
from maps_core._bounds import (
    ALL_CHANGED,
    bounds_workspace,
    interval_bound,
    sweep_bound,
    sweep_workspace,
)
from maps_core._dual import dual_bound, dual_workspace
from maps_core._norms import L1
from maps_core.lazy import clip_to_ball
from maps_core.options import make_options
from maps_core.partition import MIXED

SWEEPS = (1, 4, 16)


def _gap(x, w, f, a, b, coff, clow, cupp) -> float:
    lo_v, hi_v = clow[coff[f] + a], cupp[coff[f] + b]
    return float(w[f] * max(lo_v - x[f], x[f] - hi_v, 0.0))


def _leaves(kern, t, lo, hi):
    """Reachable leaves of tree ``t`` in the box, with their cell ranges."""
    nf, ncut, nl, nr = kern.nf, kern.ncut, kern.nl, kern.nr
    out = []
    stack = [(int(kern.roots[t]), lo.copy(), hi.copy())]
    while stack:
        node, lo_n, hi_n = stack.pop()
        f = nf[node]
        if f < 0:
            out.append((node, lo_n, hi_n))
            continue
        c = ncut[node]
        if lo_n[f] <= c:
            h2 = hi_n.copy()
            h2[f] = min(h2[f], c)
            stack.append((int(nl[node]), lo_n.copy(), h2))
        if hi_n[f] > c:
            l2 = lo_n.copy()
            l2[f] = max(l2[f], c + 1)
            stack.append((int(nr[node]), l2, hi_n.copy()))
    return out


def relaxation(kern, ce, x, w, lo, hi, a, b, room, integral, time_limit):
    """Minimum of the margin of ``a`` over ``b`` over the box's points whose l1 distance
    beyond the box's own terms is at most ``room`` (``inf``: the whole box), as a linear
    program (``integral`` False) or exactly. Returns (value, seconds)."""
    coff, clow, cupp = ce.coff, ce.clow, ce.cupp
    m = lo.shape[0]
    base = np.array([_gap(x, w, f, lo[f], hi[f], coff, clow, cupp) for f in range(m)])
    pidx: dict[tuple[int, int], int] = {}
    for f in range(m):
        for k in range(lo[f], hi[f]):  # p[f, k] = 1: x_f lies in a cell <= k
            pidx[(f, k)] = len(pidx)
    n_p = len(pidx)
    recs = [(t, n, lo_n, hi_n) for t in range(kern.roots.shape[0])
            for n, lo_n, hi_n in _leaves(kern, t, lo, hi)]
    n_var = n_p + len(recs)
    cost = np.zeros(n_var)
    for i, (_, n, _, _) in enumerate(recs):
        cost[n_p + i] = kern.nv[n, a] - kern.nv[n, b]
    rows: list[tuple[dict[int, float], float, float]] = []
    for f in range(m):
        for k in range(lo[f], hi[f] - 1):
            rows.append(({pidx[(f, k)]: 1.0, pidx[(f, k + 1)]: -1.0}, -np.inf, 0.0))
    by_tree: dict[int, list[int]] = {}
    for i, (t, _, _, _) in enumerate(recs):
        by_tree.setdefault(t, []).append(i)
    for ids in by_tree.values():
        rows.append(({n_p + i: 1.0 for i in ids}, 1.0, 1.0))
        for f in range(m):
            cuts = {int(recs[i][3][f]) for i in ids if recs[i][3][f] < hi[f]}
            cuts |= {int(recs[i][2][f]) - 1 for i in ids if recs[i][2][f] > lo[f]}
            for k in cuts:  # leaves wholly left of cut k need x left of it, and so on
                left = {n_p + i: 1.0 for i in ids if recs[i][3][f] <= k}
                right = {n_p + i: 1.0 for i in ids if recs[i][2][f] > k}
                left[pidx[(f, k)]] = -1.0
                right[pidx[(f, k)]] = 1.0
                rows.append((left, -np.inf, 0.0))
                rows.append((right, -np.inf, 1.0))
    if room < np.inf:
        # distance beyond the box's terms: cell j costs e_j, and x_f lies in cell j when
        # p[f, j] - p[f, j - 1] = 1 (p[f, lo - 1] = 0, p[f, hi] = 1)
        d: dict[int, float] = {}
        const = 0.0
        for f in range(m):
            for j in range(lo[f], hi[f] + 1):
                e = _gap(x, w, f, j, j, coff, clow, cupp) - base[f]
                if j < hi[f]:
                    d[pidx[(f, j)]] = d.get(pidx[(f, j)], 0.0) + e
                else:
                    const += e
                if j > lo[f]:
                    d[pidx[(f, j - 1)]] = d.get(pidx[(f, j - 1)], 0.0) - e
        rows.append((d, -np.inf, room - const))
    A = lil_matrix((len(rows), n_var))
    lb = np.empty(len(rows))
    ub = np.empty(len(rows))
    for r, (coefs, lo_r, hi_r) in enumerate(rows):
        for col, v in coefs.items():
            A[r, col] = v
        lb[r], ub[r] = lo_r, hi_r
    integ = np.zeros(n_var)
    if integral:
        integ[:n_p] = 1
    t0 = time.perf_counter()
    res = milp(cost, constraints=LinearConstraint(A.tocsr(), lb, ub), bounds=Bounds(0, 1),
               integrality=integ, options={"time_limit": time_limit})
    seconds = time.perf_counter() - t0
    if res.status != 0 or res.fun is None:
        return float("nan"), seconds
    return float(res.fun + kern.base[a] - kern.base[b]), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--regions", type=int, default=5)
    ap.add_argument("--reach", type=float, default=1.1, help="ball radius, in answers' distances")
    ap.add_argument("--time-limit", type=float, default=60.0, help="per LP or MILP solve (s)")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()

    data = load_csv(SHARED / "datasets" / "Credit.csv")
    Xtr, Xte, ytr, _ = train_test_split(data.X, data.y, test_size=0.2, random_state=0)
    model = RandomForestClassifier(args.trees, max_depth=args.depth, random_state=0).fit(Xtr, ytr)
    maps = CounterfactualMaps.build(model, data.schema, max_rectangles=250_000)
    eng = maps.engine
    kern, ce = eng.kernel, eng.cells
    part = eng.partition
    opts = make_options(eng, norm="l1")
    w = np.ascontiguousarray(opts.weights, dtype=np.float64)
    gcol = np.ascontiguousarray(opts.gcol)
    T = kern.roots.shape[0]
    m = w.shape[0]
    dw = dual_workspace(kern.nv.shape[0], T, m, int(ce.coff[-1]), kern.max_depth_nodes)
    act = np.arange(T, dtype=np.int32)
    mixed = np.flatnonzero(np.asarray(part.labels) == MIXED)
    start = kern.roots.astype(np.int32).copy()  # every tree live, from its root
    cs = kern.base.astype(np.float64).copy()

    def dual(lo, hi, a, x, bound, sweeps, kappa):
        return dual_bound(lo, hi, a, 1 - a, act, T, cs, kern.nf, kern.ncut, kern.nl, kern.nr,
                          kern.nv, start, x, w, L1, gcol, ce.coff, ce.clow, ce.cupp, kappa,
                          bound, sweeps, np.inf, dw)

    c = kern.base.shape[0]
    d_nodes = kern.max_depth_nodes
    iws = (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32),
           np.empty(d_nodes, dtype=np.int32), np.empty(c), np.empty(c),
           *bounds_workspace(kern.nv.shape[0], T, c, d_nodes))
    sws = sweep_workspace(ce.coff, m, c, d_nodes)
    no_target = np.zeros(c, dtype=bool)
    nlo, nhi = np.empty(m, dtype=np.int32), np.empty(m, dtype=np.int32)
    header = (["row", "region", "free features", "interval", "sweep"]
              + [f"dual {s}" for s in SWEEPS] + [f"ball dual {s}" for s in SWEEPS]
              + ["LP", "ball LP", "ball MILP", "LP / MILP s"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ruled = np.zeros(len(header) - 5)
    n_boxes = 0
    for row in range(args.rows):
        x = np.ascontiguousarray(Xte[row], dtype=np.float64)
        res = maps.counterfactual(x)
        a = list(eng.classes).index(res.prediction)
        b = 1 - a
        bound = args.reach * res.best.distance  # l1: accumulated form = distance
        boxes = []
        for r in mixed:
            lo = np.array(part.lo[r], dtype=np.int32)
            hi = np.array(part.hi[r], dtype=np.int32)
            if sum(_gap(x, w, f, lo[f], hi[f], ce.coff, ce.clow, ce.cupp)
                   for f in range(m) if gcol[f] < 0) >= bound:
                continue
            clip_to_ball(x, w, L1, gcol, lo, hi, ce.coff, ce.clow, ce.cupp, bound)
            boxes.append((float(np.log(hi - lo + 1.0).sum()), lo, hi))
        boxes.sort(key=lambda t: -t[0])
        for i, (_, lo, hi) in enumerate(boxes[:args.regions]):
            tot = sum(_gap(x, w, f, lo[f], hi[f], ce.coff, ce.clow, ce.cupp)
                      for f in range(m) if gcol[f] < 0)
            lb, _, top_n, _, _, _, tfeat, _, rec = iws
            interval_bound(lo, hi, a, act, T, cs, kern.nf, kern.ncut, kern.nl, kern.nr,
                           kern.nv, start, *iws, ALL_CHANGED)
            swept, _ = sweep_bound(lo, hi, a, act, T, cs, kern.nv, kern.nf, tfeat, top_n, rec,
                                   ce.coff, lb, sws, False, no_target, kern.tol, nlo, nhi)
            vals = ([swept] + [dual(lo, hi, a, x, bound, s, 0.0) for s in SWEEPS]
                    + [dual(lo, hi, a, x, bound, s, 0.5) for s in SWEEPS])
            lp, t_lp = relaxation(kern, ce, x, w, lo, hi, a, b, np.inf, False, args.time_limit)
            lp_ball, _ = relaxation(kern, ce, x, w, lo, hi, a, b, bound - tot, False,
                                    args.time_limit)
            exact, t_ex = relaxation(kern, ce, x, w, lo, hi, a, b, bound - tot, True,
                                     args.time_limit)
            vals += [lp, lp_ball, exact]
            ruled += np.array(vals) > kern.tol
            n_boxes += 1
            cells = [f"{v:+.2f}" for v in [dual(lo, hi, a, x, bound, 0, 0.0)] + vals]
            lines.append(f"| {row} | {i} | {int((hi > lo).sum())} | " + " | ".join(cells)
                         + f" | {t_lp:.2f} / {t_ex:.1f} |")
            print(lines[-1], flush=True)
    lines.append(f"| ruled out | of {n_boxes} | | | "
                 + " | ".join(str(int(v)) for v in ruled) + " | |")
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
