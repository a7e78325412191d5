"""The tests' independent brute force: every cell of a model's threshold grid on the real
line, labelled by the model's own ``predict`` (no maps_core code).

The splits and their rule come from the model's library
(:func:`tests.library_splits.split_values`): per split, the last value sent left in the
view the library compares in. scikit-learn sends x left iff ``float32(x) <= t`` (XGBoost
``float32(x) < t``): with ``s`` the last float32 sent left, float32 rounding to nearest
sends every real x below the midpoint ``b`` of ``s`` and the next float32 left, every one
above it right, and ``b`` itself where its own rounding goes: cells are the intervals
between consecutive ``b``, each end open or closed accordingly. LightGBM and
HistGradientBoosting compare ``x <= t`` in float64: cells are ``(t_j-1, t_j]``. On integral
features the last integer sent left, ``floor(s)``, is the cut, and integer cuts below the
domain or at/above its upper end are dropped: both only remove cells without a legal point,
so the optimum is unchanged.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.library_splits import f32_real_boundary, split_values

F32_MAX = float(np.finfo(np.float32).max)


def next32(v: np.ndarray | float) -> np.ndarray:
    """Smallest float32 above the float32 value ``v`` (as float64)."""
    return np.nextafter(np.asarray(v, dtype=np.float32), np.float32(np.inf)).astype(np.float64)


@dataclass(frozen=True)
class FeatureCells:
    """One feature's cells on the real line, in order (each array of shape (n,))."""

    low: np.ndarray  # lower ends (-inf for the first)
    high: np.ndarray  # upper ends (inf for the last)
    low_open: np.ndarray  # whether the lower end is left out
    high_open: np.ndarray  # whether the upper end is left out
    rep: np.ndarray  # a point strictly inside each cell (an integer on integral features)


def feature_cells(values: np.ndarray, view: str, integral: bool = False,
                  lo: float = -np.inf, hi: float = np.inf) -> FeatureCells:
    """The cells of one feature whose splits send left the sorted distinct ``values`` in
    ``view`` (``"float32"`` or ``"float64"``, from :func:`split_values`), on the domain
    ``lo..hi`` (integers when ``integral``)."""
    c = values
    if view == "float32" and c.size and c[-1] >= F32_MAX:
        # a split whose last float32 sent left is the largest float32 sends every input
        # the library accepts left (scikit-learn refuses any whose float32 overflows)
        c = c[:-1]
    if integral:
        if view == "float32":
            # the last integer sent left: the largest at or below the real boundary that
            # the left side owns (past 2**24 an integer may round to the float32 above)
            b = f32_real_boundary(c)
            with np.errstate(over="ignore"):
                owned = b.astype(np.float32).astype(np.float64) == c
            c = np.floor(b) - ((np.floor(b) == b) & ~owned)
        # x <= t is x <= floor(t) on integers: cells without an integer merge away
        c = np.unique(np.floor(c))
        c = c[(c >= lo) & (c < hi)]
        bnd, left_owns = c, np.ones(c.size, dtype=bool)
        rep = np.concatenate([c, c[-1:] + 1])
    elif view == "float64":
        # x <= t: the cells are (t_j-1, t_j]; points strictly inside label them (a closed
        # end may be read otherwise: LightGBM reads |x| <= 1e-35 as 0)
        bnd, left_owns = c, np.ones(c.size, dtype=bool)
        pad = np.maximum(1.0, np.abs(c[[0, -1]])) if c.size else np.zeros(2)
        mid = np.maximum((c[:-1] + c[1:]) / 2.0, np.nextafter(c[:-1], np.inf))
        rep = np.concatenate([c[:1] - pad[0], mid, c[-1:] + pad[1]])
    else:
        bnd = f32_real_boundary(c)
        left_owns = bnd.astype(np.float32).astype(np.float64) == c
        rep = np.concatenate([c, next32(c[-1:])])  # float32 values lie strictly inside
    return FeatureCells(
        low=np.concatenate([[-np.inf], bnd + 1.0 if integral else bnd]),
        high=np.concatenate([bnd, [np.inf]]),
        low_open=np.concatenate([[False], left_owns & (not integral)]),
        high_open=np.concatenate([~left_owns, [False]]),
        rep=rep if c.size else np.clip([0.0], lo, hi))


@dataclass(frozen=True)
class CellGrid:
    """Every cell of a model's grid, one row each (shapes (n, m); ``label`` (n,))."""

    lo: np.ndarray
    hi: np.ndarray
    lo_open: np.ndarray
    hi_open: np.ndarray
    label: np.ndarray  # index into model.classes_ of model.predict inside the cell


def cell_grid(model: Any, m: int, integral: list[bool] | None = None,
              domains: list[tuple[float, float]] | None = None) -> CellGrid:
    """The product of every feature's cells (:func:`feature_cells`), each labelled by
    ``model.predict`` at a point inside. ``integral`` and ``domains`` per feature (default:
    real, unbounded)."""
    values, view = split_values(model, m)
    cells = [feature_cells(values[f], view, bool(integral[f]) if integral else False,
                           *(domains[f] if domains else (-np.inf, np.inf)))
             for f in range(m)]
    idx = np.array(list(itertools.product(*[range(len(c.rep)) for c in cells])))

    def column(name: str) -> np.ndarray:
        return np.column_stack([getattr(cells[f], name)[idx[:, f]] for f in range(m)])

    pts = column("rep")
    return CellGrid(lo=column("low"), hi=column("high"), lo_open=column("low_open"),
                    hi_open=column("high_open"),
                    label=np.searchsorted(model.classes_, model.predict(pts)))


def brute_force(model: Any, x: np.ndarray, target_index: int, weights: np.ndarray,
                norm: str) -> float:
    """Exact optimum over real inputs: the least weighted ``norm`` distance from ``x``
    (shape (m,)) to a cell the model labels ``model.classes_[target_index]`` (its infimum,
    whichever side owns each end; ``inf`` when no cell is). For queries without
    constraints on real, unbounded features; ``tests.recourse.BruteForce``
    adds integers, one-hot groups and constraints."""
    grid = cell_grid(model, x.shape[0])
    keep = grid.label == target_index
    if not keep.any():
        return np.inf
    delta = np.maximum(0.0, np.maximum(grid.lo[keep] - x, x - grid.hi[keep])) * weights
    d = {"l1": lambda: delta.sum(axis=1), "l2": lambda: np.sqrt((delta**2).sum(axis=1)),
         "linf": lambda: delta.max(axis=1)}[norm]()
    return float(d.min())
