"""Tests of the search's protocols and the paper's pieces in it: --protocol paper (exactly the
budget, 4 children kept, the forecaster's paper prompt and its retry), the abstain variant's
deferrals, forecast as reward, fast_1, and refusing a log written before these options.

The search runs with the scripted collaborators of test_search.py (bit-string kernels, a fake
measure function), or from the command line with a fake measure function and the loopback fake
OpenAI server, so no test here needs a GPU, a model or a real measurement."""
import json
import threading

import pytest
from fake_openai_server import FakeOpenAIServer, final_text, tool_call
from test_search import BitMeasure, FakeMeasurement, ScriptedForecaster, peaked, run

import bins
import search
from forecast_answer import Forecast
from forecast_prompt import DEFER_TOOL_NAME, PAPER_PROB_FIELDS, TOOL_NAME
from gate import forecast_speedup, rank_key
from search import SearchError, parse_args

# ---- --protocol paper --------------------------------------------------------------------------

def test_paper_protocol_spends_exactly_the_budget_and_keeps_four_children(tmp_path):
    # The paper's standard run: 40 steps x 2 parents x 4 = 320, but the first step has one parent
    # (the seed), so 40 steps measure 4 + 39 x 8 = 316. Under the paper protocol the budget, not
    # the step count, ends the run. The same at a small scale: 3 steps measure 4 + 8 + 8 = 20.
    paper = search.with_protocol_defaults(search.Args(task="cross_entropy", protocol="paper", budget=320))
    ours = search.with_protocol_defaults(search.Args(task="cross_entropy", budget=320))
    assert (paper.steps, paper.keep_children, paper.parse_retries) == (320, 4, 1)
    assert (ours.steps, ours.keep_children, ours.parse_retries) == (40, 2, 0)
    seed = "0" * 16 + "\n"
    _, short, _ = run(tmp_path, name="ours", seed_code=seed, budget=24, steps=3, parents=2, mutations=4)
    s, exact, measure = run(tmp_path, name="paper", seed_code=seed, budget=24, steps=None, parents=2,
                            mutations=4, protocol="paper")
    assert (short["measurements"], short["steps"]) == (20, 3)
    assert (exact["measurements"], exact["steps"]) == (24, 4) and len(measure.calls) == 25
    assert exact["protocol"] == "paper" and short["protocol"] == "ours"
    kept = [len(e["payload"]["kept"].get(pid, [])) for e in s.log.events if e["kind"] == "step"
            for pid in e["payload"]["parents"]]
    assert max(kept) == 4 and s.archive.keep_children == 4  # ours keeps 2


def test_protocol_defaults_yield_to_explicit_settings(tmp_path):
    s, summary, _ = run(tmp_path, budget=8, steps=2, protocol="paper", keep_children=1, parse_retries=0)
    assert (s.args.keep_children, s.args.steps, s.args.parse_retries) == (1, 2, 0)
    assert summary["steps"] == 2
    config = next(e["payload"] for e in s.log.events if e["kind"] == "config")
    assert (config["protocol"], config["keep_children"], config["parse_retries"]) == ("paper", 1, 0)


# ---- fast_1 --------------------------------------------------------------------------------------

def test_fast_1_is_the_share_of_measured_candidates_correct_and_faster_than_the_reference(tmp_path):
    class Mixed(BitMeasure):  # 'x' fails; one 1 -> 0.8x (correct, slower); more ones -> faster
        def __call__(self, task, source, **kw):
            m = super().__call__(task, source, **kw)
            if m.status == "ok" and source.count("1") == 1:
                return FakeMeasurement("ok", 0.8)
            return m

    from test_search import BitMutator
    _, summary, measure = run(tmp_path, measure=Mixed(), mutator=BitMutator(fail_every=0), budget=12)
    speedups = [Mixed()("toy", c) for c in measure.calls[1:]]
    fast = sum(m.status == "ok" and m.speedup > 1 for m in speedups)
    assert summary["fast_1"] == pytest.approx(fast / 12) and 0 < fast < 12


# ---- forecast as reward --------------------------------------------------------------------------

def test_forecast_reward_admits_trusted_children_unmeasured_and_keeps_them_apart(tmp_path):
    # bits 0-3 flipped: a confident forecast (trusted at threshold 0.5); the rest unsure (measured)
    def script(code):
        first_one = code.index("1")
        return peaked(6, 0.9) if first_one < 4 else peaked(3, 0.3)
    fc = ScriptedForecaster(script)
    s, summary, measure = run(tmp_path, gate="confidence", forecaster=fc, threshold=0.5, forecast_reward=True,
                              budget=6, steps=3, parents=1, mutations=8, measure_per_parent=2)
    forecast_nodes = [n for n in s.archive.nodes.values() if not n.measured]
    assert forecast_nodes and summary["forecast_rewards"] >= len(forecast_nodes)
    expected = forecast_speedup(Forecast(probs=peaked(6, 0.9)))
    assert all(n.reward == pytest.approx(expected) and n.info["result"]["status"] == "forecast"
               for n in forecast_nodes)
    # a forecast is never measured, never a training row, never the best kernel or on the curve
    assert not any(n.code in measure.calls for n in forecast_nodes)
    rows = [json.loads(x) for x in (tmp_path / "run" / "training_rows.jsonl").read_text().splitlines()]
    assert len(rows) == 1 + summary["measurements"] - summary["failed_measurements"]
    assert {r["candidate_code"] for r in rows}.isdisjoint(n.code for n in forecast_nodes)
    assert expected > max(r["aggregated_speedup"] for r in rows)  # the forecast would win if mixed in
    best = s.archive.best()
    assert best.measured and summary["best_speedup"] == best.reward == max(r["aggregated_speedup"] for r in rows)
    assert (tmp_path / "run" / "best_kernel.py").read_text() == best.code
    assert all(y <= max(r["aggregated_speedup"] for r in rows) for _, y in summary["best_vs_measurements"])
    nodes = json.loads((tmp_path / "run" / "archive.json").read_text())["nodes"]
    assert {n["id"] for n in nodes if not n["measured"]} == {n.id for n in forecast_nodes}
    sel = [e["payload"] for e in s.log.events if e["kind"] == "selection"]
    assert all("forecast_reward" in p for p in sel)
    # the replay rebuilds the same archive without forecasting or measuring again
    calls = (fc.calls, len(measure.calls))
    s2, again, _ = run(tmp_path, gate="confidence", forecaster=fc, threshold=0.5, forecast_reward=True,
                       budget=6, steps=3, parents=1, mutations=8, measure_per_parent=2, measure=measure)
    assert (fc.calls, len(measure.calls)) == calls and again["forecast_rewards"] == summary["forecast_rewards"]
    assert s2.archive.to_dict() == s.archive.to_dict()


def test_forecast_reward_needs_the_confidence_gate(capsys):
    with pytest.raises(SearchError, match="needs --gate confidence"):
        parse_args(["--task", "cross_entropy", "--gate", "topk", "--forecast-reward"])
    assert search.main(["--task", "cross_entropy", "--forecast-reward"]) == 2
    assert "needs --gate confidence" in capsys.readouterr().err


# ---- deferrals in the gates ----------------------------------------------------------------------

class Deferring:
    """A forecaster whose forecasts are scripted, None a parse failure, "defer" a deferral."""

    def __init__(self, script):
        self.script, self.calls = script, 0

    def forecast_many(self, task, reference_code, codes):
        self.calls += len(codes)
        out = []
        for code in codes:
            p = self.script(code)
            out.append(Forecast(deferred=True, reasoning="unsure") if p == "defer" else
                       Forecast(parse_failed=True, parse_error="bad") if p is None else
                       Forecast(probs=list(bins.as_probs(p))))
        return out


def test_deferrals_rank_after_forecasts_in_topk_and_are_measured_by_the_confidence_gate(tmp_path):
    assert rank_key(Forecast(probs=peaked(1, 0.9)), "expected_bin") > rank_key(Forecast(deferred=True), "x") \
        > rank_key(Forecast(parse_failed=True), "x")

    def script(code):  # bit 0 flipped: a deferral; bit 1: a parse failure; the rest: confident bin 1
        return "defer" if code.startswith("1") else None if code[1] == "1" else peaked(1, 0.9)
    _, topk, measure = run(tmp_path, name="topk", gate="topk", forecaster=Deferring(script), budget=8,
                           steps=1, parents=1, mutations=8, measure_per_parent=7)
    # 7 of 8 measured: the 6 forecasts and the deferral; the parse failure ranked last
    assert topk["measurements"] == 7 and any(c.startswith("1") for c in measure.calls[1:])
    assert not any(c.startswith("01") for c in measure.calls[1:])
    s, conf, measure = run(tmp_path, name="conf", gate="confidence", forecaster=Deferring(script), threshold=0.5,
                           budget=2, steps=1, parents=1, mutations=8, measure_per_parent=4)
    # confident bin 1 (no gain over a 1.0x parent): skipped; the deferral and the failure: measured
    assert sorted(c[:2] for c in measure.calls[1:]) == ["01", "10"]
    views = [v for e in s.log.events if e["kind"] == "forecast" for v in e["payload"]["forecasts"]]
    assert sum(v["deferred"] for v in views) == 1 and sum(v["parse_failed"] for v in views) == 1


