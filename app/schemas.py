"""Request and response shapes, and the conversions between JSON and engine arrays.

Request bodies are validated by pydantic (unknown keys are refused, so a typo such as
``"instace"`` answers 422 instead of being silently ignored). Instances are decoded by
:class:`FeatureCodec` rather than by pydantic so that an error names the exact feature
(``instances.3.age``) and so that large batches stay cheap to parse; what the values mean
for the model (domain, integers, one-hot groups) is checked once, by the engine (see
:mod:`app.dataplane`).

Response models exist for the OpenAPI document; the routes build plain dicts (faster than
validating every response) that follow them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    WithJsonSchema,
    field_validator,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic.json_schema import SkipJsonSchema

from maps_core import NORM_NAMES, Counterfactual, CounterfactualResult, py_scalar
from maps_core.schema import control_character

from .errors import InvalidInputError, PayloadTooLargeError

FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Weight = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]
if TYPE_CHECKING:
    Norm = str
else:
    # The engine's norms (maps_core._norms) are the one list; a Literal gives the enum of
    # the OpenAPI schema and the validation message.
    Norm = Literal[NORM_NAMES]
Direction = Literal["any", "increase", "decrease"]


def _whole_number(v: Any) -> Any:
    # JSON Schema calls 3.0 an integer; Python's int type does not. Accept it, refuse
    # booleans and fractions (what StrictInt refused) and strings.
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("expected an integer")
    return v


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]


def _scalar_label(v: Any) -> Any:
    # One custom check instead of a pydantic union, whose errors would point at
    # "target.str", "target.int", ... instead of "target".
    if v is None or isinstance(v, str | int | float):  # bool is an int
        return v
    raise ValueError("a class label must be a string, a number or a boolean")


ClassLabel = Annotated[
    Any,
    BeforeValidator(_scalar_label),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}),
]
Instance = Annotated[
    dict[str, Any] | list[Any],
    # decoded by FeatureCodec (so that errors name the feature), documented as what it takes
    WithJsonSchema({
        "anyOf": [{"type": "object", "additionalProperties": {"type": "number"}},
                  {"type": "array", "items": {"type": "number"}}],
        "description": "Feature values: an object keyed by feature name, or a list in "
        "feature order. Numbers only; NaN and infinities are refused.",
        "examples": [{"x0": 0.5, "x1": -1.2}, [0.5, -1.2]],
    }),
]


#: How the norm's description states the default (the service's ``CFMAPS_DEFAULT_NORM``
#: replaces it in its OpenAPI document: app.main).
NORM_DEFAULT_WORDS = "l1"
#: ``on_budget``'s description names the service's default with these words; the served
#: OpenAPI document puts the configured value in their place (app.main).
ON_BUDGET_DEFAULT_WORDS = "`error` unless configured"
#: A map picture's size when the request gives none, shrunk to fit ``CFMAPS_MAP_MAX_SIDE``
#: (:func:`app.dataplane.check_map_size`).
MAP_DEFAULT_SIZE = (480, 360)


# -- requests -----------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FeatureSpec(_Strict):
    """One feature of an upload spec (see :class:`maps_core.Feature`)."""

    name: StrictStr
    type: Literal["continuous", "integer", "binary", "categorical", "nominal"] = "continuous"
    lower: FiniteFloat | None = None
    upper: FiniteFloat | None = None
    group: StrictStr | None = None
    mutable: StrictBool = True
    direction: Direction = "any"
    weight: Weight | None = None


def _printable(text: str) -> str:
    """Refuse control characters, as feature names do (a NUL or a newline in a name
    breaks logs and clients; a file name's stem has them removed)."""
    bad = control_character(text)
    if bad is not None:
        raise ValueError(f"must not hold the control character {bad!r}")
    return text


#: A display name: a model's or a class's.
DisplayName = Annotated[StrictStr, Field(min_length=1, max_length=200), AfterValidator(_printable)]


class ModelSpec(_Strict):
    """The optional ``spec`` part of an upload."""

    name: DisplayName | None = None
    features: list[FeatureSpec] | None = Field(
        default=None,
        description="One entry per model input, in column order. Default: x0..x{m-1} "
        "(or the model's feature_names_in_), continuous, unbounded.",
    )
    classes: list[DisplayName] | None = Field(
        default=None, description="Display names, one per class of the model's classes_, in order."
    )


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed")


def parse_spec(text: str | bytes | None) -> ModelSpec:
    """Parse the ``spec`` form field (JSON text). Empty or missing: an empty spec.

    Raises
    ------
    InvalidInputError
        With ``field`` ``spec`` or ``spec.<path>``.
    """
    if text is None:
        return ModelSpec()
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError("spec must be UTF-8 JSON text", "spec") from exc
    if not text.strip():
        return ModelSpec()
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidInputError(f"spec is not valid JSON: {exc}", "spec") from exc
    if not isinstance(raw, dict):
        raise InvalidInputError("spec must be a JSON object", "spec")
    try:
        return ModelSpec.model_validate(raw)
    except PydanticValidationError as exc:
        err = exc.errors()[0]
        path = ".".join(str(p) for p in err["loc"])
        field = f"spec.{path}" if path else "spec"
        raise InvalidInputError(f"{field}: {err['msg']}", field) from exc


class _InstancesRequest(_Strict):
    # Exactly one of the two, stated in the schema (oneOf) as the codec enforces it. An
    # explicit null is refused, as the schema says (it used to be read as absent); None is
    # only the default of a field left out, hidden from the schema (SkipJsonSchema).
    # The oneOf sits inside an allOf (the same constraint):
    # a oneOf at the top of an object schema makes client generators (openapi-python-client)
    # read the body as a union of two property-less schemas and type it Any.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [{"oneOf": [{"required": ["instance"]}, {"required": ["instances"]}]}],
            # whole bodies: tools that start from examples (schemathesis) send these
            "examples": [{"instance": {"x0": 0.5, "x1": -1.2}}, {"instances": [[0.5, -1.2]]}],
        },
    )

    instance: Instance | SkipJsonSchema[None] = Field(
        default=None, description="One input. Give exactly one of `instance` and `instances`."
    )
    instances: Annotated[list[Instance], Field(min_length=1)] | SkipJsonSchema[None] = Field(
        default=None,
        description="A batch (at least one input); results come back in the same order.",
    )

    @field_validator("instance", "instances", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        # runs only for a value the body gave (defaults are not validated)
        if v is None:
            raise ValueError("must not be null: leave it out instead")
        return v


class CounterfactualRequest(_InstancesRequest):
    """Body of ``POST /v1/models/{id}/counterfactuals``."""

    target: ClassLabel | None = Field(
        default=None,
        description="Desired class: a label of the model's classes_ or a display name from "
        "the spec. Omitted: the nearest class other than the prediction.",
    )
    norm: Norm | None = Field(
        default=None,
        description=f"Distance; default {NORM_DEFAULT_WORDS}. l1 favours few changed "
        "features; l0 counts them (a one-hot group once), ties broken by weighted l1.",
    )
    weights: dict[str, Weight] | None = Field(
        default=None,
        description="Cost per unit of change, by feature name (default from the spec).",
    )
    immutable: list[StrictStr] | None = Field(
        default=None, description="Features that must not change."
    )
    direction: dict[str, Direction] | None = Field(
        default=None,
        description=("Allowed direction of change, by feature name; restricts the spec's (the "
                     "opposite of the spec's direction fixes the feature, any keeps it)."),
    )
    bounds: dict[str, tuple[FiniteFloat | None, FiniteFloat | None]] | None = Field(
        default=None,
        description="[lower, upper] (null: unbounded) the counterfactual must respect.",
    )
    k: WholeNumber = Field(
        default=1,
        ge=1,
        description="Counterfactuals per instance, from distinct "
        "regions; the extra ones come back as `alternatives`.",
    )
    group_costs: dict[str, Weight] | None = Field(
        default=None,
        description="Cost of switching category, by one-hot group name (default: the "
        "largest weight declared on the group's columns, else 1).",
    )
    max_seconds: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="Most seconds one instance's search may take (at most the service's "
        "own limit, which applies when omitted). What happens beyond it: `on_budget`.",
    )
    on_budget: Literal["error", "best"] | None = Field(
        default=None,
        description="A search out of its time or box budget: `error` answers 422 "
        "`budget_exceeded` (every answer certified optimal); `best` answers with the "
        "nearest counterfactual the search found, valid but perhaps not the nearest: "
        "`optimal` false and `lower_bound` a certified lower bound of the optimal distance. "
        f"Omitted: the service's `CFMAPS_QUERY_ON_BUDGET` ({ON_BUDGET_DEFAULT_WORDS}).",
    )


