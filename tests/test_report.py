"""Tests of the search report (report.py): the page's data from a small hand-made event log whose
tree, ledger and audit figures are known; the same figures as search.py's own summary on scripted
searches; the audit, which never changes what the search does; bad input (not a run, a torn or
damaged log, a run still going); a candidate's text kept as text; the command line and
search.py's pages (a run, a --compare pair). The browser test (e2e) opens a real CPU search's
page in headless Chromium: tests/test_report_browser.py.
"""
import base64
import gzip
import json
import re

import pytest
from test_search import BitMeasure, BitMutator, ScriptedForecaster, cfg, ones_forecast, peaked

import bins
import report
import search
from runtime.measure_pool import MeasurePool
from search import Search
from search_setup import Plan


def page_data(path):
    """The data a page carries, decoded as its script decodes them (base64, then gzip)."""
    text = path.read_text()
    blob = re.search(r'<script type="application/octet-stream" id="report-data">([A-Za-z0-9+/=]*)</script>', text)
    return json.loads(gzip.decompress(base64.b64decode(blob.group(1))))


# ---- a hand-made log whose every figure is known ----------------------------------------------------

CONFIG = dict(task="toy", protocol="ours", gate="topk", seed=0, parents=2, mutations=4, measure_per_parent=1,
              rank_by="expected_bin", score="maxprob", threshold=None, target_risk=0.3, delta=0.1, abstain=False,
              forecast_reward=False, parse_retries=0, min_labels=8, c=1.0, keep_children=2, capacity=1000,
              target_bin=None, mutator="catalog", scale="cpu", forecaster="scripted")


def measured(speedup, noise=0.01, status="ok", message="", seconds=2.0):
    m = dict(task="toy", status=status, speedup=speedup if status == "ok" else None, noise=noise if status == "ok" else None,
             cases=[dict(case={"n": 8}, reference_ms=1.0, candidate_ms=1.0 / speedup if speedup else None,
                         speedup=speedup, noise=noise, flags=[])],
             message=message, device="cpu", timer="parent clock: CPU time (Triton interpreter; not GPU times)",
             flags=[])
    return dict(measurement=m, worker="cpu:0", started=0.0, ended=seconds, seconds=seconds)


def forecast(bin_, conf=0.6, tokens=(100, 20)):
    p = peaked(bin_, conf)
    return dict(parse_failed=False, deferred=False, probs=p,
                record=dict(probs=p, parse_failed=False, deferred=False, readout="verbalized", model="m",
                            tokens_in=tokens[0], tokens_out=tokens[1], reasoning="because", raw=f"answer bin {bin_}"))


