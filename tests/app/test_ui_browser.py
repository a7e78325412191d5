"""The explorer page (/ui) in headless Chromium, driven by Selenium, against a real server.

It fills the form generated from a model's features, submits with the keyboard, and reads
the answer the page shows (decision, distance, changes, region, alternatives) against the
API's own JSON for the request the page sent; it checks that the map picture the page shows
is the API's, and that it follows the features picked; it triggers a validation error and
reads the message beside the field; it shows an infeasible answer's reason; it walks every
control with the Tab key; and it saves screenshots at 1280x800 (and the whole page at 1280
wide) and at 390x844 into tests/artifacts/ (not committed).

Needs Debian's ``chromium`` and ``chromium-driver``. Without them the module is skipped,
unless ``CFMAPS_REQUIRE_BROWSER`` is set (``.ci/run`` sets it after installing them): then
their absence is an error, so CI cannot pass without running these tests.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait
from sklearn.ensemble import RandomForestClassifier
from svc_helpers import Fitted, decode_png

from app.main import create_app
from app.mapimage import class_colours
from app.settings import Settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TOKEN = "ui-test-token"
ADMIN = "ui-admin-token"

REQUIRED = bool(os.environ.get("CFMAPS_REQUIRE_BROWSER"))
if not (CHROMIUM and DRIVER) and not REQUIRED:
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium "
                "chromium-driver; CFMAPS_REQUIRE_BROWSER=1 makes this a failure)",
                allow_module_level=True)

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
INSTANCE = {"income": 40, "late": 1, "home=rent": 1, "home=own": 0, "debt": 7.5, "age": 40}
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OTHER = "ui-other-token"
OTHER_AUTH = {"Authorization": f"Bearer {OTHER}"}

# Records what the page asks of the API: the test replays the same requests itself.
RECORD_FETCH = """
window.__errors = [];
window.addEventListener("error", (e) => window.__errors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.__errors.push(String(e.reason)));
window.__requests = [];
const orig = window.fetch;
window.fetch = (url, opts) => {
  window.__requests.push({url: String(url), body: opts && opts.body ? opts.body : null});
  return orig(url, opts);
};
"""


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


@contextlib.contextmanager
def _serving(settings: Settings) -> Iterator[tuple[str, str, Fitted]]:
    """A real server with ``settings`` in a thread, the loan model uploaded and ready:
    yields its base URL, the model's id and the fitted model."""
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                        log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    try:
        base = f"http://127.0.0.1:{port}"
        # generous: on a fresh checkout the first build also compiles the numba kernels
        deadline = time.monotonic() + 300
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
            info = httpx.get(f"{base}/v1/models/{mid}", headers=AUTH).json()
            if info["status"] in ("ready", "failed"):
                break
            time.sleep(0.1)
        assert info["status"] == "ready", info
        yield base, mid, fitted
    finally:
        srv.should_exit = True
        th.join(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("ui") / "data", api_tokens=[TOKEN],
                        admin_token=ADMIN)
    with _serving(settings) as (base, mid, fitted):
        # one query first, untimed: on a cold numba cache it compiles the search kernels,
        # which can take longer than the page's 30 s waits below
        warm = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH,
                          json={"instance": INSTANCE}, timeout=300)
        assert warm.status_code == 200, warm.text
        yield base, mid, fitted


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (CHROMIUM and DRIVER):  # only reached when CFMAPS_REQUIRE_BROWSER is set
        pytest.fail("CFMAPS_REQUIRE_BROWSER is set but chromium/chromedriver are missing "
                    "(apt-get install chromium chromium-driver)", pytrace=False)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, read back
    # offline and quiet: no sync, no component updates, no first-run network calls
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars"):
        opts.add_argument(flag)
    # the driver given explicitly: Selenium Manager never downloads one. Its own TMPDIR:
    # chromium made a singleton-socket directory (org.chromium.Chromium.*) in /tmp at
    # every run and left it there.
    tmp = tmp_path_factory.mktemp("chromium")
    drv = webdriver.Chrome(service=ChromeService(DRIVER, env={**os.environ, "TMPDIR": str(tmp)}),
                           options=opts)
    _viewport(drv, 1280, 800)
    yield drv
    drv.quit()


def _viewport(drv: Any, width: int, height: int, mobile: bool = False) -> None:
    """The page's viewport exactly ``width x height`` CSS pixels at scale 1 (a window size
    would include the browser's own frame)."""
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})
    time.sleep(0.2)


def _png_size(path: Path) -> tuple[int, int]:
    w, h = struct.unpack(">II", path.read_bytes()[16:24])
    return w, h


def _screenshot(drv: Any, name: str, size: tuple[int, int]) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    drv.save_screenshot(str(path))
    assert _png_size(path) == size
    return path


def _full_page(drv: Any, name: str, width: int) -> Path:
    """The whole page at ``width`` CSS pixels (for the README's picture)."""
    height = int(drv.execute_script("return document.documentElement.scrollHeight"))
    _viewport(drv, width, height)
    path = _screenshot(drv, name, (width, height))
    _viewport(drv, 1280, 800)
    return path