class MapRequest(_Strict):
    """Body of ``POST /v1/models/{id}/map.png`` (the GET takes the same as query
    parameters)."""

    features: Annotated[list[StrictStr], Field(min_length=2, max_length=2)] = Field(
        description="The horizontal and the vertical feature of the slice: two distinct "
        "features, neither a one-hot column."
    )
    instance: Instance = Field(description="The instance the slice goes through; its other "
                               "features stay fixed.")
    width: WholeNumber = Field(default=MAP_DEFAULT_SIZE[0], ge=1, description=(
        "Pixels. Default 480, or the service's largest side when smaller (the height "
        "keeps 4:3)."))
    height: WholeNumber = Field(default=MAP_DEFAULT_SIZE[1], ge=1, description=(
        "Pixels. Default 360, scaled with the width's default."))
    target: ClassLabel | None = Field(
        default=None, description="Class of the counterfactual drawn (default: the nearest "
        "other class)."
    )
    norm: Norm | None = Field(default=None, description="Distance of the counterfactual drawn.")
    a_range: tuple[FiniteFloat, FiniteFloat] | None = Field(
        default=None, description="[lo, hi] shown along the first feature, lo < hi and "
        "(hi - lo) x width finite (default: its legal range; unbounded ends padded around "
        "the thresholds)."
    )
    b_range: tuple[FiniteFloat, FiniteFloat] | None = Field(
        default=None, description="[lo, hi] shown along the second feature, lo < hi and "
        "(hi - lo) x height finite."
    )
    overlay: StrictBool = Field(
        default=True, description="Draw box and class boundaries, the instance and the "
        "counterfactual; false: the class fill only."
    )


