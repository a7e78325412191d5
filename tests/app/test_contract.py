"""The OpenAPI contract, checked by schemathesis against the real server.

``schemathesis run --checks all`` over every phase (examples, coverage, fuzzing and the
stateful phase, which follows the upload's OpenAPI links to the model's routes), within a
time budget, against uvicorn on a loopback port; it must find nothing. Its settings, and
why, are in ``schemathesis.toml`` at the repository root.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from svc_helpers import free_port

from app.main import create_app
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# Seconds of generation: the run ends after this (and the report), about 2 minutes in all.
BUDGET = 90


@pytest.mark.slow
def test_schemathesis_finds_no_contract_failure(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", build_max_seconds=5)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                        log_level="critical", lifespan="on"))
    thread = threading.Thread(target=srv.run, name="uvicorn-contract", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    base = f"http://127.0.0.1:{port}"
    try:
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
        cmd = [
            sys.executable, "-m", "schemathesis.cli",
            "--config-file", str(ROOT / "schemathesis.toml"),
            "run", f"{base}/openapi.json",
            "--checks", "all",
            "--max-time", str(BUDGET),
            # one worker: hypothesis's lambda descriptions parse source with ast, which is
            # not thread-safe on CPython 3.11 (schemathesis then reports internal errors)
            "--workers", "1",
            "--generation-database", "none",
            "--no-color",
        ]
        run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True,
                             timeout=BUDGET + 150)
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in out or f"✅  {phase}" in out, out[-3000:]
