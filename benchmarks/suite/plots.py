"""PNG figures (matplotlib, Agg backend): sensitivity (paper Figs. 5 and 6) and total time
against the number of counterfactuals (paper Fig. 4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

COLORS = {"CP": "tab:blue", "BC": "tab:red", "FI": "tab:green", "PD": "tab:purple"}
PEER_STYLE = {"cfmaps (ours)": ("tab:blue", "-"), "OCEAN": ("tab:red", "--"),
              "treecf": ("tab:green", "-."), "DiCE": ("tab:orange", ":")}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sensitivity(rows: list[dict], axis: str, path: Path, budget: float) -> Path:
    """Build time and rectangles against ``axis`` ('trees' or 'depth'), log scale.
    Builds stopped by their budget are drawn hollow (their rectangle count is a lower bound
    and their mixed regions are shown beside)."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for ds in sorted({r["dataset"] for r in rows}):
        rs = sorted((r for r in rows if r["dataset"] == ds and r.get("T0") is not None),
                    key=lambda r: r[axis])
        if not rs:
            continue
        x = [r[axis] for r in rs]
        c = COLORS.get(ds, "k")
        a1.plot(x, [r["T0"] for r in rs], "-", color=c, label=ds)
        a2.plot(x, [max(r["rectangles"], 1) for r in rs], "-", color=c, label=ds)
        a2.plot(x, [max(r["rectangles"] + r["mixed"], 1) if r["mixed"] else np.nan for r in rs],
                ":", color=c, alpha=0.6)
        for r in rs:
            full = not r["mixed"]
            kw = {"color": c, "markerfacecolor": c if full else "white", "markersize": 7}
            a1.plot(r[axis], r["T0"], "o", **kw)
            a2.plot(r[axis], max(r["rectangles"], 1), "o", **kw)
    a1.axhline(budget, color="grey", ls="--", lw=0.8)
    a1.text(0.01, budget, f"budget {budget:g} s", va="bottom", fontsize=8, color="grey",
            transform=a1.get_yaxis_transform())
    a1.set_ylabel("build time T0 (s)")
    a2.set_ylabel("certified rectangles")
    fixed = "depth 5" if axis == "trees" else "100 trees"
    for a in (a1, a2):
        a.set_yscale("log")
        a.set_xlabel("number of trees" if axis == "trees" else "maximum depth")
        if axis == "trees":
            a.set_xscale("log")
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    fig.suptitle(f"Sensitivity to the {'number of trees' if axis == 'trees' else 'depth'} ({fixed}); "
                 "hollow: build stopped by its budget (dotted: + mixed regions)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def total_time(curves: dict[str, dict[str, dict]], path: Path, n_max: int = 10_000) -> Path:
    """``curves[dataset][method] = {setup_s, per_query_s, measured: [(n, total)], paper: ...}``.
    Lines are setup + n * per-query time (extrapolated linearly); markers are measured."""
    plt = _plt()
    names = list(curves)
    cols = min(2, len(names)) or 1
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    n = np.unique(np.logspace(0, np.log10(n_max), 60).astype(int))
    for ax, ds in zip(axes.flat, names, strict=False):
        for method, c in curves[ds].items():
            color, ls = PEER_STYLE.get(method, ("k", "-"))
            ax.plot(n, c["setup_s"] + n * c["per_query_s"], ls, color=color, label=method)
            for nx, tot in c.get("measured", []):
                ax.plot(nx, tot, "o", color=color)
            for nx, tot in c.get("paper", []):
                ax.plot(nx, tot, "s", color=color, markerfacecolor="white", markersize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(ds)
        ax.set_xlabel("number of counterfactuals")
        ax.set_ylabel("total time (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.suptitle("Total time (build + queries). Lines: linear extrapolation of measured per-query "
                 "times (+ our T0);\nfilled dots: measured; hollow squares: the paper's T50/T1000 "
                 "(CF-Maps blue, OCEAN red)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
