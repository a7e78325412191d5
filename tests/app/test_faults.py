"""Faults the service survives: a build worker killed, a full disk, damaged maps, an
upload and a delete racing, 100 clients at once, an API process killed under load or
mid-build.

Also: a build left running by an API process killed with ``kill -9`` stops by itself, and
the next process builds the model again.

Every wait is bounded; the servers run on loopback ports.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import build_faults
import httpx
import numpy as np
import pytest
from svc_helpers import Fitted, Service, free_port, serve_uvicorn, upload, wait_built, wait_until

from app.settings import Settings


def _wait_http_ready(http: httpx.Client, model_id: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = http.get(f"/v1/models/{model_id}").json()
        if info["status"] in ("ready", "failed"):
            return dict(info)
        time.sleep(0.05)
    raise AssertionError(f"model {model_id} not built in {timeout} s")


# -- a build worker killed mid-build --------------------------------------------------------
def test_a_build_worker_killed_mid_build_is_started_again_and_finishes(
    service: Service, rf: Fitted, tmp_path: Path
) -> None:
    marker = tmp_path / "first-worker"
    builds = service.app.state.builds
    builds.worker = functools.partial(build_faults.hold_first, str(marker))
    model_id = upload(service.client, rf.skops).json()["id"]
    wait_until(lambda: marker.exists() and model_id in builds.worker_pids(), timeout=60)
    pid = int(marker.read_text())
    assert builds.worker_pids()[model_id] == pid
    wait_until(lambda: service.client.get(f"/v1/models/{model_id}").json()["progress"] > 0, timeout=30)
    os.kill(pid, signal.SIGKILL)
    info = wait_built(service.client, model_id)
    assert info["status"] == "ready" and info["error"] is None, info
    r = service.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
    assert r.status_code == 200 and r.json()["feasible"] is True
    text = service.client.get("/metrics").text
    assert 'cfmaps_builds_total{outcome="ready"} 1.0' in text  # one build, two workers


# -- a full disk while saving -----------------------------------------------------------------
@pytest.mark.parametrize("when", ["mid-save", "at-start", "short-write"])
def test_a_full_disk_while_saving_maps_fails_the_model_cleanly(
    service_factory: Any, rf: Fitted, when: str
) -> None:
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        svc.app.state.builds.worker = {
            "mid-save": functools.partial(build_faults.disk_full_after, 3),
            "at-start": build_faults.disk_full_at_start,
            # numpy's own words for it said nothing of the disk: "N requested and M written"
            "short-write": functools.partial(build_faults.disk_full_after, 3, short=True),
        }[when]
        info = wait_built(svc.client, upload(svc.client, rf.skops).json()["id"])
        model_id = info["id"]
        assert info["status"] == "failed"
        reason = ("No space left on device (a write stopped short: " if when == "short-write"
                  else "No space left on device (ENOSPC)")
        assert info["error"].startswith(f"could not save the maps: {reason}"), info["error"]
        model_dir = data_dir / "models" / model_id
        svc.app.state.builds.wait(timeout=30)  # "failed" shows before status.json is written
        # nothing half-written: no maps, no temporaries; the upload itself is intact
        assert sorted(p.name for p in model_dir.iterdir()) == [".build.lock", "model.skops",
                                                               "spec.json", "status.json"]
        r = svc.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
        assert r.status_code == 409 and "No space left on device" in r.json()["message"]
    with service_factory(data_dir=data_dir) as svc:  # and so it stays after a restart
        info = svc.client.get(f"/v1/models/{model_id}").json()
        assert info["status"] == "failed" and reason in info["error"]


def test_an_upload_onto_a_full_disk_is_a_507_and_leaves_nothing(
    service: Service, rf: Fitted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was a 500 (an OSError from the copy, logged as a bug)."""
    from app.registry import Registry

    def full(self: Any, upload: Any, dest: Path) -> None:
        dest.write_bytes(b"\0" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Registry, "_copy_upload", full)
    r = upload(service.client, rf.skops)
    assert r.status_code == 507, r.text
    assert r.json()["error"] == "insufficient_storage"
    assert "full" in r.json()["message"] and str(service.settings.data_dir) not in r.text
    models = service.settings.data_dir / "models"
    assert [p.name for p in models.iterdir()] == []  # no upload left half-written
    assert service.client.get("/v1/models").json()["models"] == []