class PredictRequest(_InstancesRequest):
    """Body of ``POST /v1/models/{id}/predict``."""


# -- responses (documentation) ------------------------------------------------------------
#: A class as a response names it: its display name (a string) where the spec gave the
#: classes names, else the model's own label (string, number or boolean).
ClassOut = Annotated[
    Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]})
]


class ErrorDetail(BaseModel):
    """One problem a request's validation found."""

    field: str | None = Field(description="The input it concerns, as a dotted path "
                              "(`instances.3.AGE`, `bounds.PAY_AMT1`).")
    message: str


class ErrorResponse(BaseModel):
    """Every error's body, whatever its status."""

    error: str = Field(description="A stable code to act on: `invalid_input`, "
                       "`invalid_query`, `model_not_found`, `model_not_ready`, `budget_exceeded`, "
                       "`rate_limited`, `unavailable`, ...")
    message: str = Field(description="What is wrong and, where there is one, what to do.")
    field: str | None = Field(default=None, description="The input at fault, as a dotted "
                              "path (`instance.AGE`, `target`, `spec.features.2.type`); null "
                              "when none is.")
    details: list[ErrorDetail] | None = Field(default=None, description="A request that "
                                              "failed validation: every problem found, the "
                                              "first one being `field` and `message`.")


#: A value of a feature as answers give it: an integer for integer, binary, categorical
#: and nominal features, a float otherwise.
Number = float | int


class Change(BaseModel):
    """One changed feature's value in the query and in the counterfactual."""

    model_config = ConfigDict(populate_by_name=True)
    from_: Number = Field(alias="from", description="The query's value.")
    to: Number = Field(description="The counterfactual's value.")


