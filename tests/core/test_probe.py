"""The probe round (``maps_core.query.PROBE``): a search without a guess starts with a round
bounded far below the schedule's first bound once its maps' recent answers lay within that
bound. The answers must be the same whether the probe round finds them or not; only which
searches take it follows the maps' recent answers."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier

import maps_core.query
from maps_core import CounterfactualMaps
from maps_core._norms import L1, L2, LINF
from maps_core.engine import PACE_WEIGHT
from tests.conftest import synthetic


@pytest.fixture(scope="module")
def forest():
    """A forest whose budgeted maps leave most of the space mixed, and its complete maps."""
    X, y = synthetic(2, 5, 11)
    model = RandomForestClassifier(n_estimators=40, max_depth=6, random_state=0).fit(X, y)
    return model, X, CounterfactualMaps.build(model), CounterfactualMaps.build(model,
                                                                               max_rectangles=5)


@pytest.fixture
def probe_args(monkeypatch):
    """The ``probe`` argument of every single search (``best_first``'s eighth)."""
    seen: list[float] = []
    real = maps_core.query.best_first

    def spy(*args):
        seen.append(args[7])
        return real(*args)

    monkeypatch.setattr(maps_core.query, "best_first", spy)
    return seen


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
@pytest.mark.parametrize("k", [1, 3])
def test_probe_round_gives_the_same_answers_whether_it_finds_them_or_not(
        forest, norm, k, monkeypatch):
    """With every search probing (no guess) and the probe's bound at the median answer,
    about half the answers lie within the probe round and half beyond it. Each nearest
    answer is the complete maps' (to 1e-12), the k best are distinct and valid by the
    model, and the maps' pace counts each answer near or not by its k-th distance."""
    model, X, full, part = forest
    assert part.stats.mixed_regions > 10
    Q = X[:40]
    want = [full.counterfactual(x, norm=norm).best.distance for x in Q]
    before = np.array([part.counterfactual(x, norm=norm, k=k, threads=1).counterfactuals[-1]
                       .distance for x in Q])
    probe = maps_core.query.PROBE
    first = float(np.median(before)) / probe  # the probe round's bound: the median answer
    monkeypatch.setattr(maps_core.query, "_first_radius", lambda engine, opts: first)
    monkeypatch.setattr(maps_core.query, "PROBE_SHARE", 0.0)
    monkeypatch.setattr(maps_core.query, "GUESS_FIRST", False)
    assert 0 < (before < probe * first).sum() < len(Q)  # both outcomes of the probe round
    code = {"l1": L1, "l2": L2, "linf": LINF}[norm]
    pace = part.engine.pace
    for x, d in zip(Q, want, strict=True):
        share = pace.near[code]
        got = part.counterfactual(x, norm=norm, k=k, threads=1)
        assert got.optimal and len(got.counterfactuals) == k
        assert got.best.distance == pytest.approx(d, abs=1e-12)
        dist = [c.distance for c in got.counterfactuals]
        assert dist == sorted(dist)
        boxes = {(tuple(c.region.lower), tuple(c.region.upper)) for c in got.counterfactuals}
        assert len(boxes) == k
        for c in got.counterfactuals:
            assert model.predict(c.x[None])[0] == c.target
        near = dist[-1] < probe * first
        assert pace.near[code] == pytest.approx(share + (near - share) * PACE_WEIGHT)


def test_probe_round_follows_the_recent_answers(forest, probe_args):
    """Fresh maps start without a probe round; once at least ``PROBE_SHARE`` of the recent
    answers under a norm lay within the probe's bound, that norm's searches take one, and
    stop taking it once they mostly lie beyond; the other norms keep their own record."""
    model, X, _, _ = forest
    maps = CounterfactualMaps.build(model, max_rectangles=5)  # a fresh pace
    pace = maps.engine.pace
    probe = maps_core.query.PROBE
    maps.counterfactual(X[0], norm="linf", threads=1)
    assert probe_args == [1.0]
    while pace.near[LINF] < maps_core.query.PROBE_SHARE:
        pace.record(LINF, 0, 1e-4, 10, True)  # as after answers within the probe's bound
    maps.counterfactual(X[1], norm="linf", threads=1)
    maps.counterfactual(X[1], norm="l1", threads=1, k=2)
    assert probe_args == [1.0, probe, 1.0]
    while pace.near[LINF] >= maps_core.query.PROBE_SHARE:
        pace.record(LINF, 0, 1e-4, 10, False)
    maps.counterfactual(X[1], norm="linf", threads=1)
    assert probe_args[-1] == 1.0


@pytest.mark.parametrize("near", [True, False])
def test_search_records_whether_its_answer_lay_within_the_probe(forest, near, monkeypatch):
    """A single search and each row of a batch count their answer near when it lies
    within the probe's bound (a fraction ``PROBE`` of the first bound)."""
    model, X, _, _ = forest
    maps = CounterfactualMaps.build(model, max_rectangles=5)
    d = maps.counterfactual(X[0], norm="linf", threads=1).best.distance
    maps = CounterfactualMaps.build(model, max_rectangles=5)  # a fresh pace
    first = d / maps_core.query.PROBE * (2.0 if near else 0.5)
    monkeypatch.setattr(maps_core.query, "_first_radius", lambda engine, opts: first)
    maps.counterfactual(X[0], norm="linf", threads=1)
    assert maps.engine.pace.near[LINF] == (PACE_WEIGHT if near else 0.0)
    batch = np.repeat(X[:1], maps_core.query._BATCH_MIN_ROWS, axis=0)
    maps.counterfactuals(batch, norm="linf")
    share = PACE_WEIGHT if near else 0.0
    for _ in range(len(batch)):
        share += (near - share) * PACE_WEIGHT
    assert maps.engine.pace.near[LINF] == pytest.approx(share)