def handmade_events():
    """A topk search of budget 2, one measured per parent, with audits (F = 0.5):
    step 0: the seed's 4 mutations: one fails; c2 measured (2.0x), c0 and c3 skipped and audited
            (c0 1.5x: faster than its parent, a miss; c3 0.5x: no miss);
    step 1: s0p0c2's 2 mutations: c0 measured (compile error), c1 skipped with the budget spent."""
    ev, t = [], [1000.0]

    def add(kind, step, rid, parent, payload):
        t[0] += 1
        ev.append(dict(kind=kind, step=step, request_id=rid, parent_id=parent, payload=payload, time=t[0]))

    add("config", None, "config", None, CONFIG)
    add("seed", -1, "seed", None, {"code": "seed = 0\n"})
    add("request", -1, "seed", None, {"what": "measurement"})
    add("measurement", -1, "seed", None, measured(1.0, seconds=4.0))
    add("request", 0, "s0p0/mutate", "seed", {"what": "mutation"})
    add("mutation", 0, "s0p0/mutate", "seed", {"mutator": "catalog", "seconds": 0.5, "candidates": [
        {"code": "a = 1\n", "error": None, "meta": {"edit": "a"}},
        {"code": None, "error": "no block", "meta": {}},
        {"code": "b = 2\n", "error": None, "meta": {"edit": "b"}},
        {"code": "c = 3\n", "error": None, "meta": {"edit": "c"}}]})
    add("request", 0, "s0p0/forecast", "seed", {"what": "forecast"})
    add("forecast", 0, "s0p0/forecast", "seed", {"seconds": 3.0, "forecasts": [forecast(5), forecast(6), forecast(3)]})
    add("selection", 0, "s0p0/select", "seed", {"measure": ["s0p0c2"], "threshold": None,
                                                  "skip": {"s0p0c0": "below top-k", "s0p0c3": "below top-k"},
                                                  "audit": ["s0p0c0", "s0p0c3"], "audit_fraction": 0.5})
    add("request", 0, "s0p0c2", "seed", {"what": "measurement"})
    for rid in ("s0p0c0", "s0p0c3"):
        add("request", 0, rid, "seed", {"what": "audit"})
    add("measurement", 0, "s0p0c2", "seed", measured(2.0))
    add("audit", 0, "s0p0c0", "seed", measured(1.5))
    add("audit", 0, "s0p0c3", "seed", measured(0.5))
    add("step", 0, "step0", None, {"parents": ["seed"], "kept": {"seed": ["s0p0c2"]}, "best_speedup": 2.0,
                                    "measurements": 1, "archive_size": 2})
    add("request", 1, "s1p0/mutate", "s0p0c2", {"what": "mutation"})
    add("mutation", 1, "s1p0/mutate", "s0p0c2", {"mutator": "catalog", "seconds": 0.25, "candidates": [
        {"code": "d = 4\n", "error": None, "meta": {}}, {"code": "e = 5\n", "error": None, "meta": {}}]})
    add("request", 1, "s1p0/forecast", "s0p0c2", {"what": "forecast"})
    add("forecast", 1, "s1p0/forecast", "s0p0c2", {"seconds": 1.0, "forecasts": [forecast(7), forecast(2)]})
    add("selection", 1, "s1p0/select", "s0p0c2", {"measure": ["s1p0c0"], "threshold": None,
                                                  "skip": {"s1p0c1": "budget spent"}})
    add("request", 1, "s1p0c0", "s0p0c2", {"what": "measurement"})
    add("measurement", 1, "s1p0c0", "s0p0c2", measured(None, status="compile_error", message="SyntaxError: bad"))
    add("step", 1, "step1", None, {"parents": ["s0p0c2"], "kept": {"s0p0c2": []}, "best_speedup": 2.0,
                                    "measurements": 2, "archive_size": 2})
    add("end", None, "end", None, {"measurements": 2, "steps": 2, "budget": 2, "audits": 2})
    return ev


def write_log(folder, events):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def ledger(view):
    return dict(view["ledger"]["rows"])


