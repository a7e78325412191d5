"""Volumetric KD-trees over the rectangles, one per class, in flat arrays.

Every node stores the bounding box of the rectangles below it, so the distance from a query
to a node's box is an admissible lower bound for all of them. Leaves hold at most
``leaf_size`` rectangles, contiguous in ``order``. Mixed (unresolved) regions are indexed
under every class, since any class may occur inside them.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np
from numba import njit

from .grid import Grid
from .partition import MIXED, Partition

LEAF_SIZE = 8
SMALL_NODE = 64  # nodes this small split on the widest spread, bigger ones on least overlap


@dataclass(frozen=True, eq=False)
class KDForest:
    """All classes' KD-trees in shared flat arrays.

    Attributes
    ----------
    node_lo, node_hi : ndarray of shape (n_nodes, n_features), float64
        Bounding box of every node (closed; +-inf allowed).
    left, right : ndarray of shape (n_nodes,), int32
        Children, ``-1`` at leaves.
    start, end : ndarray of shape (n_nodes,), int64
        A node's rectangles are ``order[start:end]``.
    order : ndarray of shape (n_entries,), int64
        Rectangle ids, leaf by leaf.
    class_root : ndarray of shape (n_classes,), int32
        Root node of each class's tree, ``-1`` if the class never occurs.
    """

    node_lo: np.ndarray
    node_hi: np.ndarray
    left: np.ndarray
    right: np.ndarray
    start: np.ndarray
    end: np.ndarray
    order: np.ndarray
    class_root: np.ndarray

    @property
    def n_nodes(self) -> int:
        return int(self.left.shape[0])


@njit(cache=True, nogil=True)
def _center_clip(lo, hi, off, cell_lower, cell_upper):
    """Per feature, the range centres are clipped to: one unit beyond the finite extent of
    the rectangles' ends (two arrays of shape (m,)), so infinite rectangles get centres."""
    n, m = lo.shape
    fmin = np.empty(m)
    fmax = np.empty(m)
    for f in range(m):
        a = np.inf
        b = -np.inf
        for r in range(n):
            for v in (cell_lower[off[f] + lo[r, f]], cell_upper[off[f] + hi[r, f]]):
                if np.isfinite(v):
                    a = min(a, v)
                    b = max(b, v)
        fmin[f] = (a if a < np.inf else 0.0) - 1.0
        fmax[f] = (b if b > -np.inf else 0.0) + 1.0
    return fmin, fmax


@njit(inline="always")
def _center(lo, hi, off, cell_lower, cell_upper, fmin, fmax, r, f):
    """Centre of rectangle ``r`` along feature ``f`` (its ends clipped to ``fmin..fmax``)."""
    a = min(max(cell_lower[off[f] + lo[r, f]], fmin[f]), fmax[f])
    b = min(max(cell_upper[off[f] + hi[r, f]], fmin[f]), fmax[f])
    return (a + b) / 2.0


