"""Certified extraction of a faithful partition into labeled rectangles.

A *region* is a box of grid cells: per feature an inclusive range ``lo[f]..hi[f]`` of cell
indices (see :mod:`maps_core.grid`). :func:`_refine` turns a region into disjoint labeled
sub-regions whose union is the region, each *certified* single-class:

1. Label one cell of the region (its centre) exactly: candidate class ``a``.
2. Interval bound: for every other class ``b``, ``base_a - base_b + sum over trees of the
   minimum over the tree's reachable leaves of (v_a - v_b)``. If every bound exceeds a
   tolerance far above float64 rounding, the region is certified class ``a``. When it
   fails by not too much, the sweep bound (:func:`maps_core._bounds.sweep_bound`) projects every live tree
   on one feature and sums the projections per feature before taking the minimum.
3. Otherwise sample a few cells and label them exactly. Two labels prove the region
   impure. If all agree, a small depth-first branch-and-bound over sub-boxes tries to
   *prove* purity exactly (the bound is loose because trees share features; proving
   avoids fragmenting a pure region into many pieces) or finds a counter-example cell.
4. Split at the split node that best separates the labelled cells (Gini), chosen among
   the root-most undecided node of every tree: splits land where the label actually
   changes and where the model itself cuts.

Single cells are always decidable: their scores are exact sums. Cells whose best and
second-best scores lie within the tolerance (near-ties, where float summation order could
matter) are labelled by the model itself afterwards, so no float disagreement can leak in.
Sampling only ever proves impurity, never purity.

The driver runs work items in parallel threads (the kernels release the GIL), honours
rectangle and time budgets, and can keep unresolved regions as *mixed* boxes.
"""

from __future__ import annotations

import time
from collections import namedtuple
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, NamedTuple, cast

import numpy as np
from numba import njit

from ._bounds import (
    ALL_CHANGED,
    SWEEP_REACH,
    bounds_workspace,
    interval_bound,
    label_cell,
    spread_sum,
    sweep_bound,
    sweep_workspace,
)
from ._heap import grow
from ._memory import rectangles_within
from .ensemble import FlatEnsemble
from .exceptions import BudgetExceededError, BuildOptionsError
from .grid import Grid

# Label sentinels of the extraction (class labels are >= 0).
MIXED = -1  # an unresolved region (kept when a budget runs out; refined at query time)
NEAR_TIE = -2  # single cell whose scores nearly tie: labelled by the model afterwards
UNDECIDED = -3  # a region not certified yet (never leaves the kernel)

# Counter slots returned by the kernel.
(C_REGIONS, C_BOUND, C_PROVED, C_REFUTED, C_UNKNOWN, C_CELLS, C_TIES, C_PROOF_NODES,
 C_MERGED) = range(9)
COUNTER_NAMES = (
    "regions",
    "certified_by_bound",
    "certified_by_proof",
    "proofs_refuted",
    "proofs_unknown",
    "single_cells",
    "near_ties",
    "proof_nodes",
    "merged",
)

# Pending regions of one _refine call: a depth-first stack. Row i holds a region's cell
# ranges, its live trees act[i, :nact[i]], the node start[i, t] each of them has surely
# reached, the summed leaf values cs[i] of the others (plus the base), and its id in the
# call's split tree (for sibling merging).
RegionStack = namedtuple("RegionStack", ["lo", "hi", "act", "nact", "start", "cs", "id"])
# Certified boxes of one _refine call, with the split-tree id of each.
Emitted = namedtuple("Emitted", ["lo", "hi", "lab", "id"])


# --------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _prove(lo0, hi0, a, budget, tol, act, n_act, cs, nf, ncut, nl, nr, nv, start, cex, ws):
    """Exact purity test by depth-first branch-and-bound.

    Returns (status, nodes): status 1 = every cell of the region is class ``a`` with a
    margin above ``tol``; 0 = counter-example cell written to ``cex``; -1 = budget spent.
    """
    (lb, trange, top_n, stack, mn, mx, slo, shi, tfeat, tmin, rec) = ws
    m = lo0.shape[0]
    sp = 0
    for f in range(m):
        slo[0, f] = lo0[f]
        shi[0, f] = hi0[f]
    sp = 1
    nodes = 0
    while sp > 0:
        if nodes >= budget:
            return -1, nodes
        sp -= 1
        lo = slo[sp].copy()
        hi = shi[sp].copy()
        nodes += 1
        worst = interval_bound(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb,
                               trange, top_n, stack, mn, mx, tfeat, tmin, rec, ALL_CHANGED)
        if worst > tol:
            continue
        # Split at the root-most undecided node of the most uncertain tree.
        bt = -1
        br = -1.0
        for i in range(n_act):
            t = act[i]
            if nf[top_n[t]] >= 0 and trange[t] > br:
                br = trange[t]
                bt = t
        if bt < 0:
            # Single cell (no undecided split): the bound is the exact margin.
            for f in range(m):
                cex[f] = lo[f]
            return 0, nodes
        if sp + 2 > slo.shape[0]:
            return -1, nodes
        f = nf[top_n[bt]]
        cut = ncut[top_n[bt]]
        for g in range(m):
            slo[sp, g] = lo[g]
            shi[sp, g] = hi[g]
            slo[sp + 1, g] = lo[g]
            shi[sp + 1, g] = hi[g]
        shi[sp, f] = cut
        slo[sp + 1, f] = cut + 1
        sp += 2
    return 1, nodes


