"""Load test (issue 16): ``cfmaps serve`` under ``wrk``, over loopback, 60 s per scenario.

Trains ``RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0)`` on each
dataset (CP and PD by default, as in ``benchmarks/bench_engine.py``), starts the real server
(``python -m app.cli serve --workers N --log-level warning``) on a free loopback port with a
temporary data dir, uploads the models once (the first server builds them, the next ones
load them from the data dir), then, per worker count and dataset:

* ``single``: one test row per request (``{"instance": [...]}``), ``--single-connections``
  keep-alive connections;
* ``batch``: 100 rows per request (``{"instances": [...]}``), ``--batch-connections``.

Each scenario is a closed loop driven by `wrk <https://github.com/wg/wrk>`_ (the Debian
package; one client thread, written in C, so that the client takes little of the two
cores) with ``benchmarks/bench_load.lua``, which cycles through the request bodies. Every
run is bounded in time (``-d``, plus a hard subprocess timeout) and in count (each wrk
thread stops after ``--max-requests``). A 5-second warm-up run precedes each scenario (every
worker process loads and JIT-warms its engine), and one request is checked by hand before
it. Reported: counterfactuals per second, p50/p90/p99/max latency, errors (connection,
read, write, timeout, and non-2xx answers), the server's CPU (all its processes) and the
client's, and the load average before and after.

Targets (issue 16, 2 cores): >= 1,500 single counterfactuals/s and >= 10,000 counterfactuals/s
in batches on CP maps, p99 < 50 ms, 0 errors.

    python -m benchmarks.bench_load [--datasets CP,PD] [--workers 1,2] [--duration 60] [--quick]

Writes the markdown report to ``benchmarks/results/load.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_http import (
    Server,
    free_port,
    machine,
    make_model,
    proc_cpu,
    say,
    upload,
    wait_until,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LUA = HERE / "bench_load.lua"
BATCH = 100
TARGET_SINGLE = 1500.0
TARGET_BATCH = 10000.0
TARGET_P99_MS = 50.0


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and all its descendants still alive (Linux)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        c = proc_cpu(p)
        if np.isfinite(c):
            total += c
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                pass
    return total


def children_cpu() -> float:
    """CPU seconds of this process's terminated children (wrk runs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def git_head() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
                             capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "app",
                                "maps_core"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    head = out.stdout.strip()[:90] or "unknown"
    return head + (" (with uncommitted changes in app/ or maps_core/)" if dirty.stdout.strip() else "")


@dataclass
class Result:
    dataset: str
    workers: int
    kind: str
    connections: int
    per_request: int
    wrk: dict[str, Any]
    server_cpu: float
    client_cpu: float
    load_before: float
    load_after: float

    @property
    def seconds(self) -> float:
        return self.wrk["duration_us"] / 1e6

    @property
    def throughput(self) -> float:
        return self.wrk["requests"] * self.per_request / self.seconds

    @property
    def errors(self) -> int:
        return sum(self.wrk[k] for k in ("connect", "read", "write", "status", "timeout"))

    def ms(self, key: str) -> float:
        return float(self.wrk[key]) / 1e3


