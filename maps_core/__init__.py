"""cfmaps core: exact counterfactual maps for tree-ensemble classifiers.

Data flows one way: fitted model -> :class:`FlatEnsemble` (:func:`flatten_model`) ->
certified partition into labeled rectangles -> one KD-tree per class -> best-first
branch-and-bound query.

Examples
--------
>>> from maps_core import CounterfactualMaps, FeatureSchema
>>> maps = CounterfactualMaps.build(model, schema)        # doctest: +SKIP
>>> maps.save("maps/credit")                               # doctest: +SKIP
>>> maps = CounterfactualMaps.load("maps/credit")          # doctest: +SKIP
>>> res = maps.counterfactual(x, norm="l2")                # doctest: +SKIP
>>> res.best.x, res.best.distance, res.best.region         # doctest: +SKIP
"""

# First: empties numba's cache of the kernels when any source changed (see _jitcache).
from . import _jitcache  # noqa: F401  (must stay the first import)
from ._memory import available_memory, default_build_memory, default_query_memory
from ._norms import NORM_NAMES
from .adapters import flatten_model
from .data import Dataset, load_csv, read_table
from .ensemble import FlatEnsemble
from .exceptions import (
    ArtifactError,
    ArtifactNotFoundError,
    BudgetExceededError,
    BuildOptionsError,
    CorruptArtifactError,
    IncompatibleArtifactError,
    InvalidQueryError,
    MapsError,
    QueryCancelledError,
    SchemaError,
    UnsupportedModelError,
)
from .maps import (
    DEFAULT_MAX_RECTANGLES,
    CounterfactualMaps,
    build_maps,
    check_schema,
    load_maps,
    match_label,
)
from .results import BuildStats, Counterfactual, CounterfactualResult, QueryStats, Region, py_scalar
from .schema import Feature, FeatureSchema
from .storage import check_save_path

__all__ = [
    "DEFAULT_MAX_RECTANGLES",
    "NORM_NAMES",
    "ArtifactError",
    "ArtifactNotFoundError",
    "BudgetExceededError",
    "BuildOptionsError",
    "BuildStats",
    "Counterfactual",
    "Dataset",
    "CounterfactualMaps",
    "CounterfactualResult",
    "CorruptArtifactError",
    "Feature",
    "FeatureSchema",
    "FlatEnsemble",
    "IncompatibleArtifactError",
    "InvalidQueryError",
    "MapsError",
    "QueryCancelledError",
    "QueryStats",
    "Region",
    "SchemaError",
    "UnsupportedModelError",
    "available_memory",
    "build_maps",
    "check_schema",
    "check_save_path",
    "default_build_memory",
    "default_query_memory",
    "flatten_model",
    "load_csv",
    "load_maps",
    "match_label",
    "py_scalar",
    "read_table",
]
