"""Settings that take units or derive their default from the machine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import Settings, parse_byte_size, query_threads
from maps_core import available_memory


@pytest.mark.parametrize(
    ("text", "want"),
    [("2147483648", 2 << 30), ("2G", 2 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29),
     ("64k", 64 << 10), (" 1T ", 1 << 40)],
)
def test_byte_sizes(text: str, want: int) -> None:
    assert parse_byte_size(text) == want


def test_build_max_memory_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CFMAPS_BUILD_MAX_MEMORY", "3G")
    s = Settings()
    assert s.build_max_memory == 3 << 30 and s.effective_build_memory() == 3 << 30
    for bad in ("lots", "-1G", "0"):
        monkeypatch.setenv("CFMAPS_BUILD_MAX_MEMORY", bad)
        with pytest.raises(ValidationError):
            Settings()


def test_query_max_memory_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CFMAPS_QUERY_MAX_MEMORY", "256M")
    s = Settings()
    assert s.query_max_memory == 256 << 20 and s.effective_query_memory() == 256 << 20
    for bad in ("lots", "-1G", "0"):
        monkeypatch.setenv("CFMAPS_QUERY_MAX_MEMORY", bad)
        with pytest.raises(ValidationError):
            Settings()


def test_default_query_memory_is_a_third_of_the_memory_shared_by_the_query_threads(
        tmp_path) -> None:
    assert Settings(data_dir=tmp_path).effective_query_memory() == (
        available_memory() // (3 * query_threads()))


def test_default_build_memory_is_half_the_memory_shared_by_the_builds(tmp_path) -> None:
    one = Settings(data_dir=tmp_path).effective_build_memory()
    assert one == available_memory() // 2
    assert Settings(data_dir=tmp_path, build_workers=4).effective_build_memory() == one // 4


@pytest.mark.parametrize("freeze", [False, True])
def test_gc_freeze_hides_the_startup_heap_from_the_collector(tmp_path, freeze: bool) -> None:
    import gc

    from svc_helpers import start_service

    gc.unfreeze()
    try:
        with start_service(tmp_path / "data", gc_freeze=freeze) as svc:
            assert svc.client.get("/readyz").status_code == 200
            frozen = gc.get_freeze_count()
        # the modules, the app and its settings: well over 10k objects when frozen
        assert (frozen > 10_000) if freeze else frozen == 0
    finally:
        gc.unfreeze()  # the rest of the test process collects as usual