def _set(el: Any, value: Any) -> None:
    el.clear()
    el.send_keys(str(value))


def _rows(drv: Any, table_id: str) -> list[list[Any]]:
    return [[c for c in tr.find_elements(By.CSS_SELECTOR, "th, td")]
            for tr in drv.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")]


def _field(drv: Any, name: str) -> Any:
    return drv.find_element(By.CSS_SELECTOR, f'[data-feature="{name}"]')


def _open(drv: Any, base: str) -> WebDriverWait:
    drv.get(base + "/ui")
    drv.execute_script(RECORD_FETCH)
    drv.get_log("browser")  # the console from here on only
    # the page re-renders its form when a model is chosen: a condition that read an
    # element being replaced is tried again (a CI run failed on one such stale element)
    wait = WebDriverWait(drv, 30, ignored_exceptions=(StaleElementReferenceException,))
    _set(drv.find_element(By.ID, "token"), TOKEN)
    drv.find_element(By.ID, "reload").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-feature="income"]'))
    return wait


def _requests(drv: Any, suffix: str) -> list[dict[str, Any]]:
    return [json.loads(r["body"]) for r in drv.execute_script("return window.__requests")
            if r["url"].endswith(suffix) and r["body"]]


def _fill(drv: Any, inst: dict[str, Any] = INSTANCE) -> None:
    _set(_field(drv, "income"), _fmt(inst["income"]))
    Select(_field(drv, "late")).select_by_value(_fmt(inst["late"]))
    Select(drv.find_element(By.CSS_SELECTOR, '[data-group="home"]')).select_by_visible_text(
        "rent" if inst["home=rent"] else "own")
    _set(_field(drv, "debt"), repr(float(inst["debt"])))
    _set(_field(drv, "age"), _fmt(inst["age"]))


def _shown_pixels(drv: Any) -> np.ndarray:
    """The RGB pixels of the picture the page shows, read back through a canvas (the page's
    policy lets it fetch nothing but its own origin, so not its blob: URL)."""
    data = drv.execute_script("""
        const img = document.getElementById('map-img');
        const c = document.createElement('canvas');
        c.width = img.naturalWidth; c.height = img.naturalHeight;
        const g = c.getContext('2d');
        g.drawImage(img, 0, 0);
        const px = g.getImageData(0, 0, c.width, c.height).data;
        let s = '';
        for (let i = 0; i < px.length; i += 4) s += String.fromCharCode(px[i], px[i + 1], px[i + 2]);
        return [c.width, c.height, btoa(s)];""")
    w, h, b64 = data
    return np.frombuffer(base64.b64decode(b64), dtype=np.uint8).reshape(h, w, 3)


def _api_pixels(png: bytes) -> np.ndarray:
    return decode_png(png)


def _fmt(v: float) -> str:
    """What the page shows for a number: ten significant digits (JavaScript's
    ``Number(v.toPrecision(10))``), integers as integers."""
    if float(v).is_integer():
        return str(int(v))
    return repr(float(f"{v:.10g}"))


