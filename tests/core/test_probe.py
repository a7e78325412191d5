"""The probe round (``maps_core.query.PROBE``): a search without a guess (linf; l1 and l2
with ``k > 1``) starts with a round bounded far below the schedule's first bound. The
answers must be the same whether the probe round finds them or not; a probe round that
finds the answer is the whole search, and one that does not only adds its own boxes."""

from __future__ import annotations

import numpy as np
import pytest

import maps_core.query


def _first_at(monkeypatch, radius: float) -> None:
    """The schedule's first bound, whatever the query (the probe's is ``PROBE`` of it)."""
    monkeypatch.setattr(maps_core.query, "_first_radius", lambda engine, opts: radius)


@pytest.mark.parametrize("norm", ["l1", "l2", "linf"])
@pytest.mark.parametrize("k", [1, 3])
def test_probe_round_gives_the_same_answers_whether_it_finds_them_or_not(
        mixed_forest, norm, k, monkeypatch):
    """With every search probing (no guess) and the probe's bound at the median answer,
    about half the answers lie within the probe round and half beyond it. Each nearest
    answer is the complete maps' (to 1e-12), and the k best are distinct, sorted and
    valid by the model."""
    model, X, full, part = mixed_forest
    assert part.stats.mixed_regions > 10
    Q = X[:40]
    want = [full.counterfactual(x, norm=norm).best.distance for x in Q]
    kth = np.array([part.counterfactual(x, norm=norm, k=k, threads=1).counterfactuals[-1]
                    .distance for x in Q])
    probe = maps_core.query.PROBE
    _first_at(monkeypatch, float(np.median(kth)) / probe)  # the probe's bound: the median
    monkeypatch.setattr(maps_core.query, "GUESS_FIRST", False)
    within = kth < np.median(kth)
    assert 0 < within.sum() < len(Q)  # both outcomes of the probe round
    for x, d in zip(Q, want, strict=True):
        got = part.counterfactual(x, norm=norm, k=k, threads=1)
        assert got.optimal and len(got.counterfactuals) == k
        assert got.best.distance == pytest.approx(d, abs=1e-12)
        dist = [c.distance for c in got.counterfactuals]
        assert dist == sorted(dist)
        boxes = {(tuple(c.region.lower), tuple(c.region.upper)) for c in got.counterfactuals}
        assert len(boxes) == k
        for c in got.counterfactuals:
            assert model.predict(c.x[None])[0] == c.target


@pytest.mark.parametrize(("norm", "k"), [("linf", 1), ("l1", 2), ("l2", 2)])
def test_a_probe_round_is_the_whole_search_or_adds_only_its_boxes(
        mixed_forest, norm, k, monkeypatch):
    """Searches without a guess probe by default. Where the answer lies within the probe's
    bound, the search is that one round: the same boxes and answer as a search whose first
    round has that bound and no probe. Where it lies beyond, the search is the probe round
    and then the schedule: at least the boxes of the schedule alone, the same answer."""
    model, X, _, part = mixed_forest
    probe = maps_core.query.PROBE
    assert probe < 1
    hits = misses = 0
    for x in X[:20]:
        kth = part.counterfactual(x, norm=norm, k=k, threads=1).counterfactuals[-1].distance
        if kth == 0:
            continue
        for scale, found in ((2.0, True), (0.5, False)):
            _first_at(monkeypatch, scale * kth / probe)
            got = part.counterfactual(x, norm=norm, k=k, threads=1)
            monkeypatch.setattr(maps_core.query, "PROBE", 1.0)  # no probe round
            if found:
                _first_at(monkeypatch, scale * kth)
            alone = part.counterfactual(x, norm=norm, k=k, threads=1)
            monkeypatch.setattr(maps_core.query, "PROBE", probe)
            assert [c.distance for c in got.counterfactuals] == [
                c.distance for c in alone.counterfactuals]
            if found:
                assert got.stats.regions_refined == alone.stats.regions_refined
                assert got.stats.nodes_popped == alone.stats.nodes_popped
                assert np.array_equal(got.best.x, alone.best.x)
                hits += got.stats.regions_refined > 0
            else:
                assert got.stats.regions_refined >= alone.stats.regions_refined
                assert got.stats.nodes_popped > alone.stats.nodes_popped
                misses += got.stats.regions_refined > alone.stats.regions_refined
    assert hits > 0 and misses > 0  # rounds that searched mixed regions, both ways
