"""Tests of forecast_answer.py: the parser of a model's answer into a Forecast."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bins
from forecast_answer import Forecast, parse_answer
from forecast_prompt import PROB_FIELDS, TOOL_NAME

TOOL = f"functions.{TOOL_NAME}"


def args(probs=(0, 0, 0.1, 0.2, 0.5, 0.2, 0, 0), stated=5, reasoning="Fewer passes over memory."):
    return {"predicted_bin": stated, **dict(zip(PROB_FIELDS, probs)), "reasoning": reasoning}


def call(a, analysis="Compare memory traffic.", end="<|call|>"):
    body = a if isinstance(a, str) else json.dumps(a)
    text = f"<|channel|>analysis<|message|>{analysis}<|end|>" if analysis is not None else ""
    return text + f"<|start|>assistant to={TOOL}<|channel|>commentary <|constrain|>json<|message|>{body}{end}"


# ---- parser --------------------------------------------------------------------------------------

def test_parse_tool_call():
    f = parse_answer(call(args()))
    assert not f.parse_failed and f.probs == pytest.approx([0, 0, 0.1, 0.2, 0.5, 0.2, 0, 0])
    assert f.predicted_bin == 5 and f.stated_bin == 5 and not f.bin_disagrees
    assert f.raw_sum == pytest.approx(1.0) and f.reasoning == "Fewer passes over memory."


def test_parse_renormalises_and_keeps_raw_sum():
    f = parse_answer(call(args(probs=(0, 0, 0, 0.2, 0.4, 0.2, 0, 0))))
    assert f.raw_sum == pytest.approx(0.8) and sum(f.probs) == pytest.approx(1.0)
    assert f.probs[4] == pytest.approx(0.5)


def test_parse_records_bin_disagreement():
    f = parse_answer(call(args(stated=3)))
    assert f.stated_bin == 3 and f.predicted_bin == 5 and f.bin_disagrees


@pytest.mark.parametrize("text, reason", [
    (call('{"predicted_bin": 5, "p_severe'), "bad JSON"),
    (call(args(probs=(0, 0, 0, 0, 1.5, 0, 0, 0))), "p_moderate_speedup out of range"),
    (call(args(probs=(0, 0, 0, -0.1, 0.5, 0, 0, 0))), "p_parity_to_slight_speedup out of range"),
    (call(args(probs=(0, 0, 0, "0.2", 0.5, 0, 0, 0))), "out of range"),
    (call(args(probs=(0, 0, 0, True, 0.5, 0, 0, 0))), "out of range"),
    (call('{"predicted_bin": 5, "p_severe_slowdown": NaN}'), "missing field"),
    (call(args(probs=(0,) * 8)), "all probabilities are zero"),
    (call({k: v for k, v in args().items() if k != "p_high_speedup"}), "missing field p_high_speedup"),
    (call(args(reasoning="  ")), "empty reasoning"),
    (call(args(stated=9)), "predicted_bin must be an integer"),
    (call(args(stated=4.5)), "predicted_bin must be an integer"),
    (call("[1, 2]"), "not an object"),
    ("<|channel|>analysis<|message|>The candidate uses a two-pass", "truncated reasoning"),
    ("<|channel|>analysis<|message|>I think it is faster.<|end|>", "never called"),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>Faster.<|return|>",
     "final channel holds no JSON"),
    ("", "empty completion"),
    ("It is probably faster.", "no JSON forecast"),
])
def test_parse_failures_have_reasons(text, reason):
    f = parse_answer(text)
    assert f.parse_failed and f.probs is None and f.predicted_bin is None
    assert reason in f.parse_error


def test_parse_nan_probability_fails():
    f = parse_answer(call(json.dumps(args()).replace('"p_moderate_speedup": 0.5', '"p_moderate_speedup": NaN')))
    assert f.parse_failed and "p_moderate_speedup out of range" in f.parse_error


def test_parse_final_channel_and_fenced_block():
    final = ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
             f"Here: {json.dumps(args())}<|return|>")
    fenced = f"My estimate:\n```json\n{json.dumps(args(stated=4, probs=(0, 0, 0, .6, .4, 0, 0, 0)))}\n```\n"
    wrapped = json.dumps({"name": TOOL_NAME, "arguments": args()})
    for text, bin_ in ((final, 5), (fenced, 4), (wrapped, 5)):
        f = parse_answer(text)
        assert not f.parse_failed, f.parse_error
        assert f.predicted_bin == bin_


def test_parse_several_calls_takes_last_complete_one():
    first = args(probs=(1, 0, 0, 0, 0, 0, 0, 0), stated=1)
    second = args(probs=(0, 0, 0, 0, 0, 0, 0, 1), stated=8)
    text = call(first) + call(second, analysis=None)
    assert parse_answer(text).predicted_bin == 8
    truncated = call(first) + f"<|start|>assistant to={TOOL}<|channel|>commentary <|constrain|>json<|message|>" + '{"predicted_bin": 8, "p_se'
    assert parse_answer(truncated).predicted_bin == 1
    trailing = call(json.dumps(second) + " (done)")
    assert parse_answer(trailing).predicted_bin == 8


@pytest.mark.parametrize("later", ["[" * 100_000 + "]" * 100_000,          # deeper than the recursion limit
                                   '{"predicted_bin": 1' + "0" * 400 + "}",  # an integer no float can hold
                                   '{"predicted_bin": 8, "p_severe_slowdown": ' + "9" * 5000 + "}"])
def test_a_later_broken_call_does_not_hide_an_earlier_complete_one(later):
    first = args(probs=(1, 0, 0, 0, 0, 0, 0, 0), stated=1)
    f = parse_answer(call(first) + call(later, analysis=None))
    assert not f.parse_failed, f.parse_error
    assert f.predicted_bin == 1
    alone = parse_answer(call(later))
    assert alone.parse_failed and "unparseable" not in alone.parse_error


_value = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10), st.text(max_size=5),
                   st.none(), st.booleans(), st.lists(st.integers(), max_size=2))

_answer = st.dictionaries(st.sampled_from(["predicted_bin", *PROB_FIELDS, "reasoning", "name", "arguments"]),
                          _value, max_size=11)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_answer, noise=st.text(max_size=40), wrap=st.sampled_from(["call", "final", "fence", "bare", "cut"]))
def test_parser_never_raises(obj, noise, wrap):
    body = json.dumps(obj)
    text = {"call": call(body, analysis=noise), "fence": f"{noise}```json\n{body}\n```",
            "final": f"<|channel|>final<|message|>{noise}{body}", "bare": noise + body,
            "cut": call(body)[: len(noise) * 3]}[wrap]
    f = parse_answer(text)
    assert isinstance(f, Forecast)
    if f.parse_failed:
        assert f.probs is None and isinstance(f.parse_error, str) and f.parse_error
    else:
        assert len(f.probs) == 8 and sum(f.probs) == pytest.approx(1.0) and 1 <= f.predicted_bin <= 8
        assert all(0 <= p <= 1 for p in f.probs) and f.predicted_bin == bins.predicted_bin(f.probs)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_parser_never_raises_on_any_text(text):
    assert isinstance(parse_answer(text), Forecast)