def test_query_through_the_page_matches_the_api(server, browser):
    base, mid, fitted = server
    drv = browser
    wait = _open(drv, base)
    # every control has a label (a <label for> or an aria-label)
    for el in drv.find_elements(By.CSS_SELECTOR, "input, select, button"):
        el_id = el.get_attribute("id")
        labelled = el_id and drv.find_elements(By.CSS_SELECTOR, f'label[for="{el_id}"]')
        assert labelled or el.get_attribute("aria-label") or (
            el.tag_name == "button" and el.text.strip()), el.get_attribute("outerHTML")
    # the form follows the spec: integer step, binary select, group select, immutable marked
    assert _field(drv, "income").get_attribute("step") == "1"
    assert _field(drv, "debt").get_attribute("step") == "any"
    assert _field(drv, "late").tag_name == "select"
    group = Select(drv.find_element(By.CSS_SELECTOR, '[data-group="home"]'))
    assert [o.text for o in group.options] == ["rent", "own"]
    assert "immutable" in drv.find_element(By.CSS_SELECTOR, 'label[for="in-5"]').text
    assert "immutable" not in drv.find_element(By.CSS_SELECTOR, 'label[for="in-0"]').text

    assert fitted.model.predict(np.array([list(INSTANCE.values())], float))[0] == 1
    _fill(drv)
    Select(drv.find_element(By.ID, "opt-norm")).select_by_value("l1")
    _set(drv.find_element(By.ID, "opt-k"), 2)
    _field(drv, "debt").send_keys(Keys.ENTER)  # submitted from the keyboard
    wait.until(ec.visibility_of_element_located((By.ID, "distance")))

    sent = _requests(drv, "/counterfactuals")
    assert sent == [{"instance": INSTANCE, "norm": "l1", "k": 2, "immutable": ["age"]}]
    api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH, json=sent[0]).json()
    assert api["feasible"] and api["prediction"] == "decline" and api["target"] == "approve"
    # the certified counterfactual is what the model itself decides
    cf = np.array([[api["counterfactual"][f["name"]] for f in SPEC["features"]]], float)
    assert fitted.model.predict(cf)[0] == 0

    assert drv.find_element(By.ID, "decision").text == "Decision: decline. Target: approve."
    # proven: the badge says so, and no lower bound is needed
    assert api["optimal"] is True
    assert drv.find_element(By.ID, "optimal").text == "certified optimal"
    assert not drv.find_element(By.ID, "lower-bound").is_displayed()
    distance = drv.find_element(By.ID, "distance")
    assert float(distance.get_attribute("data-value")) == api["distance"]
    assert distance.text == _fmt(api["distance"])
    # changes: one row per feature (the one-hot group as one), sorted by cost, exact values
    rows = _rows(drv, "changes")
    shown = {r[0].text: r for r in rows}
    want = {n: c for n, c in api["changes"].items() if not n.startswith("home=")}
    assert set(shown) - {"home"} == set(want)
    for name, c in want.items():
        row = shown[name]
        assert float(row[1].get_attribute("data-value")) == c["from"]
        assert float(row[2].get_attribute("data-value")) == c["to"]
        assert row[2].text == _fmt(c["to"])
    costs = [float(r[3].get_attribute("data-value")) for r in rows]
    assert costs == sorted(costs, reverse=True)
    # the region: every feature, exact ends and their open/closed flags
    region = {r[0].text: r[1] for r in _rows(drv, "region")}
    assert set(region) == set(api["region"])
    for name, r in api["region"].items():
        assert json.loads(region[name].get_attribute("data-value")) == r
        lo = "-inf" if r["lower"] is None else _fmt(r["lower"])
        hi = "inf" if r["upper"] is None else _fmt(r["upper"])
        assert region[name].text == ("[" if r["lower_closed"] else "(") + f"{lo}, {hi}" + (
            "]" if r["upper_closed"] else ")")
    alts = drv.find_elements(By.CSS_SELECTOR, "#alternatives li")
    assert len(alts) == len(api["alternatives"]) == 1
    assert f"distance {_fmt(api['alternatives'][0]['distance'])}" in alts[0].text

    # the map picture drawn after the query is the API's picture for the request sent
    wait.until(lambda d: d.execute_script(
        "const i = document.getElementById('map-img');"
        "return i.src.startsWith('blob:') && i.complete && i.naturalWidth > 0"))
    (map_req,) = _requests(drv, "/map.png")
    assert map_req["features"] == ["income", "late"] and map_req["instance"] == INSTANCE
    r = httpx.post(f"{base}/v1/models/{mid}/map.png", headers=AUTH, json=map_req)
    assert r.status_code == 200
    assert np.array_equal(_shown_pixels(drv), _api_pixels(r.content))
    ext = json.loads(r.headers["X-Map-Extent"])
    assert ext == [-0.5, 200.5, -0.5, 1.5]  # integer axes: a band per value
    assert drv.find_element(By.ID, "map-caption").text.startswith("income: 0 to 200")
    assert drv.find_element(By.ID, "map-b-name").text == "late: 0 to 1"
    legend = [li.text for li in drv.find_elements(By.CSS_SELECTOR, "#legend li")]
    assert legend == ["approve", "decline"]
    # the legend's swatches are the picture's own fill colours
    swatches = [drv.execute_script("return getComputedStyle(arguments[0]).backgroundColor", el)
                for el in drv.find_elements(By.CSS_SELECTOR, "#legend .swatch")]
    assert swatches == ["rgb({}, {}, {})".format(*c) for c in class_colours(2)]

    _screenshot(drv, "ui-1280x800.png", (1280, 800))
    _full_page(drv, "ui-1280-full.png", 1280)
    _viewport(drv, 390, 844, mobile=True)
    # one column on a phone: the page itself never scrolls sideways
    assert drv.execute_script(
        "const e = document.documentElement; return e.scrollWidth <= e.clientWidth")
    assert drv.execute_script("return document.getElementById('map-img').getBoundingClientRect()"
                              ".right") <= 390
    _screenshot(drv, "ui-390x844.png", (390, 844))
    _viewport(drv, 1280, 800)
    # a quiet console: no error, nor the 404 of a /favicon.ico asked for (the page makes its
    # own icon: the content security policy refuses a data: one)
    assert [e for e in drv.get_log("browser") if e["level"] == "SEVERE"] == []
    assert drv.execute_script("return window.__errors") == []
    assert drv.execute_script(
        "return document.querySelector('link[rel=icon]').href").startswith("blob:")


