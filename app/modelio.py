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

Every failure is an :class:`~app.errors.ApiError` naming the ``model`` field, so a hostile or
broken upload always answers 4xx.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Literal

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
        return _load_skops(path, max_unpacked_bytes), fmt
    if not trust_pickle:
        raise UnsafeModelFileError(
            "pickle/joblib model files can execute code when loaded and are refused "
            "(the operator can allow them with CFMAPS_TRUST_PICKLE=true); " + SKOPS_HOWTO,
            "model",
        )
    import joblib

    try:
        return joblib.load(path), fmt
    except Exception as exc:  # any failure of an unpickler on foreign bytes is bad input
        raise InvalidInputError(
            f"could not load the pickle/joblib file: {type(exc).__name__}: {exc}", "model"
        ) from exc


def _load_skops(path: Path, max_unpacked_bytes: int | None) -> Any:
    import skops.io as sio

    try:
        with zipfile.ZipFile(path) as zf:
            unpacked = sum(info.file_size for info in zf.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise InvalidInputError(f"the skops file is not a valid archive: {exc}", "model") from exc
    if max_unpacked_bytes is not None and unpacked > max_unpacked_bytes:
        raise PayloadTooLargeError(
            f"the skops file unpacks to {unpacked} bytes, more than the allowed "
            f"{max_unpacked_bytes}",
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
