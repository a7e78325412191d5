"""The JSON form of answers: a batch formatted column-wise equals each answer's own form."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from svc_helpers import Fitted

from app.schemas import FeatureCodec, result_json, results_json
from maps_core import CounterfactualMaps, Feature, FeatureSchema


@pytest.fixture(scope="module")
def gb3_maps(gb3: Fitted) -> CounterfactualMaps:
    """Three classes with string labels; integer and binary features, one unbounded
    continuous feature (so regions have infinite ends)."""
    schema = FeatureSchema((
        Feature("count", "integer", 0, 60),
        Feature("flag", "binary"),
        Feature("score"),
        Feature("age", "integer"),
    ))
    return CounterfactualMaps.build(gb3.model, schema)


def _codec(maps: CounterfactualMaps) -> FeatureCodec:
    return FeatureCodec(maps.feature_names, maps.schema.integral_mask().tolist())


@pytest.mark.parametrize("norm", ["l1", "l2", "linf", "l0"])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("target", [None, "high"])
@pytest.mark.parametrize("options", [{}, {"immutable": ["count", "score"]}], ids=["free", "fixed"])
def test_a_batch_formats_as_its_answers_one_by_one(
    gb3_maps: CounterfactualMaps, gb3: Fitted, norm: str, k: int, target: Any,
    options: dict[str, Any],
) -> None:
    X = gb3.X[:40].copy()
    X[0, 3] = 3e20  # an integer beyond int64: written as a JSON integer all the same
    X[1, 2] = 3.0e38  # near the float32 limit of what the model reads (beyond it: refused)
    results = gb3_maps.counterfactuals(X, target, norm=norm, k=k, **options)
    codec = _codec(gb3_maps)
    batch = results_json(results, codec, k)
    one_by_one = [result_json(r, codec, k) for r in results]
    assert batch == one_by_one
    # same types too (1 and 1.0 compare equal): the JSON text is identical
    assert json.dumps(batch) == json.dumps(one_by_one)
    # the batch covers what it is meant to: answers with a counterfactual, and (for the
    # fixed features) answers without one
    assert any(r.feasible for r in results)
    if options and target is None:
        assert not all(r.feasible for r in results)


def test_codec_rows_match_the_values_of_each_row() -> None:
    codec = FeatureCodec(["a", "b", "c"], [True, False, True])
    M = np.array([
        [1.0, 2.0, np.inf],
        [1.5, -np.inf, 3e20],
        [-0.0, 0.0, -4.0],
        [2.0**62, 2.0**62, -(2.0**63)],
        [2.0**63, 1.0, 2.0**64],
    ])
    rows = codec.rows(M)
    assert rows == [codec._values(r) for r in M]
    assert json.dumps(rows) == json.dumps([codec._values(r) for r in M])
    assert rows[0] == [1, 2.0, None] and isinstance(rows[0][0], int)
    assert isinstance(rows[1][2], int) and rows[1][2] == 3 * 10**20
    assert isinstance(rows[3][0], int) and isinstance(rows[3][1], float)
