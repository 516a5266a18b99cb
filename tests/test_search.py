"""Tests of the kernel search (search.py): its loop, budget, event log and resume, parallel
measurements, outputs and command line.

Most tests run the search with scripted collaborators (a fake measure function, a scripted
forecaster, deterministic mutators), so they need neither a GPU nor an LLM; test_gate.py,
test_search_protocol.py, test_measure_pool.py and test_records.py use them too. The end-to-end
tests run the real main command on CPU: one with real measurements, then its resume; one gated,
with a fake embedded forecaster, to check that resuming a finished run loads no model.
"""
import hashlib
import json
import math
import random
import threading
import time
import types

import pytest
from test_mutators import RecordingBackend

import bins
import search
from mutators import LLMMutator
from runtime.measure_pool import MeasurePool
from search import Args, Search, SearchError
from search_setup import Plan

# ---- scripted collaborators ------------------------------------------------------------------

class FakeMeasurement:
    def __init__(self, status, speedup=None, message="", cases=None, **seconds):
        self.status, self.speedup, self.message = status, speedup, message
        self.cases = cases or []
        self.seconds = seconds  # wall_s, import_s, check_s, build_s, as measure.py reports them

    def to_dict(self):
        return dict(status=self.status, speedup=self.speedup, cases=self.cases, message=self.message,
                    device="FakeGPU", timer="fake", **self.seconds)


class BitMeasure:
    """Reward of a bit-string 'kernel' = 1 + number of ones; 'x' in the code -> compile error."""

    def __init__(self, crash_after=None):
        self.calls, self.crash_after = [], crash_after

    def __call__(self, task, source, **kw):
        if self.crash_after is not None and len(self.calls) >= self.crash_after:
            raise RuntimeError("simulated crash of the measuring process")
        self.calls.append(source)
        if "x" in source:
            return FakeMeasurement("compile_error", message="SyntaxError: bad kernel")
        return FakeMeasurement("ok", 1.0 + source.count("1"))


class BitMutator:
    """Children = single-bit flips of the parent, deterministic for the key."""

    name = "bits"

    def __init__(self, fail_every=0):
        self.fail_every = fail_every

    def propose(self, parent, n, seen, key):
        bits = parent.code.strip()
        flips = list(range(len(bits)))
        random.Random(key).shuffle(flips)
        out = []
        for i in flips:
            code = bits[:i] + ("1" if bits[i] == "0" else "0") + bits[i + 1:] + "\n"
            if code.strip() not in seen:
                out.append({"code": code, "error": None, "meta": {"flip": i}})
            if len(out) == n:
                break
        if self.fail_every:
            out = [c if (k + 1) % self.fail_every else {"code": None, "error": "no block", "meta": {}}
                   for k, c in enumerate(out)]
        return out


class FakeForecast:
    def __init__(self, probs):
        self.parse_failed = probs is None
        self.probs = None if probs is None else list(bins.as_probs(probs))

    def to_dict(self):
        return {"probs": self.probs, "parse_failed": self.parse_failed}


def peaked(bin_, conf):
    """A forecast putting `conf` on one bin and spreading the rest evenly."""
    p = [(1 - conf) / 7] * 8
    p[bin_ - 1] = conf
    return p


class ScriptedForecaster:
    """Forecast = script(code) (a list of 8 probabilities or None for a parse failure)."""

    def __init__(self, script):
        self.script, self.calls = script, 0

    def forecast_many(self, task, reference_code, codes):
        self.calls += len(codes)
        return [FakeForecast(self.script(code)) for code in codes]


def ones_forecast(code):
    """Scripted: the more ones, the higher the forecast bin (a perfectly ranking forecaster)."""
    return peaked(min(8, 1 + code.count("1")), 0.6)


def cfg(**kw):
    base = dict(task="toy", gate="none", seed=0, steps=50, budget=12, parents=2, mutations=4,
                measure_per_parent=4, mutator="bits", scale="cpu")
    base.update(kw)
    return Args(**base)


def run(tmp_path, name="run", seed_code="00000000\n", measure=None, forecaster=None, mutator=None,
        workers=1, llm_waits=False, **kw):
    measure = measure or BitMeasure()
    with MeasurePool(["cpu"] * workers, measure_fn=measure) as pool:
        s = Search(cfg(**kw), tmp_path / name, seed_code=seed_code, mutator=mutator or BitMutator(),
                   pool=pool, forecaster=forecaster, llm_waits=llm_waits, progress=False, say=lambda *a: None)
        return s, s.run(), measure


# ---- the search on a toy problem --------------------------------------------------------------

