"""Schemathesis hooks for ``test_contract.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

The OpenAPI document is the same for every model, so a generated ``instance`` almost never
has the uploaded model's number of features, and every query would end at that 422. These
hooks cut or pad each numeric instance to the model's length (padding from one of its
training rows) and put one of its class labels in ``target``, so that the fuzzed options
(norms, bounds, immutable features, directions, ``k``...) reach the engine. Schemathesis
re-checks a changed case against the schema, so negative cases stay negative.
"""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis

_ROW: list[float] = json.loads(os.environ["CFMAPS_CONTRACT_ROW"])
_CLASSES: list[Any] = json.loads(os.environ["CFMAPS_CONTRACT_CLASSES"])
_FEATURES: list[str] = json.loads(os.environ["CFMAPS_CONTRACT_FEATURES"])


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _pair(names: Any) -> Any:
    """Two distinct feature names of the model in place of two generated strings."""
    if isinstance(names, list) and len(names) == 2 and all(isinstance(n, str) for n in names):
        a = len(names[0]) % len(_FEATURES)
        b = (a + 1 + len(names[1]) % (len(_FEATURES) - 1)) % len(_FEATURES)
        return [_FEATURES[a], _FEATURES[b]]
    return names


def _fit(instance: Any) -> Any:
    """A numeric list or object as one with the model's features (others are left)."""
    if isinstance(instance, list) and all(_is_number(v) for v in instance):
        return (instance + _ROW[len(instance):])[: len(_ROW)]
    if isinstance(instance, dict) and all(_is_number(v) for v in instance.values()):
        values = list(instance.values())
        return dict(zip(_FEATURES, values + _ROW[len(values):], strict=False))
    return instance


#: The largest picture side the document allows (the service's ``CFMAPS_MAP_MAX_SIDE``).
_MAX_SIDE: int = int(os.environ["CFMAPS_CONTRACT_MAX_SIDE"])


def _shrink(params: dict[str, Any]) -> None:
    """Legal picture sizes made small, so that a fuzzing run draws many cheap pictures.
    A size over the document's maximum is left as it is: a negative case made legal here
    was then a "schema-violating request accepted" (ST201)."""
    for key in ("width", "height"):
        if type(params.get(key)) is int and 64 < params[key] <= _MAX_SIDE:
            params[key] = params[key] % 64 + 1


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    body = dict(body)
    if "instance" in body:
        body["instance"] = _fit(body["instance"])
    if isinstance(body.get("instances"), list):
        body["instances"] = [_fit(row) for row in body["instances"]]
    if "features" in body:
        body["features"] = _pair(body["features"])
    _shrink(body)
    target = body.get("target")
    if target is not None and target not in _CLASSES:
        if _is_number(target) and abs(target) < 1e15:
            body["target"] = _CLASSES[int(target) % len(_CLASSES)]
        elif isinstance(target, str):
            body["target"] = _CLASSES[len(target) % len(_CLASSES)]
    for key in ("a_range", "b_range"):
        span = body.get(key)
        if isinstance(span, list) and len(span) == 2 and all(_is_number(v) for v in span):
            lo, hi = sorted(span)
            body[key] = [lo, hi if hi > lo else lo + 1.0]
    return body


@schemathesis.hook
def map_query(context: schemathesis.HookContext, query: Any) -> Any:
    """The same for ``GET map.png``, whose parameters are comma-separated strings."""
    if not isinstance(query, dict):
        return query
    query = dict(query)
    _shrink(query)
    # any strings are schema-valid here (the schema cannot state "a,b" of this model's
    # names): one parameter as "a,b", two as themselves
    feats = query.get("features")
    if isinstance(feats, str):
        feats = [feats]
    if isinstance(feats, list) and len(feats) == 1 and isinstance(feats[0], str):
        text = feats[0]
        query["features"] = ",".join(_pair([text, text[: len(text) // 2]]))
    elif isinstance(feats, list):
        query["features"] = _pair(feats)
    if isinstance(query.get("instance"), str):
        try:
            values = [float(v) for v in query["instance"].split(",")]
        except ValueError:
            values = []
        query["instance"] = ",".join(repr(float(v)) for v in _fit(values))
    return query
