"""The explorer page (/ui) in headless Chromium, driven by Selenium, against a real server.

It fills the form generated from a model's features, submits, and reads the answer the page
shows (distance, changes, region) against the API's own JSON for the same request; it
triggers a validation error and reads the message beside the field; it waits for the map
picture; and it saves screenshots at 1280x800 and 390x844 into tests/artifacts/.

Needs Debian's ``chromium`` and ``chromium-driver``; ``.ci/run`` installs them and sets
``CFMAPS_REQUIRE_BROWSER=1``, which turns their absence into a failure instead of a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from sklearn.ensemble import RandomForestClassifier
from svc_helpers import Fitted

from app.main import create_app
from app.settings import Settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TOKEN = "ui-test-token"
ADMIN = "ui-admin-token"

if not (CHROMIUM and DRIVER):
    if os.environ.get("CFMAPS_REQUIRE_BROWSER"):
        raise RuntimeError("CFMAPS_REQUIRE_BROWSER is set but chromium/chromedriver are missing")
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium "
                "chromium-driver)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service as ChromeService  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

SPEC = {
    "name": "loan",
    "classes": ["approve", "decline"],
    "features": [
        {"name": "income", "type": "integer", "lower": 0, "upper": 200},
        {"name": "late", "type": "binary", "lower": 0, "upper": 1},
        {"name": "home=rent", "type": "categorical", "group": "home"},
        {"name": "home=own", "type": "categorical", "group": "home"},
        {"name": "debt", "type": "continuous", "lower": 0, "upper": 10},
        {"name": "age", "type": "integer", "lower": 18, "upper": 90, "mutable": False},
    ],
}


def _model() -> Fitted:
    rng = np.random.default_rng(0)
    n = 600
    own = rng.integers(0, 2, n)
    X = np.column_stack([rng.integers(0, 201, n), rng.integers(0, 2, n), 1 - own, own,
                         rng.uniform(0, 10, n), rng.integers(18, 91, n)]).astype(float)
    risk = X[:, 4] / 2 - X[:, 0] / 40 + 1.5 * X[:, 1] - own + (X[:, 5] < 25)
    y = (risk + rng.normal(0, 0.5, n) > 0).astype(int)
    return Fitted(RandomForestClassifier(15, max_depth=4, random_state=0).fit(X, y), X, y)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("ui") / "data", api_tokens=[TOKEN],
                        admin_token=ADMIN)
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                        log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    fitted = _model()
    r = httpx.post(base + "/v1/models", headers={"Authorization": f"Bearer {ADMIN}"},
                   files={"model": ("m.skops", fitted.skops)}, data={"spec": json.dumps(SPEC)})
    assert r.status_code == 202, r.text
    mid = r.json()["id"]
    while time.monotonic() < deadline:
        info = httpx.get(f"{base}/v1/models/{mid}", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        if info["status"] in ("ready", "failed"):
            break
        time.sleep(0.1)
    assert info["status"] == "ready", info
    yield base, mid, fitted
    srv.should_exit = True
    th.join(10)


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=ChromeService(DRIVER), options=opts)
    drv.set_window_size(1280, 800)
    yield drv
    drv.quit()


def _set(drv, el, value):
    el.clear()
    el.send_keys(str(value))


def _rows(drv, table_id):
    out = []
    for tr in drv.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr"):
        out.append([c.text for c in tr.find_elements(By.CSS_SELECTOR, "th, td")])
    return out


def _field(drv, name):
    return drv.find_element(By.CSS_SELECTOR, f'[data-feature="{name}"]')


def _open(drv, base):
    drv.get(base + "/ui")
    wait = WebDriverWait(drv, 30)
    _set(drv, drv.find_element(By.ID, "token"), TOKEN)
    drv.find_element(By.ID, "reload").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-feature="income"]'))
    return wait


def test_query_through_the_page_matches_the_api(server, browser):
    base, mid, fitted = server
    drv = browser
    wait = _open(drv, base)
    # every control has a label
    for el in drv.find_elements(By.CSS_SELECTOR, "#fields input, #fields select, #options select, "
                                                 "#options input[type=number]"):
        el_id = el.get_attribute("id")
        if el_id:
            assert drv.find_elements(By.CSS_SELECTOR, f'label[for="{el_id}"]'), el_id
        else:
            assert el.get_attribute("aria-label"), el.get_attribute("outerHTML")
    # the form follows the spec: integer step, binary select, group select, immutable marked
    assert _field(drv, "income").get_attribute("step") == "1"
    assert _field(drv, "late").tag_name == "select"
    group = Select(drv.find_element(By.CSS_SELECTOR, '[data-group="home"]'))
    assert [o.text for o in group.options] == ["rent", "own"]
    age_label = drv.find_element(By.CSS_SELECTOR, 'label[for="in-5"]').text
    assert "immutable" in age_label

    instance = {"income": 40, "late": 1, "home=rent": 1, "home=own": 0, "debt": 7.5, "age": 40}
    assert fitted.model.predict(np.array([list(instance.values())], float))[0] == 1
    _set(drv, _field(drv, "income"), 40)
    Select(_field(drv, "late")).select_by_value("1")
    group.select_by_visible_text("rent")
    _set(drv, _field(drv, "debt"), 7.5)
    _set(drv, _field(drv, "age"), 40)
    Select(drv.find_element(By.ID, "opt-norm")).select_by_value("l1")
    _set(drv, drv.find_element(By.ID, "opt-k"), 2)
    drv.find_element(By.ID, "submit").click()
    wait.until(ec.visibility_of_element_located((By.ID, "distance")))

    api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals",
                     headers={"Authorization": f"Bearer {TOKEN}"},
                     json={"instance": instance, "norm": "l1", "k": 2, "immutable": ["age"]}).json()
    assert api["feasible"]
    shown = float(drv.find_element(By.ID, "distance").text)
    assert shown == pytest.approx(api["distance"], rel=1e-9)
    assert drv.find_element(By.ID, "decision").text == f"Decision: {api['prediction']}. Target: {api['target']}."
    changes = {r[0]: (r[1], r[2]) for r in _rows(drv, "changes")}
    want = {}
    for name, c in api["changes"].items():
        if name.startswith("home="):
            want["home"] = ("rent", "own")
        else:
            want[name] = (str(c["from"]), _fmt(c["to"]))
    assert changes == want
    region = dict(_rows(drv, "region"))
    assert set(region) == set(api["region"])
    for name, r in api["region"].items():
        lo = "-inf" if r["lower"] is None else _fmt(r["lower"])
        hi = "inf" if r["upper"] is None else _fmt(r["upper"])
        assert region[name] == ("[" if r["lower_closed"] else "(") + f"{lo}, {hi}" + (
            "]" if r["upper_closed"] else ")")
    assert len(drv.find_elements(By.CSS_SELECTOR, "#alternatives li")) == len(api.get("alternatives", []))
    # the map picture arrived and was drawn (a blob: URL with real pixels)
    wait.until(lambda d: d.find_element(By.ID, "map-img").get_attribute("src").startswith("blob:"))
    wait.until(lambda d: d.execute_script("return document.getElementById('map-img').naturalWidth") > 0)
    assert "income" in drv.find_element(By.ID, "map-caption").text
    ARTIFACTS.mkdir(exist_ok=True)
    drv.save_screenshot(str(ARTIFACTS / "ui-1280x800.png"))
    drv.set_window_size(390, 844)
    time.sleep(0.3)
    # one column on a phone: no horizontal scrolling of the page itself
    assert drv.execute_script("const e = document.documentElement; return e.scrollWidth <= e.clientWidth")
    drv.save_screenshot(str(ARTIFACTS / "ui-390x844.png"))
    drv.set_window_size(1280, 800)


def _fmt(v):
    if isinstance(v, float) and not v.is_integer():
        return repr(float(f"{v:.10g}"))
    return str(int(v)) if float(v).is_integer() else str(v)


def test_validation_error_is_shown_beside_its_field(server, browser):
    base, mid, _ = server
    drv = browser
    wait = _open(drv, base)
    _set(drv, _field(drv, "income"), 500)  # above the legal range [0, 200]
    drv.find_element(By.ID, "submit").click()
    err = wait.until(lambda d: d.find_element(By.ID, "err-in-0").text or None)
    api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals",
                     headers={"Authorization": f"Bearer {TOKEN}"},
                     json={"instance": {"income": 500, "late": 0, "home=rent": 1, "home=own": 0,
                                        "debt": 5.0, "age": 54}}).json()
    assert api["field"] == "instance.income"
    assert err == api["message"]
    assert _field(drv, "income").get_attribute("aria-invalid") == "true"


def test_wrong_token_is_reported(server, browser):
    base, _, _ = server
    drv = browser
    drv.get(base + "/ui")
    _set(drv, drv.find_element(By.ID, "token"), "wrong")
    drv.find_element(By.ID, "reload").click()
    WebDriverWait(drv, 30).until(
        lambda d: "Could not list models" in d.find_element(By.ID, "model-status").text)
