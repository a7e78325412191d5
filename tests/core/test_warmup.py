"""The warm-up compiles the query paths a service runs, on maps loaded as it loads them."""

from __future__ import annotations

from maps_core import lazy, query
from maps_core.warmup import warm_up


def test_warm_up_compiles_the_paths_a_service_runs() -> None:
    assert warm_up() >= 0.0
    # a service memory-maps its maps: read-only arrays, a signature of their own
    single = [str(s) for s in lazy.best_first.signatures]
    batch = [str(s) for s in query._batch.signatures]
    assert any("readonly" in s for s in single)
    assert any("readonly" in s for s in batch)