# -- the steps of _refine ----------------------------------------------------------------
# Each is inlined into _refine (numba IR inlining): the compiled kernel is one function,
# as before the split, so no step pays a call or the reference counting of its arrays.
@njit(cache=True, nogil=True)
def _new_stack(root_lo, root_hi, roots, base):
    """A region stack holding the root region: every tree live from its root."""
    m = root_lo.shape[0]
    T = roots.shape[0]
    c = base.shape[0]
    S = 256
    st = RegionStack(np.empty((S, m), dtype=np.int32), np.empty((S, m), dtype=np.int32),
                     np.empty((S, T), dtype=np.int32), np.empty(S, dtype=np.int32),
                     np.empty((S, T), dtype=np.int32), np.empty((S, c)),
                     np.empty(S, dtype=np.int32))
    st.id[0] = 0
    st.lo[0] = root_lo
    st.hi[0] = root_hi
    for t in range(T):
        st.act[0, t] = t
        st.start[0, t] = roots[t]
    st.nact[0] = T
    st.cs[0] = base
    return st


@njit(cache=True, nogil=True, inline="always")
def _take(st, sp, lo, hi, act, start, cs):
    """Copy the region in row ``sp`` of the stack into the working arrays; returns its
    (id, number of live trees)."""
    n_act = st.nact[sp]
    for f in range(lo.shape[0]):
        lo[f] = st.lo[sp, f]
        hi[f] = st.hi[sp, f]
    for i in range(n_act):
        t = st.act[sp, i]
        act[i] = t
        start[t] = st.start[sp, t]
    for k in range(cs.shape[0]):
        cs[k] = st.cs[sp, k]
    return st.id[sp], n_act


@njit(cache=True, nogil=True, inline="always")
def _centre(lo, hi, cell):
    """The centre cell of ``lo..hi`` into ``cell``; True when the region is one cell."""
    single = True
    for f in range(lo.shape[0]):
        cell[f] = (lo[f] + hi[f]) // 2
        if hi[f] > lo[f]:
            single = False
    return single


@njit(cache=True, nogil=True, inline="always")
def _fold_decided(act, n_act, start, cs, top_n, nf, nv):
    """Trees constant on the region (their root-most undecided node is a leaf) leave the
    live set ``act`` and add their leaf to ``cs``; the others move down to that node.
    Returns the new number of live trees."""
    k_act = 0
    for i in range(n_act):
        t = act[i]
        node = top_n[t]
        if nf[node] >= 0:
            act[k_act] = t
            start[t] = node
            k_act += 1
        else:
            for k in range(cs.shape[0]):
                cs[k] += nv[node, k]
    return k_act


@njit(cache=True, nogil=True, inline="always")
def _sample(lo, hi, a, marg, n_samples, cell, samp, slab, act, n_act, cs, nf, ncut, nl, nr,
            nv, start, tie_high, tol, buf):
    """Label the centre cell and ``n_samples`` random cells of the region (rows of
    ``samp``, labels in ``slab``). Returns (labelled cells, whether two labels or a
    near-tie prove the region impure)."""
    m = lo.shape[0]
    for f in range(m):
        samp[0, f] = cell[f]
    slab[0] = a
    n = 1
    mixed = marg <= tol
    for _ in range(n_samples):
        for f in range(m):
            samp[n, f] = lo[f] + np.random.randint(0, hi[f] - lo[f] + 1)
        lab, mg = label_cell(samp[n], act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high, buf)
        slab[n] = lab
        if lab != a or mg <= tol:
            mixed = True
        n += 1
    return n, mixed


