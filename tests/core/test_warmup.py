"""The warm-up compiles the query paths a service runs, on maps loaded as it loads them."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest


def test_warm_up_compiles_the_paths_a_service_runs() -> None:
    """In a fresh process, so that only the warm-up's own calls count (in the test run's
    process, earlier tests had compiled the kernels, and this test passed while the
    warm-up's maps had no mixed region and never ran the mixed-region search)."""
    probe = (
        "import json\n"
        "from maps_core import lazy, query\n"
        "from maps_core.warmup import warm_up\n"
        "warm_up()\n"
        "print(json.dumps({name: [str(s) for s in f.signatures] for name, f in (\n"
        "    ('single', lazy.best_first), ('batch', query._batch))}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=900, check=True)
    signatures = json.loads(out.stdout.strip().splitlines()[-1])
    # a service memory-maps its maps: read-only arrays, a signature of their own; the
    # mixed-region search and a batch (kernels they call, such as the guesses, compile
    # with them and show no signature of their own when loaded from numba's cache)
    for name in ("single", "batch"):
        assert any("readonly" in s for s in signatures[name]), name


def test_the_warm_up_runs_the_mixed_region_search() -> None:
    """Its budgeted maps must keep mixed regions, else the search inside them is never
    compiled before the first query (its old forest was certified whole at any budget)."""
    from maps_core import CounterfactualMaps
    from maps_core.warmup import MIXED_BUDGET, _model

    model, _ = _model()
    assert CounterfactualMaps.build(model, max_rectangles=MIXED_BUDGET).engine.has_mixed


def test_discard_scratch_removes_a_running_warm_ups_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service stopped by SIGTERM ends without its warm-up thread's clean-up, which left
    a ``cfmaps-warmup-*`` directory (the maps saved so far) in the temp dir at every such
    stop; its shutdown calls :func:`discard_scratch`. The interrupted warm-up must then
    fail rather than make its directory again."""
    from maps_core.warmup import discard_scratch, warm_up

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            warm_up()
        except Exception as exc:  # noqa: BLE001 - what the thread ended with is the result
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("cfmaps-warmup-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert list(tmp_path.glob("cfmaps-warmup-*")), "the warm-up made no scratch directory"
    discard_scratch()
    thread.join(timeout=600)
    assert not thread.is_alive()
    assert failures, "the warm-up ended before its directory was discarded"
    assert list(tmp_path.iterdir()) == []