def test_the_map_follows_the_features_picked(server, browser):
    base, mid, _ = server
    drv = browser
    wait = _open(drv, base)
    _fill(drv)
    Select(drv.find_element(By.ID, "map-a")).select_by_visible_text("debt")
    wait.until(lambda d: _requests(d, "/map.png") and "debt:" in d.find_element(
        By.ID, "map-caption").text)
    Select(drv.find_element(By.ID, "map-b")).select_by_visible_text("income")
    wait.until(lambda d: d.find_element(By.ID, "map-b-name").text.startswith("income:"))
    last = _requests(drv, "/map.png")[-1]
    assert last["features"] == ["debt", "income"]
    r = httpx.post(f"{base}/v1/models/{mid}/map.png", headers=AUTH, json=last)
    want = _api_pixels(r.content)
    wait.until(lambda d: np.array_equal(_shown_pixels(d), want))
    cf = json.loads(r.headers["X-Map-Counterfactual"])
    assert f"debt = {_fmt(cf['debt'])}, income = {_fmt(cf['income'])}" in drv.find_element(
        By.ID, "map-caption").text
    # the same feature twice: the API's message, shown beside the picture, never a crash
    Select(drv.find_element(By.ID, "map-b")).select_by_visible_text("debt")
    err = wait.until(lambda d: d.find_element(By.ID, "err-map").text or None)
    assert "must differ" in err
    # and the old picture is gone, not left standing under the error
    assert drv.find_element(By.ID, "map-img").get_attribute("src") in (None, "")
    assert drv.find_element(By.ID, "map-caption").text == ""


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory):
    """A service whose rate limit (100 answers a minute) is below the 169 a picture of the
    default size costs; a second token keeps the test's own requests off the page's bucket."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("ui-limited") / "data",
                        api_tokens=[TOKEN, OTHER], admin_token=ADMIN, rate_limit_per_minute=100)
    with _serving(settings) as (base, mid, fitted):
        warm = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=OTHER_AUTH,
                          json={"instance": INSTANCE}, timeout=300)
        assert warm.status_code == 200, warm.text
        yield base, mid, fitted


def test_a_map_is_drawn_small_under_a_low_rate_limit(limited_server, browser):
    """Under a rate limit below a default picture's cost the page drew no map at all, only
    the 429 ("more than the limit"); it now asks for smaller pictures (refused ones cost
    nothing) and says it drew a small one."""
    base, mid, _ = limited_server
    drv = browser
    wait = _open(drv, base)
    _fill(drv)
    Select(drv.find_element(By.ID, "map-a")).select_by_visible_text("debt")
    caption = wait.until(lambda d: "Drawn small" in d.find_element(
        By.ID, "map-caption").text and d.find_element(By.ID, "map-caption").text)
    assert "debt:" in caption and drv.find_element(By.ID, "err-map").text == ""
    sent = _requests(drv, "/map.png")
    assert "width" not in sent[0]  # the default first: refused whole
    last = sent[-1]
    assert (last["width"], last["height"]) == (240, 180)
    r = httpx.post(f"{base}/v1/models/{mid}/map.png", headers=OTHER_AUTH, json=last)
    assert r.status_code == 200, r.text
    want = _api_pixels(r.content)
    wait.until(lambda d: np.array_equal(_shown_pixels(d), want))
    # the default size is refused as a whole, naming the field the page reacts to
    r = httpx.post(f"{base}/v1/models/{mid}/map.png", headers=OTHER_AUTH,
                   json={k: v for k, v in last.items() if k not in ("width", "height")})
    assert r.status_code == 429 and r.json()["field"] == "width", r.text


def test_validation_error_is_shown_beside_its_field(server, browser):
    base, mid, _ = server
    drv = browser
    wait = _open(drv, base)
    _fill(drv)
    # an answer and its picture first: a failed query must not leave them beside its error
    drv.find_element(By.ID, "submit").click()
    wait.until(lambda d: d.find_element(By.ID, "distance").is_displayed()
               and d.find_element(By.ID, "map-caption").text)
    _set(_field(drv, "income"), 500)  # above the legal range [0, 200]
    drv.find_element(By.ID, "submit").click()
    err = wait.until(lambda d: d.find_element(By.ID, "err-in-0").text or None)
    assert not drv.find_element(By.ID, "answer").is_displayed()
    assert drv.find_element(By.ID, "map-img").get_attribute("src") in (None, "")
    assert drv.find_element(By.ID, "map-caption").text == ""
    assert drv.find_elements(By.CSS_SELECTOR, "#legend li") == []
    sent = _requests(drv, "/counterfactuals")[-1]
    api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH, json=sent)
    assert api.status_code == 422 and api.json()["field"] == "instance.income"
    assert err == api.json()["message"]
    income = _field(drv, "income")
    assert income.get_attribute("aria-invalid") == "true"
    assert drv.switch_to.active_element == income  # focus moved to the field to fix
    assert drv.find_element(By.ID, "form-error").text == ""
    # an empty field is caught before any request, next to that field
    income.clear()
    drv.find_element(By.ID, "submit").click()
    assert "needs a number" in wait.until(lambda d: d.find_element(By.ID, "err-in-0").text or None)
    assert len(_requests(drv, "/counterfactuals")) == 2


def test_infeasible_answer_shows_its_reason(server, browser):
    base, mid, _ = server
    drv = browser
    wait = _open(drv, base)
    _fill(drv)
    drv.find_element(By.CSS_SELECTOR, "#constraints-box summary").click()
    for box in drv.find_elements(By.CSS_SELECTOR, '[data-constraint="immutable"]'):
        if not box.is_selected():
            box.send_keys(Keys.SPACE)  # checkboxes toggle from the keyboard
    drv.find_element(By.ID, "submit").send_keys(Keys.ENTER)
    wait.until(ec.visibility_of_element_located((By.ID, "infeasible")))
    (sent,) = _requests(drv, "/counterfactuals")
    assert sorted(sent["immutable"]) == sorted(f["name"] for f in SPEC["features"])
    api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH, json=sent).json()
    assert api["feasible"] is False and api["reason"]
    assert drv.find_element(By.ID, "infeasible").text == f"feasible: false. {api['reason']}"
    assert not drv.find_element(By.ID, "found").is_displayed()
    # the map route takes no query constraints: its point (income and late move) breaks
    # them, and the caption says so instead of calling it the nearest in the slice
    caption = wait.until(lambda d: d.find_element(By.ID, "map-caption").text or None)
    (map_req,) = _requests(drv, "/map.png")
    assert set(map_req) >= {"features", "instance"} and "immutable" not in map_req
    r = httpx.post(f"{base}/v1/models/{mid}/map.png", headers=AUTH, json=map_req)
    cf = json.loads(r.headers["X-Map-Counterfactual"])
    moved = [n for n in ("income", "late") if cf[n] != INSTANCE[n]]
    assert moved
    assert "Nearest in this slice" not in caption
    assert "not this query's constraints" in caption and "no answer to this query" in caption
    for n in moved:
        assert f"{n} is immutable" in caption
    alt = drv.find_element(By.ID, "map-img").get_attribute("alt")
    assert "nearest" not in alt.lower() and "no answer to this query" in alt


def test_every_control_is_reached_with_the_tab_key(server, browser):
    base, _, _ = server
    drv = browser
    _open(drv, base)
    drv.find_element(By.ID, "token").click()
    seen = []
    for _ in range(80):
        el = drv.switch_to.active_element
        seen.append(el.get_attribute("id") or el.tag_name)
        if seen[-1] == "map-draw":
            break
        el.send_keys(Keys.TAB)
    want = ["token", "model", "reload", "in-0", "in-1", "in-group-1", "in-4", "in-5",
            "opt-target", "opt-norm", "opt-k", "summary", "submit", "map-a", "map-b",
            "map-zoom", "map-draw"]
    assert seen == want
    # and a focused control is visibly outlined
    outline = drv.execute_script(
        "return getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")


def test_wrong_token_is_reported(server, browser):
    base, _, _ = server
    drv = browser
    drv.get(base + "/ui")
    _set(drv.find_element(By.ID, "token"), "wrong")
    drv.find_element(By.ID, "reload").click()
    WebDriverWait(drv, 30).until(
        lambda d: "Could not list models" in d.find_element(By.ID, "model-status").text)


NOMINAL_SPEC = {
    "name": "regions",
    "classes": ["no", "yes"],
    "features": [
        {"name": "region", "type": "nominal", "lower": 0, "upper": 4},
        {"name": "income", "type": "continuous", "lower": 0, "upper": 10},
    ],
}


@contextlib.contextmanager
def _uploaded(base: str, fitted: Fitted, spec: dict[str, Any]) -> Iterator[str]:
    """Upload ``fitted`` with ``spec``, wait until its maps are ready, yield its id, and
    delete it afterwards."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    r = httpx.post(base + "/v1/models", headers=admin, files={"model": ("m.skops", fitted.skops)},
                   data={"spec": json.dumps(spec)})
    assert r.status_code == 202, r.text
    mid = r.json()["id"]
    try:
        deadline = time.monotonic() + 300
        while httpx.get(f"{base}/v1/models/{mid}", headers=AUTH).json()["status"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield mid
    finally:
        httpx.delete(f"{base}/v1/models/{mid}", headers=admin)


def test_nominal_feature_is_a_list_of_codes_and_costs_one_weight(server, browser):
    """A nominal feature is chosen from its codes, has no direction to pick, and the
    changes table charges its switch one weight, as the API's distance does (read as a
    number, region 0 -> 3 would cost 3)."""
    base, _, _ = server
    drv = browser
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.integers(0, 5, 400), rng.uniform(0, 10, 400)]).astype(float)
    y = (X[:, 0] == 3).astype(int)
    fitted = Fitted(RandomForestClassifier(10, max_depth=3, random_state=0).fit(X, y), X, y)
    with _uploaded(base, fitted, NOMINAL_SPEC) as mid:
        wait = _open(drv, base)
        Select(drv.find_element(By.ID, "model")).select_by_value(mid)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-feature="region"]'))
        region = Select(_field(drv, "region"))
        assert [o.text for o in region.options] == ["0", "1", "2", "3", "4"]
        assert not drv.find_element(
            By.CSS_SELECTOR, '[data-constraint="direction"][data-name="region"]').is_enabled()
        assert drv.find_element(
            By.CSS_SELECTOR, '[data-constraint="direction"][data-name="income"]').is_enabled()
        region.select_by_value("0")
        _set(_field(drv, "income"), 2)
        Select(drv.find_element(By.ID, "opt-norm")).select_by_value("l1")
        _field(drv, "income").send_keys(Keys.ENTER)
        wait.until(ec.visibility_of_element_located((By.ID, "distance")))
        (sent,) = _requests(drv, "/counterfactuals")
        assert sent["instance"] == {"region": 0, "income": 2} and "direction" not in sent
        api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH,
                         json=sent).json()
        assert api["counterfactual"]["region"] == 3 and api["distance"] == 1.0
        cf = np.array([[api["counterfactual"]["region"], api["counterfactual"]["income"]]])
        assert fitted.model.predict(cf)[0] == 1
        shown = {row[0].text: row for row in _rows(drv, "changes")}
        assert set(shown) == {"region"}
        assert float(shown["region"][2].get_attribute("data-value")) == 3
        assert float(shown["region"][3].get_attribute("data-value")) == 1.0


