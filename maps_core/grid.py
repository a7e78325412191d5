"""The threshold grid: canonical thresholds per feature on the legal domain.

Every split ``x[f] <= t`` of the ensemble becomes a *cut index*: the cells of feature
``f`` are numbered ``0..K_f`` by the canonical thresholds ``s_0 < ... < s_{K_f-1}``,
cell ``j`` being ``s_{j-1} < x <= s_j``, and a node sends cell ``j`` left iff
``j <= cut``. Canonicalisation is where the feature domain pays off:

* continuous: ``t`` becomes the largest value of the model's view of an input that the
  node sends left (:func:`maps_core.splits.canonical_thresholds`: for scikit-learn's
  ``float32(x) <= t`` the largest float32 ``<= t``), so thresholds that no input the
  model can see separates coincide. Cells are located by that view, but their bounds are
  stated on the real line (:func:`maps_core.splits.real_boundaries`: the point where the
  decision changes, closed on the side that owns it), so distances and regions are exact
  for the real inputs clients send;
* integer / binary / categorical: ``t`` becomes ``floor(t)``, so ``1.5`` and ``1.9`` are one
  cut, and a binary feature keeps at most one;
* thresholds at or beyond the domain's bounds disappear: the node always goes one way
  (cut ``-1``: always right; cut ``K_f``: always left).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from .ensemble import FlatEnsemble
from .exceptions import InvalidQueryError, SchemaError
from .schema import FeatureSchema
from .splits import (
    FLOAT32_MAX,
    FLOAT32_OVERFLOW,
    canonical_thresholds,
    model_view,
    next_integer,
    real_boundaries,
    rule_flags,
)


@njit(cache=True, nogil=True)
def cells_kernel(A, integral, thr_values, thr_offsets, view32):
    """Cell index of every entry of ``A`` (shape (n, m)): the number of its feature's
    thresholds below it (continuous values in the model's view, float32 when ``view32``)."""
    n, m = A.shape
    out = np.empty((n, m), dtype=np.int32)
    for i in range(n):
        for f in range(m):
            v = A[i, f] if integral[f] else model_view(A[i, f], view32)
            lo = thr_offsets[f]
            hi = thr_offsets[f + 1]
            base = lo
            while lo < hi:  # first threshold >= v (numpy's searchsorted, side="left")
                mid = (lo + hi) >> 1
                if thr_values[mid] < v:
                    lo = mid + 1
                else:
                    hi = mid
            out[i, f] = lo - base
    return out


@njit(cache=True, nogil=True)
def _violation(A, dom_lower, dom_upper, integral, view32):
    """First illegal entry of ``A`` (shape (n, m)) as (kind, row, column), kind 0 when
    every entry is legal. Kinds by precedence (the first of the highest kind anywhere
    wins, entries in row-major order): 1 not finite, 2 beyond the float32 range of a
    model that reads float32 (``view32``; the library itself refuses such a value),
    3 below the domain, 4 above it, 5 fractional on an integral feature. One pass instead
    of a dozen array operations (a single query paid ~8 us for them)."""
    n, m = A.shape
    best = 6
    bi = 0
    bj = 0
    for i in range(n):
        for f in range(m):
            v = A[i, f]
            if not np.isfinite(v):
                kind = 1
            elif view32 and abs(v) >= FLOAT32_OVERFLOW:
                kind = 2
            elif v < dom_lower[f]:
                kind = 3
            elif v > dom_upper[f]:
                kind = 4
            elif integral[f] and v != np.floor(v):  # math.floor: an int64 in numba, overflows
                kind = 5
            else:
                continue
            if kind < best:
                best, bi, bj = kind, i, f
                if kind == 1:
                    return best, bi, bj
    return (0 if best == 6 else best), bi, bj


@dataclass(frozen=True, eq=False)
class Grid:
    """Canonical thresholds, cell bounds and the ensemble's nodes as cut indices.

    Attributes
    ----------
    thr_offsets : ndarray of shape (n_features + 1,), int64
        Feature ``f``'s thresholds are ``thr_values[thr_offsets[f]:thr_offsets[f+1]]``.
    thr_values : ndarray of shape (n_thresholds,), float64
        Canonical thresholds, ascending per feature.
    cell_offsets : ndarray of shape (n_features + 1,), int64
        Feature ``f``'s cells are ``cell_offsets[f] .. cell_offsets[f+1]-1``
        (``K_f + 1`` cells).
    cell_lower, cell_upper : ndarray of shape (n_cells,), float64
        Real bounds of every cell on the legal domain (+-inf when unbounded).
    cell_lower_closed, cell_upper_closed : ndarray of shape (n_cells,), bool
    integral : ndarray of shape (n_features,), bool
        Features whose legal values are integers.
    dom_lower, dom_upper : ndarray of shape (n_features,), float64
    node_cut : ndarray of shape (n_nodes,), int32
        Cut index of every ensemble node (see module docs); 0 at leaves.
    raw_thresholds : int
        Distinct (feature, threshold) pairs of the model before canonicalisation.
    view32 : bool
        Whether the model sees continuous inputs as float32 (its split rule's view, see
        :mod:`maps_core.splits`): cells are located by that view. Cell bounds are real
        boundaries, with either end open or closed.
    """

    thr_offsets: np.ndarray
    thr_values: np.ndarray
    cell_offsets: np.ndarray
    cell_lower: np.ndarray
    cell_upper: np.ndarray
    cell_lower_closed: np.ndarray
    cell_upper_closed: np.ndarray
    integral: np.ndarray
    dom_lower: np.ndarray
    dom_upper: np.ndarray
    node_cut: np.ndarray
    raw_thresholds: int
    view32: bool = True

    @cached_property
    def magnitudes(self) -> np.ndarray:
        """Per feature, the largest magnitude of its finite cell bounds (0 when it has
        none), shape (n_features,): with ``x``, the scale of the moves a query weighs."""
        ends = np.maximum(np.abs(np.where(np.isfinite(self.cell_lower), self.cell_lower, 0.0)),
                          np.abs(np.where(np.isfinite(self.cell_upper), self.cell_upper, 0.0)))
        out = np.zeros(self.cell_offsets.shape[0] - 1)
        has = np.diff(self.cell_offsets) > 0
        out[has] = np.maximum.reduceat(ends, self.cell_offsets[:-1][has])
        return out

    @property
    def n_features(self) -> int:
        return int(self.integral.shape[0])

    @property
    def n_thresholds(self) -> np.ndarray:
        """Number of canonical thresholds per feature, shape (n_features,)."""
        return np.diff(self.thr_offsets)

    @property
    def n_cells(self) -> np.ndarray:
        """Number of cells per feature, shape (n_features,)."""
        return self.n_thresholds + 1

    def thresholds(self, f: int) -> np.ndarray:
        return self.thr_values[self.thr_offsets[f] : self.thr_offsets[f + 1]]

    @classmethod
    def from_ensemble(cls, ens: FlatEnsemble, schema: FeatureSchema) -> Grid:
        m = ens.n_features
        dom_lo, dom_hi = schema.domains()
        schema.default_weights()  # a range 1/range cannot weigh: refused at build, not per query
        integral = schema.integral_mask()
        feat = ens.node_feature
        view32, _ = rule_flags(ens.split_rule)
        if view32:
            beyond = np.flatnonzero((dom_lo >= FLOAT32_OVERFLOW) | (dom_hi <= -FLOAT32_OVERFLOW))
            if beyond.size:  # every value there reads as an infinity in float32
                j = int(beyond[0])
                raise SchemaError(
                    f"feature {schema.features[j].name!r}: its bounds admit no value the model "
                    f"can read (it reads features as float32, whose range ends at "
                    f"+-{FLOAT32_MAX:.8g})", feature=j)
        node_cut = np.zeros(ens.n_nodes, dtype=np.int32)
        thr_parts, cl, cu, clc, cuc = [], [], [], [], []
        raw = 0
        for f in range(m):
            nodes = np.flatnonzero(feat == f)
            t = ens.node_threshold[nodes]
            raw += np.unique(t).size
            integral_f = bool(integral[f])
            v = canonical_thresholds(t, ens.split_rule, integral_f)
            lo, hi = dom_lo[f], dom_hi[f]
            # Where each cut splits the real line, and which side owns that point.
            if integral_f:
                b, left_owns = v, np.ones(v.shape, dtype=bool)
            else:
                b, left_owns = real_boundaries(v, ens.split_rule)
            # Every legal x (lo <= x <= hi) goes right of a cut below the domain, left of
            # one above it.
            always_right = (b < lo) | ((b == lo) & ~left_owns)
            always_left = (b > hi) | ((b == hi) & left_owns)
            keep = ~always_right & ~always_left
            cuts, first = np.unique(v[keep], return_index=True)
            b_kept, owns_kept = b[keep][first], left_owns[keep][first]
            K = cuts.size
            c = np.searchsorted(cuts, v).astype(np.int32)
            c[always_right] = -1
            c[always_left] = K
            node_cut[nodes] = c
            thr_parts.append(cuts)
            # Cell j lies between the real boundaries of cuts j-1 and j, within the domain.
            if integral_f:
                lower = np.concatenate([[lo], next_integer(cuts)])  # integers above the cut
                upper = np.concatenate([cuts, [hi]])
                lclosed = np.ones(K + 1, dtype=bool)
                uclosed = np.ones(K + 1, dtype=bool)
            else:
                lower = np.concatenate([[lo], b_kept])
                upper = np.concatenate([b_kept, [hi]])
                lclosed = np.concatenate([[True], ~owns_kept])
                uclosed = np.concatenate([owns_kept, [True]])
            lclosed[0] = math.isfinite(lo)
            uclosed[-1] = math.isfinite(hi)
            cl.append(lower)
            cu.append(upper)
            clc.append(lclosed)
            cuc.append(uclosed)
        counts = np.array([p.size for p in thr_parts], dtype=np.int64)
        thr_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        cell_offsets = np.concatenate([[0], np.cumsum(counts + 1)]).astype(np.int64)
        grid = cls(
            thr_offsets=thr_offsets,
            thr_values=np.concatenate(thr_parts) if m else np.zeros(0),
            cell_offsets=cell_offsets,
            cell_lower=np.concatenate(cl),
            cell_upper=np.concatenate(cu),
            cell_lower_closed=np.concatenate(clc),
            cell_upper_closed=np.concatenate(cuc),
            integral=integral,
            dom_lower=dom_lo,
            dom_upper=dom_hi,
            node_cut=node_cut,
            raw_thresholds=int(raw),
            view32=view32,
        )
        # with the model's thresholds known: a declared weight they make unmeasurable is
        # refused at build, not by every query after
        schema.check_weights(grid.magnitudes)
        return grid

    # -- points <-> cells -----------------------------------------------------------------
    def check_domain(self, A: np.ndarray, names: Sequence[str]) -> None:
        """Raise :class:`InvalidQueryError` naming the first illegal entry of ``A`` (shape
        (n, n_features)): not finite, outside the legal domain, or fractional on an
        integral feature."""
        kind, i, j = _violation(A, self.dom_lower, self.dom_upper, self.integral, self.view32)
        if kind == 0:
            return
        v = A[i, j]
        if kind == 1:
            msg = f"feature {names[j]!r} is {v} (values must be finite)"
        elif kind == 2:
            msg = (f"feature {names[j]!r} = {v} is beyond +-{FLOAT32_MAX:.8g}: the model reads "
                   "features as float32 and refuses it")
        elif kind == 5:
            msg = f"feature {names[j]!r} = {_show(v)} must be an integer"
        else:
            what = "below" if kind == 3 else "above"
            msg = (f"feature {names[j]!r} = {_show(v)} is {what} its legal range "
                   f"[{_show(self.dom_lower[j])}, {_show(self.dom_upper[j])}]")
        raise InvalidQueryError(msg, names[j], row=int(i))

    def cells_of(self, A: np.ndarray) -> np.ndarray:
        """Cell index per feature of every row, shape (n_samples, n_features), int32.

        Uses the model's view of the input (float32 for continuous features of a model
        that casts).
        """
        A = np.ascontiguousarray(A, dtype=np.float64)
        return cells_kernel(A, self.integral, self.thr_values, self.thr_offsets, self.view32)

    def cell_points(self, cells: np.ndarray) -> np.ndarray:
        """A legal point inside each cell vector, shape (n, n_features).

        Picks the upper end when finite (the float64 just below it when it is open), else
        the lower end (the float64 just above it when open), else 0: a real point of the
        cell, which the model therefore sees in that very cell.
        """
        cells = np.atleast_2d(cells)
        out = np.empty(cells.shape, dtype=np.float64)
        for f in range(self.n_features):
            g = cells[:, f] + self.cell_offsets[f]
            lo, hi = self.cell_lower[g], self.cell_upper[g]
            lc, uc = self.cell_lower_closed[g], self.cell_upper_closed[g]
            top = np.where(uc, hi, np.nextafter(hi, -np.inf))
            bottom = np.where(lc, lo, np.nextafter(lo, np.inf))
            out[:, f] = np.where(np.isfinite(hi), top, np.where(np.isfinite(lo), bottom, 0.0))
        return out


def _show(v: float) -> str:
    """A value as a message shows it: whole numbers without ``.0`` (an integer feature's
    5 and bounds [10000, 1000000], not 5.0 and [10000.0, 1000000.0])."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 2.0**53 else repr(v)


__all__ = ["Grid", "cells_kernel"]