def test_a_delete_the_data_dir_refuses_keeps_the_model_served(
    service: Service, rf: Fitted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a replica whose data dir is read-only, DELETE was a 500 and the replica then
    forgot the model for good (404 until a restart), though its files stayed on disk and
    other replicas served it."""
    import app.registry as registry

    mid = service.add(rf.skops)
    q = {"instance": rf.X[0].tolist()}
    before = service.client.post(f"/v1/models/{mid}/counterfactuals", json=q)
    assert before.status_code == 200
    real_access = os.access
    # the check before anything is cancelled (a read-only mount) ...
    monkeypatch.setattr(registry.os, "access", lambda p, mode: False)
    r = service.client.delete(f"/v1/models/{mid}")
    assert r.status_code == 503 and r.json()["error"] == "storage_unavailable", r.text
    monkeypatch.setattr(registry.os, "access", real_access)
    # ... and a rename that fails anyway (an I/O error): rolled back
    real_replace = os.replace

    def refuse(src: Any, dst: Any) -> None:
        if ".trash-" in str(dst):
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(registry.os, "replace", refuse)
    r = service.client.delete(f"/v1/models/{mid}")
    assert r.status_code == 503 and "Input/output error" in r.json()["message"], r.text
    for _ in range(2):  # still served, also after a sync pass
        assert service.client.get(f"/v1/models/{mid}").json()["status"] == "ready"
        again = service.client.post(f"/v1/models/{mid}/counterfactuals", json=q)
        assert again.status_code == 200
        assert again.json()["distance"] == before.json()["distance"]
        service.app.state.registry.sync()
    monkeypatch.setattr(registry.os, "replace", real_replace)
    assert service.client.delete(f"/v1/models/{mid}").status_code == 204
    assert service.client.get(f"/v1/models/{mid}").status_code == 404


# -- damaged maps -------------------------------------------------------------------------------
def _truncate(maps: Path) -> str:
    f = maps / "index.order.npy"
    f.write_bytes(f.read_bytes()[:-8])
    return "index.order.npy does not match its checksum"


def _tamper(maps: Path) -> str:
    f = maps / "partition.labels.npy"
    b = bytearray(f.read_bytes())
    b[-1] ^= 0x01  # same size, one bit: a label changed
    f.write_bytes(bytes(b))
    return "partition.labels.npy does not match its checksum"


def _cut_manifest(maps: Path) -> str:
    f = maps / "manifest.json"
    f.write_bytes(f.read_bytes()[:100])
    return "unreadable manifest"


def _forge_manifest(maps: Path) -> str:
    # a tamperer who also fixes the checksum: the arrays no longer make the model
    f = maps / "manifest.json"
    doc = json.loads(f.read_text())
    doc["fingerprint"] = "0" * len(doc["fingerprint"])
    f.write_text(json.dumps(doc))
    return "model fingerprint does not match the manifest"


@pytest.mark.parametrize("damage", [_truncate, _tamper, _cut_manifest, _forge_manifest])
def test_damaged_maps_are_refused_at_load_with_the_reason(
    service_factory: Any, rf: Fitted, tmp_path: Path, damage: Any
) -> None:
    data = tmp_path / "shared"
    # The replica's sync passes are an hour apart, so that it reads the model only when a
    # request asks for it (it catches up then): never before the damage, nor during it.
    with service_factory(data_dir=data, role="api", sync_interval_seconds=3600.0) as replica:
        with service_factory(data_dir=data, sync_interval_seconds=0.05) as builder:
            model_id = builder.add(rf.skops)
            # damaged after the build, before the replica loads it (it is ready on disk)
            reason = damage(data / "models" / model_id / "maps")
        # a replica at its start, and one that catches up on a request, both refuse it
        with service_factory(data_dir=data, role="api") as fresh:
            info = fresh.client.get(f"/v1/models/{model_id}").json()
            assert info["status"] == "failed"
            assert info["error"].startswith("could not load the model: CorruptArtifactError")
            assert reason in info["error"], info["error"]
        wait_until(lambda: replica.client.get(f"/v1/models/{model_id}").json()["status"]
                   in ("ready", "failed"), timeout=30)
        info = replica.client.get(f"/v1/models/{model_id}").json()
        assert info["status"] == "failed" and reason in info["error"], info
        r = replica.client.post(f"/v1/models/{model_id}/counterfactuals",
                                json={"instance": rf.X[0].tolist()})
        assert r.status_code == 409


@pytest.mark.parametrize("refused", ["building", "ready"])
def test_a_status_the_data_dir_refuses_fails_the_model_once(
    service_factory: Any, rf: Fitted, monkeypatch: pytest.MonkeyPatch, refused: str
) -> None:
    # A full disk that refuses status.json as the build starts or ends: the model had
    # stayed "queued" on disk, and the sync queued its build again every pass, silently.
    import app.registry

    real = app.registry.write_json_atomic

    def full(path: Path, data: Any) -> None:
        if Path(path).name == "status.json" and data.get("status") == refused:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(app.registry, "write_json_atomic", full)
    with service_factory(sync_interval_seconds=0.05) as svc:
        registry = svc.app.state.registry
        requeued: list[str] = []
        real_queue = registry._queue_again
        monkeypatch.setattr(registry, "_queue_again",
                            lambda e: requeued.append(e.id) or real_queue(e))
        model_id = upload(svc.client, rf.skops).json()["id"]
        wait_until(lambda: svc.client.get(f"/v1/models/{model_id}").json()["status"]
                   == "failed", timeout=120)
        time.sleep(1.0)  # twenty sync passes
        info = svc.client.get(f"/v1/models/{model_id}").json()
        assert info["status"] == "failed", info
        assert info["error"].startswith("could not write the model's status: No space left "
                                        "on device (ENOSPC)"), info["error"]
        assert requeued == []
        svc.app.state.builds.wait(timeout=30)
        r = svc.client.post(f"/v1/models/{model_id}/counterfactuals",
                            json={"instance": rf.X[0].tolist()})
        assert r.status_code == 409


# -- upload and delete racing ------------------------------------------------------------------
def test_upload_and_delete_of_the_same_model_racing(rf: Fitted, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", sync_interval_seconds=0.05)
    statuses: list[int] = []
    with serve_uvicorn(settings) as (base, app), ThreadPoolExecutor(8) as pool:
        with httpx.Client(base_url=base, timeout=60) as http:
            for delay in (0.0, 0.0, 0.05, 0.2, 0.5, 1.0, 1.5, 2.5):
                r = http.post("/v1/models", files={"model": ("rf.skops", rf.skops)})
                assert r.status_code == 202
                model_id = r.json()["id"]
                time.sleep(delay)  # the delete lands while queued, building, saving or ready

                def call(method: str, path: str, **kw: Any) -> int:
                    with httpx.Client(base_url=base, timeout=60) as c:
                        return c.request(method, path, **kw).status_code

                q = {"json": {"instance": rf.X[0].tolist()}}
                futs = [pool.submit(call, "DELETE", f"/v1/models/{model_id}"),
                        pool.submit(call, "DELETE", f"/v1/models/{model_id}"),
                        pool.submit(call, "GET", f"/v1/models/{model_id}"),
                        pool.submit(call, "POST", f"/v1/models/{model_id}/counterfactuals", **q),
                        pool.submit(call, "POST", "/v1/models",
                                    files={"model": ("rf.skops", rf.skops)})]
                got = [f.result(timeout=60) for f in futs]
                statuses += got
                assert sorted(got[:2]) == [204, 404], got  # one delete wins
                assert got[2] in (200, 404) and got[3] in (200, 404, 409) and got[4] == 202
                assert http.get(f"/v1/models/{model_id}").status_code == 404
            # the end state, once the surviving uploads are deleted too: nothing at all
            for m in http.get("/v1/models").json()["models"]:
                assert http.delete(f"/v1/models/{m['id']}").status_code == 204
            app.state.builds.wait(timeout=60)
            assert http.get("/v1/models").json()["models"] == []
    assert all(s < 500 for s in statuses)
    assert list((tmp_path / "data" / "models").iterdir()) == []


@pytest.mark.parametrize("step", ["start", "middle"])
def test_a_delete_by_another_process_while_a_build_saves_leaves_nothing(
    service_factory: Any, rf: Fitted, tmp_path: Path, step: str
) -> None:
    # The builder syncs rarely, so it still builds and saves after the API replica has
    # deleted the model: the save must fail, not bring the model's folder back as maps alone.
    data, gate = tmp_path / "shared", tmp_path / "gate"
    with (service_factory(data_dir=data, sync_interval_seconds=600) as builder,
          service_factory(data_dir=data, role="api", sync_interval_seconds=0.05) as api):
        builds = builder.app.state.builds
        builds.worker = functools.partial(build_faults.hold_in_save, str(gate), step)
        model_id = upload(builder.client, rf.skops).json()["id"]
        wait_until(lambda: Path(str(gate) + ".reached").exists(), timeout=60)
        wait_until(lambda: api.client.get(f"/v1/models/{model_id}").status_code == 200, timeout=30)
        assert api.client.delete(f"/v1/models/{model_id}").status_code == 204
        model_dir = data / "models" / model_id
        assert not model_dir.exists()
        gate.touch()  # the worker saves now
        wait_until(lambda: model_id not in builds.worker_pids(), timeout=120)
        builds.wait(timeout=60)
        entry = builder.app.state.registry.get(model_id)  # the save failed, as it should
        assert entry.status == "failed", entry.info()
        assert entry.error == "could not save the maps: No such file or directory (ENOENT)"
        # and the delete another process answered 204 wins here too: a 404, not "failed"
        assert builder.client.get(f"/v1/models/{model_id}").status_code == 404
        assert not model_dir.exists(), sorted(p.name for p in model_dir.rglob("*"))
        assert list((data / "models").iterdir()) == []


# -- 100 concurrent clients ---------------------------------------------------------------------
def test_a_hundred_concurrent_clients_are_all_answered_correctly(rf: Fitted, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    rows = rf.X[:20].tolist()
    with serve_uvicorn(settings) as (base, _), httpx.Client(base_url=base, timeout=60) as http:
        model_id = http.post("/v1/models", files={"model": ("rf.skops", rf.skops)}).json()["id"]
        assert _wait_http_ready(http, model_id)["status"] == "ready"
        url = f"/v1/models/{model_id}/counterfactuals"
        want = [r["distance"] for r in http.post(url, json={"instances": rows}).json()["results"]]
        start = threading.Barrier(100, timeout=60)

        def client(i: int) -> list[tuple[int, int, float | None]]:
            out = []
            with httpx.Client(base_url=base, timeout=60) as c:
                start.wait()  # all hundred at once
                for j in range(3):
                    k = (i + j) % len(rows)
                    r = c.post(url, json={"instance": rows[k]})
                    out.append((r.status_code, k, r.json().get("distance")))
            return out

        with ThreadPoolExecutor(100) as pool:
            results = [x for f in [pool.submit(client, i) for i in range(100)]
                       for x in f.result(timeout=120)]
    assert len(results) == 300
    assert [s for s, _, _ in results if s != 200] == []
    assert all(d == want[k] for _, k, d in results)


# -- an API process killed under load -----------------------------------------------------------
def _processes() -> dict[int, tuple[int, bytes]]:
    """Every process as ``pid: (parent pid, command line)`` (Linux /proc)."""
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
                cmd = (p / "cmdline").read_bytes()
                out[int(p.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd)
            except (OSError, ValueError, IndexError):
                continue
    return out


def _children(pid: int) -> list[int]:
    """uvicorn's worker processes under ``pid`` (spawned by multiprocessing)."""
    return [c for c, (pp, cmd) in _processes().items() if pp == pid and b"spawn_main" in cmd]


@contextmanager
def _cfmaps_serve(data_dir: Path, log_path: Path, workers: int = 1,
                  **env: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``cfmaps serve`` in its own process over ``data_dir``, ready: ``(process, base url)``.

    Its log goes to ``log_path`` (a pipe nobody reads could fill and stall it), for the
    assertion messages. Stopped with SIGTERM at the end unless a test killed it.
    """
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
           "serve", "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    log_file = log_path.open("ab")
    server = subprocess.Popen(cmd, env={**os.environ, "CFMAPS_DATA_DIR": str(data_dir), **env},
                              stdout=subprocess.DEVNULL, stderr=log_file)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "cfmaps serve did not start"
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield server, base
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        log_file.close()


def _requests_counted(scrape: str, route: str) -> float:
    """``cfmaps_http_requests_total`` of ``route`` in a scrape, summed over its labels."""
    total = 0.0
    for line in scrape.splitlines():
        if line.startswith("cfmaps_http_requests_total{") and f'route="{route}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_every_scrape_of_a_multi_process_server_counts_every_process(tmp_path: Path) -> None:
    """``cfmaps serve --workers 2`` answers on one port from two processes, and a scrape
    reaches one of them. Each counted for itself, so successive scrapes read two partial
    counts in turn (and Prometheus each drop as a counter reset). They share
    prometheus_client's multiprocess files now, in a directory of the server's own that
    goes when it stops."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with _cfmaps_serve(tmp_path / "data", tmp_path / "server.log", workers=2,
                       TMPDIR=str(scratch)) as (server, base):
        wait_until(lambda: len(_children(server.pid)) == 2, timeout=30)
        assert len(list(scratch.glob("cfmaps-serve-*"))) == 1
        for _ in range(40):  # a connection each, so that both processes answer some
            assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        totals = [_requests_counted(httpx.get(f"{base}/metrics", timeout=10).text, "/healthz")
                  for _ in range(10)]
        assert totals == [40.0] * 10
    assert not list(scratch.glob("cfmaps-serve-*"))


def _ready_in_both_processes(server: subprocess.Popen[bytes], base: str, rf: Fitted,
                             log_path: Path) -> str:
    """Upload ``rf`` to a two-process ``cfmaps serve`` and wait until both processes serve
    it: the id. Built in one process; the other catches up on the first request it gets
    for the model. A new connection per request, so that both processes are asked (one
    kept-alive connection stays with one of them)."""
    wait_until(lambda: len(_children(server.pid)) == 2, timeout=30)
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post("/v1/models", files={"model": ("rf.skops", rf.skops)})
        assert r.status_code == 202, (r.text, log_path.read_text())
        model_id: str = r.json()["id"]
        assert _wait_http_ready(http, model_id)["status"] == "ready"
    wait_until(lambda: all(
        httpx.get(f"{base}/v1/models/{model_id}", timeout=10).json()["status"] == "ready"
        for _ in range(6)
    ), timeout=30)
    return model_id


def test_a_rate_limit_holds_across_the_processes_of_one_server(rf: Fitted, tmp_path: Path) -> None:
    """``cfmaps serve --workers 2`` with a limit of 10 answers a minute: each process kept
    buckets of its own, so a client whose requests the kernel spread over both got about
    20. The processes share the buckets' file now."""
    log_path = tmp_path / "server.log"
    with _cfmaps_serve(tmp_path / "data", log_path, workers=2,
                       CFMAPS_RATE_LIMIT_PER_MINUTE="10") as (server, base):
        model_id = _ready_in_both_processes(server, base, rf, log_path)
        url = f"{base}/v1/models/{model_id}/predict"
        t0 = time.monotonic()
        codes = [httpx.post(url, json={"instance": rf.X[0].tolist()}, timeout=30).status_code
                 for _ in range(24)]
        elapsed = time.monotonic() - t0
    assert set(codes) <= {200, 429}, codes
    # the minute's 10, and one more per 6 s the requests took (the bucket refills)
    assert 10 <= codes.count(200) <= 10 + int(elapsed / 6), (codes, elapsed)


def test_an_api_process_killed_under_load_leaves_the_other_answering(
    rf: Fitted, tmp_path: Path
) -> None:
    log_path = tmp_path / "server.log"
    with _cfmaps_serve(tmp_path / "data", log_path, workers=2,
                       CFMAPS_SYNC_INTERVAL_SECONDS="0.2") as (server, base):
        model_id = _ready_in_both_processes(server, base, rf, log_path)
        workers = _children(server.pid)
        assert len(workers) == 2
        url = f"{base}/v1/models/{model_id}/counterfactuals"
        body = {"instance": rf.X[0].tolist()}
        log: list[tuple[float, str]] = []
        # The load runs until both processes answer again (the last 20 answers 200), at
        # most 30 s: a fixed window raced the replacement's start-up on a busy machine.
        stop = time.monotonic() + 30.0
        settled_again = threading.Event()
        killed_at: list[float] = []

        def load() -> None:
            # one connection per request: the kernel hands new connections to a live worker
            while time.monotonic() < stop and not settled_again.is_set():
                try:
                    r = httpx.post(url, json=body, timeout=10)
                    status = str(r.status_code)
                    if r.status_code == 409 and "being loaded" in r.json()["message"]:
                        status = "409 loading"  # the replacement process, starting up
                    log.append((time.monotonic(), status))
                except httpx.TransportError as exc:
                    log.append((time.monotonic(), type(exc).__name__))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        os.kill(workers[0], signal.SIGKILL)
        killed_at.append(time.monotonic())

        def answering_again() -> bool:
            recent = [s for t, s in log[-20:] if t >= killed_at[0] + 1.0]
            return len(recent) == 20 and set(recent) == {"200"}

        while time.monotonic() < stop and not answering_again():
            time.sleep(0.1)
        settled_again.set()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        before = [s for t, s in log if t < killed_at[0]]
        after = [s for t, s in log if t >= killed_at[0]]
        assert before and set(before) == {"200"}
        # The master starts a replacement process, which takes connections at once and
        # answers 409 "being loaded" (with Retry-After) until its start-up load is done (a
        # second or two to load numba's cache and the maps, longer on a busy machine: a CI
        # run saw it past the second this test allowed); nothing else may fail but the
        # requests in flight to the killed process.
        failed = [s for s in after if s not in ("200", "409 loading")]
        assert not [s for s in after if s.startswith("5")]
        assert len(failed) <= len(threads), failed  # at most the requests in flight to it
        settled = [s for t, s in log if t >= killed_at[0] + 1.0]
        assert len(settled) >= 20 and set(settled) <= {"200", "409 loading"}, settled[:20]
        assert set(settled[-20:]) == {"200"}, settled[-20:]  # both processes answer again
        assert server.poll() is None  # the service itself is up


# -- an API process killed mid-build --------------------------------------------------------
def _descendants(pid: int) -> set[int]:
    """Every process under ``pid``: the forkserver and its build workers."""
    parent = {c: pp for c, (pp, _) in _processes().items()}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    try:  # a zombie has exited (nobody may reap an orphan in a container)
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _slow_forest() -> bytes:
    """A forest whose complete partition takes minutes: its build is surely still running
    when the test kills the API process."""
    import skops.io as sio
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 8))
    y = (X[:, :3].sum(axis=1) + rng.normal(0, 1.5, 4000) > 0).astype(int)
    return sio.dumps(RandomForestClassifier(60, max_depth=10, random_state=0).fit(X, y))


