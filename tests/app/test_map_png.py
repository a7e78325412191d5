"""GET/POST /v1/models/{id}/map.png: the picture is the model's own decision, pixel for
pixel, and bad parameters get a 422 that names them, never a 500."""

from __future__ import annotations

import json

import numpy as np
import pytest
from svc_helpers import decode_png

from app.mapimage import class_colours


def picture(svc, mid, **params):
    r = svc.client.get(f"/v1/models/{mid}/map.png", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    return r, decode_png(r.content)


def centres(x, a, b, extent, w, h):
    a_lo, a_hi, b_lo, b_hi = extent
    av = a_lo + (np.arange(w) + 0.5) * (a_hi - a_lo) / w
    bv = b_hi - (np.arange(h) + 0.5) * (b_hi - b_lo) / h
    P = np.repeat(np.asarray(x, float)[None, :], h * w, axis=0)
    P[:, a] = np.tile(av, h)
    P[:, b] = np.repeat(bv, w)
    return P


@pytest.mark.parametrize("features", [(0, 1), (3, 2)])
def test_fill_equals_predict_on_every_pixel_centre(rf_service, rf, features):
    svc, mid = rf_service
    a, b = features
    x = rf.X[5]
    w, h = 120, 90
    r, img = picture(svc, mid, features=f"x{a},x{b}", instance=",".join(repr(float(v)) for v in x), width=w,
                     height=h, overlay="false", a_range="-3,3", b_range="-2.5,2.5")
    extent = json.loads(r.headers["X-Map-Extent"])
    assert extent == [-3.0, 3.0, -2.5, 2.5]
    assert json.loads(r.headers["X-Map-Classes"]) == [0, 1]
    assert json.loads(r.headers["X-Map-Colours"]) == [
        "#{:02x}{:02x}{:02x}".format(*c) for c in class_colours(2)]
    labels = np.searchsorted(rf.model.classes_, rf.model.predict(centres(x, a, b, extent, w, h)))
    expected = class_colours(2)[labels].reshape(h, w, 3)
    assert img.shape == (h, w, 3)
    assert np.array_equal(img, expected)
    assert len(np.unique(labels)) == 2  # both classes are in the picture


def test_overlay_marks_instance_and_counterfactual(rf_service, rf):
    svc, mid = rf_service
    x = rf.X[5]
    body = {"features": ["x0", "x1"], "instance": list(map(float, x)), "width": 200,
            "height": 150, "a_range": [-3, 3], "b_range": [-3, 3]}
    r = svc.client.post(f"/v1/models/{mid}/map.png", json=body)
    assert r.status_code == 200, r.text
    img = decode_png(r.content)
    col = int((x[0] + 3) / 6 * 200)
    row = int((3 - x[1]) / 6 * 150)
    assert tuple(img[row, col]) == (255, 255, 255)  # the instance: a white disc
    cf = json.loads(r.headers["X-Map-Counterfactual"])
    # the slice's counterfactual holds every other feature: the model agrees it is the target
    q = x.copy()
    q[0], q[1] = cf["x0"], cf["x1"]
    assert rf.model.predict(q[None])[0] != rf.model.predict(x[None])[0]
    ans = svc.client.post(f"/v1/models/{mid}/counterfactuals",
                          json={"instance": list(map(float, x)),
                                "immutable": ["x2", "x3", "x4"]}).json()
    assert ans["counterfactual"]["x0"] == cf["x0"] and ans["counterfactual"]["x1"] == cf["x1"]
    # the class boundary is drawn in black somewhere
    assert (img == 0).all(axis=2).any()


@pytest.mark.parametrize(
    "params, field",
    [
        ({"features": "x0,nope"}, "features.1"),
        ({"features": "x1,x1"}, "features"),
        ({"features": "x0"}, "features"),
        ({"width": 5000}, "width"),
        ({"height": 0}, "height"),
        ({"instance": "1,2"}, "instance"),
        ({"instance": "a,b,c,d,e"}, "instance"),
        ({"a_range": "3,1"}, "a_range"),
        ({"a_range": "-1e9,1e9"}, None),  # inside an unbounded domain: fine
        ({"target": "no-such-class"}, "target"),
        ({"norm": "l7"}, "norm"),
        ({"instance": "nan,0,0,0,0"}, "instance.x0"),
        ({"instance": "inf,0,0,0,0"}, "instance.x0"),
        ({"width": 10**30}, "width"),
        ({"a_range": "nan,1"}, "a_range"),
        ({"a_range": "1,2,3"}, "a_range"),
        ({"overlay": "maybe"}, "overlay"),
        ({"a_range": "-1.7e308,1.7e308"}, "a_range"),  # hi - lo overflows
        ({"a_range": "0,2.225073858507203e-309"}, None),  # a subnormal span (was a 500)
        ({"a_range": "100,100.000001"}, None),  # the instance far outside (was a 500)
        ({"widht": 100}, "widht"),  # a typo drew the default size, with a 200
        ({"pad": "x" * 5000}, "pad"),
        ({"_": "1700000000"}, None),  # a client's cache-buster
    ],
)
def test_bad_parameters_get_422_naming_them(rf_service, rf, params, field):
    svc, mid = rf_service
    q = {"features": "x0,x1", "instance": ",".join(repr(float(v)) for v in rf.X[0]), "width": 40,
         "height": 30}
    q.update(params)
    r = svc.client.get(f"/v1/models/{mid}/map.png", params=q)
    if field is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()


def test_names_holding_a_comma_are_given_as_the_parameter_twice(service, rf):
    """A feature named ``income, monthly`` could not be named in ``features=a,b``; the
    parameter given twice names each feature whole, and draws as the POST does."""
    names = ["income, monthly", "x1", "x2", "x3", "x4"]
    mid = service.add(rf.skops, {"features": [{"name": n} for n in names]})
    inst = ",".join(repr(float(v)) for v in rf.X[0])
    common = {"instance": inst, "width": 40, "height": 30, "overlay": "false",
              "a_range": "-3,3", "b_range": "-3,3"}
    r = service.client.get(f"/v1/models/{mid}/map.png",
                           params=[("features", "income, monthly"), ("features", "x2"),
                                   *common.items()])
    assert r.status_code == 200, r.text
    post = service.client.post(f"/v1/models/{mid}/map.png", json={
        "features": ["income, monthly", "x2"], "instance": list(map(float, rf.X[0])),
        "width": 40, "height": 30, "overlay": False, "a_range": [-3, 3], "b_range": [-3, 3]})
    assert post.status_code == 200, post.text
    assert np.array_equal(decode_png(r.content), decode_png(post.content))
    # the comma form still works for plain names, and a comma name in it is a clear 422
    assert service.client.get(f"/v1/models/{mid}/map.png",
                              params={**common, "features": "x1,x2"}).status_code == 200
    bad = service.client.get(f"/v1/models/{mid}/map.png",
                             params={**common, "features": "income, monthly,x2"})
    assert bad.status_code == 422 and bad.json()["field"] == "features", bad.text


def test_unknown_model_is_404_and_one_hot_columns_are_refused(service, gb3):
    r = service.client.get("/v1/models/nope/map.png", params={"features": "a,b", "instance": "1"})
    assert r.status_code == 404
    spec = {"features": [{"name": "n", "type": "integer", "lower": 0, "upper": 49},
                         {"name": "c=0", "type": "categorical", "group": "c"},
                         {"name": "c=1", "type": "categorical", "group": "c"},
                         {"name": "age", "type": "integer", "lower": 18, "upper": 79}]}
    X = gb3.X.copy()
    from sklearn.ensemble import GradientBoostingClassifier

    oh = np.column_stack([X[:, 0], X[:, 1] == 0, X[:, 1] == 1, X[:, 3]]).astype(float)
    model = GradientBoostingClassifier(n_estimators=5, max_depth=2, random_state=0).fit(oh, gb3.y)
    from svc_helpers import Fitted

    mid = service.add(Fitted(model, oh, gb3.y).skops, spec)
    r = service.client.post(f"/v1/models/{mid}/map.png",
                            json={"features": ["n", "c=1"], "instance": [3, 1, 0, 30]})
    assert r.status_code == 422 and "one-hot" in r.json()["message"], r.text
    r = service.client.post(f"/v1/models/{mid}/map.png",
                            json={"features": ["n", "age"], "instance": [3, 1, 0, 30], "width": 64,
                                  "height": 48, "overlay": False})
    assert r.status_code == 200, r.text
    img = decode_png(r.content)
    ext = json.loads(r.headers["X-Map-Extent"])
    assert ext == [-0.5, 49.5, 17.5, 79.5]
    P = centres([3, 1, 0, 30], 0, 3, ext, 64, 48)
    P[:, 0], P[:, 3] = np.round(P[:, 0]), np.round(P[:, 3])  # integer features: nearest integer
    labels = np.searchsorted(model.classes_, model.predict(P))
    assert np.array_equal(img, class_colours(3)[labels].reshape(48, 64, 3))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"features": ["x0", "nope"]}, "features.1"),
        ({"features": ["x2", "x2"]}, "features"),
        ({"width": 1025}, "width"),  # the default CFMAPS_MAP_MAX_SIDE is 1024
        ({"height": 4096}, "height"),
        ({"width": 2.5}, "width"),
        ({"instance": {"x0": 0.0}}, "instance"),
        ({"b_range": [0, 0]}, "b_range"),
    ],
)
def test_bad_bodies_get_422_naming_them(rf_service, rf, change, field):
    svc, mid = rf_service
    body = {"features": ["x0", "x1"], "instance": list(map(float, rf.X[0])), "width": 40,
            "height": 30, **change}
    r = svc.client.post(f"/v1/models/{mid}/map.png", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] is not None and r.json()["field"].startswith(field), r.json()


