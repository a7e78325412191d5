"""Health, readiness, metrics and the OpenAPI document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import LOCAL, Fitted, TestClient

from app.main import create_app
from app.metrics import MULTIPROC_ENV
from app.registry import Registry
from app.routes.models import STORAGE_REFUSED
from app.settings import Settings
from app.siblings import PROCESSES_ENV, SHARED_ENV, Siblings


def test_healthz(service: Any) -> None:
    r = service.client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_readyz_waits_for_the_startup_load(
    service_factory: Any, rf: Fitted, monkeypatch: pytest.MonkeyPatch
) -> None:
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        model_id = svc.add(rf.skops)

    release = threading.Event()
    real = Registry._load_entry

    def slow(self: Registry, entry: Any) -> None:
        assert release.wait(30)
        real(self, entry)

    monkeypatch.setattr(Registry, "_load_entry", slow)
    app = create_app(Settings(data_dir=data_dir))
    with TestClient(app, client=LOCAL) as c:
        assert c.get("/healthz").status_code == 200  # alive while loading
        r = c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["status"] == "loading" and r.headers["retry-after"] == "1"
        info = c.get(f"/v1/models/{model_id}").json()
        assert info["status"] == "loading"
        r = c.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
        assert r.status_code == 409 and "being loaded" in r.json()["message"]
        release.set()
        for _ in range(3000):
            if c.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.01)
        assert c.get("/readyz").json()["models"]["ready"] == 1
        r = c.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
        assert r.status_code == 200


def test_a_process_of_a_multi_process_server_is_ready_once_all_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cfmaps serve --workers 2``: a probe reaches one process, and each was ready for
    itself, so the first to load put the server in service while the other answered
    409 ``loading``. Each is ready now once both have loaded, live ones only."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv(SHARED_ENV, str(run))
    monkeypatch.setenv(PROCESSES_ENV, "2")
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        app = create_app(Settings(data_dir=tmp_path / "data"))
        with TestClient(app, client=LOCAL) as c:
            mine = run / "ready" / str(os.getpid())
            for _ in range(3000):  # this process's start-up load
                if mine.exists():
                    break
                threading.Event().wait(0.01)
            assert mine.exists()
            r = c.get("/readyz")
            assert (r.status_code, r.json()["status"]) == (503, "loading")
            assert c.get("/v2/health/ready").json() == {"ready": False}
            (run / "ready" / str(sibling.pid)).touch()  # the other process has loaded
            assert c.get("/readyz").status_code == 200
            assert c.get("/v2/health/ready").json() == {"ready": True}
            sibling.kill()  # uvicorn starts another, not loaded yet
            sibling.wait()
            assert c.get("/readyz").status_code == 503
            assert not (run / "ready" / str(sibling.pid)).exists()  # its pid may come back
        assert not mine.exists()  # gone with the process's shutdown
    finally:
        sibling.kill()
        sibling.wait()
    # without the variables (one process), ready for itself, as before
    assert Siblings.from_env() is not None
    monkeypatch.delenv(PROCESSES_ENV)
    assert Siblings.from_env() is None


def test_metrics(rf_service: Any, rf: Fitted) -> None:
    svc, model_id = rf_service
    c = svc.client
    for _ in range(3):
        c.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
    c.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": [1]})
    c.get("/no/such/path")
    # answered before the body is read (415, 413), still counted under their route
    c.post(f"/v1/models/{model_id}/counterfactuals", content=b"{}",
           headers={"content-type": "application/json", "content-encoding": "gzip"})
    c.post(f"/v1/models/{model_id}/counterfactuals",
           content=b" " * (svc.settings.max_body_bytes + 1),
           headers={"content-type": "application/json"})
    # HEAD probes count under their route, as their GET (they were "<unmatched>")
    assert c.head("/readyz").status_code == 200
    assert c.head(f"/v1/models/{model_id}").status_code == 200
    r = c.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    route = "/v1/models/{model_id}/counterfactuals"
    assert f'cfmaps_http_requests_total{{method="POST",route="{route}",status="200"}} 3.0' in text
    assert f'cfmaps_http_requests_total{{method="POST",route="{route}",status="422"}} 1.0' in text
    assert 'route="<unmatched>",status="404"' in text
    for status in (413, 415):
        assert (f'cfmaps_http_requests_total{{method="POST",route="{route}",'
                f'status="{status}"}} 1.0') in text
    assert 'cfmaps_http_requests_total{method="HEAD",route="/readyz",status="200"} 1.0' in text
    assert ('cfmaps_http_requests_total{method="HEAD",route="/v1/models/{model_id}",'
            'status="200"} 1.0') in text
    assert model_id not in text  # ids never become labels
    assert (
        f'cfmaps_http_request_duration_seconds_count{{method="POST",route="{route}"}} 6.0' in text
    )
    assert 'cfmaps_builds_total{outcome="ready"} 1.0' in text
    assert "cfmaps_builds_running 0.0" in text
    assert 'cfmaps_models{status="ready"} 1.0' in text
    assert "cfmaps_counterfactuals_total 3.0" in text
    assert "cfmaps_build_duration_seconds_count 1.0" in text


def test_two_apps_in_one_process_have_separate_metrics(tmp_path: Any) -> None:
    a = create_app(Settings(data_dir=tmp_path / "a"))
    b = create_app(Settings(data_dir=tmp_path / "b"))
    with TestClient(a, client=LOCAL) as ca, TestClient(b, client=LOCAL) as cb:
        ca.get("/healthz")
        ca.get("/healthz")
        cb.get("/healthz")
        line = 'cfmaps_http_requests_total{method="GET",route="/healthz",status="200"}'
        assert f"{line} 2.0" in ca.get("/metrics").text
        assert f"{line} 1.0" in cb.get("/metrics").text


def test_a_killed_process_leaves_the_live_gauges_of_shared_metrics(tmp_path: Path) -> None:
    """``cfmaps serve --workers N`` shares the processes' metrics in files; a process
    killed mid-build (uvicorn starts another) never takes its running build out of
    ``cfmaps_builds_running``, so the next process to start does, for every process that
    is gone. Its counters stay counted. Subprocesses: prometheus_client chooses its value
    store when imported, by the environment."""
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path)}
    killed = ("import os; from app.metrics import Metrics; m = Metrics(); "
              "m.builds_running.inc(); m.builds.labels('ready').inc(); os._exit(0)")
    scrape = "import sys; from app.metrics import Metrics; sys.stdout.write(Metrics().render().decode())"
    subprocess.run([sys.executable, "-c", killed], env=env, check=True)
    assert any(p.name.startswith("gauge_livesum_") for p in tmp_path.iterdir())
    text = subprocess.run([sys.executable, "-c", scrape], env=env, check=True,
                          capture_output=True, text=True).stdout
    assert "cfmaps_builds_running 0.0" in text.splitlines(), text
    assert 'cfmaps_builds_total{outcome="ready"} 1.0' in text.splitlines(), text


def test_openapi_documents_the_routes(service: Any) -> None:
    doc = service.client.get("/openapi.json").json()
    paths = doc["paths"]
    for path, method in [
        ("/v1/models", "post"),
        ("/v1/models", "get"),
        ("/v1/models/{model_id}", "get"),
        ("/v1/models/{model_id}", "delete"),
        ("/v1/models/{model_id}/counterfactuals", "post"),
        ("/v1/models/{model_id}/predict", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ]:
        assert method in paths[path], (path, method)
    cf = paths["/v1/models/{model_id}/counterfactuals"]["post"]
    assert {"404", "409", "413", "422"} <= set(cf["responses"])
    assert "CounterfactualRequest" in doc["components"]["schemas"]
    # what the routes cannot declare (were missing: no token scheme, FastAPI's own 422
    # shape, no Retry-After, /metrics as JSON)
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    # this service has no tokens: management from loopback, queries open
    assert paths["/v1/models"]["post"]["security"] == [{}, {"bearer": []}]
    assert cf["security"] == [{}, {"bearer": []}]
    assert "security" not in paths["/healthz"]["get"]
    text = json.dumps(doc)
    assert "HTTPValidationError" not in text
    for path, item in paths.items():
        for method, op in item.items():
            for code, resp in op["responses"].items():
                if code == "422":
                    schema = resp["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, method)
                if resp.get("description") == STORAGE_REFUSED:  # waiting does not mend it
                    assert "Retry-After" not in resp.get("headers", {}), (path, method)
                elif code in ("409", "429", "503"):  # 409: the model not ready yet
                    assert "Retry-After" in resp["headers"], (path, method, code)
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


def test_a_failed_warm_up_does_not_keep_the_service_from_ready(
    service_factory: Any, rf: Fitted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up warm-up only saves the first query its compile time: when it fails,
    the service still loads its models, reports ready and answers."""
    import app.main

    def broken() -> float:
        raise OSError("no writable temporary directory")

    with service_factory() as svc:
        mid = svc.add(rf.skops)
    monkeypatch.setattr(app.main, "warm_up", broken)
    with service_factory() as svc:  # same data dir: the model is loaded at start
        assert svc.client.get("/readyz").status_code == 200
        r = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                            json={"instance": rf.X[0].tolist()})
        assert r.status_code == 200, r.text


