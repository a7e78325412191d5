"""Versioned on-disk format: one directory per model.

``manifest.json`` holds the format version, the model fingerprint, classes, schema, build
statistics, for every array its file name, dtype, shape and SHA-256, and a SHA-256 of its
own model, schema, grid and partition entries (``content_sha256``). Arrays are plain
``.npy`` files, loaded memory-mapped. Saving writes a temporary sibling directory and
renames it into place, so a crash never leaves a half-written artifact under the final
name. Loading refuses anything missing, truncated, tampered with or of another format
version.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from .ensemble import FlatEnsemble
from .exceptions import (
    ArtifactError,
    ArtifactNotFoundError,
    CorruptArtifactError,
    IncompatibleArtifactError,
    MapsError,
)
from .grid import Grid
from .index import KDForest
from .partition import Partition
from .results import BuildStats
from .schema import FeatureSchema
from .splits import FLOAT32_LE

FORMAT = "cfmaps"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"

_ENSEMBLE = ("node_feature", "node_threshold", "node_left", "node_right", "node_value",
             "roots", "base")
_GRID = ("thr_offsets", "thr_values", "cell_offsets", "cell_lower", "cell_upper",
         "cell_lower_closed", "cell_upper_closed", "integral", "dom_lower", "dom_upper",
         "node_cut")
_PARTITION = ("lo", "hi", "labels")
_INDEX = tuple(f.name for f in fields(KDForest))


@dataclass(frozen=True, eq=False)
class Artifact:
    """Everything persisted for one model's maps (what :func:`save_artifact` writes and
    :func:`load_artifact` returns)."""

    ensemble: FlatEnsemble
    schema: FeatureSchema
    grid: Grid
    partition: Partition
    index: KDForest
    stats: BuildStats
    fingerprint: str


# The manifest's own entries that decide answers, under one digest: the arrays have theirs
# and the decision function the fingerprint, but an edited schema (a feature turned
# integer with a new lower bound) loaded silently and changed the answers (not integers,
# below the bound). Maps saved before the digest have none and are read as before.
_CONTENT_KEY = "content_sha256"
_CONTENT = ("model", "schema", "grid", "partition")


def _content_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the manifest's :data:`_CONTENT` entries, in canonical JSON."""
    content = {k: manifest.get(k) for k in _CONTENT}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of the file at ``path``, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _compact(a: np.ndarray, ncells_max: int) -> np.ndarray:
    """Cell-index ranges fit in uint16 for all realistic grids: halve the footprint."""
    return a.astype(np.uint16) if ncells_max <= np.iinfo(np.uint16).max else a


def check_save_path(path: str | os.PathLike[str]) -> None:
    """Raise :class:`ArtifactError` unless ``path`` may receive maps: it does not exist, or
    it is an empty directory or maps saved before (a directory holding a manifest).

    Anything else would be replaced whole: a project folder, the model file itself.
    """
    path = Path(path)
    if not os.path.lexists(path):
        # the nearest existing ancestor must be a directory to make the rest under (a
        # file there was a FileExistsError from the save, after the whole build)
        up = path.parent
        while not os.path.lexists(up) and up != up.parent:
            up = up.parent
        if os.path.lexists(up) and not up.is_dir():
            raise ArtifactError(f"{path}: {up} is a file, so no directory can be made there "
                                "for the maps; choose another path")
        return
    for attempt in range(_RETRIES):
        before = _identity(path)
        if before is None and not os.path.lexists(path):
            return  # moved aside by another save meanwhile: nothing to replace
        try:
            if path.is_dir() and ((path / MANIFEST).is_file() or not any(path.iterdir())):
                return
        except FileNotFoundError:
            return
        # Another save swapping its maps in between the checks above (_swap_in): the
        # directory moved aside under them read as "a file" and the save was refused.
        if _identity(path) == before and not _replacing(path):
            break
        time.sleep(0.005 * (attempt + 1))
    what = "a directory that holds no maps" if path.is_dir() else "a file"
    raise ArtifactError(f"{path} is {what} ({MANIFEST} missing): maps replace only maps; "
                        "choose a new path or remove it first")