class Interval(BaseModel):
    """A feature's range in a region: every value in it, up to its ends as `lower_closed`
    and `upper_closed` say, gets the region's decision (with the other features in theirs)."""

    lower: Number | None = Field(description="Lower end; null: unbounded.")
    upper: Number | None = Field(description="Upper end; null: unbounded.")
    lower_closed: bool = Field(description="Whether `lower` itself is in the range.")
    upper_closed: bool = Field(description="Whether `upper` itself is in the range.")


class QueryStatsOut(BaseModel):
    """The work one search did (for monitoring; it varies with the maps and, in two
    threads, from run to run)."""

    nodes_popped: int = Field(description="KD-tree nodes taken off the search's queue.")
    rectangles_evaluated: int = Field(description="Certified boxes whose exact distance was "
                                      "computed.")
    regions_refined: int = Field(description="Boxes of unresolved (mixed) regions searched.")
    peak_boxes: int = Field(description="The most of those boxes held at once.")
    seconds: float = Field(description="Search time.")


_POINT = ("The counterfactual, by feature name: the model predicts `target` for it, and it "
          "meets the query's constraints and the features' legal values.")
_CHANGES = "The features whose value differs from the query's, by name."
_DISTANCE_OF_POINT = ("Distance of `counterfactual` itself: `distance`, or one float64 step "
                      "more where the region's nearest end is open.")
_REGION = ("By feature name, the box around `counterfactual` in which the model decides "
           "`target` everywhere, up to its ends.")


class AlternativeOut(BaseModel):
    """A next-best counterfactual (`k` > 1), from a region other than the best's."""

    target: ClassOut = Field(description="The class the model decides in its region.")
    counterfactual: dict[str, Number] = Field(description=_POINT)
    changes: dict[str, Change] = Field(description=_CHANGES)
    distance: float = Field(description="Distance from the query to its region.")
    counterfactual_distance: float = Field(description=_DISTANCE_OF_POINT)
    region: dict[str, Interval] = Field(description=_REGION)


class CounterfactualOut(BaseModel):
    """One instance's answer: the nearest input the model decides as `target`, or why
    there is none. The counterfactual fields are null when `feasible` is false."""

    prediction: ClassOut = Field(description="The model's decision for the instance.")
    target: ClassOut | None = Field(description="The class of the counterfactual: the one asked "
                             "for, or with none asked for the nearest other class. When "
                             "infeasible: the class asked for (null when several are out "
                             "of reach).")
    feasible: bool = Field(description="False when no input that meets the query's "
                           "constraints gets `target`; `reason` says which.")
    reason: str | None = Field(description="Why there is no counterfactual; null when "
                               "`feasible`.")
    counterfactual: dict[str, Number] | None = Field(description=_POINT)
    changes: dict[str, Change] | None = Field(description=_CHANGES)
    distance: float | None = Field(
        description="Certified optimal distance (when `optimal`; else the distance to "
        "`region`, the best the search found within its budget).")
    counterfactual_distance: float | None = Field(description=_DISTANCE_OF_POINT)
    region: dict[str, Interval] | None = Field(description=_REGION)
    optimal: bool = Field(description="Whether `distance` is certified optimal: false only "
                          "for an answer under `on_budget: best` whose search ran out first.")
    lower_bound: float | None = Field(
        description="Certified lower bound of the optimal distance: `distance` when "
        "`optimal`; null when infeasible.")
    stats: QueryStatsOut
    alternatives: list[AlternativeOut] | None = Field(
        default=None, description="With `k` > 1: the next-best counterfactuals, nearest "
        "first, each from another region (fewer when fewer exist).")


class CounterfactualBatchOut(BaseModel):
    """A batch's answers (`instances`), in the order of its instances."""

    results: list[CounterfactualOut]


class PredictionOut(BaseModel):
    """The model's own decision for one instance."""

    prediction: ClassOut = Field(description="The class the model decides.")
    probabilities: dict[str, float] = Field(description="The model's probability per class, "
                                            "keyed by the class as `classes` names it (as text).")


class PredictBatchOut(BaseModel):
    """A batch's predictions, in the order of its instances."""

    results: list[PredictionOut]


