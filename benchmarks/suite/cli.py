"""Command line of the benchmark suite: run the parts in order, then write the report.

    python -m benchmarks.run [--quick | --full] [--parts paper,sensitivity,peers] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

from benchmarks.suite import env as envmod
from benchmarks.suite import report
from benchmarks.suite.config import MODES, NORMS
from benchmarks.suite.metrics import condense, status
from benchmarks.suite.peers_cmp import run_peers
from benchmarks.suite.runner import run_worker

BENCH = Path(__file__).resolve().parents[1]
T_START = time.perf_counter()


LOG: list[str] = []


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - T_START:7.1f}s] {msg}"
    LOG.append(line)
    print(line, flush=True)


def _line(r: dict) -> str:
    if "T0" not in r:
        return status(r)
    nm = r.get("norms", {})
    lat = " ".join(f"{n} {nm[n]['p50_ms']:.3g}ms({nm[n]['n']})" for n in NORMS if "p50_ms" in nm.get(n, {}))
    return (f"T0 {r['T0']:.2f}s rect {r['rectangles']:,} mixed {r.get('mixed', 0):,}; {lat}; "
            f"wall {r['wall_s']:.0f}s; {status(r)}")


def part_paper(mode, peers_needed: set[str]) -> list[dict]:
    plan = mode.paper
    rows = []
    for ds in plan.datasets:
        for seed in range(plan.seeds[ds]):
            spec = {"dataset": ds, "trees": 100, "depth": 5, "seed": seed,
                    "max_seconds": plan.build_budget[ds], "n_queries": plan.n_queries,
                    "query_budget": plan.query_budget, "norms": list(NORMS),
                    "n_peer": mode.peers.n_queries[ds] if seed == 0 and ds in peers_needed else 0,
                    "n_scan": plan.n_scan if seed == 0 else 0, "scan_budget": plan.scan_budget}
            log(f"part 1: {ds} 100x5 seed {seed} (budget {spec['max_seconds']:g} s)")
            r = condense(run_worker(spec, log))
            rows.append(r)
            log(f"  {ds} seed {seed}: {_line(r)}")
    return rows


def part_sensitivity(mode) -> list[dict]:
    plan = mode.sensitivity
    configs = [(t, 5) for t in plan.trees] + [(100, d) for d in plan.depths if d != 5]
    rows = []
    for ds in plan.datasets:
        for trees, depth in configs:
            spec = {"dataset": ds, "trees": trees, "depth": depth, "seed": 0,
                    "max_seconds": plan.build_budget, "n_queries": plan.n_queries,
                    "query_budget": plan.query_budget, "norms": list(NORMS), "n_peer": 0, "n_scan": 0}
            log(f"part 2: {ds} {trees} trees depth {depth}")
            r = condense(run_worker(spec, log))
            rows.append(r)
            log(f"  {ds} {trees}x{depth}: {_line(r)}")
    return rows


def part_peers(mode, paper_rows: list[dict]) -> dict:
    out = {}
    for ds in mode.peers.datasets:
        w = next((r for r in paper_rows if r["spec"]["dataset"] == ds and r["spec"]["seed"] == 0), None)
        if w is None:
            log(f"part 3: {ds}: no seed-0 build from part 1; skipped")
            continue
        log(f"part 3: {ds}")
        out[ds] = run_peers(ds, w, mode.peers, log)
        for name, p in out[ds].get("peers", {}).items():
            s = p.get("summary")
            if s:
                log(f"  {ds} {name}: median {s['median_time_s']} s/query, valid {s['valid']}/{s['n']}, "
                    f"proved {s['proved_optimal']}, ratio {s['median_ratio']}, "
                    f"= ours {s['optimal_matched']}/{s['optimal_compared']}")
    return out


def _finish(results: dict, out: Path) -> int:
    lines = report.write(results, out)
    if LOG:  # not with --report-only
        (out / "run.log").write_text("\n".join(LOG) + "\n")
    print()
    print(f"== summary ({results['mode']} mode, {results['wall_s'] / 60:.1f} min; {out / 'README.md'}) ==")
    for s in lines:
        print(("!!! " if s.startswith("MISMATCH") else "") + s.replace("**", ""))
    return 1 if any(s.startswith("MISMATCH") for s in lines) else 0


def report_only(out: Path) -> int:
    """Recompute the peer summaries from the saved records and rewrite the report."""
    import json

    import numpy as np

    from benchmarks.suite.peers_cmp import summarize

    results = json.loads((out / "suite.json").read_text())
    for cmp in (results.get("peers") or {}).values():
        for p in cmp.get("peers", {}).values():
            if "records" in p:
                p["summary"] = summarize("", p["records"], cmp["ours"], np.asarray(cmp["queries"]))
    return _finish(results, out)


def ensure_peer_envs(names: tuple[str, ...] | list[str]) -> None:
    """Create the virtual environments of the peers that lack one (OCEAN's from pyenv's
    Python 3.12), with ``benchmarks/peers/setup_envs.sh``; never project dependencies."""
    import subprocess

    from benchmarks.peers.peers import available

    missing = [n for n in names if not available(n)]
    if not missing:
        return
    log(f"creating peer venvs: {', '.join(missing)} (benchmarks/peers/setup_envs.sh, a few minutes)")
    script = BENCH / "peers" / "setup_envs.sh"
    rc = subprocess.run(["bash", str(script), *missing], check=False).returncode
    if rc != 0:
        log(f"!! setup_envs.sh exited with {rc}: the peers still missing are skipped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="cfmaps benchmark suite (see benchmarks/README.md)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="< 3 minutes: CP and FI, 1 seed, few queries")
    g.add_argument("--full", action="store_true", help="5 seeds everywhere, large budgets (hours)")
    ap.add_argument("--parts", default="paper,sensitivity,peers",
                    help="comma-separated subset of paper,sensitivity,peers (peers need paper)")
    ap.add_argument("--out", type=Path, help="output directory (default benchmarks/results, "
                    "benchmarks/results/quick with --quick)")
    ap.add_argument("--no-peer-setup", action="store_true",
                    help="do not create missing peer venvs (benchmarks/peers/setup_envs.sh); "
                         "missing peers are then skipped and say so")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite README.md and the plots from OUT/suite.json without running anything")
    a = ap.parse_args(argv)
    mode = MODES["quick" if a.quick else "full" if a.full else "default"]
    if a.report_only:
        return report_only(a.out or (BENCH / "results" / ("quick" if a.quick else "")))
    parts = {p.strip() for p in a.parts.split(",") if p.strip()}
    unknown = parts - {"paper", "sensitivity", "peers"}
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}")
    if "peers" in parts:
        parts.add("paper")
    out = a.out or (BENCH / "results" / ("quick" if a.quick else ""))
    command = "python " + " ".join(shlex.quote(x) for x in
                                   ["benchmarks/run.py", *(sys.argv[1:] if argv is None else argv)])
    env = envmod.describe()
    log(f"{command}  ({mode.name} mode) -> {out}")
    if env["versions"].get("matplotlib") == "not installed":
        log("!! matplotlib is not installed: tables only, no PNGs (pip install -e '.[bench]')")
    log(f"{env['nproc']} CPUs {env['cpu']}, {env['ram_gb']} GB, Python {env['python']}, "
        f"load {env['load_start']}, git {env['git']}")
    results: dict = {"mode": mode.name, "command": command, "env": env,
                     "plan": dataclasses.asdict(mode), "parts": sorted(parts)}
    peers_needed = set(mode.peers.datasets) if "peers" in parts else set()
    if "peers" in parts and not a.no_peer_setup:
        ensure_peer_envs(mode.peers.peers)
    if "paper" in parts:
        results["paper"] = part_paper(mode, peers_needed)
    if "sensitivity" in parts:
        results["sensitivity"] = part_sensitivity(mode)
    if "peers" in parts:
        results["peers"] = part_peers(mode, results["paper"])
    env["load_end"] = envmod.load_average()
    env["git_end"] = envmod.describe()["git"]
    results["wall_s"] = time.perf_counter() - T_START
    return _finish(results, out)
