"""A client generated from /openapi.json by openapi-python-client builds, uploads a model,
queries it and reads typed results: the document is exact enough for code generators."""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from svc_helpers import Fitted, serve_uvicorn

from app.settings import Settings

PACKAGE = "cfmaps_client"


@pytest.fixture
def generated(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """(base url of a running service, importer of the generated client's modules)."""
    with serve_uvicorn(Settings(data_dir=tmp_path / "data")) as (base, _):
        (tmp_path / "openapi.json").write_text(httpx.get(f"{base}/openapi.json").text)
        # The generator reads binary bodies only as application/octet-stream; its documented
        # override maps the map picture's image/png onto that (the document stays exact).
        (tmp_path / "config.yml").write_text(
            "content_type_overrides:\n  image/png: application/octet-stream\n")
        gen = subprocess.run(
            [sys.executable, "-m", "openapi_python_client", "generate",
             "--path", "openapi.json", "--output-path", PACKAGE, "--meta", "none",
             "--config", "config.yml"],
            cwd=tmp_path, capture_output=True, text=True, timeout=180,
        )
        out = gen.stdout + gen.stderr
        assert gen.returncode == 0, out
        assert "warning" not in out.lower(), out  # every schema was understood
        sys.path.insert(0, str(tmp_path))

        def module(name: str) -> ModuleType:
            return importlib.import_module(f"{PACKAGE}.{name}" if name else PACKAGE)

        try:
            yield base, module
        finally:
            sys.path.remove(str(tmp_path))
            for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
                del sys.modules[name]


def test_a_generated_client_uploads_queries_and_reads_typed_results(
    generated: tuple[str, Any], rf: Fitted
) -> None:
    base, module = generated
    m = module("models")
    types = module("types")
    create_model = module("api.models.create_model")
    get_model = module("api.models.get_model")
    counterfactuals = module("api.queries.counterfactuals")
    predict = module("api.queries.predict")
    client = module("").Client(base_url=base, raise_on_unexpected_status=True,
                               timeout=httpx.Timeout(60))

    body = m.BodyCreateModel(
        model=types.File(payload=io.BytesIO(rf.skops), file_name="rf.skops"),
        spec=json.dumps({"name": "forest", "classes": ["denied", "approved"]}),
    )
    info = create_model.sync(client=client, body=body)
    assert isinstance(info, m.ModelInfo), info
    assert info.name == "forest"
    deadline = time.monotonic() + 120
    while info.status.value not in ("ready", "failed"):
        assert time.monotonic() < deadline, "not built in time"
        time.sleep(0.05)
        info = get_model.sync(model_id=info.id, client=client)
    assert info.status == m.ModelInfoStatus.READY and info.progress == 1.0

    x = rf.X[0]
    single = m.CounterfactualRequest(
        instance=m.CounterfactualRequestInstanceType0.from_dict({f"x{j}": float(v) for j, v in enumerate(x)}),
        target="approved",
        norm=m.CounterfactualRequestNormType0.L2,
    )
    out = counterfactuals.sync(model_id=info.id, client=client, body=single)
    assert isinstance(out, m.CounterfactualOut), out
    assert out.feasible is True and out.optimal is True and isinstance(out.distance, float)
    cf = out.counterfactual.to_dict()
    assert rf.model.predict([[cf[f"x{j}"] for j in range(5)]])[0] == 1  # "approved"
    assert isinstance(out.stats, m.QueryStatsOut)

    batch = m.CounterfactualRequest(instances=[row.tolist() for row in rf.X[:4]], k=2)
    many = counterfactuals.sync(model_id=info.id, client=client, body=batch)
    assert isinstance(many, m.CounterfactualBatchOut) and len(many.results) == 4
    assert all(isinstance(r, m.CounterfactualOut) for r in many.results)

    labels = predict.sync(model_id=info.id, client=client,
                          body=m.PredictRequest(instances=[rf.X[0].tolist()]))
    assert isinstance(labels, m.PredictBatchOut)
    want = ["denied", "approved"][int(rf.model.predict(rf.X[:1])[0])]
    assert labels.results[0].prediction == want

    map_png = module("api.queries.map_png_post")
    picture = map_png.sync(model_id=info.id, client=client, body=m.MapRequest(
        features=["x0", "x1"], instance=rf.X[0].tolist(), width=40, height=30))
    assert isinstance(picture, types.File)
    assert picture.payload.read(8) == b"\x89PNG\r\n\x1a\n"

    missing = counterfactuals.sync(model_id="nope", client=client, body=single)
    assert isinstance(missing, m.ErrorResponse) and missing.error == "model_not_found"
