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
changes. The folders are the ones numba itself would use, found with its own locators;
where none is writable numba caches nothing, and there is nothing to check.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numba

try:  # numba's own cache locators, in the order numba tries them (numba.core.caching)
    from numba.core import caching as _caching

    _LOCATORS: tuple[Any, ...] = (_caching.UserProvidedCacheLocator,
                                  _caching.InTreeCacheLocator, _caching.UserWideCacheLocator)
except (ImportError, AttributeError):  # another numba layout: the in-tree folders only
    _LOCATORS = ()

#: The package whose kernels are cached.
PACKAGE = Path(__file__).resolve().parent
#: Name of the fingerprint file written in each cache folder.
STAMP = "cfmaps-kernels.sha256"


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
    modules = sorted({p.parent: p for p in package.rglob("*.py")}.items())
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
                if f.suffix in (".nbi", ".nbc"):
                    f.unlink(missing_ok=True)
            stamp.write_text(want)
            emptied.append(d)
        except OSError:
            continue
    return emptied


refresh()

__all__ = ["PACKAGE", "STAMP", "cache_dirs", "fingerprint", "refresh"]
