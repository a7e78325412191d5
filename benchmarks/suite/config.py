"""Suite modes (quick / default / full), budgets, and the paper's figures (method.md §5)."""

from __future__ import annotations

from dataclasses import dataclass, field

DATASETS = ("BC", "CP", "FI", "PD")
NORMS = ("l1", "l2", "linf")

# Counterfactual Maps paper, random forests of 100 trees of depth 5 (method.md §5);
# paper hardware: AMD EPYC 7532 2.4 GHz. Seconds.
PAPER = {
    "BC": {"T0": 8.8, "T50": 9.6, "T1000": 14.1, "OCEAN_T50": 104.2, "OCEAN_T1000": 1367.6},
    "CP": {"T0": 0.3, "T50": 0.3, "T1000": 0.9, "OCEAN_T50": 55.8, "OCEAN_T1000": 993.4},
    "FI": {"T0": 1.6, "T50": 1.8, "T1000": 4.2, "OCEAN_T50": 119.6, "OCEAN_T1000": 2214.6},
    "PD": {"T0": 234.4, "T50": 235.1, "T1000": 245.8, "OCEAN_T50": 787.5, "OCEAN_T1000": 12664.0},
}
PAPER_LATENCY_NOTE = ("paper: a few ms (CP) to a few tens of ms (BC) per query, L1 slowest, "
                      "Linf fastest")

SPLIT_SEED = 0  # train/test split (80/20) is the same for every seed; the seed is the forest's


@dataclass(frozen=True)
class PaperPlan:
    """Part 1: 100 trees of depth 5 per dataset, several forest seeds."""

    datasets: tuple[str, ...]
    seeds: dict[str, int]            # number of forest seeds (random_state 0..n-1) per dataset
    build_budget: dict[str, float]   # max_seconds per build
    n_queries: int                   # test rows topped up with uniform legal samples
    query_budget: float              # seconds per norm per build (the rest is extrapolated)
    n_scan: int                      # queries timed again by linear scan, per norm
    scan_budget: float               # seconds per norm for the linear-scan comparison


@dataclass(frozen=True)
class SensitivityPlan:
    """Part 2: trees at depth 5, depth at 100 trees."""

    datasets: tuple[str, ...]
    trees: tuple[int, ...]
    depths: tuple[int, ...]
    build_budget: float
    n_queries: int
    query_budget: float


@dataclass(frozen=True)
class PeerPlan:
    """Part 3: OCEAN, DiCE, treecf on the seed-0 forests of part 1, first test rows."""

    datasets: tuple[str, ...]
    n_queries: dict[str, int]
    ocean_time_limit: float
    treecf_time_limit: float
    peers: tuple[str, ...] = ("ocean", "treecf", "dice")


@dataclass(frozen=True)
class Mode:
    name: str
    paper: PaperPlan
    sensitivity: SensitivityPlan
    peers: PeerPlan
    notes: list[str] = field(default_factory=list)


def _per(value, datasets=DATASETS, **over):
    d = {k: value for k in datasets}
    d.update(over)
    return d


QUICK = Mode(
    name="quick",
    paper=PaperPlan(("CP", "FI"), _per(1), _per(30.0), n_queries=200, query_budget=10.0, n_scan=20,
                    scan_budget=5.0),
    sensitivity=SensitivityPlan(("CP",), trees=(3, 10, 100), depths=(3, 5, 7), build_budget=20.0,
                                n_queries=50, query_budget=5.0),
    peers=PeerPlan(("CP", "FI"), _per(5), ocean_time_limit=20.0, treecf_time_limit=20.0),
    notes=["quick mode: CP and FI only, 1 seed, 200 queries, sensitivity on CP with 5 "
           "configurations, 5 peer queries per dataset"],
)

DEFAULT = Mode(
    name="default",
    paper=PaperPlan(DATASETS, _per(5, PD=1), _per(120.0, PD=60.0), n_queries=1000,
                    query_budget=45.0, n_scan=100, scan_budget=15.0),
    sensitivity=SensitivityPlan(("CP", "BC"), trees=(3, 5, 7, 10, 50, 100), depths=(3, 5, 7, 10),
                                build_budget=60.0, n_queries=200, query_budget=10.0),
    peers=PeerPlan(DATASETS, _per(20), ocean_time_limit=20.0, treecf_time_limit=20.0),
    notes=["default mode: PD 1 forest seed (the slow build; budget 60 s), 5 seeds elsewhere; "
           "every build also stops at 5M rectangles; "
           "`--full` runs 5 seeds everywhere with larger budgets"],
)

FULL = Mode(
    name="full",
    paper=PaperPlan(DATASETS, _per(5), _per(600.0), n_queries=1000, query_budget=300.0, n_scan=1000,
                    scan_budget=120.0),
    sensitivity=SensitivityPlan(("CP", "BC"), trees=(3, 5, 7, 10, 50, 100), depths=(3, 5, 7, 10),
                                build_budget=300.0, n_queries=1000, query_budget=60.0),
    peers=PeerPlan(DATASETS, _per(50), ocean_time_limit=60.0, treecf_time_limit=60.0),
    notes=["full mode: 5 seeds everywhere, 600 s build budget, 50 peer queries, 60 s peer limits"],
)

MODES = {"quick": QUICK, "default": DEFAULT, "full": FULL}