def test_a_build_orphaned_by_a_killed_api_process_stops_and_is_built_again(
    tmp_path: Path,
) -> None:
    data, log_path = tmp_path / "data", tmp_path / "server.log"
    # a budget this forest does not reach for minutes: only the orphan rule stops it
    with _cfmaps_serve(data, log_path, CFMAPS_BUILD_MAX_RECTANGLES="50000000",
                       CFMAPS_BUILD_MAX_SECONDS="600") as (server, base):
        r = httpx.post(f"{base}/v1/models", files={"model": ("slow.skops", _slow_forest())},
                       timeout=30)
        assert r.status_code == 202, r.text
        model_id = r.json()["id"]
        wait_until(lambda: httpx.get(f"{base}/v1/models/{model_id}", timeout=10)
                   .json()["progress"] > 0, timeout=60)
        tree = _descendants(server.pid)  # the forkserver and the build worker
        assert len(tree) >= 2, tree
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        # The worker's next progress report (every 0.2 s) finds the pipe broken and it
        # stops, long before the build would end; the forkserver goes with it. (With the
        # broken pipe ignored in the worker, this wait times out: checked.)
        wait_until(lambda: not any(_running(p) for p in tree), timeout=20)
    model_dir = data / "models" / model_id
    assert not (model_dir / "maps").exists(), "the orphan went on to save its maps"
    assert json.loads((model_dir / "status.json").read_text())["status"] == "building"
    # The next process takes the interrupted build up again from the stored model file
    # (with a small budget, so that it ends soon: the budget is the process's setting).
    with _cfmaps_serve(data, log_path, CFMAPS_BUILD_MAX_RECTANGLES="20000") as (_, base), \
            httpx.Client(base_url=base, timeout=30) as http:
        info = _wait_http_ready(http, model_id)
        assert info["status"] == "ready", (info, log_path.read_text()[-3000:])
        r = http.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": [0.0] * 8})
        assert r.status_code == 200 and r.json()["feasible"] is True, r.text


