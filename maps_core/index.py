"""Volumetric KD-trees over the rectangles, one per class, in flat arrays.

Every node stores the bounding box of the rectangles below it, so the distance from a query
to a node's box is an admissible lower bound for all of them. Leaves hold at most
``leaf_size`` rectangles, contiguous in ``order``. Mixed (unresolved) regions are indexed
under every class, since any class may occur inside them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
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
def _build(lower, upper, centers, ids, leaf_size, small, node_lo, node_hi, left, right, start,
           end, order, n0, o0):
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
                keys[i] = centers[order[s + i * step], f]
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
                if keys[i] <= med_f and upper[r, f] > lhi:
                    lhi = upper[r, f]
                if keys[i] >= med_f and lower[r, f] < rlo:
                    rlo = lower[r, f]
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
            full[i] = centers[order[s + i], best_f]
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


def rect_bounds(part: Partition, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Real-valued bounds of every rectangle, two arrays of shape (n, n_features)."""
    off = grid.cell_offsets[:-1]
    lower = grid.cell_lower[part.lo + off]
    upper = grid.cell_upper[part.hi + off]
    return lower, upper


def build_index(
    part: Partition, grid: Grid, n_classes: int, leaf_size: int = LEAF_SIZE, n_jobs: int = 1
) -> KDForest:
    """One volumetric KD-tree per class over ``part``'s rectangles (``n_jobs`` threads)."""
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

    def one(ids: np.ndarray) -> tuple[np.ndarray, ...]:
        cap = 2 * (len(ids) // leaf_size + 1) * 2 + 4
        arrays = (np.empty((cap, m)), np.empty((cap, m)), np.empty(cap, dtype=np.int32),
                  np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int64),
                  np.empty(cap, dtype=np.int64), np.empty(len(ids), dtype=np.int64))
        n = int(_build(lower, upper, centers, ids.astype(np.int64), leaf_size, SMALL_NODE, *arrays,
                       0, 0))
        return tuple(a[:n] for a in arrays[:6]) + (arrays[6],)

    # The class trees are independent and _build releases the GIL: build them in parallel.
    with ThreadPoolExecutor(max_workers=max(1, min(n_jobs, n_classes))) as pool:
        trees = list(pool.map(one, [g for g in groups if g.size]))
    class_root = np.full(n_classes, -1, dtype=np.int32)
    parts: list[tuple[np.ndarray, ...]] = []
    n_nodes = 0
    o = 0
    it = iter(trees)
    for k, ids in enumerate(groups):
        if ids.size == 0:
            continue
        lo_k, hi_k, l_k, r_k, s_k, e_k, ord_k = next(it)
        class_root[k] = n_nodes
        parts.append((lo_k, hi_k, np.where(l_k >= 0, l_k + n_nodes, -1).astype(np.int32),
                      np.where(r_k >= 0, r_k + n_nodes, -1).astype(np.int32), s_k + o, e_k + o, ord_k))
        n_nodes += lo_k.shape[0]
        o += ids.size
    if not parts:
        parts.append((np.empty((0, m)), np.empty((0, m)), np.empty(0, dtype=np.int32),
                      np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int64),
                      np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)))
    cols = (np.concatenate(col) for col in zip(*parts, strict=True))
    node_lo, node_hi, left, right, start, end, order = cols
    return KDForest(node_lo=node_lo, node_hi=node_hi, left=left, right=right, start=start,
                    end=end, order=order, class_root=class_root)
