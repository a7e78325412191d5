"""Several processes over one data dir: what one does, every other sees within a second.

Each service below is a separate app (its own registry, build manager and sync thread)
over the same data dir, as ``cfmaps serve --workers N`` processes or containers sharing a
volume are; the build lock is a ``flock`` on a file, which two opens conflict on even in
one process, so these tests exercise the real exclusion.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from svc_helpers import Fitted, Service, upload, wait_until


def _status(svc: Service, model_id: str) -> Any:
    return svc.client.get(f"/v1/models/{model_id}").json().get("status")


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
        # visible on the other replica within a second, queued or building
        t0 = time.monotonic()
        wait_until(lambda: _status(api2, model_id) is not None, timeout=1.0)
        assert time.monotonic() - t0 < 1.0
        # built by the builder, then served by both replicas
        wait_until(lambda: _status(api1, model_id) == "ready" and _status(api2, model_id) == "ready")
        a = api1.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
        b = api2.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
        assert a.status_code == b.status_code == 200
        assert a.json()["distance"] == b.json()["distance"]
        # deleted through one replica: gone from the other within a second
        assert api2.client.delete(f"/v1/models/{model_id}").status_code == 204
        t0 = time.monotonic()
        wait_until(lambda: api1.client.get(f"/v1/models/{model_id}").status_code == 404, timeout=1.0)
        assert time.monotonic() - t0 < 1.0


def test_two_full_processes_build_each_model_once(
    service_factory: Callable[..., Any], rf: Fitted, gb3: Fitted, tmp_path: Any
) -> None:
    data = tmp_path / "shared"
    with (service_factory(data_dir=data, sync_interval_seconds=0.05) as a,
          service_factory(data_dir=data, sync_interval_seconds=0.05) as b):
        ids = [upload(c.client, m).json()["id"] for c, m in ((a, rf.skops), (b, gb3.skops))]
        for model_id in ids:
            wait_until(lambda m=model_id: _status(a, m) == "ready" and _status(b, m) == "ready")
        built = [a.app.state.metrics, b.app.state.metrics]
        ready = sum(
            s.value for m in built for metric in m.builds.collect() for s in metric.samples
            if s.name.endswith("_total") and s.labels.get("outcome") == "ready"
        )
        assert ready == 2  # one build per model, whichever process took its lock
        for model_id in ids:
            status = json.loads((data / "models" / model_id / "status.json").read_text())
            assert status["status"] == "ready" and status["progress"] == 1.0


def test_a_build_left_by_a_dead_process_is_taken_over(
    service_factory: Callable[..., Any], rf: Fitted, tmp_path: Any
) -> None:
    data = tmp_path / "shared"
    with service_factory(data_dir=data) as a:
        model_id = a.add(rf.skops)
    # as if a builder died mid-build: 'building' on disk, nobody holds the lock
    path = data / "models" / model_id / "status.json"
    status = json.loads(path.read_text())
    status.update(status="building", progress=0.4)
    path.write_text(json.dumps(status))
    with service_factory(data_dir=data, role="api", sync_interval_seconds=0.05) as api:
        assert _status(api, model_id) == "building"  # an API replica builds nothing
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
