"""Safe loading of uploaded model files.

Formats are recognised by their first bytes, never by the file name:

* **skops** (a zip archive, ``PK\\x03\\x04``): loaded with :func:`skops.io.load`, trusting only
  skops' default types plus :data:`ALLOWED_UNTRUSTED` (the types that scikit-learn tree
  models need and that skops does not trust by default). A file naming any other type is
  refused without being loaded, and the refusal lists the types.
* **pickle / joblib** (``\\x80`` protocol header, or a zlib/gzip/bz2/xz/lz4 stream as written
  by ``joblib.dump(..., compress=...)``): loading runs arbitrary code, so these are loaded
  only when the operator sets ``CFMAPS_TRUST_PICKLE=true``; otherwise the refusal explains
  how to export with skops.
* anything else is refused.

After loading, every tree's node arrays are checked (:func:`check_trees`): scikit-learn's
compiled ``predict`` trusts them, so a crafted file with an out-of-range child index reads
out of bounds (segfault) and a child pointing back up loops forever.

Every failure is an :class:`~app.errors.ApiError` naming the ``model`` field, so a hostile or
broken upload always answers 4xx.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .errors import InvalidInputError, PayloadTooLargeError, UnsafeModelFileError

ModelFormat = Literal["skops", "pickle"]

#: Types outside skops' default trust list that a fitted scikit-learn tree model contains.
#: Kept exact (no prefixes): a prefix like ``numpy.`` would admit e.g. ``numpy.memmap``, whose
#: constructor opens files.
ALLOWED_UNTRUSTED: frozenset[str] = frozenset({"sklearn.tree._tree.Tree"})

#: File name under ``models/<id>/`` per format.
FILE_NAMES: dict[str, str] = {"skops": "model.skops", "pickle": "model.pkl"}

SKOPS_HOWTO = (
    "export the model with skops instead: `import skops.io; skops.io.dump(model, "
    '"model.skops")`, then upload model.skops'
)

_PICKLE_MAGICS = (
    b"\x80",  # pickle protocol >= 2 (plain pickle and uncompressed joblib)
    b"\x1f\x8b",  # gzip
    b"BZh",  # bz2
    b"\xfd7zXZ\x00",  # xz
    b"\x04\x22\x4d\x18",  # lz4
    b"ZF",  # joblib < 0.10 compressed format
)
_ZLIB_SECOND = (0x01, 0x5E, 0x9C, 0xDA)


def detect_format(head: bytes) -> ModelFormat | None:
    """Format of a model file from its first bytes (at least 8), or None when unknown."""
    if head.startswith(b"PK\x03\x04"):
        return "skops"
    if head.startswith(_PICKLE_MAGICS):
        return "pickle"
    if len(head) >= 2 and head[0] == 0x78 and head[1] in _ZLIB_SECOND:  # zlib (joblib)
        return "pickle"
    return None


def sniff(path: Path) -> ModelFormat:
    """Format of the file at ``path``; raises :class:`InvalidInputError` when unknown."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if not head:
        raise InvalidInputError("the model file is empty", "model")
    fmt = detect_format(head)
    if fmt is None:
        raise InvalidInputError(
            "the model file is neither a skops file nor a pickle/joblib file; " + SKOPS_HOWTO,
            "model",
        )
    return fmt


def load_model_file(
    path: Path, *, trust_pickle: bool, max_unpacked_bytes: int | None = None
) -> tuple[Any, ModelFormat]:
    """Load a model file safely.

    Parameters
    ----------
    path : Path
        The file.
    trust_pickle : bool
        Whether pickle/joblib files may be loaded (they can run arbitrary code).
    max_unpacked_bytes : int, optional
        Cap on the uncompressed size of a skops archive (zip-bomb guard).

    Returns
    -------
    model : object
        The deserialised object (not yet checked to be a supported classifier).
    format : {"skops", "pickle"}

    Raises
    ------
    InvalidInputError, UnsafeModelFileError, PayloadTooLargeError
    """
    fmt = sniff(path)
    if fmt == "skops":
        model = _load_skops(path, max_unpacked_bytes)
        check_trees(model)
        return model, fmt
    if not trust_pickle:
        raise UnsafeModelFileError(
            "pickle/joblib model files can execute code when loaded and are refused "
            "(the operator can allow them with CFMAPS_TRUST_PICKLE=true); " + SKOPS_HOWTO,
            "model",
        )
    import joblib

    try:
        model = joblib.load(path)
    except Exception as exc:  # any failure of an unpickler on foreign bytes is bad input
        raise InvalidInputError(
            f"could not load the pickle/joblib file: {type(exc).__name__}: {exc}", "model"
        ) from exc
    check_trees(model)
    return model, fmt


