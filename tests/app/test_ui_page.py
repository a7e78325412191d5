"""GET /ui and its assets, without a browser: served self-contained under a same-origin
policy, switched off by CFMAPS_UI=false, absent from a builder; and the map picture's
instance checks (the browser test is tests/app/test_ui_browser.py)."""

from __future__ import annotations

import re

import numpy as np
from sklearn.ensemble import GradientBoostingClassifier
from svc_helpers import Fitted


def test_the_page_is_self_contained(service):
    r = service.client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    # every resource the page names is its own, by a relative URL (works under a prefix)
    refs = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert sorted(refs) == ["ui/explorer.css", "ui/explorer.js"]
    for ref, kind in (("ui/explorer.js", "text/javascript"), ("ui/explorer.css", "text/css")):
        a = service.client.get("/" + ref)
        assert a.status_code == 200 and a.headers["content-type"].startswith(kind)
        assert not re.search(r"https?://", a.text), ref  # no CDN, nothing remote
        assert "localStorage" not in a.text and "sessionStorage" not in a.text
        assert "document.cookie" not in a.text  # the token lives in the page's memory only
    assert not re.search(r"https?://", r.text)
    assert service.client.get("/ui/nope.js").json()["error"] == "not_found"
    assert service.client.get("/ui/index.html").status_code == 404
    # HEAD (link checkers, uptime probes) gets the GET's headers and no body
    h = service.client.head("/ui")
    assert h.status_code == 200 and h.headers["content-type"] == r.headers["content-type"]
    assert h.content == b"" and h.headers["content-length"] == r.headers["content-length"]
    assert service.client.head("/ui/explorer.js").status_code == 200


def test_the_page_and_its_assets_revalidate_with_their_etag(service):
    """``Cache-Control: no-cache`` makes a browser ask again on every visit: with an ETag
    it gets a body-less 304 while the file is unchanged (it got the whole file again)."""
    for path in ("/ui", "/ui/explorer.js", "/ui/explorer.css"):
        r = service.client.get(path)
        tag = r.headers["etag"]
        assert r.status_code == 200 and r.headers["cache-control"] == "no-cache"
        again = service.client.get(path, headers={"If-None-Match": tag})
        assert again.status_code == 304 and again.content == b"", path
        assert again.headers["etag"] == tag
        assert "default-src 'self'" in again.headers["content-security-policy"]
        weak = service.client.get(path, headers={"If-None-Match": f'"other", W/{tag}'})
        assert weak.status_code == 304, path
        stale = service.client.get(path, headers={"If-None-Match": '"other"'})
        assert stale.status_code == 200 and stale.content == r.content
    tags = {service.client.get(p).headers["etag"] for p in ("/ui", "/ui/explorer.js")}
    assert len(tags) == 2


def test_the_page_needs_no_token_but_the_api_does(service_factory):
    with service_factory(api_tokens=["t0k"]) as svc:
        assert svc.client.get("/ui").status_code == 200
        assert svc.client.get("/v1/models").status_code == 401
        r = svc.client.get("/v1/models/x/map.png", params={"features": "a,b", "instance": "1"})
        assert r.status_code == 401


def test_ui_setting_and_builder_role(service_factory, tmp_path):
    with service_factory(data_dir=tmp_path / "a", ui=False) as svc:
        assert svc.client.get("/ui").status_code == 404
        assert svc.client.get("/ui/explorer.js").status_code == 404
    with service_factory(data_dir=tmp_path / "b", role="builder") as svc:
        assert svc.client.get("/ui").status_code == 404


def test_map_instance_is_checked_like_a_query(service, gb3):
    spec = {"features": [{"name": "n", "type": "integer", "lower": 0, "upper": 49},
                         {"name": "c=0", "type": "categorical", "group": "c"},
                         {"name": "c=1", "type": "categorical", "group": "c"},
                         {"name": "age", "type": "integer", "lower": 18, "upper": 79}]}
    X = np.column_stack([gb3.X[:, 0], gb3.X[:, 1] == 0, gb3.X[:, 1] == 1, gb3.X[:, 3]]).astype(float)
    model = GradientBoostingClassifier(n_estimators=5, max_depth=2, random_state=0).fit(X, gb3.y)
    mid = service.add(Fitted(model, X, gb3.y).skops, spec)
    url = f"/v1/models/{mid}/map.png"
    for instance, field in (({"n": 99, "c=0": 1, "c=1": 0, "age": 30}, "instance.n"),
                            ({"n": 2.5, "c=0": 1, "c=1": 0, "age": 30}, "instance.n"),
                            ({"n": 3, "c=0": 1, "c=1": 1, "age": 30}, "instance"),
                            ({"n": 3, "c=0": 1, "c=1": 0}, "instance")):
        r = service.client.post(url, json={"features": ["n", "age"], "instance": instance})
        assert r.status_code == 422, r.text
        assert r.json()["field"].startswith(field), r.json()
    r = service.client.post(url, json={"features": ["n", "age"], "a_range": [-0.5, 49.5],
                                       "instance": {"n": 3, "c=0": 1, "c=1": 0, "age": 30}})
    assert r.status_code == 200
    r = service.client.post(url, json={"features": ["n", "age"], "a_range": [-1, 49],
                                       "instance": {"n": 3, "c=0": 1, "c=1": 0, "age": 30}})
    assert r.status_code == 422 and r.json()["field"] == "a_range"
