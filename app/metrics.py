"""Prometheus metrics, one :class:`~prometheus_client.CollectorRegistry` per app.

A per-app registry (instead of the process-global default) lets tests, and the CLI's demo,
create several apps in one process without "duplicated timeseries" errors.

Exposed series:

* ``cfmaps_http_requests_total{method, route, status}`` and
  ``cfmaps_http_request_duration_seconds{method, route}``: ``route`` is the route
  *template* (``/v1/models/{model_id}/counterfactuals``), so ids do not explode the label
  space; requests matching no route count as ``<unmatched>``. Answers given before the
  body is read (401, 403, 413, 415) count under their route.
* ``cfmaps_builds_total{outcome}`` (ready, failed, cancelled), ``cfmaps_builds_running``,
  ``cfmaps_builds_queued``, ``cfmaps_build_duration_seconds``.
* ``cfmaps_counterfactuals_total``: instances answered; ``cfmaps_models{status}``: models
  per status, computed at scrape time.

``cfmaps serve --workers N`` runs N processes behind one port, and a scrape reaches one of
them: each process's own counters read as resets whenever the scrape reached the other.
So with N > 1 the processes keep their values in prometheus_client's multiprocess files
(:data:`MULTIPROC_ENV`, a fresh directory per ``cfmaps serve`` unless the operator names
one) and every scrape sums them all: counters and histograms over every process that ran
(a process that ended keeps its counts), gauges over the processes alive.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .siblings import pid_alive

# Counterfactual queries take well under a millisecond to tens of milliseconds; builds seconds
# to minutes.
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_BUILD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: prometheus_client's directory of per-process values; set (by ``cfmaps serve --workers
#: N``, or by the operator) before the processes import prometheus_client, which reads it
#: then.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The multiprocess directory this process's metrics write to, or None."""
    return os.environ.get(MULTIPROC_ENV) or None


def forget_dead_processes(path: str) -> None:
    """Take the gauges of processes that ended without :meth:`Metrics.close` (killed;
    uvicorn starts another in their place) out of the live sums in ``path``."""
    for name in os.listdir(path):
        if not name.startswith("gauge_live") or not name.endswith(".db"):
            continue
        try:
            pid = int(name[:-3].rsplit("_", 1)[1])
        except ValueError:
            continue
        if not pid_alive(pid):
            multiprocess.mark_process_dead(pid, path)



class _ModelsCollector(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("cfmaps_models", "Registered models by status", labels=["status"])
        for status, n in sorted(self._counts().items()):
            g.add_metric([status], n)
        yield g

    def describe(self) -> list[Any]:
        # Not calling collect() at registration time: the registry may not be open yet.
        return []


class Metrics:
    """The app's metrics and their registry.

    ``registry`` is what a scrape renders: the metrics themselves, or, in multiprocess mode
    (:func:`multiprocess_dir`), every process's values read from their files.
    """

    def __init__(self) -> None:
        own = CollectorRegistry(auto_describe=True)
        self._dir = multiprocess_dir()
        if self._dir is not None:
            forget_dead_processes(self._dir)
            self.registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(self.registry)
        else:
            self.registry = own
        r = own
        self.requests = Counter(
            "cfmaps_http_requests", "HTTP requests", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "cfmaps_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.builds = Counter("cfmaps_builds", "Finished builds", ["outcome"], registry=r)
        # summed over the processes alive (multiprocess mode; ignored otherwise)
        self.builds_running = Gauge("cfmaps_builds_running", "Builds in progress", registry=r,
                                    multiprocess_mode="livesum")
        self.builds_queued = Gauge("cfmaps_builds_queued", "Builds waiting", registry=r,
                                   multiprocess_mode="livesum")
        self.build_seconds = Histogram(
            "cfmaps_build_duration_seconds",
            "Duration of successful builds",
            buckets=_BUILD_BUCKETS,
            registry=r,
        )
        self.counterfactuals = Counter(
            "cfmaps_counterfactuals", "Instances answered with counterfactuals", registry=r
        )
        self.unproven = Counter(
            "cfmaps_counterfactuals_unproven",
            'Instances answered with the best found, not proven optimal (on_budget "best")',
            registry=r,
        )

    def watch_models(self, counts: Callable[[], dict[str, int]]) -> None:
        """Expose ``cfmaps_models{status}`` from a callable evaluated at scrape time."""
        self.registry.register(_ModelsCollector(counts))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """At the process's end: in multiprocess mode its gauges leave the sums (its
        counters stay counted)."""
        if self._dir is not None:
            multiprocess.mark_process_dead(os.getpid(), self._dir)


class MetricsMiddleware:
    """Pure ASGI middleware timing every HTTP request (cheaper than ``BaseHTTPMiddleware``)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        # The label children, looked up once per (method, route[, status]): prometheus'
        # labels() validates and locks on every call.
        self._latency: dict[tuple[str, str], Any] = {}
        self._count: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app raises before answering, the server answers 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            # The router stores the matched route in the (shared) scope dict.
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            method = scope.get("method", "")
            key = (method, route)
            hist = self._latency.get(key)
            if hist is None:
                hist = self._latency[key] = self.metrics.latency.labels(method, route)
            hist.observe(time.perf_counter() - t0)
            ckey = (method, route, status)
            counter = self._count.get(ckey)
            if counter is None:
                counter = self._count[ckey] = self.metrics.requests.labels(method, route, str(status))
            counter.inc()
