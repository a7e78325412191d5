"""The build worker: one child process per build, started by :mod:`app.builds`.

A build runs in its own process, not in the service's, so that whatever happens to it
(a crash in native code, the OS killing it for memory, a cancel that must stop it at
once) cannot take down the process that answers queries for every other model.

The child reads the uploaded model file from the data dir itself (the same safe loader as
an upload), builds, and saves the maps (atomically, :func:`maps_core.storage.save_artifact`)
where the parent will load them from. It talks to the parent over one pipe:

* ``("progress", fraction)`` while building the maps (extraction, then the KD-trees);
* then exactly one of ``("done", None)`` (maps saved) or ``("failed", reason)``.

A child that exits without its last message crashed (the parent tells that from the exit
code and builds again). An orphaned build never keeps running: on Linux the child asks
the kernel to kill it when its parent (the forkserver, which exits with the service) dies
(``PR_SET_PDEATHSIG``); elsewhere, or should that fail, its next progress report finds the
pipe broken and it exits at once (``os._exit``: leaving the engine's thread pool to finish
its wave of regions kept a build running for minutes). A service that stops kills its
workers itself (:meth:`app.builds.BuildManager.shutdown`).

Memory: the engine keeps a build within ``max_memory`` by its own measure; as a backstop,
the child also caps its address space (``RLIMIT_AS``) a margin above that, so a build that
outgrows every estimate fails with ``MemoryError`` (reported as out of memory) instead of
drawing the OS's OOM killer onto the machine. Should the OS run out of memory all the
same (other processes grew meanwhile), the child offers itself first to the OOM killer
(:func:`first_for_the_oom_killer`): in a container at its limit the killer chose the API
processes, larger than the growing build, and the service went down with every model.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import resource
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from maps_core import ArtifactError, CounterfactualMaps, FeatureSchema, MapsError

from . import modelio

# Address space a build may use beyond its memory budget: the interpreter's allocator,
# thread stacks and malloc arenas reserve address space they never touch, which
# RLIMIT_AS counts as well.
ADDRESS_HEADROOM = 1 << 30
ADDRESS_PER_THREAD = 128 << 20
# Seconds between progress messages at most (the engine reports every 0.5 s already).
_PROGRESS_EVERY = 0.2


@dataclass(frozen=True)
class BuildJob:
    """What a build worker needs, all of it plain data (it is pickled to the child).

    Attributes
    ----------
    model_id : str
    model_path : str
        The stored model file.
    trust_pickle : bool
    max_unpacked_bytes : int
        As for an upload (:func:`app.modelio.load_model_file`).
    features : list of dict
        The model's feature schema (:meth:`maps_core.FeatureSchema.to_dicts`).
    maps_path : str
        Where to save the maps.
    max_rectangles, max_seconds, max_memory, n_jobs
        The build budgets and threads (:meth:`maps_core.CounterfactualMaps.build`).
    """

    model_id: str
    model_path: str
    trust_pickle: bool
    max_unpacked_bytes: int
    features: list[dict[str, Any]]
    maps_path: str
    max_rectangles: int | None
    max_seconds: float | None
    max_memory: int
    n_jobs: int


def run(job: BuildJob, conn: Connection) -> None:
    """Entry point of the child process: build, save, report (see the module docstring).

    Parameters
    ----------
    job : BuildJob
    conn : Connection
        The write end of the pipe to the parent.
    """
    die_with_parent()
    first_for_the_oom_killer()
    limit_address_space(job.max_memory, job.n_jobs)
    try:
        message: tuple[str, Any] = ("done", None)
        try:
            build_and_save(job, conn)
        except MemoryError:
            message = ("failed", f"out of memory: the build outgrew its memory budget of "
                                 f"{job.max_memory} bytes (CFMAPS_BUILD_MAX_MEMORY) by far")
        except MapsError as exc:
            message = ("failed", f"{type(exc).__name__}: {exc}")
        except SaveError as exc:
            message = ("failed", str(exc))
        except BrokenPipeError:
            return  # the parent is gone: nobody wants this build any more
        except Exception as exc:  # a bug (ours or the engine's): report it, do not crash
            message = ("failed", f"internal error during the build: {type(exc).__name__}: {exc}")
        conn.send(message)
    except BrokenPipeError:
        return
    finally:
        conn.close()


class SaveError(Exception):
    """The maps were built but could not be written (disk full, permissions...)."""


def build_and_save(job: BuildJob, conn: Connection) -> None:
    """Load the model file, build its maps, save them to ``job.maps_path``.

    Raises
    ------
    MapsError
        From loading or building (unsupported model, budget with ``on_budget="error"``...).
    SaveError
        When saving fails; nothing is left under ``job.maps_path`` then (the save is
        atomic).
    BrokenPipeError
        When the parent is gone.
    """
    model, _ = modelio.load_model_file(
        Path(job.model_path), trust_pickle=job.trust_pickle, max_unpacked_bytes=job.max_unpacked_bytes
    )
    last = [0.0]

    def progress(fraction: float) -> None:
        now = time.monotonic()
        if now - last[0] >= _PROGRESS_EVERY or fraction >= 1.0:
            last[0] = now
            try:
                conn.send(("progress", float(fraction)))
            except (BrokenPipeError, ConnectionResetError):
                # The parent is gone: exit now. Raising would unwind into the extraction's
                # thread pool, whose exit waits for every region of the wave queued.
                os._exit(1)

    maps = CounterfactualMaps.build(
        model,
        FeatureSchema.from_dicts(job.features),
        max_rectangles=job.max_rectangles,
        max_seconds=job.max_seconds,
        max_memory=job.max_memory,
        on_budget="mixed",
        progress=progress,
        n_jobs=job.n_jobs,
    )
    try:
        # parents=False: when another process deletes the model meanwhile, its folder is
        # gone and the save fails instead of bringing the folder back with maps alone.
        maps.save(job.maps_path, parents=False)
    except OSError as exc:
        raise SaveError(f"could not save the maps: {os_reason(exc)}") from exc
    except ArtifactError as exc:  # the OS refused the save's directory: said without paths
        if isinstance(exc.__cause__, OSError):
            raise SaveError(f"could not save the maps: {os_reason(exc.__cause__)}") from exc
        raise


def os_reason(exc: OSError) -> str:
    """An OS error as a client may read it, without its path: ``No space left on device
    (ENOSPC)``."""
    name = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    if name is None and _SHORT_WRITE.fullmatch(text):
        # numpy's words for a write the file system cut short (its OSError has no errno):
        # on a real full disk the save said only "2028864 requested and 198592 written"
        return f"No space left on device (a write stopped short: {text})"
    return f"{text} ({name})" if name else text


#: numpy's message for a short write (``ndarray.tofile``, ``np.save``)
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def first_for_the_oom_killer(path: str = "/proc/self/oom_score_adj") -> bool:
    """Make this process the OOM killer's first choice (``oom_score_adj`` 1000, which any
    process may raise for itself); False where that is not available (not Linux)."""
    try:
        with open(path, "w") as f:
            f.write("1000")
    except OSError:
        return False
    return True


def die_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
    False where that is not available. A parent that died before the request leaves the
    process to init, so that case exits at once."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        ok = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux, or no prctl
        return False
    if ok and os.getppid() != parent:  # died in between: nobody wants this build
        os._exit(1)
    return ok


#: prctl's option number, from <linux/prctl.h>
_PR_SET_PDEATHSIG = 1


def limit_address_space(max_memory: int, n_jobs: int) -> int | None:
    """Cap this process's address space at its current size plus 1.5 times ``max_memory``
    plus headroom (see the module docstring); returns the limit, or None when the
    platform cannot tell the current size or a tighter limit is already set."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    current = pages * os.sysconf("SC_PAGE_SIZE")
    limit = current + max_memory * 3 // 2 + ADDRESS_HEADROOM + n_jobs * ADDRESS_PER_THREAD
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        return None
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit
