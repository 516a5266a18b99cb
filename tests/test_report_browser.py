"""The search report in a real browser (the e2e tier: `python -m pytest -m e2e`).

A short CPU search with real measurements (the learned cost model forecasting, two plain-PyTorch
kernels and a hostile one in the catalog, every skipped child audited) writes its report.html;
headless Chromium (Debian's chromium and chromium-driver, driven by selenium) opens it from disk,
clicks a node of the tree, and finds the node's code, diff and forecast, the Figure-4 curve, the
gate's charts and the ledger drawn, the hostile candidate's text shown as text, and no error in
the console. A screenshot of the page is written beside the run's report.html.
"""
import json
import shutil
import tempfile
import time

import pytest
from test_costmodel import TORCH_CHUNKED
from test_report import page_data

import search

pytestmark = pytest.mark.e2e

# a kernel whose code holds markup that would close the page's script and run another, and an
# OSC 52 sequence (a terminal's clipboard write): the page must show both as text
HOSTILE_LINE = '# </script><script>document.title = "owned"</script> \x1b]52;c;aGVsbG8=\x07\n'


def browser(tmp_path):
    """Headless Chromium with a fresh profile, nothing in the background reaching the network."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("needs Debian's chromium and chromium-driver (README: apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
              f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def wait_for(driver, script, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {script}")


def click_node(driver, node_id):
    """A real mouse click on a node of the tree, where plotly drew it."""
    from selenium.webdriver.common.action_chains import ActionChains
    driver.execute_script("document.getElementById('tree').scrollIntoView()")
    x, y = driver.execute_script("""
        const gd = document.getElementById('tree'), r = gd.getBoundingClientRect();
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        for (const t of gd.data) {
          const i = (t.customdata || []).indexOf(arguments[0]);
          if (i >= 0 && t.mode === 'markers') return [r.left + xa._offset + xa.l2p(t.x[i]), r.top + ya._offset + ya.l2p(t.y[i])];
        }""", node_id)
    actions = ActionChains(driver)
    actions.w3c_actions.pointer_action.move_to_location(int(x), int(y))
    actions.w3c_actions.pointer_action.pause(0.2)
    actions.w3c_actions.pointer_action.click()
    actions.perform()


def test_a_cpu_searchs_report_in_headless_chromium(tmp_path, monkeypatch, capsys):
    pytest.importorskip("measure")
    import measure
    import tasks
    # two plain-PyTorch kernels with a `# tune:` constant: the second step forecasts their edits
    monkeypatch.setattr(tasks, "variant_sources", lambda name, space="triton": {
        "torch_chunked": TORCH_CHUNKED, "hostile": HOSTILE_LINE + TORCH_CHUNKED})
    monkeypatch.setitem(measure.REPS, ("cpu", False), measure.REPS[("cpu", True)])  # --quick's timing: seconds each
    out = tmp_path / "run"
    argv = ["--task", "cross_entropy", "--forecaster", "costmodel", "--costmodel-min-labels", "2", "--mutations", "3", "--space", "triton",
            "--measure-per-parent", "1", "--budget", "2", "--audit", "1", "--scale", "cpu", "--out", str(out),
            "--no-progress"]
    assert search.main(argv) == 0, capsys.readouterr().err
    data = page_data(out / "report.html")
    run = data["runs"][0]
    nodes = {n["id"]: n for n in run["nodes"]}
    forecast = next(n for n in run["nodes"] if n["forecast"] and n["forecast"]["probs"] and n["measurement"]
                    and n["measurement"]["ok"])  # a child the cost model forecast, then measured
    hostile = next(n for n in run["nodes"] if n["code"] and "</script>" in n["code"])
    assert run["audit"]["requested"] > 0 and run["state"]["complete"]

    driver = browser(tmp_path)
    try:
        driver.get((out / "report.html").resolve().as_uri())
        wait_for(driver, "return document.body.dataset.ready")
        assert driver.execute_script("return document.getElementById('node').dataset.node") == run["best"] or "seed"
        click_node(driver, forecast["id"])
        wait_for(driver, f"return document.getElementById('node').dataset.node === {json.dumps(forecast['id'])}")
        text = lambda css: driver.execute_script(f"const e = document.querySelector({json.dumps(css)}); return e && e.textContent")
        assert text("#node-title").startswith(forecast["id"])
        assert text("#node-code") == forecast["code"]
        assert text("#forecast-words").startswith(f"forecast bin {forecast['forecast']['predicted_bin']} (")
        assert f"measured bin {forecast['measured_bin']}" in text("#forecast-words")
        assert wait_for(driver, "return document.querySelector('#forecast-chart .bars')")  # plotly drew the 8 bins
        assert text("#node-diff") and any(op[0] != "equal" for op in forecast["diff"])
        assert text("#node-gate") == forecast["gate"]["text"]
        # the rest of the page: Figure 4, the ledger, the gate's charts (drawn as they come into view)
        assert driver.execute_script("return document.querySelectorAll('#curve .scatterlayer .trace').length") >= 2
        assert "candidates considered" in text("#ledger")
        driver.execute_script("document.getElementById('reliability').scrollIntoView()")
        wait_for(driver, "return document.body.dataset.pending === '0'")
        for chart in ("gate", "confusion", "reliability"):
            assert driver.execute_script(f"return document.getElementById('{chart}').classList.contains('js-plotly-plot')")
        assert "audited skipped children" in text("#audit")
        # the hostile candidate, found by its id, shows its markup and its escape sequence as text
        driver.execute_script("""const f = document.getElementById('find'); f.value = arguments[0];
                                 f.dispatchEvent(new Event('change'));""", hostile["id"])
        wait_for(driver, f"return document.getElementById('node').dataset.node === {json.dumps(hostile['id'])}")
        shown = text("#node-code")
        assert '</script><script>document.title = "owned"</script>' in shown and "\\x1b]52;c;aGVsbG8=\\x07" in shown
        assert driver.title != "owned" and driver.execute_script("return document.scripts.length") == 3
        driver.execute_script("document.getElementById('tree').scrollIntoView()")
        click_node(driver, forecast["id"])
        driver.save_screenshot(str(out / "report.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
    finally:
        driver.quit()
    assert nodes[forecast["id"]]["forecast"]["model"]  # the page names the forecaster that said it
    print(f"screenshot: {out / 'report.png'}")
