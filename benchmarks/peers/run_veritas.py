"""Veritas: the closest point of the target class under weighted l-infinity (issue 14).

Run by benchmarks/.venvs/veritas/bin/python: ``run_veritas.py JOB.json OUT.jsonl``. Needs
numpy and dtai-veritas only (never the project). The host
(:mod:`benchmarks.peers.veritas_side_by_side`) writes the job:

* ``trees``: per tree the node arrays ``left``, ``right`` (-1 at leaves), ``feature``,
  ``split`` and ``leaf``. ``split`` is already the value Veritas needs: Veritas sends
  ``x < split`` left, and the host put it one float64 above the real boundary of
  scikit-learn's ``float32(x) <= threshold``, so the ensemble below routes every float64
  input as scikit-learn does (``veritas.get_addtree`` uses ``x <= threshold`` in float64,
  which differs on slivers narrower than a float32 ulp).
* ``base``: the raw score offset. The class is 1 iff ``base + sum of leaves > 0`` (random
  forest: leaves are the trees' P(class 1), base ``-n_trees / 2``; gradient boosting: the
  trees' scaled values and the initial raw prediction).
* ``X_check`` / ``raw_check``: a few hundred points and the host's raw score there; the run
  aborts unless Veritas' ``AddTree.eval`` agrees to 1e-9.
* ``X``, ``targets`` (class 0/1), ``weights`` w (distance ``max_j w_j |x'_j - x_j|``),
  ``lower`` / ``upper`` (the box the answer must stay in), ``time_limit`` (s per query).

Search. Veritas' robustness search (``veritas.VeritasRobustnessSearch``, ICML 2021) bisects
the radius delta of the box around x and asks Veritas' A* search (``HeuristicType.MAX_OUTPUT``)
for the largest output in it; it stops at a relative gap of 1e-5. Here the bisection runs
over the finite set of radii where the reachable cells change (``|split - x_j| * w_j`` for
every split, and the last float64 below each split for the cells on the left), so its
answer is exact: the smallest such radius whose box holds a point of the target class,
with Veritas proving (its search exhausted: ``NO_MORE_OPEN`` / optimal) that the box of
the previous radius holds none. The radii are tried galloping up from the smallest (the
1st, 2nd, 4th, 8th... radius: small boxes are quick to search), then bisected. Class 0 is
searched on the negated ensemble (``output >= 0``), class 1 on the ensemble
(``output > 0``). The counterfactual is the point of the solution's box nearest to x. A
step that runs out of time ends the query: the answer found so far is kept, ``proved`` is
false, and ``lower`` bounds the optimum.

One JSON line per query: status, proved, distance (weighted linf of the returned point),
lower, x_cf, output (Veritas' at x_cf), steps, seconds.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

#: focal search settings of ``veritas.VeritasRobustnessSearch`` (a solution, if any, comes
#: much sooner than with the pure A* order; a "none" still needs the search exhausted)
FOCAL = (0.2, 1000)


def build(veritas, trees, base: float, sign: float):  # noqa: ANN001, ANN201 - untyped module
    at = veritas.AddTree(1, veritas.AddTreeType.REGR)
    for tr in trees:
        t = at.add_tree()
        stack = [(0, t.root())]
        while stack:
            n, m = stack.pop()
            if tr["left"][n] == -1:
                t.set_leaf_value(m, 0, sign * tr["leaf"][n])
                continue
            t.split(m, int(tr["feature"][n]), float(tr["split"][n]))
            stack.append((tr["right"][n], t.right(m)))
            stack.append((tr["left"][n], t.left(m)))
    at.set_base_score(0, sign * base)
    return at


def splits_per_feature(trees, m: int) -> list[np.ndarray]:  # noqa: ANN001
    out: list[list[float]] = [[] for _ in range(m)]
    for tr in trees:
        for f, s, left in zip(tr["feature"], tr["split"], tr["left"], strict=True):
            if left != -1:
                out[f].append(s)
    return [np.unique(np.asarray(v, dtype=np.float64)) for v in out]


def radii(
    x: np.ndarray, splits: list[np.ndarray], w: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Every radius where the box around x reaches a new cell (plus 0)."""
    out = [np.zeros(1)]
    for j, s in enumerate(splits):
        up = s[(s > x[j]) & (s <= hi[j])]  # the cell [s, next) starts at s itself
        below = np.nextafter(s[s <= x[j]], -np.inf)  # the cell (prev, s) ends at s's predecessor
        below = below[below >= lo[j]]
        out += [(up - x[j]) * w[j], (x[j] - below) * w[j]]
    return np.unique(np.concatenate(out))


def box_for(veritas, x, splits, w, lo, hi, r):  # noqa: ANN001, ANN201
    """The box of the cells reachable within weighted-linf radius r, clipped to [lo, hi]."""
    box = []
    for j, s in enumerate(splits):
        a, b = lo[j], float(np.nextafter(hi[j], np.inf))  # Interval is [a, b)
        up = s[s > x[j]]
        out_up = up[(up - x[j]) * w[j] > r]
        if out_up.size:
            b = min(b, float(out_up[0]))
        below = np.nextafter(s[s <= x[j]], -np.inf)
        reach = below[(x[j] - below) * w[j] <= r]
        if reach.size:
            a = max(a, float(reach[0]))
        else:
            a = max(a, float(x[j]))
        box.append(veritas.Interval(a, b))
    return box


