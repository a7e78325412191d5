"""One search in several parts at once (``SearchBudget.threads``): each part searches every
n-th mixed region and the parts share the nearest target met. The answers must be those of
one part, exactly, under every budget; only the time and the counters may differ."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier

import maps_core._clock
import maps_core.engine
import maps_core.query
from maps_core import (
    BudgetExceededError,
    CounterfactualMaps,
    InvalidQueryError,
    QueryCancelledError,
)
from maps_core._memory import _cgroup_cpus, bytes_per_box, usable_cpus
from maps_core._norms import L1, LINF
from maps_core.engine import PACE_WEIGHT
from tests.brute_force import brute_force
from tests.conftest import region_end_points, synthetic


@pytest.fixture
def always_parts(monkeypatch):
    """Every search of k = 1 in parts, however short (the default waits for long ones);
    the list of the searches run in parts (their numbers of parts)."""
    monkeypatch.setattr(maps_core.query, "PARALLEL_SHARE", 0.0)
    calls: list[int] = []
    real = maps_core.query._run_parts
    monkeypatch.setattr(maps_core.query, "_run_parts",
                        lambda *a: calls.append(a[4]) or real(*a))
    return calls


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_parts_give_the_answers_of_one(mixed_forest, norm, threads, always_parts):
    """In 2, 3 or 5 parts, every answer is one part's (same distance, bit for bit) and the
    complete maps', valid by the model up to its region's ends; the parts together search
    the regions (boxes are popped)."""
    model, X, full, part = mixed_forest
    assert part.stats.mixed_regions > 10
    refined = 0
    for x in X[:30]:
        got = part.counterfactual(x, norm=norm, threads=threads)
        one = part.counterfactual(x, norm=norm, threads=1)
        want = full.counterfactual(x, norm=norm)
        assert got.best.distance == one.best.distance
        assert got.best.distance == pytest.approx(want.best.distance, abs=1e-12)
        assert got.optimal and got.lower_bound == got.best.distance
        assert model.predict(got.best.x[None])[0] == got.target
        edges = region_end_points(got.best.region, got.best.x)
        if len(edges):
            assert (model.predict(edges) == got.target).all()
        refined += got.stats.regions_refined
    assert refined > 0
    assert always_parts == [threads] * 30


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_parts_match_brute_force_with_a_target(norm, always_parts):
    """Three classes, a named target: the parts' distance is the infimum over the cells
    labelled by the model's own predict."""
    X, y = synthetic(3, 3, 5)
    model = RandomForestClassifier(n_estimators=12, max_depth=4, random_state=1).fit(X, y)
    maps = CounterfactualMaps.build(model, max_rectangles=3)
    w = np.ones(3)
    checked = 0
    for x in X[:12]:
        pred = int(model.predict(x[None])[0])
        target = (pred + 1) % 3
        got = maps.counterfactual(x, target, norm=norm, threads=3, weights=w)
        want = brute_force(model, x, target, w, norm)
        assert got.best.distance == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert model.predict(got.best.x[None])[0] == target
        checked += 1
    assert checked == 12 and always_parts == [3] * 12