def save_artifact(maps: Artifact, path: str | os.PathLike[str], *,
                  parents: bool = True) -> BuildStats:
    """Write an artifact to directory ``path`` atomically, replacing maps saved there
    before (:func:`check_save_path`: anything else there is refused with
    :class:`ArtifactError`, untouched).

    ``parents=False`` requires ``path``'s parent to exist, and keeps requiring it to the
    end: a parent removed or renamed meanwhile makes the save fail with
    ``FileNotFoundError``, nothing written (a service saving into a model's folder that
    another process deletes must not bring the folder back).

    Returns the build statistics as written, with ``bytes_on_disk`` filled in.
    """
    path = Path(path)
    check_save_path(path)
    if parents:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # permissions, a file appeared meanwhile: the caller's path
            raise ArtifactError(f"{path}: cannot make its directory: "
                                f"{exc.strerror or exc}") from exc
    # Made with os.mkdir, so the umask decides its mode (tempfile.mkdtemp's 0700 left maps
    # that another user, a replica's service account, could not load).
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    try:
        os.mkdir(tmp)
    except FileNotFoundError:
        raise  # the parent is gone (parents=False says so)
    except OSError as exc:  # a read-only or foreign parent: the caller's path
        raise ArtifactError(f"{path}: cannot write in {path.parent}: "
                            f"{exc.strerror or exc}") from exc
    try:
        ncmax = int(maps.grid.n_cells.max(initial=1))
        arrays: dict[str, np.ndarray] = {}
        for name in _ENSEMBLE:
            arrays[f"ensemble.{name}"] = getattr(maps.ensemble, name)
        for name in _GRID:
            arrays[f"grid.{name}"] = getattr(maps.grid, name)
        arrays["partition.lo"] = _compact(np.asarray(maps.partition.lo), ncmax)
        arrays["partition.hi"] = _compact(np.asarray(maps.partition.hi), ncmax)
        arrays["partition.labels"] = np.asarray(maps.partition.labels)
        for name in _INDEX:
            arrays[f"index.{name}"] = getattr(maps.index, name)
        entries: dict[str, dict[str, Any]] = {}
        for key, arr in arrays.items():
            fname = f"{key}.npy"
            np.save(tmp / fname, np.ascontiguousarray(arr), allow_pickle=False)
            entries[key] = {
                "file": fname,
                "dtype": str(np.asarray(arr).dtype),
                "shape": list(np.asarray(arr).shape),
                "sha256": file_sha256(tmp / fname),
            }
        size = sum((tmp / e["file"]).stat().st_size for e in entries.values())
        stats = asdict(maps.stats)
        ens = maps.ensemble
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "fingerprint": maps.fingerprint,
            "model": {
                "kind": ens.kind,
                "n_features": ens.n_features,
                "classes": ens.classes,
                "feature_names": ens.feature_names,
                "tie_break": ens.tie_break,
                "split_rule": ens.split_rule,
                "score_precision": ens.score_precision,
            },
            "schema": maps.schema.to_dicts(),
            "grid": {"raw_thresholds": maps.grid.raw_thresholds,
                     "view32": bool(maps.grid.view32)},
            "partition": {"counters": maps.partition.counters},
            "stats": stats,
            "arrays": entries,
        }
        # as it will read back (numpy scalars as Python numbers, tuples as lists)
        manifest[_CONTENT_KEY] = _content_digest(
            json.loads(json.dumps(manifest, default=_json_default)))
        data = json.dumps(manifest, indent=1, default=_json_default).encode()
        manifest["stats"]["bytes_on_disk"] = size + len(data)
        with open(tmp / MANIFEST, "wb") as fh:
            fh.write(json.dumps(manifest, indent=1, default=_json_default).encode())
            fh.flush()
            os.fsync(fh.fileno())
        for e in entries.values():
            with open(tmp / e["file"], "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        # Swap into place: move an existing artifact aside first, then rename (checked
        # again: the build may have taken minutes).
        check_save_path(path)
        _swap_in(tmp, path)
    except BaseException:
        _remove_tree(tmp)
        raise
    return BuildStats(**manifest["stats"])


def _swap_in(tmp: Path, path: Path) -> None:
    """Rename the finished directory ``tmp`` to ``path``, moving maps there aside first
    and removing them after. Another save may put its maps at ``path`` between the two
    renames: they are moved aside in turn (the last save wins, as with a single file),
    rather than the rename failing with "Directory not empty". A rename that fails
    otherwise puts the maps last moved aside back."""
    olds = []
    done = False
    try:
        for _ in range(100):
            if os.path.lexists(path):
                old = path.parent / f".{path.name}.old-{uuid.uuid4().hex}"
                try:
                    os.replace(path, old)
                    olds.append(old)
                except FileNotFoundError:
                    pass  # moved aside by the other save meanwhile
            try:
                os.replace(tmp, path)
                done = True
                break
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        else:
            raise ArtifactError(f"{path}: other saves keep replacing it; try again")
        _fsync_dir(path.parent)
    finally:
        if not done and olds and not os.path.lexists(path):
            try:  # the save failed: the maps that were there stay
                os.replace(olds.pop(), path)
            except OSError:
                pass
        for old in olds:
            _remove_tree(old)


def _remove_tree(path: Path) -> None:
    """Remove ``path`` and everything in it, write-protected maps too (a directory made
    read-only is moved aside by a save, but its files could not be deleted, and it was
    left behind); what still refuses is left, without an error."""

    def writable(func: Any, name: str, exc: Any) -> None:
        # exc: the exception (3.12's onexc) or its exc_info (onerror)
        error = exc if isinstance(exc, BaseException) else exc[1]
        parent = Path(name).parent
        if isinstance(error, PermissionError) and parent.is_relative_to(path):
            try:  # only directories inside the tree being removed
                os.chmod(parent, 0o700)
                func(name)
            except OSError:
                pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=writable)
    else:
        shutil.rmtree(path, onerror=writable)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_artifact(
    path: str | os.PathLike[str], *, mmap: bool = True, verify: bool = True
) -> Artifact:
    """Load an artifact written by :func:`save_artifact`. Maps that a save replaces while
    they load are read again, as the save left them (a few times at most).

    Parameters
    ----------
    path : path-like
        The artifact directory.
    mmap : bool
        Memory-map the arrays (read-only) instead of reading them into memory.
    verify : bool
        Check every array's SHA-256 against the manifest (detects tampering).

    Raises
    ------
    ArtifactNotFoundError, CorruptArtifactError, IncompatibleArtifactError
    ArtifactError
        When the process may open no more files (the maps may be fine).
    """
    path = Path(path)
    for attempt in range(_RETRIES):
        before = _identity(path)
        try:
            return _load(path, mmap, verify)
        except ArtifactError:
            # A save replacing these maps moves the old directory aside, renames the new
            # one in and removes the old: a load in between found files gone. Read again
            # when the directory at ``path`` changed meanwhile.
            if attempt == _RETRIES - 1 or (_identity(path) == before
                                           and not _replacing(path)):
                raise
            time.sleep(0.005 * (attempt + 1))
    raise AssertionError("unreachable")


