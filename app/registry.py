"""Models on disk and in memory: upload, status, reload on start, delete.

Layout under ``<data_dir>/models/<id>/``::

    model.skops | model.pkl    the uploaded file, byte for byte
    spec.json                  normalised spec: name, features (full schema), classes
    status.json                status, error, timestamps, classes, build statistics
    maps/                      written by CounterfactualMaps.save (atomic)

Every JSON file is written atomically (temporary file, fsync, ``os.replace``). A new model
is assembled in ``models/.tmp-<id>/`` and renamed into place only once complete, and a
deleted one is first renamed to ``models/.trash-<id>`` and then removed, so a crash at any
point leaves either a whole model directory or a dot-directory that the next start removes
(an upload directory only once no live process holds its ``.tmp-<id>.lock``: another
process may be starting while this one takes an upload).

Status life cycle: ``queued`` -> ``building`` -> ``ready`` | ``failed`` (persisted), and, in
memory only, ``loading`` while a restarted service loads a ready model. At start:

* a model whose persisted status is ``queued`` or ``building`` was interrupted by a crash or
  a shutdown; its uploaded model file is on disk, so its build is queued again;
* a ``ready`` model is loaded (model file and memory-mapped maps, checked against each
  other by fingerprint). Maps of an older format are rebuilt from the model file, and so
  are maps that do not match the file as this version reads it while the file is the one
  uploaded (its SHA-256, ``model_sha256``, recorded then; or none recorded). If
  loading fails otherwise it is reported ``failed`` with the reason, in memory only: the
  files stay untouched so that repairing them (or fixing the configuration, e.g.
  ``CFMAPS_TRUST_PICKLE``) and restarting brings it back;
* a model's directory (named as an id) whose ``status.json`` or ``spec.json`` does not read
  is reported ``failed`` with the reason too, and can be deleted; once its files read
  again, the sync takes what they say. Other directories are skipped with a warning.

Any number of processes may share the data dir (:meth:`Registry.sync`, :class:`BuildLock`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import shutil
import threading
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from maps_core import (
    ArtifactError,
    CounterfactualMaps,
    FeatureSchema,
    FlatEnsemble,
    IncompatibleArtifactError,
    InvalidQueryError,
    MapsError,
    check_schema,
    flatten_model,
    match_label,
    py_scalar,
)
from maps_core.adapters import check_flattened
from maps_core.exceptions import SchemaError, UnsupportedModelError
from maps_core.schema import first_misnamed
from maps_core.storage import file_sha256

from . import modelio
from .errors import (
    ApiError,
    InvalidInputError,
    ModelNotFoundError,
    ModelNotReadyError,
    PayloadTooLargeError,
    StorageError,
    StorageFullError,
    UnsupportedModelFileError,
)
from .schemas import FeatureCodec, ModelSpec
from .settings import Settings

log = logging.getLogger("cfmaps.app")

STATUS_FILE = "status.json"
SPEC_FILE = "spec.json"
MAPS_DIR = "maps"
BUILD_LOCK = ".build.lock"
#: What :meth:`Registry.register` names a model (``uuid4().hex``).
_MODEL_ID = re.compile(r"[0-9a-f]{32}")
#: Name prefix of an upload's directory while it is checked (renamed to the id when done).
UPLOAD_PREFIX = ".tmp-"
FORMAT_VERSION = 1
REQUEUED = "no process builds the model ({status}): its build is queued here"


def now() -> str:
    """Current UTC time, ISO 8601 to the microsecond: the model list's order is by
    creation time, and models uploaded within one second sorted by id instead (a page's
    cursor then skipped one uploaded after it with a smaller id)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` atomically: a reader sees the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    # Makes the rename durable; not supported on every platform/filesystem.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class ModelEntry:
    """One registered model: its persisted description plus runtime state.

    ``model`` (the estimator, for ``/predict`` and for building) and ``maps`` are set while
    the model is usable. ``progress`` is written by the build thread without a lock (a
    float assignment is atomic in CPython).
    """

    id: str
    name: str | None
    status: str
    format: str
    model_type: str
    features: list[dict[str, Any]]
    class_labels: list[Any]
    class_names: list[str] | None
    created_at: str
    updated_at: str
    error: str | None = None
    stats: dict[str, Any] | None = None
    fingerprint: str | None = None
    # SHA-256 of the stored model file as uploaded (None: stored before it was recorded)
    model_sha256: str | None = None
    progress: float = 0.0
    model: Any = None
    maps: CounterfactualMaps | None = None
    raw_classes: list[Any] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    io_lock: threading.Lock = field(default_factory=threading.Lock)
    #: This process builds the model (it holds the build lock): its state is authoritative
    #: here, and the data-dir sync leaves it alone.
    building_here: bool = False
    #: :func:`_stamp` of ``status.json`` when this process last read or wrote it.
    seen_stamp: tuple[int, int, int] = (0, 0, 0)
    #: Its ``status.json`` or ``spec.json`` could not be read when this process first saw
    #: it: shown failed (and deletable) with the reason, replaced by what the files say
    #: once they read again (every sync pass tries).
    unreadable: bool = False
    #: :func:`_stamp` of ``status.json`` when its files last failed to read after this
    #: process had read them (warned once per change; the last state is kept).
    damaged_stamp: tuple[int, int, int] | None = None
    _codec: FeatureCodec | None = None
    _display: dict[Any, Any] = field(default_factory=dict)

    # -- derived ----------------------------------------------------------------------
    @property
    def schema(self) -> FeatureSchema:
        return FeatureSchema.from_dicts(self.features)

    @property
    def codec(self) -> FeatureCodec:
        if self._codec is None:
            schema = self.schema
            self._codec = FeatureCodec(schema.names, list(schema.integral_mask()))
        return self._codec

    @property
    def classes(self) -> list[Any]:
        """Public class names: display names when the spec gave them, else the labels."""
        return list(self.class_names) if self.class_names else list(self.class_labels)

    def display(self, label: Any) -> Any:
        """Public name of a class label as the engine or the model returns it."""
        if label is None:
            return None
        key = py_scalar(label)
        if not self._display:
            self._display = dict(zip(self.class_labels, self.classes, strict=True))
        return self._display.get(key, key)

    def target_resolver(self) -> Callable[[Any], Any]:
        """The resolver of requested targets for a query answered with this model's maps
        as they are now (a query waits for a worker thread, and a delete meanwhile takes
        the entry's maps away: the query still answers with the maps it was given).

        The resolver returns the model's own label for a requested target class (None:
        none asked for), the one place the service resolves them: a display name, else a
        label as the engine reads it (:meth:`maps_core.CounterfactualMaps.target_index`:
        ``1``, ``1.0``, the text ``"1"``, or ``"1"`` for label 1.0, as a query string
        carries it).

        Display names win over labels when both could match (``"1"`` names the class whose
        display name is "1", not label 1), because clients echo back what responses show.
        For an unknown class it raises :class:`InvalidQueryError` naming the classes as
        the responses show them (the engine would name the model's own labels, ``[0, 1]``
        for classes a client knows as ``["neg", "pos"]``); the engine's own error for a
        target that is no label.
        """
        maps = self.maps
        assert maps is not None, "targets are resolved for ready models"
        raw = self.raw_classes or self.class_labels
        names, classes = self.class_names, self.classes

        def resolve(target: Any) -> Any:
            if target is None:
                return None
            if names and isinstance(target, str):
                for i, n in enumerate(names):
                    if n == target:
                        return raw[i]
            if not isinstance(target, str | int | float | bool):
                return target  # the engine says what is wrong with it
            try:
                return raw[maps.target_index(target)]
            except InvalidQueryError as exc:
                raise InvalidQueryError(f"unknown class {target!r}; classes are {classes}",
                                        "target") from exc

        return resolve

    def info(self) -> dict[str, Any]:
        """The public description (``GET /v1/models/{id}``)."""
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "progress": 1.0 if self.status == "ready" else round(self.progress, 4),
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "format": self.format,
            "model_type": self.model_type,
            "features": self.features,
            "classes": self.classes,
            "class_labels": self.class_labels,
            "stats": self.stats,
        }

    def persisted(self) -> dict[str, Any]:
        """Contents of ``status.json``."""
        return {
            "format_version": FORMAT_VERSION,
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "format": self.format,
            "model_type": self.model_type,
            "class_labels": self.class_labels,
            "stats": self.stats,
            "fingerprint": self.fingerprint,
            "model_sha256": self.model_sha256,
            "progress": round(self.progress, 4),
        }


def stats_dict(maps: CounterfactualMaps, class_names: list[Any]) -> dict[str, Any]:
    """Build statistics for the API (``rectangles_per_class`` keyed by public class name)."""
    s = maps.stats
    per_class = {str(c): int(n) for c, n in zip(class_names, s.rectangles_per_class, strict=False)}
    return {
        "seconds": round(float(s.seconds), 6),
        "rectangles": int(sum(s.rectangles_per_class)),
        "rectangles_per_class": per_class,
        "mixed_regions": int(s.mixed_regions),
        "thresholds_per_feature": [int(t) for t in s.thresholds_per_feature],
        "bytes_on_disk": int(s.bytes_on_disk),
    }


def _cursor_key(cursor: str) -> tuple[str, str]:
    """The (created_at, id) place a :meth:`Registry.page` cursor names; an
    :class:`InvalidInputError` for anything else."""
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, RecursionError):  # (Unicode/JSONDecodeError too)
        key = None
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(k, str) for k in key)):
        raise InvalidInputError(
            "cursor is not one this service handed out: pass a page's next_cursor as it "
            "came, or none for the first page", "cursor")
    return key[0], key[1]


class Registry:
    """All models of one data dir, keyed by id. Thread-safe.

    Parameters
    ----------
    settings : Settings
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.models_dir
        self._entries: dict[str, ModelEntry] = {}
        self._lock = threading.RLock()
        self.loaded = threading.Event()
        self._pending: list[ModelEntry] = []
        self._requeue: list[ModelEntry] = []
        #: Ids deleted through this process whose directory a sync pass may still have
        #: listed: the sync must not bring them back (cleared once they are off the disk).
        self._deleted: set[str] = set()
        #: Held over a sync pass and over :meth:`catch_up`, so that a request catching up
        #: on one model waits for a pass that is loading it instead of loading it twice.
        self._sync_lock = threading.Lock()
        self.on_change: Callable[[], None] | None = None
        #: Called with an entry whose build must run again (set by the app to its build
        #: manager's ``submit``): an interrupted build, or maps of an older format.
        self.on_requeue: Callable[[ModelEntry], Any] | None = None

    # -- lookup -----------------------------------------------------------------------
    def get(self, model_id: str) -> ModelEntry:
        entry = self._entries.get(model_id)
        if entry is None:
            raise ModelNotFoundError(f"no model with id {model_id!r}", "model_id")
        return entry

    def get_ready(self, model_id: str) -> ModelEntry:
        """The entry, if it can answer queries; 404/409 otherwise."""
        entry = self.get(model_id)
        if entry.status != "ready" or entry.maps is None or entry.model is None:
            detail = {
                "queued": "its build is queued",
                "building": f"its maps are being built ({entry.progress:.0%} done)",
                "loading": "it is being loaded after a restart",
                "failed": f"its build or load failed: {entry.error}",
            }.get(entry.status, entry.status)
            headers = (
                {"Retry-After": "1"} if entry.status in ("queued", "building", "loading") else None
            )
            raise ModelNotReadyError(
                f"model {model_id!r} is not ready: {detail}", "model_id", headers
            )
        return entry

    def list(self) -> list[ModelEntry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: (e.created_at, e.id))

    def page(self, limit: int, cursor: str | None = None,
             status: str | None = None) -> tuple[Sequence[ModelEntry], str | None]:
        """A page of :meth:`list` (by creation time, then id), optionally of one status:
        at most ``limit`` entries after ``cursor``, and the cursor of the next page
        (``None`` on the last).

        The cursor names the last entry's place in that order, not its position: a model
        uploaded between two pages comes on a later page (it was created after the
        cursor's), one deleted meanwhile is simply not listed, and none is repeated. A
        model that another process created earlier, but that this one has not read yet
        (the data dir is read every ``CFMAPS_SYNC_INTERVAL_SECONDS``), may be missed by a
        traversal under way. It is opaque to clients.
        """
        after = None if cursor is None else _cursor_key(cursor)
        entries = [e for e in self.list()
                   if (status is None or e.status == status)
                   and (after is None or (e.created_at, e.id) > after)]
        if len(entries) <= limit:
            return entries, None
        last = entries[limit - 1]
        token = json.dumps([last.created_at, last.id], separators=(",", ":"))
        return entries[:limit], base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")

    def counts(self) -> dict[str, int]:
        """Models per status (for metrics)."""
        out = dict.fromkeys(("queued", "building", "loading", "ready", "failed"), 0)
        for e in list(self._entries.values()):
            out[e.status] = out.get(e.status, 0) + 1
        return out

    def all_loaded(self) -> bool:
        return self.loaded.is_set()

    # -- start ------------------------------------------------------------------------
    def open(self) -> None:
        """Scan the data dir (quick: reads small JSON files); loading is :meth:`load_pending`.

        Removes leftovers of interrupted uploads and deletes. An interrupted build (the
        service stopped while a model was queued or building) is queued again: its model
        file is on disk, so :meth:`load_pending` reads it and hands it to ``on_requeue``.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        pending = []
        requeue = []
        for d in sorted(self.root.iterdir()):
            if not d.is_dir():
                if d.name.startswith(UPLOAD_PREFIX) and d.name.endswith(".lock"):
                    _remove_leftover(d)  # an upload's lock file, its directory gone
                continue
            if d.name.startswith("."):
                _remove_leftover(d)
                continue
            if _MODEL_ID.fullmatch(d.name) is None:
                # an operator's backup (``<id>.bak``), notes, anything: never a model, so
                # never listed, and never removed by a client's DELETE
                log.warning("skipping %s: not a model directory (its name is no model id)", d)
                continue
            try:
                entry = self._read_entry(d)
            except Exception as exc:  # a hand-edited or truncated file must not stop start-up
                entry = self._unreadable_entry(d, exc)
            entry.seen_stamp = _stamp(d / STATUS_FILE)
            if entry.status in ("queued", "building"):
                requeue.append(entry)  # claimed in load_pending unless a process builds it
            elif entry.status == "ready":
                entry.status = "loading"
                pending.append(entry)
            with self._lock:
                self._entries[entry.id] = entry
        # readiness waits for load_pending, even with nothing to load: the service warms
        # its query kernels up before it (app.main._load_pending)
        self._pending = pending
        self._requeue = sorted(requeue, key=lambda e: (e.created_at, e.id))  # upload order

    def load_pending(self) -> None:
        """Load every model that was ready on disk, and read the model files of the builds
        to queue again (runs in a background thread)."""
        try:
            for entry in self._pending:
                if entry.cancel.is_set():
                    continue
                self._load_entry(entry)
            for entry in self._requeue:
                if not entry.cancel.is_set():
                    self._claim_orphan(entry)
        finally:
            self._pending = []
            self._requeue = []
            self.loaded.set()

    def _queue_again(self, entry: ModelEntry) -> None:
        """Read the stored model file of ``entry`` and submit its build (the build thread
        takes the build lock, persists ``building``, or leaves the model to the process
        that holds the lock)."""
        if self.on_requeue is None:
            # This process never builds (role api): wait, queued, for a process that does;
            # the sync follows its progress and loads the maps once they are ready.
            with self._lock:
                entry.maps = None
                entry.status = "queued"
                entry.error = None
            self._changed()
            return
        try:
            model = self._read_model_file(entry)
        except (MapsError, ApiError, OSError, KeyError) as exc:
            entry.building_here = False  # not built here after all (a claim is undone)
            self.fail_in_memory(entry, f"could not read the stored model file: {_describe(exc)}")
            return
        with self._lock:
            if self._entries.get(entry.id) is not entry:
                entry.building_here = False
                return  # deleted meanwhile
            entry.building_here = True  # claimed: the sync leaves it to the build thread
            entry.model = model
            entry.raw_classes = list(model.classes_)
            entry.maps = None
            # queued until its build thread starts it (and persists "building" from 0): it
            # showed the progress an interrupted build had reached while it waited
            was = entry.status
            entry.status, entry.progress = "queued", 0.0
            entry.error = None
        log.warning("model %s: %s", entry.id, REQUEUED.format(status=was))
        self._changed()
        self.on_requeue(entry)

    def _read_entry(self, d: Path) -> ModelEntry:
        status = json.loads((d / STATUS_FILE).read_text(encoding="utf-8"))
        spec = json.loads((d / SPEC_FILE).read_text(encoding="utf-8"))
        if status.get("id") != d.name:
            raise ValueError(f"status.json names id {status.get('id')!r}")
        if status.get("status") not in _STATUSES:  # hand-edited: served as is, it broke counts
            raise ValueError(f"status.json has the unknown status {status.get('status')!r}")
        return ModelEntry(
            id=d.name,
            name=spec.get("name"),
            status=str(status["status"]),
            format=str(status["format"]),
            model_type=str(status.get("model_type", "")),
            features=list(spec["features"]),
            class_labels=list(status["class_labels"]),
            class_names=spec.get("classes"),
            created_at=str(status["created_at"]),
            updated_at=str(status.get("updated_at", status["created_at"])),
            error=status.get("error"),
            stats=status.get("stats"),
            fingerprint=status.get("fingerprint"),
            model_sha256=status.get("model_sha256"),
            progress=float(status.get("progress") or 0.0),
        )

    def _add_unreadable(self, model_id: str, stamp: tuple[int, int, int],
                        exc: Exception) -> None:
        """List an unknown model directory whose files do not read as failed (a sync
        pass; the caller holds ``_sync_lock``)."""
        try:
            entry = self._unreadable_entry(self.root / model_id, exc)
        except OSError:
            return  # gone meanwhile
        entry.seen_stamp = stamp
        with self._lock:
            if model_id in self._entries or model_id in self._deleted:
                return
            self._entries[model_id] = entry
        self._changed()

    def _unreadable_entry(self, d: Path, exc: Exception) -> ModelEntry:
        """A failed entry for a model directory whose ``status.json`` or ``spec.json`` does
        not read (truncated, hand-edited, missing): listed with the reason and deletable,
        where skipping it left files no client could see or delete (404)."""
        message = (f"unreadable model directory (status.json or spec.json): "
                   f"{_describe(exc)}; repair the file or delete the model")
        log.error("model %s: %s", d.name, message)
        fmt = next((f for f, name in modelio.FILE_NAMES.items() if (d / name).exists()), "")
        ts = datetime.fromtimestamp(d.stat().st_mtime, UTC).isoformat(timespec="seconds")
        return ModelEntry(id=d.name, name=None, status="failed", format=fmt, model_type="",
                          features=[], class_labels=[], class_names=None, created_at=ts,
                          updated_at=ts, error=self.public(message), unreadable=True)

    def _file_as_uploaded(self, entry: ModelEntry) -> bool:
        """Whether the stored model file is the one uploaded: its digest is the one
        recorded then, or none was recorded (stored by an earlier version)."""
        return entry.model_sha256 is None or entry.model_sha256 == file_sha256(self.model_file(entry))

    def model_file(self, entry: ModelEntry) -> Path:
        """The stored (uploaded) model file of ``entry``."""
        return self.root / entry.id / modelio.FILE_NAMES[entry.format]

    def _read_model_file(self, entry: ModelEntry) -> Any:
        """The model stored with ``entry``, through the same safe loader as an upload."""
        model, _ = modelio.load_model_file(
            self.model_file(entry),
            trust_pickle=self.settings.trust_pickle,
            max_unpacked_bytes=self._max_unpacked(),
        )
        return model

    def _load_entry(self, entry: ModelEntry) -> None:
        d = self.root / entry.id
        try:
            model = self._read_model_file(entry)
            try:
                maps = CounterfactualMaps.load(d / MAPS_DIR)
            except IncompatibleArtifactError as exc:
                # Maps of an older format (say, before real-line cell bounds): the model
                # file is here, so rebuild them rather than fail the model.
                log.warning("model %s: %s; rebuilding its maps", entry.id, exc)
                self._queue_again(entry)
                return
            # near-tie points decided by the model, as in the build; attaching flattens
            # the model once and checks it is the one the maps were built from
            try:
                maps.attach_model(model)
                belong = entry.fingerprint is None or entry.fingerprint == maps.fingerprint
            except ArtifactError:
                belong = False
            if not belong:
                if not self._file_as_uploaded(entry):
                    raise InvalidInputError(
                        "the maps do not belong to the model file next to them: the file "
                        "changed since its upload")
                # The file is the one uploaded (or its upload recorded no digest), so this
                # version reads it differently (an adapter fixed: XGBoost 1.5's categorical
                # rule changed the maps of such models): its maps are rebuilt from it.
                log.warning("model %s: the maps do not match the model file as this version "
                            "reads it; rebuilding its maps", entry.id)
                self._queue_again(entry)
                return
            if maps.feature_names != [f["name"] for f in entry.features]:
                raise InvalidInputError("the maps' features differ from spec.json")
            # the codec and the answers read the features' types and bounds from spec.json:
            # one edited by hand (a type no schema has) made a ready model answer every
            # query 422 invalid_schema, blaming the client for a file on the server
            try:
                schema = entry.schema
            except MapsError as exc:
                raise InvalidInputError(f"spec.json's features do not read: {exc}") from None
            if schema != maps.schema:
                raise InvalidInputError("spec.json's features (types or bounds) differ from "
                                        "the maps'")
            # the classes the answers are named by (hand-edited files had every query
            # fail with a 500 while the model showed ready)
            labels = [py_scalar(c) for c in model.classes_]
            if entry.class_labels != labels:
                raise InvalidInputError(f"status.json's class_labels {entry.class_labels} "
                                        f"differ from the model's classes {labels}")
            names = entry.class_names
            if names is not None and (
                    not isinstance(names, list) or len(names) != len(labels)
                    or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names)):
                raise InvalidInputError(f"spec.json's classes {names!r} do not name the "
                                        f"model's {len(labels)} classes, one distinct text each")
        except (MapsError, ApiError, OSError, KeyError) as exc:
            if not d.exists():
                # deleted by another process while this one read it: gone, not failed
                log.info("model %s: deleted while it loaded", entry.id)
                self._forget(entry)
                return
            self.fail_in_memory(entry, f"could not load the model: {_describe(exc)}")
            return
        except Exception as exc:  # keep start-up going; this is logged with its traceback
            log.exception("model %s: unexpected error while loading", entry.id)
            self.fail_in_memory(entry, f"could not load the model: {_describe(exc)}")
            return
        with self._lock:
            if self._entries.get(entry.id) is not entry:
                return  # deleted while loading
            entry.model = model
            entry.raw_classes = list(model.classes_)
            entry.maps = maps
            entry.status = "ready"
            entry.progress = 1.0
        log.info("model %s loaded", entry.id)
        self._changed()

    def fail_in_memory(self, entry: ModelEntry, message: str) -> None:
        """Show ``entry`` as failed with ``message`` in this process, and log it: a model
        that cannot be loaded, or whose status the data dir refused to write. In memory
        only (see the module docstring): the files stay as they are, so a restart, once
        they are repaired, tries again; and the sync does not queue a failed model. The
        status file as it is now counts as seen, so that the sync does not take its older
        status back (a file still ``queued`` was queued again every pass); a change to it
        by another process still shows."""
        log.error("model %s: %s", entry.id, message)
        stamp = _stamp(self.root / entry.id / STATUS_FILE)
        with self._lock:
            entry.status = "failed"
            entry.error = self.public(message)
            entry.seen_stamp = stamp
        self._changed()

    def _max_unpacked(self) -> int:
        return self.settings.max_upload_bytes * self.settings.max_unpacked_factor

    # -- upload -----------------------------------------------------------------------
    def register(
        self, upload: IO[bytes], spec: ModelSpec, filename: str | None = None
    ) -> ModelEntry:
        """Store an uploaded model, check it, and register it as ``queued``.

        Parameters
        ----------
        upload : binary file
            The uploaded model file (read from its current position).
        spec : ModelSpec
            The parsed spec.
        filename : str, optional
            Client-side file name, used as the model name when the spec has none.

        Raises
        ------
        InvalidInputError, UnsafeModelFileError, PayloadTooLargeError, UnsupportedModelFileError
        StorageError
            The data dir refused the upload's files (:class:`StorageFullError` when full);
            nothing is left of them.
        """
        try:
            return self._register(upload, spec, filename)
        except OSError as exc:
            raise self._storage_error(exc, "store the upload") from exc

    def _storage_error(self, exc: OSError, doing: str) -> StorageError:
        """The client's error for a write the data dir refused (logged in full here; the
        message leaves out the server's paths)."""
        log.warning("data dir: cannot %s: %s", doing, exc)
        words = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StorageFullError(f"cannot {doing}: the data dir is full ({words})")
        return StorageError(f"cannot {doing}: the data dir refused the write ({words})")

    def _register(self, upload: IO[bytes], spec: ModelSpec, filename: str | None) -> ModelEntry:
        model_id = uuid.uuid4().hex
        tmp = self.root / f"{UPLOAD_PREFIX}{model_id}"
        self.root.mkdir(parents=True, exist_ok=True)
        # Held until the upload is registered or abandoned: another process starting on
        # this data dir removes only upload directories nobody holds (see open()).
        guard = BuildLock.acquire(_upload_lock(tmp))
        if guard is None:
            raise PermissionError(errno.EACCES, "cannot lock the upload directory")
        try:
            tmp.mkdir()
            raw_path = tmp / "upload"
            self._copy_upload(upload, raw_path)
            model, fmt = modelio.load_model_file(
                raw_path,
                trust_pickle=self.settings.trust_pickle,
                max_unpacked_bytes=self._max_unpacked(),
            )
            try:
                ens = flatten_model(model)
                labels = [py_scalar(c) for c in model.classes_]
                if not all(isinstance(c, str | int | float | bool) for c in labels):
                    raise InvalidInputError("class labels must be strings or numbers", "model")
                if any(isinstance(c, float) and not math.isfinite(c) for c in labels) or len(
                        {(isinstance(c, bool), c) for c in labels}) != len(labels):
                    raise InvalidInputError(
                        f"class labels must be distinct and finite, got {labels}", "model")
                check_flattened(model, ens)
            except UnsupportedModelError as exc:  # 422 with the engine's words, on the file
                raise UnsupportedModelFileError(str(exc), "model") from exc
            except (AttributeError, TypeError, ValueError, IndexError, KeyError) as exc:
                # an uploaded object whose attributes are not what its class promises (a
                # skops file of trusted types, one of them changed): the file's fault
                raise UnsupportedModelFileError(
                    f"the model object is malformed: {type(exc).__name__}: {exc}", "model") from exc
            schema = _schema_for(spec, ens)
            names = _class_names(spec, labels)
            os.replace(raw_path, tmp / modelio.FILE_NAMES[fmt])
            digest = file_sha256(tmp / modelio.FILE_NAMES[fmt])
            ts = now()
            entry = ModelEntry(
                id=model_id,
                name=spec.name or _stem(filename),
                status="queued",
                format=fmt,
                model_type=type(model).__name__,
                features=schema.to_dicts(),
                class_labels=labels,
                class_names=names,
                created_at=ts,
                updated_at=ts,
                fingerprint=ens.fingerprint(),
                model_sha256=digest,
                model=model,
                raw_classes=list(model.classes_),
                # Claimed for this process's build before the directory shows, when this
                # process builds: the caller submits it after an ``await``, and a sync
                # pass in between must not take it for an orphan and queue it twice.
                building_here=self.on_requeue is not None,
            )
            write_json_atomic(
                tmp / SPEC_FILE,
                {"name": entry.name, "features": entry.features, "classes": entry.class_names},
            )
            write_json_atomic(tmp / STATUS_FILE, entry.persisted())
            # Registered before the directory appears under its name, so that a sync pass
            # that lists it takes it for this process's, not for a stranger's to adopt.
            with self._lock:
                self._entries[model_id] = entry
            try:
                os.replace(tmp, self.root / model_id)
            except BaseException:
                with self._lock:
                    del self._entries[model_id]
                raise
            _fsync_dir(self.root)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            _upload_lock(tmp).unlink(missing_ok=True)
            guard.release()
        self._changed()
        return entry

    def _copy_upload(self, upload: IO[bytes], dest: Path) -> None:
        limit = self.settings.max_upload_bytes
        size = 0
        with open(dest, "wb") as out:
            while chunk := upload.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLargeError(
                        f"the model file exceeds the limit of {limit} bytes", "model"
                    )
                out.write(chunk)

    # -- status transitions (build thread) --------------------------------------------
    def set_status(self, entry: ModelEntry, status: str, error: str | None = None) -> bool:
        """Persist a new status; False (and nothing written) when the entry was deleted."""
        with self._lock:
            if entry.cancel.is_set() or self._entries.get(entry.id) is not entry:
                return False
            error = None if error is None else self.public(error)
            self._persist(entry, status=status, error=error, updated_at=now())
        self._changed()
        return True

    def public(self, message: str) -> str:
        """``message`` without the server's data-dir path (a model's error is shown to
        every client with a query token): ``<root>/<id>/maps: ...`` reads ``<id>/maps:
        ...``; the log keeps the full text."""
        return message.replace(f"{self.root}{os.sep}", "").replace(str(self.root), ".")

    def maps_dir(self, entry: ModelEntry) -> Path:
        return self.root / entry.id / MAPS_DIR

    def attach(self, entry: ModelEntry, maps: CounterfactualMaps) -> bool:
        """Attach freshly built, re-loaded maps (status unchanged until :meth:`publish_ready`).

        Returns False when the entry was deleted meanwhile.
        """
        with self._lock:
            if entry.cancel.is_set() or self._entries.get(entry.id) is not entry:
                return False
            entry.maps = maps
            entry.stats = stats_dict(maps, entry.classes)
            entry.fingerprint = maps.fingerprint
        return True

    def publish_ready(self, entry: ModelEntry) -> bool:
        """Persist and expose ``ready`` for an entry whose maps are attached."""
        with self._lock:
            if entry.cancel.is_set() or self._entries.get(entry.id) is not entry:
                return False
            assert entry.maps is not None
            self._persist(entry, progress=1.0, status="ready", error=None, updated_at=now())
        self._changed()
        return True

    def _persist(self, entry: ModelEntry, **changes: Any) -> None:
        """Write ``status.json`` with ``changes`` (fields of :meth:`ModelEntry.persisted`),
        then make them in memory. The file first: the routes read entries without the lock,
        so a status set in memory first was answered here (a client polling this process
        saw ``ready``) while the other processes still read ``building`` from the file and
        answered 409 (seen once in test_processes under load)."""
        d = self.root / entry.id
        if d.is_dir():
            write_json_atomic(d / STATUS_FILE, {**entry.persisted(), **changes})
            entry.seen_stamp = _stamp(d / STATUS_FILE)
        for name, value in changes.items():
            setattr(entry, name, value)

    def persist_progress(self, entry: ModelEntry) -> None:
        """Write a running build's progress to disk, for the other processes."""
        with self._lock:
            if not entry.cancel.is_set() and self._entries.get(entry.id) is entry:
                self._persist(entry)

    # -- several processes over one data dir -------------------------------------------
    def build_lock(self, entry: ModelEntry) -> BuildLock | None:
        """The lock that makes this process the one building ``entry``, or None when
        another process holds it (or the model is gone)."""
        return BuildLock.acquire(self.root / entry.id / BUILD_LOCK)

    def settled_elsewhere(self, entry: ModelEntry) -> bool:
        """Whether another process finished ``entry``'s build (``ready`` or ``failed`` on
        disk) since this process last read or wrote its status.

        A build thread asks once it holds the build lock. A process that finishes a build
        writes the final status before it releases the lock, so a build queued here in the
        meantime (queued behind other builds, or claimed as an orphan by a sync pass that
        read the status just before it changed) has nothing left to do.
        """
        status_file = self.root / entry.id / STATUS_FILE
        if _stamp(status_file) == entry.seen_stamp:
            return False
        try:
            status = json.loads(status_file.read_text(encoding="utf-8")).get("status")
        except (OSError, ValueError):
            return False  # gone or half-written: the build decides (set_status checks)
        return status in ("ready", "failed")

    def sync(self) -> None:
        """Make this process's view match the data dir, which other processes (API
        replicas, a builder) write too: models added elsewhere appear (ready ones are
        loaded), deleted ones disappear, status and progress changes show. Models this
        process builds are left alone. Queued models no process builds (an upload through
        an API-only replica, an interrupted build) are handed to ``on_requeue`` when this
        process builds (role ``all`` or ``builder``)."""
        with self._sync_lock:
            try:
                names = {d.name for d in self.root.iterdir()
                         if d.is_dir() and _MODEL_ID.fullmatch(d.name) is not None}
            except OSError:
                return
            with self._lock:
                # A delete removes the entry and adds the tombstone under this lock: whatever
                # the listing above saw, a model deleted here is in neither ``known`` nor
                # ``names``.
                self._deleted &= names
                names -= self._deleted
                known = dict(self._entries)
            for model_id in set(known) - names:  # deleted through another process
                self._forget(known[model_id])
            for model_id in sorted(names):
                self._sync_one(model_id, known.get(model_id))

    def behind(self, model_id: str) -> bool:
        """Whether the data dir may know more about ``model_id`` than this process: it is
        unknown here but has a directory, or another process changed its status since the
        last sync pass, or deleted a model this process holds ready or failed, or a sync
        pass is loading it. Cheap (a ``stat``); see :meth:`catch_up`."""
        entry = self._entries.get(model_id)
        if entry is None:
            # Ids are ``uuid4().hex``: anything else (a client's typo, a fuzzer's 2 KB of
            # combining marks) is not looked up on disk at all.
            return (_MODEL_ID.fullmatch(model_id) is not None
                    and model_id not in self._deleted and (self.root / model_id).is_dir())
        if entry.building_here:
            return False
        if entry.status in ("ready", "failed"):
            # Their status does not change elsewhere, but another process may delete them:
            # a client told 204 there must get 404 here, not the model until the next sync
            # pass (with two workers, half of the requests right after a DELETE did).
            return not (self.root / model_id).is_dir()
        if entry.status == "loading":
            return self.loaded.is_set()  # a sync pass loads it (not the start-up loader)
        return _stamp(self.root / model_id / STATUS_FILE) != entry.seen_stamp

    def catch_up(self, model_id: str) -> None:
        """Bring one model up to date with the data dir now, rather than at the next sync
        pass: a model uploaded or finished through another process answers here at once
        (read-your-writes across workers and replicas). Blocks while a model is loaded, so
        the routes call it in a worker thread, only when :meth:`behind` says so."""
        if _MODEL_ID.fullmatch(model_id) is None:
            return
        with self._sync_lock:
            with self._lock:
                if model_id in self._deleted:
                    return
                entry = self._entries.get(model_id)
            if (self.root / model_id).is_dir():
                self._sync_one(model_id, entry)
            elif entry is not None and not entry.building_here:
                # deleted through another process: gone here too (its last status, say
                # "building", answered 409 until the next sync pass)
                self._forget(entry)

    def _forget(self, gone: ModelEntry) -> None:
        """Drop a model another process deleted (the caller holds ``_sync_lock``)."""
        with self._lock:
            if self._entries.get(gone.id) is gone:
                gone.cancel.set()
                del self._entries[gone.id]
        gone.model = None
        gone.maps = None
        self._changed()

    def _sync_one(self, model_id: str, entry: ModelEntry | None) -> None:
        """One model's step of a sync pass (the caller holds ``_sync_lock``)."""
        if entry is not None and (entry.building_here or entry.status == "loading"):
            return
        stamp = _stamp(self.root / model_id / STATUS_FILE)
        if entry is not None and stamp == entry.seen_stamp and not entry.unreadable:
            if entry.status in ("queued", "building"):
                self._claim_orphan(entry)
            return
        try:
            fresh = self._read_entry(self.root / model_id)
        except Exception as exc:
            # Every writer replaces these files whole (write_json_atomic) and a model's
            # directory appears whole (a rename), so a file that does not read is damaged,
            # not half-written. A model known here keeps its last state (a loaded one goes
            # on answering), with one warning per change of its status file; one not seen
            # before is listed failed, as at start-up (open), where skipping it left a
            # directory no client could see or delete.
            if entry is None:
                self._add_unreadable(model_id, stamp, exc)
            elif not entry.unreadable and stamp != entry.damaged_stamp:
                entry.damaged_stamp = stamp
                log.warning("model %s: its files no longer read (%s); keeping its last "
                            "state", model_id, _describe(exc))
            return
        fresh.seen_stamp = stamp
        if entry is not None and entry.unreadable:
            entry = None  # its files read again: what they say replaces it, as a new model
            with self._lock:
                self._entries.pop(model_id, None)
        # Ready on disk means "loading" here until the maps are in: an entry published as
        # ready without them answered a request in between with a 409 ("not ready:
        # ready"), where "loading" makes it wait for this pass (behind, catch_up).
        load = fresh.status == "ready"
        if load:
            fresh.status = "loading"
        if entry is None:
            with self._lock:
                if model_id in self._entries or model_id in self._deleted:
                    return
                self._entries[model_id] = fresh
            entry = fresh
            if load:
                self._load_entry(fresh)
                return
        else:
            with self._lock:
                if entry.building_here:
                    return  # claimed since the check above: its build thread owns it now
                was_ready = entry.status == "ready" and entry.maps is not None
                entry.seen_stamp = stamp
                entry.status = fresh.status if not was_ready else entry.status
                entry.error, entry.stats = fresh.error, fresh.stats
                entry.progress, entry.updated_at = fresh.progress, fresh.updated_at
                entry.fingerprint = fresh.fingerprint
            if load and not was_ready:
                self._load_entry(entry)
                return
            self._changed()
        if entry.status in ("queued", "building"):
            self._claim_orphan(entry)

    def _claim_orphan(self, entry: ModelEntry) -> None:
        """Queue the build of a queued/building model that no process builds (nobody holds
        its build lock), when this process builds at all."""
        if self.on_requeue is None:
            self._show_unbuilt(entry)
            return
        with self._lock:
            # Checked and claimed in one step: a build thread of this process finishing
            # the model meanwhile must not leave it to be queued a second time.
            if (entry.building_here or entry.cancel.is_set()
                    or entry.status not in ("queued", "building")):
                return
            entry.building_here = True
        probe = BuildLock.acquire(self.root / entry.id / BUILD_LOCK)
        if probe is None:
            entry.building_here = False
            return  # another process builds it
        probe.release()
        self._queue_again(entry)

    def _show_unbuilt(self, entry: ModelEntry) -> None:
        """On a process that never builds (role ``api``): show a build that a dead process
        left ``building`` on disk as ``queued`` from 0, as a builder will restart it.

        A builder killed mid-build (SIGKILL, the OOM killer) cannot write its build back
        ``queued`` as a stopping one does, and this replica reported ``building`` with the
        progress it had reached until a builder took it over, forever when none runs. The
        only way to tell is to try the build lock: a live builder holds it, and the OS
        dropped a dead one's. Taking it for a moment can make a builder claiming the model
        at that instant leave it to its next sync pass (half a second by default), never
        lose it. Memory only: the files are the builder's to write.
        """
        if entry.status != "building":
            return
        probe = BuildLock.acquire(self.root / entry.id / BUILD_LOCK)
        if probe is None:
            return  # a builder runs it (or the data dir refuses the lock file: cannot tell)
        try:
            # A builder writes its final status before it releases the lock: a status file
            # changed since this pass read it may say "ready", which the next pass loads.
            if _stamp(self.root / entry.id / STATUS_FILE) != entry.seen_stamp:
                return
        finally:
            probe.release()
        with self._lock:
            if self._entries.get(entry.id) is not entry or entry.status != "building":
                return
            entry.status, entry.progress = "queued", 0.0
        log.warning("model %s: no process builds it (its builder died); queued until a "
                    "builder takes it over", entry.id)
        self._changed()

    # -- delete -----------------------------------------------------------------------
    def delete(self, model_id: str) -> None:
        """Forget a model and remove its files; a running build is cancelled. A model
        uploaded through another process and not seen here yet is deleted too (not a
        :class:`~app.errors.ModelNotFoundError`); one whose files another process removed
        first (a DELETE there) is forgotten here and is a ``ModelNotFoundError``: of two
        DELETEs racing in two processes, one answers 204 and the other 404. Blocks while a
        build writes its files. A :class:`~app.errors.StorageError` when the data dir
        refuses the removal: the model stays as it was."""
        if self.behind(model_id):
            self.catch_up(model_id)
        self.get(model_id)  # a 404 first
        # A data dir that refuses writes (a read-only replica) refuses the delete before
        # anything is cancelled or forgotten here: the model stays served.
        if not os.access(self.root, os.W_OK | os.X_OK):
            ro = _read_only(self.root)
            raise self._storage_error(PermissionError(
                errno.EROFS if ro else errno.EACCES, "read-only" if ro else "no write permission"),
                "delete the model")
        with self._lock:
            entry = self.get(model_id)
            entry.cancel.set()
            del self._entries[model_id]
            self._deleted.add(model_id)
        # Wait for a build that is saving maps into the directory (see builds.py).
        gone = False
        with entry.io_lock:
            d = self.root / model_id
            trash = self.root / f".trash-{model_id}"
            if not d.exists():
                gone = True
            else:
                try:
                    os.replace(d, trash)
                except FileNotFoundError:
                    gone = True
                except OSError as exc:
                    # still on disk, so still here (and on every other replica); a build
                    # cancelled above runs again at the next start
                    with self._lock:
                        self._deleted.discard(model_id)
                        self._entries.setdefault(model_id, entry)
                    raise self._storage_error(exc, "delete the model") from exc
                else:
                    _fsync_dir(self.root)
                    shutil.rmtree(trash, ignore_errors=True)
        entry.model = None
        entry.maps = None
        self._changed()
        if gone:
            # Another process deleted it first (its rename won): that DELETE was the one
            # that removed it, so this one answers as a second DELETE in one process does.
            raise ModelNotFoundError(f"no model with id {model_id!r}", "model_id")

    def close(self) -> None:
        """Signal every running build and pending load to stop (service shutdown).

        The builds this process holds (running or queued here, under their build locks)
        are written back ``queued`` with no progress: left ``building`` on disk, a restart
        or an API replica reported a build that no process ran, with the progress it had
        reached, until one took it over from 0."""
        with self._lock:
            for e in self._entries.values():
                if e.building_here and e.status in ("queued", "building"):
                    with contextlib.suppress(OSError):  # a full disk: left as it was
                        self._persist(e, status="queued", progress=0.0, updated_at=now())
                e.cancel.set()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


class BuildLock:
    """An exclusive ``fcntl.flock`` on a model's build lock file: the process holding it
    builds the model. The OS drops it when the process dies (a crash or an OOM kill), so
    another process can take the build over."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def acquire(cls, path: Path) -> BuildLock | None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            return None  # the model directory is gone
        except OSError as exc:
            # a read-only or foreign-owned data dir: no process can build here, and the
            # model stays queued; said once per model (every sync pass tries again)
            if path not in _UNLOCKABLE:
                _UNLOCKABLE.add(path)
                log.error("cannot build the model in %s: its build lock cannot be created "
                          "(%s); it stays queued", path.parent, exc.strerror or exc)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return cls(fd)

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


#: Build lock paths whose creation failed other than by their directory being gone
#: (logged once each).
_UNLOCKABLE: set[Path] = set()


def _upload_lock(tmp: Path) -> Path:
    """The lock file held by the process writing the upload directory ``tmp``."""
    return tmp.with_name(tmp.name + ".lock")


def _remove_leftover(path: Path) -> None:
    """Remove what an interrupted upload or delete left in the data dir: a ``.trash-``
    directory, or an upload's directory or lock file that no live process holds (a
    replica starting while another process takes an upload must not pull it away)."""
    name = path.name.removesuffix(".lock")
    if not name.startswith(UPLOAD_PREFIX):
        shutil.rmtree(path, ignore_errors=True)  # a delete's trash: nobody reads it
        return
    upload = path.with_name(name)
    guard = BuildLock.acquire(_upload_lock(upload))
    if guard is None:
        return  # an upload in progress in another process
    try:
        shutil.rmtree(upload, ignore_errors=True)
        _upload_lock(upload).unlink(missing_ok=True)
    finally:
        guard.release()


def _stamp(path: Path) -> tuple[int, int, int]:
    """Which version of a file this is: (inode, mtime, size), zeros when it is missing.

    Not the mtime alone: filesystems and kernels that stamp files from a coarse clock
    (milliseconds) give two writes within one tick the same mtime. Every write here is a
    new file renamed over the old one (:func:`write_json_atomic`), so its inode changes
    too.
    """
    try:
        st = path.stat()
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _describe(exc: BaseException) -> str:
    msg = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _stem(filename: str | None) -> str | None:
    """The display name an upload's file name gives: its stem, without control characters
    (a NUL or a newline in a name breaks logs and clients), at most 200 characters, as a
    ``spec.name`` may be."""
    if not filename:
        return None
    name = "".join(ch for ch in Path(filename).name if ch.isprintable())
    return (name.rsplit(".", 1)[0] or name)[:200].strip() or None


#: The statuses a model may have (ModelInfo.status); any other in a status file makes the
#: directory unreadable (:meth:`Registry._unreadable_entry`).
_STATUSES = frozenset({"queued", "building", "loading", "ready", "failed"})


def _schema_for(spec: ModelSpec, ens: FlatEnsemble) -> FeatureSchema:
    n_features, model_names = ens.n_features, ens.feature_names
    if spec.features is None:
        names = list(model_names) if model_names is not None else None
        return FeatureSchema.default(n_features, names)
    if len(spec.features) != n_features:
        raise InvalidInputError(
            f"spec.features lists {len(spec.features)} features but the model expects {n_features}",
            "spec.features",
        )
    given = [f.name for f in spec.features]
    bad = first_misnamed(given, model_names)
    if bad is not None:
        assert model_names is not None
        raise InvalidInputError(
            f"spec.features.{bad}.name is {given[bad]!r} but the model file names that "
            f"column {str(model_names[bad])!r}; the spec must list the model's features "
            "in its order",
            f"spec.features.{bad}.name",
        )
    try:
        schema = FeatureSchema.from_dicts([f.model_dump() for f in spec.features])
        # what the build would refuse (no integer in the bounds, a range 1/range cannot
        # weigh, a weight the thresholds make unmeasurable), now rather than mid-build
        check_schema(ens, schema)
    except SchemaError as exc:  # one feature's declaration, or the list as a whole
        where = "spec.features" if exc.feature is None else f"spec.features.{exc.feature}"
        raise InvalidInputError(str(exc), where) from exc
    looks = [_looks(name) for name in given]
    for j, look in enumerate(looks):
        if look in looks[:j]:
            # as class names: "a" and " a" (or "é" in two Unicode forms) look the same in
            # every list a client reads, and a client typing one would get the other
            raise InvalidInputError(
                f"spec.features.{j}.name {given[j]!r} is the name of feature "
                f"{looks.index(look)} {given[looks.index(look)]!r} but for Unicode form or "
                "spaces around it; names must differ in more", f"spec.features.{j}.name")
    return schema


def _looks(name: str) -> str:
    """How a name looks to a person: its Unicode form (NFC) without spaces around it."""
    return unicodedata.normalize("NFC", name).strip()


def _class_names(spec: ModelSpec, labels: list[Any]) -> list[str] | None:
    if spec.classes is None:
        return None
    if len(spec.classes) != len(labels):
        raise InvalidInputError(
            f"spec.classes gives {len(spec.classes)} names but the model has "
            f"{len(labels)} classes {labels}",
            "spec.classes",
        )
    # Names that differ only by their Unicode form or by spaces around them look the same
    # in every client's list of classes and probabilities.
    looks = [_looks(name) for name in spec.classes]
    if len(set(looks)) != len(looks):
        raise InvalidInputError("spec.classes contains duplicate names (after Unicode "
                                "normalisation and trimming spaces)", "spec.classes")
    # Queries may name a class by display name or by label, display names first: a name
    # that reads as another class's label (as the engine reads labels: "1", or "1.0" for
    # label 1) would make that label mean the other class.
    for i, name in enumerate(spec.classes):
        j = match_label(labels, name)
        if j is not None and j != i:
            raise InvalidInputError(
                f"spec.classes.{i} is {name!r}, which reads as the label {labels[j]!r} of "
                f"another class (classes {labels}): a target {name!r} would be ambiguous",
                f"spec.classes.{i}")
    return list(spec.classes)


def _read_only(path: Path) -> bool:
    """Whether the file system holding ``path`` is mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