@pytest.mark.usefixtures("always_parts")
def test_parts_keep_to_the_budgets(mixed_forest):
    """In 3 parts, each part pops at most ``max_boxes`` boxes and the parts' shares of
    ``max_memory`` sum to it: a search holds at most what it allows, completes with the
    exact answer or stops with BudgetExceededError, and, asked for the best found, answers
    validly with a lower bound no greater than the optimum."""
    model, X, full, part = mixed_forest
    eng = part.engine
    per_box = bytes_per_box(eng.grid.n_features, len(eng.kernel.roots), len(eng.classes))
    stopped = answered = 0
    for x in X[:20]:
        want = full.counterfactual(x, norm="l1").best.distance
        pops = part.counterfactual(x, norm="l1", threads=3).stats.regions_refined
        for max_boxes in (1, max(1, pops // 3), 4 * pops + 10):
            try:
                r = part.counterfactual(x, norm="l1", threads=3, max_boxes=max_boxes)
            except BudgetExceededError as exc:
                assert "max_boxes" in str(exc)
                stopped += 1
            else:
                assert r.stats.regions_refined <= 3 * max_boxes
                assert r.best.distance == pytest.approx(want, abs=1e-12)
                answered += 1
            best = part.counterfactual(x, norm="l1", threads=3, max_boxes=max_boxes,
                                       on_budget="best")
            assert best.stats.regions_refined <= 3 * max_boxes
            assert model.predict(best.best.x[None])[0] == best.target
            assert best.lower_bound <= want * (1 + 1e-12) <= best.best.distance * (1 + 1e-12)
            assert not best.optimal or best.best.distance == pytest.approx(want, abs=1e-12)
        for boxes in (1, 3, 8):
            try:
                r = part.counterfactual(x, norm="l1", threads=3, max_memory=boxes * per_box)
            except BudgetExceededError as exc:
                assert "max_memory" in str(exc)
                continue
            assert r.stats.peak_boxes <= boxes
            assert r.best.distance == pytest.approx(want, abs=1e-12)
    assert stopped > 0 and answered > 0, (stopped, answered)


def test_long_searches_switch_to_parts(mixed_forest, monkeypatch):
    """A set of maps' searches under one norm run in one part until at least
    ``PARALLEL_SHARE`` of the recent ones popped ``PARALLEL_AFTER`` boxes or more, then in
    ``threads`` parts, and in one again once most are short; never with ``threads=1`` or
    ``k > 1``, nor under another norm whose searches are short."""
    model, X, _, _ = mixed_forest
    maps = CounterfactualMaps.build(model, max_rectangles=5)  # a fresh pace
    calls = []
    real = maps_core.query._run_parts
    monkeypatch.setattr(maps_core.query, "_run_parts",
                        lambda *a: calls.append(a[4]) or real(*a))
    monkeypatch.setattr(maps_core.query, "PARALLEL_AFTER", 10)
    first = maps.counterfactual(X[0], threads=2)
    assert calls == [] and first.stats.regions_refined > 0
    pace = maps.engine.pace
    assert first.stats.regions_refined >= 10  # a long search: one of the last 16 or so
    assert pace.long[L1] == pytest.approx(PACE_WEIGHT)
    assert 0 < pace.seconds[L1] <= first.stats.seconds * PACE_WEIGHT
    assert pace.long[LINF] == pace.seconds[LINF] == 0
    while pace.long[L1] < 0.5:
        maps.counterfactual(X[0], threads=1, k=2)
        pace.record(L1, 10_000, 1.0, 10)  # as after long searches
    assert calls == []
    maps.counterfactual(X[1], threads=1)
    maps.counterfactual(X[1], k=2, threads=2)
    maps.counterfactual(X[1], threads=2, norm="linf")
    assert calls == []
    maps.counterfactual(X[1], threads=2)
    assert calls == [2]
    while pace.long[L1] >= 0.5:
        pace.record(L1, 0, 1e-4, 10)  # as after short searches
    maps.counterfactual(X[1], threads=2)
    assert calls == [2]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "2", 65])
def test_threads_must_be_a_positive_integer_within_the_limit(mixed_forest, bad):
    _, X, _, part = mixed_forest
    with pytest.raises(InvalidQueryError, match="threads") as exc:
        part.counterfactual(X[0], threads=bad)
    assert exc.value.field == "threads"


