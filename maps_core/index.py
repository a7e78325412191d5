"""Volumetric KD-trees over the rectangles, one per class, in flat arrays.

Every node stores the bounding box of the rectangles below it, so the distance from a query
to a node's box is an admissible lower bound for all of them. Leaves hold at most
``leaf_size`` rectangles, contiguous in ``order``. Mixed (unresolved) regions are indexed
under every class, since any class may occur inside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .grid import Grid
from .partition import MIXED, Partition

LEAF_SIZE = 8


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


@njit(cache=True)
def _build(lower, upper, centers, ids, leaf_size, node_lo, node_hi, left, right, start, end,
           order, n0, o0):
    """Build one tree over rectangles ``ids``; nodes from ``n0``, entries from ``o0``."""
    n = ids.shape[0]
    m = lower.shape[1]
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
                if lower[r, f] < lo:
                    lo = lower[r, f]
                if upper[r, f] > hi:
                    hi = upper[r, f]
            node_lo[nd, f] = lo
            node_hi[nd, f] = hi
        left[nd] = -1
        right[nd] = -1
        if e - s <= leaf_size:
            continue
        # Split along the dimension where rectangle centres spread most.
        best_f = 0
        best_s = -1.0
        for f in range(m):
            lo = np.inf
            hi = -np.inf
            for i in range(s, e):
                v = centers[order[i], f]
                lo = min(lo, v)
                hi = max(hi, v)
            if hi - lo > best_s:
                best_s = hi - lo
                best_f = f
        keys = np.empty(e - s)
        for i in range(s, e):
            keys[i - s] = centers[order[i], best_f]
        perm = np.argsort(keys, kind="mergesort")
        seg = order[s:e].copy()
        for i in range(e - s):
            order[s + i] = seg[perm[i]]
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


def rect_bounds(part: Partition, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Real-valued bounds of every rectangle, two arrays of shape (n, n_features)."""
    off = grid.cell_offsets[:-1]
    lower = grid.cell_lower[part.lo + off]
    upper = grid.cell_upper[part.hi + off]
    return lower, upper


def build_index(part: Partition, grid: Grid, n_classes: int, leaf_size: int = LEAF_SIZE) -> KDForest:
    """One volumetric KD-tree per class over ``part``'s rectangles."""
    lower, upper = rect_bounds(part, grid)
    m = lower.shape[1]
    # Centres of infinite rectangles: clip to just beyond the finite extent.
    finite = np.concatenate([lower, upper])
    finite = np.where(np.isfinite(finite), finite, np.nan)
    fmin = np.nan_to_num(np.nanmin(finite, axis=0, initial=np.inf), posinf=0.0) - 1.0
    fmax = np.nan_to_num(np.nanmax(finite, axis=0, initial=-np.inf), neginf=0.0) + 1.0
    centers = (np.clip(lower, fmin, fmax) + np.clip(upper, fmin, fmax)) / 2.0
    mixed = np.flatnonzero(part.labels == MIXED)
    groups = [np.concatenate([np.flatnonzero(part.labels == k), mixed]) for k in range(n_classes)]
    cap = sum(2 * (len(g) // leaf_size + 1) + 1 for g in groups) * 2 + 4
    node_lo = np.empty((cap, m))
    node_hi = np.empty((cap, m))
    left = np.empty(cap, dtype=np.int32)
    right = np.empty(cap, dtype=np.int32)
    start = np.empty(cap, dtype=np.int64)
    end = np.empty(cap, dtype=np.int64)
    order = np.empty(sum(len(g) for g in groups), dtype=np.int64)
    class_root = np.full(n_classes, -1, dtype=np.int32)
    n_nodes = 0
    o = 0
    for k, ids in enumerate(groups):
        if ids.size == 0:
            continue
        class_root[k] = n_nodes
        n_nodes = int(
            _build(lower, upper, centers, ids.astype(np.int64), leaf_size, node_lo, node_hi,
                   left, right, start, end, order, n_nodes, o)
        )
        o += ids.size
    return KDForest(
        node_lo=node_lo[:n_nodes].copy(),
        node_hi=node_hi[:n_nodes].copy(),
        left=left[:n_nodes].copy(),
        right=right[:n_nodes].copy(),
        start=start[:n_nodes].copy(),
        end=end[:n_nodes].copy(),
        order=order,
        class_root=class_root,
    )