ModelStatus = Literal["queued", "building", "loading", "ready", "failed"]


class FeatureInfo(BaseModel):
    """One model input as the model's spec declares it, with the defaults filled in
    (:class:`maps_core.Feature`); the order of ``features`` is the model's column order."""

    name: str
    type: Literal["continuous", "integer", "binary", "categorical", "nominal"] = Field(
        description="`categorical` is one 0/1 column of the one-hot group `group`; `nominal` "
        "one column of category codes `lower..upper`.")
    lower: float | int | None = Field(description="Least legal value (inclusive); null: none.")
    upper: float | int | None = Field(description="Greatest legal value (inclusive); null: "
                                      "none.")
    group: str | None = Field(description="The one-hot group of a `categorical` column.")
    mutable: bool = Field(description="Whether a counterfactual may change it (a query may "
                          "fix more features, never free one the spec fixes).")
    direction: Direction = Field(description="The way a counterfactual may move it (a query "
                                 "may restrict it further).")
    weight: float | int | None = Field(description="Cost per unit of change (per switch of "
                                       "a `nominal` feature); null: derived from the bounds.")


class BuildStatsOut(BaseModel):
    """What a build made: the maps' size and how long it took."""

    seconds: float = Field(description="Build time.")
    rectangles: int = Field(description="Certified boxes of constant decision, all classes.")
    rectangles_per_class: dict[str, int] = Field(description="Certified boxes per class, "
                                                 "keyed by the class as `classes` names it (as text).")
    mixed_regions: int = Field(description="Regions left unresolved within the build's "
                               "budgets, searched exactly at query time.")
    thresholds_per_feature: list[int] = Field(description="Distinct split thresholds per "
                                              "feature, in column order.")
    bytes_on_disk: int = Field(description="Size of the saved maps.")


class ModelInfo(BaseModel):
    """A model: its build's state, its features and classes, and once built its maps'
    statistics."""

    id: str
    name: str | None = Field(description="Display name: the spec's, else the uploaded "
                             "file's stem.")
    status: ModelStatus = Field(description="`queued` and `building` until its maps are "
                                "built, `loading` while this process maps them, then `ready` "
                                "(queries answer) or `failed` (see `error`).")
    progress: float = Field(description="Build progress, 0 to 1 (1 once `ready`).")
    error: str | None = Field(description="Why the model failed; null otherwise.")
    created_at: str = Field(description="Upload time, ISO 8601 in UTC.")
    updated_at: str = Field(description="Last change of status, ISO 8601 in UTC.")
    format: str = Field(description="The uploaded file's format: `skops`, `pickle`, "
                        "`xgboost` or `lightgbm` (empty when the directory does not read).")
    model_type: str = Field(description="The model's class, e.g. `RandomForestClassifier`, "
                            "`XGBoostModel` or `LightGBMModel` for those libraries' own files.")
    features: list[FeatureInfo] = Field(description="The model's inputs, in column order "
                                        "(the order of an instance given as a list).")
    classes: list[ClassOut] = Field(description="How requests and answers name the classes "
                                    "(`target`, `prediction`): the spec's display names, "
                                    "else `class_labels`.")
    class_labels: list[ClassOut] = Field(description="The model's own class labels "
                                         "(`classes_`), in the same order.")
    stats: BuildStatsOut | None = Field(description="The maps' statistics once built; null "
                                        "before.")


class ModelList(BaseModel):
    """A page of models by creation time (to the microsecond), then id; ``next_cursor``
    fetches the next page (``null`` on the last one)."""

    models: list[ModelInfo]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null "
                                    "on the last one.")


class ReadinessOut(BaseModel):
    """``/readyz``: ``ready`` (200) once the persisted models are loaded (by every
    process of ``cfmaps serve --workers N``), ``loading`` (503) before; ``models`` counts
    them by status."""

    status: Literal["loading", "ready"]
    models: dict[str, int] = Field(description="How many models there are, by status.")


class ServerReadyOut(BaseModel):
    """``/v2/health/ready`` (Open Inference Protocol): 200 when ready, 503 before."""

    ready: bool