def test_convergence_on_bit_strings(tmp_path):
    s, summary, measure = run(tmp_path, budget=80, steps=40)
    assert summary["best_speedup"] == 9.0  # all eight bits set
    assert summary["measurements"] <= 80
    assert s.archive.best().code.strip() == "11111111"
    assert len(measure.calls) == len(set(measure.calls))  # never measures the same code twice


@pytest.mark.parametrize("budget", [1, 5, 7, 12])
def test_budget_never_exceeded(tmp_path, budget):
    _, summary, measure = run(tmp_path, budget=budget, parents=2, mutations=4)
    assert summary["measurements"] == budget
    assert len(measure.calls) == budget + 1  # + the seed, which the budget does not count


def test_off_a_terminal_the_search_says_where_it_is_a_line_at_a_time(tmp_path, monkeypatch, capsys):
    # into a log (capsys: no terminal) no bar, but a line every GPU_FORECASTERS_PROGRESS_S seconds
    # with the measurements done and the time left; a rerun's measurements come from its log, in
    # no time, and do not make the pace
    monkeypatch.setenv("GPU_FORECASTERS_PROGRESS_S", "0.05")

    def slow(task, source, **kw):
        time.sleep(0.2)  # a few of the progress's ticks a measurement
        return BitMeasure()(task, source)

    def search(budget):
        with MeasurePool(["cpu"], measure_fn=slow) as pool:
            return Search(cfg(budget=budget), tmp_path / "run", seed_code="00000000\n", mutator=BitMutator(),
                          pool=pool, progress=True, say=lambda *a: None, expected_s=30).run()
    search(6)
    lines = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(lines) and lines[0].startswith("search (none gate): 0 of 6 measurements, ")
    assert lines[0].endswith("left (the start-up estimate)")
    assert any(x.startswith("search (none gate): 4 of 6 measurements") and "start-up" not in x for x in lines)
    assert lines[-1].startswith("search (none gate): 6 of 6 measurements in ")
    search(8)  # a rerun that extends it: 6 from the log, 2 measured now
    resumed = capsys.readouterr().err.splitlines()
    replayed = [x for x in resumed if x.startswith("search (none gate): 6 of 8 measurements,")]
    assert replayed and all(x.endswith("(the start-up estimate)") for x in replayed)  # no pace from the replay


def test_failed_candidates_count_as_visits_but_never_enter_the_archive(tmp_path):
    # 'x' kernels fail to compile; a mutator that only proposes them leaves the seed alone.
    class Broken:
        name = "broken"

        def propose(self, parent, n, seen, key):
            return [{"code": f"x{key}-{i}\n", "error": None, "meta": {}} for i in range(n)]

    s, summary, _ = run(tmp_path, mutator=Broken(), budget=8, parents=2, mutations=4)
    assert summary["measurements"] == 8 and summary["failed_measurements"] == 8
    assert list(s.archive.nodes) == ["seed"]
    assert s.archive.nodes["seed"].visits == 2 and s.archive.expansions == 2
    assert s.archive.nodes["seed"].info["last_failure"]["status"] == "compile_error"
    assert summary["training_rows"] == 1  # only the seed has a speedup


def test_failed_mutations_are_recorded_and_not_measured(tmp_path):
    _, summary, measure = run(tmp_path, mutator=BitMutator(fail_every=2), budget=6, mutations=4)
    assert summary["failed_mutations"] > 0
    assert summary["candidates_proposed"] == summary["candidates_considered"] + summary["failed_mutations"]
    assert len(measure.calls) == 7


# ---- event log and resume -------------------------------------------------------------------------

@pytest.mark.parametrize("gate", ["none", "topk"])
def test_kill_and_resume_matches_an_uninterrupted_run(tmp_path, gate):
    kw = dict(gate=gate, budget=10, mutations=4 if gate == "none" else 6, measure_per_parent=2)
    ref, ref_summary, ref_measure = run(tmp_path, "ref", forecaster=ScriptedForecaster(ones_forecast), **kw)

    first = BitMeasure(crash_after=5)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(tmp_path, "crashy", measure=first, forecaster=ScriptedForecaster(ones_forecast), **kw)
    crashed = [json.loads(l) for l in (tmp_path / "crashy" / "events.jsonl").read_text().splitlines()]
    unanswered = {e["request_id"] for e in crashed if e["kind"] == "request"} - \
        {e["request_id"] for e in crashed if e["kind"] != "request"}
    second = BitMeasure()
    again, summary, _ = run(tmp_path, "crashy", measure=second, forecaster=ScriptedForecaster(ones_forecast), **kw)

    assert first.calls + second.calls == ref_measure.calls  # nothing measured twice, nothing lost
    assert again.archive.to_dict() == ref.archive.to_dict()
    assert summary["measurements"] == ref_summary["measurements"]
    events = [json.loads(l) for l in (tmp_path / "crashy" / "events.jsonl").read_text().splitlines()]
    rids = [e["request_id"] for e in events if e["kind"] == "measurement"]
    assert len(rids) == len(set(rids))
    assert all(set(e) == {"kind", "step", "request_id", "parent_id", "payload", "time"} for e in events)
    # The crashed request, and the rest of its step's measurements sent with it, were logged
    # without a result, then issued again, once each.
    reqs = [e["request_id"] for e in events if e["kind"] == "request"]
    assert unanswered and len(reqs) == len(set(reqs)) + len(unanswered)