@njit(cache=True, nogil=True, inline="always")
def _split_tree(n, a, c, samp, slab, act, n_act, start, nf, ncut, trange, cnt_l, cnt_r):
    """The live tree whose root-most undecided cut best separates the labelled cells
    ``samp[:n]`` (Gini purity, ties to the larger spread), or with one cell only the most
    uncertain tree; -1 when no tree is live."""
    best_gain = -1.0
    best_t = -1
    best_r = -1.0
    for i in range(n_act):
        t = act[i]
        if n == 1:  # nothing to separate: the most uncertain tree
            if trange[t] > best_r:
                best_t = t
                best_r = trange[t]
            continue
        f = nf[start[t]]
        cut = ncut[start[t]]
        for k in range(c):
            cnt_l[k] = 0.0
            cnt_r[k] = 0.0
        nL = 0.0
        nR = 0.0
        for s in range(n):
            k = slab[s]
            if k >= c:  # a near-tie counts as the candidate's label
                k = a
            if samp[s, f] <= cut:
                cnt_l[k] += 1.0
                nL += 1.0
            else:
                cnt_r[k] += 1.0
                nR += 1.0
        # Gini "purity" sum_k n_k^2 / n per side: larger is better.
        g = 0.0
        for k in range(c):
            if nL > 0:
                g += cnt_l[k] * cnt_l[k] / nL
            if nR > 0:
                g += cnt_r[k] * cnt_r[k] / nR
        if g > best_gain + 1e-12 or (abs(g - best_gain) <= 1e-12 and trange[t] > best_r):
            best_gain = g
            best_t = t
            best_r = trange[t]
    return best_t


@njit(cache=True, nogil=True, inline="always")
def _push_children(st, sp, par, n_ids, rid, lo, hi, act, n_act, start, cs, f, cut):
    """Push the two halves of ``lo..hi`` split at ``cut`` of feature ``f`` (the left half
    on top, popped first), each inheriting the live trees. Returns (stack, sp, par, n_ids)
    (the buffers grow when full)."""
    m = lo.shape[0]
    if sp + 2 > st.lo.shape[0]:
        st = RegionStack(grow(st.lo, sp + 2), grow(st.hi, sp + 2), grow(st.act, sp + 2),
                         grow(st.nact, sp + 2), grow(st.start, sp + 2), grow(st.cs, sp + 2),
                         grow(st.id, sp + 2))
    if n_ids + 2 > par.shape[0]:
        par = grow(par, n_ids + 2)
    for j in range(sp, sp + 2):
        st.id[j] = n_ids
        par[n_ids] = rid
        n_ids += 1
        for g in range(m):
            st.lo[j, g] = lo[g]
            st.hi[j, g] = hi[g]
        st.nact[j] = n_act
        for i in range(n_act):
            t = act[i]
            st.act[j, i] = t
            st.start[j, t] = start[t]
        for k in range(cs.shape[0]):
            st.cs[j, k] = cs[k]
    st.lo[sp, f] = cut + 1  # right child popped second
    st.hi[sp + 1, f] = cut
    return st, sp + 2, par, n_ids


@njit(cache=True, nogil=True, inline="always")
def _emit(out, n_out, lo, hi, label, rid, par, counters):
    """Append a certified box and merge equal-label siblings back into their parent,
    repeatedly. A region's subtree is emitted contiguously (depth first), so two siblings
    that each collapsed to one box are the last two outputs; their union is the parent
    box. Returns (out, n_out)."""
    if n_out >= out.lo.shape[0]:
        out = Emitted(grow(out.lo, n_out + 1), grow(out.hi, n_out + 1),
                      grow(out.lab, n_out + 1), grow(out.id, n_out + 1))
    out.lo[n_out] = lo
    out.hi[n_out] = hi
    out.lab[n_out] = label
    out.id[n_out] = rid
    n_out += 1
    while (n_out >= 2 and out.lab[n_out - 1] >= 0
           and out.lab[n_out - 1] == out.lab[n_out - 2]
           and par[out.id[n_out - 1]] == par[out.id[n_out - 2]]
           and par[out.id[n_out - 1]] >= 0):
        n_out -= 1
        for f in range(lo.shape[0]):
            if out.lo[n_out, f] < out.lo[n_out - 1, f]:
                out.lo[n_out - 1, f] = out.lo[n_out, f]
            if out.hi[n_out, f] > out.hi[n_out - 1, f]:
                out.hi[n_out - 1, f] = out.hi[n_out, f]
        out.id[n_out - 1] = par[out.id[n_out]]
        counters[C_MERGED] += 1
    return out, n_out


