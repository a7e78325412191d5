"""Bearer tokens for management and queries, and the loopback rule."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.routing import APIRoute
from svc_helpers import LOCAL, REMOTE, Fitted, upload, wait_built

from app.routes import counterfactuals, models
from app.security import CREDENTIAL_CHECKS, is_loopback

ADMIN = {"Authorization": "Bearer s3cret-admin"}
API = {"Authorization": "Bearer tok-a"}
ZEROS = "0" * 32  # an id no model has


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("203.0.113.7", False),
        ("testclient", False),
        ("localhost", False),
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(host: str | None, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_admin_token_guards_management(service_factory: Any, rf: Fitted) -> None:
    with service_factory(admin_token="s3cret-admin", client=REMOTE) as svc:
        c = svc.client
        r = upload(c, rf.skops)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"] == "unauthorized" and r.json()["field"] == "authorization"
        r = upload(c, rf.skops, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403 and r.json()["error"] == "forbidden"
        for bad in ("s3cret-admin", "Basic czNjcmV0", "Bearer", "Bearer   "):
            r = upload(c, rf.skops, headers={"Authorization": bad})
            assert r.status_code == 401, bad
        r = upload(c, rf.skops, headers=ADMIN)
        assert r.status_code == 202
        model_id = r.json()["id"]
        assert wait_built(c, model_id)["status"] == "ready"  # queries are open (no API tokens)
        assert c.delete(f"/v1/models/{model_id}").status_code == 401
        assert c.delete(f"/v1/models/{model_id}", headers=API).status_code == 403
        assert c.delete(f"/v1/models/{model_id}", headers=ADMIN).status_code == 204
        # Auth comes before existence: no probing ids without a token.
        assert c.delete("/v1/models/unknown").status_code == 401


def test_without_admin_token_only_loopback_manages(service_factory: Any, rf: Fitted) -> None:
    with service_factory(client=REMOTE) as svc:
        r = upload(svc.client, rf.skops, headers=ADMIN)
        assert r.status_code == 403
        assert "CFMAPS_ADMIN_TOKEN" in r.json()["message"]
        assert svc.client.get("/v1/models").status_code == 200  # queries stay open
    with service_factory(data_dir=svc.settings.data_dir, client=LOCAL) as svc:
        assert upload(svc.client, rf.skops).status_code == 202
    with service_factory(data_dir=svc.settings.data_dir, client=("::1", 4000)) as svc:
        assert upload(svc.client, rf.skops).status_code == 202
    with service_factory(data_dir=svc.settings.data_dir, client=("testclient", 1)) as svc:
        assert upload(svc.client, rf.skops).status_code == 403


def test_api_tokens_guard_queries(service_factory: Any, rf: Fitted) -> None:
    with service_factory(api_tokens="tok-a, tok-b", admin_token="s3cret-admin") as svc:
        assert svc.settings.api_tokens == ["tok-a", "tok-b"]
        c = svc.client
        model_id = svc.add(rf.skops, headers=ADMIN)  # polls with the admin token
        x = rf.X[0].tolist()
        routes = [
            ("GET", "/v1/models", None),
            ("GET", f"/v1/models/{model_id}", None),
            ("POST", f"/v1/models/{model_id}/counterfactuals", {"instance": x}),
            ("POST", f"/v1/models/{model_id}/predict", {"instance": x}),
        ]
        for method, url, body in routes:
            r = c.request(method, url, json=body)
            assert r.status_code == 401, url
            assert r.headers["www-authenticate"] == "Bearer"
            r = c.request(method, url, json=body, headers={"Authorization": "Bearer tok-c"})
            assert r.status_code == 403, url
            for token in ("tok-a", "tok-b", "s3cret-admin"):
                r = c.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"})
                assert r.status_code == 200, (url, token, r.text)
        # API tokens do not grant management.
        assert upload(c, rf.skops, headers=API).status_code == 403
        # Probes and metrics need no token.
        for url in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert c.get(url).status_code == 200, url


def test_credentials_are_checked_before_the_body_is_read(service_factory: Any) -> None:
    """FastAPI reads and parses a body before a route's dependencies run: an upload
    without a token was read whole (up to 256 MiB) before its 401, and a query whose body
    is no JSON got 422 instead of 401."""
    with service_factory(admin_token="s3cret-admin", api_tokens=["tok-a"], client=REMOTE) as svc:
        c = svc.client
        sent = [0]

        def body() -> Any:
            for _ in range(1000):
                sent[0] += 1
                yield b"x" * 65536

        for headers, status in (({}, 401), ({"Authorization": "Bearer wrong"}, 403),
                                (API, 403)):
            sent[0] = 0
            r = c.post("/v1/models", content=body(), headers={
                **headers, "content-type": "multipart/form-data; boundary=b"})
            assert r.status_code == status and r.json()["field"] == "authorization"
            assert sent[0] <= 2, sent[0]  # of 1,000 chunks (64 MB)
        for path in ("counterfactuals", "predict", "map.png"):
            r = c.post(f"/v1/models/{ZEROS}/{path}", content=b"{not json",
                       headers={"content-type": "application/json"})
            assert r.status_code == 401, (path, r.text)
            r = c.post(f"/v1/models/{ZEROS}/{path}", content=b"{not json",
                       headers={**API, "content-type": "application/json"})
            assert r.status_code in (404, 422), (path, r.text)  # past the gate
        # Every route with a body is gated as it declares its own credential check (the
        # gate reads the routes): a future route is covered with no list to keep.
        guarded = [(method, route.path)
                   for route in models.router.routes + counterfactuals.router.routes
                   if isinstance(route, APIRoute)
                   and any(d.call in CREDENTIAL_CHECKS for d in route.dependant.dependencies)
                   for method in sorted(route.methods - {"GET", "HEAD"})]
        assert ("POST", "/v1/models") in guarded and len(guarded) >= 5, guarded
        for method, path in guarded:
            r = c.request(method, path.replace("{model_id}", ZEROS), content=b"{not json",
                          headers={"content-type": "application/json"})
            assert r.status_code == 401, (method, path, r.text)


def test_token_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from app.settings import Settings

    monkeypatch.setenv("CFMAPS_API_TOKENS", " a,b ,, c ")
    monkeypatch.setenv("CFMAPS_ADMIN_TOKEN", "")
    monkeypatch.setenv("CFMAPS_TRUST_PICKLE", "true")
    monkeypatch.setenv("CFMAPS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CFMAPS_MAX_BATCH", "7")
    s = Settings()
    assert s.api_tokens == ["a", "b", "c"]
    assert s.admin_token is None and s.admin_secret is None
    assert s.trust_pickle is True
    assert s.data_dir == tmp_path and s.max_batch == 7
    assert s.default_norm == "l1"
    monkeypatch.setenv("CFMAPS_ADMIN_TOKEN", "xyz")
    monkeypatch.setenv("CFMAPS_API_TOKENS", "")
    s = Settings()
    assert s.admin_secret == "xyz" and s.api_tokens == []
    assert "xyz" not in repr(s)  # secrets stay out of logs