@njit(cache=True, nogil=True)
def _build(lo_cell, hi_cell, off, cell_lower, cell_upper, fmin, fmax, ids, leaf_size, small,
           node_lo, node_hi, left, right, start, end, order, n0, o0):
    """Build one tree over rectangles ``ids``; nodes from ``n0``, entries from ``o0``.

    A rectangle's real bounds are read through the grid (``cell_lower[off[f] +
    lo_cell[r, f]]``, ``cell_upper[off[f] + hi_cell[r, f]]``), and its centres computed
    when needed (:func:`_center`), rather than from float64 copies of every rectangle:
    those three (n, m) arrays and their temporaries were the build's peak memory (Adult GB
    300x4, 250k rectangles: the build grew by 656 MB with them, 225 MB without; the same
    trees, bit for bit)."""
    n = ids.shape[0]
    m = lo_cell.shape[1]
    for i in range(n):
        order[o0 + i] = ids[i]
    st_node = np.empty(128, dtype=np.int64)
    st_node[0] = n0
    start[n0] = o0
    end[n0] = o0 + n
    sp = 1
    nxt = n0 + 1
    while sp > 0:
        sp -= 1
        nd = st_node[sp]
        s = start[nd]
        e = end[nd]
        for f in range(m):
            lo = np.inf
            hi = -np.inf
            for i in range(s, e):
                r = order[i]
                v = cell_lower[off[f] + lo_cell[r, f]]
                if v < lo:
                    lo = v
                v = cell_upper[off[f] + hi_cell[r, f]]
                if v > hi:
                    hi = v
            node_lo[nd, f] = lo
            node_hi[nd, f] = hi
        left[nd] = -1
        right[nd] = -1
        if e - s <= leaf_size:
            continue
        # Split at the median centre along the dimension whose two halves' bounding boxes
        # overlap least (relative to the node's extent there): overlapping children are
        # what makes a volumetric tree visit both sides. Ties: the widest spread of centres.
        # Large nodes choose the dimension on an evenly strided sample of their rectangles;
        # small ones (<= ``small`` rectangles) simply take the widest spread.
        cnt = e - s
        step = max(1, cnt // 1024)
        ns = (cnt + step - 1) // step
        keys = np.empty(ns)
        half = ns // 2
        best_f = -1
        best_o = np.inf
        best_s = -1.0
        for f in range(m):
            for i in range(ns):
                keys[i] = _center(lo_cell, hi_cell, off, cell_lower, cell_upper, fmin, fmax,
                                  order[s + i * step], f)
            spread = keys.max() - keys.min()
            if spread <= 0.0:
                continue
            if cnt <= small:  # small nodes: the widest spread (the overlap test costs more there)
                if spread > best_s:
                    best_s = spread
                    best_f = f
                continue
            # Overlap of the halves below / above the median centre (ties sit on both
            # sides, which only makes the estimate pessimistic).
            med_f = np.partition(keys.copy(), half)[half]
            lhi = -np.inf
            rlo = np.inf
            for i in range(ns):
                r = order[s + i * step]
                if keys[i] <= med_f:
                    lhi = max(lhi, cell_upper[off[f] + hi_cell[r, f]])
                if keys[i] >= med_f:
                    rlo = min(rlo, cell_lower[off[f] + lo_cell[r, f]])
            ext = node_hi[nd, f] - node_lo[nd, f]
            ov = max(0.0, lhi - rlo)
            ov = ov / ext if np.isfinite(ext) and ext > 0 else (0.0 if ov == 0.0 else 1.0)
            if ov < best_o - 1e-12 or (abs(ov - best_o) <= 1e-12 and spread > best_s):
                best_o = ov
                best_s = spread
                best_f = f
        if best_f < 0:
            best_f = 0
        # Median split in linear time: smaller centres left, larger right, ties filling
        # the left half first (no full sort needed).
        full = np.empty(cnt)
        for i in range(cnt):
            full[i] = _center(lo_cell, hi_cell, off, cell_lower, cell_upper, fmin, fmax,
                              order[s + i], best_f)
        half_n = cnt // 2
        med = np.partition(full, half_n)[half_n]
        seg = order[s:e].copy()
        n_less = 0
        for i in range(cnt):
            if full[i] < med:
                n_less += 1
        li = 0
        ri = half_n
        eq_left = half_n - n_less
        for i in range(cnt):
            v = full[i]
            if v < med or (v == med and eq_left > 0):
                if v == med:
                    eq_left -= 1
                order[s + li] = seg[i]
                li += 1
            else:
                order[s + ri] = seg[i]
                ri += 1
        mid = s + (e - s) // 2
        lc = nxt
        rc = nxt + 1
        nxt += 2
        left[nd] = lc
        right[nd] = rc
        start[lc] = s
        end[lc] = mid
        start[rc] = mid
        end[rc] = e
        if sp + 2 > st_node.shape[0]:
            tmp = np.empty(2 * st_node.shape[0], dtype=np.int64)
            tmp[:sp] = st_node[:sp]
            st_node = tmp
        st_node[sp] = lc
        st_node[sp + 1] = rc
        sp += 2
    return nxt


def _n_nodes(n: int, leaf_size: int) -> int:
    """Nodes of a tree over ``n`` entries (``n >= 1``) whose nodes of more than
    ``leaf_size`` entries split at the middle, as :func:`_build` does."""
    memo: dict[int, int] = {}

    def count(k: int) -> int:
        if k <= leaf_size:
            return 1
        if k not in memo:
            memo[k] = 1 + count(k // 2) + count(k - k // 2)
        return memo[k]

    return count(n)


def build_index(
    part: Partition,
    grid: Grid,
    n_classes: int,
    leaf_size: int = LEAF_SIZE,
    n_jobs: int = 1,
    progress: Callable[[float], None] | None = None,
) -> KDForest:
    """One volumetric KD-tree per class over ``part``'s rectangles (``n_jobs`` threads).

    ``progress``, when given, is called in the calling thread with the share of the
    entries indexed (a float in (0, 1]) each time a class's tree is done.
    """
    m = part.lo.shape[1]
    off = np.ascontiguousarray(grid.cell_offsets[:-1], dtype=np.int64)
    cells = (part.lo, part.hi, off, grid.cell_lower, grid.cell_upper)
    fmin, fmax = _center_clip(*cells)
    mixed = np.flatnonzero(part.labels == MIXED)
    groups = [np.concatenate([np.flatnonzero(part.labels == k), mixed]) for k in range(n_classes)]
    # Every class's tree is built in place in the shared arrays (its nodes and entries
    # after the previous classes'), so no per-class copy is ever concatenated: its node
    # count is known in advance, since a node splits at the middle of its entries.
    sizes = [_n_nodes(len(g), leaf_size) if g.size else 0 for g in groups]
    n_nodes, n_entries = sum(sizes), sum(len(g) for g in groups)
    arrays = (np.empty((n_nodes, m)), np.empty((n_nodes, m)), np.empty(n_nodes, dtype=np.int32),
              np.empty(n_nodes, dtype=np.int32), np.empty(n_nodes, dtype=np.int64),
              np.empty(n_nodes, dtype=np.int64), np.empty(n_entries, dtype=np.int64))
    node0 = np.cumsum([0, *sizes])
    entry0 = np.cumsum([0, *(len(g) for g in groups)])
    class_root = np.array([node0[k] if g.size else -1 for k, g in enumerate(groups)],
                          dtype=np.int32)

    def one(k: int) -> None:
        end = _build(*cells, fmin, fmax, groups[k].astype(np.int64), leaf_size, SMALL_NODE, *arrays,
                     int(node0[k]), int(entry0[k]))
        assert end == node0[k + 1], "KD-tree node count"

    # The class trees are independent and _build releases the GIL: build them in parallel.
    with ThreadPoolExecutor(max_workers=max(1, min(n_jobs, n_classes))) as pool:
        todo = {pool.submit(one, k): len(g) for k, g in enumerate(groups) if g.size}
        done = 0
        for fut in as_completed(todo):
            fut.result()
            done += todo[fut]
            if progress is not None:
                progress(done / max(n_entries, 1))
    node_lo, node_hi, left, right, start, end, order = arrays
    return KDForest(node_lo=node_lo, node_hi=node_hi, left=left, right=right, start=start,
                    end=end, order=order, class_root=class_root)