@njit(cache=True, nogil=True)
def _refine(root_lo, root_hi, max_regions, prove_budget, n_samples, seed, kern):
    """Refine one region into certified labeled boxes (see module docs).

    ``kern`` is the ensemble's :class:`Kernel`. Every pending region carries what its
    parent learnt about the trees: which trees are still undecided on it (``act``), the
    node each of them has certainly reached (``start``), and the summed leaf values of the
    decided ones (``cs``). Small regions deep in the recursion thus touch only the few
    sub-trees still alive. Per popped region: label the centre cell (candidate ``a``); a
    single cell is decided by its margin; otherwise certify by the interval bound, then
    the sweep bound; failing both, fold the decided trees, optionally sample and prove,
    and split at the chosen tree's root-most undecided cut.

    Returns (out_lo, out_hi, out_label, n_out, left_lo, left_hi, n_left, counters):
    certified boxes and, when ``max_regions`` ran out, the regions still to do.
    """
    nf, ncut, nl, nr, nv, roots, base, tie_high, tol, max_depth_nodes, coff = kern
    np.random.seed(seed)
    m = root_lo.shape[0]
    c = base.shape[0]
    T = roots.shape[0]
    counters = np.zeros(len(COUNTER_NAMES), dtype=np.int64)
    cap = 1024
    out = Emitted(np.empty((cap, m), dtype=np.int32), np.empty((cap, m), dtype=np.int32),
                  np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int32))
    n_out = 0
    # Split tree of this call: parent of every region (root 0), to merge siblings.
    par = np.empty(cap, dtype=np.int32)
    par[0] = -1
    n_ids = 1
    st = _new_stack(root_lo, root_hi, roots, base)
    sp = 1
    # workspaces, allocated once per call
    lb = np.empty(c)
    trange = np.empty(T)
    top_n = np.empty(T, dtype=np.int32)
    stack = np.empty(max_depth_nodes, dtype=np.int32)
    mn = np.empty(c)
    mx = np.empty(c)
    buf = np.empty(c)
    ns = n_samples + 2
    samp = np.empty((ns, m), dtype=np.int32)
    slab = np.empty(ns, dtype=np.int32)
    cell = np.empty(m, dtype=np.int32)
    cex = np.empty(m, dtype=np.int32)
    pw = (np.empty(c), np.empty(T), np.empty(T, dtype=np.int32),
          np.empty(max_depth_nodes, dtype=np.int32), np.empty(c), np.empty(c),
          np.empty((4096, m), dtype=np.int32), np.empty((4096, m), dtype=np.int32),
          *bounds_workspace(nv.shape[0], T, c, max_depth_nodes))
    tfeat, tmin, rec = bounds_workspace(nv.shape[0], T, c, max_depth_nodes)
    sw = sweep_workspace(coff, m, c, max_depth_nodes)
    tm_none = np.zeros(c, dtype=np.bool_)  # the build does not narrow regions
    nlo = np.empty(m, dtype=np.int32)
    nhi = np.empty(m, dtype=np.int32)
    act = np.empty(T, dtype=np.int32)
    start = np.empty(T, dtype=np.int32)
    cs = np.empty(c)
    cnt_l = np.empty(c)
    cnt_r = np.empty(c)
    lo = np.empty(m, dtype=np.int32)
    hi = np.empty(m, dtype=np.int32)
    regions = 0
    while sp > 0 and regions < max_regions:
        sp -= 1
        rid, n_act = _take(st, sp, lo, hi, act, start, cs)
        regions += 1
        # 1. candidate class from the centre cell; a single cell is decided by its margin
        single = _centre(lo, hi, cell)
        a, marg = label_cell(cell, act, n_act, cs, nf, ncut, nl, nr, nv, start, tie_high, buf)
        label = UNDECIDED
        if single:
            counters[C_CELLS] += 1
            label = a if marg > tol else NEAR_TIE
            if label == NEAR_TIE:
                counters[C_TIES] += 1
        else:
            # 2. certify by the interval bound, or failing that by the sweep bound
            worst = interval_bound(lo, hi, a, act, n_act, cs, nf, ncut, nl, nr, nv, start, lb,
                                   trange, top_n, stack, mn, mx, tfeat, tmin, rec, ALL_CHANGED)
            if worst <= tol and worst > -SWEEP_REACH * spread_sum(act, n_act, trange):
                worst, _ = sweep_bound(lo, hi, a, act, n_act, cs, nv, nf, tfeat, top_n, rec,
                                       coff, lb, sw, False, tm_none, tol, nlo, nhi)
            if worst > tol:
                label = a
                counters[C_BOUND] += 1
            else:
                n_act = _fold_decided(act, n_act, start, cs, top_n, nf, nv)
        if label == UNDECIDED:
            # 3. sample cells (two labels prove impurity); if all agree, try a proof
            n, mixed = _sample(lo, hi, a, marg, n_samples, cell, samp, slab, act, n_act, cs,
                               nf, ncut, nl, nr, nv, start, tie_high, tol, buf)
            if not mixed and prove_budget > 0:
                status, pn = _prove(lo, hi, a, prove_budget, tol, act, n_act, cs, nf, ncut, nl,
                                    nr, nv, start, cex, pw)
                counters[C_PROOF_NODES] += pn
                if status == 1:
                    label = a
                    counters[C_PROVED] += 1
                elif status == 0:
                    counters[C_REFUTED] += 1
                    samp[n] = cex
                    lab, mg = label_cell(cex, act, n_act, cs, nf, ncut, nl, nr, nv, start,
                                         tie_high, buf)
                    slab[n] = lab if mg > tol else c  # near-tie counts as its own label
                    n += 1
                else:
                    counters[C_UNKNOWN] += 1
            if label == UNDECIDED:
                # 4. split at the root-most undecided node of one tree, the one whose cut
                # best separates the labelled cells (_prove uses private workspaces, so
                # trange is still the region's).
                best_t = _split_tree(n, a, c, samp, slab, act, n_act, start, nf, ncut, trange,
                                     cnt_l, cnt_r)
                if best_t < 0:
                    # Every tree is constant on the region: one score vector, a near-tie.
                    # The model labels it (same leaves everywhere, so the same answer).
                    label = NEAR_TIE
                    counters[C_TIES] += 1
                else:
                    st, sp, par, n_ids = _push_children(
                        st, sp, par, n_ids, rid, lo, hi, act, n_act, start, cs,
                        nf[start[best_t]], ncut[start[best_t]])
                    continue
        out, n_out = _emit(out, n_out, lo, hi, label, rid, par, counters)
    counters[C_REGIONS] = regions
    return (out.lo[:n_out].copy(), out.hi[:n_out].copy(), out.lab[:n_out].copy(), n_out,
            st.lo[:sp].copy(), st.hi[:sp].copy(), sp, counters)


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------
@dataclass(eq=False)
class Partition:
    """Disjoint labeled boxes of grid cells covering the legal domain.

    Attributes
    ----------
    lo, hi : ndarray of shape (n_rectangles, n_features), int32
        Inclusive cell-index ranges per feature.
    labels : ndarray of shape (n_rectangles,), int32
        Class index, or ``MIXED`` (-1) for an unresolved region.
    counters : dict
        Algorithm counters (see ``COUNTER_NAMES``).
    """

    lo: np.ndarray
    hi: np.ndarray
    labels: np.ndarray
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def n_rectangles(self) -> int:
        return int(self.labels.shape[0])

    @property
    def n_mixed(self) -> int:
        return int(np.count_nonzero(self.labels == MIXED))

    def counts(self, n_classes: int) -> np.ndarray:
        """Certified rectangles per class index, shape (n_classes,)."""
        lab = self.labels[self.labels >= 0]
        return np.bincount(lab, minlength=n_classes)


