"""Build workers that misbehave, for the fault tests.

Each is a module-level function (a build worker's entry point is pickled by reference to
the forkserver child, see :mod:`app.builds`) that changes something *inside the child*
and then runs the real :func:`app.build_worker.run`, so the real child code reports what
happens. Arguments come first so that ``functools.partial(f, arg)`` is the worker.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from app import build_worker
from app.build_worker import BuildJob
from maps_core import BudgetExceededError, CounterfactualMaps, storage

# Bounds every wait of a held worker (the test kills or releases it well before).
HOLD_SECONDS = 120.0


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + HOLD_SECONDS
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def hold(gate: str, job: BuildJob, conn: Connection) -> None:
    """Report progress 0.5, wait until the file ``gate`` exists, then build for real."""
    conn.send(("progress", 0.5))
    _wait_for(Path(gate))
    build_worker.run(job, conn)


def hold_first(marker: str, job: BuildJob, conn: Connection) -> None:
    """The first worker (no file ``marker`` yet) creates it, reports progress and waits to
    be killed; every later one builds for real."""
    if not Path(marker).exists():
        # whole or absent: the test polls for it, and write_text creates the file empty
        # before it writes (a poll in between read "" for the pid)
        tmp = Path(f"{marker}.{os.getpid()}.tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, marker)
        conn.send(("progress", 0.5))
        _wait_for(Path(marker + ".never"))
        return
    build_worker.run(job, conn)


def _build_raising(exc: BaseException) -> Any:
    def build(cls: Any, *a: Any, **kw: Any) -> Any:
        raise exc

    return classmethod(build)


def budget_exceeded(job: BuildJob, conn: Connection) -> None:
    CounterfactualMaps.build = _build_raising(  # type: ignore[method-assign]
        BudgetExceededError("rectangle budget of 10 exhausted"))
    build_worker.run(job, conn)


def zero_division(job: BuildJob, conn: Connection) -> None:
    CounterfactualMaps.build = _build_raising(ZeroDivisionError("oops"))  # type: ignore[method-assign]
    build_worker.run(job, conn)


def hog_memory(job: BuildJob, conn: Connection) -> None:
    """The build asks for 6 GiB of address space (never touched: without the worker's
    RLIMIT_AS this succeeds on any 64-bit machine that overcommits)."""

    def build(cls: Any, *a: Any, **kw: Any) -> Any:
        return np.empty(6 << 30, dtype=np.uint8)

    CounterfactualMaps.build = classmethod(build)  # type: ignore[method-assign,assignment]
    build_worker.run(job, conn)


def die(job: BuildJob, conn: Connection) -> None:
    """Killed by the OS (as the OOM killer does) before reporting anything."""
    conn.send(("progress", 0.1))
    os.kill(os.getpid(), signal.SIGKILL)


def disk_full_after(files: int, job: BuildJob, conn: Connection, short: bool = False) -> None:
    """The disk fills up while the maps are saved: the ``files``-th array write fails with
    ENOSPC after writing half of its bytes; with ``short``, as numpy says it on a real full
    disk (an OSError without errno: "N requested and M written")."""
    real = np.save
    written = [0]

    def save(file: Any, arr: Any, *a: Any, **kw: Any) -> None:
        if written[0] >= files:
            Path(file).write_bytes(b"\x93NUMPY" + b"\0" * 10)
            if short:
                raise OSError(f"{arr.nbytes} requested and 16 written")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += 1
        real(file, arr, *a, **kw)

    storage.np.save = save  # type: ignore[attr-defined]
    build_worker.run(job, conn)


def disk_full_at_start(job: BuildJob, conn: Connection) -> None:
    """The disk is full as the save makes its temporary directory (an ArtifactError of the
    engine, caused by the OS's ENOSPC)."""
    real = os.mkdir

    def mkdir(path: Any, *a: Any, **kw: Any) -> None:
        if ".tmp-" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, *a, **kw)

    storage.os.mkdir = mkdir  # type: ignore[attr-defined]
    build_worker.run(job, conn)


def hold_in_save(gate: str, step: str, job: BuildJob, conn: Connection) -> None:
    """Build for real, then wait for the file ``gate`` at one step of the save: ``"start"``
    (before the save begins) or ``"middle"`` (after three arrays are written
    into it). It creates ``gate + ".reached"`` when it starts waiting."""

    def wait() -> None:
        Path(gate + ".reached").touch()
        _wait_for(Path(gate))

    if step == "start":
        real_maps_save = CounterfactualMaps.save

        def maps_save(self: CounterfactualMaps, *a: Any, **kw: Any) -> Any:
            wait()
            return real_maps_save(self, *a, **kw)

        CounterfactualMaps.save = maps_save  # type: ignore[method-assign]
    else:
        real_save = np.save
        written = [0]

        def save(file: Any, arr: Any, *a: Any, **kw: Any) -> None:
            written[0] += 1
            if written[0] == 4:
                wait()
            real_save(file, arr, *a, **kw)

        storage.np.save = save  # type: ignore[attr-defined]
    conn.send(("progress", 0.5))
    build_worker.run(job, conn)