class ModelReadyOut(BaseModel):
    """``/v2/models/{id}/ready`` (Open Inference Protocol): ``name`` is the model's id."""

    name: str
    ready: bool
    status: ModelStatus


# -- conversions --------------------------------------------------------------------------
def json_float(v: float) -> float | None:
    """A float for JSON: None for non-finite values (JSON has no infinities)."""
    f = float(v)
    return f if math.isfinite(f) else None


def _is_number(v: Any) -> bool:
    # bool is an int subclass but not a number here; huge ints are caught at conversion.
    return type(v) is int or (type(v) is float and math.isfinite(v))


_MISSING: Any = object()


class FeatureCodec:
    """Converts one model's instances between JSON and arrays.

    Parameters
    ----------
    names : sequence of str
        Feature names in column order.
    integral : sequence of bool
        True for integer/binary/categorical features, whose values are written as JSON
        integers.
    """

    def __init__(self, names: Sequence[str], integral: Sequence[bool]) -> None:
        self.names = list(names)
        self.index = {n: j for j, n in enumerate(self.names)}
        self.integral = [bool(b) for b in integral]
        self._integral_cols = np.flatnonzero(np.asarray(self.integral, dtype=bool))
        self.m = len(self.names)

    # JSON -> array
    @staticmethod
    def check_count(req: _InstancesRequest, max_batch: int) -> int:
        """The number of instances a request asks about, checked: one of ``instance`` and
        ``instances``, not empty, within ``max_batch`` (before a rate limit counts them).

        Raises
        ------
        InvalidInputError, PayloadTooLargeError
        """
        if (req.instance is None) == (req.instances is None):
            raise InvalidInputError("give exactly one of 'instance' or 'instances'", "instance")
        if req.instances is None:
            return 1
        if not req.instances:
            raise InvalidInputError("'instances' must not be empty", "instances")
        if len(req.instances) > max_batch:
            raise PayloadTooLargeError(
                f"{len(req.instances)} instances exceed the limit of {max_batch} per request",
                "instances",
            )
        return len(req.instances)

    def matrix(self, req: _InstancesRequest, max_batch: int) -> tuple[np.ndarray, bool]:
        """Instances of a request as an array of shape (n, n_features).

        Returns
        -------
        X : ndarray of float64
        single : bool
            True when the request used ``instance`` (answer with one object).

        Raises
        ------
        InvalidInputError, PayloadTooLargeError
        """
        self.check_count(req, max_batch)
        if req.instance is not None:
            return self.row(req.instance, "instance")[None, :], True
        assert req.instances is not None
        X = np.empty((len(req.instances), self.m), dtype=np.float64)
        for i, inst in enumerate(req.instances):
            X[i] = self.row(inst, f"instances.{i}")
        return X, False

    def row(self, inst: dict[str, Any] | list[Any], where: str) -> np.ndarray:
        """One instance (object or list) as a float64 array of shape (n_features,)."""
        if isinstance(inst, dict):
            values: list[Any] = [_MISSING] * self.m
            for key, v in inst.items():
                j = self.index.get(key)
                if j is None:
                    raise InvalidInputError(
                        f"unknown feature {key!r}; features are {self.names}", f"{where}.{key}"
                    )
                values[j] = v
            for j, v in enumerate(values):
                if v is _MISSING:
                    name = self.names[j]
                    raise InvalidInputError(f"feature {name!r} is missing", f"{where}.{name}")
        else:
            if len(inst) != self.m:
                raise InvalidInputError(f"expected {self.m} feature values, got {len(inst)}", where)
            values = inst
        for j, v in enumerate(values):
            if not _is_number(v):
                name = self.names[j]
                raise InvalidInputError(
                    f"feature {name!r} must be a finite number, got {_short(v)}",
                    f"{where}.{name}",
                )
        try:
            return np.array(values, dtype=np.float64)
        except OverflowError:
            for j, v in enumerate(values):
                try:
                    float(v)
                except OverflowError:
                    name = self.names[j]
                    raise InvalidInputError(
                        f"feature {name!r} is too large", f"{where}.{name}"
                    ) from None
            raise

    # array -> JSON
    def value(self, j: int, v: float) -> float | int | None:
        """One feature value for JSON: an int for integral features, None if infinite."""
        f = float(v)
        if not math.isfinite(f):
            return None
        if self.integral[j] and f.is_integer():
            return int(f)
        return f

    def _values(self, x: np.ndarray) -> list[float | int | None]:
        """:meth:`value` of every feature of ``x``, on Python floats (converting numpy
        scalars one by one costs more than the conversion itself)."""
        isfinite = math.isfinite
        return [
            None if not isfinite(f) else int(f) if integral and f.is_integer() else f
            for f, integral in zip(np.asarray(x, dtype=np.float64).tolist(), self.integral,
                                   strict=True)
        ]

    def rows(self, M: np.ndarray) -> list[list[float | int | None]]:
        """:meth:`_values` of every row of ``M`` (shape (n, n_features)), converted a column
        block at a time: one numpy pass instead of a Python test per value, which made up
        most of a batch's formatting (CP, 100 rows: 3 matrices of 1,200 values each)."""
        M = np.asarray(M, dtype=np.float64)
        out = M.astype(object)  # Python floats
        cols = self._integral_cols
        if cols.size:
            sub = M[:, cols]
            # integral values within int64 become Python ints (beyond, as _values does)
            whole = np.isfinite(sub) & (np.floor(sub) == sub) & (np.abs(sub) < 2.0**62)
            block = out[:, cols]
            block[whole] = sub[whole].astype(np.int64)
            big = np.isfinite(sub) & (np.abs(sub) >= 2.0**62)
            for r, c in zip(*np.nonzero(big), strict=True):
                block[r, c] = int(sub[r, c])
            out[:, cols] = block
        out[~np.isfinite(M)] = None
        return out.tolist()

    def point(self, x: np.ndarray) -> dict[str, float | int | None]:
        return dict(zip(self.names, self._values(x), strict=True))

    def changes(self, q: np.ndarray, x: np.ndarray) -> dict[str, dict[str, Any]]:
        """Only the features whose value differs between the query and the answer."""
        out = {}
        for j in np.flatnonzero(q != x).tolist():
            out[self.names[j]] = {"from": self.value(j, q[j]), "to": self.value(j, x[j])}
        return out

    def region(self, region: Any) -> dict[str, dict[str, Any]]:
        """A :class:`maps_core.Region` as an object keyed by feature name."""
        return self.region_of(self._values(region.lower), self._values(region.upper),
                              np.asarray(region.lower_closed, dtype=bool).tolist(),
                              np.asarray(region.upper_closed, dtype=bool).tolist())

    def region_of(self, lo: list[Any], hi: list[Any], lc: list[bool],
                  uc: list[bool]) -> dict[str, dict[str, Any]]:
        """The region object from its ends already converted (:meth:`_values`, :meth:`rows`)
        and its closed flags, per feature."""
        return {
            n: {"lower": a, "upper": b, "lower_closed": c, "upper_closed": d}
            for n, a, b, c, d in zip(self.names, lo, hi, lc, uc, strict=True)
        }


