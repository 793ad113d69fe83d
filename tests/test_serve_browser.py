"""``fdsl serve`` in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
installed by .ci/run; nothing is downloaded at test time) driven by Selenium types the manual's
session and the hostile inputs, and reads what the page shows. After each, the server still serves.

What the page shows is checked against ``fdsl run`` of the same program (the oracle of the text),
and the math against KaTeX's own output on the page (``.katex`` elements, with MathML inside).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from serve_helpers import ROOT, Served, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER) and not os.environ.get("CI"):
    pytest.skip("the browser tests need Debian's chromium and chromium-driver (apt-get install chromium "
                "chromium-driver; .ci/run does)", allow_module_level=True)
try:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError:
    if os.environ.get("CI"):
        raise  # .ci/run installs the test extra: a missing selenium is a failure there
    pytest.skip("the browser tests need selenium (pip install -e '.[test]')", allow_module_level=True)

SHOTS = Path(os.environ.get("FDSL_SCREENSHOTS", "")) if os.environ.get("FDSL_SCREENSHOTS") else None


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=DRIVER)  # given: Selenium Manager downloads nothing
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def natural():
    s = Served("examples/natural.fd", "--time-limit", "30")
    yield s
    s.stop()


def open_page(driver, url):
    driver.get(url)
    assert wait_for(lambda: driver.execute_script("return document.body.dataset.ready === '1'"), 90), \
        "the page did not start its session"


def entries(driver):
    return driver.find_elements(By.CSS_SELECTOR, "#results .entry")


def idle(driver):
    return driver.execute_script("return document.getElementById('status').hidden")


def type_command(driver, text, timeout=90):
    """Type ``text`` in the command window as a person does (Shift+Enter between lines), press
    Enter, wait for the answer; the entry it made."""
    assert wait_for(lambda: idle(driver), timeout)
    before = len(entries(driver))
    box = driver.find_element(By.ID, "input")
    lines = text.split("\n")
    for i, line in enumerate(lines):
        box.send_keys(line)
        if i < len(lines) - 1:
            box.send_keys(Keys.SHIFT, Keys.ENTER, Keys.NULL)
    box.send_keys(Keys.ENTER)
    assert wait_for(lambda: len(entries(driver)) > before and idle(driver), timeout), "no answer to %r" % text
    return entries(driver)[-1]


def grey_box(driver) -> str:
    return driver.find_element(By.ID, "log").get_attribute("textContent")


def errors_in(entry) -> str:
    """The errors shown under a command (issue 31: they stay there, the next command keeps them)."""
    return "\n".join(e.get_attribute("textContent") for e in entry.find_elements(By.CSS_SELECTOR, "pre.error"))


def text_of(entry) -> str:
    return entry.get_attribute("textContent")


def math_in(entry):
    return entry.find_elements(By.CSS_SELECTOR, ".math .katex")


def oracle(run_fdsl, file, *inputs) -> list:
    """What ``fdsl run FILE -e INPUT`` prints for each input, after the file's own output."""
    own = run_fdsl("run", file).stdout
    out = run_fdsl("run", file, "-e", "; ".join(inputs))
    assert out.returncode == 0, out.stderr
    return out.stdout[len(own):]


def shows_a_picture(driver, entry, kind):
    """The entry holds a picture (an <img> of base64 data of type image/KIND) that the browser drew."""
    picture = entry.find_element(By.TAG_NAME, "img")
    assert picture.get_attribute("src").startswith("data:image/%s;base64," % kind)
    assert wait_for(lambda: driver.execute_script("return arguments[0].naturalWidth", picture) > 100)


def screenshot(driver, name):
    if SHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / name))


def still_serving(driver, served):
    assert served.alive()
    entry = type_command(driver, "show C")
    assert math_in(entry), text_of(entry)


