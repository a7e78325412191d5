"""Service configuration, read from ``CFMAPS_*`` environment variables.

Every field can be set as ``CFMAPS_<FIELD>`` (for example ``CFMAPS_DATA_DIR=/srv/cfmaps``)
or passed explicitly to :class:`Settings` (tests do that).
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from maps_core import DEFAULT_MAX_RECTANGLES, available_memory, default_build_memory
from maps_core.options import MAX_K

from .schemas import Norm

MiB = 1024 * 1024
#: Largest byte budget (1 PiB): past about 6e18 a build worker's address-space limit
#: (RLIMIT_AS, 1.5 times the budget) no longer fits the kernel's 64-bit value.
MAX_BYTES = 1 << 50
#: Most processes ``cfmaps serve`` starts: each is a whole Python process with its own
#: loaded models (about 300 MB before any), so a typo such as 100000 would fork the
#: machine to a stall rather than serve (QA, session 61).
MAX_WORKERS = 64


def parse_byte_size(text: str) -> int:
    """Bytes of ``2G``, ``512M``, ``1.5GiB`` or ``100000`` (binary suffixes K, M, G, T).

    Raises
    ------
    ValueError
        For anything else.
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    number = t[:-1] if scale > 1 else t
    try:
        value = int(float(number) * scale)
    except (ValueError, OverflowError):  # not a number; inf, or 1e400 (inf as a float)
        raise ValueError(f"not a byte size: {text!r} (try 2G, 512M or a number of bytes)") from None
    if value <= 0:
        raise ValueError(f"a byte size must be positive, got {text!r}")
    if value > MAX_BYTES:
        raise ValueError(f"a byte size must be at most 1024T (no machine has more), got {text!r}")
    return value


#: Limits whose default is a number but which an empty variable lifts (no limit).
_EMPTY_IS_NO_LIMIT = frozenset({"query_max_seconds", "build_max_seconds", "build_max_rectangles"})


def _check_token(token: str) -> None:
    """Refuse a token no client can send: HTTP header values arrive as bytes that the
    server reads as Latin-1, so a token with ``ü`` matched no client that sends UTF-8 (and
    every one of its requests was a 403). Printable ASCII only, as bearer tokens are
    (RFC 6750); the message does not repeat the token."""
    if not all("!" <= ch <= "~" for ch in token):
        raise ValueError("a token must be printable ASCII without spaces (characters ! to ~): "
                         "HTTP clients cannot send others in a header as the server reads them")


