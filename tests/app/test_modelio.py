"""Safe model-file loading: format sniffing, skops trust list, pickle policy, zip bombs."""

from __future__ import annotations

import io
import pickle
import sys
import zipfile
from pathlib import Path

import joblib
import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import GradientBoostingClassifier
from svc_helpers import Fitted, Service, upload

from app.errors import InvalidInputError, PayloadTooLargeError, UnsafeModelFileError
from app.modelio import detect_format, load_model_file


def _write(tmp_path: Path, data: bytes, name: str = "m.bin") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(
    ("head", "fmt"),
    [
        (b"PK\x03\x04rest", "skops"),
        (b"\x80\x04\x95", "pickle"),
        (b"\x80\x02", "pickle"),
        (b"\x1f\x8b\x08", "pickle"),
        (b"x\x9c", "pickle"),
        (b"x\x01", "pickle"),
        (b"BZh9", "pickle"),
        (b"\xfd7zXZ\x00", "pickle"),
        (b"ccopy_reg\n_reconstructor\np0\n(csklearn", "pickle"),  # protocol 0/1
        (b"(csklearn.ensemble._forest\nRandomForestClassifier\n", "pickle"),
        (b"xyz", None),
        (b"c\n", None),
        (b"certainly not\na model\n", None),
        (b"{}", None),
        (b"", None),
    ],
)
def test_detect_format(head: bytes, fmt: str | None) -> None:
    assert detect_format(head) == fmt


def test_skops_loads_tree_models(tmp_path: Path, rf: Fitted, gb3: Fitted) -> None:
    for fitted in (rf, gb3):
        model, fmt = load_model_file(_write(tmp_path, fitted.skops), trust_pickle=False)
        assert fmt == "skops"
        assert (model.predict(fitted.X) == fitted.model.predict(fitted.X)).all()