def test_a_group_with_some_columns_fixed_is_marked_so(server, browser):
    """A one-hot group is marked immutable only when all its columns are; with some fixed,
    the API still switches among the others, and the mark says how many are fixed."""
    base, _, fitted = server
    drv = browser
    admin = {"Authorization": f"Bearer {ADMIN}"}
    ids = {}
    for fixed, mark in ((["home=own"], "1 of 2 fixed"), (["home=rent", "home=own"], "immutable")):
        spec = json.loads(json.dumps(SPEC))
        for f in spec["features"]:
            if f["name"] in fixed:
                f["mutable"] = False
        r = httpx.post(base + "/v1/models", headers=admin,
                       files={"model": ("m.skops", fitted.skops)}, data={"spec": json.dumps(spec)})
        assert r.status_code == 202, r.text
        ids[r.json()["id"]] = mark
    try:
        deadline = time.monotonic() + 300
        for mid in ids:
            while httpx.get(f"{base}/v1/models/{mid}", headers=AUTH).json()["status"] != "ready":
                assert time.monotonic() < deadline
                time.sleep(0.1)
        wait = _open(drv, base)
        group = 'label[for="in-group-1"]'
        assert "fixed" not in drv.find_element(By.CSS_SELECTOR, group).text  # none fixed
        for mid, mark in ids.items():
            Select(drv.find_element(By.ID, "model")).select_by_value(mid)
            wait.until(lambda d, mark=mark: mark in d.find_element(By.CSS_SELECTOR, group).text)
            other = "immutable" if mark != "immutable" else "of 2 fixed"
            assert other not in drv.find_element(By.CSS_SELECTOR, group).text
    finally:
        for mid in ids:
            httpx.delete(f"{base}/v1/models/{mid}", headers=admin)


