"""The ``cfmaps`` command line: build (from --spec and from --data), query, errors."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import RandomForestClassifier

from app.cli import main, schema_from_data
from app.progress import ProgressBar
from app.settings import Settings
from maps_core import DEFAULT_MAX_RECTANGLES, CounterfactualMaps
from tests.conftest import ROOT

NAMES = ["income", "age", "late", "debt"]


def _data(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Integer-valued features (income, age, late (0/1), debt) and a binary label."""
    rng = np.random.default_rng(seed)
    income = rng.integers(10, 100, n)
    age = rng.integers(18, 80, n)
    late = rng.integers(0, 2, n)
    debt = rng.integers(0, 50, n)
    y = ((income - debt - 25 * late + rng.normal(0, 10, n)) < 30).astype(int)
    return np.column_stack([income, age, late, debt]).astype(float), y


@pytest.fixture(scope="module")
def fitted() -> tuple[RandomForestClassifier, np.ndarray, np.ndarray]:
    X, y = _data()
    model = RandomForestClassifier(n_estimators=8, max_depth=3, random_state=0).fit(X, y)
    return model, X, y


@pytest.fixture()
def model_file(tmp_path: Path, fitted: Any) -> Path:
    path = tmp_path / "model.skops"
    sio.dump(fitted[0], path)
    return path


def _spec() -> dict[str, Any]:
    return {
        "name": "toy",
        "features": [
            {"name": "income", "type": "integer", "lower": 0, "upper": 200},
            {"name": "age", "type": "integer", "lower": 18, "upper": 100, "mutable": False},
            {"name": "late", "type": "binary"},
            {"name": "debt", "type": "integer", "lower": 0, "upper": 100},
        ],
    }