@pytest.mark.parametrize("step", ["get_untrusted_types", "load"])
def test_skops_load_survives_the_cpython_ast_race(
    tmp_path: Path, rf: Fitted, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """CPython 3.11 (gh-106905) can fail an ast.parse with a spurious SystemError while
    another thread parses too; a skops load that meets it is tried again. Any other
    SystemError is still the file's error."""
    path = tmp_path / "model.skops"
    sio.dump(rf.model, path)
    real = getattr(sio, step)
    calls = []

    def flaky(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=102, after=43)")
        return real(*args, **kwargs)

    monkeypatch.setattr(sio, step, flaky)
    model, fmt = load_model_file(path, trust_pickle=False)
    assert fmt == "skops" and len(calls) == 2
    np.testing.assert_array_equal(model.predict(rf.X), rf.model.predict(rf.X))

    def broken(*args: object, **kwargs: object) -> object:
        raise SystemError("something else")

    monkeypatch.setattr(sio, step, broken)
    with pytest.raises(InvalidInputError, match="something else"):
        load_model_file(path, trust_pickle=False)


def test_skops_with_untrusted_types_is_refused(tmp_path: Path) -> None:
    # A function reference is exactly what a malicious file would smuggle in.
    data = sio.dumps({"f": print, "g": GradientBoostingClassifier})
    with pytest.raises(UnsafeModelFileError, match="builtins.print"):
        load_model_file(_write(tmp_path, data), trust_pickle=True)


def test_a_partial_of_an_untrusted_function_is_refused(tmp_path: Path) -> None:
    """functools.partial is allowed for HistGradientBoosting's preprocessor, whose
    partial wraps check_array: the function a partial wraps is checked like any type."""
    import functools
    import os

    data = sio.dumps({"p": functools.partial(os.system, "true")})
    with pytest.raises(UnsafeModelFileError, match="system"):
        load_model_file(_write(tmp_path, data), trust_pickle=True)


def test_zip_bomb_guard(tmp_path: Path, rf: Fitted) -> None:
    p = _write(tmp_path, rf.skops)
    with pytest.raises(PayloadTooLargeError):
        load_model_file(p, trust_pickle=False, max_unpacked_bytes=100)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("schema.json", b"{" + b" " * 5_000_000 + b"}")
    with pytest.raises(PayloadTooLargeError):
        load_model_file(_write(tmp_path, buf.getvalue()), trust_pickle=False, max_unpacked_bytes=1_000_000)


def test_a_schema_json_past_its_own_cap_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """Within the archive's unpacked limit, a huge schema.json would still be parsed whole
    in the API process (about 5x its size in objects): refused by its own size."""
    from app import modelio

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("schema.json", b"[" + b"0," * (modelio.SKOPS_SCHEMA_MAX_BYTES // 2) + b"0]")
    data = buf.getvalue()
    assert len(data) < modelio.SKOPS_SCHEMA_MAX_BYTES // 100  # a small upload
    with pytest.raises(PayloadTooLargeError, match="schema.json"):
        load_model_file(_write(tmp_path, data), trust_pickle=False, max_unpacked_bytes=1 << 40)


def test_zip_that_is_not_skops(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(InvalidInputError, match="skops"):
        load_model_file(_write(tmp_path, buf.getvalue()), trust_pickle=False)


def test_pickle_and_joblib_policy(tmp_path: Path, rf: Fitted) -> None:
    files = {
        "pickle": pickle.dumps(rf.model),
        # protocols 0 and 1 have no header byte: they open with the class's GLOBAL opcode
        "pickle-0": pickle.dumps(rf.model, protocol=0),
        "pickle-1": pickle.dumps(rf.model, protocol=1),
        "joblib": _joblib_bytes(tmp_path, rf, compress=0),
        "joblib-z": _joblib_bytes(tmp_path, rf, compress=3),
        "joblib-gz": _joblib_bytes(tmp_path, rf, compress=("gzip", 3)),
    }
    for name, data in files.items():
        p = _write(tmp_path, data, f"{name}.skops")  # extension lies on purpose
        with pytest.raises(UnsafeModelFileError, match=r"skops\.io\.dump"):
            load_model_file(p, trust_pickle=False)
        model, fmt = load_model_file(p, trust_pickle=True)
        assert fmt == "pickle", name
        assert (model.predict(rf.X) == rf.model.predict(rf.X)).all()


def test_trusted_but_broken_pickle_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="pickle"):
        load_model_file(_write(tmp_path, b"\x80\x04garbage"), trust_pickle=True)


XGB_BINARY = sorted((Path(__file__).parents[1] / "core/data/xgboost_old/binary").glob("*.model"))


@pytest.mark.parametrize("path", XGB_BINARY, ids=lambda p: p.stem)
@pytest.mark.parametrize("trust_pickle", [False, True])
def test_xgboost_binary_format_is_named(path: Path, trust_pickle: bool) -> None:
    """XGBoost's binary format (save_model to a name without .json/.ubj), of 0.80 to 1.6:
    refused by name, with how to re-save it, not as an unknown file, nor as a pickle or a
    compressed joblib file when its first bytes (the base score, before 1.1) look like
    one (the *_magic files: an UnsafeModelFileError, or a KeyError from unpickling)."""
    assert len(XGB_BINARY) == 9
    with pytest.raises(InvalidInputError, match=r"XGBoost's binary format.*model\.json") as info:
        load_model_file(path, trust_pickle=trust_pickle)
    assert type(info.value) is InvalidInputError


@pytest.mark.parametrize("head", [
    b"binf" + bytes(64),  # no names
    b"binf" + bytes(132) + (15).to_bytes(8, "little") + b"binary:logistic"
    + (6).to_bytes(8, "little") + b"gbtreX",  # a booster no XGBoost wrote
    bytes(136) + (99).to_bytes(8, "little") + b"binary:logistic",  # the wrong length
    bytes(136) + (15).to_bytes(8, "little") + b"Binary:Logistic"
    + (6).to_bytes(8, "little") + b"gbtree",
])
def test_only_xgboost_binary_files_are_named_so(tmp_path: Path, head: bytes) -> None:
    with pytest.raises(InvalidInputError, match="neither a skops file"):
        load_model_file(_write(tmp_path, head + bytes(300)), trust_pickle=True)


def test_a_pickle_of_another_xgboost_version_says_so(tmp_path: Path) -> None:
    """XGBoost 1.3.3 pickled this wrapper; the installed XGBoost fails to unpickle it with
    a native stack trace (library paths, addresses), which stays out of the answer."""
    pytest.importorskip("xgboost")
    old = Path(__file__).parents[1] / "core/data/xgboost_old/1.3.3_wrapper.joblib"
    with pytest.raises(InvalidInputError) as info:
        load_model_file(old, trust_pickle=True)
    message = str(info.value)
    assert "XGBoostError" in message and "another version of xgboost" in message
    assert "save_model('model.json')" in message
    assert "Stack trace" not in message and "\n" not in message and "0x" not in message


def _joblib_bytes(tmp_path: Path, rf: Fitted, compress: object) -> bytes:
    p = tmp_path / f"m-{abs(hash(str(compress)))}.joblib"
    joblib.dump(rf.model, p, compress=compress)
    return p.read_bytes()


def _crafted(data: bytes, field: str, value: int) -> bytes:
    """Rewrite one entry of the first tree's node array inside a skops archive."""
    src, out = io.BytesIO(data), io.BytesIO()
    patched = False
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w") as zout:
        for item in zin.infolist():
            blob = zin.read(item.filename)
            if item.filename.endswith(".npy") and not patched:
                arr = np.load(io.BytesIO(blob), allow_pickle=False)
                if arr.dtype.names and field in arr.dtype.names:
                    arr[field][0] = value
                    buf = io.BytesIO()
                    np.save(buf, arr, allow_pickle=False)
                    blob, patched = buf.getvalue(), True
            zout.writestr(item, blob)
    assert patched
    return out.getvalue()


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("left_child", 10**9, "out of range"),
        ("right_child", 10**9, "out of range"),
        ("left_child", 0, "cycle"),
        ("right_child", -1, "exactly one child"),
        ("feature", 99, "feature out of range"),
        ("feature", -5, "feature out of range"),
    ],
)
def test_crafted_trees_are_refused(
    tmp_path: Path, rf: Fitted, service: Service, field: str, value: int, problem: str
) -> None:
    # sklearn's compiled predict trusts these arrays: out of range reads segfault the
    # server, a cycle loops forever. They must be refused before any predict call.
    data = _crafted(rf.skops, field, value)
    with pytest.raises(InvalidInputError, match=problem):
        load_model_file(_write(tmp_path, data), trust_pickle=False)
    r = upload(service.client, data)
    assert r.status_code == 422 and r.json()["field"] == "model"
    assert "malformed tree" in r.json()["message"]


@pytest.mark.parametrize(
    "head",
    [b'{\n  "learner": {', b'\n\t {"learner": {', b'\xef\xbb\xbf{"learner": {',
     b"\xef\xbb\xbf\r\n" + b" " * 100 + b'{\n' + b" " * 100 + b'"learner": {',
     b"{U\x07learner{", b"{L\x00\x00\x00\x00\x00\x00\x00\x07learner{"],
)
def test_xgboost_json_is_detected_pretty_printed_too(head: bytes) -> None:
    assert detect_format(head) == "xgboost"


def _xgboost_json(tmp_path: Path) -> dict:
    import json

    xgb = pytest.importorskip("xgboost")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    clf = xgb.XGBClassifier(n_estimators=3, max_depth=2, random_state=0)
    clf.fit(X, (X[:, 0] > 0).astype(int)).save_model(tmp_path / "m.json")
    return json.loads((tmp_path / "m.json").read_bytes())


def test_pretty_printed_xgboost_json_loads(tmp_path: Path) -> None:
    import json

    doc = _xgboost_json(tmp_path)
    X = np.random.default_rng(1).normal(size=(300, 3))
    want = load_model_file(_write(tmp_path, json.dumps(doc).encode()), trust_pickle=False)[0].predict(X)
    for blob in (b"\n" + json.dumps(doc, indent=2).encode(),
                 b"\xef\xbb\xbf" + json.dumps(doc, indent=4).encode()):
        model, fmt = load_model_file(_write(tmp_path, blob), trust_pickle=False)
        assert fmt == "xgboost" and np.array_equal(model.predict(X), want)


def test_hostile_native_files_are_bad_input_not_500(tmp_path: Path, service: Service) -> None:
    """Integers beyond int64 and tiny files that claim huge containers, features or
    classes: the adapters' malformed-model error (422 naming ``model``), at once."""
    import json
    import struct

    doc = _xgboost_json(tmp_path)
    bigint = json.loads(json.dumps(doc))
    bigint["learner"]["gradient_booster"]["model"]["trees"][0]["split_indices"][0] = 10**30
    features = json.loads(json.dumps(doc))
    features["learner"]["learner_model_param"]["num_feature"] = "1000000000"
    classes = json.loads(json.dumps(doc))
    classes["learner"]["learner_model_param"]["num_class"] = "1000000"
    classes["learner"]["objective"]["name"] = "multi:softprob"
    lgb_head = ("tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n"
                "max_feature_idx=0\nobjective=binary sigmoid:{s}\nfeature_names=a\n\n"
                "Tree=0\nnum_leaves=2\nnum_cat=0\nsplit_feature={f}\nthreshold=0.5\n"
                "decision_type=2\nleft_child=-1\nright_child=-2\nleaf_value=0.1 -0.1\n\nend of trees\n")
    cases = [
        (json.dumps(bigint).encode(), "malformed tree 0"),
        (json.dumps(features).encode(), "1000000000 features"),
        (json.dumps(classes).encode(), "1000000 classes"),
        (b"{U\x07learner[$Z#L" + struct.pack(">q", 2**62) + b"}", "container of"),
        (lgb_head.format(s=1, f=10**23).encode(), "out of range"),
        (lgb_head.format(s=-1, f=0).encode(), "sigmoid"),
    ]
    sound = _write(tmp_path, lgb_head.format(s=1, f=0).encode())
    assert load_model_file(sound, trust_pickle=False)[1] == "lightgbm"
    for blob, words in cases:
        with pytest.raises(InvalidInputError, match=words):
            load_model_file(_write(tmp_path, blob), trust_pickle=False)
        r = upload(service.client, blob)
        assert r.status_code == 422 and r.json()["field"] == "model", r.text
        assert words in r.json()["message"]


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_trusted_pickle_of_a_library_not_installed_says_how_to_send_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str) -> None:
    """The ``[service]`` install has neither library: their pickles failed with a bare
    ``No module named 'xgboost'``. The answer now says what to install, or to send the
    library's own model file, which the service reads without it."""
    import lightgbm
    import xgboost

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 3)), np.arange(60) % 2
    model = (xgboost.XGBClassifier(n_estimators=2, max_depth=2) if library == "xgboost"
             else lightgbm.LGBMClassifier(n_estimators=2, num_leaves=3, verbose=-1)).fit(X, y)
    path = _write(tmp_path, pickle.dumps(model))
    for name in [m for m in sys.modules if m.split(".")[0] == library]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(InvalidInputError, match=rf"needs {library}, which this service does "
                       rf"not have \(pip install {library} beside it\), or send") as err:
        load_model_file(path, trust_pickle=True)
    assert "save_model" in str(err.value)
