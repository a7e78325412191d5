"""The public facade: :class:`CounterfactualMaps` (build, save, load, query)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ._memory import default_build_memory
from .adapters import flatten_model, prepare_model
from .engine import SearchEngine
from .ensemble import FlatEnsemble
from .exceptions import ArtifactError, InvalidQueryError, SchemaError
from .grid import Grid
from .index import KDForest, build_index
from .options import QueryOptions, categories, make_options
from .partition import Partition, extract
from .query import SearchBudget, SearchOutput, locate, locate_rect, search_batch
from .results import BuildStats, Counterfactual, CounterfactualResult, QueryStats, Region
from .schema import (
    FeatureSchema,
    first_misnamed,
    lightgbm_name,
    made_up_names,
    unknown_feature,
)
from .storage import Artifact, load_artifact, save_artifact

ProgressCallback = Callable[[float], None]

# Share of a build's progress given to the extraction; the KD-trees take the rest. The
# extraction alone used to report 1.0, and the trees, built after it, are about a third of
# a build whose budget binds (Credit RF 100x5 at the defaults: extraction 2.0 s, the trees
# 1.0 s), a time a progress bar sat full.
_EXTRACT_SHARE = 0.7


def _scaled(progress: ProgressCallback, lo: float, hi: float) -> ProgressCallback:
    """``progress`` with its fraction mapped from [0, 1] onto [lo, hi], 1 onto ``hi``
    exactly (whatever the rounding of ``lo + (hi - lo)``)."""
    return lambda fraction: progress(hi if fraction >= 1.0 else lo + (hi - lo) * fraction)


#: Rectangles a build certifies by default before it keeps the rest as mixed regions that
#: queries search exactly. Measured (README, "Budgets"): on the loan data, builds at 5M
#: rectangles took 20-40x the time and 20x the memory of builds at 100k for no faster
#: queries, and a LightGBM 300 x 31-leaf model on 80 features grew to 11 GB in 108 s;
#: on Pima, 100k rectangles answered faster than 5M. The service's default too.
DEFAULT_MAX_RECTANGLES = 250_000

#: The text of a decimal number (no spaces, underscores, inf or nan, which ``float`` takes
#: too): a target given as ``"1"`` for class 1.0 (:meth:`CounterfactualMaps.target_index`).
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


class CounterfactualMaps:
    """Counterfactual maps of one tree-ensemble classifier.

    Build them once from a fitted model, save them, load them memory-mapped, and answer
    exact counterfactual queries in milliseconds.

    Examples
    --------
    >>> from sklearn.ensemble import RandomForestClassifier
    >>> from sklearn.datasets import make_classification
    >>> X, y = make_classification(300, 4, random_state=0)
    >>> model = RandomForestClassifier(10, max_depth=3, random_state=0).fit(X, y)
    >>> maps = CounterfactualMaps.build(model)
    >>> res = maps.counterfactual(X[0], norm="l2")
    >>> bool(model.predict(res.best.x[None])[0] == res.target)
    True
    """

    def __init__(
        self,
        ensemble: FlatEnsemble,
        schema: FeatureSchema,
        grid: Grid,
        partition: Partition,
        index: KDForest,
        stats: BuildStats,
        fingerprint: str | None = None,
        labeler: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.ensemble = ensemble
        self.schema = schema
        self.grid = grid
        self.partition = partition
        self.index = index
        self.stats = stats
        self.fingerprint = fingerprint or ensemble.fingerprint()
        #: Query-time arrays and caches, built once (see :class:`SearchEngine`).
        self.engine = SearchEngine.assemble(ensemble, schema, grid, partition, index, labeler)

    # -- properties -----------------------------------------------------------------------
    @property
    def classes(self) -> list[Any]:
        """Class labels in class-index order (the model's ``classes_``)."""
        return self.engine.classes

    @property
    def feature_names(self) -> list[str]:
        return self.engine.feature_names

    @property
    def n_features(self) -> int:
        return self.engine.n_features

    # -- build ----------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        model: Any,
        schema: FeatureSchema | None = None,
        *,
        max_rectangles: int | None = DEFAULT_MAX_RECTANGLES,
        max_seconds: float | None = None,
        max_memory: int | None = None,
        on_budget: str = "mixed",
        progress: ProgressCallback | None = None,
        n_jobs: int | None = None,
    ) -> CounterfactualMaps:
        """Extract, certify and index the maps of a fitted model.

        Parameters
        ----------
        model : estimator
            A fitted tree classifier of scikit-learn, LightGBM or XGBoost, or its parsed
            model file (see :func:`maps_core.flatten_model`), or an already flattened
            :class:`FlatEnsemble`.
        schema : FeatureSchema, optional
            Legal domain and query defaults. Without it every feature is continuous and
            unbounded, named after the model's ``feature_names_in_`` or ``x0..``.
        max_rectangles : int or None, default DEFAULT_MAX_RECTANGLES (250,000)
            Rectangles certified before the rest stays mixed (searched exactly at query
            time); None: no limit (complete maps when the other budgets allow).
        max_seconds : float, optional
            Time budget of the extraction.
        max_memory : int, optional
            Bytes the build may grow by; it stops refining before its boxes, certified
            rectangles and mixed regions alike, would pass the budget at their measured
            cost on this many features (see
            :mod:`maps_core._memory`), so a build is never killed for memory: it keeps
            mixed regions or raises, as ``on_budget`` says. Default: half the memory this
            process may count on (:func:`~maps_core.available_memory`: the machine's, or its
            container's cgroup limit when smaller), or half of what is free when the build
            starts when that is less (:func:`~maps_core.default_build_memory`). Without it a
            build that no other budget stops grows until the OS kills the process (a 40-tree forest of depth
            5 on 8 continuous features: 24 GB within two minutes).
        on_budget : {"mixed", "error"}
            What to do when a budget runs out: keep the unresolved regions as *mixed* boxes
            that queries refine on demand (answers stay exact), or raise
            :class:`BudgetExceededError`.
        progress : callable, optional
            Called with the fraction done, a float in [0, 1], non-decreasing: the
            extraction's share of its budget or grid, then the KD-trees' share of the
            rectangles indexed. 1.0 comes last, once the maps are complete.
        n_jobs : int, optional
            Worker threads for the extraction (default: all cores).
        """
        t0 = time.perf_counter()
        model = prepare_model(model)  # LightGBM, XGBoost objects: their parsed files
        ens = model if isinstance(model, FlatEnsemble) else flatten_model(model)
        if schema is None:
            schema = FeatureSchema.default(ens.n_features, ens.feature_names)
        grid = _grid(ens, schema)
        labeler = None if isinstance(model, FlatEnsemble) else _model_labeler(model, ens)
        jobs = n_jobs or os.cpu_count() or 1
        if max_memory is None:
            max_memory = default_build_memory()
        part = extract(
            ens,
            grid,
            max_rectangles=max_rectangles,
            max_seconds=max_seconds,
            max_memory=max_memory,
            on_budget=on_budget,
            progress=None if progress is None else _scaled(progress, 0.0, _EXTRACT_SHARE),
            n_jobs=jobs,
            labeler=labeler,
        )
        index = build_index(
            part, grid, ens.n_classes, n_jobs=jobs,
            progress=None if progress is None else _scaled(progress, _EXTRACT_SHARE, 1.0),
        )
        stats = BuildStats(
            seconds=time.perf_counter() - t0,
            rectangles_per_class=[int(n) for n in part.counts(ens.n_classes)],
            mixed_regions=int(part.n_mixed),
            thresholds_per_feature=[int(k) for k in grid.n_thresholds],
            raw_thresholds=int(grid.raw_thresholds),
            extra=dict(part.counters),
        )
        return cls(ens, schema, grid, part, index, stats, labeler=labeler)

    def attach_model(self, model: Any) -> None:
        """Let the model itself decide the points whose scores nearly tie, as it did
        during the build (see :mod:`maps_core.engine`). Maps built from a model have it
        already; loaded maps need it for the model's own tie-breaking to the last bit.

        Raises
        ------
        UnsupportedModelError
            The model is not one :func:`flatten_model` supports.
        ArtifactError
            The model is not the one these maps were built from (fingerprints differ).
        """
        model = prepare_model(model)
        ens = flatten_model(model)
        if ens.fingerprint() != self.fingerprint:
            raise ArtifactError("the model is not the one these maps were built from")
        self.engine = replace(self.engine, labeler=_model_labeler(model, ens))

    # -- persistence ----------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], *, parents: bool = True) -> Path:
        """Write the maps atomically to the directory ``path``, replacing maps saved there
        before; any other file or non-empty directory there is refused with
        :class:`ArtifactError` and left untouched (:func:`check_save_path`).

        Missing parent directories are created, unless ``parents=False``: then the save
        fails with ``FileNotFoundError`` when the parent is missing or goes away before
        the save completes (see :func:`maps_core.storage.save_artifact`).
        """
        art = Artifact(self.ensemble, self.schema, self.grid, self.partition, self.index,
                       self.stats, self.fingerprint)
        self.stats = save_artifact(art, path, parents=parents)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, mmap: bool = True) -> CounterfactualMaps:
        """Load maps saved by :meth:`save`, memory-mapped by default.

        Raises
        ------
        ArtifactNotFoundError, CorruptArtifactError, IncompatibleArtifactError
        """
        a = load_artifact(path, mmap=mmap)
        return cls(a.ensemble, a.schema, a.grid, a.partition, a.index, a.stats, a.fingerprint)

    # -- queries --------------------------------------------------------------------------
    def _as_matrix(self, X: Any) -> np.ndarray:
        if getattr(getattr(X, "dtype", None), "kind", "") == "c":  # numpy would drop the imaginary parts
            raise InvalidQueryError("inputs must be real numbers, not complex", "instance")
        order = self._column_order(X)
        try:
            A = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidQueryError(f"inputs must be numeric: {exc}", "instance") from exc
        if order is not None:
            A = A[..., order]
        if A.ndim == 1:
            A = A[None, :]
        if A.ndim != 2 or A.shape[1] != self.n_features:
            raise InvalidQueryError(
                f"expected {self.n_features} feature values per instance, got shape "
                f"{A.shape}",
                "instance",
            )
        self.grid.check_domain(A, self.feature_names)  # finite, legal, integral where due
        return A

    def _column_order(self, X: Any) -> list[int] | None:
        """For an input whose columns are named (a pandas DataFrame's string columns, a
        Series' string index), the positions of the maps' features among them; None for
        an array, or names already in the maps' order. For a LightGBM model, columns
        named as its training DataFrame's were ("a b", which LightGBM writes "a_b") are
        read by the names LightGBM gave them, when that renaming is one to one.

        Raises
        ------
        InvalidQueryError
            When the names are not the maps' features (missing or unknown ones) and the
            model's own names are known: read by position, the columns would be taken
            for other features (scikit-learn's ``predict`` refuses them too). A model
            fitted without names takes any columns by position, as its ``predict`` does.
        """
        labels = getattr(X, "columns", None)
        if labels is None and getattr(X, "ndim", 0) == 1:
            labels = getattr(X, "index", None)
        if labels is None:
            return None
        cols = list(labels)
        if not cols or not all(isinstance(c, str) for c in cols):
            return None  # numbered columns (pandas' default): by position
        names = self.feature_names
        if cols == names:
            return None
        if len(set(cols)) == len(cols) and set(cols) == set(names):
            return [cols.index(n) for n in names]
        if self.engine.ensemble.kind.startswith("LightGBM"):
            # LightGBM wrote the training DataFrame's column "a b" as "a_b" and its own
            # predict takes that DataFrame: so do the maps, when the renaming is one to one
            written = [lightgbm_name(c) for c in cols]
            if len(set(written)) == len(written) and set(written) == set(names):
                return [written.index(n) for n in names]
        if made_up_names(self.engine.ensemble.feature_names) and len(cols) == len(names):
            return None
        missing = [n for n in names if n not in cols]
        unknown = [c for c in cols if c not in names]
        hint = "".join(f"; {unknown_feature(c, names)}" for c in unknown[:5]
                       if unknown_feature(c, names) != f"unknown feature {c!r}")
        raise InvalidQueryError(
            f"the input's columns are not the model's features (missing {missing[:5]}, "
            f"unknown {unknown[:5]}); name them as the model does, in any order{hint}",
            "instance")

    def predict_index(self, X: Any) -> np.ndarray:
        """Class indices of the rectangles containing each row, shape (n_samples,)."""
        A = self._as_matrix(X)
        return self.partition_lookup(A)

    def partition_lookup(self, A: np.ndarray) -> np.ndarray:
        """Class index per row of a validated float64 matrix (no input checks)."""
        return locate(self.engine, A)

    def predict(self, X: Any) -> np.ndarray:
        """Class labels from the maps, shape (n_samples,): equal to ``model.predict``."""
        idx = self.predict_index(X)
        return np.asarray(self.classes, dtype=object)[idx]

    def target_index(self, target: Any) -> int:
        """Class index of a class label: the one place labels are resolved.

        A label matches a class equal to it (``1``, ``1.0`` and ``np.int64(1)`` are class
        1), or whose text it is (``"1"``, as a command line or a JSON client may send it;
        ``"True"`` for a boolean class, as the service writes labels as keys), or, failing
        that, a decimal number's text equal to a numeric class (``"1"`` or ``"1.0"`` for
        class 1.0, as a query string carries it); a boolean matches only a boolean class
        (``True`` is not class 1).

        Raises
        ------
        InvalidQueryError
            With field ``target``, when no class matches.
        """
        t = target.item() if isinstance(target, np.generic) else target
        if not isinstance(t, str | int | float | bool):  # an array, a list, None...: no label
            raise InvalidQueryError(
                f"target must be a class label (a string or a number), got {target!r}", "target")
        i = match_label(self.classes, t)
        if i is None:
            raise InvalidQueryError(f"unknown class {target!r}; classes are {self.classes}",
                                    "target")
        return i

    def counterfactual(self, x: Any, target: Any = None, **options: Any) -> CounterfactualResult:
        """Exact nearest counterfactual of one input, shape (n_features,).

        Takes the options of :meth:`counterfactuals`.

        Examples
        --------
        >>> res = maps.counterfactual(x, norm="l2", immutable=["age"])  # doctest: +SKIP
        >>> res.best.x, res.best.distance, res.best.region  # doctest: +SKIP
        """
        A = self._as_matrix(x)
        if A.shape[0] != 1:
            raise InvalidQueryError("counterfactual() takes one instance", "instance")
        return self._answer(A, target, options)[0]

    def counterfactuals(
        self,
        X: Any,
        target: Any = None,
        *,
        norm: str = "l1",
        weights: Mapping[str, float] | Sequence[float] | np.ndarray | None = None,
        immutable: Sequence[str] | None = None,
        direction: Mapping[str, str] | None = None,
        bounds: Mapping[str, Sequence[float | None]] | None = None,
        k: int = 1,
        group_costs: Mapping[str, float] | None = None,
        max_boxes: int | None = None,
        max_seconds: float | None = None,
        max_memory: int | None = None,
        on_budget: str = "error",
        threads: int | None = None,
        cancel: threading.Event | None = None,
    ) -> list[CounterfactualResult]:
        """Exact counterfactuals for every row of ``X``, in input order.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Legal inputs (inside the schema's domain; one-hot groups exactly one-hot).
        target : class label, optional
            Desired class. Omitted: the nearest class other than the prediction. Equal to
            the prediction: ``x`` itself at distance 0, with the rectangle containing it.
        norm : {"l1", "l2", "linf", "l0"}
            Distance, weighted per feature. ``l0`` counts the changed features (a one-hot
            group counts once) and breaks ties by weighted l1.
        weights : mapping or array of shape (n_features,), optional
            Per-unit cost per feature; defaults to the schema's weights (see
            :mod:`maps_core.schema`).
        immutable, direction, bounds : optional
            Constraints, added to the schema's ``mutable``, ``direction`` and bounds: they
            restrict the schema's, never lift them (a direction against the schema's fixes
            the feature).
        k : int
            Number of counterfactuals from distinct rectangles, nearest first.
        group_costs : mapping, optional
            Cost of switching category, per one-hot group name (default from the schema,
            see :meth:`FeatureSchema.default_group_costs`).
        max_boxes : int, optional
            Most boxes of unresolved (mixed) regions one instance's search may pop
            (default :data:`maps_core.query.MAX_MIXED_POPS`). It bounds the time and the
            memory of a query on maps a budgeted build left mixed regions in: a box costs
            tens of microseconds on a 100-tree forest (25-70 us measured on Credit RF
            100x5, 28 features) and holds 8m + 4T + 8c + 24 bytes while queued (m
            features, T trees, c classes). Exactness is never traded: a search that needs more raises
            :class:`BudgetExceededError`.
        max_seconds : float, optional
            Most seconds one instance's search of mixed regions may take (default: no
            limit), the clock read about every :data:`maps_core.lazy.CLOCK_SECONDS` of
            boxes, so a search may overrun it by about that. Beyond it,
            :class:`BudgetExceededError`: what a service needs to keep one hard query
            from holding a worker for minutes (Credit RF 200x8 pops about 7,000 boxes a
            second on its hard queries). With ``on_budget="best"``, the search stops
            :data:`maps_core.lazy.GUESS_SHARE` of it early (at most ``GUESS_SECONDS``)
            to leave that time to its guesses for a nearer answer.
        max_memory : int, optional
            Most bytes the boxes one instance's search holds at once may take (the boxes
            popped are reused; each takes :func:`~maps_core._memory.bytes_per_box` bytes).
            Default: a sixteenth of the memory this process may count on
            (:func:`~maps_core.default_query_memory`). It keeps a hard query from growing
            until the OS kills the process: a Credit RF 200x8 query held 209,000 boxes
            (223 MB) after 500,000 pops. A search that would need more stops, as ``on_budget``
            says.
        on_budget : {"error", "best"}
            What a search out of ``max_boxes``, ``max_seconds`` or ``max_memory`` does: raise
            :class:`BudgetExceededError` (default: every answer is certified optimal), or
            answer with the nearest certified target boxes it met. Such an answer is
            valid (its point and region get the target) but may not be the nearest:
            ``optimal`` is False and ``lower_bound`` a certified lower bound of the
            optimum, so ``best.distance / lower_bound`` bounds how far from optimal it
            is. A search that met no target box still raises.
        threads : int, optional
            Threads one instance's search may run in at once (default 2, or 1 where the
            process may use one processor). With ``k = 1``, once most of the recent
            searches on these maps under the query's norm were long (at least
            :data:`maps_core.query.PARALLEL_AFTER` boxes), the search's mixed regions are
            dealt out among that many parts, which share the nearest target met; each
            part may pop ``max_boxes`` boxes and gets ``1 / threads`` of ``max_memory``.
            A batch's rows are dealt out among them when they are expected to take
            :data:`maps_core.query.PARALLEL_SECONDS` or more. The distances do not depend
            on it; where several answers tie at the optimum, which one is returned may
            (use 1 where the same request must return the same point). Credit RF 100x5,
            l1: p50 18 -> 12 ms, p90 77 -> 39 ms in 2 threads on 2 cores; use 1 where
            every processor is busy with other queries anyway. More threads than
            processors only share them.
        cancel : threading.Event, optional
            Set by another thread, it stops the call with :class:`QueryCancelledError`:
            a search under way stops at its next clock reading (about every
            :data:`maps_core.lazy.CLOCK_SECONDS` of boxes), a batch's compiled rows run in
            chunks of about :data:`maps_core.query.CANCEL_SECONDS` and the next chunk does
            not start. A service sets it when its client has gone away.

        Returns
        -------
        list of CounterfactualResult
            ``feasible`` is False with a ``reason`` when no input satisfying the
            constraints gets the target class.
        """
        options = {"norm": norm, "weights": weights, "immutable": immutable,
                   "direction": direction, "bounds": bounds, "k": k, "group_costs": group_costs,
                   "max_boxes": max_boxes, "max_seconds": max_seconds, "max_memory": max_memory,
                   "on_budget": on_budget, "threads": threads, "cancel": cancel}
        return self._answer(self._as_matrix(X), target, options)

    def _answer(
        self, A: np.ndarray, target: Any, options: Mapping[str, Any]
    ) -> list[CounterfactualResult]:
        """:meth:`counterfactuals` of the validated matrix ``A`` (shape (n, n_features))."""
        t_idx = None if target is None else self.target_index(target)
        options = dict(options)
        budget = SearchBudget.parse(options.pop("max_boxes", None),
                                    options.pop("max_seconds", None),
                                    options.pop("max_memory", None),
                                    options.pop("on_budget", "error"),
                                    options.pop("threads", None),
                                    options.pop("cancel", None))
        opts: QueryOptions = make_options(self.engine, **options)
        cats = categories(opts, A)  # every row's one-hot groups are valid before any work
        rids = locate_rect(self.engine, A)  # one compiled call for the batch
        outs = search_batch(self.engine, A, t_idx, opts, rids, cats, budget)
        return [self._result(A[i], t_idx, out) for i, out in enumerate(outs)]

    def _result(self, x: np.ndarray, t_idx: int | None, out: SearchOutput) -> CounterfactualResult:
        """The public form of one row's search."""
        classes = self.classes
        cfs = tuple(
            Counterfactual(
                x=c.x,
                distance=c.distance,
                counterfactual_distance=c.counterfactual_distance,
                region=Region(c.lower, c.upper, c.lower_closed, c.upper_closed),
                target=classes[c.target],
            )
            for c in out.found
        )
        stats = QueryStats(
            nodes_popped=out.nodes_popped,
            rectangles_evaluated=out.rectangles_evaluated,
            regions_refined=out.regions_refined,
            peak_boxes=out.peak_boxes,
            seconds=out.seconds,
        )
        if cfs:
            target = cfs[0].target
        elif t_idx is None and len(out.unreachable) == 1:
            # no target asked for and a single other class (two-class models): it is the
            # one the answer is about, as its reason says
            target = classes[out.unreachable[0]]
        else:
            target = None if t_idx is None else classes[t_idx]
        res = CounterfactualResult(
            query=x,
            prediction=classes[out.prediction],
            target=target,
            feasible=bool(cfs),
            counterfactuals=cfs,
            stats=stats,
            unreachable=tuple(classes[i] for i in out.unreachable),
            constraints=out.constraints,
            optimal=out.optimal,
            lower_bound=out.lower_bound,
        )
        return res if res.feasible else replace(res, reason=res.explain())


