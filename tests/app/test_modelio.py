"""Safe model-file loading: format sniffing, skops trust list, pickle policy, zip bombs."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import joblib
import pytest
import skops.io as sio
from sklearn.ensemble import GradientBoostingClassifier
from svc_helpers import Fitted

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
        (b"xyz", None),
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


def test_skops_with_untrusted_types_is_refused(tmp_path: Path) -> None:
    # A function reference is exactly what a malicious file would smuggle in.
    data = sio.dumps({"f": print, "g": GradientBoostingClassifier})
    with pytest.raises(UnsafeModelFileError, match="builtins.print"):
        load_model_file(_write(tmp_path, data), trust_pickle=True)


def test_zip_bomb_guard(tmp_path: Path, rf: Fitted) -> None:
    p = _write(tmp_path, rf.skops)
    with pytest.raises(PayloadTooLargeError):
        load_model_file(p, trust_pickle=False, max_unpacked_bytes=100)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("schema.json", b"{" + b" " * 5_000_000 + b"}")
    with pytest.raises(PayloadTooLargeError):
        load_model_file(
            _write(tmp_path, buf.getvalue()), trust_pickle=False, max_unpacked_bytes=1_000_000
        )


def test_zip_that_is_not_skops(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(InvalidInputError, match="skops"):
        load_model_file(_write(tmp_path, buf.getvalue()), trust_pickle=False)


def test_pickle_and_joblib_policy(tmp_path: Path, rf: Fitted) -> None:
    files = {
        "pickle": pickle.dumps(rf.model),
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


def _joblib_bytes(tmp_path: Path, rf: Fitted, compress: object) -> bytes:
    p = tmp_path / f"m-{abs(hash(str(compress)))}.joblib"
    joblib.dump(rf.model, p, compress=compress)
    return p.read_bytes()
