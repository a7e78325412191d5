"""Background builds of counterfactual maps.

Builds run in a :class:`~concurrent.futures.ThreadPoolExecutor` with
``CFMAPS_BUILD_WORKERS`` threads, not in a process pool, because

* the engine's extraction is numba ``nogil`` code that runs its own worker threads, so a
  build thread does not hold the GIL while it works and queries keep being answered;
* the progress callback can write the shared :class:`~app.registry.ModelEntry` directly,
  and a delete or a shutdown can cancel a build through a :class:`threading.Event` that the
  callback checks, with no inter-process plumbing;
* the built maps need no pickling back to the parent: they are saved, then re-loaded
  memory-mapped exactly as after a restart, so a model only becomes ``ready`` once its maps
  were proven readable from disk.

What a thread pool cannot do is kill a runaway build; ``CFMAPS_BUILD_MAX_SECONDS`` bounds
it instead (on budget the engine keeps *mixed* regions that queries refine, so answers stay
exact). A process crash leaves the status ``queued``/``building`` on disk; the next start queues
the build again from the stored model file (:meth:`app.registry.Registry.open`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from maps_core import CounterfactualMaps, MapsError

from .metrics import Metrics
from .registry import ModelEntry, Registry
from .settings import Settings

log = logging.getLogger("cfmaps.app")

# Share of the progress bar given to extraction; saving and re-loading take the rest.
_EXTRACT_SHARE = 0.95
# Seconds between progress writes to status.json (read by the other processes).
_PROGRESS_EVERY = 0.5


class BuildCancelled(Exception):
    """Raised from the progress callback to stop a build whose model was deleted."""


class BuildManager:
    """Runs builds in a thread pool and records their outcome in the registry.

    Parameters
    ----------
    registry : Registry
    settings : Settings
    metrics : Metrics
    """

    def __init__(self, registry: Registry, settings: Settings, metrics: Metrics) -> None:
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self._executor = ThreadPoolExecutor(
            max_workers=settings.build_workers, thread_name_prefix="cfmaps-build"
        )
        self._futures: set[Future[None]] = set()

    def submit(self, entry: ModelEntry) -> Future[None] | None:
        """Queue the build of a ``queued`` model; None when this process does not build
        (role ``api``: a builder process picks the model up from the data dir)."""
        if self.settings.role == "api":
            return None
        entry.building_here = True
        self.metrics.builds_queued.inc()
        fut = self._executor.submit(self._run, entry)
        self._futures.add(fut)
        fut.add_done_callback(self._futures.discard)
        return fut

    def shutdown(self) -> None:
        """Cancel queued builds and ask running ones to stop; does not wait for them."""
        self.registry.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def wait(self, timeout: float | None = None) -> None:
        """Block until every submitted build has finished (tests, CLI)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for fut in list(self._futures):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            fut.result(timeout=remaining)

    # -- the build ------------------------------------------------------------------------
    def _run(self, entry: ModelEntry) -> None:
        self.metrics.builds_queued.dec()
        lock = self.registry.build_lock(entry)
        if lock is None:
            # Another process (a replica, the builder) holds the build lock: it builds the
            # model, and the data-dir sync shows its progress here.
            entry.building_here = False
            return
        try:
            self._run_locked(entry)
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
            outcome = self._build(entry)
        except BuildCancelled:
            outcome = "cancelled"
        except MapsError as exc:
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

    def _build(self, entry: ModelEntry) -> str:
        last_written = [time.monotonic()]

        def progress(fraction: float) -> None:
            if entry.cancel.is_set():
                raise BuildCancelled()
            f = min(max(float(fraction), 0.0), 1.0) * _EXTRACT_SHARE
            if f > entry.progress:
                entry.progress = f
            now = time.monotonic()
            if now - last_written[0] >= _PROGRESS_EVERY:  # for the other processes
                last_written[0] = now
                self.registry.persist_progress(entry)

        s = self.settings
        maps = CounterfactualMaps.build(
            entry.model,
            entry.schema,
            max_rectangles=s.build_max_rectangles,
            max_seconds=s.build_max_seconds,
            max_memory=s.effective_build_memory(),
            on_budget="mixed",
            progress=progress,
            n_jobs=s.effective_build_jobs(),
        )
        # Save and re-load under the entry's lock so that a concurrent delete waits for the
        # files to be complete before removing the directory.
        with entry.io_lock:
            if entry.cancel.is_set():
                return "cancelled"
            path = self.registry.maps_dir(entry)
            maps.save(path)
            entry.progress = max(entry.progress, 0.98)
            loaded = CounterfactualMaps.load(path)
        del maps
        if not self.registry.attach(entry, loaded):
            return "cancelled"
        log.info(
            "model %s ready: %d rectangles in %.2fs",
            entry.id,
            sum(loaded.stats.rectangles_per_class),
            loaded.stats.seconds,
        )
        return "ready"