def _write_csv(path: Path, X: np.ndarray, y: np.ndarray, two_row: bool, target: str) -> None:
    lines = [",".join([*NAMES, target])]
    if two_row:
        lines.append("D,D,B,D,T")
    lines += [",".join(str(int(v)) for v in [*row, label]) for row, label in zip(X, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _query(capsys: pytest.CaptureFixture[str], maps_dir: Path, *extra: str) -> dict[str, Any]:
    code, out, err = _run(capsys, "query", str(maps_dir), *extra)
    assert code == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


# ------------------------------------------------------------------------------------------
# build + query
# ------------------------------------------------------------------------------------------
def test_build_with_spec_then_query(
    tmp_path: Path, model_file: Path, fitted: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    model, X, _ = fitted
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec()))
    out = tmp_path / "maps"
    code, stdout, err = _run(capsys, "build", str(model_file), "--spec", str(spec), "--out", str(out))
    assert code == 0, err
    assert "wrote maps to" in stdout
    assert "100%" in err  # the progress bar ran to the end
    maps = CounterfactualMaps.load(out)
    assert maps.feature_names == NAMES
    assert [f.type for f in maps.schema] == ["integer", "integer", "binary", "integer"]

    x = X[0]
    pred = model.predict(x[None])[0]
    target = 1 - pred
    instance = dict(zip(NAMES, (int(v) for v in x), strict=True))
    doc = _query(capsys, out, "--instance", json.dumps(instance), "--target", str(target))
    assert doc["prediction"] == pred
    assert doc["target"] == target
    assert doc["feasible"] is True and doc["optimal"] is True
    cf = np.array([doc["counterfactual"][n] for n in NAMES], dtype=float)
    assert model.predict(cf[None])[0] == target
    assert cf[1] == x[1]  # age is immutable in the spec
    assert set(doc["changes"]) == {n for n, a, b in zip(NAMES, x, cf, strict=True) if a != b}
    for n, ch in doc["changes"].items():
        assert ch == {"from": instance[n], "to": doc["counterfactual"][n]}
    assert doc["distance"] > 0
    assert doc["counterfactual_distance"] == pytest.approx(doc["distance"], rel=1e-5, abs=1e-9)
    assert set(doc["region"]) == set(NAMES)


def test_query_list_instance_norms_and_k(
    tmp_path: Path, model_file: Path, fitted: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    model, X, _ = fitted
    out = tmp_path / "maps"
    assert main(["build", str(model_file), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    for norm in ("l1", "l2", "linf"):
        doc = _query(capsys, out, "--instance", json.dumps(X[3].tolist()), "--norm", norm)
        cf = np.array(list(doc["counterfactual"].values()), dtype=float)
        assert model.predict(cf[None])[0] == doc["target"] != doc["prediction"]
    doc = _query(capsys, out, "--instance", json.dumps(X[3].tolist()), "--k", "3")
    alts = doc.get("alternatives", [])
    assert len(alts) <= 2
    dists = [doc["distance"]] + [a["distance"] for a in alts]
    assert dists == sorted(dists)


@pytest.mark.parametrize("two_row", [True, False])
def test_build_with_data_infers_schema(
    tmp_path: Path,
    model_file: Path,
    fitted: Any,
    capsys: pytest.CaptureFixture[str],
    two_row: bool,
) -> None:
    model, X, y = fitted
    csv = tmp_path / "train.csv"
    _write_csv(csv, X, y, two_row=two_row, target="label")
    out = tmp_path / "maps"
    argv = ["build", str(model_file), "--data", str(csv), "--out", str(out), "--no-progress"]
    if not two_row:
        argv += ["--target-column", "label"]  # the two-row header marks it with T
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    assert "inferred feature schema" in err
    maps = CounterfactualMaps.load(out)
    assert maps.feature_names == NAMES
    assert [f.type for f in maps.schema] == ["integer", "integer", "binary", "integer"]
    income = maps.schema[0]
    assert (income.lower, income.upper) == (X[:, 0].min(), X[:, 0].max())

    doc = _query(capsys, out, "--instance", json.dumps(X[5].tolist()))
    cf = np.array(list(doc["counterfactual"].values()), dtype=float)
    assert model.predict(cf[None])[0] == doc["target"]
    assert np.all(cf == np.round(cf))  # integer features stay integral
    assert X[:, 0].min() <= cf[0] <= X[:, 0].max()  # inferred bounds hold


def test_schema_from_data_type_codes(tmp_path: Path, fitted: Any) -> None:
    model, X, y = fitted
    csv = tmp_path / "train.csv"
    lines = [",".join([*NAMES, "y"]), "F,D,B,D,T"]
    lines += [",".join(str(int(v)) for v in [*r, t]) for r, t in zip(X, y, strict=True)]
    csv.write_text("\n".join(lines))
    schema, A = schema_from_data(csv, None, model)
    # F wins over the integral values; the T column is the target
    assert [f.type for f in schema] == ["continuous", "integer", "binary", "integer"]
    assert A.shape == X.shape
    # the last column coded E: kept as one nominal column of codes on request
    csv.write_text("\n".join([lines[0], "F,D,B,E,T", *lines[2:]]))
    schema, A = schema_from_data(csv, None, model, "codes")
    assert [f.type for f in schema] == ["continuous", "integer", "binary", "nominal"]
    assert np.array_equal(A, X)


def test_data_columns_follow_model_feature_names(tmp_path: Path) -> None:
    X, y = _data()
    model = RandomForestClassifier(4, max_depth=2, random_state=0).fit(X[:, ::-1], y)
    # as if fitted on a DataFrame with columns in reverse order
    model.feature_names_in_ = np.array(NAMES[::-1], dtype=object)
    csv = tmp_path / "train.csv"
    _write_csv(csv, X, y, two_row=False, target="label")
    schema, A = schema_from_data(csv, "label", model)
    assert schema.names == NAMES[::-1]
    assert np.array_equal(A, X[:, ::-1])


def test_pickle_needs_trust(tmp_path: Path, fitted: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.joblib"
    joblib.dump(fitted[0], path)
    out = tmp_path / "maps"
    code, _, err = _run(capsys, "build", str(path), "--out", str(out), "--no-progress")
    assert code == 1
    assert "cfmaps: error:" in err and "skops" in err and "--trust-pickle" in err
    assert not out.exists()
    code, _, err = _run(capsys, "build", str(path), "--out", str(out), "--no-progress", "--trust-pickle")
    assert code == 0, err
    assert (out / "manifest.json").exists() or any(out.iterdir())


def test_crafted_tree_is_refused(tmp_path: Path, fitted: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A skops file whose node array points out of range (predict would read out of bounds)."""
    import zipfile

    good = tmp_path / "good.skops"
    sio.dump(fitted[0], good)
    bad = tmp_path / "crafted.skops"
    patched = 0
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith(".npy"):
                arr = np.load(io.BytesIO(data), allow_pickle=False)
                if arr.dtype.names and "left_child" in arr.dtype.names and patched == 0:
                    arr["left_child"][0] = 10**9
                    buf = io.BytesIO()
                    np.save(buf, arr, allow_pickle=False)
                    data, patched = buf.getvalue(), 1
            zout.writestr(item, data)
    assert patched
    code, _, err = _run(capsys, "build", str(bad), "--out", str(tmp_path / "m"))
    assert code == 1 and "malformed tree" in err


# ------------------------------------------------------------------------------------------
# errors: non-zero exit and a clear message
# ------------------------------------------------------------------------------------------
@pytest.fixture()
def built(tmp_path: Path, model_file: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec()))
    out = tmp_path / "maps"
    assert main(["build", str(model_file), "--spec", str(spec), "--out", str(out)]) == 0
    capsys.readouterr()
    return out


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        # the HTTP API's checks and messages, with the field in front
        ('{"income": 50, "age": 30, "late": 0}', "instance.debt: feature 'debt' is missing"),
        ('{"income": 50, "age": 30, "late": 0, "debt": 1, "zip": 9}', "instance.zip: unknown feature 'zip'"),
        ("[1, 2, 3]", "instance: expected 4 feature values, got 3"),
        ("[1, 2, 3, ", "not valid JSON"),
        ('[1, "a", 0, 3]', "instance.age: feature 'age' must be a finite number"),
        ('"hello"', "JSON list or an object"),
        ("[1, 2, 0, NaN]", "instance.debt: feature 'debt' must be a finite number"),
        ("[50, 30, 0.5, 3]", "instance.late: feature 'late' = 0.5 must be an integer"),
        # what the parser refuses beyond broken JSON printed a traceback
        ("[" + "9" * 5000 + ", 30, 0, 3]", "not valid JSON: Exceeds the limit"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_query_bad_instance(
    built: Path, capsys: pytest.CaptureFixture[str], instance: str, message: str
) -> None:
    code, out, err = _run(capsys, "query", str(built), "--instance", instance)
    assert code == 1
    assert out == ""
    assert err.startswith("cfmaps: error:") and message in err


def test_query_unknown_target_and_missing_maps(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inst = "[50, 30, 0, 10]"
    code, _, err = _run(capsys, "query", str(built), "--instance", inst, "--target", "7")
    assert code == 1 and "unknown class" in err
    code, _, err = _run(capsys, "query", str(tmp_path / "nope"), "--instance", inst)
    assert code == 1 and "no maps directory" in err


def test_query_out_of_domain(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "query", str(built), "--instance", "[50, 30, 0, 1000]")
    assert code == 1 and "cfmaps: error:" in err and "debt" in err


def test_build_errors(
    tmp_path: Path, model_file: Path, fitted: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "maps")
    code, _, err = _run(capsys, "build", str(tmp_path / "missing.skops"), "--out", out)
    assert code == 1 and "model file not found" in err

    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model at all")
    code, _, err = _run(capsys, "build", str(junk), "--out", out)
    assert code == 1 and "cannot load model" in err

    bad = tmp_path / "bad.json"
    for text, message in (("{nope", "not valid JSON"),
                          ('{"features": ' + "[" * 100_000 + "]" * 100_000 + "}",
                           "nested too deeply")):
        bad.write_text(text)
        code, _, err = _run(capsys, "build", str(model_file), "--spec", str(bad), "--out", out)
        assert code == 1 and err.startswith("cfmaps: error:") and message in err, err

    code, _, err = _run(capsys, "build", str(tmp_path), "--out", out)
    assert code == 1 and "is a directory, not a model file" in err

    short = tmp_path / "short.json"
    short.write_text(json.dumps({"features": _spec()["features"][:3]}))
    code, _, err = _run(capsys, "build", str(model_file), "--spec", str(short), "--out", out)
    assert code == 1 and "3 features" in err and "4" in err

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"features": [{"name": "a", "type": "text"}]}))
    code, _, err = _run(capsys, "build", str(model_file), "--spec", str(wrong), "--out", out)
    assert code == 1 and "type must be one of" in err

    _, X, y = fitted
    csv = tmp_path / "train.csv"
    _write_csv(csv, X, y, two_row=False, target="label")
    code, _, err = _run(capsys, "build", str(model_file), "--data", str(csv), "--out", out)
    assert code == 1 and "--target-column" in err
    code, _, err = _run(
        capsys, "build", str(model_file), "--data", str(csv), "--target-column", "nope",
        "--out", out,
    )  # fmt: skip
    assert code == 1 and "no label column 'nope'" in err

    text = tmp_path / "text.csv"
    text.write_text("income,age,late,debt,label\n1,2,0,4,0\n1,old,0,4,1\n")
    code, _, err = _run(
        capsys, "build", str(model_file), "--data", str(text), "--target-column", "label",
        "--out", out,
    )  # fmt: skip
    assert code == 1 and "line 3" in err and "'age'" in err and "non-numeric" in err
    assert not Path(out).exists()


def test_build_budget_defaults_to_the_library_and_service_default(
    tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --max-rectangles, the CLI builds with DEFAULT_MAX_RECTANGLES (as the
    library and the service); with it, with the number given."""
    seen: list[Any] = []
    real = CounterfactualMaps.build.__func__  # type: ignore[attr-defined]

    def spy(cls: Any, model: Any, schema: Any = None, **kw: Any) -> Any:
        seen.append(kw["max_rectangles"])
        return real(cls, model, schema, **kw)

    monkeypatch.setattr(CounterfactualMaps, "build", classmethod(spy))
    assert main(["build", str(model_file), "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert main(["build", str(model_file), "--out", str(tmp_path / "b"), "--no-progress",
                 "--max-rectangles", "50"]) == 0
    assert seen == [DEFAULT_MAX_RECTANGLES, 50]
    assert Settings().build_max_rectangles == DEFAULT_MAX_RECTANGLES


def test_usage_errors(model_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["build", str(model_file), "--spec", "a.json", "--data", "b.csv", "--out", "x"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["build", str(model_file)])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["query", "x", "--instance", "[1]", "--norm", "l3"])
    assert exc.value.code == 2
    for k in ("0", "-1"):  # was exit 1, from the query's own check
        with pytest.raises(SystemExit) as exc:
            main(["query", "x", "--instance", "[1]", "--k", k])
        assert exc.value.code == 2 and "must be a positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    for port in ("99999", "-1"):  # 99999 listened on 34463, -1 failed inside uvicorn
        for command in ("serve", "demo"):
            with pytest.raises(SystemExit) as exc:
                main([command, "--port", port])
            assert exc.value.code == 2
            assert "must be a TCP port" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# pieces
# ------------------------------------------------------------------------------------------
def test_progress_bar_on_a_log() -> None:
    stream = io.StringIO()
    bar = ProgressBar("building maps", stream=stream, width=10)
    for f in (0.0, 0.05, 0.31, 0.3, 0.72, float("nan"), 2.0):
        bar(f)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("building maps [..........]   0%")
    assert lines[-1].startswith("building maps [##########] 100%")
    assert len(lines) == 4  # 0 %, 30 %, 70 %, 100 %: one line per tenth reached, no repeats


def test_demo_data_and_spec() -> None:
    from app.demo import CLASS_NAMES, DATA_FILE, demo_spec, load_credit
    from maps_core import FeatureSchema

    assert DATA_FILE.is_file() and (DATA_FILE.parent / "ATTRIBUTION.md").is_file()
    X, y, schema = load_credit()
    assert X.shape == (29986, 8) and set(np.unique(y)) == {0, 1}
    assert {f.type for f in schema} == {"integer", "binary"}
    assert [f.name for f in schema if not f.mutable] == ["AGE"]
    spec = demo_spec(schema)
    assert spec["classes"] == CLASS_NAMES
    assert FeatureSchema.from_dicts(json.loads(json.dumps(spec))["features"]) == schema


def _run_demo(tmp_path: Path, *args: str) -> tuple[str, int, Path]:
    """Run ``cfmaps demo`` until it prints its API docs line, check the curl command it
    printed, then stop it with SIGTERM: its output, its exit status and its TMPDIR."""
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CFMAPS_")}
    root = str(Path(__file__).resolve().parents[2])  # importable without an install too
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    scratch = tmp_path / "tmp"  # the demo's temporary data dir goes here
    scratch.mkdir(exist_ok=True)
    env["TMPDIR"] = str(scratch)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "demo", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("API docs:"):
                break
        text = "".join(lines)
        assert "API docs:" in text, text + (proc.stderr.read() if proc.poll() is not None else "")
        m = re.search(r"curl -s -X POST (\S+) \\\n.*-d '(.*)' \| python3", text, re.S)
        assert m, text
        url, body = m.group(1), json.loads(m.group(2))
        assert url.startswith(f"http://127.0.0.1:{port}/v1/models/")
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["prediction"] == "default" and doc["target"] == "no default"
        assert doc["optimal"] is True and doc["changes"]
        assert doc["counterfactual"]["AGE"] == body["instance"]["AGE"]  # immutable
        assert "answer:" in text
        if "--data-dir" not in args:  # a temporary one, until it stops
            assert any(p.name.startswith("cfmaps-demo-") for p in scratch.iterdir())
    finally:
        # SIGTERM, as docker stop and systemd send: the demo ends by it, as uvicorn does
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return text, proc.returncode, scratch


@pytest.mark.slow
def test_demo_end_to_end(tmp_path: Path) -> None:
    """``cfmaps demo`` trains, uploads, builds, serves and prints a working curl command;
    stopped, it takes its temporary data dir (the built maps) with it."""
    import signal

    text, status, scratch = _run_demo(tmp_path)
    assert "reusing" not in text
    assert status == -signal.SIGTERM
    # its build started multiprocessing's forkserver, whose socket directory (pymp-*) it
    # removes too: Python's exit handlers do not run when a process ends by its signal
    assert [p.name for p in scratch.iterdir()
            if p.name.startswith(("cfmaps-", "pymp-"))] == []


@pytest.mark.slow
def test_demo_reuses_its_model_in_a_data_dir(tmp_path: Path) -> None:
    """With ``--data-dir`` a second run serves the model the first one built (it uploaded
    a new copy at every start: the stored models were still loading when it looked)."""
    import re

    first, _, _ = _run_demo(tmp_path, "--data-dir", str(tmp_path / "data"))
    second, _, _ = _run_demo(tmp_path, "--data-dir", str(tmp_path / "data"))
    model_id = re.search(r"uploaded the model as (\w+)", first)
    assert model_id, first
    assert f"reusing the demo model {model_id.group(1)}" in second, second
    assert "uploaded the model" not in second
    assert [p.name for p in (tmp_path / "data" / "models").iterdir()] == [model_id.group(1)]


def test_query_options_and_l0(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--options carries the HTTP body's constraints; l0 counts changed features."""
    inst = '{"income": 20, "age": 30, "late": 1, "debt": 40}'
    free = _query(capsys, built, "--instance", inst, "--norm", "l0")
    assert free["feasible"] and free["distance"] == len(free["changes"])
    fixed = sorted(free["changes"])[:1]
    res = _query(capsys, built, "--instance", inst, "--norm", "l0",
                 "--options", json.dumps({"immutable": fixed}))
    if res["feasible"]:
        assert not set(fixed) & set(res["changes"])
    else:
        assert fixed[0] in res["reason"]
    code, out, err = _run(capsys, "query", str(built), "--instance", inst, "--options", '{"k": 3}')
    assert code == 1 and "unknown key(s) ['k']" in err
    deep = '{"immutable": ' + "[" * 100_000 + "]" * 100_000 + "}"
    code, out, err = _run(capsys, "query", str(built), "--instance", inst, "--options", deep)
    assert code == 1 and err.startswith("cfmaps: error: --options is nested too deeply"), err


def test_query_time_limit_options(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--options also carries the time limit and what happens beyond it."""
    inst = '{"income": 20, "age": 30, "late": 1, "debt": 40}'
    exact = _query(capsys, built, "--instance", inst)
    res = _query(capsys, built, "--instance", inst,
                 "--options", '{"max_seconds": 5, "on_budget": "best"}')
    assert res["optimal"] is True and res["lower_bound"] == res["distance"] == exact["distance"]
    code, out, err = _run(capsys, "query", str(built), "--instance", inst,
                          "--options", '{"on_budget": "maybe"}')
    assert code == 1 and "on_budget" in err


def test_query_into_a_closed_pipe_exits_quietly(built: Path) -> None:
    """`cfmaps query ... | head -1`: the reader leaves early; no traceback."""
    import subprocess

    cmd = [sys.executable, "-m", "app.cli", "query", str(built), "--instance",
           '{"income": 20, "age": 30, "late": 1, "debt": 40}', "--k", "5", "--pretty"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the answer is written: EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err, err


def test_a_setting_out_of_range_is_an_error_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CFMAPS_MAX_BATCH", "0")
    code, _, err = _run(capsys, "serve", "--port", "1", "--data-dir", str(tmp_path))
    assert code == 1
    assert err == "cfmaps: error: CFMAPS_MAX_BATCH: Input should be greater than 0\n"


def test_a_worker_count_past_its_bound_is_one_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """CFMAPS_WORKERS had no upper bound: 100000 forked processes until the machine
    stalled (QA, session 61)."""
    monkeypatch.setenv("CFMAPS_WORKERS", "100000")
    code, _, err = _run(capsys, "serve", "--port", "1", "--data-dir", str(tmp_path))
    assert (code, err) == (1, "cfmaps: error: CFMAPS_WORKERS: Input should be less than or "
                              "equal to 64\n")
    monkeypatch.delenv("CFMAPS_WORKERS")
    code, _, err = _run(capsys, "serve", "--port", "1", "--data-dir", str(tmp_path),
                        "--workers", "65")
    assert (code, err) == (1, "cfmaps: error: --workers must be between 1 and 64\n")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_metrics_directory_that_cannot_be_written_is_one_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    workers: str
) -> None:
    """An operator's PROMETHEUS_MULTIPROC_DIR that is no directory: every process failed
    at its first metric, a traceback each."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "absent"))
    code, _, err = _run(capsys, "serve", "--port", "1", "--data-dir", str(tmp_path / "data"),
                        "--workers", workers)
    assert (code, err) == (1, f"cfmaps: error: PROMETHEUS_MULTIPROC_DIR={tmp_path / 'absent'}:"
                              " not a writable directory\n")


def test_serve_names_a_bad_log_level(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # --log-level bogus was a 19-line traceback (ValueError: Unknown level)
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error
        main(["serve", "--port", "1", "--data-dir", str(tmp_path), "--log-level", "bogus"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'bogus'" in err


def test_build_out_never_replaces_what_is_not_maps(
    tmp_path: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cfmaps build --out PATH` replaced whatever PATH was: a project folder, a file, even
    the model file being read. Now refused at once (exit 1), PATH untouched; maps built
    before are replaced."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "code.py").write_text("precious")
    before = model_file.read_bytes()
    for out in (project, model_file):
        code, _, err = _run(capsys, "build", str(model_file), "--out", str(out), "--no-progress")
        assert code == 1
        assert err.startswith("cfmaps: error:") and "maps replace only maps" in err
    assert (project / "code.py").read_text() == "precious"
    assert model_file.read_bytes() == before
    maps_dir = tmp_path / "maps"
    for _ in range(2):
        code, _, err = _run(capsys, "build", str(model_file), "--out", str(maps_dir), "--no-progress")
        assert code == 0, err


def test_paths_the_cli_cannot_use_are_one_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    model_file: Path,
) -> None:
    """A data dir that is a file, and an --out nothing can be written under, were
    tracebacks (the first as 'Application startup failed', exit 3)."""
    a_file = tmp_path / "data"
    a_file.write_text("not a directory")
    code, _, err = _run(capsys, "serve", "--port", "1", "--data-dir", str(a_file))
    assert code == 1 and err.startswith("cfmaps: error: data dir") and "Traceback" not in err
    blocked = a_file / "maps"  # under a file: no directory can be made there
    code, _, err = _run(capsys, "build", str(model_file), "--out", str(blocked), "--no-progress")
    assert code == 1 and err.startswith("cfmaps: error:") and "Traceback" not in err
    monkeypatch.setenv("CFMAPS_BUILD_MAX_MEMORY", "1e400")
    code, _, err = _run(capsys, "serve", "--port", "1", "--data-dir", str(tmp_path / "d"))
    assert code == 1 and err.startswith("cfmaps: error: CFMAPS_BUILD_MAX_MEMORY")
    with pytest.raises(SystemExit) as exc:
        main(["build", str(model_file), "--out", str(tmp_path / "m"), "--max-memory", "1e400"])
    assert exc.value.code == 2


# -- README's command-line examples run as written ---------------------------------------------
def _readme_commands() -> list[list[str]]:
    """The ``cfmaps build`` and ``cfmaps query`` lines of README's "Command line" block as
    argument lists: continuation lines joined, comments dropped, each optional ``[...]``
    group kept and the first of its ``a|b`` choices taken."""
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split("## Command line", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] not in (["cfmaps", "build"], ["cfmaps", "query"]):
            continue
        argv, opened = [], False
        for w in words[1:]:
            if w.startswith("[-") and not opened:  # (not a JSON list)
                w, opened = w[1:], True
            if opened and w.endswith("]"):
                w, opened = w[:-1], False
            argv.append(w.split("|")[0] if w.startswith(("l1|", "one-hot|")) else w)
        assert not opened, line
        commands.append(argv)
    return commands


def test_readme_command_line_examples_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every build and query line of README's "Command line" section, with its optional
    flags, runs on a model of the features it names (its --options named a feature the
    instance did not have, so it could only fail)."""
    commands = _readme_commands()
    assert [c[0] for c in commands].count("build") == 2 and len(commands) >= 5, commands
    rng = np.random.default_rng(0)
    n = 400
    X = np.column_stack([rng.integers(0, 100, n) * 5000.0, rng.integers(21, 70, n),
                         rng.integers(0, 2, n)]).astype(float)
    y = ((X[:, 2] == 1) & (X[:, 0] < 150_000)).astype(int)
    model = RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0).fit(X, y)
    monkeypatch.chdir(tmp_path)
    sio.dump(model, tmp_path / "model.skops")
    (tmp_path / "spec.json").write_text(json.dumps({"features": [
        {"name": "LIMIT_BAL", "type": "continuous", "lower": 0, "upper": 1_000_000},
        {"name": "AGE", "type": "integer", "lower": 18, "upper": 100},
        {"name": "PAY_0_LATE", "type": "binary"}]}))
    rows = ["LIMIT_BAL,AGE,PAY_0_LATE,DEFAULT", "F,D,B,T"]
    rows += [f"{a:g},{b:g},{c:g},{t}" for (a, b, c), t in zip(X, y, strict=True)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "instance.json").write_text('{"LIMIT_BAL": 50000, "AGE": 26, "PAY_0_LATE": 1}')
    assert model.predict([[50000, 26, 1]])[0] == 1  # so that target 0 is another class
    for argv in commands:
        code, out, err = _run(capsys, *argv)
        assert code == 0, (argv, err)
        if argv[0] == "query":
            doc = json.loads(out)
            assert doc["feasible"], (argv, doc)
            cf = [doc["counterfactual"][f] for f in ("LIMIT_BAL", "AGE", "PAY_0_LATE")]
            assert model.predict([cf])[0] == 0, (argv, doc)