def test_features_named_like_object_members_are_read_and_constrained(server, browser):
    """Feature names are any text: "toString" and "__proto__" too. The page kept them in
    plain objects, where bounds["toString"] read the inherited function (the bound typed
    there was dropped, and the answer broke it) and inst["__proto__"] set no key (every
    query was refused: feature '__proto__' is missing)."""
    base, _, _ = server
    drv = browser
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, size=(400, 2))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    fitted = Fitted(RandomForestClassifier(10, max_depth=3, random_state=0).fit(X, y), X, y)
    spec = {"name": "odd names", "features": [
        {"name": "toString", "type": "continuous", "lower": -1, "upper": 1},
        {"name": "__proto__", "type": "continuous", "lower": -1, "upper": 1}]}
    with _uploaded(base, fitted, spec) as mid:
        wait = _open(drv, base)
        Select(drv.find_element(By.ID, "model")).select_by_value(mid)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-feature="__proto__"]'))
        _set(_field(drv, "toString"), -0.5)
        _set(_field(drv, "__proto__"), -0.5)
        drv.find_element(By.CSS_SELECTOR, "#constraints-box summary").click()
        _set(drv.find_element(By.CSS_SELECTOR, '[data-constraint="bounds"][data-name="toString"]'
                              '[data-side="lower"]'), -0.5)
        drv.find_element(By.ID, "submit").send_keys(Keys.ENTER)
        wait.until(ec.visibility_of_element_located((By.ID, "distance")))
        (sent,) = _requests(drv, "/counterfactuals")
        assert sent["instance"] == {"toString": -0.5, "__proto__": -0.5}
        assert sent["bounds"] == {"toString": [-0.5, None]}
        api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH,
                         json=sent).json()
        assert api["feasible"] and api["counterfactual"]["toString"] >= -0.5


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory):
    """A service that answers a search out of its budget with its best find, unproven:
    a box per search (CFMAPS_QUERY_MAX_BOXES=1) and CFMAPS_QUERY_ON_BUDGET=best."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("ui-budget") / "data",
                        api_tokens=[TOKEN], admin_token=ADMIN, build_max_rectangles=20,
                        query_max_boxes=1, query_on_budget="best")
    with _serving(settings) as served:
        yield served


def test_an_unproven_answer_is_not_called_optimal(budget_server, browser):
    """An answer given past the search's budget (``optimal`` false) is badged "not proven
    optimal" with its certified lower bound; the page called every answer "certified
    optimal"."""
    base, mid, fitted = budget_server
    drv = browser
    url = f"{base}/v1/models/{mid}/counterfactuals"
    names = [f["name"] for f in SPEC["features"]]
    inst = None
    for x in fitted.X[:60].tolist():
        r = httpx.post(url, headers=AUTH, json={"instance": dict(zip(names, x, strict=True))}, timeout=60)
        if r.status_code == 200 and r.json()["feasible"] and r.json()["optimal"] is False:
            inst = dict(zip(names, x, strict=True))
            break
    assert inst is not None, "no unproven answer among the rows tried"
    wait = _open(drv, base)
    _fill(drv, inst)
    drv.find_element(By.ID, "submit").click()
    wait.until(ec.visibility_of_element_located((By.ID, "distance")))
    sent = _requests(drv, "/counterfactuals")[-1]
    api = httpx.post(url, headers=AUTH, json=sent, timeout=60).json()
    assert api["optimal"] is False and api["lower_bound"] <= api["distance"]
    assert float(drv.find_element(By.ID, "distance").get_attribute("data-value")) == api["distance"]
    badge = drv.find_element(By.ID, "optimal")
    assert badge.text == "not proven optimal"
    assert "unproven" in badge.get_attribute("class").split()
    note = drv.find_element(By.ID, "lower-bound")
    assert note.is_displayed()
    assert float(note.get_attribute("data-value")) == api["lower_bound"]
    assert f"No counterfactual is nearer than {_fmt(api['lower_bound'])}" in note.text
    assert "certified optimal" not in drv.find_element(By.ID, "answer").text
    _screenshot(drv, "ui-unproven-1280x800.png", (1280, 800))


