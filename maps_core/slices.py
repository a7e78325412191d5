"""Two-feature slices of a map through an instance: what the explorer page draws.

A slice fixes every feature of ``x`` but two, ``a`` (horizontal) and ``b`` (vertical), and
labels a ``height x width`` raster of their values. Pixel ``(r, c)`` stands for the point
with

* ``a = a_lo + (c + 0.5) * (a_hi - a_lo) / width``,
* ``b = b_hi - (r + 0.5) * (b_hi - b_lo) / height`` (row 0 at the top),

each rounded to the nearest integer (half to even, ``numpy.round``) on integral features,
and everything else as in ``x``.
Its label comes from the maps, not from sampling the model: the map is constant on every
cell of the threshold grid, so each distinct (cell of ``a``, cell of ``b``) pair the raster
meets is labelled once, by its certified rectangle or, inside a mixed region, by the exact
decision the search uses (:func:`maps_core.query.locate`), and the label is spread over its
pixels. The partition box of every pixel is returned too, so boundaries between boxes can
be drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .exceptions import InvalidQueryError
from .query import locate, locate_rect

if TYPE_CHECKING:
    from .maps import CounterfactualMaps

#: Largest raster side accepted (pixels).
MAX_SIDE = 2048

#: Representative points labelled at once (one per cell pair the raster meets).
_BLOCK = 65536


@dataclass(frozen=True)
class MapSlice:
    """A labelled raster of a two-feature slice (see the module docs).

    Attributes
    ----------
    features : tuple of int
        Column indices of the horizontal and the vertical feature.
    extent : tuple of float
        ``(a_lo, a_hi, b_lo, b_hi)``: the value ranges the raster spans.
    a_values : ndarray of shape (width,)
        Value of feature ``a`` at each column's pixel centres.
    b_values : ndarray of shape (height,)
        Value of feature ``b`` at each row's pixel centres (row 0 at the top).
    labels : ndarray of shape (height, width), int64
        Class index of every pixel.
    boxes : ndarray of shape (height, width), int64
        Id of the partition box (certified rectangle or mixed region) holding every pixel.
    """

    features: tuple[int, int]
    extent: tuple[float, float, float, float]
    a_values: np.ndarray
    b_values: np.ndarray
    labels: np.ndarray
    boxes: np.ndarray

    def pixel_of(self, a: float, b: float) -> tuple[float, float]:
        """Fractional (column, row) of the point ``(a, b)`` in raster coordinates."""
        a_lo, a_hi, b_lo, b_hi = self.extent
        w, h = self.a_values.shape[0], self.b_values.shape[0]
        col = (a - a_lo) / (a_hi - a_lo) * w if a_hi > a_lo else w / 2
        row = (b_hi - b) / (b_hi - b_lo) * h if b_hi > b_lo else h / 2
        return col, row


#: How far a slice's range may reach beyond an integral feature's domain: the pixels there
#: round to the end values (the bands of 0 and 1 of a binary feature are equally wide).
_INTEGRAL_SLACK = 0.5


def axis_extent(maps: CounterfactualMaps, f: int, value: float) -> tuple[float, float]:
    """The range feature ``f`` spans in a slice: its legal domain when finite (on an integer
    or binary feature, half a unit more on each side, so that every value, the end ones
    too, gets a band of the same width with the value at its centre); otherwise the span
    of its thresholds and ``value``, padded by 10% on each unbounded side."""
    g = maps.grid
    lo, hi = float(g.dom_lower[f]), float(g.dom_upper[f])
    if np.isfinite(lo) and np.isfinite(hi):
        if g.integral[f]:
            return float(np.ceil(lo)) - _INTEGRAL_SLACK, float(np.floor(hi)) + _INTEGRAL_SLACK
        return lo, hi
    pts = np.concatenate([g.thresholds(f), [value], [v for v in (lo, hi) if np.isfinite(v)]])
    span = float(pts.max() - pts.min()) or max(1.0, abs(value))
    a = lo if np.isfinite(lo) else float(pts.min()) - 0.1 * span
    b = hi if np.isfinite(hi) else float(pts.max()) + 0.1 * span
    return a, b


def _axis_values(lo: float, hi: float, n: int, integral: bool, descending: bool,
                 legal: tuple[float, float]) -> np.ndarray:
    # Evaluated in the documented order, operation for operation, so that a client who
    # recomputes a pixel's centre from the extent gets the same float64 (a centre within an
    # ulp of a threshold would otherwise land on the other side of it).
    step = (np.arange(n) + 0.5) * (hi - lo) / n
    v = hi - step if descending else lo + step
    if integral:
        # np.round: half to even, as documented. The range holds a legal integer (checked),
        # so the clip keeps rounded centres inside the range and the domain both.
        v = np.clip(np.round(v), max(np.ceil(lo), np.ceil(legal[0])),
                    min(np.floor(hi), np.floor(legal[1])))
    return v


def map_slice(maps: CounterfactualMaps, x: np.ndarray, a: int, b: int, width: int,
              height: int, a_range: tuple[float, float] | None = None,
              b_range: tuple[float, float] | None = None) -> MapSlice:
    """Label the ``height x width`` raster of the slice of ``maps`` through ``x`` along
    features ``a`` and ``b`` (column indices).

    Parameters
    ----------
    maps : CounterfactualMaps
    x : ndarray of shape (n_features,)
        A legal instance (checked).
    a, b : int
        Distinct features, neither a column of a one-hot group (its values are tied to the
        group's other columns).
    width, height : int
        Raster size, 1 to :data:`MAX_SIDE` pixels each.
    a_range, b_range : (float, float), optional
        Value range to show along ``a`` (``b``), ``lo < hi``, inside the legal domain (on
        an integral feature, up to half a unit beyond it, and holding a legal integer).
        Default: :func:`axis_extent`.

    Raises
    ------
    InvalidQueryError
        Bad features or sizes, or an illegal ``x``.
    """
    names = maps.feature_names
    X = maps._as_matrix(x)
    m = X.shape[1]
    for f, field in ((a, "features"), (b, "features")):
        if not 0 <= f < m:
            raise InvalidQueryError(f"no feature at column {f}", field)
    if a == b:
        raise InvalidQueryError(f"the two features must differ (both are {names[a]!r})", "features")
    for f in (a, b):
        grp = maps.schema[f].group
        if grp is not None:
            raise InvalidQueryError(f"feature {names[f]!r} is a column of the one-hot group "
                                    f"{grp!r}; a slice takes ungrouped features", "features")
    for v, field in ((width, "width"), (height, "height")):
        if not 1 <= v <= MAX_SIDE:
            raise InvalidQueryError(f"{field} must be 1 to {MAX_SIDE} pixels, got {v}", field)
    integral = maps.grid.integral
    a_lo, a_hi = _range(maps, a, float(X[0, a]), a_range, "a_range")
    b_lo, b_hi = _range(maps, b, float(X[0, b]), b_range, "b_range")
    g = maps.grid
    legal = {f: (float(g.dom_lower[f]), float(g.dom_upper[f])) for f in (a, b)}
    for f, lo, hi, n, field, given in ((a, a_lo, a_hi, width, "a_range", a_range),
                                       (b, b_lo, b_hi, height, "b_range", b_range)):
        # the pixel centres lo + (i + 0.5) * (hi - lo) / n: the product must not overflow
        # (from 1.8e308 / n up, it did: centres at inf, outside the range, labelled there)
        if not np.isfinite((hi - lo) * n):
            what = (f"{field} [{lo}, {hi}]" if given is not None else
                    f"the default range of {names[f]!r} around the instance's value "
                    f"{float(X[0, f]):g}, [{lo:g}, {hi:g}],")
            raise InvalidQueryError(f"{what} is too wide for {n} pixels: (hi - lo) x {n} "
                                    f"must be finite; give a narrower {field}", field)
    for f, lo, hi, field in ((a, a_lo, a_hi, "a_range"), (b, b_lo, b_hi, "b_range")):
        if integral[f] and (max(np.ceil(lo), np.ceil(legal[f][0]))
                            > min(np.floor(hi), np.floor(legal[f][1]))):
            raise InvalidQueryError(f"{field} [{lo}, {hi}] holds no legal integer value of "
                                    f"{names[f]!r}", field)
    av = _axis_values(a_lo, a_hi, width, bool(integral[a]), False, legal[a])
    bv = _axis_values(b_lo, b_hi, height, bool(integral[b]), True, legal[b])
    # One representative per distinct cell along each axis: the map is constant on cells.
    ca = _cells_along(maps, X[0], a, av)
    cb = _cells_along(maps, X[0], b, bv)
    ua, ia, inv_a = np.unique(ca, return_index=True, return_inverse=True)
    ub, ib, inv_b = np.unique(cb, return_index=True, return_inverse=True)
    lab = np.empty((ub.size, ua.size), dtype=np.int64)
    box = np.empty((ub.size, ua.size), dtype=np.int64)
    # A model with thousands of thresholds per feature can meet a cell per pixel: the
    # representatives go through in blocks of rows so memory stays ~_BLOCK x n_features.
    step = max(1, _BLOCK // ua.size)
    for r0 in range(0, ub.size, step):
        rb = bv[ib[r0:r0 + step]]
        P = np.repeat(X, ua.size * rb.size, axis=0)
        P[:, a] = np.tile(av[ia], rb.size)
        P[:, b] = np.repeat(rb, ua.size)
        rid = locate_rect(maps.engine, P)
        box[r0:r0 + rb.size] = rid.reshape(rb.size, ua.size)
        lab[r0:r0 + rb.size] = locate(maps.engine, P, rid).reshape(rb.size, ua.size)
    rows, cols = inv_b.reshape(-1)[:, None], inv_a.reshape(-1)[None, :]
    return MapSlice(features=(a, b), extent=(a_lo, a_hi, b_lo, b_hi), a_values=av, b_values=bv,
                    labels=lab[rows, cols].astype(np.int64), boxes=box[rows, cols].astype(np.int64))


def _range(maps: CounterfactualMaps, f: int, value: float, given: tuple[float, float] | None,
           field: str) -> tuple[float, float]:
    if given is None:
        return axis_extent(maps, f, value)
    lo, hi = float(given[0]), float(given[1])
    d_lo, d_hi = float(maps.grid.dom_lower[f]), float(maps.grid.dom_upper[f])
    # hi - lo must be finite too: pixel centres are lo + (i + 0.5) * (hi - lo) / n
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi and np.isfinite(hi - lo)):
        raise InvalidQueryError(f"{field} must be two finite numbers lo < hi, hi - lo finite, "
                                f"got {given}", field)
    if maps.grid.integral[f]:  # pixels beyond the domain round to its end values
        d_lo, d_hi = d_lo - _INTEGRAL_SLACK, d_hi + _INTEGRAL_SLACK
    if lo < d_lo or hi > d_hi:
        raise InvalidQueryError(f"{field} [{lo}, {hi}] leaves the legal range [{d_lo}, {d_hi}] "
                                f"of {maps.feature_names[f]!r}", field)
    return lo, hi


def _cells_along(maps: CounterfactualMaps, x: np.ndarray, f: int, values: np.ndarray) -> np.ndarray:
    """Cell index of feature ``f`` at each of ``values`` (shape (n,)), the model's view."""
    A = np.repeat(x[None, :], values.shape[0], axis=0)
    A[:, f] = values
    return maps.grid.cells_of(A)[:, f]


__all__ = ["MAX_SIDE", "MapSlice", "axis_extent", "map_slice"]
