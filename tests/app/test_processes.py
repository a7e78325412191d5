"""Several processes over one data dir: what one does, every other sees within a second.

Each service below is a separate app (its own registry, build manager and sync thread)
over the same data dir, as ``cfmaps serve --workers N`` processes or containers sharing a
volume are; the build lock is a ``flock`` on a file, which two opens conflict on even in
one process, so these tests exercise the real exclusion.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import Fitted, Service, upload, wait_until

from app import modelio
from app.registry import BuildLock, ModelEntry, Registry
from app.schemas import parse_spec
from app.settings import Settings


def _status(svc: Service, model_id: str) -> Any:
    return svc.client.get(f"/v1/models/{model_id}").json().get("status")


def _builds(svc: Service, outcome: str) -> float:
    """How many builds with ``outcome`` this process ran (its metrics counter)."""
    return sum(
        s.value for metric in svc.app.state.metrics.builds.collect() for s in metric.samples
        if s.name.endswith("_total") and s.labels.get("outcome") == outcome
    )


def test_an_upload_to_an_api_replica_is_built_by_the_builder_and_served_by_all(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    data = tmp_path / "shared"
    x = rf.X[0].tolist()
    with (service_factory(data_dir=data, role="api", sync_interval_seconds=0.1) as api1,
          service_factory(data_dir=data, role="api", sync_interval_seconds=0.1) as api2,
          service_factory(data_dir=data, role="builder", sync_interval_seconds=0.1) as builder):
        # the builder serves probes only
        assert builder.client.get("/v1/models").status_code == 404
        assert builder.client.get("/readyz").status_code == 200
        r = upload(api1.client, rf.skops)
        assert r.status_code == 202
        model_id = r.json()["id"]
        # visible on the other replica at once: it catches up within the request itself
        # (Registry.catch_up), so no sync pass and no clock is involved
        assert _status(api2, model_id) in ("queued", "building", "ready")
        # built by the builder, then served by both replicas
        wait_until(lambda: _status(api1, model_id) == "ready" and _status(api2, model_id) == "ready")
        a = api1.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
        b = api2.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
        assert a.status_code == b.status_code == 200
        assert a.json()["distance"] == b.json()["distance"]
        # deleted through one replica: gone from the other at once (caught up likewise)
        assert api2.client.delete(f"/v1/models/{model_id}").status_code == 204
        assert api1.client.get(f"/v1/models/{model_id}").status_code == 404


def test_a_status_is_on_disk_before_its_process_answers_with_it(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any, monkeypatch: Any
) -> None:
    # The routes read entries without the registry's lock. A build that set ``ready`` in
    # memory and then wrote status.json let a client hear ``ready`` from this process and
    # get a 409 from another that read the file in between (seen once, under load, in
    # the test below). Each write of status.json must find memory still at the old status.
    from app import registry as registry_module

    apps: list[Any] = []
    seen: list[tuple[str, str]] = []
    write = registry_module.write_json_atomic

    def spy(path: Path, data: Any) -> None:
        if path.name == "status.json" and apps:
            entry = apps[0].state.registry._entries.get(data["id"])
            if entry is not None:
                seen.append((data["status"], entry.status))
        write(path, data)

    monkeypatch.setattr(registry_module, "write_json_atomic", spy)
    with service_factory(data_dir=tmp_path / "d") as svc:
        apps.append(svc.app)
        model_id = upload(svc.client, rf.skops).json()["id"]
        wait_until(lambda: _status(svc, model_id) == "ready")
    assert ("ready", "building") in seen, seen
    assert ("ready", "ready") not in seen, seen


def test_what_one_process_did_answers_at_once_on_another(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    # Sync passes an hour apart: the second process sees the model only by catching up on
    # the request, as a client does that uploads through one worker and queries another.
    data = tmp_path / "shared"
    x = rf.X[0].tolist()
    hour = {"sync_interval_seconds": 3600.0}
    with (service_factory(data_dir=data, **hour) as a,
          service_factory(data_dir=data, role="api", **hour) as b):
        r = upload(a.client, rf.skops)
        model_id = r.json()["id"]
        # unknown to b a moment ago, queued or building now (not a 404)
        assert _status(b, model_id) in ("queued", "building", "ready")
        wait_until(lambda: _status(a, model_id) == "ready")
        # a says ready: b answers a query right away (not a 409), same answer as a
        qa = a.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
        qb = b.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
        assert qa.status_code == qb.status_code == 200, qb.text
        assert qa.json()["distance"] == qb.json()["distance"]
        assert b.client.get(f"/v2/models/{model_id}/ready").status_code == 200
        # a second model, uploaded through a and deleted through b before b ever saw it
        other = upload(a.client, rf.skops).json()["id"]
        assert b.client.delete(f"/v1/models/{other}").status_code == 204
        assert not (data / "models" / other).exists()
        # a deleted model stays deleted for the process that deleted it
        assert b.client.get(f"/v1/models/{other}").status_code == 404


def test_a_model_building_elsewhere_and_deleted_there_is_gone_here_at_once(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    """b knows the model as building (a builds it); deleted through a, b answers 404 at
    once, not the 409 "being built" of its last sync pass."""
    import functools

    import build_faults

    data = tmp_path / "shared"
    hour = {"sync_interval_seconds": 3600.0}
    with (service_factory(data_dir=data, **hour) as a,
          service_factory(data_dir=data, role="api", **hour) as b):
        a.app.state.builds.worker = functools.partial(build_faults.hold, str(tmp_path / "never"))
        model_id = upload(a.client, rf.skops).json()["id"]
        wait_until(lambda: _status(b, model_id) == "building")
        assert a.client.delete(f"/v1/models/{model_id}").status_code == 204
        r = b.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
        assert r.status_code == 404, r.text
        assert b.client.get(f"/v1/models/{model_id}").status_code == 404


def test_a_ready_model_deleted_elsewhere_is_gone_here_at_once(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    """b serves the model ready; deleted through a (204), b answered it ready and its
    queries 200 until its next sync pass (QA, session 61: with two workers, 15 of 30
    GETs right after a DELETE). Now 404 at once, and a second DELETE there is a 404."""
    data = tmp_path / "shared"
    hour = {"sync_interval_seconds": 3600.0}
    x = rf.X[0].tolist()
    with (service_factory(data_dir=data, **hour) as a,
          service_factory(data_dir=data, role="api", **hour) as b):
        model_id = a.add(rf.skops)
        url = f"/v1/models/{model_id}/counterfactuals"
        assert b.client.post(url, json={"instance": x}).status_code == 200
        assert a.client.delete(f"/v1/models/{model_id}").status_code == 204
        assert b.client.get(f"/v1/models/{model_id}").status_code == 404
        assert b.client.post(url, json={"instance": x}).status_code == 404
        assert model_id not in {m["id"] for m in b.client.get("/v1/models").json()["models"]}
        assert b.client.delete(f"/v1/models/{model_id}").status_code == 404


class _Watched:
    """A registry's lock that checks, at every release, that no entry is ready without
    its maps (what a request would see in between)."""

    def __init__(self, registry: Registry) -> None:
        self.registry, self.lock, self.seen = registry, registry._lock, []

    def __enter__(self) -> _Watched:
        self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self, *args: Any, **kw: Any) -> bool:
        return self.lock.acquire(*args, **kw)

    def release(self) -> None:
        self.seen += [(e.id, e.status) for e in self.registry._entries.values()
                      if e.maps is None]
        self.lock.release()


@pytest.mark.parametrize("known", [False, True], ids=["unknown-here", "known-building"])
def test_a_model_another_process_built_is_never_ready_here_without_its_maps(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Path, known: bool
) -> None:
    # ``cfmaps serve --workers 2``: the process that did not build a model published it
    # as ready before loading its maps, and a request in between got 409 "not ready:
    # ready" instead of waiting for the load (kill-under-load test, a rare flake). Both
    # ways it learns of the model: unknown until then, or seen while it was building.
    data = tmp_path / "shared"
    other = Registry(Settings(data_dir=data))
    other.open()
    with service_factory(data_dir=data) as svc:
        model_id = svc.add(rf.skops)
    if known:
        status = data / "models" / model_id / "status.json"
        ready = status.read_text()
        building = json.loads(ready) | {"status": "building"}
        # the builder holds the build lock while it builds (else the model is shown queued)
        builder = BuildLock.acquire(data / "models" / model_id / ".build.lock")
        assert builder is not None
        for text in (json.dumps(building), ready):  # new files, as every write here is
            tmp = status.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, status)
            if text != ready:
                other.catch_up(model_id)
                assert other.get(model_id).status == "building"
        builder.release()
    watch = _Watched(other)
    other._lock = watch  # type: ignore[assignment]
    other.catch_up(model_id)
    assert other.get_ready(model_id).maps is not None
    assert (model_id, "loading") in watch.seen
    assert (model_id, "ready") not in watch.seen, watch.seen
    other.close()


def test_a_sync_pass_between_upload_and_submit_does_not_queue_the_build_twice(
    rf: Fitted, tmp_path: Path
) -> None:
    # The upload route registers the model, then submits its build after an ``await``: a
    # sync pass in between took the model for an orphan and queued a second build, which
    # rewrote ``building`` over ``ready`` on disk (CI flake of the damaged-maps test).
    registry = Registry(Settings(data_dir=tmp_path / "data"))
    registry.open()
    requeued: list[ModelEntry] = []
    registry.on_requeue = requeued.append
    entry = registry.register(io.BytesIO(rf.skops), parse_spec(None), "rf.skops")
    registry.sync()
    assert requeued == [] and entry.building_here
    # a model nobody builds (its uploader died before submitting) is still adopted
    entry.building_here = False
    registry.sync()
    assert requeued == [entry] and entry.building_here


def test_a_process_starting_during_an_upload_elsewhere_leaves_the_upload_alone(
    rf: Fitted, tmp_path: Path, monkeypatch: Any
) -> None:
    # ``cfmaps serve --workers 2``: one worker takes an upload while the other starts and
    # clears what interrupted uploads left. It removed the upload in progress, which then
    # answered 500 (found by the kill-under-load test).
    settings = Settings(data_dir=tmp_path / "data")
    uploading = Registry(settings)
    uploading.open()
    checking, go = threading.Event(), threading.Event()
    real_load = modelio.load_model_file

    def slow_load(*args: Any, **kw: Any) -> Any:
        checking.set()
        assert go.wait(30)
        return real_load(*args, **kw)

    monkeypatch.setattr(modelio, "load_model_file", slow_load)
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(
        uploading.register(io.BytesIO(rf.skops), parse_spec(None), "rf.skops")))
    # what a process that died mid-upload leaves: a directory and a lock file nobody holds
    stale = settings.models_dir / ".tmp-deadbeef"
    (stale / "upload").parent.mkdir(parents=True)
    (stale / "upload").write_bytes(b"partial")
    stale_lock = settings.models_dir / ".tmp-0ddba11.lock"
    stale_lock.touch()
    t.start()
    assert checking.wait(30)
    Registry(settings).open()  # another process starts now
    go.set()
    t.join(30)
    assert len(done) == 1, "the upload failed"
    model_id = done[0].id
    assert (settings.models_dir / model_id / "status.json").is_file()
    assert not stale.exists() and not stale_lock.exists()
    assert sorted(p.name for p in settings.models_dir.iterdir()) == [model_id]


def test_two_full_processes_build_each_model_once(
    service_factory: Callable[..., Any], rf: Fitted, gb3: Fitted, tmp_path: Any
) -> None:
    data = tmp_path / "shared"
    with (service_factory(data_dir=data, sync_interval_seconds=0.05) as a,
          service_factory(data_dir=data, sync_interval_seconds=0.05) as b):
        ids = [upload(c.client, m).json()["id"] for c, m in ((a, rf.skops), (b, gb3.skops))]
        for model_id in ids:
            wait_until(lambda m=model_id: _status(a, m) == "ready" and _status(b, m) == "ready")
        # one build per model, whichever process took its lock
        assert _builds(a, "ready") + _builds(b, "ready") == 2
        for model_id in ids:
            status = json.loads((data / "models" / model_id / "status.json").read_text())
            assert status["status"] == "ready" and status["progress"] == 1.0


def test_a_build_queued_behind_another_is_left_to_its_process(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # Process a queues a build behind another one. Its build lock used to be taken only
    # when a build thread got to the model, so process b's sync took the model for an
    # orphan, queued it too and built it, or (its own build slot busy) left its status
    # alone until its queue reached it: with CFMAPS_WORKERS=2, a model reported ready by
    # one worker answered 409 "queued" on the other 53-95 times over 25-33 s (QA,
    # session 54). a now holds the lock from the moment it queues the build.
    data = tmp_path / "shared"
    fast = {"sync_interval_seconds": 0.05}
    queued_by: list[int] = []  # the registries that queued the model's build
    real_queue = Registry._queue_again

    def queue_again(self: Registry, entry: ModelEntry) -> None:
        queued_by.append(id(self))
        real_queue(self, entry)

    monkeypatch.setattr(Registry, "_queue_again", queue_again)
    with service_factory(data_dir=data, **fast) as a:
        busy, go = threading.Event(), threading.Event()

        def other_build() -> None:
            busy.set()
            assert go.wait(60)

        a.app.state.builds._executor.submit(other_build)  # one build worker: a waits
        assert busy.wait(30)
        model_id = upload(a.client, rf.skops).json()["id"]
        with service_factory(data_dir=data, **fast) as b:
            wait_until(lambda: _status(b, model_id) == "queued")
            time.sleep(0.5)  # ten sync passes of b
            # b never queued it (a sync pass marks it claimed for the moment it probes
            # the lock, so the flag itself may read True at any time)
            assert id(b.app.state.registry) not in queued_by
            assert _status(b, model_id) == "queued"
            go.set()
            a.app.state.builds.wait(60)
            assert _status(a, model_id) == "ready"
            wait_until(lambda: _status(b, model_id) == "ready", timeout=5)
            assert _builds(a, "ready") == 1 and _builds(b, "ready") == 0
            x = rf.X[0].tolist()
            qb = b.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
            assert qb.status_code == 200, qb.text


def _built_then_marked_building(service_factory: Callable[..., Any], rf: Fitted,
                                 data: Path) -> tuple[str, Path]:
    """A model built in ``data``, then its status set back to ``building`` at 0.4, as a
    builder that died mid-build left it. Returns its id and its directory."""
    with service_factory(data_dir=data) as a:
        model_id = a.add(rf.skops)
    model_dir = data / "models" / model_id
    path = model_dir / "status.json"
    status = json.loads(path.read_text())
    status.update(status="building", progress=0.4)
    path.write_text(json.dumps(status))
    return model_id, model_dir


def test_a_build_left_by_a_dead_process_is_taken_over(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    data = tmp_path / "shared"
    # as if a builder died mid-build, in its save: 'building' on disk, nobody holds the
    # lock, the save's temporary directory (and one of the maps it replaced) left behind
    model_id, model_dir = _built_then_marked_building(service_factory, rf, data)
    for left in (".maps.tmp-dead1234", ".maps.old-0123abcd"):
        (model_dir / left).mkdir()
        (model_dir / left / "partition.lo.npy").write_bytes(b"\0" * 4096)
    with service_factory(data_dir=data, role="api", sync_interval_seconds=0.05) as api:
        # an API replica builds nothing; it shows the build waiting for a builder
        assert _status(api, model_id) == "queued"
        assert (model_dir / ".maps.tmp-dead1234").exists()  # nor cleans a builder's files
        with service_factory(data_dir=data, role="builder", sync_interval_seconds=0.05):
            wait_until(lambda: _status(api, model_id) == "ready")
    # the builder that took the build over removed what the dead one left
    assert sorted(p.name for p in model_dir.iterdir() if p.name.startswith(".maps")) == []


def test_an_api_replica_tells_a_dead_builders_build_from_a_running_one(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    """A builder killed mid-build (no stop to write it back queued) left "building" and its
    progress on disk, which an API replica reported as a running build until a builder took
    it over: forever, with none running."""
    data = tmp_path / "shared"
    model_id, model_dir = _built_then_marked_building(service_factory, rf, data)
    path = model_dir / "status.json"
    builder = BuildLock.acquire(model_dir / ".build.lock")  # a live builder's lock
    assert builder is not None
    with service_factory(data_dir=data, role="api", sync_interval_seconds=0.05) as api:
        time.sleep(0.3)  # several sync passes: the lock is held, the build is running
        info = api.client.get(f"/v1/models/{model_id}").json()
        assert (info["status"], info["progress"]) == ("building", 0.4)
        builder.release()  # the builder dies: the OS drops its lock
        wait_until(lambda: _status(api, model_id) == "queued", timeout=5)
        info = api.client.get(f"/v1/models/{model_id}").json()
        assert (info["status"], info["progress"], info["error"]) == ("queued", 0.0, None)
        # memory only: the files are left for the builder that takes the build over
        assert json.loads(path.read_text())["status"] == "building"
        with service_factory(data_dir=data, role="builder", sync_interval_seconds=0.05):
            wait_until(lambda: _status(api, model_id) == "ready")


def test_outdated_maps_wait_on_an_api_replica_until_the_builder_rebuilds_them(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    data = tmp_path / "shared"
    with service_factory(data_dir=data) as a:
        model_id = a.add(rf.skops)
    manifest = data / "models" / model_id / "maps" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["format_version"] = 1
    manifest.write_text(json.dumps(doc))
    with service_factory(data_dir=data, role="api", sync_interval_seconds=0.05) as api:
        info = api.client.get(f"/v1/models/{model_id}").json()
        assert info["status"] == "queued" and info["error"] is None  # waiting, not failed
        with service_factory(data_dir=data, role="builder", sync_interval_seconds=0.05):
            # the builder's start finds the outdated maps, rebuilds them; the replica loads them
            wait_until(lambda: _status(api, model_id) == "ready")
        r = api.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
        assert r.status_code == 200


def test_a_builder_documents_what_it_serves(service_factory: Callable[..., Any], tmp_path: Any) -> None:
    """A builder serves the probes and metrics alone; its OpenAPI document was a 500 (the
    limits were written into request schemas it does not have)."""
    with service_factory(data_dir=tmp_path / "b", role="builder") as builder:
        r = builder.client.get("/openapi.json")
        assert r.status_code == 200, r.text
        paths = set(r.json()["paths"])
        assert "/healthz" in paths and "/readyz" in paths
        assert not [p for p in paths if p.startswith("/v1/")]
        assert builder.client.get("/docs").status_code == 200