def test_the_view_of_a_handmade_log(tmp_path):
    view = report.build_run(write_log(tmp_path / "run", handmade_events()))
    nodes = {n["id"]: n for n in view["nodes"]}
    # the tree: every child considered, under its parent; the failed mutation is no node
    assert {k: n["parent"] for k, n in nodes.items()} == {
        "seed": None, "s0p0c0": "seed", "s0p0c2": "seed", "s0p0c3": "seed", "s1p0c0": "s0p0c2", "s1p0c1": "s0p0c2"}
    assert nodes["s0p0c2"]["code"] == "b = 2\n" and nodes["seed"]["code"] == "seed = 0\n"
    assert nodes["s0p0c2"]["diff"] == [["replace", 0, 1, 0, 1], ["equal", 1, 2, 1, 2]]  # difflib's opcodes
    # PUCT's visits, replayed: the seed's expansion and its child's (back-propagated to the seed)
    assert {k: n["archive"]["visits"] for k, n in nodes.items() if n["archive"]["kept"]} == {"seed": 2, "s0p0c2": 1}
    assert nodes["s0p0c2"]["archive"]["picked_at"] == [1] and not nodes["s0p0c0"]["archive"]["kept"]
    assert view["best"] == "s0p0c2" and [k for k, n in nodes.items() if n["best_path"]] == ["seed", "s0p0c2"]
    # each decision, with its reason; forecasts and measured bins
    assert nodes["s0p0c2"]["gate"]["text"].startswith("measured: among this parent's 1 best")
    assert nodes["s0p0c0"]["gate"]["reason"] == "below top-k" and nodes["s1p0c1"]["gate"]["reason"] == "budget spent"
    assert nodes["s0p0c2"]["forecast"]["predicted_bin"] == 6 and nodes["s0p0c2"]["measured_bin"] == 6
    assert nodes["s0p0c0"]["measured_bin"] == 5  # by its audit: 1.5x
    assert nodes["s0p0c2"]["forecast"]["raw"] == "answer bin 6"
    assert nodes["s1p0c0"]["measurement"]["status"] == "compile_error" and nodes["s1p0c0"]["gain"] is None
    # the noise: 2.0x over a 1.0x parent, both +-1%, is far beyond two standard errors
    assert nodes["s0p0c2"]["gain"] == {"ratio": 2.0, "within_noise": False}
    assert nodes["seed"]["gain"] == {"ratio": 1.0, "within_noise": True}
    # Figure 4, as search.py draws it
    assert view["curve"]["points"] == [[0, 1.0], [1, 2.0], [2, 2.0]]
    assert [g["node"] for g in view["curve"]["gains"]] == ["seed", "s0p0c2"]
    assert view["state"]["complete"] and view["state"]["text"].startswith("complete: 2 measurements")
    # the ledger
    led = ledger(view)
    assert led["candidates proposed"] == "6 (1 failed mutations, 0 repeats of earlier code)"
    assert led["candidates considered"] == "5"
    assert led["forecast"].startswith("5 (0 did not parse")
    assert led["measured"] == "2 sent: 1 ok, 1 failed (1 compile_error)"
    assert led["skipped"] == "3 (2 below top-k, 1 budget spent)"
    assert led["seconds measuring"] == "8.0 s (3 measurements, the seed's included)"  # 4 + 2 + 2
    assert led["seconds forecasting"] == "4.0 s" and led["seconds mutating"] == "0.8 s"
    assert led["forecaster tokens in / out"] == "500 / 100"
    assert led["considered per measurement"] == "2.50"
    assert "interpreter" in led["times"]  # a log before --space: the Triton kernels, in the interpreter
    assert "Triton kernels run by its interpreter" in view["ledger"]["cpu"]
    # no measurement recorded what it cost when made (measure.py's wall_s): nothing to add up
    assert led["measuring's cost, builds included"] == "not recorded"