def run_wrk(url: str, bodies: Path, path: str, connections: int, seconds: float,
            max_requests: int, out: Path) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s",
           "-s", str(LUA), url, "--", str(bodies), path, str(max_requests)]
    env = dict(os.environ, CFMAPS_WRK_OUT=str(out))
    out.unlink(missing_ok=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr or proc.stdout}")
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def write_bodies(path: Path, X: np.ndarray, kind: str) -> int:
    """One JSON body per line; returns the instances per request."""
    with open(path, "w") as fh:
        if kind == "single":
            for x in X:
                fh.write(json.dumps({"instance": x.tolist()}) + "\n")
            return 1
        rows = np.resize(X, (max(len(X), 50 * BATCH) // BATCH * BATCH, X.shape[1]))
        for i in range(0, len(rows), BATCH):
            fh.write(json.dumps({"instances": rows[i:i + BATCH].tolist()}) + "\n")
        return BATCH


def start(data_dir: Path, workers: int, log: Path) -> Server:
    return Server(data_dir, free_port(), log, sys.executable, workers=workers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="CP,PD", help="comma-separated (default: CP,PD)")
    ap.add_argument("--workers", default="1,2", help="server processes, comma-separated")
    ap.add_argument("--kinds", default="single,batch", help="single, batch or both")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per scenario")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of warm-up per scenario")
    ap.add_argument("--single-connections", type=int, default=8)
    # Two per worker process at most: a connection stays with the process that accepted it,
    # and with 2 connections both can land on one of 2 processes (4,528 cf/s against
    # 10,422 with 4, CP); more only queue (latency = connections x service time).
    ap.add_argument("--batch-connections", type=int, default=4)
    ap.add_argument("--max-requests", type=int, default=1_000_000,
                    help="requests after which a scenario stops early (per wrk thread)")
    ap.add_argument("--quick", action="store_true", help="10 s per scenario, 2 s warm-up")
    ap.add_argument("--build-timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(HERE / "results" / "load.md"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    if a.quick:
        a.duration, a.warmup = min(a.duration, 10.0), min(a.warmup, 2.0)
    if shutil.which("wrk") is None:
        say("wrk is not installed (Debian: apt-get install wrk)")
        return 2
    datasets = [d.strip() for d in a.datasets.split(",") if d.strip()]
    worker_counts = [int(w) for w in a.workers.split(",") if w.strip()]
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    conns = {"single": a.single_connections, "batch": a.batch_connections}

    import httpx

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_start = os.getloadavg()
    results: list[Result] = []
    info: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="cfmaps-bench-load-") as tmp:
        tmpd = Path(tmp)
        data_dir = tmpd / "data"
        models, tests = {}, {}
        for ds in datasets:
            (tmpd / ds).mkdir()
            say(f"training RandomForestClassifier(100, max_depth=5) on {ds}...")
            model_path, spec_path, Xte, _ = make_model(ds, tmpd / ds)
            models[ds], tests[ds] = (model_path, spec_path), Xte
        for w in worker_counts:
            server = start(data_dir, w, tmpd / f"server-{w}.log")
            try:
                with httpx.Client(base_url=server.base, timeout=120) as client:
                    wait_until("/readyz", lambda c=client: c.get("/readyz").status_code == 200,
                               server, 300)
                    for ds in datasets:
                        if ds not in info:
                            say(f"uploading {ds}; the server builds its maps...")
                            info[ds] = upload(client, server, *models[ds], a.build_timeout)
                            st = info[ds]["stats"]
                            say(f"{ds} ready: {st['rectangles']} rectangles, "
                                f"{st['mixed_regions']} mixed regions, built in {st['seconds']:.1f} s")
                        model_id = info[ds]["id"]
                        # every worker process has the model (they sync within a second):
                        # probed over new connections, which the kernel spreads over them
                        url = f"{server.base}/v1/models/{model_id}"
                        wait_until(f"{ds} in every worker", lambda u=url, n=8 * w: all(
                            httpx.get(u, headers={"Connection": "close"}).json().get("status")
                            == "ready" for _ in range(n)), server, 60)
                        path = f"/v1/models/{model_id}/counterfactuals"
                        for kind in kinds:
                            bodies = tmpd / f"{ds}-{kind}.jsonl"
                            per = write_bodies(bodies, tests[ds], kind)
                            first = bodies.read_text().splitlines()[0]
                            r = client.post(path, content=first,
                                            headers={"Content-Type": "application/json"})
                            if r.status_code != 200:
                                raise RuntimeError(f"{ds} {kind}: {r.status_code} {r.text[:300]}")
                            out = tmpd / "wrk.json"
                            say(f"{ds}, {w} worker(s), {kind}: warm-up {a.warmup:g} s, then "
                                f"{a.duration:g} s with {conns[kind]} connections...")
                            run_wrk(server.base, bodies, path, conns[kind], a.warmup,
                                    a.max_requests, out)
                            lb = os.getloadavg()[0]
                            s0, c0 = tree_cpu(server.proc.pid), children_cpu()
                            doc = run_wrk(server.base, bodies, path, conns[kind], a.duration,
                                          a.max_requests, out)
                            s1, c1 = tree_cpu(server.proc.pid), children_cpu()
                            res = Result(ds, w, kind, conns[kind], per, doc, s1 - s0, c1 - c0,
                                         lb, os.getloadavg()[0])
                            results.append(res)
                            say(f"  {res.throughput:,.0f} cf/s, p50 {res.ms('p50_us'):.2f} ms, "
                                f"p99 {res.ms('p99_us'):.2f} ms, errors {res.errors}")
                            if not server.alive():
                                raise RuntimeError(f"the server died:\n{server.log_tail()}")
            finally:
                server.stop()
    load_end = os.getloadavg()
    text = report(a, results, info, load_start, load_end)
    print(text)
    if not a.no_write:
        out_path = Path(a.out)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text)
        say(f"wrote {out_path}")
    return 0


