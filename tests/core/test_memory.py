"""Memory budgets: bytes a build may grow by, and the memory a process may count on."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier

import maps_core._memory
from maps_core import BudgetExceededError, CounterfactualMaps, available_memory, default_build_memory
from maps_core._memory import (
    BYTES_PER_RECTANGLE,
    BYTES_PER_RECTANGLE_FEATURE,
    MIN_RECTANGLES,
    _cgroup_limit,
    rectangles_within,
)
from tests.conftest import synthetic


def test_rectangles_within_scales_with_features() -> None:
    per28 = BYTES_PER_RECTANGLE_FEATURE * 28 + BYTES_PER_RECTANGLE
    assert rectangles_within(1 << 30, 28) == (1 << 30) // per28
    assert rectangles_within(1 << 30, 41) < rectangles_within(1 << 30, 28)
    assert rectangles_within(1, 28) == MIN_RECTANGLES  # a build always starts


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({"memory.max": "max\n"}, None),
        ({"memory.max": "2147483648\n"}, 2147483648),
        ({"memory/memory.limit_in_bytes": "1073741824\n"}, 1073741824),
        ({"memory/memory.limit_in_bytes": str(2**63 - 4096)}, None),  # cgroup v1: unlimited
        ({"memory.max": "garbage"}, None),
        ({}, None),
    ],
)
def test_cgroup_limits(tmp_path: Path, files: dict[str, str], want: int | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cgroup_limit(tmp_path) == want


def test_available_memory_takes_the_smaller_of_machine_and_cgroup(tmp_path: Path) -> None:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert available_memory(tmp_path) == physical  # no cgroup files: the machine
    (tmp_path / "memory.max").write_text(str(512 << 20))
    assert available_memory(tmp_path) == 512 << 20
    (tmp_path / "memory.max").write_text(str(physical * 2))
    assert available_memory(tmp_path) == physical


@pytest.mark.parametrize("v1", [False, True], ids=["cgroup-v2", "cgroup-v1"])
def test_free_memory_counts_what_the_container_already_holds(tmp_path: Path, v1: bool) -> None:
    """The container's limit less what its processes hold, the page cache the kernel can
    drop aside; the default build budget is half of that when it is less than half the
    limit (the QA's container: 2 API workers held 588 MB of 1000 MiB, and a build given half
    the limit was killed by the OS)."""
    limit, used, cache = 1000 << 20, 588 << 20, 100 << 20
    files = ({"memory/memory.limit_in_bytes": limit, "memory/memory.usage_in_bytes": used,
              "memory/memory.stat": f"cache 1\ntotal_inactive_file {cache}\n"} if v1 else
             {"memory.max": limit, "memory.current": used,
              "memory.stat": f"anon 1\ninactive_file {cache}\n"})
    for name, value in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"{value}\n")
    assert maps_core._memory.free_memory(tmp_path) == limit - (used - cache)
    (tmp_path / ("memory/memory.stat" if v1 else "memory.stat")).unlink()  # no stat: all used
    assert maps_core._memory.free_memory(tmp_path) == limit - used


def test_default_build_memory_is_half_of_what_is_free_when_that_is_less(
        monkeypatch: pytest.MonkeyPatch) -> None:
    half = available_memory() // 2
    monkeypatch.setattr(maps_core._memory, "free_memory", lambda: 412 << 20)
    assert default_build_memory() == 206 << 20
    monkeypatch.setattr(maps_core._memory, "free_memory", lambda: 4 * half)
    assert default_build_memory() == half
    monkeypatch.setattr(maps_core._memory, "free_memory", lambda: None)  # unknown
    assert default_build_memory() == half


@pytest.fixture(scope="module")
def forest():
    """A forest whose complete partition holds ~170k rectangles (0.6 s to build)."""
    X, y = synthetic(2, 5, 4)
    model = RandomForestClassifier(n_estimators=30, max_depth=5, random_state=0).fit(X, y)
    return model, X, CounterfactualMaps.build(model)


def test_a_small_memory_budget_keeps_mixed_regions_and_exact_answers(forest) -> None:
    model, X, full = forest
    assert full.stats.mixed_regions == 0
    # one byte: the smallest rectangle budget; below the complete partition's size
    assert sum(full.stats.rectangles_per_class) > MIN_RECTANGLES
    part = CounterfactualMaps.build(model, max_memory=1)
    assert part.stats.mixed_regions > 0
    # the budget counts every box the maps hold, and holds exactly
    assert sum(part.stats.rectangles_per_class) + part.stats.mixed_regions == MIN_RECTANGLES
    rng = np.random.default_rng(1)
    P = np.vstack([X, rng.normal(scale=2, size=(5000, X.shape[1]))])
    assert np.array_equal(part.predict(P), model.predict(P))
    for norm in ("l1", "l2", "linf"):
        for a, b in zip(part.counterfactuals(X[:20], norm=norm), full.counterfactuals(X[:20], norm=norm),
                        strict=True):
            assert a.best.distance == pytest.approx(b.best.distance, abs=1e-12)
            assert model.predict(a.best.x[None])[0] == a.target


def test_a_build_given_no_budget_counts_on_half_the_memory(forest, monkeypatch) -> None:
    """Without max_memory a build still has a memory budget: half of what the process may
    count on (a 40x5 forest on 8 continuous features grew to 24 GB and was killed by the
    OS before this default). Here that memory is made tiny, so the build stops early and
    keeps mixed regions, with the same answers."""
    model, X, full = forest
    assert default_build_memory() <= available_memory() // 2  # less when less is free
    monkeypatch.setattr(maps_core._memory, "free_memory", lambda: None)
    assert default_build_memory() == available_memory() // 2
    monkeypatch.setattr(maps_core._memory, "available_memory", lambda: 2)  # a 1-byte budget
    part = CounterfactualMaps.build(model)
    assert part.stats.mixed_regions > 0
    assert sum(part.stats.rectangles_per_class) + part.stats.mixed_regions == MIN_RECTANGLES
    for a, b in zip(part.counterfactuals(X[:10]), full.counterfactuals(X[:10]), strict=True):
        assert a.best.distance == pytest.approx(b.best.distance, abs=1e-12)


def test_a_memory_budget_can_refuse_instead(forest) -> None:
    model, _, _ = forest
    with pytest.raises(BudgetExceededError,
                       match=r"memory \(1 bytes: 1,000 rectangles and mixed regions on 5 features\)"):
        CounterfactualMaps.build(model, max_memory=1, on_budget="error")
    # a generous budget changes nothing
    big = CounterfactualMaps.build(model, max_memory=1 << 40, on_budget="error")
    assert big.stats.mixed_regions == 0


def test_the_memory_budget_counts_the_regions_left_mixed() -> None:
    """On a wide model most regions split rather than certify: counting the rectangles
    alone, a 300 MB budget on 1,000 features grew by 1.9 GB (16,776 mixed regions held
    beside 100 rectangles). The regions left mixed cost as much, and count too; the share
    of the grid done, past float64's count of cells, was a NaN progress."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 1000))
    y = (X[:, :5].sum(axis=1) + rng.normal(size=600) > 0).astype(int)
    model = RandomForestClassifier(20, max_depth=5, random_state=0).fit(X, y)
    budget = 40_000_000
    cap = rectangles_within(budget, 1000)
    seen: list[float] = []
    maps = CounterfactualMaps.build(model, max_memory=budget, progress=seen.append)
    boxes = sum(maps.stats.rectangles_per_class) + maps.stats.mixed_regions
    assert maps.stats.mixed_regions > 0 and boxes <= cap, (boxes, cap)
    assert seen and all(0.0 <= v <= 1.0 for v in seen), seen
    P = np.vstack([X[:200], rng.normal(scale=3, size=(300, 1000))])
    assert np.array_equal(maps.predict(P), model.predict(P))
    for r in maps.counterfactuals(X[:3], norm="linf"):
        assert model.predict(r.best.x[None])[0] == r.target


def test_past_two_classes_a_box_is_priced_with_an_index_entry_per_class() -> None:
    """A mixed region is indexed under every class (each entry a third of a node of two
    float64 bounds per feature, plus links), and how many regions stay mixed is known
    only at the end: past two classes every box is priced as one."""
    from maps_core._memory import BYTES_PER_ENTRY, BYTES_PER_ENTRY_FEATURE

    budget = 1 << 30
    assert rectangles_within(budget, 28, 2) == rectangles_within(budget, 28)
    per10 = (BYTES_PER_RECTANGLE_FEATURE * 28 + BYTES_PER_RECTANGLE
             + 8 * (BYTES_PER_ENTRY_FEATURE * 28 + BYTES_PER_ENTRY))
    assert rectangles_within(budget, 28, 10) == budget // per10
    assert rectangles_within(budget, 28, 3) < rectangles_within(budget, 28, 2)
