"""The credit-risk demo behind ``cfmaps demo``.

It trains a random forest on the shipped UCI credit data (``credit.csv``, see
``ATTRIBUTION.md``), starts the service, uploads the model through the service's own HTTP API
(from loopback, so no admin token is needed unless one is configured), waits for the maps to be
built, checks one counterfactual end to end, and prints a ``curl`` command ready to paste.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from maps_core import FeatureSchema, load_csv

from ..progress import ProgressBar

DATA_FILE = Path(__file__).with_name("credit.csv")
MODEL_NAME = "credit-demo"
TARGET_COLUMN = "DEFAULT"
#: Class display names, in the order of the model's ``classes_`` (0, 1).
CLASS_NAMES = ["no default", "default"]
#: Features a client cannot change; counterfactuals keep them fixed.
IMMUTABLE = ("AGE",)
#: The demo forest: 50 trees of depth 4. Its maps (about 70,000 rectangles) build in about
#: 6 s on two cores, plus about a minute of one-off JIT compilation on a fresh install; 100
#: trees of depth 5 are as accurate (81 % against 80 %) but build for many minutes, because
#: the amount columns carry ~100-200 distinct thresholds each.
N_ESTIMATORS = 50
MAX_DEPTH = 4


def load_credit() -> tuple[np.ndarray, np.ndarray, FeatureSchema]:
    """The shipped credit data.

    Returns
    -------
    X : ndarray of shape (29986, 8)
    y : ndarray of shape (29986,), int
        1 = default payment next month.
    schema : FeatureSchema
        Types from the file's type codes, bounds from the data; ``AGE`` immutable.
    """
    data = load_csv(DATA_FILE, TARGET_COLUMN)
    assert data.y is not None
    schema = FeatureSchema(tuple(replace(f, mutable=f.name not in IMMUTABLE) for f in data.schema.features))
    X, y = data.X, data.y
    return X, y, schema


def train_model(X: np.ndarray, y: np.ndarray) -> Any:
    """The demo's credit-risk model: a seeded random forest."""
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(n_estimators=N_ESTIMATORS, max_depth=MAX_DEPTH, random_state=0).fit(X, y)


def demo_spec(schema: FeatureSchema) -> dict[str, Any]:
    """The ``spec`` uploaded with the model (as for ``POST /v1/models``)."""
    return {"name": MODEL_NAME, "features": schema.to_dicts(), "classes": CLASS_NAMES}


def example_instance(model: Any, X: np.ndarray, schema: FeatureSchema) -> dict[str, int]:
    """The first client of the file whom the model predicts to default, by feature name."""
    pred = model.predict(X)
    i = int(np.flatnonzero(pred == 1)[0])
    return {f.name: int(v) for f, v in zip(schema.features, X[i], strict=True)}


def _client_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def curl_command(base_url: str, model_id: str, instance: dict[str, Any], target: Any, token: bool) -> str:
    """A shell command asking the demo service for one counterfactual."""
    body = json.dumps({"instance": instance, "target": target})
    parts = [f"curl -s -X POST {base_url}/v1/models/{model_id}/counterfactuals"]
    if token:
        parts.append("-H 'Authorization: Bearer <one of CFMAPS_API_TOKENS>'")
    parts.append("-H 'Content-Type: application/json'")
    parts.append(f"-d {shlex.quote(body)} | python3 -m json.tool")
    return " \\\n  ".join(parts)


