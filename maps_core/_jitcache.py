"""numba's on-disk cache of the kernels, kept in step with their sources.

numba drops a cached function when its own source file changes, but not when a function
it calls in *another* module does (a documented limitation): the caller's cached machine
code, with the old callee compiled into it, is loaded as if nothing had changed. Change
``_bounds.py`` alone and ``lazy.best_first`` goes on running the old bounds, silently.
A ``git pull``, a checkout or an edit in an editable install does exactly that (seen while
developing: an edited bound had no effect until the cache was cleared by hand).

So, once per process and before any kernel module is imported (``maps_core/__init__.py``
imports this module first, and importing it runs the check), :func:`refresh` compares a
fingerprint of every source file of the package (and the numba and Python versions) with
the one stored beside the cache, and empties the cache when they differ. A fresh install
writes every file anew, which numba's own check already catches; this covers the partial
changes. The folders are the ones numba itself would use, found with its own locators.

Before that, :func:`ensure_writable` makes sure numba has somewhere to write. numba's
``cache=True`` raises at import (``cannot cache function ...: no locator available``) when
neither ``NUMBA_CACHE_DIR``, nor the module's ``__pycache__``, nor the per-user cache is
writable: a container run with an arbitrary UID (OpenShift, Kubernetes ``runAsUser``) or a
read-only root file system. Where the configured folder (``NUMBA_CACHE_DIR``, else the
first of numba's own that works) is not writable, the cache moves to a private folder
under the temp dir, ``cfmaps-numba-<uid>``, seeded first with the kernels of the read-only
folder when its stamp is the current sources' (the container image's prebuilt cache: the
service starts warm); ``NUMBA_CACHE_DIR`` is set to it for the processes this one starts.
Where nothing at all is writable, the kernels are compiled in memory, in every process,
and a warning says so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numba
from numba.core import config as _numba_config

_config: Any = _numba_config  # its settings are set at run time (mypy sees none)

try:  # numba's own cache locators, in the order numba tries them (numba.core.caching)
    from numba.core import caching as _caching

    _LOCATORS: tuple[Any, ...] = (_caching.UserProvidedCacheLocator,
                                  _caching.InTreeCacheLocator, _caching.UserWideCacheLocator)
except (ImportError, AttributeError):  # another numba layout: the in-tree folders only
    _LOCATORS = ()
_Dispatcher: Any
try:  # what :func:`_compile_in_memory` adapts
    from numba.core.dispatcher import Dispatcher as _Dispatcher
except ImportError:
    _Dispatcher = None

#: The package whose kernels are cached.
PACKAGE = Path(__file__).resolve().parent
#: Name of the fingerprint file written in each cache folder.
STAMP = "cfmaps-kernels.sha256"
#: numba's cache files (index and data).
_CACHE_SUFFIXES = (".nbi", ".nbc")

_log = logging.getLogger(__name__)


def fingerprint(package: Path = PACKAGE) -> str:
    """SHA-256 of every ``.py`` file under ``package`` (names and contents, in path
    order), numba's version and Python's."""
    h = hashlib.sha256(f"{numba.__version__} {sys.version}".encode())
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_dirs(package: Path = PACKAGE) -> list[Path]:
    """The folder numba keeps the cache of each module folder of ``package`` in, chosen as
    numba chooses it: under ``NUMBA_CACHE_DIR`` when set, else the module's writable
    ``__pycache__``, else numba's per-user cache. Like numba, this creates the folder (so
    a cache compiled later, e.g. into a container image, is stamped from the start)."""
    modules = _modules(package)
    if not _LOCATORS:
        return [d / "__pycache__" for d, _ in modules if (d / "__pycache__").is_dir()]
    dirs = []
    for _, py_file in modules:
        for cls in _LOCATORS:
            loc = cls.from_function(_probe, str(py_file))
            if loc is not None:
                dirs.append(Path(loc.get_cache_path()))
                break
    return dirs


def _probe() -> None:
    """A stand-in function for numba's locators, which read only its first line number."""


