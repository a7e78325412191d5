"""Per-client rate limits on the query routes (off unless CFMAPS_RATE_LIMIT_PER_MINUTE)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from svc_helpers import Fitted

from app.errors import RateLimitedError
from app.ratelimit import RateLimiter, SharedBuckets

A = {"Authorization": "Bearer tok-a"}
B = {"Authorization": "Bearer tok-b"}


@pytest.mark.parametrize("where", ["process", "shared"])
def test_buckets_refill_with_time_and_are_per_client(where: str, tmp_path: Path) -> None:
    now = [0.0]
    # one per second, bursts of 60
    lim = RateLimiter(60, clock=lambda: now[0], shared=tmp_path if where == "shared" else None)
    lim.charge("a", 60)
    with pytest.raises(RateLimitedError) as err:
        lim.charge("a", 1)
    assert err.value.headers == {"Retry-After": "1"}
    lim.charge("b", 60)  # another client has its own bucket
    now[0] = 10.0
    lim.charge("a", 10)  # ten seconds refilled ten
    with pytest.raises(RateLimitedError) as err:
        lim.charge("a", 5)
    assert err.value.headers == {"Retry-After": "5"}
    now[0] = 1000.0
    lim.charge("a", 60)  # full again, never above the capacity
    with pytest.raises(RateLimitedError):
        lim.charge("a", 1)
    with pytest.raises(RateLimitedError) as err:
        lim.charge("c", 61)  # more than a minute's worth at once: split it
    assert "split it" in err.value.message and err.value.field == "instances"
    assert RateLimiter.client_key("t", "1.2.3.4") != RateLimiter.client_key("u", "1.2.3.4")
    assert "t" not in RateLimiter.client_key("t", None)[6:]  # the token is hashed


def test_processes_sharing_the_buckets_share_the_limit(tmp_path: Path) -> None:
    """``cfmaps serve --workers N``: each process had buckets of its own, so a client
    spreading its requests got N times the limit. Two limiters over one file (as two
    processes: each opens and locks it on its own), eight threads each, 1,000 answers
    asked one at a time: exactly the limit is granted, no update lost."""
    now = [0.0]
    limiters = [RateLimiter(300, clock=lambda: now[0], shared=tmp_path) for _ in range(2)]
    granted = []

    def ask(lim: RateLimiter) -> None:
        n = 0
        for _ in range(125):
            try:
                lim.charge("k", 1)
                n += 1
            except RateLimitedError:
                pass
        granted.append(n)

    threads = [threading.Thread(target=ask, args=(limiters[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 300
    now[0] = 30.0  # half a minute refills half
    limiters[1].charge("k", 150)
    with pytest.raises(RateLimitedError):
        limiters[0].charge("k", 1)
    limiters[0].refund("k", 5)  # given back in one process, there for the other
    limiters[1].charge("k", 5)


def test_shared_buckets_push_out_the_fullest_and_refill_nobody(tmp_path: Path) -> None:
    """More clients on a key's slots than there are: the fullest bucket's slot goes to the
    newcomer, bucket and all. A newcomer started full, so a window of spent buckets handed
    a spent client a fresh one each time it was pushed out and came back (QA, session
    65); now clients past the slots share a bucket, and nobody exceeds the limit."""
    from app import ratelimit

    home = SharedBuckets._hash("spent") % ratelimit._SLOTS
    rivals = []  # keys whose slots start where "spent"'s do: they share its window
    n = 0
    while len(rivals) < 2 * ratelimit._PROBES:
        key = f"c{n}"
        n += 1
        if SharedBuckets._hash(key) % ratelimit._SLOTS == home:
            rivals.append(key)
    full = ratelimit._PROBES - 1  # rivals beside "spent" that fill its window
    now = [0.0]
    # the fullest goes, not a spent one
    (tmp_path / "a").mkdir()
    lim = RateLimiter(60, clock=lambda: now[0], shared=tmp_path / "a")
    lim.charge("spent", 60)
    for key in rivals[:full]:  # the window: "spent" at 0 and 31 buckets at 59
        lim.charge(key, 1)
    lim.charge(rivals[full], 59)  # a 59's slot, with its 59
    with pytest.raises(RateLimitedError):
        lim.charge("spent", 1)
    # 65 clients on a window of 32, each asking for its whole minute at once
    (tmp_path / "b").mkdir()
    lim = RateLimiter(60, clock=lambda: now[0], shared=tmp_path / "b")
    clients = ["spent", *rivals]
    granted = []
    for key in clients:
        try:
            lim.charge(key, 60)
            granted.append(key)
        except RateLimitedError:
            pass
    assert granted == clients[:ratelimit._PROBES]  # the first 32, one full bucket each
    for key in clients * 2:  # pushed out and back, every one of them stays spent
        with pytest.raises(RateLimitedError):
            lim.charge(key, 1)
    now[0] = 60.0  # a minute later the buckets are full again
    lim.charge("spent", 60)


def test_the_query_routes_answer_429_per_token(service_factory: Any, rf: Fitted) -> None:
    with service_factory(api_tokens="tok-a,tok-b", rate_limit_per_minute=6) as svc:
        model_id = svc.add(rf.skops, headers=A)  # polling the build costs nothing
        c = svc.client
        url = f"/v1/models/{model_id}/counterfactuals"
        x = rf.X[:3].tolist()
        # B's first query compiles the search kernels (cold cache: seconds, in which A's
        # bucket would refill); A's queries then run back to back
        assert c.post(url, json={"instance": x[1]}, headers=B).status_code == 200
        assert c.post(url, json={"instances": x}, headers=A).status_code == 200  # 3 answers
        assert c.post(url, json={"instance": x[0], "k": 2}, headers=A).status_code == 200  # 2
        assert c.post(f"/v1/models/{model_id}/predict", json={"instance": x[0]},
                      headers=A).status_code == 200  # 1: the minute's 6 are spent
        r = c.post(url, json={"instance": x[0]}, headers=A)
        assert r.status_code == 429
        assert r.json()["error"] == "rate_limited"
        assert int(r.headers["retry-after"]) >= 1
        assert c.post(url, json={"instance": x[0]}, headers=B).status_code == 200  # B is apart
        assert c.get(f"/v1/models/{model_id}", headers=A).status_code == 200  # not a query
    with service_factory() as svc:  # off by default
        model_id = svc.add(rf.skops)
        for _ in range(3):
            r = svc.client.post(f"/v1/models/{model_id}/counterfactuals",
                                json={"instances": rf.X[:50].tolist()})
            assert r.status_code == 200


def test_429_is_in_the_openapi_document(service_factory: Any) -> None:
    with service_factory() as svc:
        paths = svc.client.get("/openapi.json").json()["paths"]
        for route in ("counterfactuals", "predict"):
            assert "429" in paths[f"/v1/models/{{model_id}}/{route}"]["post"]["responses"]


def test_map_pictures_count_by_their_size(service_factory: Any, rf: Fitted) -> None:
    """A picture shows the decision over a whole slice, so the limit charges one answer per
    1,024 pixels: a client cannot read the forest out through pictures instead."""
    with service_factory(api_tokens="tok-a,tok-b", rate_limit_per_minute=100) as svc:
        model_id = svc.add(rf.skops, headers=A)
        url = f"/v1/models/{model_id}/map.png"
        body = {"features": ["x0", "x1"], "instance": rf.X[0].tolist(), "width": 64,
                "height": 64}  # 4 answers
        # B's picture compiles the kernels first (A's bucket would refill meanwhile)
        assert svc.client.post(url, json=body, headers=B).status_code == 200
        assert svc.client.post(url, json=body, headers=A).status_code == 200
        big = {**body, "width": 320, "height": 320}  # 100 answers: more than the 96 left
        r = svc.client.post(url, json=big, headers=A)
        assert r.status_code == 429 and r.json()["error"] == "rate_limited"
        r = svc.client.get(url, params={"features": "x0,x1", "width": 320, "height": 320,
                                        "instance": ",".join(map(str, rf.X[0]))}, headers=A)
        assert r.status_code == 429
        paths = svc.client.get("/openapi.json", headers=A).json()["paths"]
        for method in ("get", "post"):
            assert "429" in paths["/v1/models/{model_id}/map.png"][method]["responses"]


def test_a_refused_request_costs_no_answers(service_factory: Any, rf: Fitted) -> None:
    """The limit counts answers given: a batch over the batch limit (413) or a picture
    over the side limit (422 on its width) is refused before it is counted, and a picture
    bigger than a minute's worth is refused naming its size, not a batch. Content the
    engine refuses (after the charge) is given back: ten 422s had spent a client's minute."""
    with service_factory(api_tokens="tok-a,tok-b", rate_limit_per_minute=20, max_batch=10,
                         map_max_side=512, max_k=5) as svc:
        model_id = svc.add(rf.skops, headers=A)
        c = svc.client
        url = f"/v1/models/{model_id}/counterfactuals"
        x = rf.X[:11].tolist()
        assert c.post(url, json={"instance": x[0]}, headers=B).status_code == 200  # compiles
        r = c.post(url, json={"instances": x}, headers=A)
        assert r.status_code == 413
        r = c.post(f"/v1/models/{model_id}/predict", json={"instances": x}, headers=A)
        assert r.status_code == 413
        assert c.post(url, json={"instances": x[:10]}, headers=A).status_code == 200  # 10 of 20
        pic = f"/v1/models/{model_id}/map.png"
        body = {"features": ["x0", "x1"], "instance": x[0], "width": 2000, "height": 100}
        r = c.post(pic, json=body, headers=A)
        assert r.status_code == 422 and r.json()["field"] == "width", r.text
        r = c.post(pic, json={**body, "width": 512, "height": 512}, headers=A)  # 256 answers
        assert r.status_code == 429 and r.json()["field"] == "width"
        assert "smaller picture" in r.json()["message"]
        assert "Retry-After" not in r.headers  # waiting never lets it through
        # bad content is refused after the charge, and given back: a wrong instance, k
        # over the limit, an option the engine refuses, a picture of a one-hot column
        bad = [{"instances": [x[0], x[1][:-1]]}, {"instances": x[:2], "k": 6},
               {"instances": x[:2], "weights": {"x0": -1}}, {"instance": x[0], "norm": "l7"},
               {"instances": x[:2], "bounds": {"x0": [3, 1]}}]
        for _ in range(3):  # 3 x 5 x up to 2 answers: past the 10 left, were they counted
            for b in bad:
                r = c.post(url, json=b, headers=A)
                assert r.status_code == 422, (b, r.text)
        r = c.post(pic, json={**body, "width": 64, "height": 64, "a_range": [1, 0]}, headers=A)
        assert r.status_code == 422, r.text
        # rows the model itself cannot read (beyond float32) are refused before the charge
        huge = {"instances": [x[0], [4e38, *x[1][1:]]]}
        for _ in range(6):
            r = c.post(f"/v1/models/{model_id}/predict", json=huge, headers=A)
            assert r.status_code == 422 and r.json()["field"] == "instances.1.x0", r.text
        assert c.post(url, json={"instances": x[:10]}, headers=A).status_code == 200  # 20 of 20
        assert c.post(url, json={"instance": x[0]}, headers=A).status_code == 429


def test_a_request_over_the_whole_limit_names_what_to_shrink(service_factory: Any,
                                                             rf: Fitted) -> None:
    """One instance asking for more alternatives than a minute's worth is refused naming
    ``k`` (it named ``instances`` and advised smaller batches); a batch names its rows."""
    with service_factory(rate_limit_per_minute=20, max_k=50) as svc:
        model_id = svc.add(rf.skops)
        url = f"/v1/models/{model_id}/counterfactuals"
        x = rf.X[:11].tolist()
        r = svc.client.post(url, json={"instance": x[0], "k": 21})
        assert r.status_code == 429 and r.json()["field"] == "k", r.text
        assert "smaller k" in r.json()["message"] and "batches" not in r.json()["message"]
        r = svc.client.post(url, json={"instances": x[:2], "k": 11})
        assert r.status_code == 429 and r.json()["field"] == "instances", r.text
        assert "smaller batches or ask for a smaller k" in r.json()["message"]
        r = svc.client.post(url, json={"instances": [x[0]] * 21})
        assert r.status_code == 429 and r.json()["field"] == "instances", r.text
        assert r.json()["message"].endswith("split it into smaller batches")
