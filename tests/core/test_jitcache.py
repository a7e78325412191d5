"""numba's cache of the kernels follows their sources (maps_core._jitcache)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numba
import pytest
from numba.core import caching as _caching

from maps_core import _jitcache

CALLEE = "from numba import njit\n\n\n@njit(cache=True)\ndef value():\n    return {value}\n"
CALLER = ("from numba import njit\n\nfrom .callee import value\n\n\n"
          "@njit(cache=True)\ndef twice():\n    return 2 * value()\n")
RUN = ("import sys\nfrom pathlib import Path\n"
       "if {refresh}:\n"
       "    from maps_core._jitcache import refresh\n"
       "    refresh(Path('kpkg').resolve())\n"
       "from kpkg.caller import twice\nprint(twice())\n")


def _package(root: Path, value: int) -> Path:
    pkg = root / "kpkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "callee.py").write_text(CALLEE.format(value=value))
    (pkg / "caller.py").write_text(CALLER)
    return pkg


def _twice(root: Path, refresh: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(Path(__file__).resolve().parents[2])])
    out = subprocess.run([sys.executable, "-c", RUN.format(refresh=refresh)], cwd=root, env=env,
                         capture_output=True, text=True, check=True, timeout=300)
    return out.stdout.strip()


def test_a_callee_changed_in_another_module_is_compiled_again(tmp_path):
    """numba checks only the caller's own file: without the refresh, ``twice`` keeps the
    old ``value`` compiled into its cache (2 after the change below; checked by hand with
    numba 0.68). With it, the changed callee is what runs."""
    pkg = _package(tmp_path, 1)
    assert _twice(tmp_path, refresh=True) == "2"
    assert any(f.suffix == ".nbc" for f in (pkg / "__pycache__").iterdir())  # cached
    (pkg / "callee.py").write_text(CALLEE.format(value=5))
    assert _twice(tmp_path, refresh=True) == "10"


def test_refresh_empties_a_stale_cache_once(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")  # the in-tree folder, as in CI
    pkg = _package(tmp_path, 1)
    cache = pkg / "__pycache__"
    cache.mkdir()
    assert _jitcache.cache_dirs(pkg) == [cache]
    stale = [cache / "caller.twice-7.py311.nbi", cache / "caller.twice-7.py311.1.nbc"]
    for f in stale:
        f.write_bytes(b"old")
    (cache / "caller.cpython-311.pyc").write_bytes(b"bytecode")

    assert _jitcache.refresh(pkg) == [cache]  # no stamp yet: a cache of unknown sources
    assert not any(f.exists() for f in stale)
    assert (cache / "caller.cpython-311.pyc").exists()  # only numba's files go
    assert (cache / _jitcache.STAMP).read_text() == _jitcache.fingerprint(pkg)

    stale[0].write_bytes(b"new")  # compiled from the current sources: kept
    assert _jitcache.refresh(pkg) == []
    assert stale[0].exists()

    (pkg / "callee.py").write_text(CALLEE.format(value=2))  # a source changed
    assert _jitcache.refresh(pkg) == [cache]
    assert not stale[0].exists()


def test_the_package_cache_is_stamped_with_its_sources():
    """Importing maps_core ran the check: the cache folders numba uses for it carry the
    stamp of the sources as they are now."""
    dirs = _jitcache.cache_dirs()
    assert len(dirs) == 2  # maps_core and maps_core.adapters
    for d in dirs:
        assert (d / _jitcache.STAMP).read_text() == _jitcache.fingerprint()


# --- a cache folder numba cannot write (a container with an arbitrary UID, a read-only
# root file system): maps_core._jitcache.ensure_writable

#: Run first in each restricted subprocess: numba's test of a cache folder (its locators
#: create the folder and a temporary file in it) fails outside ``ALLOW`` (a list of
#: prefixes), as it does for a folder another user owns or on a read-only file system;
#: root (the container tests' user) could write anywhere otherwise.
RESTRICT = """\
import os
from numba.core import caching
ALLOW = {allow!r}
def ensure_cache_path(self):
    path = os.path.abspath(self.get_cache_path())
    if not any(path.startswith(a + os.sep) for a in ALLOW):
        raise PermissionError(13, "Permission denied (test)", path)
    os.makedirs(path, exist_ok=True)
caching._CacheLocator.ensure_cache_path = ensure_cache_path
"""

#: One small build and query; prints the counterfactual's distance, where the kernels were
#: cached and numba's cache hits and misses over maps_core's kernels.
QUERY = """\
import json, os, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import maps_core
from numba.core import config
from numba.core.registry import CPUDispatcher
from maps_core import CounterfactualMaps, _jitcache
from maps_core.warmup import _model
model, X = _model()
res = CounterfactualMaps.build(model).counterfactual(X[0], norm="l2")
hits = misses = 0
for name, mod in list(sys.modules.items()):
    if name.startswith("maps_core"):
        for f in vars(mod).values():
            if isinstance(f, CPUDispatcher):
                hits += sum(f.stats.cache_hits.values())
                misses += sum(f.stats.cache_misses.values())
print(json.dumps({"distance": res.best.distance, "cache_dir": config.CACHE_DIR,
                  "env": os.environ.get("NUMBA_CACHE_DIR"), "hits": hits, "misses": misses,
                  "warnings": [str(w.message) for w in caught]}))