def _modules(package: Path) -> list[tuple[Path, Path]]:
    """(folder, one ``.py`` file in it) for every module folder of ``package``."""
    return sorted({p.parent: p for p in package.rglob("*.py")}.items())


def _candidates(py_file: Path) -> list[Path]:
    """The folders numba may keep ``py_file``'s cache in, in its order, writable or not."""
    paths = []
    for cls in _LOCATORS:
        if cls is _caching.UserProvidedCacheLocator and not _config.CACHE_DIR:
            continue
        try:
            paths.append(Path(cls(_probe, str(py_file)).get_cache_path()))
        except Exception:  # noqa: BLE001 (a locator that cannot say: not a candidate)
            continue
    return paths


def _writable(py_file: Path, configured_only: bool) -> bool:
    """Whether numba finds a writable cache folder for ``py_file``: the configured
    ``NUMBA_CACHE_DIR`` alone when ``configured_only``, else any of its locators (numba's
    own test: it creates the folder and a temporary file in it)."""
    locators = (_caching.UserProvidedCacheLocator,) if configured_only else _LOCATORS
    return any(cls.from_function(_probe, str(py_file)) is not None for cls in locators)


def _private_dir(path: Path) -> bool:
    """Create ``path`` (mode 700) unless it exists; whether it is a directory only this
    user can write (the temp dir is shared, and numba unpickles what its cache holds)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    if hasattr(os, "getuid"):
        return st.st_uid == os.getuid() and not st.st_mode & 0o022
    return True


def fallback_dir() -> Path | None:
    """A private, writable cache folder under the temp dir: ``cfmaps-numba-<uid>``, or a
    new ``cfmaps-numba-<uid>-*`` when that name is taken by a folder another user could
    write. None when the temp dir itself is not writable."""
    try:
        tmp = Path(tempfile.gettempdir())
    except OSError:  # FileNotFoundError: "No usable temporary directory found"
        return None
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    path = tmp / f"cfmaps-numba-{user}"
    if _private_dir(path):
        return path
    try:
        return Path(tempfile.mkdtemp(prefix=f"cfmaps-numba-{user}-", dir=tmp))
    except OSError:
        return None


def _seed(dest: Path, sources: list[Path], want: str) -> bool:
    """Copy numba's files from the first of ``sources`` stamped ``want`` into ``dest``
    (unless ``dest`` already carries that stamp), then stamp ``dest``. Each file is
    written under a temporary name and renamed, the stamp last, so that a process
    starting at the same time reads whole files. Returns whether files were copied."""
    try:
        if (dest / STAMP).read_text() == want:
            return False
    except OSError:
        pass
    for src in sources:
        try:
            if src.resolve() == dest.resolve() or (src / STAMP).read_text() != want:
                continue
            files = sorted((f for f in src.iterdir() if f.suffix in _CACHE_SUFFIXES),
                           key=lambda f: f.suffix == ".nbi")  # the data before the indexes
        except OSError:
            continue
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for old in dest.iterdir():
                if old.suffix in _CACHE_SUFFIXES:
                    old.unlink(missing_ok=True)
            for f in [*files, src / STAMP]:
                tmp = dest / f".{f.name}.{os.getpid()}.tmp"
                shutil.copyfile(f, tmp)
                os.replace(tmp, dest / f.name)
        except OSError as exc:
            _log.warning("could not copy numba's cache of the kernels from %s to %s: %s",
                         src, dest, exc)
            return False
        return True
    return False


def _compile_in_memory() -> None:
    """Let ``cache=True`` functions that numba finds no writable cache folder for compile
    without a cache, instead of raising at their definition (numba has no setting for
    it: its dispatcher's ``enable_caching`` is wrapped to fall back to its ``NullCache``).
    """
    null_cache = getattr(_caching, "NullCache", None)
    original = getattr(_Dispatcher, "enable_caching", None)
    if null_cache is None or original is None:
        raise RuntimeError(
            "numba has no writable folder to cache the cfmaps kernels in: set "
            "NUMBA_CACHE_DIR to a writable folder or make the temp dir (TMPDIR) writable")
    if getattr(original, "_cfmaps_in_memory", False):
        return

    def enable_caching(self: Any) -> None:
        try:
            original(self)
        except RuntimeError as exc:
            if "no locator available" not in str(exc):
                raise
            self._cache = null_cache()

    enable_caching._cfmaps_in_memory = True  # type: ignore[attr-defined]
    _Dispatcher.enable_caching = enable_caching


def ensure_writable(package: Path = PACKAGE) -> str:
    """Make sure numba can write the cache of ``package``'s kernels (see the module's
    docstring). Returns where they are cached: ``"configured"`` (where numba would cache
    them anyway), ``"fallback"`` (:func:`fallback_dir`, now ``NUMBA_CACHE_DIR``) or
    ``"memory"`` (nowhere: each process compiles them).

    A ``NUMBA_CACHE_DIR`` that is not writable moves the cache to the temp dir even where
    numba would go on to a writable ``__pycache__`` or per-user cache: there it starts with
    the configured folder's kernels (when they are current), and the installation is left
    alone, as setting ``NUMBA_CACHE_DIR`` asked."""
    if not _LOCATORS:
        return "configured"
    modules = _modules(package)
    configured = bool(_config.CACHE_DIR)
    if all(_writable(f, configured_only=configured) for _, f in modules):
        return "configured"
    sources = {d: _candidates(f) for d, f in modules}  # before CACHE_DIR changes
    where = fallback_dir()
    if where is not None:
        previous = _config.CACHE_DIR
        _config.CACHE_DIR = str(where)
        if all(_writable(f, configured_only=True) for _, f in modules):
            # numba re-reads its settings from the environment when a NUMBA_ variable
            # changes: keep them in step (and pass the folder on to child processes)
            os.environ["NUMBA_CACHE_DIR"] = str(where)
            want = fingerprint(package)
            seeded = [_seed(Path(_caching.UserProvidedCacheLocator(_probe, str(f))
                                 .get_cache_path()), sources[d], want) for d, f in modules]
            _log.info("numba's cache folder %s is not writable: the kernels are cached in "
                      "%s%s", previous or "(numba's default)", where,
                      " (seeded with the prebuilt cache)" if any(seeded) else "")
            return "fallback"
        _config.CACHE_DIR = previous
    if configured and all(_writable(f, configured_only=False) for _, f in modules):
        return "configured"  # numba goes on to the next of its folders, a writable one
    _compile_in_memory()
    warnings.warn(
        "numba finds no writable folder to cache the cfmaps kernels in (NUMBA_CACHE_DIR, "
        "the package's __pycache__, the user's cache and the temp dir are not writable): "
        "every process compiles them anew, for a minute or more; mount a writable /tmp or "
        "set NUMBA_CACHE_DIR to a writable folder", RuntimeWarning, stacklevel=2)
    return "memory"


def refresh(package: Path = PACKAGE) -> list[Path]:
    """Empty every cache folder of ``package`` whose stored fingerprint is not the
    sources' own (:func:`fingerprint`), then store it there. Returns those folders.

    A folder without a stamp (new, or a cache from before this check) counts as stale. Errors
    of the file system (read-only installs, a folder another process is emptying) are
    ignored: the worst outcome is a recompilation.
    """
    want = fingerprint(package)
    emptied = []
    for d in cache_dirs(package):
        stamp = d / STAMP
        try:
            if stamp.is_file() and stamp.read_text() == want:
                continue
            for f in d.iterdir():
                if f.suffix in _CACHE_SUFFIXES:
                    f.unlink(missing_ok=True)
            stamp.write_text(want)
            emptied.append(d)
        except OSError:
            continue
    return emptied


ensure_writable()
refresh()

__all__ = ["PACKAGE", "STAMP", "cache_dirs", "ensure_writable", "fallback_dir", "fingerprint",
           "refresh"]
