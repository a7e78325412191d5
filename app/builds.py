"""Background builds of counterfactual maps, each in its own worker process.

A :class:`~concurrent.futures.ThreadPoolExecutor` with ``CFMAPS_BUILD_WORKERS`` threads
runs the builds; each thread starts one child process (:mod:`app.build_worker`) per build
and follows it. The child, not this process, loads the model file, builds and saves the
maps, because

* a build that crashes in native code or is killed by the OS for memory (large models
  need gigabytes) takes only the child down, never the process that answers queries;
* a cancelled build (the model deleted, the service stopping) is stopped at once by
  killing the child, where a thread could only be asked to stop at its next progress
  report;
* the child caps its own address space (``RLIMIT_AS``) above the memory budget.

The children are forked from a *forkserver* that imported the engine once, so a build
starts in milliseconds rather than the seconds a fresh interpreter takes to import numpy,
scikit-learn and numba, and inherits nothing of this process (no threads, no sockets, no
build locks).

This process keeps everything else: the build lock, the model's status and progress
(which the child reports over a pipe), the metrics, and loading the saved maps
memory-mapped, exactly as after a restart, so a model only becomes ``ready`` once its
maps were proven readable from disk and to belong to its model file.

A child that dies without reporting (a crash, ``kill -9``, the OOM killer) is started
again from the stored model file, up to :data:`ATTEMPTS` times; after that the model is
``failed`` with the reason. A child that overruns ``CFMAPS_BUILD_MAX_SECONDS`` by far
(saving and indexing included) is killed. If this whole process dies, the status stays
``queued``/``building`` on disk and the next process that builds (at its start or its next
sync) takes the build over (:meth:`app.registry.Registry.sync`).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import shutil
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from maps_core import ArtifactError, CounterfactualMaps, MapsError

from . import build_worker
from .build_worker import BuildJob, os_reason
from .metrics import Metrics
from .registry import BuildLock, ModelEntry, Registry
from .settings import Settings

log = logging.getLogger("cfmaps.app")

# Share of the progress bar given to the engine's build (extraction, then the KD-trees);
# saving and re-loading take the rest.
_BUILD_SHARE = 0.95
# Seconds between progress writes to status.json (read by the other processes).
_PROGRESS_EVERY = 0.5
#: Times a build is started before a worker that keeps dying fails the model: once is a
#: fluke (a node drained, an operator's kill), three times is the build itself (memory).
ATTEMPTS = 3
#: How often the parent looks at the cancel flag and the child while waiting for news.
_POLL_SECONDS = 0.1
#: A child is killed when it runs this much longer than ``CFMAPS_BUILD_MAX_SECONDS``
#: (flattening, indexing and saving come on top of the extraction budget).
OVERRUN_SECONDS = 600.0

Worker = Callable[[BuildJob, Connection], None]


def _context() -> Any:
    """The multiprocessing context that starts build workers (see the module docstring)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["app.build_worker"])
    return ctx


def remove_forkserver_dir() -> None:
    """Remove multiprocessing's temporary directory of this process (``pymp-*``, where the
    forkserver of :func:`_context` keeps its socket).

    Python's exit handlers remove it, but a process that ends by re-raising SIGTERM (as
    uvicorn does once it has shut down) never runs them; ``cfmaps serve`` and ``cfmaps
    demo`` call this first. It creates the directory only to remove it when this process
    never made one."""
    import multiprocessing.util

    shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)


class BuildCancelled(Exception):
    """The build's model was deleted, or the service is stopping."""


class WorkerDied(Exception):
    """The build worker exited without reporting an outcome."""