def decide(veritas, at, box, strict: bool, seconds: float):  # noqa: ANN001, ANN201
    """(True, solution) / (False, None) when proved, (None, None) when out of time."""
    c = veritas.Config(veritas.HeuristicType.MAX_OUTPUT)
    c.stop_when_optimal = True
    c.ignore_state_when_worse_than = 0.0
    c.stop_when_atleast_bound_better_than = float(np.nextafter(0.0, 1.0)) if strict else 0.0
    c.max_memory = 2 * 1024**3
    c.focal_eps, c.max_focal_size = FOCAL
    s = c.get_search(at, box)
    stop = time.perf_counter() + max(seconds, 0.0)
    while True:
        reason = s.step_for(max(stop - time.perf_counter(), 1e-3), 100)
        for i in range(s.num_solutions()):
            sol = s.get_solution(i)
            if sol.output > 0.0 or (not strict and sol.output == 0.0):
                return True, sol
        name = str(reason).rsplit(".", 1)[-1]
        if name in ("NO_MORE_OPEN", "OPTIMAL") or s.is_optimal():
            return False, None
        if time.perf_counter() >= stop or name in ("OUT_OF_TIME", "OUT_OF_MEMORY"):
            return None, None


def closest(x: np.ndarray, sol, box) -> np.ndarray:  # noqa: ANN001
    p = x.copy()
    sb = sol.box()
    for j, iv in enumerate(box):
        a, b = iv.lo, iv.hi
        if j in sb:
            a, b = max(a, sb[j].lo), min(b, sb[j].hi)
        if x[j] < a:
            p[j] = a
        elif x[j] >= b:
            p[j] = float(np.nextafter(b, -np.inf))
    return p


def main(job_path: str, out_path: str) -> None:
    import veritas

    job = json.loads(open(job_path, encoding="utf-8").read())
    trees, base = job["trees"], float(job["base"])
    m = len(job["weights"])
    ats = {1: build(veritas, trees, base, 1.0), 0: build(veritas, trees, base, -1.0)}
    raw = np.asarray(ats[1].eval(np.asarray(job["X_check"], dtype=np.float64))).ravel()
    diff = float(np.max(np.abs(raw - np.asarray(job["raw_check"]))))
    if not diff <= 1e-9 * max(1.0, float(np.max(np.abs(raw)))):
        raise RuntimeError(f"Veritas' AddTree differs from the host's raw scores by {diff}")
    splits = splits_per_feature(trees, m)
    w = np.asarray(job["weights"], dtype=np.float64)
    lo, hi = np.asarray(job["lower"], dtype=np.float64), np.asarray(job["upper"], dtype=np.float64)
    meta = {"veritas": veritas.__version__, "numpy": np.__version__, "check_max_diff": diff}
    open(out_path + ".meta.json", "w", encoding="utf-8").write(json.dumps(meta))
    with open(out_path, "w", encoding="utf-8") as out:
        for x, target in zip(job["X"], job["targets"], strict=True):
            x = np.asarray(x, dtype=np.float64)
            at, strict = ats[int(target)], int(target) == 1
            t0 = time.perf_counter()
            deadline = t0 + float(job["time_limit"])
            cand = radii(x, splits, w, lo, hi)
            # gallop up from the smallest radii (small boxes are quick to search), then bisect
            i_lo, i_hi = 0 if cand[0] == 0.0 else -1, None  # cand[i_lo]: no target point
            best, steps, timed_out = None, 0, False
            k = 1
            while True:
                if i_hi is None:
                    mid = min(i_lo + k, len(cand) - 1)
                    k *= 2
                elif i_hi - i_lo > 1:
                    mid = (i_lo + i_hi) // 2
                else:
                    break
                box = box_for(veritas, x, splits, w, lo, hi, cand[mid])
                ok, sol = decide(veritas, at, box, strict, deadline - time.perf_counter())
                steps += 1
                if ok is None:
                    timed_out = True
                    break
                if ok:
                    i_hi, best = mid, (cand[mid], sol, box)
                elif mid == len(cand) - 1:
                    break  # the whole domain holds no target point
                else:
                    i_lo = mid
            dt = time.perf_counter() - t0
            rec: dict = {"steps": steps, "seconds": dt, "candidates": len(cand)}
            if best is None:
                rec.update(status="timeout" if timed_out else "infeasible", proved=not timed_out)
            else:
                p = closest(x, best[1], best[2])
                rec.update(
                    status="ok",
                    proved=not timed_out,
                    radius=float(best[0]),
                    distance=float(np.max(np.abs(p - x) * w)),
                    lower=float(cand[i_lo + 1]),  # the optimum is one of the radii
                    x_cf=[float(v) for v in p],
                    output=float(np.asarray(ats[1].eval(p[None])).ravel()[0]),
                )
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
