"""The ``cfmaps`` command line: ``build``, ``query``, ``serve`` and ``demo``.

Examples
--------
Build the maps of a model saved with skops, inferring the feature schema from its
training data, then ask for the nearest counterfactual of one input::

    cfmaps build model.skops --data train.csv --target-column DEFAULT --out maps/credit
    cfmaps query maps/credit --instance '{"LIMIT_BAL": 20000, "AGE": 24, ...}' --target 0

Serve every model under a data directory, or the shipped credit-risk demo::

    cfmaps serve --data-dir ./data --port 8000
    cfmaps demo

Exit status: 0 on success, 1 when the command fails (bad model, bad schema, bad input...),
2 on a usage error; the reason is printed on stderr as ``cfmaps: error: ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
from pydantic import ValidationError

from maps_core import (
    DEFAULT_MAX_RECTANGLES,
    NORM_NAMES,
    CounterfactualMaps,
    FeatureSchema,
    MapsError,
    check_save_path,
    load_csv,
    py_scalar,
)

from .progress import ProgressBar

#: ``--log-level`` values (Python's logging levels, which uvicorn's are too).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class CLIError(Exception):
    """A failure to report to the user as ``cfmaps: error: <message>`` (exit status 1)."""


# --------------------------------------------------------------------------------------------
# Model files
# --------------------------------------------------------------------------------------------
def load_model_file(path: str | os.PathLike[str], *, trust_pickle: bool = False) -> Any:
    """Load a fitted model from a skops file (or a pickle/joblib file if trusted).

    Uses the service's safe loader (:func:`app.modelio.load_model_file`), so the CLI and the
    HTTP API accept and refuse exactly the same files, then checks the trees' node arrays.

    Parameters
    ----------
    path : path-like
        A skops file; or a pickle / joblib file when ``trust_pickle`` is true.
    trust_pickle : bool
        Allow pickle and joblib files, which run arbitrary code when loaded.

    Raises
    ------
    CLIError
        Missing file, unknown format, untrusted content, or a pickle without
        ``trust_pickle``.
    """
    from app.errors import ApiError
    from app.modelio import load_model_file as safe_load

    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{p} is a directory, not a model file")
    if not p.is_file():
        raise CLIError(f"model file not found: {p}")
    try:
        model, _fmt = safe_load(p, trust_pickle=trust_pickle)
    except ApiError as exc:
        msg = exc.message.replace("CFMAPS_TRUST_PICKLE=true", "--trust-pickle")
        raise CLIError(f"cannot load model {p}: {msg}") from exc
    return model


# --------------------------------------------------------------------------------------------
# Schemas: --spec and --data
# --------------------------------------------------------------------------------------------
def _json(text: str, what: str) -> Any:
    """``text`` parsed as JSON, or a :class:`CLIError` naming ``what``: broken JSON, and
    what the parser refuses beyond it (an integer of more than 4,300 digits, arrays nested
    thousands deep) printed a traceback."""
    try:
        return json.loads(text)
    except RecursionError:
        raise CLIError(f"{what} is nested too deeply to read") from None
    except ValueError as exc:
        raise CLIError(f"{what} is not valid JSON: {exc}") from exc


def load_spec(path: str | os.PathLike[str]) -> FeatureSchema:
    """Feature schema from a spec JSON file.

    The file is the ``spec`` of ``POST /v1/models``: an object with ``features`` (a list of
    ``{name, type, lower, upper, group, mutable, direction, weight}``) and optionally ``name``
    and ``classes``; a bare list of features is accepted too.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CLIError(f"spec file not found: {p}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"spec {p} is not valid JSON: {exc}") from exc
    doc = _json(text, f"spec {p}")
    feats = doc.get("features") if isinstance(doc, dict) else doc
    if not isinstance(feats, list):
        raise CLIError(f"spec {p}: expected an object with a 'features' list")
    try:
        return FeatureSchema.from_dicts(feats)
    except MapsError as exc:
        raise CLIError(f"spec {p}: {exc}") from exc


def schema_from_data(
    path: str | os.PathLike[str],
    target_column: str | None,
    model: Any,
    categories: str = "one-hot",
) -> tuple[FeatureSchema, np.ndarray]:
    """Infer the feature schema of ``model`` from its training data in a CSV file.

    The file is read by :func:`maps_core.load_csv`, the one CSV-to-schema path (type codes,
    ``E`` columns one-hot encoded as ``column=value``, or with ``categories="codes"`` one
    nominal column of codes, missing values, bounds). The feature
    columns are then the model's ``feature_names_in_`` when it has them (extra columns are
    ignored), otherwise every column except the target, in file order.

    Returns
    -------
    schema : FeatureSchema
    X : ndarray of shape (n_samples, n_features)
        The feature columns, in model order.
    """
    where = str(path)
    model_names = getattr(model, "feature_names_in_", None)
    try:
        data = load_csv(path, target_column, require_target=model_names is None,
                        categories=categories)
    except MapsError as exc:
        if target_column is None and "no label column" in str(exc):
            raise CLIError(
                f"{where}: say which column is the label with --target-column "
                "(it is left out of the features)"
            ) from exc
        raise CLIError(str(exc)) from exc
    names = data.schema.names
    if model_names is not None:
        feature_names = [str(n) for n in model_names]
        missing = [n for n in feature_names if n not in names]
        if missing:
            raise CLIError(
                f"{where}: the model's input columns {missing} are not in the file (columns "
                f"coded E are one-hot encoded as column=value); the file gives {names}"
            )
        cols = [names.index(n) for n in feature_names]
    else:
        n_in = getattr(model, "n_features_in_", None)
        if n_in is not None and len(names) != int(n_in):
            raise CLIError(
                f"{where}: {len(names)} feature columns besides {data.target!r} (columns coded "
                f"E count once per category), but the model expects {int(n_in)}"
            )
        cols = list(range(len(names)))
    schema = FeatureSchema(tuple(data.schema.features[j] for j in cols))
    return schema, data.X[:, cols]


# --------------------------------------------------------------------------------------------
# JSON answers
# --------------------------------------------------------------------------------------------
def _read_arg(text: str, flag: str = "--options") -> str:
    """An argument's JSON text: itself, ``@path`` (a file) or ``-`` (stdin)."""
    if text == "-":
        return sys.stdin.read()
    if text.startswith("@"):
        try:
            return Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise CLIError(f"{flag}: cannot read {text[1:]}: {exc}") from exc
    return text


def parse_instance(text: str) -> Any:
    """One input from JSON (a list in feature order or an object keyed by feature name), as
    the JSON value; the data plane checks it as it checks an HTTP body's ``instance``.

    ``text`` may also be ``@path`` (read the JSON from a file) or ``-`` (from stdin).
    """
    doc = _json(_read_arg(text, "--instance"), "--instance")
    if not isinstance(doc, dict | list):
        raise CLIError("--instance must be a JSON list or an object keyed by feature name")
    return doc


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------
def cmd_build(args: argparse.Namespace) -> int:
    check_save_path(args.out)  # before the build, which may take minutes
    model = load_model_file(args.model, trust_pickle=args.trust_pickle)
    if args.spec is not None:
        schema: FeatureSchema | None = load_spec(args.spec)
    elif args.data is not None:
        schema, _ = schema_from_data(args.data, args.target_column, model, args.categories)
        _print_schema(schema, sys.stderr)
    else:
        schema = None
    bar = None if args.no_progress else ProgressBar("building maps")
    try:
        maps = CounterfactualMaps.build(
            model,
            schema,
            max_rectangles=args.max_rectangles,
            max_memory=args.max_memory,  # None: the engine's default, half the memory
            max_seconds=args.max_seconds,
            progress=bar,
            n_jobs=args.jobs,
        )
    finally:
        if bar is not None:
            bar.close(done=sys.exc_info()[0] is None)
    out = maps.save(args.out)
    st = maps.stats
    size = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file())
    per_class = ", ".join(
        f"{py_scalar(c)}: {n}" for c, n in zip(maps.classes, st.rectangles_per_class, strict=True)
    )
    print(f"wrote maps to {out}")
    print(f"  rectangles: {st.rectangles} ({per_class})")
    if st.mixed_regions:
        print(
            f"  unresolved regions: {st.mixed_regions} (budget reached; queries refine them "
            "on demand and stay exact)"
        )
    print(f"  build time: {st.seconds:.2f} s, size on disk: {size} bytes")
    return 0


