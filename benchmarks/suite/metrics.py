"""Numbers derived from worker results: T50/T1000, latency percentiles, build status."""

from __future__ import annotations

import numpy as np


def condense(res: dict) -> dict:
    """Replace per-query time lists by their statistics (keeps the saved JSON small) and
    add T50 / T1000 (build + the first 50 / 1000 l1 queries; extrapolated from the mean
    query time when the query budget stopped earlier)."""
    for norm, r in (res.get("norms") or {}).items():
        t = np.asarray(r.pop("times", []), dtype=float)
        if t.size == 0:
            continue
        r.update(
            p50_ms=float(np.median(t) * 1e3),
            p99_ms=float(np.percentile(t, 99) * 1e3),
            mean_ms=float(t.mean() * 1e3),
            max_ms=float(t.max() * 1e3),
            sum_s=float(t.sum()),
            sum50_s=float(t[:50].sum()),
        )
        if norm == "l1" and "T0" in res:
            res["T50"], res["T50_extrapolated"] = _total(res["T0"], t, 50)
            res["T1000"], res["T1000_extrapolated"] = _total(res["T0"], t, 1000)
    return res


def _total(T0: float, t: np.ndarray, n: int) -> tuple[float, bool]:
    if t.size >= n:
        return float(T0 + t[:n].sum()), False
    return float(T0 + t.sum() + (n - t.size) * t.mean()), True


def status(res: dict) -> str:
    """'ok', 'budget exceeded: N mixed regions', 'hard timeout ...' or 'error ...'."""
    if res.get("timed_out"):
        where = "during the build" if res.get("stage") == "start" else f"after stage {res.get('stage')}"
        return f"hard timeout ({res.get('hard_timeout_s', 0):.0f} s) {where}"
    if "T0" not in res:
        return f"error: {str(res.get('error', 'no build'))[:120]}"
    s = "ok"
    if res.get("mixed", 0) > 0 or res.get("budget_exhausted"):
        s = f"budget exceeded: {res.get('mixed', 0):,} mixed regions"
    if res.get("error"):
        s += f"; error after the build: {str(res['error'])[:100]}"
    return s


def queries_note(res: dict, norm: str = "l1") -> str:
    r = (res.get("norms") or {}).get(norm)
    if not r:
        return "-"
    return f"{r['n']}/{r['n_total']}"


def mean_sd(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0
