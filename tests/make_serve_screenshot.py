"""Make docs/serve.png, the README's picture of ``fdsl serve examples/encoder2.fd``: the manual's
session typed into headless Chromium (``python tests/make_serve_screenshot.py [OUT.png]``)."""

from __future__ import annotations

import sys
from pathlib import Path

from selenium.webdriver.common.by import By
from serve_helpers import ROOT, Served
from test_serve_browser import CHROMIUM, DRIVER, open_page, type_command, webdriver

SESSION = ["depends(coeff(N, K[0]), Q[1])", "z = flatten(expandmm(expandAll(form(2))))", "len(z)", "forms(2, 4)",
           "show(html(cycle(shiftmm(z[13]))))", "show X Q[0] Q[0]"]


def main(out: Path) -> None:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    served = Served("examples/encoder2.fd")
    try:
        open_page(driver, served.url)
        for command in SESSION:
            type_command(driver, command)
        driver.find_element(By.ID, "input").send_keys("cycle(shiftmm(z[13]))")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
        served.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "serve.png")