def _print_schema(schema: FeatureSchema, stream: IO[str]) -> None:
    stream.write("inferred feature schema:\n")

    def fmt(v: float | None, inf: str) -> str:
        if v is None:
            return inf
        return str(int(v)) if float(v).is_integer() else repr(float(v))

    for f in schema.features:
        lo, hi = fmt(f.lower, "-inf"), fmt(f.upper, "+inf")
        stream.write(f"  {f.name}: {f.type} [{lo}, {hi}]\n")
    stream.flush()


def cmd_query(args: argparse.Namespace) -> int:
    """Answer one query with the service's data plane (:mod:`app.dataplane`): the same
    checks, messages and JSON as ``POST /v1/models/{id}/counterfactuals``."""
    from pydantic import ValidationError

    from app.dataplane import QueryLimits, counterfactual_answer
    from app.errors import ApiError
    from app.schemas import CounterfactualRequest, FeatureCodec

    if not Path(args.maps).is_dir():
        raise CLIError(f"no maps directory at {args.maps} (create one with 'cfmaps build')")
    maps = CounterfactualMaps.load(args.maps)
    fields = {"instance": parse_instance(args.instance), "target": args.target, "norm": args.norm,
              "k": args.k, **_parse_options(args.options)}
    try:
        body = CounterfactualRequest.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise CLIError(f"{where}: {err['msg']}") from exc
    codec = FeatureCodec(maps.feature_names, maps.schema.integral_mask().tolist())
    try:
        doc = counterfactual_answer(maps, codec, body, QueryLimits(max_k=1000, default_norm=args.norm))
    except (ApiError, MapsError) as exc:
        field = getattr(exc, "field", None)
        message = exc.message if isinstance(exc, ApiError) else str(exc)
        raise CLIError(f"{field}: {message}" if field else message) from exc
    json.dump(doc, sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")
    return 0


QUERY_OPTIONS = ("weights", "immutable", "direction", "bounds", "group_costs", "max_seconds",
                 "on_budget")


def _parse_options(text: str | None) -> dict[str, Any]:
    """``--options`` JSON: the constraint fields of the HTTP body, same shapes."""
    if not text:
        return {}
    opts = _json(_read_arg(text), "--options")
    if not isinstance(opts, dict):
        raise CLIError(f"--options must be a JSON object with keys among {', '.join(QUERY_OPTIONS)}")
    unknown = sorted(set(opts) - set(QUERY_OPTIONS))
    if unknown:
        raise CLIError(f"--options: unknown key(s) {unknown}; allowed: {', '.join(QUERY_OPTIONS)}")
    return opts


def _make_settings(data_dir: str | None) -> Any:
    from app.settings import Settings

    overrides: dict[str, Any] = {"data_dir": Path(data_dir)} if data_dir else {}
    return Settings(**overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.observability import WORKER_LOG_ENV, configure_logging
    from app.server import PROTOCOL
    from app.settings import MAX_WORKERS, unknown_settings

    if args.data_dir:
        # Worker processes read their settings from the environment.
        os.environ["CFMAPS_DATA_DIR"] = str(Path(args.data_dir))
    settings = _make_settings(None)
    workers = args.workers if args.workers is not None else settings.workers
    if not 1 <= workers <= MAX_WORKERS:
        raise CLIError(f"--workers must be between 1 and {MAX_WORKERS}")
    _check_metrics_dir()  # before logging is configured: one line, and nothing to undo
    try:  # here, as one line, rather than as a traceback from the app's start-up
        settings.models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"data dir {settings.data_dir}: {exc.strerror or exc}") from None
    configure_logging(settings.log_format, args.log_level)
    for warning in unknown_settings(os.environ):
        logging.getLogger("cfmaps.app").warning(warning)
    # log_config=None: keep the handler above (request ids, JSON) for uvicorn's loggers.
    # On SIGTERM uvicorn stops accepting, lets in-flight requests finish within the grace
    # period, then runs the app's shutdown (builds asked to stop, queued again at start).
    common: dict[str, Any] = {
        "host": args.host, "port": args.port, "log_level": args.log_level, "log_config": None,
        "timeout_graceful_shutdown": settings.shutdown_grace_seconds,
        # httptools' parser, each response written in one piece (app/server.py); uvloop's
        # event loop when installed (uvicorn's default "auto" picks it)
        "http": PROTOCOL,
    }
    if workers == 1:
        _clean_up_after_sigterm()
        uvicorn.run(create_app(settings), **common)
    else:
        # N processes, each an app over the shared data dir (see app.registry.Registry.sync);
        # each configures its own logging (create_app reads this variable).
        os.environ[WORKER_LOG_ENV] = args.log_level
        with _shared_state(workers):
            uvicorn.run("app.cli:worker_app", factory=True, workers=workers, **common)
    return 0


def _check_metrics_dir() -> None:
    """A ``PROMETHEUS_MULTIPROC_DIR`` the operator set must be a writable directory: every
    process would fail at its first metric otherwise, with a traceback each."""
    from app.metrics import MULTIPROC_ENV

    named = os.environ.get(MULTIPROC_ENV)
    if named and not (os.path.isdir(named) and os.access(named, os.W_OK | os.X_OK)):
        raise CLIError(f"{MULTIPROC_ENV}={named}: not a writable directory")


@contextmanager
def _shared_state(workers: int) -> Iterator[None]:
    """What the N processes share beyond the data dir, in a directory of this run that
    goes at the end: their metrics (app.metrics), so that a scrape reaching any of them
    counts all of them (unless the operator named a ``PROMETHEUS_MULTIPROC_DIR``, then
    theirs to empty between runs, as prometheus_client asks), the rate limit's buckets
    (app.ratelimit), so that the limit holds across them, and which of the ``workers``
    processes have loaded (app.siblings), so that each is ready only when all are. The
    processes are spawned, so they read these variables when they import the modules.
    Without a writable temp dir each process counts, limits and is ready for itself,
    with a warning."""
    from app.metrics import MULTIPROC_ENV
    from app.siblings import PROCESSES_ENV, SHARED_ENV

    try:
        run = tempfile.mkdtemp(prefix="cfmaps-serve-")
        shared = {SHARED_ENV: run, PROCESSES_ENV: str(workers)}
        if not os.environ.get(MULTIPROC_ENV):
            shared[MULTIPROC_ENV] = os.path.join(run, "metrics")
            os.mkdir(shared[MULTIPROC_ENV])
    except OSError as exc:  # no writable temp dir: the service runs, as without one (README)
        logging.getLogger("cfmaps.app").warning(
            "no writable temp dir for what the processes share (%s): each process's "
            "/metrics counts only its own requests, a rate limit holds per process and "
            "/readyz answers for one process; set TMPDIR to a writable directory",
            exc.strerror or exc)
        yield
        return
    os.environ.update(shared)
    try:
        yield
    finally:
        for name in shared:
            os.environ.pop(name, None)
        shutil.rmtree(run, ignore_errors=True)


def _clean_up_after_sigterm() -> None:
    """Remove multiprocessing's temporary directory (``pymp-*``: the build workers'
    forkserver socket) when the process ends by SIGTERM.

    uvicorn ends by the stopping signal once it has shut down (a supervisor sees why it
    stopped), so Python's exit handlers, multiprocessing's removal of that directory among
    them, never run: every stop left one in the temp dir. uvicorn puts back the handler it
    found before re-raising the signal; this one removes the directory, then ends by the
    signal as before."""
    import signal

    from app.builds import remove_forkserver_dir

    def remove_then_end(signum: int, frame: Any) -> None:
        remove_forkserver_dir()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    signal.signal(signal.SIGTERM, remove_then_end)


def worker_app() -> Any:
    """The app of one of ``cfmaps serve --workers N``'s processes (uvicorn's factory, called
    in each). Each process starts a forkserver of its own when it builds, and ends by
    re-raising SIGTERM once uvicorn has shut it down, so its ``pymp-*`` directory is
    removed at the end of the app's shutdown.

    Not by :func:`_clean_up_after_sigterm`'s handler, as in one process: uvicorn calls
    this factory after it has installed its own, which that handler replaced, so SIGTERM
    ended the process at once: no request in flight finished, no shutdown ran (QA,
    session 65: a 40 s batch cut off 0.2 s after the signal, with 60 s of grace)."""
    from app.builds import remove_forkserver_dir
    from app.main import create_app

    app = create_app()
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with inner(a) as state:
            yield state
        remove_forkserver_dir()

    app.router.lifespan_context = lifespan
    return app


def cmd_demo(args: argparse.Namespace) -> int:
    from app.demo import run_demo

    return run_demo(host=args.host, port=args.port, data_dir=args.data_dir)


# --------------------------------------------------------------------------------------------
# Parser and entry point
# --------------------------------------------------------------------------------------------
def _positive_float(s: str) -> float:
    v = float(s)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {s}")
    return v


def _byte_size(s: str) -> int:
    from app.settings import parse_byte_size

    try:
        return parse_byte_size(s)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(s: str) -> int:
    v = int(s)
    if not 0 <= v <= 65535:  # uvicorn would bind another port (99999 wraps to 34463)
        raise argparse.ArgumentTypeError(f"must be a TCP port, 0 to 65535, got {s}")
    return v


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cfmaps",
        description="Exact counterfactual explanations for scikit-learn tree ensembles.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser(
        "build",
        help="build the counterfactual maps of a model",
        description="Extract, certify and index the maps of a fitted model and save them.",
    )
    b.add_argument("model", metavar="MODEL", help=(
        "model file (.skops, XGBoost .json/.ubj, LightGBM text; pickle/joblib if trusted)"))
    src = b.add_mutually_exclusive_group()
    src.add_argument("--spec", metavar="SPEC.json", help="feature spec (as for POST /v1/models)")
    src.add_argument(
        "--data",
        metavar="TRAIN.csv",
        help="infer the feature schema (types, bounds, scales) from the training data; a "
        "two-row header (names, then type codes B/D/F/E/T) is understood",
    )
    b.add_argument("--target-column", metavar="COL", help="label column of --data (left out)")
    b.add_argument(
        "--categories", choices=("one-hot", "codes"), default="one-hot",
        help="columns of --data coded E: one-hot encoded as column=value (default), or one "
        "nominal column of codes, for a model with categorical splits (LightGBM, XGBoost)",
    )
    b.add_argument("--out", required=True, metavar="DIR",
                   help="directory to write the maps to: new, empty, or maps saved before "
                        "(replaced); anything else is refused")
    b.add_argument("--max-seconds", type=_positive_float, metavar="S", help="time budget")
    b.add_argument(
        "--max-rectangles", type=_positive_int, metavar="N", default=DEFAULT_MAX_RECTANGLES,
        help=f"rectangles certified before the rest stays mixed, searched exactly at query "
        f"time (default {DEFAULT_MAX_RECTANGLES:,}, as the service)",
    )
    b.add_argument(
        "--max-memory", type=_byte_size, metavar="SIZE",
        help="bytes the build may grow by, e.g. 2G (default: half the machine's or the "
        "container's memory, or of what is free when less); past it the build keeps mixed "
        "regions instead of being killed",
    )
    b.add_argument("--jobs", type=_positive_int, metavar="J", help="worker threads (all cores)")
    b.add_argument(
        "--trust-pickle",
        action="store_true",
        help="accept pickle/joblib model files (they run arbitrary code when loaded)",
    )
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.set_defaults(func=cmd_build)

    q = sub.add_parser(
        "query",
        help="print the nearest counterfactual of an input as JSON",
        description="Answer one exact counterfactual query from saved maps.",
    )
    q.add_argument("maps", metavar="DIR", help="maps directory written by 'cfmaps build'")
    q.add_argument(
        "--instance",
        required=True,
        metavar="JSON",
        help="the input: a JSON list in feature order or an object keyed by feature name "
        "(@FILE reads it from a file, - from stdin)",
    )
    q.add_argument("--target", metavar="T", help="desired class (default: nearest other class)")
    q.add_argument("--norm", default="l1", choices=NORM_NAMES, help="distance (default: l1)")
    q.add_argument(
        "--options",
        metavar="JSON",
        help='constraints as in the HTTP body, e.g. \'{"immutable": ["age"], "direction": '
        '{"income": "increase"}, "bounds": {"debt": [0, 5000]}, "group_costs": {"job": 2}}\' '
        'and the time limit, e.g. \'{"max_seconds": 0.05, "on_budget": "best"}\' (@FILE reads '
        "a file)",
    )
    q.add_argument("--k", type=_positive_int, default=1, metavar="K",
                   help="number of counterfactuals")
    q.add_argument("--pretty", action="store_true", help="indent the JSON")
    q.set_defaults(func=cmd_query)

    s = sub.add_parser(
        "serve",
        help="run the HTTP service",
        description="Serve every model under the data directory (settings: CFMAPS_* env vars).",
    )
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    s.add_argument("--port", type=_port, default=8000, help="port (default: 8000)")
    s.add_argument("--data-dir", metavar="D", help="data directory (default: $CFMAPS_DATA_DIR)")
    s.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                   help="log level (default: info)")
    s.add_argument(
        "--workers", type=int, default=None, metavar="N",
        help="processes serving the same data dir (default: $CFMAPS_WORKERS, else 1); they "
        "share the memory-mapped maps through the page cache",
    )
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser(
        "demo",
        help="train, build and serve a credit-risk demo model",
        description="Train a credit-risk random forest on the shipped UCI credit data, build "
        "its maps in the service, serve it, and print a curl command to try.",
    )
    d.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    d.add_argument("--port", type=_port, default=8000, help="port (default: 8000)")
    d.add_argument(
        "--data-dir",
        metavar="D",
        help="keep the demo's data here and reuse it next time (default: a temporary directory)",
    )
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cfmaps`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "build" and args.target_column and not args.data:
        parser.error("--target-column goes with --data")
    try:
        return int(args.func(args))
    except CLIError as exc:
        _fail(str(exc))
    except MapsError as exc:
        field = getattr(exc, "field", None)
        _fail(f"{exc}" + (f" (field: {field})" if field else ""))
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        # a CFMAPS_* setting out of range (Settings() reads the environment)
        _fail("; ".join(f"CFMAPS_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}"
                        for e in exc.errors()))
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (``cfmaps query ... | head``): stop quietly, as Unix tools
        # do; pointing stdout at devnull keeps the interpreter's final flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # after BrokenPipeError (an OSError): a path not read or written
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc}")
    return 1


def _fail(message: str) -> None:
    sys.stderr.write(f"cfmaps: error: {message}\n")
    sys.stderr.flush()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