def test_the_manual_session(browser, natural, run_fdsl):
    """forms(2), forms(2, 4), show(html(...)) of one summand, shiftmm, cycle, len(z), z[13], and the deep
    encoder's question with its path and its picture, typed as the manual types them."""
    open_page(browser, natural.url)
    first = entries(browser)[0]
    assert len(math_in(first)) >= 1, "the program's output is typeset"  # coeff(N, K[5]) of the file
    assert "true, via encoder_5" in text_of(first)
    assert browser.find_element(By.ID, "file").text == "natural.fd"

    entry = type_command(browser, "forms(2)")
    assert math_in(entry) and "dK_1" in text_of(entry)
    entry = type_command(browser, "forms(2, 4)")
    assert len(math_in(entry)) == 1
    want = oracle(run_fdsl, "examples/natural.fd", "show forms(2, 4)").strip()
    assert entry.find_element(By.CSS_SELECTOR, "details pre").get_attribute("textContent").strip() == want

    assert "error" not in text_of(type_command(browser, "z = flatten(expandmm(expandAll(form(2))))"))
    n = oracle(run_fdsl, "examples/natural.fd", "z = flatten(expandmm(expandAll(form(2))))", "show len(z)").strip()
    assert text_of(type_command(browser, "len(z)")).endswith(n)
    for command in ("show(html(z[13]))", "show(html(shiftmm(z[13])))", "show(html(cycle(shiftmm(z[13]))))"):
        entry = type_command(browser, command)
        assert len(math_in(entry)) == 1, command
        assert entry.find_elements(By.CSS_SELECTOR, ".katex mathml, .katex math"), "KaTeX's MathML is there"
    # cycle brought the differential to the end of the word (the annotation is the LaTeX typeset)
    latex = entry.find_element(By.CSS_SELECTOR, "annotation").get_attribute("textContent")
    summand = re.split(r"\\\\|\\begin\{aligned\}|\\text\{where\}", latex)  # the summand before its where block
    summand = [part for part in summand if "\\mathrm{d}" in part][0]
    assert re.search(r"\\mathrm\{d\}[A-Za-z]_\{\d\}\\right\)", summand), latex[:300]
    want = oracle(run_fdsl, "examples/natural.fd", "z = flatten(expandmm(expandAll(form(2))))",
                  "show(html(cycle(shiftmm(z[13]))))").strip()
    # the text under the math is what fdsl repl prints: here html(...)'s markup, shown as text
    assert entry.find_element(By.CSS_SELECTOR, "details pre").get_attribute("textContent").strip() == want

    entry = type_command(browser, "depends(coeff(N, K[5]), Q[3])")
    assert "true, via encoder_5 > m(...) > encoder_4 > m(...) > a(...) > Q_3" in text_of(entry)
    shows_a_picture(browser, entry, "svg+xml")
    screenshot(browser, "manual_session.png")
    still_serving(browser, natural)


def test_history_walks_back_and_forth_and_survives_a_reload(browser, natural):
    open_page(browser, natural.url)
    for command in ("show X0", "show Y"):
        type_command(browser, command)
    box = browser.find_element(By.ID, "input")
    box.send_keys("draft")
    box.send_keys(Keys.ARROW_UP)
    assert box.get_attribute("value") == "show Y"
    box.send_keys(Keys.ARROW_UP)
    assert box.get_attribute("value") == "show X0"
    box.send_keys(Keys.ARROW_DOWN)
    assert box.get_attribute("value") == "show Y"
    box.send_keys(Keys.ARROW_DOWN)
    assert box.get_attribute("value") == "draft"
    open_page(browser, natural.url)  # kept per browser
    box = browser.find_element(By.ID, "input")
    box.send_keys(Keys.ARROW_UP)
    assert box.get_attribute("value") == "show Y"
    box.clear()
    # Shift+Enter starts a new line; the two lines are one command
    entry = type_command(browser, "show X0,\n  Y")
    assert len(math_in(entry)) == 2


def test_the_help_button_lists_the_verbs_and_operators(browser, natural):
    open_page(browser, natural.url)
    browser.find_element(By.ID, "help").click()
    panel = browser.find_element(By.ID, "helppanel")
    assert wait_for(lambda: panel.is_displayed())
    text = panel.get_attribute("textContent")
    for verb in ("expandAll", "expandmm", "shiftmm", "cycle", "forms(E, j?)", "depends(G, V)", "mm(A, B)", "aa(A, B)"):
        assert verb in text, verb
    assert "Enter runs" in text and "Shift+Enter" in text