def test_the_ledger_adds_up_what_measuring_and_forecasting_cost_on_a_cpu_space_run(tmp_path):
    """Issue 43: what measuring cost with the builds in it (wall_s when made, a cached one too; the
    build measure.py's build_s, else import and correctness seconds), what a forecast cost."""
    events = handmade_events()
    events[0]["payload"] = {**CONFIG, "space": "cpu"}
    costs = {"seed": dict(wall_s=10.0, import_s=0.5, check_s=1.5),  # 2 s of build, as an older record says it
             "s0p0c2": dict(wall_s=50.0, import_s=2.0, check_s=40.0, build_s=38.0, cached=True),
             "s1p0c0": dict(wall_s=6.0, import_s=6.0)}  # a compile error: its import was all of it
    for e in events:
        if e["kind"] == "measurement":
            e["payload"]["measurement"].update(costs[e["request_id"]])
    view = report.build_run(write_log(tmp_path / "run", events))
    led = ledger(view)
    assert led["measuring's cost, builds included"].startswith("66.0 s, 46.0 s of it building the kernels")
    assert "the 1 from the cache count what they cost when made" in led["measuring's cost, builds included"]
    # 5 forecasts in 4 s; 66 s over 3 measurements
    assert led["a forecast against a measurement"] == "0.80 s a forecast, 22.0 s a measurement: one measurement costs 28 forecasts"
    assert "CPU kernels" in led["times"] and "interpreter" not in view["ledger"]["cpu"]
    # the audit: 1 of 2 audited skipped children beat its parent; the exact interval of 1/2
    a = view["audit"]
    assert (a["requested"], a["eligible"], a["scored"], a["misses"], a["beat_best"]) == (2, 2, 2, 1, 0)
    assert a["rate"] == 0.5 and a["interval"] == pytest.approx((0.012579, 0.987421), abs=1e-6)
    assert a["miss_nodes"] == ["s0p0c0"] and a["estimated_misses"][0] == 1.0 and a["fraction"] == 0.5
    assert "1 of 2 audited skipped children were faster than their parent" in report.audit_summary(a)
    # the gate over time and the confusion of the two measured forecasts (one did: the failed kernel has no bin)
    assert view["calibration"]["n"] == 1 and view["calibration"]["confusion"][5][5] == 1
    assert view["gate"]["mismatch"] == [{"x": 1, "all": 0.0, "trusted": None}]


def test_the_ledger_names_each_models_tokens_for_what_it_is(tmp_path):
    # the embedded mutator is a language model (SmolLM2): its tokens are counted, not denied; a
    # gated run whose forecasts carry no tokens says why, never "no gate"
    events = handmade_events()
    for e in events:
        if e["kind"] == "config":
            e["payload"] = dict(e["payload"], mutator="embedded")
        if e["kind"] == "mutation":
            for c in e["payload"]["candidates"]:
                c["meta"] = dict(c["meta"], tokens_in=700, tokens_out=300, reply="```python\nx\n```")
    led = ledger(report.build_run(write_log(tmp_path / "embedded", events)))
    assert led["mutator tokens in / out"] == "3,500 / 1,500"  # the 5 children's, the failed mutation's not
    for e in events:
        if e["kind"] == "config":
            e["payload"] = dict(e["payload"], forecaster="costmodel (online, LightGBM, gates from 5 labels)")
        if e["kind"] == "forecast":
            for f in e["payload"]["forecasts"]:
                f["record"] = dict(f["record"], tokens_in=None, tokens_out=None)
    led = ledger(report.build_run(write_log(tmp_path / "costmodel", events)))
    assert led["forecaster tokens in / out"] == "none: the cost model is no language model"


def test_the_trees_marks_tell_a_measured_node_from_a_skipped_one(tmp_path):
    # a measured node at parity is filled with a colour no one takes for the grey ring of a skipped
    # child, and one within the noise of its parent is marked by its symbol, not faded toward white
    events = handmade_events()
    for e in events:
        if e["kind"] == "measurement" and e["request_id"] == "s0p0c2":
            e["payload"] = measured(1.005)  # 1.005x over a 1.0x parent, both +-1%: within the noise
    view = report.build_run(write_log(tmp_path / "run", events))
    traces = {t.get("name"): t for t in report.tree_figure(view)["data"]}
    assert traces["skipped: forecast only"]["marker"]["symbol"] == "circle-open"
    noise = next(t for name, t in traces.items() if name and name.startswith("measured, within the noise"))
    assert noise["marker"]["symbol"] == "circle-dot" and "opacity" not in noise["marker"]
    parity = dict(report.COLORS)[0.5]
    assert parity.lower() not in ("#d9d9d9", "#999999", "#ffffff") and parity != traces["skipped: forecast only"]["marker"]["color"]


@pytest.mark.parametrize("k, n, interval", [(0, 10, (0.0, 0.308497)), (3, 12, (0.054861, 0.571858)),
                                            (10, 10, (0.691503, 1.0))])