def _short(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, str | bool | type(None)) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _stack(rows: Sequence[Any], dtype: Any) -> np.ndarray:
    """Rows of equal length as a matrix (shape (n, length)); one concatenation costs a
    quarter of ``np.stack`` on a hundred short rows."""
    return np.concatenate([np.asarray(r, dtype=dtype) for r in rows]).reshape(len(rows), -1)


def results_json(
    results: Sequence[CounterfactualResult], codec: FeatureCodec, k: int = 1,
    display: Callable[[Any], Any] = py_scalar,
) -> list[dict[str, Any]]:
    """:func:`result_json` of every answer of a batch, in order.

    The answers that have a counterfactual are formatted column-wise: their queries, points
    and region ends are stacked and converted a matrix at a time (:meth:`FeatureCodec.rows`).
    The output is the same as :func:`result_json` row by row (a test checks it), in about
    half the time on a CP batch of 100. Infeasible answers, and any answer when ``k > 1``,
    go row by row.
    """
    out: list[dict[str, Any] | None] = [
        None if k == 1 and r.best is not None else result_json(r, codec, k, display)
        for r in results
    ]
    rows = [i for i, o in enumerate(out) if o is None]
    if not rows:
        return out  # type: ignore[return-value]
    best: list[Counterfactual] = [results[i].best for i in rows]  # type: ignore[misc]
    Q = _stack([results[i].query for i in rows], np.float64)
    P = _stack([cf.x for cf in best], np.float64)
    qv, pv = codec.rows(Q), codec.rows(P)
    lo = codec.rows(_stack([cf.region.lower for cf in best], np.float64))
    hi = codec.rows(_stack([cf.region.upper for cf in best], np.float64))
    lc = _stack([cf.region.lower_closed for cf in best], bool).tolist()
    uc = _stack([cf.region.upper_closed for cf in best], bool).tolist()
    diff = (Q != P).tolist()
    names = codec.names
    for r, i in enumerate(rows):
        q, p = qv[r], pv[r]
        out[i] = _answer_json(results[i], display, _counterfactual_json(
            best[r], dict(zip(names, p, strict=True)),
            {names[j]: {"from": q[j], "to": p[j]} for j, d in enumerate(diff[r]) if d},
            codec.region_of(lo[r], hi[r], lc[r], uc[r])))
    return out  # type: ignore[return-value]


