"""Markdown tables, the per-dataset summary, and the results README."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from benchmarks.suite import plots
from benchmarks.suite.config import NORMS, PAPER, PAPER_LATENCY_NOTE
from benchmarks.suite.metrics import mean_sd, status

PEER_LABEL = {"ocean": "OCEAN", "treecf": "treecf", "dice": "DiCE"}



def _rect_budget(r: dict) -> int:
    """Rectangle budget a build ran with (older results: the worker's default)."""
    from .worker import MAX_RECTANGLES

    return int(r["spec"].get("max_rectangles", MAX_RECTANGLES))

def _f(v, nd: int = 3, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}g}{unit}" if abs(v) < 1000 else f"{v:,.0f}{unit}"
    return f"{v}{unit}"


def _ms(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 1 else f"{v:.1f}" if v < 100 else f"{v:,.0f}")


def _ms_cell(r: dict | None) -> str:
    """Median latency of one norm with the number of queries answered."""
    if not r or "p50_ms" not in r:
        return "-"
    s = _ms(r["p50_ms"])
    if r["n"] < r["n_total"]:
        s += f" ({r['n']}/{r['n_total']})"
    return s


def _ms_cell_mean(rs: list[dict | None]) -> str:
    rs = [r for r in rs if r and "p50_ms" in r]
    if not rs:
        return "-"
    s = _ms(float(np.mean([r["p50_ms"] for r in rs])))
    n, tot = sum(r["n"] for r in rs), sum(r["n_total"] for r in rs)
    return s + (f" ({n}/{tot})" if n < tot else "")


def _by_dataset(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["spec"]["dataset"], []).append(r)
    return out