# Makes the page's queries slow: each answer to /counterfactuals reaches it 1.5 s late.
DELAY_ANSWERS = """
window.__late = 0;
const inner = window.fetch;
window.fetch = async (url, opts) => {
  const r = await inner(url, opts);
  if (String(url).endsWith("/counterfactuals")) {
    await new Promise((ok) => setTimeout(ok, 1500));
    window.__late++;
  }
  return r;
};
"""


def _nominal_model() -> Fitted:
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.integers(0, 5, 400), rng.uniform(0, 10, 400)]).astype(float)
    y = (X[:, 0] == 3).astype(int)
    return Fitted(RandomForestClassifier(10, max_depth=3, random_state=0).fit(X, y), X, y)


def test_another_model_drops_the_last_ones_answer_and_map(server, browser):
    """Picking another model takes the previous one's answer and map picture away (they
    stayed, under the new model's form), and an answer to the previous model's query that
    arrives afterwards is dropped (it was shown, with a JavaScript error)."""
    base, mid, _ = server
    drv = browser
    with _uploaded(base, _nominal_model(), NOMINAL_SPEC) as other:
        wait = _open(drv, base)
        assert Select(drv.find_element(By.ID, "model")).first_selected_option.get_attribute(
            "value") == mid
        _fill(drv)
        drv.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "distance").is_displayed()
                   and d.find_element(By.ID, "map-caption").text)
        drv.execute_script(DELAY_ANSWERS)
        drv.find_element(By.ID, "submit").click()
        Select(drv.find_element(By.ID, "model")).select_by_value(other)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-feature="region"]'))

        def cleared(d: Any) -> bool:
            return (not d.find_element(By.ID, "answer").is_displayed()
                    and d.find_element(By.ID, "map-img").get_attribute("src") in (None, "")
                    and d.find_element(By.ID, "map-caption").text == ""
                    and d.find_element(By.ID, "map-b-name").text == ""
                    and not d.find_elements(By.CSS_SELECTOR, "#legend li"))

        assert cleared(drv)
        # the loan model's late answer comes now: nothing of it is shown
        wait.until(lambda d: d.execute_script("return window.__late") == 1)
        time.sleep(0.5)
        assert len(_requests(drv, "/counterfactuals")) == 2
        assert cleared(drv)
        assert drv.find_element(By.ID, "form-error").text == ""
        assert drv.execute_script("return window.__errors") == []
        assert drv.find_element(By.ID, "submit").is_enabled()
        # and the model now picked answers its own queries
        Select(_field(drv, "region")).select_by_value("0")
        _set(_field(drv, "income"), 2)
        drv.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "distance").is_displayed())
        assert _requests(drv, "/counterfactuals")[-1]["instance"] == {"region": 0, "income": 2}
        shown = {row[0].text for row in _rows(drv, "changes")}
        assert shown == {"region"}
        assert drv.execute_script("return window.__errors") == []