class _Driver:
    """Uploads the demo model once the server is up, waits for its maps, prints the command."""

    def __init__(self, server: Any, settings: Any, base_url: str, shown_url: str) -> None:
        self.server = server
        self.settings = settings
        self.base_url = base_url
        self.shown_url = shown_url
        self.failed: str | None = None

    def _headers(self, admin: bool) -> dict[str, str]:
        token = self.settings.admin_secret if admin else None
        if token is None and self.settings.api_tokens:
            token = self.settings.admin_secret or self.settings.api_tokens[0]
        return {"Authorization": f"Bearer {token}"} if token else {}

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            self.server.should_exit = True

    def _wait_started(self) -> bool:
        deadline = time.monotonic() + 60
        while not self.server.started:
            if self.server.should_exit or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _run(self) -> None:
        import httpx

        say = _say
        say(
            f"training the demo credit-risk model (random forest, {N_ESTIMATORS} trees of "
            f"depth {MAX_DEPTH})..."
        )
        X, y, schema = load_credit()
        model = train_model(X, y)
        instance = example_instance(model, X, schema)
        if not self._wait_started():
            if not self.server.should_exit:
                self.failed = "the server did not start"
            return
        # Reads may wait for minutes: right after an install, the first query compiles the
        # search engine in the server (a minute alone, longer on a busy machine; a 60 s
        # read timeout failed the demo while tests ran beside it).
        with httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(60, read=600)) as client:
            model_id = self._find_existing(client)
            if model_id is not None:
                try:
                    self._wait_ready(client, model_id)
                except _BuildFailed as exc:  # e.g. maps damaged on disk: a fresh copy
                    _say(f"the stored demo model failed ({exc}); uploading it again")
                    model_id = None
            if model_id is None:
                model_id = self._upload(client, model, schema)
                self._wait_ready(client, model_id)
            target = CLASS_NAMES[0]
            r = client.post(
                f"/v1/models/{model_id}/counterfactuals",
                json={"instance": instance, "target": target},
                headers=self._headers(admin=False),
            )
            if r.status_code != 200:
                raise RuntimeError(f"the demo query failed: HTTP {r.status_code}: {r.text}")
            answer = r.json()
        cmd = curl_command(self.shown_url, model_id, instance, target, token=bool(self.settings.api_tokens))
        say("")
        say(f"cfmaps demo is serving at {self.shown_url}  (Ctrl-C to stop)")
        say(f"model {model_id} ({MODEL_NAME}): class 0 = no default, class 1 = default")
        say("")
        say("The model predicts that this client defaults. What is the smallest change that")
        say("would make it predict 'no default'? (AGE is immutable.) Paste:")
        say("")
        say(cmd)
        say("")
        changes = _summarise_changes(answer)
        if changes:
            norm = self.settings.default_norm
            say(f"answer: {changes}")
            say(f"        (certified optimal; weighted {norm} distance {answer.get('distance')})")
        say(f"API docs: {self.shown_url}/docs")

    def _find_existing(self, client: Any) -> str | None:
        """The demo model of an earlier run in the data dir, unless its build failed.

        Any status but ``failed`` counts: right after start-up the stored models are still
        ``loading`` (looking for ``ready`` ones only, the demo uploaded a new copy at every
        start), and :meth:`_wait_ready` waits for it as for a new upload."""
        params: dict[str, str] = {"limit": "1000"}
        found: dict[str, str] = {}  # status -> the first such model's id
        while True:  # every page of the models
            r = client.get("/v1/models", params=params, headers=self._headers(admin=False))
            if r.status_code != 200:
                return None
            doc = r.json()
            for m in doc.get("models", []):
                if m.get("name") == MODEL_NAME and m.get("status") != "failed":
                    found.setdefault(str(m.get("status")), str(m.get("id")))
            if not doc.get("next_cursor"):
                break
            params["cursor"] = doc["next_cursor"]
        model_id = found.get("ready") or next(iter(found.values()), None)
        if model_id is not None:
            _say(f"reusing the demo model {model_id} found in the data directory")
        return model_id

    def _upload(self, client: Any, model: Any, schema: FeatureSchema) -> str:
        import skops.io as sio

        buf = io.BytesIO()
        sio.dump(model, buf)
        r = client.post(
            "/v1/models",
            files={"model": (f"{MODEL_NAME}.skops", buf.getvalue(), "application/octet-stream")},
            data={"spec": json.dumps(demo_spec(schema))},
            headers=self._headers(admin=True),
        )
        if r.status_code not in (200, 201, 202):
            raise RuntimeError(f"uploading the demo model failed: HTTP {r.status_code}: {r.text}")
        model_id = str(r.json()["id"])
        _say(
            f"uploaded the model as {model_id}; building its counterfactual maps (the first "
            "build after installing also compiles the engine: about a minute)..."
        )
        return model_id

    def _wait_ready(self, client: Any, model_id: str) -> None:
        bar = ProgressBar("building maps")
        ok = False
        try:
            while not self.server.should_exit:
                r = client.get(f"/v1/models/{model_id}", headers=self._headers(admin=False))
                r.raise_for_status()
                doc = r.json()
                progress = doc.get("progress")
                if isinstance(progress, int | float):
                    bar(progress)
                if doc.get("status") == "ready":
                    ok = True
                    return
                if doc.get("status") == "failed":
                    raise _BuildFailed(f"the demo build failed: {doc.get('error')}")
                time.sleep(0.2)
            raise RuntimeError("the server stopped during the build")
        finally:
            bar.close(done=ok)