# -------------------------------------------------------------------------------------------
# part 1
# -------------------------------------------------------------------------------------------
def paper_table(rows: list[dict]) -> str:
    lines = [
        "| dataset | seeds | T0 (s) | paper T0 | T50 (s) | paper T50 | T1000 (s) | paper T1000 "
        "| l1 p50 (ms) | l2 p50 (ms) | linf p50 (ms) | l1 p99 (ms) | rectangles | build status "
        "| valid CFs | peak RSS (MB) | test acc. |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ds, rs in sorted(_by_dataset(rows).items()):
        built = [r for r in rs if "T0" in r]
        p = PAPER[ds]
        if not built:
            lines.append(f"| {ds} | {len(rs)} | - | {p['T0']} | - | {p['T50']} | - | {p['T1000']} | - | - "
                         f"| - | - | - | {status(rs[0])} | - | - | - |")
            continue

        def agg(key: str, rs=built) -> str:
            vals = [r[key] for r in rs if r.get(key) is not None]
            if not vals:
                return "-"
            m, sd = mean_sd(vals)
            ext = "~" if any(r.get(f"{key}_extrapolated") for r in rs) else ""
            return f"{ext}{m:.3g}" + (f" ± {sd:.2g}" if len(vals) > 1 else "")

        lat = [_ms_cell_mean([r.get("norms", {}).get(n) for r in built]) for n in NORMS]
        p99 = [r["norms"]["l1"]["p99_ms"] for r in built if "p99_ms" in r.get("norms", {}).get("l1", {})]
        rect = int(np.mean([r["rectangles"] for r in built]))
        sts = sorted({status(r) for r in rs})
        mixed = [r for r in built if r.get("mixed")]
        st = "ok" if sts == ["ok"] else "; ".join(
            f"seed {r['spec']['seed']}: {status(r)} (T0 {r['T0']:.0f} s; budgets "
            f"{r['spec']['max_seconds']:g} s and {_rect_budget(r):,} rectangles; extraction "
            f"{_f(r.get('counters', {}).get('extract_seconds'))} s, the rest indexing)"
            for r in (mixed or rs) if status(r) != "ok")
        val = sum(n.get("valid", 0) for r in built for n in r.get("norms", {}).values())
        ans = sum(n.get("answered", 0) for r in built for n in r.get("norms", {}).values())
        acc = np.mean([r["test_accuracy"] for r in rs if "test_accuracy" in r])
        rss = max(r.get("peak_rss_mb", r.get("peak_rss_mb_build", 0)) for r in built)
        lines.append(
            f"| {ds} | {len(built)} | {agg('T0')} | {p['T0']} | {agg('T50')} | {p['T50']} | {agg('T1000')} "
            f"| {p['T1000']} | {' | '.join(lat)} | {_ms(float(np.mean(p99))) if p99 else '-'} "
            f"| {rect:,} | {st} | {val}/{ans} | {rss:,.0f} | {acc:.3f} |"
        )
    return "\n".join(lines)


PAPER_NOTES = f"""\
RandomForestClassifier(n_estimators=100, max_depth=5, random_state=seed), seeds 0..n-1; the
80/20 train/test split is the same for every seed (`train_test_split(..., random_state=0)`):
the seed varies the forest only. Schema: `load_csv(..., whole_floats_as_integers=True)` (file type
codes, float columns holding only integers declared integer, bounds = observed range);
default query weights (1/range per feature). Queries: the test rows, topped up to the
requested count with uniform legal samples (integral on integer features), the same for
every seed. T0 = wall time of `CounterfactualMaps.build(model, schema, max_seconds=budget,
max_rectangles=5_000_000)` (the service's default budgets bound memory the same way)
after a JIT warm-up on a tiny forest (compilation is not part of T0); T50 / T1000 = T0 + the
wall time of the first 50 / 1000 single `counterfactual(x, norm="l1")` calls (nearest other
class). Mean ± sd over seeds. `~` = extrapolated: the per-norm query budget stopped the run
before 1000 queries, the rest is counted at the mean measured time (numbers in brackets:
queries answered / asked). Latency columns: median per query, mean over seeds; {PAPER_LATENCY_NOTE}.
The norms run in the order l1, l2, linf on the same maps; queries that reach mixed regions
search inside them from scratch (nothing is cached between queries). "valid CFs": the model itself predicts
the target class at every returned counterfactual (all norms, all seeds). "budget exceeded":
the build stopped at a budget and kept mixed regions, searched at query time by a best-first
branch-and-bound over their sub-boxes (answers stay exact, queries near them pay for it);
`max_seconds` bounds the extraction, the KD-tree indexing comes on top. Peak RSS: the worker
process (max over seeds). Paper hardware: AMD EPYC 7532 2.4 GHz."""


# -------------------------------------------------------------------------------------------
# part 2
# -------------------------------------------------------------------------------------------
def sensitivity_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        sp = r["spec"]
        out.append({"dataset": sp["dataset"], "trees": sp["trees"], "depth": sp["depth"],
                    "T0": r.get("T0"), "rectangles": r.get("rectangles", 0),
                    "mixed": r.get("mixed", 0), "status": status(r), "res": r})
    return out


def sensitivity_table(rows: list[dict], axis: str) -> str:
    """One sweep: ``axis`` 'trees' (depth 5) or 'depth' (100 trees)."""
    sel = [s for s in sensitivity_rows(rows) if (s["depth"] == 5 if axis == "trees" else s["trees"] == 100)]
    lines = ["| dataset | trees | depth | T0 (s) | rectangles | status | l1 p50 (ms) | l2 p50 (ms) "
             "| linf p50 (ms) | l1 max (ms) | thresholds (raw) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(sel, key=lambda s: (s["dataset"], s[axis])):
        r = s["res"]
        nm = r.get("norms", {})
        lines.append(
            f"| {s['dataset']} | {s['trees']} | {s['depth']} | {_f(s['T0'])} | {s['rectangles']:,} "
            f"| {s['status']} | {' | '.join(_ms_cell(nm.get(n)) for n in NORMS)} "
            f"| {_ms(nm.get('l1', {}).get('max_ms'))} | {r.get('thresholds', '-')} "
            f"({r.get('raw_thresholds', '-')}) |"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------
# part 3
# -------------------------------------------------------------------------------------------
def our_peer_stats(cmp: dict) -> dict:
    ours = cmp.get("ours") or []
    t = [o["time_s"] for o in ours]
    return {"median_time_s": float(np.median(t)) if t else None,
            "valid": sum(bool(o.get("valid")) for o in ours), "n": len(ours)}


def peers_table(peers: dict) -> str:
    lines = ["| dataset | queries | ours (ms/query) | peer | peer time/query median (max) | valid "
             "| proved optimal | distance ratio peer/ours median (max) | = ours where proved (exact peers) "
             "| speed-up per query |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for ds, cmp in sorted(peers.items()):
        if cmp.get("error"):
            lines.append(f"| {ds} | - | - | - | {cmp['error']} | | | | | |")
            continue
        o = our_peer_stats(cmp)
        ours_ms = o["median_time_s"] * 1e3 if o["median_time_s"] is not None else None
        ours_cell = f"{_ms(ours_ms)} (valid {o['valid']}/{o['n']})"
        for name, p in cmp["peers"].items():
            if "summary" not in p:
                lines.append(f"| {ds} | {cmp['n']} | {ours_cell} | {PEER_LABEL[name]} "
                             f"| {p.get('error', 'failed')} | | | | | |")
                continue
            s = p["summary"]
            exact = name in ("ocean", "treecf")
            agree = (f"{s['optimal_matched']}/{s['optimal_compared']}" if exact else "n/a")
            if s["mismatches"]:
                agree = f"**{agree} — {len(s['mismatches'])} MISMATCH**"
            elif not exact and s.get("closer_than_ours"):
                agree = f"**{s['closer_than_ours']} closer than ours**"
            sp = (s["median_time_s"] / o["median_time_s"]
                  if s["median_time_s"] and o["median_time_s"] else None)
            lines.append(
                f"| {ds} | {cmp['n']} | {ours_cell} | {PEER_LABEL[name]} "
                f"| {_f(s['median_time_s'])} s ({_f(s['max_time_s'])} s) | {s['valid']}/{s['n']} "
                f"| {s['proved_optimal'] if exact else '-'} "
                f"| {_f(s['median_ratio'], 4)} ({_f(s['max_ratio'], 4)}) | {agree} "
                f"| {_f(sp, 3)}× |"
            )
    return "\n".join(lines)


def scan_table(paper_rows: list[dict]) -> str:
    lines = ["| dataset | rectangles | mixed | norm | queries | KD-tree p50 (ms) | linear scan p50 (ms) "
             "| speed-up | same distance |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(paper_rows, key=lambda r: r["spec"]["dataset"]):
        sc = r.get("scan")
        if not sc:
            continue
        for n in NORMS:
            s = sc.get(n)
            if not s:
                continue
            sp = s["scan_median_s"] / s["kd_median_s"] if s["scan_median_s"] and s["kd_median_s"] else None
            same = f"{s['agree']}/{s['compared']}"
            if sc["mixed"]:
                # The scan sees certified rectangles only: an upper bound on the optimum.
                same += (f"; KD smaller on {s['compared'] - s['agree'] - s['kd_worse']} (mixed regions "
                         "refined), larger on " + (f"**{s['kd_worse']}**" if s["kd_worse"] else "0"))
            elif s["agree"] < s["compared"]:
                same = f"**{same} DISAGREE**"
            lines.append(f"| {r['spec']['dataset']} | {sc['rectangles']:,} | {sc['mixed']:,} | {n} "
                         f"| {s['compared']}/{sc['n']} | {_ms(s['kd_median_s'] * 1e3)} "
                         f"| {_ms((s['scan_median_s'] or 0) * 1e3)} | {_f(sp)}× | {same} |")
    return "\n".join(lines)


def mismatch_lines(peers: dict) -> list[str]:
    out = []
    for ds, cmp in sorted(peers.items()):
        for name, p in cmp.get("peers", {}).items():
            for m in (p.get("summary") or {}).get("mismatches", []):
                out.append(
                    f"MISMATCH {ds} {PEER_LABEL[name]} query {m['i']}: ours {m['ours']:.9g} "
                    f"(point L1 {_f(m['ours_point_l1'], 9)}, valid {m['ours_valid']}) vs peer "
                    f"{m['peer']:.9g} (objective {_f(m['peer_objective'], 9)}, "
                    f"{m['peer_status']}); tolerance {m['tolerance']:.2g}; {m['kind']}"
                )
    return out


PEER_NOTES = """\
Same forest (seed 0 of part 1, re-fitted in each peer's venv and checked bit for bit), same
queries (the first test rows), target = the other class of the forest's prediction. Our side:
`counterfactual(x, target, norm="l1", weights=ones)`, i.e. plain L1 in original units, the
objective of OCEAN (CP-SAT, `ConstraintProgrammingExplainer`) and treecf (exact backend,
normalizers = 1); the peers get the schema's types (integer features stay integral) and bounds.
Distance ratio = peer's L1 / ours, over the peer's valid answers (host-checked with
sklearn). "= ours where proved": queries where the peer proved optimality and its distance
(counterfactual point or objective) equals ours within float32 boundary slack
(`1e-6·max(1,d) + 2·m·ulp32(max|x|)`). Speed-up = peer's median time per query / ours (the
peer's time is its explain call, excluding its set-up; ours is one `counterfactual` call on
built maps). DiCE (random method) optimises no norm and has no proof. Peers run at the same
priority as our engine, one at a time, never concurrently with our timings."""


# -------------------------------------------------------------------------------------------
# part 4 and the summary
# -------------------------------------------------------------------------------------------
def curves(paper_rows: list[dict], peers: dict) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for ds, rs in sorted(_by_dataset(paper_rows).items()):
        built = [r for r in rs if r.get("norms", {}).get("l1", {}).get("mean_ms") is not None]
        if not built:
            continue
        T0 = float(np.mean([r["T0"] for r in built]))
        per = float(np.mean([r["norms"]["l1"]["mean_ms"] for r in built])) / 1e3
        meas = [(50, float(np.mean([r["T50"] for r in built])))]
        if not any(r.get("T1000_extrapolated") for r in built):
            meas.append((1000, float(np.mean([r["T1000"] for r in built]))))
        c = {"cfmaps (ours)": {"setup_s": T0, "per_query_s": per, "measured": meas,
                               "paper": [(50, PAPER[ds]["T50"]), (1000, PAPER[ds]["T1000"])]}}
        for name, p in (peers.get(ds) or {}).get("peers", {}).items():
            s = p.get("summary")
            if not s or s.get("mean_time_s") is None:
                continue
            setup = float((p.get("meta") or {}).get("setup_s") or 0.0)
            n = sum(1 for r in p["records"] if r.get("time_s") is not None)
            entry = {"setup_s": setup, "per_query_s": s["mean_time_s"],
                     "measured": [(n, setup + n * s["mean_time_s"])]}
            if name == "ocean":
                entry["paper"] = [(50, PAPER[ds]["OCEAN_T50"]), (1000, PAPER[ds]["OCEAN_T1000"])]
            c[PEER_LABEL[name]] = entry
        out[ds] = c
    return out


def scaling_table(cv: dict) -> str:
    ns = (1, 50, 1000, 10_000)
    lines = ["| dataset | method | set-up (s) | per query (s) | " + " | ".join(f"N={n:,}" for n in ns)
             + " | paper N=50 / N=1,000 |", "|---|---|---|---|" + "---|" * (len(ns) + 1)]
    for ds, c in cv.items():
        for m, e in c.items():
            tot = " | ".join(_f(e["setup_s"] + n * e["per_query_s"]) for n in ns)
            paper = " / ".join(f"{v:g}" for _, v in e.get("paper", [])) or "-"
            lines.append(f"| {ds} | {m} | {_f(e['setup_s'])} | {_f(e['per_query_s'])} | {tot} | {paper} |")
    return "\n".join(lines)


def summary_lines(results: dict) -> list[str]:
    paper = _by_dataset(results.get("paper", []))
    peers = results.get("peers", {})
    out = []
    for ds in sorted(set(paper) | set(peers)):
        parts = [f"**{ds}**"]
        built = [r for r in paper.get(ds, []) if "T0" in r]
        if built:
            T0 = float(np.mean([r["T0"] for r in built]))
            mixed = max(r.get("mixed", 0) for r in built)
            if mixed:
                secs = built[0]["spec"]["max_seconds"]
                parts.append(f"T0 {T0:.3g} s, build stopped by its budget ({secs:g} s "
                             f"or {_rect_budget(built[0]):,} rectangles) with {mixed:,} mixed regions "
                             f"(searched at query time) vs paper {PAPER[ds]['T0']} s for a complete build")
            else:
                ratio = PAPER[ds]["T0"] / T0
                parts.append(f"T0 {T0:.3g} s vs paper {PAPER[ds]['T0']} s ("
                             + (f"{ratio:.2g}× faster)" if ratio >= 1 else f"{1 / ratio:.2g}× slower)"))
            l1 = [r["norms"]["l1"]["p50_ms"] for r in built if "p50_ms" in r.get("norms", {}).get("l1", {})]
            if l1:
                parts.append(f"l1 query p50 {_ms(float(np.mean(l1)))} ms")
        cmp = peers.get(ds) or {}
        o = our_peer_stats(cmp) if cmp.get("ours") else None
        for name in ("ocean", "treecf"):
            s = (cmp.get("peers", {}).get(name) or {}).get("summary")
            if s and s.get("median_time_s") and o and o["median_time_s"]:
                ours_ms = _ms(o["median_time_s"] * 1e3)
                sp = s["median_time_s"] / o["median_time_s"]
                rel = f"{_f(sp, 3)}× faster" if sp >= 1 else f"{_f(1 / sp, 3)}× SLOWER"
                txt = (f"{rel} per query than {PEER_LABEL[name]} "
                       f"({_f(s['median_time_s'])} s vs {ours_ms} ms, medians; "
                       f"distance = ours on {s['optimal_matched']}/{s['optimal_compared']} proved")
                if s["mismatches"]:
                    txt += f", **{len(s['mismatches'])} MISMATCHES**"
                parts.append(txt + ")")
        s = (cmp.get("peers", {}).get("dice") or {}).get("summary")
        if s and s.get("median_ratio"):
            parts.append(f"DiCE distance {_f(s['median_ratio'])}× ours (median; valid {s['valid']}/{s['n']})")
        out.append(parts[0] + ": " + "; ".join(parts[1:]))
    return out


def machine_lines(env: dict, peers: dict) -> list[str]:
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    pv = {}
    for cmp in peers.values():
        for name, p in cmp.get("peers", {}).items():
            m = p.get("meta") or {}
            pv[name] = ", ".join(f"{k} {m[k]}" for k in ("oceanpy", "ortools", "dice-ml", "treecf", "python")
                                 if m.get(k))
    lines = [
        f"- date: {env['date']}; git at start: `{env['git']}`"
        + (f"; at end: `{env['git_end']}`" if env.get("git_end", env["git"]) != env["git"] else ""),
        f"- machine: {env['nproc']} CPUs ({env['cpu']}), {env['ram_gb']} GB RAM, {env['platform']}",
        f"- load average (1/5/15 min) at start: {env['load_start']}, at end: {env.get('load_end', '-')} "
        "(the machine is shared: other processes may have run during the timings)",
        f"- Python {env['python']}; {vers}",
    ]
    if pv:
        lines.append("- peers: " + "; ".join(f"{PEER_LABEL[k]} ({v})" for k, v in pv.items()))
    return lines


def plan_lines(results: dict) -> list[str]:
    p = results["plan"]
    pp, ss, pe = p["paper"], p["sensitivity"], p["peers"]
    return [
        f"- mode **{results['mode']}**" + "".join(f"; {n}" for n in p.get("notes", [])),
        f"- part 1: datasets {', '.join(pp['datasets'])}; forest seeds per dataset "
        f"{', '.join(f'{k} {v}' for k, v in pp['seeds'].items() if k in pp['datasets'])}; build budget "
        f"{', '.join(f'{k} {v:g} s' for k, v in pp['build_budget'].items() if k in pp['datasets'])}; "
        f"{pp['n_queries']} queries per norm, at most {pp['query_budget']:g} s of queries per norm and "
        f"build; linear scan on the first {pp['n_scan']} queries (seed 0)",
        f"- part 2: {', '.join(ss['datasets'])}; trees {list(ss['trees'])} at depth 5, depth "
        f"{list(ss['depths'])} at 100 trees (seed 0); build budget {ss['build_budget']:g} s; "
        f"{ss['n_queries']} queries per norm, at most {ss['query_budget']:g} s per norm",
        f"- part 3: {', '.join(pe['datasets'])}; queries "
        f"{', '.join(f'{k} {v}' for k, v in pe['n_queries'].items() if k in pe['datasets'])}; OCEAN limit "
        f"{pe['ocean_time_limit']:g} s/query, treecf {pe['treecf_time_limit']:g} s/query",
        "- every build runs in its own subprocess with a hard timeout (3 × budget + query budgets + 2 min)",
    ]


NO_PLOTS = "(no plot: matplotlib is not installed; `pip install -e '.[bench]'`)"


def _plot(fn, *args) -> bool:
    """Draw one figure; without matplotlib the tables are still written."""
    try:
        fn(*args)
    except ImportError:
        return False
    return True


def _rel(out: Path) -> str:
    return os.path.relpath(Path(__file__).resolve().parents[1] / "README.md", out.resolve())


def write(results: dict, out: Path) -> list[str]:
    """Write README.md, suite.json and the PNGs under ``out``; return the summary lines."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps(results, indent=1, default=str))
    summ = summary_lines(results)
    mism = mismatch_lines(results.get("peers", {}))
    md = ["# Benchmark suite results", "",
          f"Command: `{results['command']}` — wall time {results.get('wall_s', 0) / 60:.1f} min "
          f"({results['mode']} mode). Regenerate with the same command; see "
          f"[benchmarks/README.md]({_rel(out)}); the progress log is [run.log](run.log).",
          "", "## Summary", ""]
    md += [f"- {s}" for s in summ] or ["- (nothing ran)"]
    if mism:
        md += ["", "**Distance mismatches with a peer that proved optimality:**", ""]
        md += [f"- {m}" for m in mism]
    elif results.get("peers"):
        md += ["", "No distance mismatch with OCEAN or treecf wherever they proved optimality."]
    md += ["", "Machine and software:", ""] + machine_lines(results["env"], results.get("peers", {}))
    md += ["", "What ran:", ""] + plan_lines(results)
    if results.get("paper"):
        md += ["", "## 1. Paper reproduction: random forests of 100 trees, depth 5", "",
               paper_table(results["paper"]), "", PAPER_NOTES]
    if results.get("sensitivity"):
        ss = results["plan"]["sensitivity"]
        rows = sensitivity_rows(results["sensitivity"])
        md += ["", "## 2. Sensitivity: number of trees (depth 5) and depth (100 trees)", "",
               "Number of trees, depth 5:", "", sensitivity_table(results["sensitivity"], "trees"), "",
               "Depth, 100 trees:", "", sensitivity_table(results["sensitivity"], "depth"), "",
               f"Seed 0, build budget {ss['build_budget']:g} s per configuration (on_budget=\"mixed\"); "
               "rectangles = certified rectangles (mixed regions come on top); latency columns: "
               "median ms per query (answered/asked when the query budget stopped earlier).", ""]
        for axis, fixed in (("trees", 5), ("depth", 100)):
            sel = [r for r in rows if (r["depth"] == fixed if axis == "trees" else r["trees"] == fixed)]
            if len({r[axis] for r in sel}) > 1:
                fn = f"sensitivity_{axis}.png"
                if _plot(plots.sensitivity, sel, axis, out / fn, ss["build_budget"]):
                    md += [f"![sensitivity to {axis}]({fn})", ""]
    if results.get("peers"):
        md += ["## 3. Peers side by side: same forests, same queries", "",
               peers_table(results["peers"]), "", PEER_NOTES, ""]
        notes = [n for c in results["peers"].values() for n in c.get("notes", [])]
        md += [f"- {n}" for n in notes]
    if any(r.get("scan") for r in results.get("paper", [])):
        md += ["", "### Linear scan over all rectangles vs the per-class KD-trees", "",
               scan_table(results["paper"]), "",
               "`maps_core.query.linear_scan` (every certified rectangle, numba) vs one "
               "`counterfactual` call with the same target and default weights; medians over the "
               "queries done within the scan budget (queries column). With mixed regions the scan "
               "skips them, so its distance is only an upper bound: the KD search may be smaller, "
               "never larger.", ""]
    cv = curves(results.get("paper", []), results.get("peers", {}))
    if cv:
        fig = _plot(plots.total_time, cv, out / "total_time.png")
        md += ["## 4. Total time vs number of counterfactuals", "",
               scaling_table(cv), "", "![total time](total_time.png)" if fig else NO_PLOTS, "",
               "Ours: measured T0 (mean over seeds) + N × measured mean l1 query time (part 1); peers: "
               "measured set-up + N × measured mean time per query (part 3). Everything beyond the "
               "measured points is a **linear extrapolation**; peers were measured on "
               "the first test rows only (part 3), ours on the part-1 query set.", ""]
    (out / "README.md").write_text("\n".join(md) + "\n")
    return summ + mism
