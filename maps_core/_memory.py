"""Memory budgets of a build and of a query, in bytes, and the memory and processors a
process may count on.

A build's memory grows with the rectangles it certifies and the regions it leaves mixed,
and each costs in proportion to the number of features: its cell ranges (int32) through
extraction and sibling merging, the per-class KD-trees (float64 node bounds, one node per
three to four entries; a rectangle's real bounds are read through the grid, never copied)
and the compacted copies saving writes. Measured peak growth over the process's baseline
(``ru_maxrss``, build then save, this 2-core machine, scikit-learn models on the loan data;
rectangles and mixed regions counted together):

===========================  ====  ===========  ================  =====================
model                        m     boxes        peak growth       bytes / box / m
===========================  ====  ===========  ================  =====================
Credit GB 100x3              28    0.10M        60 MB             21.8
Credit GB 100x3              28    1.02M        749 MB            27.4
Credit RF 100x5              28    0.41M        292 MB            26.5
Credit RF 200x8              28    0.27M        212 MB            29.8
Adult GB 100x3               41    0.61M        628 MB            26.4
RF 20x5, Gaussian features   1000  3,738        74 MB             20.8
===========================  ====  ===========  ================  =====================

(Until the KD-trees read the grid instead of float64 copies of every rectangle's bounds,
the peak was 64-68 bytes per box and feature, in the index's temporaries.) So
:func:`rectangles_within` allows ``max_memory / (BYTES_PER_RECTANGLE_FEATURE * m +
BYTES_PER_RECTANGLE)`` boxes, the constants at least 1.38x the measured peaks on these
models (the growth is the build's own: the process's baseline, the model and its
training data are not counted).

A query's memory is the boxes of mixed regions its search holds while they wait in its
queue: :func:`bytes_per_box` each (cell ranges, the node each tree has reached, the summed
values of the trees already decided, a heap entry). Their arrays never grow past what
:func:`boxes_within` allows for the query's budget; a search that would need more stops
(:class:`~maps_core.exceptions.BudgetExceededError`, or the best found). A hard query on
Credit RF 200x8 held 209,000 boxes (223 MB) after 500,000 pops; the search's arrays grow by
doubling (up to the budget), and while they grow the old copy is held too, so the process
may briefly take half as much again.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = [
    "BYTES_PER_ENTRY",
    "BYTES_PER_ENTRY_FEATURE",
    "BYTES_PER_RECTANGLE",
    "BYTES_PER_RECTANGLE_FEATURE",
    "available_memory",
    "boxes_within",
    "bytes_per_box",
    "default_build_memory",
    "default_query_memory",
    "free_memory",
    "rectangles_within",
    "usable_cpus",
]

#: Peak bytes per box (rectangle or mixed region) and feature (measured 21-30, see the
#: module docs).
BYTES_PER_RECTANGLE_FEATURE = 32
#: Peak bytes per rectangle whatever the number of features (labels, ids, slack).
BYTES_PER_RECTANGLE = 256
#: Peak bytes per extra KD-tree entry and feature: a mixed region is indexed under every
#: class, so past two classes each class adds an entry (about a third of a node of two
#: float64 bounds per feature, 5.3 bytes) ...
BYTES_PER_ENTRY_FEATURE = 6
#: ... and its node links and place in the order (16 bytes).
BYTES_PER_ENTRY = 16
#: The smallest rectangle budget a memory budget yields: a build always gets started.
MIN_RECTANGLES = 1_000


def rectangles_within(max_memory: int, n_features: int, n_classes: int = 2) -> int:
    """The most boxes (rectangles and mixed regions) a build on ``n_features`` features
    and ``n_classes`` classes may hold within ``max_memory`` bytes of growth (at least
    :data:`MIN_RECTANGLES`). Past two classes every box is priced as a mixed region, with
    an index entry per class: how many stay mixed is known only at the end."""
    m = max(1, n_features)
    per = (BYTES_PER_RECTANGLE_FEATURE * m + BYTES_PER_RECTANGLE
           + max(0, n_classes - 2) * (BYTES_PER_ENTRY_FEATURE * m + BYTES_PER_ENTRY))
    return max(MIN_RECTANGLES, int(max_memory) // per)


def bytes_per_box(n_features: int, n_trees: int, n_classes: int) -> int:
    """Bytes one pending box of a query's search takes: its cell ranges (two int32 per
    feature), the node each tree has reached (int32 per tree), the summed leaf values of
    the decided trees (float64 per class), its free-list entry and its heap entry."""
    return 8 * n_features + 4 * n_trees + 8 * n_classes + 24


def boxes_within(max_memory: int, n_features: int, n_trees: int, n_classes: int) -> int:
    """The most boxes a query's search may hold at once within ``max_memory`` bytes."""
    return int(max_memory) // bytes_per_box(n_features, n_trees, n_classes)


