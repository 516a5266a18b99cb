"""Tests of gate.py: trust or defer, and which children each gate mode measures, in searches with scripted
collaborators."""
import math

import pytest
from test_search import BitMutator, ScriptedForecaster, ones_forecast, peaked, run

import bins
import selective
from forecast_answer import Forecast, failure
from gate import Gate, predicts_gain
from search import forecast_from_log

# ---- trust or defer ---------------------------------------------------------------------------------------------

def test_gate_decisions():
    sure = Forecast(probs=[0, 0, 0, 0.05, 0.9, 0.05, 0, 0], predicted_bin=5)
    unsure = Forecast(probs=[0.125] * 8, predicted_bin=1)
    failed = failure("bad JSON")
    gate = Gate("maxprob", 0.5)
    assert [gate.decide(f) for f in (sure, unsure, failed)] == ["trust", "defer", "defer"]
    assert Gate("entropy", 0.5).decide(sure) == "trust" and Gate("entropy", 0.5).decide(unsure) == "defer"
    assert Gate("margin", 0.9).decide(sure) == "defer" and Gate("margin", 0.8).decide(sure) == "trust"
    assert Gate("maxprob", 0.0).decide(failed) == "defer"
    with pytest.raises(ValueError):
        Gate("variance", 0.5)


def test_gate_from_labelled_meets_target_risk():
    # confident forecasts are right, unsure ones are wrong: a threshold must separate them
    forecasts, truth = [], []
    for i in range(200):
        conf = 0.4 + 0.5 * i / 199
        p = [(1 - conf) / 7] * 8
        p[4] = conf
        forecasts.append(Forecast(probs=p, predicted_bin=5))
        truth.append(5 if conf > 0.6 else 2)
    forecasts.append(failure("no answer"))
    truth.append(5)
    gate = Gate.from_labelled(forecasts, truth, target_risk=0.1, delta=0.05)
    trusted = [(f, y) for f, y in zip(forecasts, truth) if gate.decide(f) == "trust"]
    risk = sum(f.predicted_bin != y for f, y in trusted) / len(trusted)
    assert 0.5 < gate.threshold < 0.9 and len(trusted) > 100 and risk < 0.1
    always_wrong = Gate.from_labelled(forecasts[:200], [1] * 200, target_risk=0.1, delta=0.05)
    assert always_wrong.threshold == math.inf and always_wrong.decide(forecasts[199]) == "defer"


# ---- the gate modes in a search ------------------------------------------------------------

def test_gate_none_measures_every_mutation_without_forecasts(tmp_path):
    fc = ScriptedForecaster(ones_forecast)
    _, summary, measure = run(tmp_path, gate="none", forecaster=fc, budget=12, mutations=4)
    assert fc.calls == 0 and summary["forecasts"] == 0 and summary["skipped"] == 0
    assert summary["candidates_considered"] == 12 and len(measure.calls) == 13


def test_gate_topk_forecasts_all_and_measures_the_best_k(tmp_path):
    fc = ScriptedForecaster(ones_forecast)
    s, summary, measure = run(tmp_path, gate="topk", forecaster=fc, budget=6, parents=1,
                              mutations=8, measure_per_parent=2)
    # 3 steps x 1 parent, 2 measured each. Forecast: 8 flips of the seed, then 7 and 6 (flips back
    # to code already proposed in an earlier step are never proposed again).
    assert summary["measurements"] == 6 and summary["forecasts"] == 8 + 7 + 6 == fc.calls
    assert summary["skipped"] == 15 and summary["skipped_by_reason"] == {"below top-k": 15}
    # The forecaster ranks by ones, so every measured child has a one more than its parent:
    # the best measured reward climbs by one a step (1 -> 2 -> 3 -> 4).
    assert summary["best_speedup"] == 4.0
    sel = [e for e in s.log.events if e["kind"] == "selection"]
    assert [(len(e["payload"]["measure"]), len(e["payload"]["skip"])) for e in sel] == [(2, 6), (2, 5), (2, 4)]


def test_topk_ranks_parse_failures_last(tmp_path):
    # Parse failure for the child that flips bit 0; a confident bin-2 forecast for the others.
    # Were a parse failure read as uniform (expected bin 4.5 > 2.29) it would be measured first.
    fc2 = ScriptedForecaster(lambda code: None if code.startswith("1") else peaked(2, 0.9))
    _, summary2, measure2 = run(tmp_path, name="b", gate="topk", forecaster=fc2, budget=2, parents=1,
                                mutations=8, measure_per_parent=2)
    assert summary2["forecasts"] == 8 and len(measure2.calls) == 3
    assert not any(c.startswith("1") for c in measure2.calls[1:])


