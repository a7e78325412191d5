"""numba's cache of the kernels follows their sources (maps_core._jitcache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba

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
