"""Builds run in worker processes: whatever a build does, the API process stays up.

The workers here misbehave inside the real child process (:mod:`build_faults`), so what
is checked is the real path: the child's own error reports, its exit status, the
parent's handling of both.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import build_faults
import pytest
from svc_helpers import Fitted, Service, upload, wait_built, wait_until


def _query_ok(svc: Service, model_id: str, rf: Fitted) -> None:
    r = svc.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()})
    assert r.status_code == 200, r.text
    assert r.json()["feasible"] is True


def test_a_build_runs_in_its_own_process_and_queries_go_on(
    rf_service: tuple[Service, str], rf: Fitted, tmp_path: Path
) -> None:
    svc, ready_id = rf_service
    gate = tmp_path / "gate"
    builds = svc.app.state.builds
    builds.worker = functools.partial(build_faults.hold, str(gate))
    model_id = upload(svc.client, rf.skops).json()["id"]
    wait_until(lambda: model_id in builds.worker_pids(), timeout=60)
    pid = builds.worker_pids()[model_id]
    assert pid != os.getpid()
    wait_until(lambda: svc.client.get(f"/v1/models/{model_id}").json()["progress"] > 0, timeout=60)
    for _ in range(3):  # the API answers while the worker holds its build
        _query_ok(svc, ready_id, rf)
    gate.touch()
    assert wait_built(svc.client, model_id)["status"] == "ready"
    _query_ok(svc, model_id, rf)
    assert builds.worker_pids() == {}


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="Linux only")
def test_a_build_worker_is_the_oom_killers_first_choice(
    service: Service, rf: Fitted, tmp_path: Path
) -> None:
    """In a container at its memory limit the OOM killer chose the API processes (larger
    than the growing build) again and again; the build worker offers itself first."""
    gate = str(tmp_path / "gate")
    builds = service.app.state.builds
    builds.worker = functools.partial(build_faults.hold_in_save, gate, "start")
    model_id = upload(service.client, rf.skops).json()["id"]
    wait_until(lambda: Path(gate + ".reached").exists(), timeout=120)  # built, not saved
    pid = builds.worker_pids()[model_id]
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # not the service
    Path(gate).touch()
    assert wait_built(service.client, model_id)["status"] == "ready"


def test_cancelling_a_build_kills_its_worker(service: Service, rf: Fitted, tmp_path: Path) -> None:
    builds = service.app.state.builds
    builds.worker = functools.partial(build_faults.hold, str(tmp_path / "never"))
    model_id = upload(service.client, rf.skops).json()["id"]
    wait_until(lambda: service.client.get(f"/v1/models/{model_id}").json()["progress"] > 0, timeout=60)
    pid = builds.worker_pids()[model_id]
    t0 = time.monotonic()
    assert service.client.delete(f"/v1/models/{model_id}").status_code == 204
    assert time.monotonic() - t0 < 10  # not the worker's 120 s hold
    # the delete returned after the worker was killed and reaped: no such process left
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
    assert not (service.settings.models_dir / model_id).exists()
    builds.wait(timeout=30)
    assert 'cfmaps_builds_total{outcome="cancelled"} 1.0' in service.client.get("/metrics").text


def test_a_worker_that_keeps_dying_fails_the_model_not_the_service(
    rf_service: tuple[Service, str], rf: Fitted
) -> None:
    svc, ready_id = rf_service
    svc.app.state.builds.worker = build_faults.die
    info = wait_built(svc.client, upload(svc.client, rf.skops).json()["id"])
    assert info["status"] == "failed"
    assert "died 3 times" in info["error"] and "SIGKILL" in info["error"], info["error"]
    _query_ok(svc, ready_id, rf)
    maps_parent = svc.settings.models_dir / info["id"]
    assert not (maps_parent / "maps").exists()
    assert [p.name for p in maps_parent.iterdir() if p.name.startswith(".maps")] == []


def test_a_build_out_of_memory_fails_with_the_reason(service_factory, rf: Fitted) -> None:
    with service_factory(build_max_memory="256M") as svc:
        svc.app.state.builds.worker = build_faults.hog_memory
        info = wait_built(svc.client, upload(svc.client, rf.skops).json()["id"])
        assert info["status"] == "failed"
        assert info["error"].startswith("out of memory"), info["error"]
        assert str(256 << 20) in info["error"]
        assert svc.client.get("/readyz").status_code == 200


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


def test_stopping_the_service_kills_running_workers_at_once(
    service: Service, rf: Fitted, tmp_path: Path
) -> None:
    """uvicorn re-raises the stopping signal right after the lifespan ends: shutdown()
    must kill the workers itself, or they keep building after the service is gone."""
    builds = service.app.state.builds
    builds.worker = functools.partial(build_faults.hold, str(tmp_path / "never"))
    model_id = upload(service.client, rf.skops).json()["id"]
    wait_until(lambda: service.client.get(f"/v1/models/{model_id}").json()["progress"] > 0, timeout=60)
    pid = builds.worker_pids()[model_id]
    builds.shutdown()
    wait_until(lambda: not _running(pid), timeout=5)  # not the worker's 120 s hold
    builds.wait(timeout=30)
    assert 'cfmaps_builds_total{outcome="cancelled"} 1.0' in service.client.get("/metrics").text


def test_a_worker_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent killed outright (SIGKILL, the OOM killer) cannot kill its workers: Linux
    does, as the worker asked (PR_SET_PDEATHSIG)."""
    import subprocess
    import sys

    ready = tmp_path / "ready"
    script = (
        "import os, time\n"
        "from app.build_worker import die_with_parent\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = die_with_parent()\n"
        f"    open({str(ready)!r}, 'w').write(str(ok))\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        wait_until(lambda: ready.exists() and ready.read_text() != "", timeout=30)
        assert ready.read_text() == "True"
        assert _running(child)
        parent.kill()
        parent.wait(timeout=10)
        wait_until(lambda: not _running(child), timeout=5)
    finally:
        parent.kill()