def test_an_error_stays_under_its_command_with_its_caret(browser, natural):
    """Issue 31: the error stands under the command that made it, and the next command keeps it
    (it went to the grey box, which the next command cleared: the transcript said only "error")."""
    open_page(browser, natural.url)
    entry = type_command(browser, "show X0 Q[0] Q[0]")
    box = errors_in(entry)
    assert "<input>:1:14:" in box and "inner sizes k and d differ" in box
    lines = box.split("\n")
    source = next(i for i, line in enumerate(lines) if "show X0 Q[0] Q[0]" in line)
    # the caret stands under column 14 of the line echoed (both indented alike), in a monospace box
    assert lines[source + 1].index("^") == lines[source].index("show") + 13
    assert browser.execute_script("return getComputedStyle(document.querySelector('.entry pre.error')).fontFamily") \
        == "monospace"
    type_command(browser, "show X0")
    type_command(browser, "show Y")
    assert "inner sizes k and d differ" in errors_in(entry), "the next commands kept it"
    assert "see the grey box" not in text_of(entry)
    still_serving(browser, natural)


INJECTIONS = [
    '<img src=x onerror="document.body.dataset.pwned=1"><b id=pwned>bold</b>',
    'show "<script>document.body.dataset.pwned=1</script><b id=pwned>x</b>"',
    'weight <i id=pwned>W</i> : n x n',
    'show "$\\\\href{javascript:alert(1)}{x}$"',
]


@pytest.mark.parametrize("attack", INJECTIONS)
def test_typed_markup_stays_text(browser, natural, attack):
    open_page(browser, natural.url)
    before = len(browser.find_elements(By.CSS_SELECTOR, "img, script, b, i"))
    entry = type_command(browser, attack)
    assert not browser.find_elements(By.ID, "pwned")
    assert browser.execute_script("return document.body.dataset.pwned") is None
    assert len(browser.find_elements(By.CSS_SELECTOR, "img, script, b, i")) == before
    assert attack.split("\n")[0] in text_of(entry)  # echoed as the text it is
    still_serving(browser, natural)


def test_without_the_token_the_page_is_refused(browser, natural):
    for url in (natural.base, natural.base + "not-the-token/", natural.url.rstrip("/")[:-2] + "/"):
        browser.get(url)
        assert "403" in browser.find_element(By.TAG_NAME, "body").text
        assert not browser.find_elements(By.ID, "input")
    open_page(browser, natural.url)
    still_serving(browser, natural)


def test_two_tabs_are_two_programs(browser, natural):
    open_page(browser, natural.url)
    type_command(browser, "mine := X0 Q[0]")
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    try:
        open_page(browser, natural.url)
        assert "unknown name 'mine'" in errors_in(type_command(browser, "show mine"))
        type_command(browser, "mine := Y")
        assert "Y" in text_of(type_command(browser, "show mine"))
    finally:
        browser.close()
        browser.switch_to.window(first)
    entry = type_command(browser, "show mine")
    assert "mine" in text_of(entry) and "Q_0" in entry.find_element(By.CSS_SELECTOR, "details pre").get_attribute(
        "textContent") + text_of(entry)


def test_a_looping_command_shows_it_runs_and_stops(browser, natural):
    open_page(browser, natural.url)
    for statement in ("dim big = 2000", "const B : big x big", "random 0"):  # 80 products of big matrices:
        type_command(browser, statement)  # long work that reaches no limit
    box = browser.find_element(By.ID, "input")
    box.send_keys("eval(trace(%s))" % " ".join(["B"] * 80), Keys.ENTER)
    status = browser.find_element(By.ID, "status")
    assert wait_for(lambda: status.is_displayed() and "running" in status.text, 10)
    time.sleep(1.5)
    assert "running" in status.text and box.get_attribute("readonly")
    browser.find_element(By.ID, "stop").click()
    assert wait_for(lambda: idle(browser), 15), "Stop did not stop it"
    assert "interrupted" in errors_in(entries(browser)[-1])
    assert "B" in text_of(type_command(browser, "show B"))  # the session kept its declarations
    still_serving(browser, natural)


def test_a_save_outside_its_folder_is_refused(browser, natural, tmp_path):
    open_page(browser, natural.url)
    type_command(browser, "random 0")
    target = tmp_path / "escape.npz"
    # refused by the program's own confinement (fdsl.base.files) or, below it, by the page's
    refused = re.compile(r"writes only inside its own folder|may write only inside its own folder")
    said = errors_in(type_command(browser, 'save "%s" X0' % target))
    assert refused.search(said), said
    assert not target.exists()
    said = errors_in(type_command(browser, 'save "../escape.npz" X0'))
    assert refused.search(said), said
    entry = type_command(browser, 'save "fine.npz" X0')
    assert errors_in(entry) == "" and entry.find_elements(By.CSS_SELECTOR, "a.download")
    still_serving(browser, natural)