def match_label(classes: Sequence[Any], target: str | int | float | bool) -> int | None:
    """Index in ``classes`` of the class that ``target`` names, as
    :meth:`CounterfactualMaps.target_index` reads it, or None when none does.

    A service that lets clients name classes by display names too checks with it that no
    display name reads as another class's label.
    """
    t = target.item() if isinstance(target, np.generic) else target
    for i, c in enumerate(classes):
        c = c.item() if isinstance(c, np.generic) else c
        if not isinstance(t, str) and isinstance(c, bool) != isinstance(t, bool):
            continue
        if (isinstance(t, str) and str(c) == t) or (not isinstance(c, str) and c == t):
            return i
    if t in ("true", "false"):  # JSON's spelling of a boolean, as a client may quote it
        for i, c in enumerate(classes):
            c = c.item() if isinstance(c, np.generic) else c
            if isinstance(c, bool) and c == (t == "true"):
                return i
    if isinstance(t, str) and _DECIMAL.fullmatch(t):
        number = float(t)
        for i, c in enumerate(classes):
            c = c.item() if isinstance(c, np.generic) else c
            if isinstance(c, int | float) and not isinstance(c, bool) and c == number:
                return i
    return None


def _model_labeler(model: Any, ens: FlatEnsemble) -> Callable[[np.ndarray], np.ndarray]:
    """Label points with the model itself (used for cells whose scores nearly tie)."""
    lookup = {repr(c): i for i, c in enumerate(ens.classes)}

    def label(points: np.ndarray) -> np.ndarray:
        pred = model.predict(points)
        return np.array([lookup[repr(c.item() if hasattr(c, "item") else c)] for c in pred])

    return label