def report(a: argparse.Namespace, results: list[Result], info: dict[str, dict[str, Any]],
           load_start: tuple[float, float, float], load_end: tuple[float, float, float]) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    wrk_version = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    wrk_version = (wrk_version.splitlines() or ["wrk"])[0].split(" Copyright")[0]
    args = " ".join(sys.argv[1:])
    lines = [
        "# Load test (RandomForestClassifier(100, max_depth=5), `cfmaps serve`, loopback)",
        "",
        f"`python -m benchmarks.bench_load{' ' + args if args else ''}` on {stamp}; "
        f"commit `{git_head()}`.",
        f"Machine: {machine()}; client `{wrk_version}` (1 thread). Load average "
        f"(1/5/15 min) {' / '.join(f'{v:.2f}' for v in load_start)} before the run, "
        f"{' / '.join(f'{v:.2f}' for v in load_end)} after (this machine's 2 cores are "
        "shared: more than the benchmark's own load means other work competed).",
        "",
    ]
    for ds, doc in info.items():
        st = doc["stats"]
        lines.append(f"* {ds}: {st['rectangles']} rectangles, {st['mixed_regions']} mixed "
                     f"regions, built by the server in {st['seconds']:.1f} s.")
    lines += [
        "",
        f"Each scenario: {a.warmup:g} s warm-up, then {a.duration:g} s closed loop (`wrk -t1 "
        "-cN -d...`, bodies cycled from the test rows of the 80/20 split, default norm l1), "
        "server started as `python -m app.cli serve --workers W --log-level warning`. "
        "Throughput in counterfactuals per second (a batch request answers 100); latency "
        "per request; errors = connection + read + write + timeout errors + non-2xx answers; "
        "CPU in seconds over the scenario (server: all its processes; client: wrk).",
        "",
        "| dataset | workers | requests | connections | cf/s | requests/s | p50 ms | p90 ms "
        "| p99 ms | max ms | errors | server CPU s | client CPU s | load before / after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        label = "single" if r.kind == "single" else f"batch of {BATCH}"
        lines.append(
            f"| {r.dataset} | {r.workers} | {label} | {r.connections} | {r.throughput:,.0f} "
            f"| {r.wrk['requests'] / r.seconds:,.0f} | {r.ms('p50_us'):.2f} | {r.ms('p90_us'):.2f} "
            f"| {r.ms('p99_us'):.2f} | {r.ms('max_us'):.1f} | {r.errors} | {r.server_cpu:.1f} "
            f"| {r.client_cpu:.1f} | {r.load_before:.2f} / {r.load_after:.2f} |")
    lines += ["", f"Targets (issue 16, 2 cores, CP maps): >= {TARGET_SINGLE:,.0f} single "
              f"counterfactuals/s, >= {TARGET_BATCH:,.0f} counterfactuals/s in batches, p99 < "
              f"{TARGET_P99_MS:g} ms, 0 errors.", ""]
    for r in results:
        if r.dataset != "CP":
            continue
        target = TARGET_SINGLE if r.kind == "single" else TARGET_BATCH
        ok_t, ok_p, ok_e = r.throughput >= target, r.ms("p99_us") < TARGET_P99_MS, r.errors == 0
        verdict = "met" if ok_t and ok_p and ok_e else "MISSED"
        lines.append(
            f"* CP, {r.workers} worker(s), {r.kind}: {r.throughput:,.0f} cf/s "
            f"({'>=' if ok_t else '<'} {target:,.0f}), p99 {r.ms('p99_us'):.1f} ms, "
            f"{r.errors} errors: **{verdict}**")
    lines.append(f"* errors in all scenarios: {sum(r.errors for r in results)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