def test_a_server_stopped_during_its_warm_up_leaves_nothing_in_the_temp_dir(
    tmp_path: Path,
) -> None:
    """SIGTERM during the start-up warm-up (a new machine compiles for minutes): uvicorn
    shuts down and ends by the signal, so the warm-up's daemon thread never removed its
    scratch directory, and every such stop left one in the temp dir."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
           "serve", "--port", str(port), "--log-level", "warning"]
    log_path = tmp_path / "server.log"
    with log_path.open("ab") as log_file:
        # an empty numba cache: the warm-up compiles for minutes, so it is under way when
        # the signal comes
        env = {**os.environ, "CFMAPS_DATA_DIR": str(tmp_path / "data"), "TMPDIR": str(scratch),
               "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
        server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            def warming() -> bool:
                assert server.poll() is None, log_path.read_text()
                try:
                    up = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                except httpx.TransportError:
                    return False
                return up.status_code == 200 and any(scratch.glob("cfmaps-warmup-*"))

            wait_until(warming, timeout=120)
            assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 503
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(timeout=10)
    assert server.returncode == -signal.SIGTERM, log_path.read_text()
    assert list(scratch.glob("cfmaps-warmup-*")) == [], log_path.read_text()


def test_the_processes_of_a_multi_process_server_shut_down_on_sigterm(tmp_path: Path) -> None:
    """``cfmaps serve --workers 2``: each process replaced uvicorn's SIGTERM handler with
    its own (installed from the app factory, which uvicorn calls after installing its
    own), so the signal ended it at once: no request in flight finished and no shutdown
    ran (QA, session 65). Seen here in the metrics an operator's directory keeps: a
    process that shuts down takes its gauges out of the live sums, and a killed one's
    stayed."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    with _cfmaps_serve(tmp_path / "data", tmp_path / "server.log", workers=2,
                       PROMETHEUS_MULTIPROC_DIR=str(metrics_dir)) as (server, _):
        wait_until(lambda: len(_children(server.pid)) == 2, timeout=30)
        assert len(list(metrics_dir.glob("gauge_livesum_*.db"))) == 2
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert list(metrics_dir.glob("gauge_livesum_*.db")) == [], (tmp_path / "server.log").read_text()
    assert len(list(metrics_dir.glob("counter_*.db"))) == 2  # counts stay counted