def test_rerun_of_a_finished_run_measures_nothing(tmp_path):
    run(tmp_path, budget=6)
    measure = BitMeasure()
    _, summary, _ = run(tmp_path, budget=6, measure=measure)
    assert measure.calls == [] and summary["measurements"] == 6
    # A bigger budget extends the same run.
    _, summary, _ = run(tmp_path, budget=8, measure=measure)
    assert len(measure.calls) == 2 and summary["measurements"] == 8


def test_corrupt_last_line_is_dropped(tmp_path):
    run(tmp_path, budget=4)
    log = tmp_path / "run" / "events.jsonl"
    n_lines = len(log.read_text().splitlines())
    with open(log, "a") as f:
        f.write('{"kind": "measurement", "step": 3, "requ')  # a write torn by a crash
    measure = BitMeasure()
    _, summary, _ = run(tmp_path, budget=4, measure=measure)
    assert measure.calls == [] and summary["measurements"] == 4
    lines = log.read_text().splitlines()
    assert len(lines) == n_lines and all(json.loads(l) for l in lines)


def test_mismatched_configuration_is_refused(tmp_path):
    run(tmp_path, budget=2, gate="none")
    with pytest.raises(SearchError, match="gate='none'.*gate='topk'"):
        run(tmp_path, budget=2, gate="topk", forecaster=ScriptedForecaster(ones_forecast))
    with pytest.raises(SearchError, match="seed=0.*seed=1"):
        run(tmp_path, budget=2, seed=1)