def _tolerance(ens: FlatEnsemble, scale: float) -> float:
    """Margin above which a bound decides the class whatever the library's arithmetic:
    float64 sums of a few thousand terms err by ~1e-13 relative; a library that sums in
    float32 (XGBoost) can be off by up to half an ulp of the running sum per tree."""
    tol = 1e-9 * (1.0 + scale)
    if ens.score_precision == "float32":
        tol = max(tol, (ens.n_trees + 2) * 2.0**-23 * (1.0 + scale))
    return tol


class Kernel(NamedTuple):
    """The ensemble's arrays in the layout the kernels take, one argument for numba.

    Attributes
    ----------
    nf, ncut, nl, nr : ndarray of shape (n_nodes,), int32
        Split feature (-1 at leaves), cut index on the grid (see :mod:`maps_core.grid`),
        left and right child of every node.
    nv : ndarray of shape (n_nodes, n_classes), float64
        Leaf values.
    roots : ndarray of shape (n_split_trees,), int32
        Roots of the trees that split: a tree that is a single leaf adds the same vector
        everywhere, so it is summed into ``base`` instead.
    base : ndarray of shape (n_classes,), float64
        The ensemble's base score plus the value of every single-leaf tree.
    tie_high : bool
        Exact score ties go to the higher class index.
    tol : float
        Margin above which a bound decides the class whatever the summation order.
    max_depth_nodes : int
        Room for a DFS stack over the largest tree.
    coff : ndarray of shape (n_features + 1,), int64
        The grid's per-feature cell offsets.
    """

    nf: np.ndarray
    ncut: np.ndarray
    nl: np.ndarray
    nr: np.ndarray
    nv: np.ndarray
    roots: np.ndarray
    base: np.ndarray
    tie_high: bool
    tol: float
    max_depth_nodes: int
    coff: np.ndarray

    @classmethod
    def make(cls, ens: FlatEnsemble, grid: Grid) -> Kernel:
        nv = np.ascontiguousarray(ens.node_value, dtype=np.float64)
        # Float64 sums of at most a few thousand terms err by ~1e-13 relative; a margin
        # above this tolerance decides the class whatever the summation order.
        leaf = ens.node_feature < 0
        scale = float(np.abs(ens.base).max(initial=0.0))
        for r0, r1 in zip(ens.roots, list(ens.roots[1:]) + [ens.n_nodes], strict=True):
            sl = slice(int(r0), int(r1))
            scale += float(np.abs(nv[sl][leaf[sl]]).max(initial=0.0))
        sizes = np.diff(np.concatenate([ens.roots, [ens.n_nodes]]))
        # Single-leaf trees (trees that found no split worth making: scikit-learn's
        # min_impurity_decrease, XGBoost's gamma and random-forest mode, LightGBM) go into
        # the base. The kernels take a tree as live while its node splits, and the
        # mixed-region search starts every tree at its root: it left such a tree's value
        # out of the scores (an XGBoost forest of one split tree and three single leaves,
        # class 1 everywhere, was answered class 0 on one side of its split).
        split = ens.node_feature[ens.roots] >= 0
        base = np.asarray(ens.base, dtype=np.float64) + nv[ens.roots[~split]].sum(axis=0)
        return cls(
            nf=np.ascontiguousarray(ens.node_feature, dtype=np.int32),
            ncut=np.ascontiguousarray(grid.node_cut, dtype=np.int32),
            nl=np.ascontiguousarray(ens.node_left, dtype=np.int32),
            nr=np.ascontiguousarray(ens.node_right, dtype=np.int32),
            nv=nv,
            roots=np.ascontiguousarray(ens.roots[split], dtype=np.int32),
            base=np.ascontiguousarray(base),
            tie_high=ens.tie_break == "high",
            tol=_tolerance(ens, scale),
            max_depth_nodes=int(sizes.max()) + 2,
            coff=np.ascontiguousarray(grid.cell_offsets, dtype=np.int64),
        )

    def refine(
        self, lo: np.ndarray, hi: np.ndarray, max_regions: int, prove_budget: int,
        n_samples: int, seed: int,
    ) -> tuple[Any, ...]:
        """:func:`_refine` of the region ``lo..hi`` (cell ranges, shape (n_features,))."""
        return _refine(lo, hi, max_regions, prove_budget, n_samples, seed, self)


