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
* **XGBoost model** (JSON ``{"learner": ...``, also pretty-printed or after a UTF-8 byte
  order mark, or UBJSON, what ``save_model`` writes): parsed by
  :func:`maps_core.adapters.xgboost_json.parse_xgboost`, never handed to XGBoost.
* **LightGBM text model** (``tree\nversion=...``, what ``save_model`` /
  ``model_to_string`` writes): parsed by :func:`maps_core.adapters.lightgbm_text.parse_lightgbm`,
  never handed to LightGBM.
* anything else is refused.

Each format is a :class:`Reader` in :data:`READERS`. After loading, the model's adapter
checks its structure (:func:`maps_core.adapters.check_model`; for scikit-learn every tree's
node arrays): scikit-learn's compiled ``predict`` trusts them, so a crafted file with an
out-of-range child index reads out of bounds (segfault) and a child pointing back up loops
forever.

Every failure is an :class:`~app.errors.ApiError` naming the ``model`` field, so a hostile or
broken upload always answers 4xx.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import joblib
import skops.io as sio

from maps_core.adapters import check_model, prepare_model
from maps_core.adapters.lightgbm_text import parse_lightgbm
from maps_core.adapters.xgboost_json import is_json, parse_xgboost
from maps_core.exceptions import UnsupportedModelError

from .errors import InvalidInputError, PayloadTooLargeError, UnsafeModelFileError, shorten

#: Name of a model file format (a :class:`Reader`'s ``format``).
ModelFormat = str

#: Types outside skops' default trust list that a fitted scikit-learn tree model contains.
#: Kept exact (no prefixes): a prefix like ``numpy.`` would admit e.g. ``numpy.memmap``, whose
#: constructor opens files.
ALLOWED_UNTRUSTED: frozenset[str] = frozenset({
    "sklearn.tree._tree.Tree",
    # HistGradientBoostingClassifier's trees: node arrays and bitsets, checked by the adapter
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    # ... and, with categorical_features, its input preprocessor's validation step:
    # FunctionTransformer(partial(check_array, ...)). skops rebuilds a partial from its
    # function, itself checked against this list, so only check_array can be wrapped
    "functools.partial",
    "sklearn.utils.validation.check_array",
})

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


def _is_skops(head: bytes) -> bool:
    return head.startswith(b"PK\x03\x04")


#: Pickle protocols 0 and 1 have no header: an object's pickle opens with the GLOBAL opcode
#: naming a class (``c`` module newline name newline; ``copy_reg._reconstructor`` for most)
_OLD_PICKLE = re.compile(rb"\(?c[A-Za-z_][\w.]*\n[A-Za-z_][\w.]*\n")


def _is_pickle(head: bytes) -> bool:
    if head.startswith(_PICKLE_MAGICS) or _OLD_PICKLE.match(head):
        return True
    return len(head) >= 2 and head[0] == 0x78 and head[1] in _ZLIB_SECOND  # zlib (joblib)


def _read_skops(path: Path, trust_pickle: bool, max_unpacked_bytes: int | None) -> Any:
    return _load_skops(path, max_unpacked_bytes)


def _read_pickle(path: Path, trust_pickle: bool, max_unpacked_bytes: int | None) -> Any:
    if not trust_pickle:
        raise UnsafeModelFileError(
            "pickle/joblib model files can execute code when loaded and are refused "
            "(the operator can allow them with CFMAPS_TRUST_PICKLE=true); " + SKOPS_HOWTO,
            "model",
        )
    try:
        return joblib.load(path)
    except Exception as exc:  # any failure of an unpickler on foreign bytes is bad input
        raise InvalidInputError(_unpickling_failed(exc), "model") from exc


def _unpickling_failed(exc: Exception) -> str:
    """What to tell the client of a pickle the service could not load: the error's first
    line (XGBoost's own errors go on with a native stack trace: library paths and memory
    addresses), and, when a model library refused it, how to send the model instead."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    first = re.sub(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", first)  # XGBoost's "[time] file:line: "
    text = f"could not load the pickle/joblib file: {type(exc).__name__}: {shorten(first, 300)}"
    library = type(exc).__module__.split(".")[0]
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing and missing.split(".")[0] in ("xgboost", "lightgbm"):
        library = missing.split(".")[0]
        text += (f"; the pickle needs {library}, which this service does not have (pip "
                 f"install {library} beside it), or send the model in the library's own "
                 "format, read without it (XGBoost: save_model('model.json'); LightGBM: "
                 "booster_.save_model('model.txt'))")
    elif library in ("xgboost", "lightgbm"):
        text += (f"; a pickle made by another version of {library} may not load in this "
                 "one: save the model in the library's own format instead (XGBoost: "
                 "save_model('model.json'); LightGBM: booster_.save_model('model.txt'))")
    return text


def _is_xgboost(head: bytes) -> bool:
    # JSON, compact or pretty-printed, maybe after a byte order mark: an object naming
    # "learner" (XGBoost writes it first); UBJSON: '{' then the length-prefixed key
    # 'learner' (or a '$'/'#' container header first)
    if is_json(head):
        return b'"learner"' in head
    return head[:1] == b"{" and b"learner" in head[:24]


def _read_xgboost(path: Path, trust_pickle: bool, max_unpacked_bytes: int | None) -> Any:
    try:
        return parse_xgboost(path.read_bytes())
    except UnsupportedModelError as exc:
        raise InvalidInputError(str(exc), "model") from exc


def _is_lightgbm(head: bytes) -> bool:
    return head.startswith((b"tree\nversion=", b"tree\r\nversion="))


def _read_lightgbm(path: Path, trust_pickle: bool, max_unpacked_bytes: int | None) -> Any:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"the LightGBM model file is not UTF-8 text: {exc}", "model") from exc
    try:
        return parse_lightgbm(text)
    except UnsupportedModelError as exc:
        raise InvalidInputError(str(exc), "model") from exc


@dataclass(frozen=True)
class Reader:
    """How one model file format is recognised (by content) and read.

    ``load(path, trust_pickle, max_unpacked_bytes)`` returns the model object for the
    engine's adapters (:mod:`maps_core.adapters`), raising an :class:`~app.errors.ApiError`
    naming the ``model`` field on any failure.
    """

    format: ModelFormat
    file_name: str
    detect: Callable[[bytes], bool]
    load: Callable[[Path, bool, int | None], Any]


#: The formats the service reads, asked in order. A new model library adds its reader here
#: (and its adapter in :mod:`maps_core.adapters`).
READERS: tuple[Reader, ...] = (
    Reader("skops", "model.skops", _is_skops, _read_skops),
    Reader("pickle", "model.pkl", _is_pickle, _read_pickle),
    Reader("lightgbm", "model.lgb.txt", _is_lightgbm, _read_lightgbm),
    Reader("xgboost", "model.xgb", _is_xgboost, _read_xgboost),
)
#: File name under ``models/<id>/`` per format.
FILE_NAMES: dict[str, str] = {r.format: r.file_name for r in READERS}


#: How many first bytes :func:`sniff` reads: room for a pretty-printed JSON's indentation.
SNIFF_BYTES = 256


def detect_format(head: bytes) -> ModelFormat | None:
    """Format of a model file from its first bytes (up to :data:`SNIFF_BYTES`), or None
    when unknown."""
    for reader in READERS:
        if reader.detect(head):
            return reader.format
    return None


#: The booster names XGBoost's binary model files hold.
_XGB_BOOSTERS = (b"gbtree", b"gblinear", b"dart")


def _is_xgboost_binary(head: bytes) -> bool:
    """Whether ``head`` starts a model file in XGBoost's binary format (``save_model`` to a
    name not ending in ``.json`` or ``.ubj``, before XGBoost 3): an optional ``binf`` (1.1
    and later), a 136-byte parameter block (base score, features, classes, version,
    reserved words), then the objective's and the booster's names, each after its length
    as a little-endian uint64. Laid out so by XGBoost 0.80 to 1.6 (binary, multiclass and
    regression objectives; gbtree, gblinear, dart). Asked before the pickle check: the
    first four bytes (the base score, before 1.1) may be anything, a pickle's too."""
    at = (4 if head.startswith(b"binf") else 0) + 136
    n = int.from_bytes(head[at:at + 8], "little")
    objective = head[at + 8:at + 8 + n]
    if not 1 <= n <= 90 or re.fullmatch(rb"[a-z_]+:[a-z_]+", objective) is None:
        return False
    at += 8 + n
    k = int.from_bytes(head[at:at + 8], "little")
    booster = head[at + 8:at + 8 + k]
    return len(booster) == k and booster in _XGB_BOOSTERS