def test_readiness_waits_for_the_warm_up_even_with_no_models(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README promises the warm-up compiles the query kernels before /readyz turns 200;
    with an empty data dir it was 200 at once (146 s before the warm-up ended on a new
    machine), so a load balancer sent the first queries to a process still compiling."""
    import app.main

    started, release = threading.Event(), threading.Event()

    def slow() -> float:
        started.set()
        release.wait(60)
        return 0.0

    monkeypatch.setattr(app.main, "warm_up", slow)
    application = create_app(Settings(data_dir=tmp_path / "data"))
    with TestClient(application) as c:
        assert started.wait(30)
        for path in ("/readyz", "/v2/health/ready"):
            r = c.get(path)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1", path
        release.set()
        deadline = time.monotonic() + 30
        while c.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.get("/readyz").status_code == 200


def test_head_is_the_get_without_its_body(rf_service: Any) -> None:
    """HEAD on the probes, /metrics and the model routes was a 405 (load balancers and
    uptime monitors probe with HEAD)."""
    svc, model_id = rf_service
    c = svc.client
    for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/metrics",
                 "/v1/models", f"/v1/models/{model_id}", "/v1/models/nope", "/openapi.json",
                 "/ui"):
        got, head = c.get(path), c.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if path != "/metrics":  # its counters move between the two requests
            assert head.headers["content-length"] == got.headers["content-length"], path
        assert head.headers["x-request-id"], path
    # a path without GET: 405 naming its methods, as a GET is told
    r = c.head(f"/v1/models/{model_id}/counterfactuals")
    assert r.status_code == 405 and "POST" in r.headers["allow"] and r.content == b""


def test_openapi_requires_the_tokens_this_service_requires(service_factory: Any) -> None:
    with service_factory(admin_token="adm", api_tokens=["q"]) as svc:
        paths = svc.client.get("/openapi.json").json()["paths"]
    assert paths["/v1/models"]["post"]["security"] == [{"bearer": []}]
    assert paths["/v1/models/{model_id}"]["delete"]["security"] == [{"bearer": []}]
    assert paths["/v1/models/{model_id}/counterfactuals"]["post"]["security"] == [{"bearer": []}]
    with service_factory(admin_token="adm") as svc:
        paths = svc.client.get("/openapi.json").json()["paths"]
    assert paths["/v1/models"]["post"]["security"] == [{"bearer": []}]
    assert paths["/v1/models/{model_id}/predict"]["post"]["security"] == [{}, {"bearer": []}]


def test_the_image_runs_under_an_init_with_a_group_writable_cache() -> None:
    """What scripts/container-smoke.sh checks in a real container, read off the Dockerfile
    (no engine needed): tini is PID 1 (it reaps the processes a dead worker leaves, which
    uvicorn's supervisor as PID 1 never waits for) and runs the service's command; the JIT
    cache, the data and the home are group 0's as much as the owner's, so the service runs
    as any UID in group 0 (OpenShift) on the prebuilt kernels."""
    text = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.replace("\\\n", " ").splitlines()]
    directives = [ln.split(None, 1) for ln in lines if ln and not ln.startswith("#")]
    entrypoint = [json.loads(arg) for d, arg in directives if d == "ENTRYPOINT"]
    cmd = [json.loads(arg) for d, arg in directives if d == "CMD"]
    assert entrypoint == [["/usr/bin/tini", "--"]]
    assert cmd[-1][:2] == ["cfmaps", "serve"]
    run = " ".join(arg for d, arg in directives if d == "RUN")
    assert "apt-get install -y --no-install-recommends tini" in run
    assert "chmod -R g=u /data /var/cache/cfmaps /home/cfmaps" in run
    assert "--gid 0" in run