def test_clopper_pearson_matches_the_beta_quantiles(k, n, interval):
    # the reference values are scipy.stats.beta's quantiles, the textbook form of the interval
    assert report.clopper_pearson(k, n) == pytest.approx(interval, abs=1e-6)


def test_an_old_log_reads_with_what_it_has(tmp_path):
    # a log from before the report: no seed note, no end, no labels, no audits, no prompt; the seed's
    # code comes from archive.json and completion from summary.json
    events = [e for e in handmade_events() if e["kind"] not in ("seed", "end", "audit")]
    for e in events:
        if e["kind"] == "selection":
            e["payload"] = {k: v for k, v in e["payload"].items() if not k.startswith("audit")}
        if e["kind"] == "forecast":
            for f in e["payload"]["forecasts"]:
                del f["record"]["raw"]
    folder = write_log(tmp_path / "old", [e for e in events if not (e["kind"] == "request" and e["payload"]["what"] == "audit")])
    (folder / "archive.json").write_text(json.dumps({"nodes": [{"id": "seed", "is_seed": True, "code": "seed = 0\n"}]}))
    (folder / "summary.json").write_text(json.dumps({"measurements": 2, "budget": 2}))
    view = report.build_run(folder)
    nodes = {n["id"]: n for n in view["nodes"]}
    assert nodes["seed"]["code"] == "seed = 0\n" and nodes["s0p0c2"]["forecast"]["raw"] is None
    assert view["state"]["complete"] and "summary.json" in view["state"]["text"]
    assert view["audit"]["requested"] == 0 and "--audit F" in report.audit_summary(view["audit"])


# ---- bad input --------------------------------------------------------------------------------------

def test_a_torn_last_line_is_named_and_the_log_left_as_it_is(tmp_path):
    folder = write_log(tmp_path / "run", handmade_events())
    with open(folder / "events.jsonl", "a") as f:
        f.write('{"kind": "measurement", "step": 2, "requ')
    before = (folder / "events.jsonl").read_bytes()
    view = report.build_run(folder)
    torn = len(before.splitlines())
    assert any(f"line {torn} is torn" in n for n in view["state"]["notes"])
    assert (folder / "events.jsonl").read_bytes() == before  # a view never writes to the log


def test_a_run_still_going_shows_what_is_there(tmp_path):
    events = handmade_events()
    cut = next(i for i, e in enumerate(events) if e["kind"] == "measurement" and e["request_id"] == "s1p0c0")
    view = report.build_run(write_log(tmp_path / "run", events[:cut]))
    nodes = {n["id"]: n for n in view["nodes"]}
    assert nodes["s1p0c0"]["in_flight"] and not view["state"]["complete"]
    assert view["state"]["text"].startswith("no end recorded: 2 measurements sent")
    assert any("s1p0c0" in n for n in view["state"]["notes"])
    assert view["curve"]["points"] == [[0, 1.0], [1, 2.0]]  # the point in flight is not drawn


def test_a_run_that_only_began_or_whose_seed_failed_is_drawn_as_such(tmp_path):
    events = handmade_events()
    view = report.build_run(write_log(tmp_path / "begun", events[:3]))  # the seed's measurement sent
    assert view["nodes"][0]["in_flight"] and view["curve"]["points"] == [] and view["best"] is None
    failed = dict(events[3], payload=measured(None, status="compile_error", message="SyntaxError"))
    view = report.build_run(write_log(tmp_path / "failed", events[:3] + [failed]))
    assert view["state"]["text"].startswith("stopped: the seed did not measure ok (compile_error: SyntaxError)")
    assert ledger(view)["seed speedup"] == "compile_error"
    assert report.write_report([tmp_path / "begun", tmp_path / "failed"], tmp_path / "both.html").stat().st_size > 0