def test_what_the_spec_fixes_cannot_be_lifted(server, browser):
    """A feature the spec makes immutable, or lets move one way only, cannot be freed by a
    query (its immutable adds to the spec's, its direction restricts the spec's): its
    controls show the spec's choice, disabled, and say why. The page let the user uncheck
    "Immutable" or pick "any", to no effect."""
    base, _, fitted = server
    drv = browser
    spec = json.loads(json.dumps(SPEC))
    for f in spec["features"]:
        if f["name"] == "debt":
            f["direction"] = "decrease"
    with _uploaded(base, fitted, spec) as mid:
        wait = _open(drv, base)
        Select(drv.find_element(By.ID, "model")).select_by_value(mid)
        debt_dir = '[data-constraint="direction"][data-name="debt"]'
        wait.until(lambda d: not d.find_element(By.CSS_SELECTOR, debt_dir).is_enabled())
        drv.find_element(By.CSS_SELECTOR, "#constraints-box summary").click()

        def why(el: Any) -> str:
            return " ".join(drv.find_element(By.ID, i).text
                            for i in el.get_attribute("aria-describedby").split())

        age = drv.find_element(By.CSS_SELECTOR, '[data-constraint="immutable"][data-name="age"]')
        assert age.is_selected() and not age.is_enabled()
        assert age.get_attribute("title") == "fixed by the model's spec"
        assert "immutable: fixed by the model's spec" in why(age)
        debt = Select(drv.find_element(By.CSS_SELECTOR, debt_dir))
        assert [o.get_attribute("value") for o in debt.options] == ["decrease"]
        assert debt.first_selected_option.get_attribute("value") == "decrease"
        assert "decrease only: fixed by the model's spec" in why(drv.find_element(By.CSS_SELECTOR, debt_dir))
        # the others stay free to choose
        income = drv.find_element(By.CSS_SELECTOR, '[data-constraint="immutable"][data-name="income"]')
        assert income.is_enabled() and not income.is_selected()
        drv.execute_script("document.getElementById('constraints').scrollIntoView()")
        _screenshot(drv, "ui-spec-fixed-1280x800.png", (1280, 800))
        inc_dir = drv.find_element(By.CSS_SELECTOR, '[data-constraint="direction"][data-name="income"]')
        assert [o.text for o in Select(inc_dir).options] == ["any", "increase", "decrease"]
        assert inc_dir.is_enabled()
        _fill(drv)
        drv.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "answer").is_displayed())
        sent = _requests(drv, "/counterfactuals")[-1]
        assert sent["immutable"] == ["age"] and "direction" not in sent
        api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH,
                         json=sent).json()
        if api["feasible"]:
            assert api["counterfactual"]["age"] == INSTANCE["age"]
            assert api["counterfactual"]["debt"] <= INSTANCE["debt"]


DOTTED = 'a.b "q"'


def test_a_one_feature_model_has_no_map_and_a_dotted_name_keeps_its_errors(server, browser):
    """A model with one feature has no two-feature slice: the page says so instead of
    asking for a picture at every query (each answered "the two features must differ").
    And an error about a feature named with a "." is put on that feature's control (the
    page split the error's field at every ".")."""
    base, _, _ = server
    drv = browser
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 100, size=(300, 1))
    y = (X[:, 0] > 50).astype(int)
    fitted = Fitted(RandomForestClassifier(5, max_depth=2, random_state=0).fit(X, y), X, y)
    spec = {"name": "one", "features": [
        {"name": DOTTED, "type": "continuous", "lower": 0, "upper": 100}]}
    field = f"[data-feature='{DOTTED}']"
    with _uploaded(base, fitted, spec) as mid:
        wait = _open(drv, base)
        Select(drv.find_element(By.ID, "model")).select_by_value(mid)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, field))
        note = drv.find_element(By.ID, "map-none")
        assert note.is_displayed() and "two features" in note.text
        assert not drv.find_element(By.ID, "map-controls").is_displayed()
        assert not drv.find_element(By.ID, "map-figure").is_displayed()
        _set(drv.find_element(By.CSS_SELECTOR, field), 20)
        drv.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "distance").is_displayed())
        time.sleep(0.5)
        assert _requests(drv, "/map.png") == []
        assert drv.find_element(By.ID, "err-map").text == ""
        # bounds the API refuses (lower above upper): its field is `bounds.a.b "q"`
        drv.find_element(By.CSS_SELECTOR, "#constraints-box summary").click()
        bound = f"[data-constraint='bounds'][data-name='{DOTTED}']"
        lower = drv.find_element(By.CSS_SELECTOR, bound + "[data-side='lower']")
        _set(lower, 70)
        _set(drv.find_element(By.CSS_SELECTOR, bound + "[data-side='upper']"), 30)
        drv.find_element(By.ID, "submit").click()
        err = wait.until(lambda d: d.find_element(By.ID, "form-error").text or None)
        sent = _requests(drv, "/counterfactuals")[-1]
        api = httpx.post(f"{base}/v1/models/{mid}/counterfactuals", headers=AUTH, json=sent)
        assert api.status_code == 422 and api.json()["field"] == f"bounds.{DOTTED}"
        assert err == api.json()["message"]
        assert lower.get_attribute("aria-invalid") == "true"
        assert drv.switch_to.active_element == lower