def test_cli_refuses_a_mismatched_out_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "events.jsonl").write_text(json.dumps({"kind": "config", "step": None, "request_id": "config",
                                                  "parent_id": None, "payload": {"task": "trimul"}, "time": 0}) + "\n")
    rc = search.main(["--task", "cross_entropy", "--gate", "none", "--mutator", "catalog",
                      "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "task='trimul'" in err[0] and "--out" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["events.jsonl"]


def test_cli_rejects_bad_numbers_in_one_line(capsys):
    assert search.main(["--task", "cross_entropy", "--budget", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget" in err[0]


def test_cli_out_that_is_a_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("not a folder")
    assert search.main(["--task", "cross_entropy", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "existing file" in err[0] and "Traceback" not in err[0]
    assert out.read_text() == "not a folder"


def test_cli_without_a_sandbox_refuses_at_start_up(tmp_path, capsys, monkeypatch):
    from harness import measure_sandbox
    monkeypatch.setattr(measure_sandbox, "_PLAN", None)
    monkeypatch.setattr(measure_sandbox.shutil, "which", lambda name: None)
    rc = search.main(["--task", "cross_entropy", "--gate", "none", "--mutator", "catalog",
                      "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--unsafe-no-sandbox" in err[0]
    assert not (tmp_path / "run").exists()


def test_cli_an_unreachable_server_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    # the server backend's start-up checks (models listed, tools accepted, an adapter applied)
    # stop a search in one line, before any forecast could count as a parse failure. The seed's
    # measurement comes first and is not what this test is about: a scripted one (a real one
    # costs ~10 s of CPU: two worker boots and the timing)
    monkeypatch.setattr("measure.measure", lambda task, source, **kw: FakeMeasurement("ok", 1.0))
    rc = search.main(["--task", "cross_entropy", "--server", "http://127.0.0.1:9/v1", "--budget", "2",
                      "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "http://127.0.0.1:9/v1" in err[0] and "Traceback" not in err[0]


def test_outputs_and_training_rows(tmp_path):
    s, summary, _ = run(tmp_path, budget=6)
    out = tmp_path / "run"
    for name in ("events.jsonl", "archive.json", "best_kernel.py", "summary.json",
                 "training_rows.jsonl", "best_speedup.png"):
        assert (out / name).stat().st_size > 0, name
    rows = [json.loads(l) for l in (out / "training_rows.jsonl").read_text().splitlines()]
    assert len(rows) == 7  # the seed + 6 successful measurements
    assert {k for r in rows for k in r} == {"row_id", "pack", "anchor_code", "candidate_code",
                                            "aggregated_speedup", "relative_bin", "hardware",
                                            "pair_type", "source_id"}
    assert [r["pair_type"] for r in rows] == ["seed"] + ["parent_edit"] * 6
    assert all(r["anchor_code"] == "00000000\n" and r["hardware"] == "FakeGPU" for r in rows)
    assert all(r["relative_bin"] == bins.speedup_to_bin(r["aggregated_speedup"]) for r in rows)
    assert len({r["row_id"] for r in rows}) == 7
    assert (out / "best_kernel.py").read_text() == s.archive.best().code
    saved = json.loads((out / "summary.json").read_text())
    assert saved["best_speedup"] == summary["best_speedup"] == max(r["aggregated_speedup"] for r in rows)
    assert set(saved["time_s"]) == {"mutation", "forecast", "measurement", "measuring_cost", "build", "this_run_wall"}
    curve = saved["best_vs_measurements"]
    assert curve[0][0] == 0 and curve[-1][0] == 6 and all(a[1] <= b[1] for a, b in zip(curve, curve[1:]))


def test_seed_that_fails_to_measure_stops_with_a_clear_error(tmp_path):
    with pytest.raises(SearchError, match="seed kernel did not measure ok"):
        run(tmp_path, seed_code="x0000\n")


# ---- measuring in parallel ------------------------------------------------------------------------

class SlowBitMeasure(BitMeasure):
    """BitMeasure that takes 20 to 80 ms, by the code's hash: results arrive out of order. Records
    each call's interval and the most calls that ran at once."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.running = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, task, source, **kw):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.02 + int(hashlib.sha256(source.encode()).hexdigest(), 16) % 7 / 100)
        try:
            return super().__call__(task, source, **kw)
        finally:
            with self.lock:
                self.running -= 1


def measurement_events(out):
    events = [json.loads(l) for l in (out / "events.jsonl").read_text().splitlines()]
    return events, [e for e in events if e["kind"] == "measurement" and e["request_id"] != "seed"]


@pytest.mark.parametrize("gate", ["none", "topk", "confidence"])
def test_parallel_search_keeps_the_budget_and_builds_the_serial_archive(tmp_path, gate):
    kw = dict(gate=gate, budget=11, mutations=6 if gate != "none" else 4, measure_per_parent=3, min_labels=3,
              forecaster=ScriptedForecaster(ones_forecast))
    serial, serial_summary, _ = run(tmp_path, "serial", **kw)
    fast = SlowBitMeasure()
    par, summary, _ = run(tmp_path, "parallel", measure=fast, workers=3, **kw)
    assert par.archive.to_dict() == serial.archive.to_dict()  # whatever order results arrived in
    assert summary["best_vs_measurements"] == serial_summary["best_vs_measurements"]
    assert summary["measurements"] == 11 and len(fast.calls) == 12 == len(set(fast.calls))  # + the seed
    events, results = measurement_events(tmp_path / "parallel")
    sent = [e for e in events if e["kind"] == "request" and e["payload"]["what"] == "measurement"]
    assert len(sent) == 12 and len(results) == 11  # never more sent than the budget
    assert fast.most == 3  # several at once, never more than the workers
    spans = {}
    for e in results:
        p = e["payload"]
        assert p["measurement"]["status"] == "ok" and p["ended"] >= p["started"]
        spans.setdefault(p["worker"], []).append((p["started"], p["ended"]))
    assert set(spans) == {"cpu:0", "cpu:1", "cpu:2"}
    for intervals in spans.values():  # one measurement at a time on each worker
        intervals.sort()
        assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:]))
    if gate != "none":  # a parent is forecast while the children of the one before are measured
        at = {(e["kind"], e["request_id"]): i for i, e in enumerate(events)}
        assert any(at.get(("forecast", f"s{e['step']}p1/forecast"), len(events)) < at[("measurement", e["request_id"])]
                   for e in results if e["request_id"].startswith(f"s{e['step']}p0c"))


def test_replay_of_a_parallel_log_rebuilds_the_same_archive(tmp_path):
    first, summary, _ = run(tmp_path, measure=SlowBitMeasure(), workers=3, gate="topk", mutations=6,
                            forecaster=ScriptedForecaster(ones_forecast))
    log = (tmp_path / "run" / "events.jsonl").read_text()
    again, resumed, measure = run(tmp_path, measure=BitMeasure(crash_after=0), gate="topk", mutations=6,
                                  forecaster=ScriptedForecaster(ones_forecast))
    assert again.archive.to_dict() == first.archive.to_dict() and measure.calls == []
    assert (tmp_path / "run" / "events.jsonl").read_text() == log
    assert resumed["best_vs_measurements"] == summary["best_vs_measurements"]


def test_a_local_llm_on_a_measuring_gpu_never_runs_during_a_measurement(tmp_path):
    run(tmp_path, measure=SlowBitMeasure(), workers=3, llm_waits=True, gate="topk", mutations=6,
        forecaster=ScriptedForecaster(ones_forecast))
    events, results = measurement_events(tmp_path / "run")
    answered = set()
    for e in events:
        if e["kind"] == "measurement":
            answered.add(e["request_id"])
        elif e["kind"] == "request" and e["payload"]["what"] in ("mutation", "forecast"):
            sent = {x["request_id"] for x in events[:events.index(e)]
                    if x["kind"] == "request" and x["payload"]["what"] == "measurement"}
            assert sent <= answered, f"{e['request_id']} ran with measurements in flight"


KILLED_SEARCH = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
import conftest
from test_search import BitMutator, SlowBitMeasure, cfg
from runtime.measure_pool import MeasurePool
from search import Search

with MeasurePool(["cpu", "cpu"], measure_fn=SlowBitMeasure()) as pool:
    Search(cfg(budget=12, steps=50), {out!r}, seed_code="00000000\\n", mutator=BitMutator(), pool=pool,
           progress=False, say=lambda *a: None).run()
"""


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_parallel_step_loses_nothing_and_measures_nothing_twice(tmp_path):
    import signal
    import subprocess
    import sys
    from pathlib import Path
    tests = Path(__file__).resolve().parent
    out = tmp_path / "killed"
    script = KILLED_SEARCH.format(tests=str(tests), root=str(tests.parent), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        while True:  # until the second step has results in, and requests still in flight
            assert proc.poll() is None, "the search ended before it was killed"
            if (out / "events.jsonl").exists():
                events, results = measurement_events(out)
                if len(results) >= 6:
                    break
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    events, before = measurement_events(out)
    requested = [e["request_id"] for e in events if e["kind"] == "request" and e["request_id"] != "seed"]
    assert len(requested) > len(before)  # killed with measurements in flight
    measured_before = {e["request_id"] for e in before}

    serial, _, _ = run(tmp_path, "serial", budget=12)
    resume = BitMeasure()
    again, summary, _ = run(tmp_path, "killed", measure=resume, budget=12)
    assert again.archive.to_dict() == serial.archive.to_dict() and summary["measurements"] == 12
    events, results = measurement_events(out)
    ids = [e["request_id"] for e in results]
    assert len(ids) == len(set(ids)) == 12  # every candidate measured once, none lost
    assert len(resume.calls) == 12 - len(measured_before)  # only what had no result was measured again


# ---- an LLM mutator inside the search ---------------------------------------------------------

def test_llm_mutator_inside_the_search_records_failed_mutations(tmp_path):
    backend = RecordingBackend(["sorry, no code", "```python\n00000001\n```"])
    _, summary, measure = run(tmp_path, mutator=LLMMutator(backend, "T"), budget=1, steps=1, mutations=2)
    assert summary["failed_mutations"] == 1 and measure.calls == ["00000000\n", "00000001\n"]
    events = [json.loads(l) for l in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    mutation = next(e for e in events if e["kind"] == "mutation")
    assert mutation["payload"]["candidates"][0]["error"].startswith("no ```python block")


# ---- the main command end to end ----------------------------------------------------------------

def _no_model_builds(monkeypatch):
    """Make building any model an error: the embedded forecaster and the LLM backends."""
    from models import forecaster_backends

    def refuse(*a, **kw):
        raise AssertionError("a model was built")
    for name in ("embedded_backend", "TransformersBackend", "OpenAIServerBackend"):
        monkeypatch.setattr(forecaster_backends, name, refuse)


@pytest.mark.e2e
@pytest.mark.slow
def test_main_command_end_to_end_on_cpu_and_its_resume(tmp_path, capsys, monkeypatch):
    pytest.importorskip("measure")
    import tasks
    catalog = tasks.variant_sources
    # The catalog's plain-PyTorch variant only: interpreted Triton would add ~15 s and test nothing more.
    monkeypatch.setattr(tasks, "variant_sources", lambda name, space="triton": {"torch_inplace": catalog(name)["torch_inplace"]})
    import measure
    # A real measurement, timed as briefly as --quick times it: nothing here reads how precise the
    # seed's speedup is (a full CPU timing costs ~3 s of CPU, both sides)
    monkeypatch.setitem(measure.REPS, ("cpu", False), measure.REPS[("cpu", True)])
    out = tmp_path / "ce"
    argv = ["--task", "cross_entropy", "--gate", "none", "--mutator", "catalog", "--budget", "1", "--space", "triton",
            "--scale", "cpu", "--out", str(out), "--no-progress"]  # the scale pinned: a GPU machine defaults to benchmark
    rc = search.main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "mutator: offline catalog" in captured.out and "measurement: cpu scale" in captured.out
    for name in ("events.jsonl", "archive.json", "best_kernel.py", "summary.json",
                 "training_rows.jsonl", "best_speedup.png"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["measurements"] == 1 and summary["seed_speedup"] > 0
    rows = [json.loads(l) for l in (out / "training_rows.jsonl").read_text().splitlines()]
    assert rows[0]["pair_type"] == "seed" and rows[0]["pack"] == "cross_entropy"
    assert math.isfinite(summary["best_speedup"])

    # The same command again resumes the finished run: everything is answered from the log.
    log = (out / "events.jsonl").read_text()
    _no_model_builds(monkeypatch)
    monkeypatch.setattr("measure.measure", lambda *a, **kw: pytest.fail("measured on a resume"))
    rc = search.main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "resuming from" in captured.out
    assert (out / "events.jsonl").read_text() == log  # no new request, result or derived event
    again = json.loads((out / "summary.json").read_text())
    assert (again["measurements"], again["best_speedup"]) == (1, summary["best_speedup"])


def test_a_child_cut_unjudged_by_a_cold_forecaster_can_come_back_and_be_measured(tmp_path):
    """Issue 43: the online cost model defers every child until it has labels, and topk then cuts
    by the order of proposal. A finite catalog would lose the cut children for good (proposed
    once, never again); a child cut while its forecast was a deferral is forgotten instead, so a
    later mutation proposes it again and the gate, with a forecaster that has learnt, judges it."""
    pool = ["10000000\n", "01000000\n", "11000000\n", "11100000\n", "11110000\n", "11111000\n"]

    class FiniteCatalog:
        name = "finite"

        def propose(self, parent, n, seen, key):
            return [{"code": c, "error": None, "meta": {}} for c in pool if c.strip() not in seen][:n]

    class ColdForecaster(ScriptedForecaster):  # defers everything at first, as the cost model does
        def forecast_many(self, task, reference_code, codes):
            self.calls += 1
            if self.calls == 1:
                return [types.SimpleNamespace(probs=None, parse_failed=False, deferred=True, to_dict=dict)
                        for _ in codes]
            return [FakeForecast(self.script(code)) for code in codes]
    measure = BitMeasure()
    _, summary, _ = run(tmp_path, budget=4, gate="topk", mutations=6, measure_per_parent=2, parents=1,
                        forecaster=ColdForecaster(ones_forecast), mutator=FiniteCatalog(), measure=measure)
    assert measure.calls[1:3] == pool[:2]  # the cold step: the first two, by the order of proposal
    assert measure.calls[3:] == ["11111000\n", "11110000\n"]  # cut then, proposed again, ranked first now
    assert summary["best_speedup"] == 6.0


def test_the_summary_counts_what_measuring_cost_builds_included_and_what_forecasting_cost(tmp_path):
    """Issue 43: a measurement's cost is its wall_s when it was made (a cached one's included), and
    its build is measure.py's build_s, or in an older record its import and correctness seconds."""
    costs = iter([dict(wall_s=10.0, import_s=1.0, check_s=2.0)]  # the seed: no build_s, 3 s of build
                 + [dict(wall_s=40.0, import_s=1.0, check_s=30.0, build_s=25.0)] * 20)

    def measure_fn(task, source, **kw):
        return FakeMeasurement("ok", 1.0 + source.count("1"), **next(costs))

    class SlowForecaster(ScriptedForecaster):  # a forecast that takes time, as a real one does
        def forecast_many(self, task, reference_code, codes):
            time.sleep(0.01 * len(codes))
            return super().forecast_many(task, reference_code, codes)
    s, summary, _ = run(tmp_path, budget=3, gate="topk", forecaster=SlowForecaster(ones_forecast), measure=measure_fn)
    t = summary["time_s"]
    assert t["measuring_cost"] == 10.0 + 3 * 40.0 and t["build"] == 3.0 + 3 * 25.0
    closing = search._report(summary)
    assert f"measuring cost 130 s, {130 / 4:.1f} s a measurement (78 s of it building kernels" in closing
    per = t["forecast"] / summary["forecasts"]
    assert f"a measurement costs {130 / 4 / per:.0f} forecasts" in closing


def test_main_command_measures_on_two_cpu_workers_at_once(tmp_path, capsys, monkeypatch):
    import tasks
    monkeypatch.setattr(tasks, "seed_source", lambda name: "00000000\n")
    monkeypatch.setattr(tasks, "variant_sources", lambda name, space="triton": {f"v{i}": "0" * i + "1" * (8 - i) + "\n"
                                                                                for i in range(8)})
    monkeypatch.setattr("measure.measure", SlowBitMeasure())
    out = tmp_path / "two"
    rc = search.main(["--task", "cross_entropy", "--gate", "none", "--mutator", "catalog", "--budget", "6",
                      "--workers", "2", "--scale", "cpu", "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "measurement workers: cpu:0, cpu:1 (2 CPU workers share" in captured.out
    events, results = measurement_events(out)
    assert len(results) == 6 == len({e["request_id"] for e in results})  # exactly 6, none twice
    spans = {}
    for e in results:
        spans.setdefault(e["payload"]["worker"], []).append((e["payload"]["started"], e["payload"]["ended"]))
    assert set(spans) == {"cpu:0", "cpu:1"}
    for intervals in spans.values():  # one at a time on each worker
        intervals.sort()
        assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:]))
    (a0, a1), (b0, b1) = spans["cpu:0"][0], spans["cpu:1"][0]
    assert a0 < b1 and b0 < a1  # the two workers measured at the same time


class FakeEmbeddedBackend:
    """Stands in for the embedded SmolLM2 under the logits read-out; counts how often it is built."""

    builds = 0
    name, embedded, adapter = "fake-embedded", True, None

    def __init__(self, **kw):
        type(self).builds += 1
        type(self).kwargs = kw

    def answer_prompt(self, messages, reasoning, prefix, tools):
        return [len(messages[-1]["content"])]  # one 'token' that differs between candidates

    def next_token_probs(self, prompts, digits, shared=None):
        return [peaked(1 + p[0] % 8, 0.5) for p in prompts]


def test_the_embedded_forecaster_gets_the_dtype_asked_for(tmp_path, monkeypatch):
    from models import forecaster_backends
    pytest.importorskip("measure")
    monkeypatch.setattr(forecaster_backends, "embedded_backend", FakeEmbeddedBackend)
    monkeypatch.setattr("measure.measure", lambda task, src, **kw: FakeMeasurement("ok", 1 + len(src) % 7 / 10))
    for dtype in ("float32", None):
        FakeEmbeddedBackend.kwargs = None
        argv = ["--task", "cross_entropy", "--gate", "topk", "--mutator", "catalog", "--budget", "1", "--forecaster",
                "llm", "--out", str(tmp_path / str(dtype)), "--no-progress"] + (["--embedded-dtype", dtype] if dtype else [])
        assert search.main(argv) == 0
        assert FakeEmbeddedBackend.kwargs == {"dtype": dtype or "auto"}


def test_resuming_a_finished_gated_run_builds_no_forecaster(tmp_path, capsys, monkeypatch):
    import os
    from pathlib import Path

    from models import forecaster_backends
    pytest.importorskip("measure")
    FakeEmbeddedBackend.builds = 0
    monkeypatch.setattr(forecaster_backends, "embedded_backend", FakeEmbeddedBackend)
    monkeypatch.setattr("measure.measure", lambda task, src, **kw: FakeMeasurement("ok", 1 + len(src) % 7 / 10))
    out = tmp_path / "gated"
    argv = ["--task", "cross_entropy", "--gate", "topk", "--mutator", "catalog", "--budget", "2",
            "--forecaster", "llm", "--out", str(out), "--no-progress"]
    assert search.main(argv) == 0
    printed = capsys.readouterr().out
    assert "forecaster: embedded SmolLM2-135M (logits read-out)" in printed
    first = json.loads((out / "summary.json").read_text())
    assert FakeEmbeddedBackend.builds == 1
    assert first["forecasts"] == first["candidates_considered"] > first["measurements"] == 2
    # Forecasts are cached under GPU_FORECASTERS_CACHE (a temporary folder in tests), not the home.
    assert list((Path(os.environ["GPU_FORECASTERS_CACHE"]) / "forecasts").glob("*.json"))

    log = (out / "events.jsonl").read_text()
    monkeypatch.setattr("measure.measure", lambda *a, **kw: pytest.fail("measured on a resume"))
    assert search.main(argv) == 0
    printed = capsys.readouterr().out
    assert "forecaster: embedded SmolLM2-135M" in printed and "resuming from" in printed
    assert FakeEmbeddedBackend.builds == 1  # the start-up named the forecaster but never loaded it
    assert (out / "events.jsonl").read_text() == log
    again = json.loads((out / "summary.json").read_text())
    assert (again["forecasts"], again["measurements"], again["best_speedup"]) == \
        (first["forecasts"], 2, first["best_speedup"])


def test_compare_runs_gated_and_ungated_with_the_same_budget(tmp_path, monkeypatch, capsys):
    pytest.importorskip("measure")
    measure = BitMeasure()
    plan = Plan(scale="cpu", mutator=BitMutator(), mutator_name="bits", forecaster=ScriptedForecaster(ones_forecast),
                forecaster_name="scripted", budget=8, gated_mutations=12, measure_kwargs={},
                pool=MeasurePool(["cpu"], measure))
    monkeypatch.setattr(search, "plan_search", lambda args, say=print: plan)
    monkeypatch.setattr("measure.measure", measure)
    monkeypatch.setattr("tasks.seed_source", lambda name: "0" * 16 + "\n")
    out = tmp_path / "cmp"
    assert search.main(["--task", "cross_entropy", "--compare", "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "compare.json").read_text())
    gated, ungated = results["gated"], results["ungated"]
    assert (gated["gate"], ungated["gate"]) == ("topk", "none")
    assert gated["measurements"] == ungated["measurements"] == 8
    # Same 8 measurements; 12 mutations forecast per parent vs 4 measured per parent.
    assert (gated["candidates_considered"], ungated["candidates_considered"]) == (24, 8)
    assert gated["forecasts"] == 24 and ungated["forecasts"] == 0
    assert (out / "compare.png").stat().st_size > 0
    assert (out / "gated" / "events.jsonl").exists() and (out / "ungated" / "events.jsonl").exists()
    printed = capsys.readouterr().out
    assert "gated" in printed and "ungated" in printed


# ---- goal-conditioned search (--target-bin) and fast_1 -----------------------------------------------

def test_goal_conditioned_search_keeps_the_kernels_closest_to_the_band(tmp_path):
    from mutators import goal_band, goal_reward
    # bin 5 = [1.414x, 2x), midpoint 2^0.75 = 1.68x; BitMeasure's speedups are 1 + (number of ones)
    assert goal_band(5)[2] == pytest.approx(2 ** 0.75)
    assert goal_band(1)[2] == pytest.approx(2 ** -1.5) and goal_band(8)[2] == pytest.approx(2 ** 2.5)
    s, summary, measure = run(tmp_path, target_bin=5, budget=12)
    rewards = {n.id: n.reward for n in s.archive.nodes.values()}
    for n in s.archive.nodes.values():
        assert n.reward == pytest.approx(goal_reward(n.info["result"]["speedup"], 5))
    assert summary["best_speedup"] == 2.0 and summary["target_bin"] == 5  # one '1': 2x, the closest
    assert summary["best_reward"] == max(rewards.values()) == pytest.approx(-abs(math.log(2 / 2 ** 0.75)))
    plain = run(tmp_path, name="plain", budget=12)[1]
    assert plain["best_speedup"] > 2.0 and plain["target_bin"] is None  # the speed search climbs
    # the goal is part of the search's identity: resuming it with another bin is refused
    with pytest.raises(SearchError, match="target_bin"):
        run(tmp_path, target_bin=6, budget=12)


def test_target_bin_needs_the_ungated_search(capsys):
    for argv in (["--task", "cross_entropy", "--target-bin", "5"],
                 ["--task", "cross_entropy", "--target-bin", "5", "--gate", "none", "--compare"]):
        assert search.main(argv) == 2
        assert "--gate none" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's one-line error: a bin is 1..8
        search.main(["--task", "cross_entropy", "--target-bin", "9", "--gate", "none"])
    assert "--target-bin: invalid choice: 9" in capsys.readouterr().err


def test_fast_1_is_the_share_of_candidates_correct_and_faster(tmp_path):
    from bins import fast_p
    assert fast_p([2.0, 1.0, None, 0.5]) == 0.25 and fast_p([]) is None and fast_p([3.0, None], 2.5) == 0.5

    class Mixed(BitMeasure):  # speedup 0.4 + 0.4 * ones (0.8x, 1.2x ...); a last bit of 1 fails to compile
        def __call__(self, task, source, **kw):
            self.calls.append(source)
            if len(self.calls) > 1 and source.strip().endswith("1"):
                return FakeMeasurement("compile_error", message="no")
            return FakeMeasurement("ok", 0.4 + 0.4 * source.count("1"))
    _, summary, measure = run(tmp_path, budget=10, measure=Mixed())
    results = [None if c.strip().endswith("1") else 0.4 + 0.4 * c.count("1") for c in measure.calls[1:]]
    assert len(results) == summary["measurements"] == 10
    faster = sum(v is not None and v > 1 for v in results)
    assert 0 < faster < 10 and None in results  # the run mixes failures, slow and fast kernels
    assert summary["fast_1"] == faster / 10
