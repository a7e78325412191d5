"""Restart behaviour: reload ready models, run interrupted builds again, rebuild outdated
maps, refuse broken maps."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import skops.io as sio
from sklearn.ensemble import RandomForestClassifier
from svc_helpers import Fitted, Service, upload, wait_until

from app.registry import Registry
from app.settings import Settings


def _status(svc: Service, model_id: str) -> dict[str, Any]:
    path = svc.settings.models_dir / model_id / "status.json"
    return dict(json.loads(path.read_text()))


def _edit_status(data_dir: Path, model_id: str, **changes: Any) -> None:
    path = data_dir / "models" / model_id / "status.json"
    status = json.loads(path.read_text())
    status.update(changes)
    path.write_text(json.dumps(status))


def test_restart_reloads_ready_models(service_factory: Any, rf: Fitted, gb3: Fitted) -> None:
    x = rf.X[:4].tolist()
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        rf_id = svc.add(rf.skops, {"classes": ["no", "yes"]})
        gb_id = svc.add(gb3.skops)
        before = svc.client.post(f"/v1/models/{rf_id}/counterfactuals", json={"instances": x})
        info_before = svc.client.get(f"/v1/models/{rf_id}").json()
    with service_factory(data_dir=data_dir) as svc:
        ready = svc.client.get("/readyz").json()
        assert ready["status"] == "ready" and ready["models"]["ready"] == 2
        after = svc.client.post(f"/v1/models/{rf_id}/counterfactuals", json={"instances": x})
        assert after.status_code == 200
        strip = [{k: v for k, v in r.items() if k != "stats"} for r in after.json()["results"]]
        assert strip == [
            {k: v for k, v in r.items() if k != "stats"} for r in before.json()["results"]
        ]
        info = svc.client.get(f"/v1/models/{rf_id}").json()
        assert info == info_before
        assert svc.client.get(f"/v1/models/{gb_id}").json()["status"] == "ready"
        r = svc.client.post(f"/v1/models/{gb_id}/predict", json={"instance": gb3.X[0].tolist()})
        assert r.json()["prediction"] == gb3.model.predict(gb3.X[:1])[0]


def _wait_ready(svc: Service, model_id: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = dict(svc.client.get(f"/v1/models/{model_id}").json())
        if info["status"] in ("ready", "failed"):
            return info
        time.sleep(0.05)
    raise AssertionError(f"model {model_id} not built in {timeout} s")


def test_interrupted_builds_run_again_at_start(service_factory: Any, rf: Fitted) -> None:
    x = rf.X[0].tolist()
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        building = svc.add(rf.skops)
        queued = svc.add(rf.skops)
        want = svc.client.post(f"/v1/models/{building}/counterfactuals", json={"instance": x}).json()
    # Simulate a crash mid-build: status on disk still says building/queued, maps missing.
    _edit_status(data_dir, building, status="building", stats=None)
    shutil.rmtree(data_dir / "models" / building / "maps")
    _edit_status(data_dir, queued, status="queued")
    with service_factory(data_dir=data_dir) as svc:
        for model_id in (building, queued):
            info = _wait_ready(svc, model_id)
            assert info["status"] == "ready" and info["error"] is None, info
            assert _status(svc, model_id)["status"] == "ready"  # persisted
            r = svc.client.post(f"/v1/models/{model_id}/counterfactuals", json={"instance": x})
            assert r.status_code == 200
            assert r.json()["distance"] == want["distance"]
        assert svc.client.get("/readyz").status_code == 200


def test_maps_of_an_older_format_are_rebuilt(service_factory: Any, rf: Fitted) -> None:
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        model_id = svc.add(rf.skops)
    manifest = data_dir / "models" / model_id / "maps" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["format_version"] = 1  # maps written before real-line cell bounds
    manifest.write_text(json.dumps(doc))
    with service_factory(data_dir=data_dir) as svc:
        info = _wait_ready(svc, model_id)
        assert info["status"] == "ready", info
        new = json.loads(manifest.read_text())
        assert new["format_version"] != 1
        r = svc.client.post(f"/v1/models/{model_id}/counterfactuals",
                            json={"instance": rf.X[0].tolist()})
        assert r.status_code == 200


@pytest.mark.parametrize("recorded", [True, False])
def test_maps_that_no_longer_match_the_uploaded_file_are_rebuilt(
        service_factory: Any, rf: Fitted, recorded: bool) -> None:
    """The model file as uploaded (its recorded SHA-256 matches, or an earlier version
    recorded none) but maps of another reading of it, as after an adapter fix (XGBoost
    1.5's categorical rule): rebuilt from the file, not failed. Here another model's maps
    stand in for the old reading."""
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        model_id, other = svc.add(rf.skops), svc.add(
            sio.dumps(RandomForestClassifier(4, max_depth=2, random_state=1).fit(rf.X, rf.y)))
    d = data_dir / "models"
    status = json.loads((d / model_id / "status.json").read_text())
    assert len(status["model_sha256"]) == 64
    if not recorded:
        del status["model_sha256"]
        (d / model_id / "status.json").write_text(json.dumps(status))
    shutil.rmtree(d / model_id / "maps")
    shutil.copytree(d / other / "maps", d / model_id / "maps")
    with service_factory(data_dir=data_dir) as svc:
        info = _wait_ready(svc, model_id)
        assert info["status"] == "ready", info
        r = svc.client.post(f"/v1/models/{model_id}/predict", json={"instances": rf.X[:50].tolist()})
        assert [p["prediction"] for p in r.json()["results"]] == rf.model.predict(rf.X[:50]).tolist()


def test_corrupt_or_missing_maps_are_refused(service_factory: Any, rf: Fitted) -> None:
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        corrupt, missing, swapped, bogus, widened, good = (svc.add(rf.skops) for _ in range(6))
    maps_dir = data_dir / "models" / corrupt / "maps"
    victims = sorted(p for p in maps_dir.rglob("*") if p.is_file() and p.stat().st_size > 64)
    for p in victims:
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data[: len(data) - 7]))
    shutil.rmtree(data_dir / "models" / missing / "maps")
    # Another model's file next to these maps.
    other = RandomForestClassifier(4, max_depth=2, random_state=1).fit(rf.X, rf.y)
    (data_dir / "models" / swapped / "model.skops").write_bytes(sio.dumps(other))
    # spec.json edited by hand: a type no schema has, and bounds the maps were not built on
    # (the first loaded ready, then answered every query 422 invalid_schema)
    for model_id, edit in ((bogus, {"type": "bogus"}), (widened, {"upper": 1e9})):
        path = data_dir / "models" / model_id / "spec.json"
        spec = json.loads(path.read_text())
        spec["features"][0] = {**spec["features"][0], **edit}
        path.write_text(json.dumps(spec))

    with service_factory(data_dir=data_dir) as svc:
        for model_id in (corrupt, missing, swapped, bogus, widened):
            info = svc.client.get(f"/v1/models/{model_id}").json()
            assert info["status"] == "failed", (model_id, info)
            assert info["error"].startswith("could not load the model")
            assert str(data_dir) not in info["error"]  # no server path for clients
            if model_id in (corrupt, missing):
                assert f"{model_id}{os.sep}maps" in info["error"], info["error"]
            if model_id == swapped:
                assert "the maps do not belong to the model file next to them" in info["error"]
            if model_id in (bogus, widened):
                assert "spec.json's features" in info["error"], info["error"]
            r = svc.client.post(
                f"/v1/models/{model_id}/counterfactuals", json={"instance": rf.X[0].tolist()}
            )
            assert r.status_code == 409
            assert str(data_dir) not in r.json()["message"]
            # Load failures are not persisted: repairing the files and restarting recovers.
            assert _status(svc, model_id)["status"] == "ready"
        assert svc.client.get(f"/v1/models/{good}").json()["status"] == "ready"
        ready = svc.client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["models"]["failed"] == 5


def test_class_files_that_contradict_the_model_are_refused(service_factory: Any,
                                                            gb3: Fitted) -> None:
    # Hand-edited (or damaged) class files: the model showed ready and every query was a
    # 500. Now it is failed with the reason, and the others stay ready.
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        spec = {"classes": ["high", "low", "mid"]}
        names, labels, good = (svc.add(gb3.skops, spec) for _ in range(3))
    spec_file = data_dir / "models" / names / "spec.json"
    edited = json.loads(spec_file.read_text())
    edited["classes"] = ["high", "low"]
    spec_file.write_text(json.dumps(edited))
    status_file = data_dir / "models" / labels / "status.json"
    edited = json.loads(status_file.read_text())
    edited["class_labels"] = edited["class_labels"][:2]
    status_file.write_text(json.dumps(edited))
    with service_factory(data_dir=data_dir) as svc:
        for model_id, words in ((names, "spec.json's classes"),
                                (labels, "status.json's class_labels")):
            info = svc.client.get(f"/v1/models/{model_id}").json()
            assert info["status"] == "failed", info
            assert words in info["error"], info["error"]
            r = svc.client.post(f"/v1/models/{model_id}/counterfactuals",
                                json={"instance": gb3.X[0].tolist()})
            assert r.status_code == 409, r.text
        r = svc.client.post(f"/v1/models/{good}/counterfactuals",
                            json={"instance": gb3.X[0].tolist()})
        assert r.status_code == 200 and r.json()["prediction"] in ("high", "low", "mid")


def test_a_model_deleted_while_it_loads_is_gone_not_failed(
    service_factory: Any, rf: Fitted, monkeypatch: Any, caplog: Any
) -> None:
    # Another process's DELETE while this one loads the model at start: it is forgotten
    # (404), not shown failed with an ERROR logged until the next sync.
    from maps_core import CounterfactualMaps

    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        model_id = svc.add(rf.skops)
    real = CounterfactualMaps.load

    def deleted_meanwhile(cls: Any, path: Any, **kw: Any) -> Any:
        shutil.rmtree(data_dir / "models" / model_id)
        return real(path, **kw)

    monkeypatch.setattr(CounterfactualMaps, "load", classmethod(deleted_meanwhile))
    with service_factory(data_dir=data_dir) as svc:
        assert svc.client.get(f"/v1/models/{model_id}").status_code == 404
        assert svc.client.get("/v1/models").json()["models"] == []
    assert "could not load" not in caplog.text


def test_pickled_model_needs_trust_after_restart(service_factory: Any, rf: Fitted) -> None:
    with service_factory(trust_pickle=True) as svc:
        data_dir = svc.settings.data_dir
        model_id = svc.add(pickle.dumps(rf.model))
    with service_factory(data_dir=data_dir) as svc:
        info = svc.client.get(f"/v1/models/{model_id}").json()
        assert info["status"] == "failed" and "CFMAPS_TRUST_PICKLE" in info["error"]
    with service_factory(data_dir=data_dir, trust_pickle=True) as svc:
        assert svc.client.get(f"/v1/models/{model_id}").json()["status"] == "ready"


def test_leftovers_and_junk_in_the_data_dir(service_factory: Any, rf: Fitted) -> None:
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        model_id = svc.add(rf.skops)
    models = data_dir / "models"
    (models / ".tmp-deadbeef").mkdir()
    (models / ".tmp-deadbeef" / "upload").write_bytes(b"half an upload")
    (models / ".trash-cafe").mkdir()
    (models / "no-status").mkdir()
    (models / "bad-json").mkdir()
    (models / "bad-json" / "status.json").write_text("{not json")
    (models / "bad-json" / "spec.json").write_text("{}")
    (models / "stray.txt").write_text("hello")
    # an operator's backup of a model and notes: not models, whatever they hold
    shutil.copytree(models / model_id, models / f"{model_id}.bak")
    (models / "backup-2026").mkdir()
    (models / "backup-2026" / "notes.txt").write_text("important")
    # a copy of the good model's directory whose status was edited to one no model has
    weird = models / ("f" * 32)
    shutil.copytree(models / model_id, weird)
    doc = json.loads((weird / "status.json").read_text())
    (weird / "status.json").write_text(json.dumps({**doc, "id": weird.name, "status": "weird"}))
    # and a model whose status.json was cut short (a disk that filled up under an editor)
    cut = models / ("e" * 32)
    shutil.copytree(models / model_id, cut)
    (cut / "status.json").write_text('{"id": "' + cut.name + '", "stat')
    with service_factory(data_dir=data_dir) as svc:
        assert not (models / ".tmp-deadbeef").exists() and not (models / ".trash-cafe").exists()
        listed = {m["id"]: m for m in svc.client.get("/v1/models").json()["models"]}
        # junk that is no model's directory is skipped; a model's unreadable one is listed
        # failed with the reason, and can be deleted
        assert sorted(listed) == sorted([model_id, weird.name, cut.name])
        assert svc.client.get(f"/v1/models/{model_id}").json()["status"] == "ready"
        for bad, words in ((weird, "unknown status 'weird'"), (cut, "JSONDecodeError")):
            info = svc.client.get(f"/v1/models/{bad.name}").json()
            assert info["status"] == "failed", info
            assert info["error"].startswith("unreadable model directory"), info["error"]
            assert words in info["error"] and str(data_dir) not in info["error"]
            r = svc.client.post(f"/v1/models/{bad.name}/counterfactuals",
                                json={"instance": rf.X[0].tolist()})
            assert r.status_code == 409
        ready = svc.client.get("/readyz").json()
        assert ready["models"]["failed"] == 2 and "weird" not in json.dumps(ready)
        time.sleep(1.0)  # syncs leave them as they are
        assert svc.client.get(f"/v1/models/{cut.name}").json()["status"] == "failed"
        # and list no other directory: a sync pass listed every one failed, and a client's
        # DELETE removed it with everything in it
        listed_later = [m["id"] for m in svc.client.get("/v1/models").json()["models"]]
        assert sorted(listed_later) == sorted(listed)
        for name in (f"{model_id}.bak", "backup-2026", "no-status", "bad-json"):
            assert svc.client.get(f"/v1/models/{name}").status_code == 404
            assert svc.client.delete(f"/v1/models/{name}").status_code == 404
        assert (models / "backup-2026" / "notes.txt").read_text() == "important"
        assert (models / f"{model_id}.bak" / "status.json").is_file()
        assert svc.client.delete(f"/v1/models/{cut.name}").status_code == 204
        assert not cut.exists()
        # repaired, the other is what its files say once the sync reads them again
        (weird / "status.json").write_text(json.dumps({**doc, "id": weird.name}))
        wait_until(lambda: svc.client.get(f"/v1/models/{weird.name}").json()["status"]
                   == "ready", timeout=60)


def test_a_model_directory_damaged_while_the_service_runs(
        service_factory: Any, rf: Fitted, caplog: pytest.LogCaptureFixture) -> None:
    # Found by the sync, not only at the next start: it was skipped ("half-written, next
    # pass") forever, though every writer replaces the files whole.
    with service_factory() as svc:
        model_id = svc.add(rf.skops)
        models = svc.settings.models_dir
        # a copy of a model's directory appears with a cut-short status.json (assembled
        # beside models/ and moved in whole: a sync pass could otherwise load the copy
        # from its good status.json first and keep that state)
        staged = svc.settings.data_dir / "staged"
        shutil.copytree(models / model_id, staged)
        (staged / "status.json").write_text('{"id": "' + "e" * 32 + '", "stat')
        cut = models / ("e" * 32)
        os.rename(staged, cut)
        wait_until(lambda: svc.client.get(f"/v1/models/{cut.name}").status_code == 200)
        info = svc.client.get(f"/v1/models/{cut.name}").json()
        assert info["status"] == "failed", info
        assert info["error"].startswith("unreadable model directory"), info["error"]
        # a model the service serves keeps answering from its loaded maps, with a warning
        doc = json.loads((models / model_id / "status.json").read_text())
        with caplog.at_level(logging.WARNING, logger="cfmaps.app"):
            # replaced whole: write_text truncates first, and a sync pass that read the
            # empty file in between saw a second change of the file (and warned twice)
            damaged = models / model_id / "status.json.tmp"
            damaged.write_text("{not json")
            os.replace(damaged, models / model_id / "status.json")
            wait_until(lambda: any("no longer read" in r.getMessage() and model_id in
                                   r.getMessage() for r in caplog.records))
            time.sleep(0.6)  # more sync passes: warned once per change of the file
        assert sum("no longer read" in r.getMessage() for r in caplog.records) == 1
        assert svc.client.get(f"/v1/models/{model_id}").json()["status"] == "ready"
        r = svc.client.post(f"/v1/models/{model_id}/counterfactuals",
                            json={"instance": rf.X[0].tolist()})
        assert r.status_code == 200, r.text
        # repaired: the damaged copy is what its files say, as a new model
        (cut / "status.json").write_text(json.dumps({**doc, "id": cut.name}))
        wait_until(lambda: svc.client.get(f"/v1/models/{cut.name}").json()["status"]
                   == "ready", timeout=60)
        (models / model_id / "status.json").write_text(json.dumps(doc))


def test_upload_writes_are_complete_or_absent(service: Service, rf: Fitted) -> None:
    r = upload(service.client, b"PK\x03\x04 broken zip")
    assert r.status_code == 422
    assert list(service.settings.models_dir.iterdir()) == []


def test_a_build_waiting_to_run_again_is_queued_from_zero(service_factory: Any,
                                                         rf: Fitted) -> None:
    """An interrupted build queued again showed "building" with the progress it had reached
    (0.41) until its build really started, from 0; the restart queued builds by directory
    name, not in upload order."""
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        ids = [svc.add(rf.skops) for _ in range(3)]
    order = sorted(ids, reverse=True)  # uploaded in the reverse of the names' order
    for i, model_id in enumerate(order):
        _edit_status(data_dir, model_id, status="building", progress=0.41, stats=None,
                     created_at=f"2026-01-0{i + 1}T00:00:00+00:00")
    registry = Registry(Settings(data_dir=data_dir))
    registry.open()
    requeued: list[Any] = []
    registry.on_requeue = requeued.append  # what the build manager would run
    registry.load_pending()
    assert [e.id for e in requeued] == order
    for entry in requeued:
        assert (entry.status, entry.progress) == ("queued", 0.0)


def test_a_stopping_service_writes_its_builds_back_queued(service_factory: Any,
                                                          rf: Fitted) -> None:
    """A stop left "building" and its progress on disk: an API replica went on reporting a
    build that no process ran."""
    with service_factory() as svc:
        data_dir = svc.settings.data_dir
        model_id = svc.add(rf.skops)
    _edit_status(data_dir, model_id, status="building", progress=0.41, stats=None)
    registry = Registry(Settings(data_dir=data_dir))
    registry.open()
    entry = registry.get(model_id)
    entry.building_here = True  # as a build thread holding its lock
    registry.close()
    status = json.loads((data_dir / "models" / model_id / "status.json").read_text())
    assert (status["status"], status["progress"]) == ("queued", 0.0)


def test_a_build_lock_that_cannot_be_created_is_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """On a read-only data dir a queued model stayed queued without a word: the failed
    creation of its build lock read as "another process builds it"."""
    from app.registry import BuildLock

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    with caplog.at_level(logging.ERROR, logger="cfmaps.app"):
        assert BuildLock.acquire(blocked / ".build.lock") is None
        assert BuildLock.acquire(blocked / ".build.lock") is None  # the next sync pass
        assert BuildLock.acquire(tmp_path / "gone" / ".build.lock") is None  # deleted: quiet
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "stays queued" in said[0] and "Not a directory" in said[0], said
