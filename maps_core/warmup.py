"""Compile the query kernels before the first query needs them.

The engine's kernels are compiled by numba on first call (and cached on disk): tens of
seconds on a new machine, a second or two to load the cache after that. A service that
compiled on its first request made that request wait as long, or fail its time budget; so
a service runs :func:`warm_up` before it reports ready.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from sklearn.ensemble import RandomForestClassifier

from ._norms import N_NORMS, NORM_NAMES
from .exceptions import BudgetExceededError
from .maps import CounterfactualMaps
from .query import PARALLEL_ROWS

#: The rectangle budget that leaves the warm-up's model with mixed regions.
MIXED_BUDGET = 2

# The scratch directories of warm-ups under way (see discard_scratch).
_scratch: set[str] = set()
_scratch_lock = threading.Lock()


def _model() -> tuple[RandomForestClassifier, np.ndarray]:
    """The warm-up's forest and its rows (shape (200, 4)): big enough that a budget of
    :data:`MIXED_BUDGET` rectangles leaves mixed regions (4 trees of depth 3 were
    certified whole whatever the budget, so the mixed-region search was never warmed, and
    a service's first query on budgeted maps compiled for tens of seconds)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int)
    return RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0).fit(X, y), X


def warm_up() -> float:
    """Run every query path once on tiny maps, as a service runs them.

    Tiny maps are built (complete, and budgeted so that they keep mixed regions), saved and
    memory-mapped back as a service loads them (read-only arrays are a signature numba
    compiles apart), then asked a single query and a batch, with and without a time budget,
    and in two threads.

    Returns
    -------
    float
        Seconds taken (mostly compilation, or loading numba's cache).
    """
    t0 = time.perf_counter()
    model, X = _model()
    with tempfile.TemporaryDirectory(prefix="cfmaps-warmup-",
                                     ignore_cleanup_errors=True) as tmp:
        with _scratch_lock:
            _scratch.add(tmp)
        try:
            _run(model, X, Path(tmp))
        finally:
            with _scratch_lock:
                _scratch.discard(tmp)
    return time.perf_counter() - t0


def _run(model: RandomForestClassifier, X: np.ndarray, tmp: Path) -> None:
    """The warm-up's builds and queries, its maps saved under ``tmp``."""
    for budget in (None, MIXED_BUDGET):
        path = tmp / f"maps-{budget}"
        # parents=False: after discard_scratch, a save fails rather than make the
        # directory again
        CounterfactualMaps.build(model, max_rectangles=budget).save(path, parents=False)
        maps = CounterfactualMaps.load(path, mmap=True)
        for max_seconds in (None, 60.0):
            maps.counterfactual(X[0], max_seconds=max_seconds)
            maps.counterfactuals(X[:4], max_seconds=max_seconds)
        # every norm, k > 1 and the best found within a budget (the guesses' kernels):
        # a first query of one of these compiled for tens of seconds past max_seconds
        for norm in NORM_NAMES:
            maps.counterfactual(X[1], norm=norm, k=2)
        # nothing found in one box of these mostly mixed maps: compiled all the same
        with contextlib.suppress(BudgetExceededError):
            maps.counterfactual(X[1], max_boxes=1, on_budget="best")
        if maps.engine.has_mixed:
            # a search in two parts and a batch in two threads, as on maps whose
            # searches are long
            maps.engine.pace.long[:] = maps.engine.pace.seconds[:] = [1e9] * N_NORMS
            maps.counterfactual(X[0], threads=2)
            maps.counterfactuals(X[:2 * PARALLEL_ROWS], threads=2)
        del maps  # the memory maps close before the directory goes


def discard_scratch() -> None:
    """Remove the scratch directories of the warm-ups still running in this process.

    A service warms up in a daemon thread and, stopped by SIGTERM, ends by that signal
    once its shutdown has run (uvicorn re-raises it), so a warm-up under way never reached
    its own clean-up and left its directory in the temp dir. The service's shutdown
    calls this; the interrupted warm-up then fails, which costs nothing at that point.
    """
    with _scratch_lock:
        dirs = list(_scratch)
    for d in dirs:
        for _ in range(3):  # a save under way may add a file between two passes
            shutil.rmtree(d, ignore_errors=True)
            if not Path(d).exists():
                break


__all__ = ["discard_scratch", "warm_up"]