def test_map_max_side_setting(service_factory, rf):
    with service_factory(map_max_side=64) as svc:
        mid = svc.add(rf.skops)
        q = {"features": "x0,x1", "instance": ",".join(repr(float(v)) for v in rf.X[0])}
        r = svc.client.get(f"/v1/models/{mid}/map.png", params={**q, "width": 64, "height": 64})
        assert r.status_code == 200
        r = svc.client.get(f"/v1/models/{mid}/map.png", params={**q, "width": 65, "height": 64})
        assert r.status_code == 422 and r.json()["field"] == "width"
        assert "64" in r.json()["message"]
        # no size given: the default 480x360, fitted to the limit (it was a 422 on a
        # width the client never sent, and the explorer page could draw no map)
        for r in (svc.client.get(f"/v1/models/{mid}/map.png", params=q),
                  svc.client.post(f"/v1/models/{mid}/map.png", json={
                      "features": ["x0", "x1"], "instance": list(map(float, rf.X[0]))})):
            assert r.status_code == 200, r.text
            assert decode_png(r.content).shape == (48, 64, 3)
        r = svc.client.get(f"/v1/models/{mid}/map.png", params={**q, "height": 10})
        assert decode_png(r.content).shape == (10, 64, 3)  # a size given is kept as given
        doc = svc.client.get("/openapi.json").json()
        assert doc["components"]["schemas"]["MapRequest"]["properties"]["width"]["default"] == 64
    with service_factory() as svc:  # the default limit keeps the default size
        mid = svc.add(rf.skops)
        r = svc.client.get(f"/v1/models/{mid}/map.png", params=q)
        assert decode_png(r.content).shape == (360, 480, 3)