def sniff(path: Path) -> ModelFormat:
    """Format of the file at ``path``; raises :class:`InvalidInputError` when unknown."""
    with open(path, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if not head:
        raise InvalidInputError("the model file is empty", "model")
    if _is_xgboost_binary(head):
        raise InvalidInputError(
            "the model file is in XGBoost's binary format (save_model to a name not ending "
            "in .json or .ubj), which cfmaps does not read (nor does XGBoost 3): load it with "
            "an XGBoost 1.x or 2.x and save it again with save_model('model.json')", "model")
    fmt = detect_format(head)
    if fmt is None:
        raise InvalidInputError(
            "the model file is neither a skops file, an XGBoost JSON/UBJSON or LightGBM text "
            "model, nor a pickle/joblib file; " + SKOPS_HOWTO,
            "model",
        )
    return fmt


def load_model_file(
    path: Path, *, trust_pickle: bool, max_unpacked_bytes: int | None = None
) -> tuple[Any, ModelFormat]:
    """Load a model file safely.

    The format comes from the file's content (:data:`READERS`); the loaded model's
    structure is then checked by its adapter (:func:`maps_core.adapters.check_model`)
    before anything else runs on it: scikit-learn's compiled ``predict`` trusts its node
    arrays, so a crafted file with an out-of-range child index reads out of bounds
    (segfault) and a child pointing back up loops forever.

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
        The deserialised object (not yet checked to be a supported classifier); a
        LightGBM or XGBoost object (from a trusted pickle) as its parsed model file, the
        way their own files load.
    format : str
        The reader's format name.

    Raises
    ------
    InvalidInputError, UnsafeModelFileError, PayloadTooLargeError
    """
    fmt = sniff(path)
    reader = next(r for r in READERS if r.format == fmt)
    model = reader.load(path, trust_pickle, max_unpacked_bytes)
    try:
        model = prepare_model(model)  # a pickled LGBMClassifier: its parsed model file
        check_model(model)
    except UnsupportedModelError as exc:
        raise InvalidInputError(f"the model file is unusable: {exc}", "model") from exc
    return model, fmt


#: CPython 3.11's AST constructor keeps one recursion counter per interpreter, not per
#: thread (cpython gh-106905, fixed in 3.12): an ``ast.parse`` in one thread can make one in
#: another fail with this spurious SystemError. A service start that rebuilds two models
#: at once hit it while loading a skops file (CI, test_interrupted_builds_run_again_at_start).
_AST_RACE = "AST constructor recursion depth mismatch"


def _retrying_ast_race(call: Callable[[], Any], attempts: int = 3) -> Any:
    """``call()``, again when it fails with the spurious SystemError of :data:`_AST_RACE`
    (any other error, or the last attempt's, propagates)."""
    for i in range(attempts):
        try:
            return call()
        except SystemError as exc:
            if _AST_RACE not in str(exc) or i == attempts - 1:
                raise
    raise AssertionError("unreachable")


#: Largest ``schema.json`` a skops file may hold. skops parses it whole in the API
#: process (to list the file's types) and the parsed objects take about five times its
#: size: a 1 MB upload that unpacked to 1 GB of valid JSON took the process from 1.3 to
#: 5.8 GB. A 500-tree forest of depth 8 writes 7.7 MB.
SKOPS_SCHEMA_MAX_BYTES = 64 << 20


def _load_skops(path: Path, max_unpacked_bytes: int | None) -> Any:
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise InvalidInputError(f"the skops file is not a valid archive: {exc}", "model") from exc
    unpacked = sum(info.file_size for info in members)
    if max_unpacked_bytes is not None and unpacked > max_unpacked_bytes:
        raise PayloadTooLargeError(
            f"the skops file unpacks to {unpacked} bytes, more than the allowed {max_unpacked_bytes}",
            "model",
        )
    schema = sum(info.file_size for info in members if info.filename == "schema.json")
    if schema > SKOPS_SCHEMA_MAX_BYTES:
        raise PayloadTooLargeError(
            f"the skops file's schema.json unpacks to {schema} bytes, more than the "
            f"{SKOPS_SCHEMA_MAX_BYTES} this service parses",
            "model",
        )
    try:
        untrusted = _retrying_ast_race(lambda: sio.get_untrusted_types(file=path))
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
        return _retrying_ast_race(lambda: sio.load(path, trusted=sorted(untrusted)))
    except Exception as exc:  # same: a crafted archive can fail in many ways
        raise InvalidInputError(
            f"could not load the skops file: {type(exc).__name__}: {exc}", "model"
        ) from exc


__all__ = ["ALLOWED_UNTRUSTED", "FILE_NAMES", "READERS", "Reader", "detect_format", "load_model_file",
           "sniff"]