def test_bad_folders_are_one_line_errors_and_write_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    damaged = write_log(tmp_path / "damaged", handmade_events())
    lines = (damaged / "events.jsonl").read_text().splitlines()
    lines[3] = lines[3][:40]
    (damaged / "events.jsonl").write_text("\n".join(lines) + "\n")
    no_config = write_log(tmp_path / "noconfig", handmade_events()[1:])
    for folder, words in ((tmp_path / "empty", "holds no events.jsonl"), (tmp_path / "missing", "no such folder"),
                          (damaged, "events.jsonl:4: not valid JSON"), (no_config, "holds no config event")):
        assert report.main([str(folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and "Traceback" not in err[0], err
        assert not (folder / "report.html").exists()
    assert report.main([str(damaged), str(no_config)]) == 2
    assert "pass --out" in capsys.readouterr().err


# ---- a candidate's text stays text ---------------------------------------------------------------

HOSTILE = 'x = "</script><script>alert(1)</script>"  # \x1b]52;c;aGVsbG8=\x07 <img src=x onerror=alert(2)>\n'


def test_a_candidates_text_is_escaped_and_cannot_close_the_data(tmp_path):
    events = handmade_events()
    mutation = next(e for e in events if e["kind"] == "mutation")
    mutation["payload"]["candidates"][2]["code"] = HOSTILE
    folder = write_log(tmp_path / "run", events)
    page = report.write_report([folder], folder / "report.html")
    text = page.read_text()
    frame = re.sub(r"<script>.*?</script>", "", text, flags=re.S)  # the page without plotly.js and its own code
    assert "alert(1)" not in frame and "\x1b" not in frame and "onerror" not in frame  # not even in the raw page
    assert text.count("<script") == 3  # plotly.js, the data, the page's code: nothing more
    node = next(n for n in page_data(page)["runs"][0]["nodes"] if n["id"] == "s0p0c2")
    assert "</script><script>alert(1)</script>" in node["code"]  # kept, to be shown as text
    assert "\\x1b]52;c;aGVsbG8=\\x07" in node["code"] and "\x1b" not in node["code"]
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text).group(1)
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp.split("style-src")[0]


def test_a_diff_rebuilds_the_childs_code_from_its_parents(tmp_path):
    events = handmade_events()
    parent = "import torch\n\n" + "".join(f"x{i} = {i}\n" for i in range(40))
    child = parent.replace("x3 = 3", "x3 = 33").replace("x30 = 30\n", "") + "y = 1\r\n"
    events[1]["payload"]["code"] = parent
    next(e for e in events if e["kind"] == "mutation")["payload"]["candidates"][2]["code"] = child
    view = report.build_run(write_log(tmp_path / "run", events))
    nodes = {n["id"]: n for n in view["nodes"]}
    old, rebuilt = nodes["seed"]["code"].split("\n"), []
    for tag, i1, i2, j1, j2 in nodes["s0p0c2"]["diff"]:  # what the page's code does with them
        rebuilt += old[i1:i2] if tag == "equal" else nodes["s0p0c2"]["code"].split("\n")[j1:j2]
    assert "\n".join(rebuilt) == nodes["s0p0c2"]["code"] == child.replace("\r", "\\x0d")
    assert [op[0] for op in nodes["s0p0c2"]["diff"]] == ["equal", "replace", "equal", "delete", "equal", "insert", "equal"]


def test_visible_keeps_lines_and_tabs_and_cuts_long_text():
    assert report.visible("a\tb\nc\x1bd\u202e") == "a\tb\nc\\x1bd\\u202e"
    long = "x" * 10_000
    shown = report.visible(long, cap=600, where="events.jsonl, line 7")
    assert len(shown) < 800 and "9,400 characters left out here" in shown and "line 7" in shown


# ---- the page's figures agree with search.py's own accounts ----------------------------------------------

class NoisyBitMeasure(BitMeasure):
    """BitMeasure with a noise figure (+-2% at one standard error), as measure.py reports."""

    def __call__(self, task, source, **kw):
        m = super().__call__(task, source, **kw)
        d = m.to_dict()
        if m.status == "ok":
            d["noise"] = 0.02

        class M:
            status, speedup = m.status, m.speedup

            def to_dict(self):
                return d
        return M()


def scripted(tmp_path, name, **kw):
    with MeasurePool(["cpu"], measure_fn=kw.pop("measure", None) or NoisyBitMeasure()) as pool:
        s = Search(cfg(**kw), tmp_path / name, seed_code="00000000\n", mutator=BitMutator(fail_every=5), pool=pool,
                   forecaster=kw.get("forecaster"), progress=False, say=lambda *a: None)
        return s, s.run()


@pytest.mark.parametrize("gate", ["none", "topk", "confidence"])
def test_the_page_agrees_with_the_searchs_summary(tmp_path, gate):
    kw = dict(gate=gate, budget=16, mutations=6 if gate != "none" else 4, measure_per_parent=2, min_labels=3,
              target_risk=0.5)
    if gate == "topk":
        kw["forecaster"] = ScriptedForecaster(ones_forecast)
    if gate == "confidence":  # right about every bin, and sure of it: the gate comes to trust it
        kw["forecaster"] = ScriptedForecaster(lambda code: peaked(bins.speedup_to_bin(1 + code.count("1")), 0.9))
    s, summary = scripted(tmp_path, gate, **kw)
    view = report.build_run(tmp_path / gate)
    nodes = {n["id"]: n for n in view["nodes"]}
    assert view["curve"]["points"] == [list(p) for p in summary["best_vs_measurements"]]
    assert view["best"] == summary["best_node"] and view["state"]["complete"]
    kept = {n_id for n_id, n in nodes.items() if n["archive"]["kept"]}
    assert kept == set(s.archive.nodes)
    assert {i: nodes[i]["archive"]["visits"] for i in kept} == {i: n.visits for i, n in s.archive.nodes.items()}
    assert sum(1 for n in nodes.values() if n["call"]) == summary["candidates_considered"]
    assert sum(1 for n in nodes.values() if n["number"]) == summary["measurements"]
    assert sum(n["gate"]["outcome"] == "skipped" for n in nodes.values()) == summary["skipped"]
    led = ledger(view)
    assert led["candidates proposed"].startswith(f"{summary['candidates_proposed']} ({summary['failed_mutations']} failed "
                                                 f"mutations, {summary['duplicates']} repeats")
    assert led["forecast"].split()[0] == str(summary["forecasts"])
    if gate == "confidence":  # the trust the page derives is the gate's: measured ones predicted a gain or deferred
        for n in nodes.values():
            if n["gate"]["outcome"] == "skipped" and n["gate"]["reason"] == "confident: no gain over parent":
                assert n["gate"]["trust"] == "trusted"
        assert any(n["gate"]["trust"] == "trusted" for n in nodes.values())
        assert all(s_["labels"] is not None for s_ in view["gate"]["selections"])


def test_audits_are_measured_outside_the_budget_and_never_change_the_search(tmp_path):
    kw = dict(gate="topk", budget=10, mutations=6, measure_per_parent=2, forecaster=ScriptedForecaster(ones_forecast))
    plain, plain_summary = scripted(tmp_path, "plain", **kw)
    measure = NoisyBitMeasure()
    audited, summary = scripted(tmp_path, "audited", audit=0.5, measure=measure, **kw)
    assert audited.archive.to_dict() == plain.archive.to_dict()
    assert summary["best_vs_measurements"] == plain_summary["best_vs_measurements"]
    assert summary["measurements"] == 10 and summary["audits"] > 0 and plain_summary["audits"] == 0
    assert len(measure.calls) == 1 + 10 + summary["audits"]  # the seed, the budget, the audits beside it
    events = [json.loads(line) for line in (tmp_path / "audited" / "events.jsonl").read_text().splitlines()]
    audits = [e for e in events if e["kind"] == "audit"]
    skipped = {cid for e in events if e["kind"] == "selection" for cid, why in e["payload"]["skip"].items()
               if why != "budget spent"}
    assert len(audits) == summary["audits"] and {e["request_id"] for e in audits} <= skipped
    assert 0 < len(audits) < len(skipped)  # about half
    rows = (tmp_path / "audited" / "training_rows.jsonl").read_text()
    assert not any(e["request_id"] in rows for e in audits)  # never a training row
    view = report.build_run(tmp_path / "audited")
    a = view["audit"]
    assert a["requested"] == a["done"] == summary["audits"] and a["eligible"] == len(skipped)
    faster = 0
    for e in audits:  # a miss: faster than its parent, as BitMeasure's speedups (1 + ones) say
        node = next(n for n in view["nodes"] if n["id"] == e["request_id"])
        parent = next(n for n in view["nodes"] if n["id"] == node["parent"])
        faster += e["payload"]["measurement"]["speedup"] > parent["measurement"]["speedup"]
    assert a["misses"] == faster and a["rate"] == faster / len(audits)
    # a rerun replays the audits from the log: nothing measured again, the same page data
    again = NoisyBitMeasure()
    scripted(tmp_path, "audited", audit=0.5, measure=again, **kw)
    assert again.calls == [] and report.build_run(tmp_path / "audited")["audit"] == a


def test_audit_must_be_a_fraction(capsys):
    assert search.main(["--task", "cross_entropy", "--audit", "1.5"]) == 2
    assert "--audit" in capsys.readouterr().err


# ---- search.py's pages and report.py's command line ------------------------------------------------------

def test_search_writes_its_page_and_a_compare_page_holds_both(tmp_path, monkeypatch, capsys):
    measure = BitMeasure()
    plan = Plan(scale="cpu", mutator=BitMutator(), mutator_name="bits", forecaster=ScriptedForecaster(ones_forecast),
                forecaster_name="scripted", budget=6, gated_mutations=8, measure_kwargs={},
                pool=MeasurePool(["cpu"], measure))
    monkeypatch.setattr(search, "plan_search", lambda args, say=print: plan)
    monkeypatch.setattr("tasks.seed_source", lambda name: "0" * 12 + "\n")
    out = tmp_path / "cmp"
    assert search.main(["--task", "cross_entropy", "--compare", "--audit", "0.5", "--out", str(out), "--no-progress"]) == 0
    assert "report.html" in capsys.readouterr().out
    both = page_data(out / "report.html")
    assert [r["config"]["gate"] for r in both["runs"]] == ["none", "topk"]
    assert len(both["curve"]["data"]) == 4  # a step line and its new-best dots per run
    for arm in ("ungated", "gated"):
        one = page_data(out / arm / "report.html")
        assert [r["name"] for r in one["runs"]] == [arm] and one["runs"][0]["state"]["complete"]
    assert both["runs"][1]["audit"]["requested"] > 0
    # report.py rebuilds the same page from the folders alone, and any two runs side by side
    (out / "report.html").unlink()
    assert report.main([str(out)]) == 0
    assert page_data(out / "report.html")["runs"] == both["runs"]
    assert report.main([str(out / "gated"), str(out / "ungated"), "--out", str(tmp_path / "ab.html")]) == 0
    assert [r["name"] for r in page_data(tmp_path / "ab.html")["runs"]] == ["gated", "ungated"]
    assert "open it in a browser" in capsys.readouterr().out


def test_a_page_that_cannot_be_drawn_leaves_the_search_done(tmp_path, monkeypatch, capsys):
    def broken(runs, path):
        raise ValueError("drawing failed")
    monkeypatch.setattr(report, "write_report", broken)
    said = []
    search.write_report([tmp_path / "run"], tmp_path / "run" / "report.html", said.append)
    assert len(said) == 1 and "drawing failed" in said[0] and "python report.py" in said[0]