@pytest.mark.parametrize(("files", "want"), [
    ({"cpu.max": "150000 100000\n"}, 1),
    ({"cpu.max": "400000 100000\n"}, 4),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "50000 100000\n"}, 0),
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.max": "garbage\n"}, None),
    ({}, None),
])
def test_cgroup_cpu_quota(tmp_path, files, want):
    """Whole processors of a container's CPU quota (cgroup v2 or v1), None without one."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cgroup_cpus(tmp_path) == want
    usable_cpus.cache_clear()
    try:
        n = usable_cpus(tmp_path)
        assert n >= 1
        if want:
            assert n <= want
    finally:
        usable_cpus.cache_clear()


def test_long_batches_deal_their_rows_out(mixed_forest, monkeypatch):
    """A batch whose rows are expected to take ``PARALLEL_SECONDS`` or more is answered in
    ``threads`` threads of at least ``PARALLEL_ROWS`` rows each, with the answers, regions
    and budgets of one thread; a short one in one call."""
    model, X, _, part = mixed_forest
    calls = []
    real = maps_core.query._batch

    def counted(A, *args):
        calls.append(A.shape[0])
        return real(A, *args)

    monkeypatch.setattr(maps_core.query, "_batch", counted)
    rows = X[:2 * maps_core.query.PARALLEL_ROWS + 3]
    one = part.counterfactuals(rows, norm="l2", threads=1)
    assert calls == [len(rows)]
    monkeypatch.setattr(maps_core.query, "PARALLEL_SECONDS", 0.0)
    calls.clear()
    two = part.counterfactuals(rows, norm="l2", threads=2)
    assert sorted(calls) == [len(rows) // 2, len(rows) - len(rows) // 2]
    for a, b in zip(one, two, strict=True):
        assert a.best.distance == b.best.distance
        assert np.array_equal(a.best.x, b.best.x)
        assert np.array_equal(a.best.region.lower, b.best.region.lower)
        assert np.array_equal(a.best.region.upper, b.best.region.upper)
        assert a.optimal and b.optimal
        assert a.stats.regions_refined == b.stats.regions_refined
    calls.clear()
    part.counterfactuals(rows[:2 * maps_core.query.PARALLEL_ROWS - 1], norm="l2", threads=2)
    assert len(calls) == 1  # too few rows for two threads
    monkeypatch.setattr(maps_core.query, "PARALLEL_SECONDS", np.inf)
    calls.clear()
    part.counterfactuals(rows, norm="l2", threads=2)
    assert calls == [len(rows)]
    with pytest.raises(BudgetExceededError, match="max_boxes"):
        monkeypatch.setattr(maps_core.query, "PARALLEL_SECONDS", 0.0)
        part.counterfactuals(rows, norm="l2", threads=2, max_boxes=1)


@pytest.mark.parametrize("k", [1, 2])
def test_a_cancelled_batch_stops_between_rows(mixed_forest, monkeypatch, k):
    """With a cancel event, a batch runs in chunks of rows (k = 1: compiled chunks sized by
    the maps' pace; k = 2: row by row) and looks at the event before each: unset, the
    answers are those of one call, and a budget that runs out names the batch's row;
    set, the batch stops there with QueryCancelledError, the rows after it unsearched."""
    model, X, _, part = mixed_forest
    calls = []
    stop, stop_after = threading.Event(), [0]  # set once that many calls have returned
    real_batch, real_search = maps_core.query._batch, maps_core.query.search

    def counted(real):
        def call(*a, **kw):
            calls.append(a[0].shape[0] if real is real_batch else 1)
            out = real(*a, **kw)
            if len(calls) == stop_after[0]:
                stop.set()
            return out
        return call

    monkeypatch.setattr(maps_core.query, "_batch", counted(real_batch))
    monkeypatch.setattr(maps_core.query, "search", counted(real_search))
    monkeypatch.setattr(maps_core.query, "PARALLEL_SECONDS", np.inf)  # one thread a chunk
    rows = X[:40]
    one = part.counterfactuals(rows, norm="l2", k=k, threads=1)
    assert calls == ([len(rows)] if k == 1 else [1] * len(rows))
    # as if each row took 10 ms: chunks of CANCEL_SECONDS / 10 ms rows, at least
    # PARALLEL_ROWS per thread
    monkeypatch.setattr(maps_core.query, "CANCEL_SECONDS", 0.05)
    chunk = 5 if k == 1 else 1
    if k == 1:
        monkeypatch.setattr(maps_core.engine.SearchPace, "record", lambda *a: None)
        seconds = list(part.engine.pace.seconds)
        seconds[maps_core.query.L2] = 0.01
        monkeypatch.setattr(part.engine.pace, "seconds", seconds)
    calls.clear()
    chunked = part.counterfactuals(rows, norm="l2", k=k, threads=1, cancel=stop)
    assert calls == [chunk] * (len(rows) // chunk)
    for a, b in zip(one, chunked, strict=True):
        assert [c.distance for c in a.counterfactuals] == [c.distance for c in b.counterfactuals]
        assert all(np.array_equal(c.x, d.x) for c, d in
                   zip(a.counterfactuals, b.counterfactuals, strict=True))
        assert a.optimal and b.optimal
    calls.clear()
    stop_after[0] = 2
    with pytest.raises(QueryCancelledError):
        part.counterfactuals(rows, norm="l2", k=k, threads=1, cancel=stop)
    assert calls == [chunk, chunk]  # set while the second ran: no third
    calls.clear()
    with pytest.raises(QueryCancelledError):
        part.counterfactuals(rows, norm="l2", k=k, threads=1, cancel=stop)
    assert calls == []
    # a row past the first chunk out of its budget is named by its place in the batch
    calls.clear()

    def within(x: np.ndarray) -> bool:
        try:
            part.counterfactual(x, norm="l2", k=k, threads=1, max_boxes=50)
        except BudgetExceededError:
            return False
        return True

    fits = np.array([within(x) for x in rows])
    assert 7 <= fits.sum() < len(rows)
    order = np.r_[np.flatnonzero(fits)[:7], np.flatnonzero(~fits)[:1]]
    with pytest.raises(BudgetExceededError) as out_of:
        part.counterfactuals(rows[order], norm="l2", k=k, threads=1, max_boxes=50,
                             cancel=threading.Event())
    assert out_of.value.row == 7


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("max_seconds", [None, 100.0])
def test_a_cancel_stops_a_search_under_way(monkeypatch, threads, max_seconds):
    """A search learns of its cancel at its next clock reading (about every millisecond of
    boxes, with or without a time limit, in one part or several): once the event is set,
    a hard search reads the clock a few more times and stops with QueryCancelledError,
    where it reads it dozens of times to its end."""
    X, y = make_classification(600, 8, n_informative=6, n_redundant=0, random_state=0)
    model = RandomForestClassifier(n_estimators=60, max_depth=8, random_state=0).fit(X, y)
    maps = CounterfactualMaps.build(model, max_rectangles=5)
    monkeypatch.setattr(maps_core.query, "PARALLEL_SHARE", 0.0 if threads > 1 else 2.0)
    pops = [maps.counterfactual(x, threads=1).stats.regions_refined for x in X[:20]]
    x = X[int(np.argmax(pops))]
    assert max(pops) > 2000
    reads, event, armed = [0, 0], threading.Event(), threading.Event()
    real = maps_core._clock._now

    def counted() -> float:
        reads[event.is_set()] += 1
        if armed.is_set() and reads[0] == 3:
            event.set()
        return real()

    monkeypatch.setattr(maps_core._clock, "_now", counted)
    whole = maps.counterfactuals(x[None], threads=threads, max_seconds=max_seconds,
                                 cancel=threading.Event())[0]
    assert whole.optimal and reads[0] > 20 and reads[1] == 0
    reads[0] = 0
    armed.set()
    with pytest.raises(QueryCancelledError):
        maps.counterfactuals(x[None], threads=threads, max_seconds=max_seconds, cancel=event)
    assert reads[0] == 3 and reads[1] <= 3 * threads
