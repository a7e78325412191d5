"""Run one worker (one build and its queries) in a subprocess with a hard timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peers.peers import kill_group

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository: where -m finds benchmarks


def hard_timeout(spec: dict) -> float:
    """Backstop only: the build budget is checked inside the engine; this catches a hang."""
    norms = len(spec.get("norms", ()))
    return (120.0 + 3.0 * spec["max_seconds"] + 2.0 * norms * spec["query_budget"]
            + 5.0 * spec.get("n_peer", 0)
            + 2.0 * norms * spec.get("scan_budget", 0.0) * bool(spec.get("n_scan")))


def run_worker(spec: dict, log=None) -> dict:
    """Run the worker on ``spec``; return its result, with ``wall_s``, ``timed_out`` and
    ``error`` added (partial results survive a timeout or a crash)."""
    limit = hard_timeout(spec)
    with tempfile.TemporaryDirectory(prefix="cfmaps-suite-") as d:
        sp, out, err = Path(d) / "spec.json", Path(d) / "out.json", Path(d) / "stderr.log"
        sp.write_text(json.dumps(spec))
        t0 = time.perf_counter()
        timed_out = False
        with open(err, "wb") as fe:
            proc = subprocess.Popen([sys.executable, "-m", "benchmarks.suite.worker", str(sp), str(out)],
                                    cwd=ROOT, stdout=fe, stderr=fe, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc)
                rc = proc.returncode
            except BaseException:
                kill_group(proc)
                raise
        wall = time.perf_counter() - t0
        res = json.loads(out.read_text()) if out.exists() else {"spec": spec, "stage": "not started"}
        res.update(wall_s=wall, timed_out=timed_out, hard_timeout_s=limit, returncode=rc)
        if rc != 0 or timed_out:
            tail = err.read_text(errors="replace")[-2000:]
            res["error"] = (f"hard timeout after {limit:.0f}s at stage {res.get('stage')}"
                            if timed_out else f"worker exited with {rc}: {tail.strip()[-600:]}")
            if log:
                log(f"  !! {res['error']}")
    return res