def _grid(ens: FlatEnsemble, schema: FeatureSchema) -> Grid:
    """The build's grid of ``ens``'s cuts under ``schema``, and with it every check of the
    schema against the model (:func:`check_schema`)."""
    if len(schema) != ens.n_features:
        raise SchemaError(
            f"the schema has {len(schema)} features but the model expects {ens.n_features}"
        )
    bad = first_misnamed(schema.names, ens.feature_names)
    if bad is not None:
        assert ens.feature_names is not None
        # a schema of the same names in another order would declare each column's bounds,
        # types and constraints on another column, and answer in the wrong places
        raise SchemaError(
            f"feature {bad} is named {schema.names[bad]!r} in the schema but "
            f"{ens.feature_names[bad]!r} in the model; the schema must list the model's "
            "features in its order", feature=bad)
    return Grid.from_ensemble(ens, schema)


def check_schema(model: Any, schema: FeatureSchema) -> None:
    """Check ``schema`` against ``model`` as :meth:`CounterfactualMaps.build` does before
    it extracts anything (a few milliseconds): one entry per input, bounds the model can
    read, weights its thresholds leave measurable. A service checks an upload so, rather
    than fail its build later.

    Raises
    ------
    SchemaError
        With the feature's position where one feature's declaration is at fault.
    UnsupportedModelError
        When ``model`` is no tree ensemble the adapters read.
    """
    model = prepare_model(model)
    _grid(model if isinstance(model, FlatEnsemble) else flatten_model(model), schema)


def build_maps(model: Any, schema: FeatureSchema | None = None, **kwargs: Any) -> CounterfactualMaps:
    """Shortcut for :meth:`CounterfactualMaps.build`."""
    return CounterfactualMaps.build(model, schema, **kwargs)


def load_maps(path: str | os.PathLike[str], *, mmap: bool = True) -> CounterfactualMaps:
    """Shortcut for :meth:`CounterfactualMaps.load`."""
    return CounterfactualMaps.load(path, mmap=mmap)


__all__ = ["DEFAULT_MAX_RECTANGLES", "CounterfactualMaps", "ProgressCallback", "build_maps", "load_maps"]