def check_trees(model: Any) -> None:
    """Refuse a model whose tree node arrays are not a well-formed tree.

    Checks, for every ``tree_`` of the model (itself, or its ``estimators_``): array lengths
    equal ``node_count``; a node is a leaf on both sides or on neither; children lie in
    range and *after* their parent (scikit-learn numbers nodes in creation order, so this
    also excludes cycles); split features lie in ``[0, n_features_in_)``; the value array
    has one row per node. Objects without trees are left to the engine's model check.

    Raises
    ------
    InvalidInputError
        With field ``model``.
    """
    if hasattr(model, "tree_"):
        estimators = [model]
    elif hasattr(model, "estimators_"):
        try:
            estimators = list(np.asarray(model.estimators_, dtype=object).ravel())
        except Exception as exc:  # a crafted attribute that is not even a sequence
            raise InvalidInputError(f"malformed estimators_: {exc}", "model") from exc
    else:
        return
    n_features = getattr(model, "n_features_in_", None)
    for k, est in enumerate(estimators):
        tree = getattr(est, "tree_", None)
        if tree is None:
            continue
        problem = _tree_problem(tree, n_features)
        if problem:
            raise InvalidInputError(f"the model file holds a malformed tree #{k}: {problem}", "model")


def _tree_problem(tree: Any, n_features: Any) -> str | None:
    try:
        n = int(tree.node_count)
        left = np.asarray(tree.children_left, dtype=np.int64)
        right = np.asarray(tree.children_right, dtype=np.int64)
        feat = np.asarray(tree.feature, dtype=np.int64)
        value = np.asarray(tree.value)
    except Exception as exc:  # attributes missing or of the wrong kind
        return f"unreadable node arrays ({type(exc).__name__}: {exc})"
    if n < 1 or not (len(left) == len(right) == len(feat) == n) or value.shape[:1] != (n,):
        return "node arrays disagree with node_count"
    internal = left >= 0
    if not np.array_equal(internal, right >= 0):
        return "a node has exactly one child"
    idx = np.flatnonzero(internal)
    if np.any(left[idx] >= n) or np.any(right[idx] >= n):
        return "node indices out of range"
    if np.any(left[idx] <= idx) or np.any(right[idx] <= idx):
        return "a child precedes its parent (cycle)"
    if np.any(feat[idx] < 0) or (
        isinstance(n_features, int | np.integer) and np.any(feat[idx] >= n_features)
    ):
        return "split feature out of range"
    return None


def _load_skops(path: Path, max_unpacked_bytes: int | None) -> Any:
    import skops.io as sio

    try:
        with zipfile.ZipFile(path) as zf:
            unpacked = sum(info.file_size for info in zf.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise InvalidInputError(f"the skops file is not a valid archive: {exc}", "model") from exc
    if max_unpacked_bytes is not None and unpacked > max_unpacked_bytes:
        raise PayloadTooLargeError(
            f"the skops file unpacks to {unpacked} bytes, more than the allowed {max_unpacked_bytes}",
            "model",
        )
    try:
        untrusted = sio.get_untrusted_types(file=path)
    except Exception as exc:  # skops raises assorted errors on malformed archives
        raise InvalidInputError(
            f"the file is not a valid skops file: {type(exc).__name__}: {exc}", "model"
        ) from exc
    refused = sorted(set(untrusted) - ALLOWED_UNTRUSTED)
    if refused:
        raise UnsafeModelFileError(
            "the skops file contains types this service does not load: "
            + ", ".join(refused)
            + "; only scikit-learn tree classifiers are supported",
            "model",
        )
    try:
        return sio.load(path, trusted=sorted(untrusted))
    except Exception as exc:  # same: a crafted archive can fail in many ways
        raise InvalidInputError(
            f"could not load the skops file: {type(exc).__name__}: {exc}", "model"
        ) from exc