# ---- from the command line: the paper protocol, the abstain tool and the retry over a server -----

@pytest.mark.slow
def test_cli_paper_protocol_with_abstain_over_a_served_forecaster(tmp_path, monkeypatch, capsys):
    """search.py --protocol paper --abstain --server URL: every forecast request carries the paper's
    prompt and both tools; an answer that does not parse is asked again once; a deferral is
    recorded as one; exactly --budget measurements; the catalog mutator (no LLM)."""
    import measure as measure_module
    monkeypatch.setattr(measure_module, "measure", lambda task, src, **kw: FakeMeasurement("ok", 1 + len(src) % 7 / 10))
    seen, lock = {}, threading.Lock()

    def reply(request):
        if request.get("max_tokens") == 1:
            # the shared prefix's warm-up (no candidate in it; left out of `rows` below): before,
            # it raised here, and the server's 500 cost 7 s of the client's retry back-off
            return final_text("")
        user = request["messages"][-1]["content"]
        cand = user.split("Kernel `candidate`:")[1]
        with lock:
            seen[cand] = seen.get(cand, 0) + 1
            first = seen[cand] == 1
        if len(cand) % 3 == 0 and first:
            return final_text("I cannot say.")  # no JSON: a parse failure, asked again
        if len(cand) % 3 == 1:
            return tool_call({"reason": "Same library call in both."}, name=DEFER_TOOL_NAME)
        args = {"predicted_bin": 5, **{f: (0.6 if i == 4 else 0.4 / 7) for i, f in enumerate(PAPER_PROB_FIELDS)},
                "reasoning": "Fewer passes."}
        return tool_call(args)
    with FakeOpenAIServer(default=reply) as server:
        out = tmp_path / "run"
        argv = ["--task", "cross_entropy", "--protocol", "paper", "--abstain", "--gate", "topk", "--mutator",
                "catalog", "--server", server.url, "--budget", "3", "--mutations", "6", "--scale", "cpu",
                "--out", str(out), "--no-progress", "--unsafe-no-sandbox"]  # the measure function is a fake
        assert search.main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "protocol: paper" in printed and "abstain tool" in printed and "mutator: offline catalog" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["measurements"] == 3 and summary["protocol"] == "paper" and summary["fast_1"] is not None
    rows = [r for r in server.requests if r.get("max_tokens") != 1]  # not the prefix warm-ups
    assert rows and all([t["function"]["name"] for t in r["tools"]] == [TOOL_NAME, DEFER_TOOL_NAME] for r in rows)
    assert all("Operation: cross_entropy" in r["messages"][-1]["content"] for r in rows)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    views = [v for e in events if e["kind"] == "forecast" for v in e["payload"]["forecasts"]]
    assert any(v["deferred"] for v in views)
    retried = [v for v in views if v["record"]["attempts"] == 2]
    assert retried and all(not v["parse_failed"] for v in retried)
    assert len(rows) == len(views) + len(retried)


# ---- a log of an older search.py --------------------------------------------------------------

def test_a_log_written_before_the_protocol_options_is_refused_not_resumed(tmp_path):
    # A log's config event is its search's identity. One that lacks the protocol options (an older
    # search.py's) is not guessed at: a rerun into it is refused with the option named, as any
    # other difference is, and nothing is measured again.
    s, first, measure = run(tmp_path, budget=4)
    log = tmp_path / "run" / "events.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    for key in ("protocol", "abstain", "forecast_reward", "parse_retries"):
        del events[0]["payload"][key]  # the config event of an older search.py
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert first["measurements"] == 4 and len(measure.calls) == 5
    with pytest.raises(SearchError, match="protocol=None.*protocol='ours'"):
        run(tmp_path, budget=4, measure=measure)
    with pytest.raises(SearchError, match="protocol=None.*protocol='paper'"):
        run(tmp_path, budget=4, measure=measure, protocol="paper")
    assert len(measure.calls) == 5  # nothing measured again