def _non_negative(value: Real) -> bool:
    try:
        return float(value) >= 0  # False for nan
    except OverflowError:  # an integer past float64's range
        return cast(float, value) > 0


def _check_budgets(max_rectangles: Any, max_seconds: Any, max_memory: Any, on_budget: Any) -> None:
    """Refuse a build option that is none of what :func:`extract` documents (``bool`` is no
    number here: ``True`` rectangles is a typo, not one)."""
    for name, value in (("max_rectangles", max_rectangles), ("max_memory", max_memory)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)
                                  or value < 1):
            raise BuildOptionsError(f"{name} must be a positive integer or None, not {value!r}")
    if max_seconds is not None and (isinstance(max_seconds, bool) or not isinstance(max_seconds, Real)
                                    or not _non_negative(max_seconds)):
        raise BuildOptionsError(f"max_seconds must be a non-negative number or None, not {max_seconds!r}")
    if on_budget not in ("mixed", "error"):
        raise BuildOptionsError(f"on_budget must be 'mixed' or 'error', not {on_budget!r}")


#: Seconds between two progress reports of :func:`extract`.
REPORT_SECONDS = 0.5


def extract(
    ens: FlatEnsemble,
    grid: Grid,
    *,
    max_rectangles: int | None = None,
    max_seconds: float | None = None,
    max_memory: int | None = None,
    on_budget: str = "mixed",
    progress: Callable[[float], None] | None = None,
    n_jobs: int = 1,
    labeler: Callable[[np.ndarray], np.ndarray] | None = None,
    item_regions: int = 2_000,
    prove_budget: int = 0,
    n_samples: int = 0,
) -> Partition:
    """Certified partition of the legal domain.

    Parameters
    ----------
    ens : FlatEnsemble
    grid : Grid
        Canonical thresholds of ``ens`` on the schema's domain.
    max_rectangles, max_seconds, max_memory : optional
        Budgets: rectangles certified, seconds, and bytes the build may grow by (turned
        into a budget of boxes for this number of features by
        :func:`maps_core._memory.rectangles_within`, from measured peaks). At most
        ``max_rectangles`` rectangles are certified (mixed boxes come on top), and the
        memory's count of boxes, certified and mixed together, is never passed; time is
        checked between work items. When one runs
        out, ``on_budget="mixed"`` keeps the regions not yet resolved as mixed boxes
        (label ``MIXED``), ``"error"`` raises :class:`BudgetExceededError`.
    progress : callable, optional
        Receives, about every :data:`REPORT_SECONDS`, the share of the extraction done, in
        [0, 1]: the larger of the grid's certified share and the share spent of the
        rectangle (or memory) and time budgets, whichever ends the build first (a
        budgeted build of a forest certifies a few percent of its grid), then 1.
    n_jobs : int
        Worker threads.
    labeler : callable, optional
        ``labeler(points) -> class indices`` with the model itself, for near-tie cells.
        Defaults to :meth:`FlatEnsemble.predict_index`.
    item_regions, prove_budget, n_samples : int
        Regions per work item, node budget of each purity proof, cells sampled per region.
        By default no samples and no proofs: the interval bound alone certifies, splits go
        to the most uncertain tree's root-most undecided node, and equal-label siblings
        are merged back. Proofs and samples cut the rectangle count before merging (FI
        100x5: 5.9k instead of 11.4k rectangles) but cost more than they save in time
        (BC 100x5: 0.85M rectangles in 18 s with 16-node proofs against 0.90M in 6.6 s).

    Returns
    -------
    Partition
    """
    _check_budgets(max_rectangles, max_seconds, max_memory, on_budget)
    t0 = time.perf_counter()
    kern = Kernel.make(ens, grid)
    m = ens.n_features
    root_lo = np.zeros(m, dtype=np.int32)
    root_hi = (grid.n_cells - 1).astype(np.int32)
    # The share of the grid certified, summed in logs: a grid of 1,000 features has more
    # cells than float64 counts (the share was inf / inf, a NaN progress)
    log_total = float(np.log(grid.n_cells.astype(np.float64)).sum())
    done = 0.0
    counters = np.zeros(len(COUNTER_NAMES), dtype=np.int64)
    outs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n_rect = 0
    # Waves of work items processed in parallel; results kept in item order so that the
    # output does not depend on thread timing. The first wave is a single small item
    # whose leftover stack seeds the parallel waves.
    wave: list[tuple[np.ndarray, np.ndarray]] = [(root_lo, root_hi)]
    budget = 256
    seed = 0
    if max_seconds is not None:
        try:
            max_seconds = float(max_seconds)
        except OverflowError:  # an integer past float64's range: no limit, in effect
            max_seconds = np.inf
    deadline = np.inf if max_seconds is None else t0 + max_seconds
    # The memory budget counts every box the partition will hold, the regions still
    # unresolved (kept as mixed regions) as well as the certified rectangles: each costs
    # the same (its cell ranges, its entry in the index). Counting the rectangles alone,
    # a wide model whose regions mostly split grew 6x past its budget (1,000 features,
    # 300 MB: 1.9 GB, 16,776 regions left mixed with 100 rectangles certified).
    box_cap, box_what = None, ""
    if max_memory is not None:
        box_cap = rectangles_within(max_memory, m, ens.n_classes)
        box_what = (f"memory ({max_memory:,} bytes: {box_cap:,} rectangles and mixed regions "
                    f"on {m} features)")
    over: list[str] = []

    def work(lo: np.ndarray, hi: np.ndarray, n_regions: int, seed: int) -> tuple[Any, ...] | None:
        if time.perf_counter() > deadline:
            over.append("time")
            return None
        return kern.refine(lo, hi, n_regions, prove_budget, n_samples, seed)

    last_report = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, n_jobs)) as pool:
        while wave and not over:
            # Each region an item processes either certifies a rectangle or splits into
            # two: the rectangles grow by at most one, and so do rectangles plus regions
            # pending. Handed out in item order (below), both budgets hold exactly.
            left: float = np.inf if max_rectangles is None else max_rectangles - n_rect
            if left <= 0:
                over.append("rectangle")
                break
            if box_cap is not None and box_cap - n_rect - len(wave) < left:
                left = box_cap - n_rect - len(wave)
                if left <= 0:
                    over.append(box_what)
                    break
            futs = []
            for lo, hi in wave:
                seed += 1
                # Each region an item processes certifies at most one rectangle: regions
                # handed out in item order keep the budget exact and the maps independent
                # of thread timing (checked only between items, a budget of 3 gave 116
                # rectangles, of 300 gave 1,103). Items past the budget wait their turn.
                regions = int(min(budget, left))
                left -= regions
                futs.append((lo, hi, pool.submit(work, lo, hi, regions, seed) if regions
                             else None))
            nxt: list[tuple[np.ndarray, np.ndarray]] = []
            for lo, hi, fut in futs:
                res = None if fut is None else fut.result()
                if res is None:
                    nxt.append((lo, hi))
                    continue
                olo, ohi, olab, n_out, llo, lhi, n_left, cnt = res
                counters += cnt
                if n_out:
                    outs.append((olo, ohi, olab))
                    n_rect += n_out
                    log_vol = np.log((ohi - olo + 1).astype(np.float64)).sum(axis=1)
                    done += float(np.exp(log_vol - log_total).sum())
                nxt.extend((llo[i], lhi[i]) for i in range(n_left))
                now = time.perf_counter()
                if progress is not None and now - last_report > REPORT_SECONDS:
                    last_report = now
                    share = done
                    if max_rectangles is not None:
                        share = max(share, n_rect / max(max_rectangles, 1))
                    if box_cap is not None:
                        share = max(share, (n_rect + len(nxt)) / max(box_cap, 1))
                    if max_seconds is not None:
                        share = max(share, (now - t0) / max_seconds)
                    progress(min(share, 1.0))
            wave = nxt
            budget = item_regions
    stopped = bool(wave)
    if progress is not None:
        progress(1.0)
    if stopped:
        what = over[0] if over else "time"
        if on_budget == "error":
            raise BudgetExceededError(
                f"extraction exceeded its {what} budget with {n_rect} rectangles certified "
                f"and {len(wave)} regions unresolved ({100 * done:.4g}% of the grid "
                "certified)"
            )
        lo_m = np.stack([w[0] for w in wave]).astype(np.int32)
        hi_m = np.stack([w[1] for w in wave]).astype(np.int32)
        outs.append((lo_m, hi_m, np.full(len(wave), MIXED, dtype=np.int32)))
    if outs:
        lo = np.concatenate([o[0] for o in outs])
        hi = np.concatenate([o[1] for o in outs])
        lab = np.concatenate([o[2] for o in outs])
    else:  # pragma: no cover - the root always yields something
        lo = hi = np.zeros((0, m), dtype=np.int32)
        lab = np.zeros(0, dtype=np.int32)
    ties = np.flatnonzero(lab == NEAR_TIE)
    if ties.size:
        pts = grid.cell_points(lo[ties])
        lab[ties] = (labeler or ens.predict_index)(pts)
    info: dict[str, Any] = {k: int(v) for k, v in zip(COUNTER_NAMES, counters, strict=True)}
    info["extract_seconds"] = time.perf_counter() - t0
    info["budget_exhausted"] = stopped
    return Partition(lo=lo, hi=hi, labels=lab.astype(np.int32), counters=info)


def refine_region(
    kern: Kernel, lo: np.ndarray, hi: np.ndarray, max_regions: int = 2**62
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Refine one region (a mixed box, at query time) into disjoint pieces.

    Returns (lo, hi, labels) covering the region: certified pieces with their class,
    near-tie cells with ``NEAR_TIE`` (the caller labels them with the model), and, when
    ``max_regions`` ran out, the parts still unresolved with ``MIXED``.
    """
    olo, ohi, olab, _, llo, lhi, n_left, _ = kern.refine(
        lo.astype(np.int32), hi.astype(np.int32), max_regions, 0, 0, 1
    )
    if n_left:
        olo = np.concatenate([olo, llo])
        ohi = np.concatenate([ohi, lhi])
        olab = np.concatenate([olab, np.full(n_left, MIXED, dtype=np.int32)])
    return olo, ohi, olab


__all__ = ["MIXED", "NEAR_TIE", "Kernel", "Partition", "extract", "refine_region"]