def test_confidence_gate_with_a_fixed_threshold(tmp_path):
    # Children of the all-zero seed differ by which bit flips; script by that position:
    #   bit 0 -> confident bin 8 (a gain over a 1.0x parent): measure
    #   bit 1 -> confident bin 1 (no gain): skip
    #   bit 2 -> unsure (uniform): the gate defers: measure
    #   bit 3 -> parse failure: defer: measure
    script = {0: peaked(8, 0.9), 1: peaked(1, 0.9), 2: [1 / 8] * 8, 3: None}

    class FirstFour(BitMutator):
        def propose(self, parent, n, seen, key):
            bits = parent.code.strip()
            return [{"code": bits[:i] + "1" + bits[i + 1:] + "\n", "error": None, "meta": {}} for i in range(4)]

    fc = ScriptedForecaster(lambda code: script[code.index("1")])
    s, summary, measure = run(tmp_path, gate="confidence", threshold=0.5, forecaster=fc, mutator=FirstFour(),
                              budget=3, steps=1, parents=1, mutations=4, measure_per_parent=4)
    assert summary["measurements"] == 3 and summary["skipped"] == 1
    assert summary["skipped_by_reason"] == {"confident: no gain over parent": 1}
    assert sorted(c.index("1") for c in measure.calls[1:]) == [0, 2, 3]


def test_predicts_gain_compares_against_the_parents_measured_reward():
    f = forecast_from_log({"parse_failed": False, "probs": peaked(8, 0.9), "record": {}})
    e = bins.expected_log2_speedup(f.probs)  # about 1.56: a ~2.9x forecast vs the reference
    assert predicts_gain(f, 1.0) and predicts_gain(f, 2 ** (e - 0.01))
    assert not predicts_gain(f, 2 ** (e + 0.01)) and not predicts_gain(f, 8.0)
    # A logged forecast goes through gate.Gate, the project's one gate rule.
    assert f.predicted_bin == 8
    assert Gate("maxprob", 0.95).decide(f) == "defer" and Gate("maxprob", 0.9).decide(f) == "trust"
    failed = forecast_from_log({"parse_failed": True, "probs": None, "record": {}})
    assert failed.predicted_bin is None and Gate("maxprob", 0.0).decide(failed) == "defer"


def test_confidence_gate_learns_its_threshold_from_measured_labels(tmp_path, monkeypatch):
    calls = []

    def fake_threshold(confidences, correct, target_risk, delta):
        calls.append((list(confidences), list(correct), target_risk, delta))
        return {"threshold": 0.5}

    monkeypatch.setattr(selective, "guaranteed_risk_threshold", fake_threshold)
    # Confidently predicts bin 1 (no gain) for everything.
    fc = ScriptedForecaster(lambda code: peaked(1, 0.9))
    s, summary, _ = run(tmp_path, gate="confidence", forecaster=fc, budget=20, steps=3, parents=1,
                        mutations=4, measure_per_parent=4, min_labels=2, target_risk=0.2, delta=0.05)
    sel = [e["payload"] for e in s.log.events if e["kind"] == "selection"]
    assert sel[0]["threshold"] is None and len(sel[0]["measure"]) == 4  # no labels: defer all
    assert sel[1]["threshold"] == 0.5 and sel[1]["measure"] == []  # trusted: no gain, all skipped
    confidences, correct, risk, delta = calls[0]
    assert len(confidences) == 4 and confidences == pytest.approx([0.9] * 4)
    assert correct == [False] * 4  # true speedup 2.0 is bin 6, the forecast said bin 1
    assert (risk, delta) == (0.2, 0.05)
    assert summary["measurements"] == 4 and summary["skipped"] == 8


def test_confidence_gate_with_the_real_guaranteed_risk_threshold(tmp_path):
    # A forecaster that is always right (the true bin of 1 + ones) and 95% sure of it.
    fc = ScriptedForecaster(lambda code: peaked(bins.speedup_to_bin(1 + code.count("1")), 0.95))
    s, summary, _ = run(tmp_path, seed_code="0" * 16 + "\n", gate="confidence", forecaster=fc, budget=24,
                        steps=8, parents=1, mutations=8, measure_per_parent=4, min_labels=10)
    taus = [e["payload"]["threshold"] for e in s.log.events if e["kind"] == "selection"]
    assert taus[:3] == [None, None, None]  # 4 + 4 labels < 10: defer everything
    assert all(t is not None and t <= 0.95 for t in taus[3:]) and len(taus) > 3
    # Once trusted, children forecast no faster than their parent (bins saturate at 4x) are skipped.
    assert summary["skipped_by_reason"].get("confident: no gain over parent", 0) > 0