class BuildManager:
    """Runs builds in worker processes and records their outcome in the registry.

    Parameters
    ----------
    registry : Registry
    settings : Settings
    metrics : Metrics

    Attributes
    ----------
    worker : callable
        The child process's entry point, ``worker(job, conn)``
        (:func:`app.build_worker.run`); tests substitute one that misbehaves. It must be
        picklable by reference (a module-level function or a ``functools.partial`` of one).
    """

    def __init__(self, registry: Registry, settings: Settings, metrics: Metrics) -> None:
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self.worker: Worker = build_worker.run
        self._executor = ThreadPoolExecutor(
            max_workers=settings.build_workers, thread_name_prefix="cfmaps-build"
        )
        self._futures: set[Future[None]] = set()
        self._children: dict[str, Any] = {}

    def submit(self, entry: ModelEntry) -> Future[None] | None:
        """Queue the build of a ``queued`` model; None when this process does not build
        (role ``api``: a builder process picks the model up from the data dir) or another
        process holds the model's build lock (it builds the model; the sync follows it).

        The lock is taken here and held while the build waits in the queue, not from when
        a build thread gets to it: a model queued behind a long build had no holder, so
        another worker's sync took it for an orphan and queued it as well, then left its
        status alone until its own queue reached it (``queued`` in that worker for tens of
        seconds after ``ready`` in this one, and 409s on a ready model)."""
        if self.settings.role == "api":
            return None
        lock = self.registry.build_lock(entry)
        if lock is None:
            entry.building_here = False
            return None
        entry.building_here = True
        self.metrics.builds_queued.inc()
        fut = self._executor.submit(self._run, entry, lock)
        self._futures.add(fut)
        fut.add_done_callback(self._futures.discard)

        def unlock_if_cancelled(f: Future[None]) -> None:
            if f.cancelled():  # never run (the service stopping): nobody else releases it
                lock.release()

        fut.add_done_callback(unlock_if_cancelled)
        return fut

    def shutdown(self) -> None:
        """Cancel queued builds and kill the running ones' workers; does not wait for the
        build threads.

        The workers are killed here, not left to their threads: uvicorn re-raises the
        stopping signal once the lifespan ends, and the process could exit before a thread
        got to its worker, which then kept building (and a restart built the same model
        again beside it)."""
        self.registry.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for proc in list(self._children.values()):
            with contextlib.suppress(Exception):  # exited meanwhile, or never started
                if proc.is_alive():
                    proc.kill()

    def wait(self, timeout: float | None = None) -> None:
        """Block until every submitted build has finished (tests, CLI)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for fut in list(self._futures):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            fut.result(timeout=remaining)

    def worker_pids(self) -> dict[str, int]:
        """Process id of the running build worker per model id (operators, tests)."""
        return {mid: p.pid for mid, p in list(self._children.items()) if p.pid is not None}

    # -- the build ------------------------------------------------------------------------
    def _run(self, entry: ModelEntry, lock: BuildLock) -> None:
        """Build ``entry`` under its build ``lock`` (taken by :meth:`submit`), then release it."""
        self.metrics.builds_queued.dec()
        try:
            # What a process that died while saving these maps left (the lock is ours now,
            # so nobody else writes there): a stop during a save must not leak its folder.
            _remove_partial_saves(self.registry.maps_dir(entry))
            if self.registry.settled_elsewhere(entry):
                # Built by another process while queued here: the sync loads its maps.
                log.info("model %s: built by another process meanwhile", entry.id)
                return
            self._run_locked(entry)
        except OSError as exc:
            # The data dir refused a status write (full, read-only): left queued on disk,
            # the sync took the model for an orphan and queued it again every pass, with
            # nothing said. Failed here instead, with the reason; a restart builds it again.
            self.registry.fail_in_memory(
                entry, f"could not write the model's status: {os_reason(exc)}; free the data "
                "dir and restart the service, or upload the model again")
        finally:
            entry.building_here = False
            lock.release()

    def _run_locked(self, entry: ModelEntry) -> None:
        entry.progress = 0.0
        if not self.registry.set_status(entry, "building"):
            self.metrics.builds.labels(outcome="cancelled").inc()
            return
        t0 = time.perf_counter()
        self.metrics.builds_running.inc()
        error: str | None = None
        try:
            error = self._build(entry)
            outcome = "ready" if error is None else "failed"
        except BuildCancelled:
            outcome = "cancelled"
        except MapsError as exc:  # loading the saved maps
            outcome, error = "failed", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug (ours or the engine's): keep the service up
            log.exception("build of model %s crashed", entry.id)
            outcome = "failed"
            error = f"internal error during the build: {type(exc).__name__}: {exc}"
        # Metrics before the final status, so that whoever sees the status sees the counts.
        self.metrics.builds_running.dec()
        self.metrics.builds.labels(outcome=outcome).inc()
        if outcome == "ready":
            self.metrics.build_seconds.observe(time.perf_counter() - t0)
        if error is not None:
            self.registry.set_status(entry, "failed", error)
        elif outcome == "ready":
            self.registry.publish_ready(entry)

    def _job(self, entry: ModelEntry) -> BuildJob:
        s = self.settings
        return BuildJob(
            model_id=entry.id,
            model_path=str(self.registry.model_file(entry)),
            trust_pickle=s.trust_pickle,
            max_unpacked_bytes=s.max_upload_bytes * s.max_unpacked_factor,
            features=entry.features,
            maps_path=str(self.registry.maps_dir(entry)),
            max_rectangles=s.build_max_rectangles,
            max_seconds=s.build_max_seconds,
            max_memory=s.effective_build_memory(),
            n_jobs=s.effective_build_jobs(),
        )

    def _build(self, entry: ModelEntry) -> str | None:
        """Run workers until one reports (or :data:`ATTEMPTS` died) and attach the maps it
        saved; None when the model is ready, else why it failed.

        Raises
        ------
        BuildCancelled
        """
        job = self._job(entry)
        deaths: list[str] = []
        # The entry's io lock is held while a worker may write into the model's directory,
        # so that a delete waits (at most one poll) for the worker to be killed before it
        # removes the directory.
        with entry.io_lock:
            while True:
                try:
                    reason = self._run_worker(entry, job)
                    break
                except WorkerDied as died:
                    deaths.append(str(died))
                    if len(deaths) >= ATTEMPTS:
                        return (f"the build worker died {len(deaths)} times, last: it "
                                f"{deaths[-1]}; the build needs more memory than this "
                                "machine gives it, or crashes")
                    log.warning("model %s: build worker %s; building again (attempt %d of %d)",
                                entry.id, died, len(deaths) + 1, ATTEMPTS)
                    entry.progress = 0.0
                    self.registry.persist_progress(entry)
            if reason is not None:
                return reason
            if entry.cancel.is_set():
                raise BuildCancelled()
            entry.progress = max(entry.progress, 0.98)
            loaded = CounterfactualMaps.load(self.registry.maps_dir(entry))
        # The maps must belong to the model this process serves /predict with, and
        # near-tie points are decided by it, as after a restart (Registry._load_entry).
        try:
            loaded.attach_model(entry.model)  # flattens the model once, and checks it
        except ArtifactError:
            return "the saved maps do not belong to the model file"
        if not self.registry.attach(entry, loaded):
            raise BuildCancelled()
        log.info(
            "model %s ready: %d rectangles in %.2fs",
            entry.id,
            sum(loaded.stats.rectangles_per_class),
            loaded.stats.seconds,
        )
        return None

    def _run_worker(self, entry: ModelEntry, job: BuildJob) -> str | None:
        """One worker process from start to end: None when it saved the maps, the reason
        when it failed.

        Raises
        ------
        BuildCancelled
            The model was deleted or the service is stopping (the worker is killed).
        WorkerDied
            The worker exited without reporting.
        """
        ctx = _context()
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=self.worker, args=(job, send), daemon=True,
                           name=f"cfmaps-build-{entry.id[:8]}")
        limit = None if job.max_seconds is None else job.max_seconds + OVERRUN_SECONDS
        t0 = time.monotonic()
        last_written = t0
        saved = False
        try:
            proc.start()
            send.close()  # the child holds the write end now: EOF here means it is gone
            self._children[entry.id] = proc
            log.info("model %s: build worker %d started", entry.id, proc.pid)
            while True:
                if entry.cancel.is_set():
                    raise BuildCancelled()
                if limit is not None and time.monotonic() - t0 > limit:
                    return (f"the build ran {OVERRUN_SECONDS:.0f} s over its time budget "
                            "(CFMAPS_BUILD_MAX_SECONDS) and was stopped")
                try:
                    if not recv.poll(_POLL_SECONDS):
                        continue
                    kind, value = recv.recv()
                except (EOFError, OSError):
                    if entry.cancel.is_set():  # killed by shutdown() or a delete
                        raise BuildCancelled() from None
                    proc.join(timeout=5)
                    raise WorkerDied(_exit_description(proc.exitcode)) from None
                if kind == "progress":
                    f = min(max(float(value), 0.0), 1.0) * _BUILD_SHARE
                    entry.progress = max(entry.progress, f)
                    now = time.monotonic()
                    if now - last_written >= _PROGRESS_EVERY:  # for the other processes
                        last_written = now
                        self.registry.persist_progress(entry)
                elif kind == "done":
                    saved = True
                    return None
                else:
                    return str(value)
        finally:
            self._children.pop(entry.id, None)
            recv.close()
            if proc.is_alive() and not saved:  # cancelled or overran: stop it, whatever it does
                proc.kill()
            if proc.pid is not None:
                proc.join(timeout=10)
            if not saved:
                _remove_partial_saves(self.registry.maps_dir(entry))


def _exit_description(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the OS kills for memory with SIGKILL)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {code} without reporting"


def _remove_partial_saves(maps_dir: Path) -> None:
    """Remove what a killed worker (of this process or of a dead one) was saving: the
    save's temporary sibling directories (:func:`maps_core.storage.save_artifact`). The
    caller holds the build lock, so nobody else writes there."""
    parent = maps_dir.parent
    if not parent.is_dir():
        return
    for pattern in (f".{maps_dir.name}.tmp-*", f".{maps_dir.name}.old-*"):
        for d in parent.glob(pattern):
            shutil.rmtree(d, ignore_errors=True)