"""


def _run(code: str, env_updates: dict[str, str], allow: list[Path] | None = None) -> dict:
    env = dict(os.environ)
    env.update(env_updates)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    if allow is not None:
        code = RESTRICT.format(allow=[str(a) for a in allow]) + code
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")}


def test_a_read_only_cache_moves_to_the_temp_dir_warm(tmp_path):
    """NUMBA_CACHE_DIR read-only and holding a cache of the current sources (the
    container image's, run with another UID or a read-only root): maps_core imported and
    answered from a copy of it in the temp dir, without compiling (before the fix numba
    raised at import: ``cannot cache function ...: no locator available``)."""
    # the session's own cache (fast when warm) holds the query's kernels after this run
    first = _run(QUERY, {})
    ro = tmp_path / "ro"
    modules = sorted({p.parent: p for p in _jitcache.PACKAGE.rglob("*.py")}.items())
    for (_, py_file), d in zip(modules, _jitcache.cache_dirs(), strict=True):
        sub = _caching.UserProvidedCacheLocator.get_suitable_cache_subpath(str(py_file))
        shutil.copytree(d, ro / sub, ignore=shutil.ignore_patterns("*.pyc", "*.tmp.*"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = _listing(ro)
    for p in [ro, *ro.rglob("*")]:  # read-only for real where the tests do not run as root
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        got = _run(QUERY, {"NUMBA_CACHE_DIR": str(ro), "TMPDIR": str(tmp)}, allow=[tmp])
    finally:
        for p in [ro, *ro.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    where = tmp / f"cfmaps-numba-{os.getuid()}"
    assert got["cache_dir"] == got["env"] == str(where)  # passed on to child processes
    assert got["distance"] == first["distance"]
    assert got["hits"] > 0 and got["misses"] == 0, got  # loaded, not compiled
    assert _listing(ro) == before
    dirs = list(where.iterdir())
    assert len(dirs) == 2  # maps_core and maps_core.adapters (which has no kernels)
    for d in dirs:
        assert (d / _jitcache.STAMP).read_text() == _jitcache.fingerprint()
    assert any(f.suffix == ".nbi" for d in dirs for f in d.iterdir())
    assert where.stat().st_mode & 0o077 == 0


def test_without_any_writable_folder_the_kernels_compile_in_memory(tmp_path):
    """Neither NUMBA_CACHE_DIR, nor __pycache__, nor the user's cache, nor the temp dir
    writable: maps_core still imports and its kernels run, compiled without a cache, and a
    warning says how to get one."""
    code = ("import json, warnings\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from maps_core import _norms\n"
            "from numba.core import config\n"
            "print(json.dumps({'acc': _norms.acc(_norms.L1, 1.0, 2.0),\n"
            "                  'cache_path': _norms.acc.stats.cache_path,\n"
            "                  'cache_dir': config.CACHE_DIR,\n"
            "                  'warnings': [str(w.message) for w in caught]}))\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    got = _run(code, {"NUMBA_CACHE_DIR": str(ro), "TMPDIR": str(tmp_path)}, allow=[])
    assert got["acc"] == 3.0
    assert got["cache_path"] is None  # numba's NullCache
    assert got["cache_dir"] == str(ro)
    assert any("no writable folder" in w and "NUMBA_CACHE_DIR" in w for w in got["warnings"])


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
def test_the_fallback_folder_is_private(tmp_path, monkeypatch):
    """numba unpickles what its cache holds: a ``cfmaps-numba-<uid>`` folder that another
    user could have written (a shared /tmp) is not used; a new private one is."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = tmp_path / f"cfmaps-numba-{os.getuid()}"
    assert _jitcache.fallback_dir() == mine
    assert mine.stat().st_mode & 0o777 == 0o700
    assert _jitcache.fallback_dir() == mine  # the same one next time

    mine.chmod(0o777)  # anyone could have put files in it
    other = _jitcache.fallback_dir()
    assert other != mine and other.parent == tmp_path and other.stat().st_mode & 0o077 == 0
    mine.rmdir()
    mine.write_text("")  # not a folder
    assert _jitcache.fallback_dir() not in (mine, None)


def test_seed_copies_only_a_cache_of_the_current_sources(tmp_path):
    src, stale, dest = tmp_path / "src", tmp_path / "stale", tmp_path / "dest"
    for d, stamp in ((src, "want"), (stale, "old")):
        d.mkdir()
        (d / _jitcache.STAMP).write_text(stamp)
        (d / "k.f-1.py311.nbi").write_bytes(d.name.encode())
        (d / "k.f-1.py311.1.nbc").write_bytes(d.name.encode())
    assert _jitcache._seed(dest, [stale, src], "want")  # the stale one is skipped
    assert (dest / "k.f-1.py311.nbi").read_bytes() == b"src"
    assert (dest / _jitcache.STAMP).read_text() == "want"
    assert not [f for f in dest.iterdir() if f.suffix == ".tmp"]
    (dest / "k.f-1.py311.2.nbc").write_bytes(b"compiled here")
    assert not _jitcache._seed(dest, [src], "want")  # already current: kept as it is
    assert (dest / "k.f-1.py311.2.nbc").exists()
    assert not _jitcache._seed(tmp_path / "none", [stale], "want")
