"""Take the README's picture of the explorer page (docs/explorer.png) with headless Chromium.

Start the demo first (``cfmaps demo --port 8765``), then::

    python scripts/ui_screenshot.py --base http://127.0.0.1:8765 --out docs/explorer.png

It opens ``/ui``, picks the first ready model, fills the form with the demo's applicant
(the README's first curl example), asks for ``no default``, draws the map over the two
payment amounts the answer changes and saves the whole page, 1280 CSS pixels wide. Needs
Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package (in the test
extras).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

APPLICANT = {"LIMIT_BAL": 50000, "AGE": 26, "PAY_0_LATE": 1, "PAY_2_LATE": 1, "PAY_3_LATE": 1,
             "BILL_AMT1": 48560, "PAY_AMT1": 4570, "PAY_AMT2": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8765")
    ap.add_argument("--token", default="", help="a query token, when the service has any")
    ap.add_argument("--out", default="docs/explorer.png")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--applicant", type=json.loads, default=APPLICANT)
    ap.add_argument("--target", default="no default")
    ap.add_argument("--map", default="PAY_AMT1,PAY_AMT2", help="the two features drawn")
    args = ap.parse_args()

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--hide-scrollbars"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=ChromeService(shutil.which("chromedriver")), options=opts)
    try:
        metrics = {"width": args.width, "height": 800, "deviceScaleFactor": 1, "mobile": False}
        drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        wait = WebDriverWait(drv, 60)
        drv.get(args.base.rstrip("/") + "/ui")
        drv.find_element(By.ID, "token").send_keys(args.token)
        drv.find_element(By.ID, "reload").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#fields [data-feature]"))
        for name, value in args.applicant.items():
            el = drv.find_element(By.CSS_SELECTOR, f'[data-feature="{name}"]')
            if el.tag_name == "select":
                Select(el).select_by_value(str(value))
            else:
                el.clear()
                el.send_keys(str(value))
        Select(drv.find_element(By.ID, "opt-target")).select_by_visible_text(args.target)
        a, b = args.map.split(",")
        Select(drv.find_element(By.ID, "map-a")).select_by_value(a)
        Select(drv.find_element(By.ID, "map-b")).select_by_value(b)
        drv.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "map-caption").text.startswith(a)
                   and "Nearest" in d.find_element(By.ID, "map-caption").text
                   and d.find_element(By.ID, "distance").text)
        time.sleep(0.5)  # the last picture's decode
        drv.execute_script("document.activeElement.blur()")  # no focus ring in the picture
        metrics["height"] = int(drv.execute_script("return document.documentElement.scrollHeight"))
        drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        time.sleep(0.3)
        drv.save_screenshot(args.out)
        print(f"wrote {args.out} ({args.width}x{metrics['height']})")
    finally:
        drv.quit()


if __name__ == "__main__":
    main()