def test_budgeted_maps_draw_mixed_regions_exactly(service_factory, rf):
    """A build cut short keeps mixed regions; the picture decides them exactly, so it is
    still the model's own decision at every pixel centre."""
    with service_factory(build_max_rectangles=20) as svc:
        mid = svc.add(rf.skops)
        assert svc.client.get(f"/v1/models/{mid}").json()["stats"]["mixed_regions"] > 0
        for k, (a, b) in enumerate([(0, 1), (2, 4)]):
            x = rf.X[10 + k]
            w, h = 101, 77
            r, img = picture(svc, mid, features=f"x{a},x{b}",
                             instance=",".join(repr(float(v)) for v in x), width=w, height=h,
                             overlay="false")
            extent = json.loads(r.headers["X-Map-Extent"])
            labels = np.searchsorted(rf.model.classes_,
                                     rf.model.predict(centres(x, a, b, extent, w, h)))
            assert np.array_equal(img, class_colours(2)[labels].reshape(h, w, 3))


def test_segments_are_clipped_to_the_picture() -> None:
    from app.mapimage import _clip
    assert _clip((-10.0, 5.0), (30.0, 5.0), 20, 10) == ((0.0, 5.0), (20.0, 5.0))
    assert _clip((5.0, 5.0), (6.0, 6.0), 20, 10) == ((5.0, 5.0), (6.0, 6.0))
    assert _clip((-5.0, -5.0), (-1.0, 30.0), 20, 10) is None  # left of the picture
    assert _clip((0.0, 1e3), (0.0, -1e3), 20, 10) == ((0.0, 10.0), (0.0, 0.0))
    assert _clip((1.0, 1.0), (float("inf"), 2.0), 20, 10) is None
    # ends 1e300 away: where the segment crosses is lost to rounding, but what is drawn
    # stays inside the picture (drawing costs its size, whatever the distance)
    for far in ((-1e300, -1e300), (1e300, 1e300)), ((-1e300, 3.0), (1e300, 4.0)):
        clipped = _clip(*far, 20, 10)
        assert clipped is not None
        for x, y in clipped:
            assert 0 <= x <= 20 and 0 <= y <= 10


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_marks_far_off_the_picture_draw_nothing() -> None:
    """A disc or diamond whose centre lies far outside the raster (an instance 1e200 past
    a narrow range) or is not finite leaves the picture as it was, without overflowing the
    pixel distances; one just off the edge still draws its overlapping part."""
    from app.mapimage import _diamond, _disc
    for mark in (_disc, _diamond):
        for c in ((1e200, 5.0), (5.0, -1e200), (float("nan"), 1.0), (float("inf"), 1.0)):
            img = np.zeros((10, 20, 3), dtype=np.uint8)
            mark(img, c, 6, (255, 255, 255))
            assert not img.any()
        img = np.zeros((10, 20, 3), dtype=np.uint8)
        mark(img, (-3.0, 5.0), 6, (255, 255, 255))
        assert img[:, 0].any() and not img[:, 5:].any()


def test_a_query_string_target_names_a_float_label_as_the_json_body_does(service) -> None:
    """Labels {1.0, 2.0}: the POST's target 1 is the label 1.0, but GET map.png?target=1
    was a 422 unknown class (only "1.0" matched the label's text)."""
    import skops.io as sio
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = np.where(X[:, 0] > 0, 2.0, 1.0)
    mid = service.add(sio.dumps(RandomForestClassifier(5, max_depth=3, random_state=0).fit(X, y)))
    q = {"features": "x0,x1", "instance": "0.5,0,0", "width": 40, "height": 30}
    pictures = [service.client.get(f"/v1/models/{mid}/map.png", params={**q, "target": t})
                for t in ("1", "1.0", "1e0")]
    assert [r.status_code for r in pictures] == [200, 200, 200], pictures[0].text
    assert pictures[0].content == pictures[1].content == pictures[2].content
    bad = service.client.get(f"/v1/models/{mid}/map.png", params={**q, "target": "3"})
    assert bad.status_code == 422 and bad.json()["field"] == "target"