def test_reset_starts_the_program_afresh(browser, natural):
    open_page(browser, natural.url)
    type_command(browser, "mine = X0")
    browser.find_element(By.ID, "reset").click()
    assert wait_for(lambda: idle(browser) and entries(browser) and "true, via" in text_of(entries(browser)[0]), 60)
    assert "unknown name 'mine'" in errors_in(type_command(browser, "show mine"))


def test_the_readme_screenshot_shows_the_console(browser):
    """The README's picture is of this page (docs/serve.png, made by tests/make_serve_screenshot.py)."""
    assert (ROOT / "docs" / "serve.png").is_file()
    assert "![fdsl serve" in (ROOT / "README.md").read_text()


# ---- issue 31, item 9: pictures, downloads, :load beside the file, names typeset as names ---------

SMALL_TRAINING = ("dim q = 2", "const P : q x q", "weight U : q x q", "v = form(P - U)", "random 0",
                  "r = train(v, 3, 0.1, 1)")


def test_a_plot_is_shown_and_a_saved_file_downloads(browser, natural, tmp_path):
    open_page(browser, natural.url)
    for statement in SMALL_TRAINING:
        assert errors_in(type_command(browser, statement)) == "", statement
    entry = type_command(browser, 'plot "loss.png" r')
    assert errors_in(entry) == ""
    shows_a_picture(browser, entry, "png")
    assert entry.find_element(By.CSS_SELECTOR, "a.download").text == "download loss.png"
    # the link of a save downloads the file itself, from the session's folder
    entry = type_command(browser, 'save "p.npz" P')
    link = entry.find_element(By.CSS_SELECTOR, "a.download")
    assert link.text == "download p.npz" and link.get_attribute("download") == "p.npz"
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    link.click()
    got = tmp_path / "p.npz"
    assert wait_for(lambda: got.is_file() and got.stat().st_size > 0 and not list(tmp_path.glob("*.crdownload")),
                    60), list(tmp_path.iterdir())
    import numpy as np

    with np.load(got) as arrays:
        assert [arrays[k].shape for k in arrays.files] == [(2, 2)]
    screenshot(browser, "plot_and_download.png")
    still_serving(browser, natural)


def test_load_reads_beside_the_served_file(browser, natural):
    open_page(browser, natural.url)
    type_command(browser, ":reset")
    entry = type_command(browser, ":load natural.fd")  # examples/natural.fd, the served file's neighbour
    assert errors_in(entry) == "" and "true, via encoder_5" in text_of(entry), text_of(entry)
    assert "no such file" in errors_in(type_command(browser, ":load no-such-file.fd"))


GLYPHS = """
const out = [];
const walk = (node) => {
  if (node.nodeType === 3 && node.textContent.trim()) {
    const range = document.createRange(); range.selectNodeContents(node);
    const r = range.getBoundingClientRect(); out.push([node.textContent, r.left, r.right]);
  } else if (node.nodeType === 1 && !node.classList.contains('katex-mathml')) node.childNodes.forEach(walk);
};
walk(arguments[0]);
return out;
"""


def glyphs(browser, entry):
    """The text of a typeset entry, run by run, with where each begins and ends on the screen."""
    return browser.execute_script(GLYPHS, entry.find_element(By.CSS_SELECTOR, ".math .katex-html"))


@pytest.mark.parametrize("command, first, second", [("show s s", "s", "s"), ("show s X0", "s", "X0")])
def test_the_factors_of_a_product_stand_apart(browser, natural, command, first, second):
    """``s s`` is two factors, not a name ss; ``s X0`` is s times X0, not a name sX0: KaTeX sets the
    letters of adjacent factors as one word unless a space stands between them (issue 31)."""
    open_page(browser, natural.url)
    entry = type_command(browser, command)
    runs = glyphs(browser, entry)
    texts = [text for text, _, _ in runs]
    at = next(i for i in range(len(texts) - 1) if texts[i] == first and texts[i + 1].startswith(second[0]))
    gap = runs[at + 1][1] - runs[at][2]
    size = browser.execute_script("return parseFloat(getComputedStyle(arguments[0]).fontSize)",
                                  entry.find_element(By.CSS_SELECTOR, ".katex"))
    assert gap > 0.1 * size, (runs, gap, size)  # a thin space is 1/6 em
    latex = entry.find_element(By.CSS_SELECTOR, "annotation").get_attribute("textContent")
    assert "\\," in latex, latex