def _counterfactual_json(cf: Counterfactual, point: dict[str, Any], changes: dict[str, Any],
                         region: dict[str, Any]) -> dict[str, Any]:
    """The fields of one counterfactual, its point, changes and region already converted."""
    return {
        "counterfactual": point,
        "changes": changes,
        "distance": json_float(cf.distance),
        "counterfactual_distance": json_float(cf.counterfactual_distance),
        "region": region,
    }


_NO_COUNTERFACTUAL = dict.fromkeys(
    ("counterfactual", "changes", "distance", "counterfactual_distance", "region"))


def _answer_json(res: CounterfactualResult, display: Callable[[Any], Any],
                 best: dict[str, Any] | None) -> dict[str, Any]:
    """One answer's object around the fields of its best counterfactual (None: infeasible)."""
    return {
        "prediction": display(res.prediction),
        "target": display(res.target),
        "feasible": bool(res.feasible),
        "reason": res.explain(display),
        **(_NO_COUNTERFACTUAL if best is None else best),
        "optimal": bool(res.optimal),  # "infeasible" is certified too
        "lower_bound": None if res.lower_bound is None else json_float(res.lower_bound),
        "stats": res.stats.to_dict(),
    }


def result_json(
    res: CounterfactualResult, codec: FeatureCodec, k: int = 1, display: Callable[[Any], Any] = py_scalar
) -> dict[str, Any]:
    """The JSON form of one answer, as ``POST .../counterfactuals`` and ``cfmaps query``
    return it.

    Fields: ``prediction``, ``target``, ``feasible``, ``reason`` (why not, when infeasible),
    ``counterfactual`` (by feature name), ``changes`` (changed features only, each
    ``{"from", "to"}``), ``distance`` (certified optimum), ``counterfactual_distance``,
    ``region`` (per feature ``lower``, ``upper``, ``lower_closed``, ``upper_closed``; null for
    an unbounded end), ``optimal``, ``lower_bound``, ``stats``, and ``alternatives`` (the next-best
    counterfactuals, from distinct regions) when ``k > 1``. Classes are shown as
    ``display(label)`` (the service's display names; plain values by default).
    """
    q = np.asarray(res.query, dtype=np.float64)

    def one(cf: Counterfactual) -> dict[str, Any]:
        x = np.asarray(cf.x, dtype=np.float64)
        return _counterfactual_json(cf, codec.point(x), codec.changes(q, x),
                                    codec.region(cf.region))

    out = _answer_json(res, display, None if res.best is None else one(res.best))
    if k > 1:
        out["alternatives"] = [{"target": display(cf.target), **one(cf)} for cf in res.counterfactuals[1:]]
    return out
