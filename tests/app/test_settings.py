"""Settings that take units or derive their default from the machine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import Settings, parse_byte_size, query_threads, unknown_settings
from maps_core import available_memory


@pytest.mark.parametrize(
    ("text", "want"),
    [("2147483648", 2 << 30), ("2G", 2 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29),
     ("64k", 64 << 10), (" 1T ", 1 << 40)],
)
def test_byte_sizes(text: str, want: int) -> None:
    assert parse_byte_size(text) == want


@pytest.mark.parametrize("field", ["build_max_memory", "query_max_memory"])
def test_memory_budgets_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                             field: str) -> None:
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    var = f"CFMAPS_{field.upper()}"
    monkeypatch.setenv(var, "3G")
    s = Settings()
    effective = s.effective_build_memory if field.startswith("build") else s.effective_query_memory
    assert getattr(s, field) == 3 << 30 and effective() == 3 << 30
    # 1e400 and inf overflowed int() (a traceback); past 1 PiB a build worker's address
    # limit overflowed setrlimit, so every build failed "for memory"
    for bad in ("lots", "-1G", "0", "1e400", "infG", "nan", "9000000T", str(1 << 60)):
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValidationError):
            Settings()
    monkeypatch.setenv(var, "")  # set but empty: the computed default
    assert getattr(Settings(), field) is None


@pytest.mark.parametrize("field", ["max_body_bytes", "max_upload_bytes"])
def test_body_limits_take_byte_sizes(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                     field: str) -> None:
    """README: byte sizes take suffixes and go up to 1024T; these two took a plain integer
    only (``4M`` stopped the service) and any integer (1e20 bytes, no limit in effect)."""
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    var = f"CFMAPS_{field.upper()}"
    monkeypatch.setenv(var, "4M")
    assert getattr(Settings(), field) == 4 << 20
    monkeypatch.setenv(var, "1048576")
    assert getattr(Settings(), field) == 1 << 20
    for bad in ("lots", "-1", "0", "99999999999999999999", "2000T"):
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValidationError):
            Settings()


def test_query_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    assert Settings().query_threads is None  # the engine's default
    monkeypatch.setenv("CFMAPS_QUERY_THREADS", "3")
    assert Settings().query_threads == 3
    for bad in ("0", "-1", "65", "two"):
        monkeypatch.setenv("CFMAPS_QUERY_THREADS", bad)
        with pytest.raises(ValidationError):
            Settings()


def test_default_query_memory_is_a_third_of_the_memory_shared_by_the_query_threads(
        tmp_path) -> None:
    assert Settings(data_dir=tmp_path).effective_query_memory() == (
        available_memory() // (3 * query_threads()))


def test_default_build_memory_is_half_the_memory_shared_by_the_builds(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import maps_core._memory

    monkeypatch.setattr(maps_core._memory, "free_memory", lambda: None)  # not read twice
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


@pytest.mark.parametrize(("var", "value", "want"), [
    ("CFMAPS_QUERY_MAX_SECONDS", "", None),  # documented: empty for no limit
    ("CFMAPS_BUILD_MAX_SECONDS", " ", None),
    ("CFMAPS_BUILD_MAX_RECTANGLES", "", None),
    ("CFMAPS_RATE_LIMIT_PER_MINUTE", "", None),
    ("CFMAPS_ADMIN_TOKEN", "adm\n", "adm"),  # a Secret from a file written by `echo`
    ("CFMAPS_ADMIN_TOKEN", "  adm ", "adm"),
    ("CFMAPS_ADMIN_TOKEN", "\n", None),
    ("CFMAPS_MAX_K", "1000", 1000),
    ("CFMAPS_SYNC_INTERVAL_SECONDS", "0.01", 0.01),
    ("CFMAPS_SYNC_INTERVAL_SECONDS", "3600", 3600),
    ("CFMAPS_QUERY_ON_BUDGET", "best", "best"),
])
def test_settings_read_as_documented(monkeypatch: pytest.MonkeyPatch, tmp_path, var: str,
                                     value: str, want: object) -> None:
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(var, value)
    s = Settings()
    got = s.admin_secret if var == "CFMAPS_ADMIN_TOKEN" else getattr(s, var[7:].lower())
    assert got == want


@pytest.mark.parametrize(("var", "value"), [
    ("CFMAPS_MAX_K", "1001"),  # the engine answers at most 1,000 a query
    ("CFMAPS_SYNC_INTERVAL_SECONDS", "1e-9"),  # an idle process kept half a core busy
    ("CFMAPS_SYNC_INTERVAL_SECONDS", "inf"),  # replicas never saw each other's deletes
    ("CFMAPS_SYNC_INTERVAL_SECONDS", "3601"),
    # HTTP headers arrive as Latin-1: a client sending UTF-8 never matched (403 always)
    ("CFMAPS_API_TOKENS", "api-\u00fc"),
    ("CFMAPS_API_TOKENS", "ok,has space"),
    ("CFMAPS_ADMIN_TOKEN", "adm-\u00fc"),
    # every build then failed with a misleading reason (setrlimit's overflow, or a memory
    # budget of 0 bytes each)
    ("CFMAPS_BUILD_JOBS", "100000000000"),
    ("CFMAPS_BUILD_WORKERS", "100000000000"),
    ("CFMAPS_QUERY_ON_BUDGET", "approximate"),
    # accepted, then /openapi.json was a 500 on every request (an infinite maximum is no
    # JSON); empty is the way to say "no limit"
    ("CFMAPS_QUERY_MAX_SECONDS", "inf"),
    ("CFMAPS_BUILD_MAX_SECONDS", "Infinity"),
    ("CFMAPS_SHUTDOWN_GRACE_SECONDS", "inf"),
])
def test_settings_out_of_range_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path, var: str,
                                           value: str) -> None:
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(var, value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_variable_set_but_empty_is_unset(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """As documented, for every setting: CFMAPS_DATA_DIR= was "." (models written outside a
    container's volume), CFMAPS_MAX_BATCH=, CFMAPS_ROLE=, CFMAPS_WORKERS=, CFMAPS_UI= ...
    stopped the service at start."""
    for other in Settings.model_fields:
        monkeypatch.delenv(f"CFMAPS_{other.upper()}", raising=False)
    default = Settings()
    monkeypatch.setenv(f"CFMAPS_{name.upper()}", "")
    got = getattr(Settings(), name)
    if name in ("query_max_seconds", "build_max_seconds", "build_max_rectangles"):
        assert got is None  # documented: empty for no limit
    else:
        assert got == getattr(default, name)


def test_unknown_cfmaps_variables_are_named_with_the_setting_they_may_mean() -> None:
    # CFMAPS_API_TOKEN (the README's shell variable) set for CFMAPS_API_TOKENS left the
    # service open without a word
    env = {"CFMAPS_API_TOKEN": "s3cret", "CFMAPS_MAX_BATCH": "5", "CFMAPS_RATE_LIMIT": "5",
           "CFMAPS_SOMETHING_ELSE": "1", "PATH": "/bin"}
    got = unknown_settings(env)
    assert len(got) == 3
    assert got[0].startswith("CFMAPS_API_TOKEN is set but names no setting")
    assert got[0].endswith("did you mean CFMAPS_API_TOKENS?")
    assert got[1].endswith("did you mean CFMAPS_RATE_LIMIT_PER_MINUTE?")
    assert got[2].startswith("CFMAPS_SOMETHING_ELSE") and "did you" not in got[2]