@pytest.mark.parametrize("workers", [1, 2])
def test_a_server_stopped_by_sigterm_leaves_no_forkserver_directory(
    tmp_path: Path, rf: Fitted, workers: int
) -> None:
    """A build starts multiprocessing's forkserver, whose socket lives in a ``pymp-*``
    directory of the temp dir; uvicorn ends by the signal, so Python's exit handlers never
    removed it, and every stop of a service that had built a model left one (with
    ``--workers 2``, every stop of a worker process that had built one)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    log_path = tmp_path / "server.log"
    with _cfmaps_serve(tmp_path / "data", log_path, workers=workers, TMPDIR=str(scratch),
                       CFMAPS_WARM_UP="false") as (server, base):
        r = httpx.post(f"{base}/v1/models", files={"model": ("m.skops", rf.skops)})
        assert r.status_code == 202, r.text
        url = f"{base}/v1/models/{r.json()['id']}"
        wait_until(lambda: httpx.get(url).json()["status"] == "ready", timeout=300)
        assert list(scratch.glob("pymp-*")), "the build started no forkserver"
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    # (uvicorn's supervisor of several workers exits 0 once they have stopped)
    assert server.returncode == (-signal.SIGTERM if workers == 1 else 0), log_path.read_text()
    assert list(scratch.glob("pymp-*")) == [], log_path.read_text()


# -- a client that gives up on a long query ----------------------------------------------------
def _post_and_leave(base: str, url: str, body: bytes, content_type: str,
                    started: threading.Event) -> None:
    """POST ``body`` on a raw connection and close it once the search has ``started``."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST {url} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}"
                     f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        assert started.wait(30)


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_a_query_whose_client_went_away_stops(
    rf: Fitted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content_type: str
) -> None:
    # The lean path (plain application/json) and FastAPI's (any other JSON content type)
    # both watch for the disconnect. Maps with mixed regions (a 5-rectangle budget), so
    # that single queries search them in a worker thread too. The search is held until
    # the service has cancelled it, so the test knows the client left mid-search.
    import maps_core._clock
    import maps_core.query

    settings = Settings(data_dir=tmp_path / "data", build_max_rectangles=5)
    chunks: list[int] = []
    started, hold, cancelled = threading.Event(), threading.Event(), threading.Event()
    real_rows, real_search = maps_core.query._batch_rows, maps_core.query.best_first

    def held() -> None:
        if hold.is_set() and not started.is_set():
            started.set()
            deadline = time.monotonic() + 30  # the search's clock jumps once cancelled
            while maps_core._clock._now() != maps_core._clock.CANCELLED:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            cancelled.set()

    def rows(engine: Any, opts: Any, budget: Any, A: Any, *rest: Any) -> Any:
        chunks.append(A.shape[0])
        with maps_core._clock.watching(budget.cancel):
            held()
        return real_rows(engine, opts, budget, A, *rest)

    def search(*args: Any) -> Any:
        held()
        return real_search(*args)

    access = logging.getLogger("uvicorn.access")
    lines: list[str] = []
    catch = logging.Handler()
    catch.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    with serve_uvicorn(settings) as (base, _), httpx.Client(base_url=base, timeout=60) as http:
        access.addHandler(catch)
        level = access.level
        access.setLevel(logging.INFO)
        model_id = http.post("/v1/models", files={"model": ("rf.skops", rf.skops)}).json()["id"]
        info = _wait_http_ready(http, model_id)
        assert info["status"] == "ready" and info["stats"]["mixed_regions"] > 0, info
        monkeypatch.setattr(maps_core.query, "_batch_rows", rows)
        monkeypatch.setattr(maps_core.query, "best_first", search)
        monkeypatch.setattr(maps_core.query, "CANCEL_SECONDS", 0.0)  # the smallest chunks
        url = f"/v1/models/{model_id}/counterfactuals"
        batch = json.dumps({"instances": rf.X[:60].tolist()}).encode()
        single = json.dumps({"instance": rf.X[0].tolist()}).encode()
        headers = {"content-type": content_type}
        whole = http.post(url, content=batch, headers=headers)
        assert whole.status_code == 200, whole.text
        assert len(chunks) > 2 and sum(chunks) == 60  # answered in chunks
        one = http.post(url, content=single, headers=headers)
        assert one.status_code == 200, one.text
        for n, body in enumerate((batch, single), start=1):
            chunks.clear()
            started.clear()
            cancelled.clear()
            hold.set()
            _post_and_leave(base, url, body, content_type, started)
            # the client is gone: the service sets the event, the search under way stops,
            # no other chunk runs, and the request is counted as a 499
            assert cancelled.wait(30)
            wait_until(lambda n=n: f'status="499"}} {n}.0' in http.get("/metrics").text,
                       timeout=30)
            # and in the access log, which uvicorn does not write for an unsent answer
            assert sum(f'"POST {url} HTTP/1.1" 499' in line for line in lines) == n, lines
            assert len(chunks) == (1 if body is batch else 0)
            hold.clear()
        access.removeHandler(catch)
        access.setLevel(level)
        again = http.post(url, content=batch, headers=headers)
        assert again.status_code == 200
        assert ([(r["distance"], r["counterfactual"]) for r in again.json()["results"]]
                == [(r["distance"], r["counterfactual"]) for r in whole.json()["results"]])