class _BuildFailed(RuntimeError):
    """The demo model's status became ``failed``."""


def _summarise_changes(answer: Any) -> str:
    """``"PAY_0_LATE 1 -> 0"`` style summary of a counterfactual answer (tolerant of shape)."""
    if not isinstance(answer, dict):
        return ""
    res = answer.get("results", [answer])
    res = res[0] if isinstance(res, list) and res else answer
    changes = res.get("changes") if isinstance(res, dict) else None
    if isinstance(changes, dict):
        items = [(k, v) for k, v in changes.items()]
    elif isinstance(changes, list):
        items = [(c.get("feature"), c) for c in changes if isinstance(c, dict)]
    else:
        return ""
    text = ", ".join(f"{k} {v.get('from')} -> {v.get('to')}" for k, v in items)
    return text or "no change needed"


def _say(text: str) -> None:
    print(text, flush=True)


class _Terminated(Exception):
    """SIGTERM, raised in the main thread (see :func:`run_demo`)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


def run_demo(host: str = "127.0.0.1", port: int = 8000, data_dir: str | None = None) -> int:
    """Serve the demo until interrupted; returns the exit status.

    Stopped by SIGTERM (``docker stop``, systemd, ``kill``), it removes its temporary data
    directory and its build forkserver's (``pymp-*``), then ends by that signal, as
    ``cfmaps serve`` does. uvicorn re-raises
    the signal it stopped on; with the default action the process ended on the spot and
    left the directory (the demo's built maps, about 7 MB) behind in the temp dir.
    """
    from app.settings import unknown_settings

    for warning in unknown_settings(os.environ):  # as cfmaps serve logs them
        sys.stderr.write(f"cfmaps: warning: {warning}\n")
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    terminated = False
    try:
        driver, server = _serve_demo(host, port, data_dir)
    except _Terminated:
        terminated = True
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if terminated:
        from app.builds import remove_forkserver_dir

        remove_forkserver_dir()  # the exit handlers that would have removed it do not run
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return 128 + signal.SIGTERM  # not reached: the signal ends the process
    if driver.failed:
        sys.stderr.write(f"cfmaps: error: demo: {driver.failed}\n")
        return 1
    if not server.started:
        sys.stderr.write(f"cfmaps: error: demo: could not serve on {host}:{port}\n")
        return 1
    return 0


def _serve_demo(host: str, port: int, data_dir: str | None) -> tuple[_Driver, Any]:
    """Run the demo's server in this thread until it stops; returns its driver and server."""
    import uvicorn

    from app.main import create_app
    from app.settings import Settings

    with tempfile.TemporaryDirectory(prefix="cfmaps-demo-") as tmp:
        overrides: dict[str, Any] = {"data_dir": Path(data_dir or tmp)}
        settings = Settings(**overrides)
        app = create_app(settings)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        server = uvicorn.Server(config)
        client_host = _client_host(host)
        base_url = f"http://{client_host}:{port}"
        driver = _Driver(server, settings, base_url, base_url)
        thread = threading.Thread(target=driver.run, name="cfmaps-demo", daemon=True)
        thread.start()
        try:
            server.run()
        except SystemExit as exc:  # uvicorn exits when it cannot bind
            if exc.code not in (0, None):
                server.should_exit = True
                driver.failed = driver.failed or f"could not serve on {host}:{port}"
        finally:
            thread.join(timeout=5)
    return driver, server