class Settings(BaseSettings):
    """cfmaps service settings.

    Attributes
    ----------
    data_dir : Path
        Where uploaded models, their specs and their maps persist (``models/<id>/``).
    admin_token : SecretStr or None
        Bearer token for model management (``POST``/``DELETE /v1/models``). Unset: only
        loopback clients (127.0.0.0/8, ::1) may manage models.
    api_tokens : list of str
        Bearer tokens accepted by the query routes (comma-separated in the environment).
        Empty: the query routes are open. The admin token is always accepted too.
    trust_pickle : bool
        Accept pickle/joblib model files. Loading them runs arbitrary code, so only enable
        this when every admin-token holder is trusted with code execution on the server.
    max_body_bytes : int
        Largest JSON request body (413 above).
    max_batch : int
        Most instances per counterfactual or predict request (413 above).
    max_upload_bytes : int
        Largest model upload (413 above). A skops file's uncompressed size is also capped at
        ``max_unpacked_factor`` times this, against zip bombs.
    max_k : int
        Most counterfactuals per instance a query may ask for.
    max_answers : int
        Most counterfactuals one request may ask for, instances times ``k`` (413 above):
        an answer takes about 1-5 KB of JSON (its region names every feature), so the
        largest batch at the largest ``k`` (1,000 x 100) made a 430 MB response and
        about 2 GB of memory in the process serving it.
    ui : bool
        Serve the explorer page at ``/ui`` (it uses the public API with its user's token).
    query_max_boxes : int
        Most boxes of unresolved (mixed) regions the search for one instance may pop
        before the query fails with 422 ``budget_exceeded`` (the engine's ``max_boxes``).
        It bounds a query's time and memory on maps a budgeted build left mixed regions
        in: a box costs 25-70 us on a Credit random forest of 100 trees, so the default
        500,000 caps such a query at roughly 15-35 s (the engine's own default is 2M).
    query_max_seconds : float or None
        Most seconds the search of unresolved regions for one instance may take before
        the query fails with 422 ``budget_exceeded`` (the engine's ``max_seconds``; it may
        overrun by about a millisecond). The box budget alone lets a hard query on a large
        forest hold a worker for minutes (Credit RF 200x8 pops about 7,000 boxes a second
        on its hard queries); the default 30 s keeps every query, hence every
        request, of one instance within about that. ``None``: no time limit.
    query_max_memory : int or str or None
        Most bytes the pending boxes of one instance's search may take at once
        (``CFMAPS_QUERY_MAX_MEMORY``, e.g. ``256M``; the engine's ``max_memory``); beyond
        it the query fails with 422 ``budget_exceeded``, or answers with the best found.
        A box takes 8 bytes per feature, 4 per tree and 8 per class, plus 24: about 1 KB on
        a 200-tree forest (a hard Credit RF 200x8 query held 209,000 boxes, 223 MB, after
        500,000 pops). Default: a third of the machine's (or container's) memory shared by
        the query threads (:meth:`effective_query_memory`): their arrays briefly take half
        as much again while they grow, so queries at their limit in every thread take at
        most half, and leave the rest to the maps and builds instead of being killed by
        the OS.
    query_threads : int or None
        Threads the search for one instance may run in at once (the engine's ``threads``):
        once most of a model's searches are long (random forests on the loan data), its
        unresolved regions are dealt out among that many threads, which share the nearest
        answer found; the answers are the same. Default: the engine's, 2 (1 where the
        process may use one processor). Credit RF 100x5: p50 18 -> 12 ms and p90 77 ->
        39 ms on 2 idle cores. 1 keeps each query on one core, which serves more queries
        at once when every core is busy.
    query_on_budget : {"error", "best"}
        What a search beyond its budgets (``query_max_boxes``, ``query_max_seconds``,
        ``query_max_memory``) answers when the request does not say (its ``on_budget``):
        ``error`` a 422 ``budget_exceeded``, so that every 200 is certified optimal;
        ``best`` the nearest counterfactual it found, valid, with ``optimal`` false and a
        certified ``lower_bound``. With ``best`` and a short ``query_max_seconds`` every
        query answers in about that time (a random forest's hard queries on loan data take
        seconds to prove: README, "What limits random forests").
    map_max_side : int
        Largest width or height of a map picture (``/v1/models/{id}/map.png``), pixels.
    build_workers : int
        Builds that run at the same time, each in its own worker process
        (:mod:`app.builds`); more wait in a queue (status ``queued``). At most 64.
    build_jobs : int or None
        Threads used inside one build (at most 256). Default: all cores but one, so that
        queries keep a core while a build runs.
    build_max_seconds, build_max_rectangles : optional
        Extraction budgets (default: 15 minutes, 250,000 rectangles). When one runs out,
        the unresolved regions are kept as *mixed* boxes that queries search inside, so
        answers stay exact (the build never fails for budget reasons). 250k rectangles: on
        the loan data big maps buy no faster queries (5M rectangles: 55-107 s and 9-13 GB
        per build for the same latency: issue 14's measurements, summed up in the README's
        configuration table), and the
        time budget keeps a huge model from holding a build worker for hours.
    build_max_memory : int or str
        Bytes one build may grow by (``CFMAPS_BUILD_MAX_MEMORY``, e.g. ``2147483648`` or
        ``2G``, ``512M``). Default: half of the machine's memory, or of the container's
        cgroup limit when smaller, or half of what is free when the build starts when
        that is less (:func:`maps_core.default_build_memory`), shared by the
        ``build_workers`` builds. The engine
        stops certifying rectangles before its measured peak per rectangle would pass it
        (:mod:`maps_core._memory`), so a build is never killed by the OS for memory.
    default_norm : {"l1", "l2", "linf", "l0"}
        Norm used when a query names none. L1 is the default because it favours sparse
        changes (few features moved), which is what people asking "what should I change?"
        usually want.
    log_format : {"text", "json"}
        Log lines as text, or one JSON object per line for log collectors; both carry the
        request id (:mod:`app.observability`).
    shutdown_grace_seconds : float
        On SIGTERM, how long ``cfmaps serve`` lets in-flight requests finish before it
        closes their connections.
    role : {"all", "api", "builder"}
        What this process does over the data dir, which any number of processes may
        share: ``api`` answers the HTTP API and builds nothing (uploads wait, ``queued``,
        for a builder); ``builder`` builds queued models and serves only the probes and
        metrics; ``all`` does both.
    sync_interval_seconds : float
        How often the process reads the data dir for what other processes changed
        (models added, built, deleted; build progress).
    workers : int
        Processes ``cfmaps serve`` starts over the data dir (``--workers``), at most
        :data:`MAX_WORKERS` (64).
    gc_freeze : bool
        At start and once the stored models are loaded, hide the objects alive then from
        Python's cyclic garbage collector (:func:`gc.freeze`): a full collection otherwise
        scans ~190k long-lived objects, 0.1-0.2 s that a request now and then waits for.
    warm_up : bool
        Compile the query kernels before reporting ready (``/readyz``), on tiny maps
        (:func:`maps_core.warmup.warm_up`; not in the ``builder`` role). A new machine
        compiles for about a minute, later starts load numba's cache in about a second;
        without it the first query of each process waits that long.
    rate_limit_per_minute : int or None
        Answers (counterfactuals times ``k``, predictions) one client (bearer token, else
        address) may ask the query routes for per minute, per process; unset: no limit
        (:mod:`app.ratelimit` says why a service may want one).
    """

    model_config = SettingsConfigDict(env_prefix="CFMAPS_", extra="ignore")

    data_dir: Path = Path("./data")
    admin_token: SecretStr | None = None
    api_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    trust_pickle: bool = False
    max_body_bytes: int = Field(default=4 * MiB, gt=0, le=MAX_BYTES)
    max_batch: int = Field(default=1000, gt=0)
    max_upload_bytes: int = Field(default=256 * MiB, gt=0, le=MAX_BYTES)
    max_unpacked_factor: int = Field(default=20, gt=0)
    max_k: int = Field(default=100, gt=0, le=MAX_K)  # the engine takes no more
    max_answers: int = Field(default=10_000, gt=0)
    query_max_boxes: int = Field(default=500_000, gt=0)
    query_max_seconds: float | None = Field(default=30.0, gt=0, allow_inf_nan=False)
    query_max_memory: int | None = Field(default=None, gt=0, le=MAX_BYTES)
    query_threads: int | None = Field(default=None, gt=0, le=64)
    query_on_budget: Literal["error", "best"] = "error"
    map_max_side: int = Field(default=1024, gt=0, le=2048)
    ui: bool = True
    build_workers: int = Field(default=1, gt=0, le=64)
    build_jobs: int | None = Field(default=None, gt=0, le=256)
    build_max_seconds: float | None = Field(default=900.0, gt=0, allow_inf_nan=False)
    build_max_rectangles: int | None = Field(default=DEFAULT_MAX_RECTANGLES, gt=0)
    build_max_memory: int | None = Field(default=None, gt=0, le=MAX_BYTES)
    default_norm: Norm = "l1"
    log_format: Literal["text", "json"] = "text"
    shutdown_grace_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    role: Literal["all", "api", "builder"] = "all"
    workers: int = Field(default=1, gt=0, le=MAX_WORKERS)
    # at least 10 ms (a pass reads every model's status: shorter keeps a core busy), at most
    # an hour (replicas must see each other's deletes)
    sync_interval_seconds: float = Field(default=0.5, ge=0.01, le=3600)
    rate_limit_per_minute: int | None = Field(default=None, gt=0)
    gc_freeze: bool = True
    warm_up: bool = True

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, v: object) -> object:
        # The environment carries one comma-separated string; blanks are dropped so that
        # "a, b," means ["a", "b"].
        if isinstance(v, str):
            return [t.strip() for t in v.split(",") if t.strip()]
        return v

    @model_validator(mode="before")
    @classmethod
    def _empty_is_unset(cls, data: object) -> object:
        # A variable set but empty (CFMAPS_DATA_DIR= in a compose file) is unset, as
        # documented: None for the optional settings (no limit, or the computed default),
        # the default for the others. CFMAPS_DATA_DIR= was "." (models written outside the
        # container's volume) and CFMAPS_MAX_BATCH= stopped the service at start.
        if not isinstance(data, dict):
            return data
        out: dict[str, object] = {}
        for key, v in data.items():
            if isinstance(v, str) and not v.strip() and key in cls.model_fields:
                if cls.model_fields[key].default is None or key in _EMPTY_IS_NO_LIMIT:
                    out[key] = None
                continue  # the default
            out[key] = v
        return out

    @field_validator("build_max_memory", "query_max_memory", "max_body_bytes",
                     "max_upload_bytes", mode="before")
    @classmethod
    def _byte_size(cls, v: object) -> object:
        if isinstance(v, str):
            return parse_byte_size(v)
        return v

    @field_validator("admin_token", mode="before")
    @classmethod
    def _blank_is_unset(cls, v: object) -> object:
        # CFMAPS_ADMIN_TOKEN="" (common in compose files) means "not configured", not
        # "the empty string is the token".
        # Surrounding whitespace is never part of it: a Secret made from a file written by
        # `echo` ends in a newline, and every admin call was a 403.
        if isinstance(v, str):
            return v.strip() or None
        return v

    @field_validator("api_tokens")
    @classmethod
    def _ascii_tokens(cls, v: list[str]) -> list[str]:
        for t in v:
            _check_token(t)
        return v

    @field_validator("admin_token")
    @classmethod
    def _ascii_admin_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            _check_token(v.get_secret_value())
        return v

    @property
    def admin_secret(self) -> str | None:
        """The admin token in clear, or None."""
        return self.admin_token.get_secret_value() if self.admin_token else None

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    def effective_build_memory(self) -> int:
        """Bytes per build: the setting, else the engine's default (half the machine's or
        container's memory, or of what is free when less) shared by the concurrent builds."""
        if self.build_max_memory:
            return self.build_max_memory
        return default_build_memory() // self.build_workers

    def effective_query_memory(self) -> int:
        """Bytes per instance's search: the setting, else a third of the machine's or
        container's memory shared by the threads that run queries (Python's default pool
        size, ``min(32, cores + 4)``: see :func:`app.routes.deps.in_thread`)."""
        if self.query_max_memory:
            return self.query_max_memory
        return _default_query_memory()

    def effective_build_jobs(self) -> int:
        """Threads per build: the setting, else all cores but one (at least one)."""
        if self.build_jobs:
            return self.build_jobs
        return max(1, (os.cpu_count() or 2) - 1)


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``CFMAPS_`` variable of ``environ`` that names no setting (a
    typo: ``CFMAPS_API_TOKEN`` set for ``CFMAPS_API_TOKENS`` left the service open), with
    the setting it may mean. Warned, not refused: the README's examples use such names as
    shell variables, and tests and benchmarks have their own."""
    known = {f"CFMAPS_{name.upper()}" for name in Settings.model_fields}
    out = []
    for name in sorted(environ):
        if not name.startswith("CFMAPS_") or name in known:
            continue
        near = ([k for k in sorted(known) if k.startswith(name)]  # CFMAPS_RATE_LIMIT
                or difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8))
        hint = f"; did you mean {near[0]}?" if near else ""
        out.append(f"{name} is set but names no setting of the service, so it has no "
                   f"effect{hint}")
    return out


def query_threads() -> int:
    """Threads that run queries in one process: the size of Python's default
    :class:`~concurrent.futures.ThreadPoolExecutor` (:func:`app.routes.deps.in_thread`)."""
    return min(32, (os.cpu_count() or 1) + 4)


@functools.cache
def _default_query_memory() -> int:
    # Once per process: every request asks (reading the cgroup files takes about 90 us).
    return available_memory() // (3 * query_threads())