def _cgroup_limit(root: Path) -> int | None:
    """The memory limit of the cgroup this process runs in (v2 ``memory.max`` or v1
    ``memory.limit_in_bytes`` under ``root``), None when unlimited or unknown."""
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (root / name).read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        # cgroup v1 reports "no limit" as a huge page-aligned number
        return value if value < 1 << 60 else None
    return None


def available_memory(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup") -> int:
    """Bytes this process may count on: the machine's physical memory, or its container's
    cgroup limit when that is smaller."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit(Path(cgroup_root))
    return min(physical, limit) if limit is not None else physical


@functools.cache
def usable_cpus(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup") -> int:
    """Processors this process may count on (at least 1): those it may run on, or its
    container's cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``, rounded down) when that is fewer. Read once per process."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _cgroup_cpus(Path(cgroup_root))
    return max(1, min(cpus or 1, quota) if quota is not None else cpus or 1)


def _cgroup_cpus(root: Path) -> int | None:
    """Whole processors of the cgroup CPU quota under ``root``, None when unlimited or
    unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) // int(period)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
        period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        return int(quota) // int(period) if int(quota) > 0 else None
    except (OSError, ValueError, ZeroDivisionError):
        return None


def free_memory(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup") -> int | None:
    """Bytes this process could still take now, None when unknown: its container's cgroup
    limit less what the cgroup holds (v2 ``memory.current``, v1 ``memory.usage_in_bytes``)
    other than the page cache the kernel can drop (``inactive_file``), or, without a
    limit, the machine's ``MemAvailable``."""
    root = Path(cgroup_root)
    limit = _cgroup_limit(root)
    if limit is not None:
        for usage, stat, key in (("memory.current", "memory.stat", "inactive_file"),
                                 ("memory/memory.usage_in_bytes", "memory/memory.stat",
                                  "total_inactive_file")):
            try:
                used = int((root / usage).read_text().strip())
            except (OSError, ValueError):
                continue
            return max(0, limit - max(0, used - _stat_value(root / stat, key)))
        return None
    return _stat_value(Path("/proc/meminfo"), "MemAvailable:", scale=1024) or None


def _stat_value(path: Path, key: str, scale: int = 1) -> int:
    """The number after ``key`` on its line of a ``key value`` file (0 when absent)."""
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == key:
                return int(parts[1]) * scale
    except (OSError, ValueError):
        pass
    return 0


def default_build_memory() -> int:
    """The memory budget of a build given none (bytes): half of :func:`available_memory`,
    the service's own default for one build at a time (``CFMAPS_BUILD_MAX_MEMORY``), or
    half of what is free when the build starts (:func:`free_memory`) when that is less.
    In a container the processes already there count: with 2 API workers taking 588 MB of
    a 1000 MiB limit, half the limit was more than was left, and the build was killed by
    the OS three times over."""
    free = free_memory()
    half = available_memory() // 2
    return min(half, free // 2) if free is not None else half


#: The share of :func:`available_memory` one query may hold by default: eight queries at
#: their limit take what a build may (:func:`default_build_memory`).
QUERY_MEMORY_SHARE = 16


@functools.cache
def default_query_memory() -> int:
    """The memory budget of one query's search given none (bytes): a sixteenth of
    :func:`available_memory` (1.5 GB on a 24 GB machine, 128 MB in a 2 GB container).
    Read once per process: reading the cgroup files took about 90 us, more than a whole
    query on the paper's maps."""
    return available_memory() // QUERY_MEMORY_SHARE
