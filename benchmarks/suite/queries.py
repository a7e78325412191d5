"""Query sets and the forest fingerprint shared by the worker and the parent."""

from __future__ import annotations

import hashlib

import numpy as np


def query_set(Xte: np.ndarray, schema, n: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """The first ``n`` test rows, topped up with uniform legal samples (integral on integer
    features). Returns (queries, number of test rows among them)."""
    if len(Xte) >= n:
        return Xte[:n].copy(), n
    lo, hi = schema.domains()
    lo = np.where(np.isfinite(lo), lo, Xte.min(0))
    hi = np.where(np.isfinite(hi), hi, Xte.max(0))
    rng = np.random.default_rng(seed)
    extra = rng.uniform(lo, hi, size=(n - len(Xte), Xte.shape[1]))
    integ = schema.integral_mask()
    extra[:, integ] = np.clip(np.round(extra[:, integ]), lo[integ], hi[integ])
    return np.vstack([Xte, extra]), len(Xte)


def forest_hash(forest) -> str:
    """SHA-256 over every tree's node arrays and leaf values (same forest <=> same hash)."""
    h = hashlib.sha256()
    for est in forest.estimators_:
        t = est.tree_
        for a in (t.children_left, t.children_right, t.feature, t.threshold, t.value):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def fit_forest(Xtr: np.ndarray, ytr: np.ndarray, trees: int, depth: int, seed: int):
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(n_estimators=trees, max_depth=depth, random_state=seed).fit(Xtr, ytr)