#: Reads of a path that a save replaces meanwhile (:func:`load_artifact`,
#: :func:`check_save_path`).
_RETRIES = 10


def _identity(path: Path) -> tuple[int, int] | None:
    """The directory at ``path`` as (device, inode), None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _replacing(path: Path) -> bool:
    """Whether a save is replacing the maps at ``path`` now (their old directory is aside,
    :func:`_swap_in`)."""
    try:
        return any(path.parent.glob(f".{path.name}.old-*"))
    except OSError:
        return False


def _load(path: Path, mmap: bool, verify: bool) -> Artifact:
    """:func:`load_artifact` of the directory at ``path`` as it is now."""
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ArtifactNotFoundError(f"no counterfactual maps at {path} (missing {MANIFEST})")
    try:
        # utf-8-sig: a manifest saved again by an editor that adds a byte order mark
        manifest = json.loads(mpath.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: JSON's own errors, integers past 4,300 digits; RecursionError:
        # arrays nested thousands deep
        raise CorruptArtifactError(f"{mpath}: unreadable manifest ({type(exc).__name__}: "
                                   f"{str(exc)[:200]})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptArtifactError(f"{mpath}: not a cfmaps manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IncompatibleArtifactError(
            f"{path}: format version {manifest.get('format_version')!r}, this build of "
            f"cfmaps reads version {FORMAT_VERSION}; rebuild the maps"
        )
    if verify and _CONTENT_KEY in manifest and manifest[_CONTENT_KEY] != _content_digest(manifest):
        raise CorruptArtifactError(f"{mpath}: the model, schema or grid entries were changed "
                                   "after the maps were saved (content digest)")
    try:
        arrays = _load_arrays(path, manifest["arrays"], mmap, verify)
        mm = manifest["model"]
        ens = FlatEnsemble(
            kind=mm["kind"],
            n_features=int(mm["n_features"]),
            classes=list(mm["classes"]),
            feature_names=mm["feature_names"],
            tie_break=mm["tie_break"],
            # maps saved before split rules were recorded are scikit-learn's
            split_rule=mm.get("split_rule", FLOAT32_LE),
            score_precision=mm.get("score_precision", "float64"),
            **{n: arrays[f"ensemble.{n}"] for n in _ENSEMBLE},
        )
        grid = Grid(raw_thresholds=int(manifest["grid"]["raw_thresholds"]),
                    view32=bool(manifest["grid"].get("view32", True)),
                    **{n: arrays[f"grid.{n}"] for n in _GRID})
        part = Partition(
            lo=arrays["partition.lo"], hi=arrays["partition.hi"],
            labels=arrays["partition.labels"], counters=manifest["partition"]["counters"],
        )
        index = KDForest(**{n: arrays[f"index.{n}"] for n in _INDEX})
        schema = FeatureSchema.from_dicts(manifest["schema"])
        stats = BuildStats(**manifest["stats"])
        _check_consistency(ens, grid, part, index, schema)
    except MapsError as exc:
        if isinstance(exc, ArtifactError):  # corrupt, or this process out of descriptors
            raise
        raise CorruptArtifactError(f"{path}: inconsistent artifact ({exc})") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptArtifactError(f"{path}: inconsistent artifact ({exc!r})") from exc
    if verify and ens.fingerprint() != manifest["fingerprint"]:
        raise CorruptArtifactError(f"{path}: model fingerprint does not match the manifest")
    return Artifact(ens, schema, grid, part, index, stats, str(manifest["fingerprint"]))


def _load_arrays(path: Path, entries: dict[str, Any], mmap: bool, verify: bool) -> dict[str, np.ndarray]:
    out = {}
    expected = {f"ensemble.{n}" for n in _ENSEMBLE} | {f"grid.{n}" for n in _GRID}
    expected |= {f"partition.{n}" for n in _PARTITION} | {f"index.{n}" for n in _INDEX}
    missing = expected - set(entries)
    if missing:
        raise CorruptArtifactError(f"{path}: manifest lacks arrays {sorted(missing)}")
    for key in sorted(expected):
        e = entries[key]
        if e["file"] != f"{key}.npy":
            # every save names an array's file after its key: entries swapped with their
            # checksums (lower and upper cell bounds, say) would load and answer wrongly
            raise CorruptArtifactError(f"{path}: array {key} is read from {e['file']!r}, not "
                                       f"from {key}.npy")
        fpath = path / str(e["file"])
        if not fpath.is_file():
            raise CorruptArtifactError(f"{path}: missing array file {e['file']}")
        try:
            if verify and file_sha256(fpath) != e["sha256"]:
                raise CorruptArtifactError(f"{path}: {e['file']} does not match its checksum")
            arr = np.load(fpath, mmap_mode="r" if mmap else None, allow_pickle=False)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # the process's limit, not the file
                raise ArtifactError(
                    f"{path}: cannot open {e['file']}: too many open files (each loaded model "
                    "keeps a few dozen open; raise the open-files limit, ulimit -n)") from exc
            raise CorruptArtifactError(f"{path}: unreadable {e['file']} ({exc})") from exc
        except ValueError as exc:
            raise CorruptArtifactError(f"{path}: unreadable {e['file']} ({exc})") from exc
        if str(arr.dtype) != e["dtype"] or list(arr.shape) != list(e["shape"]):
            raise CorruptArtifactError(f"{path}: {e['file']} has the wrong dtype or shape")
        # A plain ndarray view of the memory map: the kernels read it the same way, and
        # indexing it skips np.memmap's per-access bookkeeping (dozens of accesses per
        # query). Its ``base`` is the memmap, which keeps the file mapped.
        out[key] = arr.view(np.ndarray) if isinstance(arr, np.memmap) else arr
    return out


def _check_consistency(ens: FlatEnsemble, grid: Grid, part: Partition, index: KDForest,
                       schema: FeatureSchema) -> None:
    """Shapes must agree, so that kernels never index out of bounds."""
    m, n_nodes, c = ens.n_features, ens.n_nodes, ens.n_classes
    ok = (
        len(schema) == m
        and ens.node_value.shape == (n_nodes, c)
        and grid.node_cut.shape == (n_nodes,)
        and grid.cell_offsets.shape == (m + 1,)
        and part.lo.shape == part.hi.shape
        and part.lo.shape[1:] == (m,)
        and part.labels.shape == (part.lo.shape[0],)
        and index.node_lo.shape == (index.n_nodes, m)
        and index.class_root.shape == (c,)
    )
    if not ok:
        raise CorruptArtifactError("array shapes disagree with each other")
    if part.lo.shape[0]:
        if int(np.max(part.hi)) >= int(grid.n_cells.max()) or int(np.max(index.order)) >= part.lo.shape[0]:
            raise CorruptArtifactError("indices out of range")
        if int(part.labels.max()) >= c or int(part.labels.min()) < -1:
            raise CorruptArtifactError("labels out of range")


__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "Artifact", "check_save_path", "file_sha256",
           "load_artifact", "save_artifact"]