def test_a_model_deleted_by_another_process_is_not_deleted_again(
    service_factory: Any, rf: Fitted, tmp_path: Path
) -> None:
    # Two processes over one data dir that both know the model: one DELETE removes it (204),
    # the other process's is a 404, as two DELETEs in one process are.
    data = tmp_path / "shared"
    with (service_factory(data_dir=data, sync_interval_seconds=600) as a,
          service_factory(data_dir=data, role="api", sync_interval_seconds=600) as b):
        model_id = a.add(rf.skops)
        assert b.client.get(f"/v1/models/{model_id}").json()["status"] == "ready"
        assert a.client.delete(f"/v1/models/{model_id}").status_code == 204
        r = b.client.delete(f"/v1/models/{model_id}")
        assert r.status_code == 404 and r.json()["error"] == "model_not_found", r.text
        assert b.client.get(f"/v1/models/{model_id}").status_code == 404
        assert list((data / "models").iterdir()) == []


# -- requests cut short by the shutdown's grace period ------------------------------------------
def test_a_request_the_shutdown_cuts_short_is_a_503_not_a_bare_500() -> None:
    """uvicorn cancels the requests still running when CFMAPS_SHUTDOWN_GRACE_SECONDS runs
    out and answered each with a text/plain 500 without request id (QA, operator round):
    a client read a bug where a retry elsewhere would do. Other cancellations go on."""
    import asyncio

    from app.errors import CatchAllMiddleware

    def app_cancelled(msg: str | None) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            raise asyncio.CancelledError(*(() if msg is None else (msg,)))
        return app

    async def call(app: Any) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/v1/models/x/counterfactuals",
                 "headers": [], "query_string": b""}
        await CatchAllMiddleware(app)(scope, receive, send)
        return sent

    sent = asyncio.run(call(app_cancelled("Task cancelled, timeout graceful shutdown exceeded")))
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"] == "unavailable"
    for other in (None, "Cancelled by cancel scope 7f"):
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(call(app_cancelled(other)))
