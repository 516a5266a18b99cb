"""Tests of the forecaster's protocols and variants: the paper protocol's prompt, the abstain tool,
the hardware each row was measured on, and the retry of an answer that does not parse; through
the parser, the Forecaster, the harmony format, a served model (the fake OpenAI server) and the
command line."""
import json

import pytest
from fake_openai_server import FakeOpenAIServer, final_text, tool_call

import forecaster as F
from forecast_answer import parse_answer
from forecast_prompt import (
    DEFER_TOOL,
    DEFER_TOOL_NAME,
    PAPER_PROB_FIELDS,
    PROB_FIELDS,
    TOOL_NAME,
    answer_tools,
    build_messages,
    forecast_tool,
    hardware_info,
    shared_messages,
)
from gate import Gate
from models.forecaster_backends import Completion, OpenAIServerBackend

A100 = hardware_info("a100-80gb")
REF = "import torch\n\ndef custom_kernel(data):\n    return reference(*data)\n"
CAND = "import triton\n\ndef custom_kernel(data):\n    return fused_cross_entropy(*data)\n"
PROBS = (0, 0, 0.1, 0.2, 0.5, 0.2, 0, 0)


def answer(fields=PROB_FIELDS, probs=PROBS, stated=5):
    return {"predicted_bin": stated, **dict(zip(fields, probs)), "reasoning": "One pass instead of two."}


def call(args, tool=TOOL_NAME):
    return (f"<|channel|>analysis<|message|>Compare traffic.<|end|><|start|>assistant to=functions.{tool}"
            f"<|channel|>commentary <|constrain|>json<|message|>{json.dumps(args)}<|call|>")


# ---- the paper protocol's prompt ----------------------------------------------------------------

def test_paper_prompt_shows_the_originals_table_and_nothing_more():
    from tasks import get_task
    system, user = build_messages("cross_entropy", REF, CAND, A100, protocol="paper")
    s, u = system["content"], user["content"]
    # its table: right-closed, its own edges and names (bin 4 "minor slowdown", 0.71 < S <= 1.0)
    for row in ("| 1 | severe slowdown | S <= 0.25 |", "| 4 | minor slowdown | 0.71 < S <= 1.0 |",
                "| 5 | minor speedup | 1.0 < S <= 1.41 |", "| 8 | extreme speedup | S > 4.0 |"):
        assert row in s
    assert "unless the evidence is decisive" in s and all(f in s for f in PAPER_PROB_FIELDS)
    assert "parity" not in s and "1.4142" not in s and "```json" not in s  # none of ours
    # the task name as the operation, "reference" and "candidate" as the kernels, no description
    assert "Operation: cross_entropy" in u and "Kernel `reference`" in u and "Kernel `candidate`" in u
    assert get_task("cross_entropy").DESCRIPTION.strip()[:60] not in u
    assert u.index("Kernel `candidate`") < u.index("| SMs | 108 |")  # the hardware after the candidate
    assert f"```python\n{CAND.rstrip()}\n```" in u
    ours = build_messages("cross_entropy", REF, CAND, A100)
    assert get_task("cross_entropy").DESCRIPTION.strip() in ours[1]["content"]
    # the part every candidate shares ends before the candidate, under this protocol too
    shared = shared_messages("cross_entropy", REF, A100, protocol="paper")
    assert u.startswith(shared[1]["content"]) and "Kernel `candidate`" not in shared[1]["content"]
    with pytest.raises(ValueError, match="unknown protocol"):
        build_messages("cross_entropy", REF, CAND, A100, protocol="theirs")


def test_each_protocols_tool_names_its_fields_after_its_table():
    ours, paper = forecast_tool("ours")["function"]["parameters"], forecast_tool("paper")["function"]["parameters"]
    assert ours["required"] == ["predicted_bin", *PROB_FIELDS, "reasoning"]
    assert paper["required"] == ["predicted_bin", *PAPER_PROB_FIELDS, "reasoning"]
    assert "[1.00x, 1.41x)" in ours["properties"]["p_parity_to_slight_speedup"]["description"]
    assert answer_tools("paper", abstain=True) == [forecast_tool("paper"), DEFER_TOOL]


def test_the_parser_reads_either_protocols_field_names_by_position():
    for fields in (PROB_FIELDS, PAPER_PROB_FIELDS):
        f = parse_answer(call(answer(fields)))
        assert not f.parse_failed and f.probs == pytest.approx(list(PROBS)) and f.predicted_bin == 5
    mixed = {k: v for k, v in answer(PAPER_PROB_FIELDS).items() if k != "p_minor_speedup"}
    assert "missing field p_minor_speedup" in parse_answer(call(mixed)).parse_error


# ---- the abstain variant -------------------------------------------------------------------------

def test_abstain_prompt_and_the_deferral_tool():
    for protocol in ("ours", "paper"):
        s = build_messages("cross_entropy", REF, CAND, A100, protocol=protocol, abstain=True)[0]["content"]
        assert DEFER_TOOL_NAME in s and "exactly one of the two tools" in s
        assert DEFER_TOOL_NAME not in build_messages("cross_entropy", REF, CAND, A100, protocol=protocol)[0]["content"]
    assert DEFER_TOOL["function"]["parameters"]["required"] == ["reason"]


def test_a_deferral_is_parsed_as_a_deferral_not_a_failure():
    f = parse_answer(call({"reason": "Both kernels call the same library routine."}, DEFER_TOOL_NAME))
    assert f.deferred and not f.parse_failed and f.probs is None and f.reasoning.startswith("Both kernels")
    assert f.confidence() is None and f.expected_bin is None
    assert Gate("maxprob", 0.0).decide(f) == "defer"  # even a gate that trusts everything
    blank = parse_answer(call({"reason": " "}, DEFER_TOOL_NAME))
    assert blank.parse_failed and "without a reason" in blank.parse_error
    # the last complete call wins, whichever tool it calls
    both = call(answer()) + call({"reason": "unsure"}, DEFER_TOOL_NAME)[len("<|channel|>analysis<|message|>Compare traffic.<|end|>"):]
    assert parse_answer(both).deferred
    # a model without tool calls writes the deferral as JSON in its final channel
    text = ("<|channel|>final<|message|>" + json.dumps({"name": DEFER_TOOL_NAME, "arguments": {"reason": "unsure"}})
            + "<|return|>")
    assert parse_answer(text).deferred


def test_abstain_needs_the_verbalized_readout():
    with pytest.raises(ValueError, match="verbalized read-out"):
        F.Forecaster(Scripted(), readout="logits", cache_dir=None, hardware=A100, abstain=True)


# ---- hardware: from the row, unknown is an error ----------------------------------------------------

class Scripted:
    """Answers from a script, one completion per conversation; records each call's seed and tools."""
    name, adapter, reasoning_effort = "scripted", None, "medium"

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def generate(self, conversations, *, max_new_tokens, temperature, seed, tools=None, shared=None):
        self.calls.append(dict(n=len(conversations), seed=seed, tools=tools, max_new_tokens=max_new_tokens,
                               conversations=conversations))
        return [Completion(self.answers.pop(0) if self.answers else call(answer()), 10, 5)
                for _ in conversations]


def test_eval_rows_are_shown_the_hardware_they_were_measured_on(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(dict(row_id=f"r{i}", pack="cross_entropy", anchor_code=REF,
                                            candidate_code=CAND + f"#{i}\n", aggregated_speedup=1.5, **hw)) + "\n"
                            for i, hw in enumerate([{"hardware": "NVIDIA H100 80GB HBM3"}, {"hardware": "NVIDIA L40S"}, {}])))
    backend = Scripted()
    F.run_eval(F.Forecaster(backend, cache_dir=None, hardware=A100), rows, tmp_path / "p.jsonl", progress=False)
    seen = {c["conversations"][0][1]["content"].split("#")[-1][:2]: c["conversations"][0][1]["content"]
            for c in backend.calls}
    assert len(backend.calls) == 3  # one prefix per (task, reference, hardware)
    devices = sorted(next(line for line in u.splitlines() if line.startswith("| device |")) for u in seen.values())
    assert devices == ["| device | NVIDIA A100-SXM4-80GB |", "| device | NVIDIA H100 80GB HBM3 |",
                       "| device | NVIDIA L40S |"]


def test_cli_refuses_a_row_of_unknown_hardware_before_loading_a_model(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(dict(row_id="x", pack="cross_entropy", anchor_code=REF, candidate_code=CAND,
                                     aggregated_speedup=1.5, hardware="FakeGPU")) + "\n")
    assert F.main(["--eval", str(rows), "--out", str(tmp_path / "p.jsonl"), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown hardware 'FakeGPU'" in err and "l40s" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "p.jsonl").exists()


# ---- the retry of an answer that does not parse ----------------------------------------------------

def test_a_failed_answer_is_generated_once_more_with_another_seed():
    backend = Scripted("I think it is faster.", call(answer()), call(answer()))
    fc = F.Forecaster(backend, cache_dir=None, hardware=A100, parse_retries=1, seed=3)
    retried, fine = fc.forecast_many("cross_entropy", REF, [CAND, CAND + "#2\n"])
    assert not retried.parse_failed and retried.attempts == 2 and fine.attempts == 1
    assert (retried.tokens_in, retried.tokens_out) == (20, 10)  # both attempts are its cost
    assert [c["n"] for c in backend.calls] == [2, 1] and backend.calls[1]["seed"] != backend.calls[0]["seed"]
    never = Scripted("no", "no", "no")
    f = F.Forecaster(never, cache_dir=None, hardware=A100, parse_retries=1).forecast_many("cross_entropy", REF, [CAND])[0]
    assert f.parse_failed and f.attempts == 2 and len(never.calls) == 2
    plain = Scripted("no")
    assert F.Forecaster(plain, cache_dir=None, hardware=A100).forecast_many("cross_entropy", REF, [CAND])[0].parse_failed
    assert len(plain.calls) == 1  # ours: no retry


# ---- a served model and the harmony format ---------------------------------------------------------

def test_server_paper_protocol_and_abstain_round_trip():
    reason = "Both call the same cuBLAS routine; the difference is noise."
    with FakeOpenAIServer(replies=[tool_call(), tool_call({"reason": reason}, name=DEFER_TOOL_NAME),
                                   final_text("no json here"), tool_call(answer(PAPER_PROB_FIELDS))]) as server:
        backend = OpenAIServerBackend(server.url, model="openai/gpt-oss-20b", backoff_s=0.01, timeout_s=10)
        fc = F.Forecaster(backend, cache_dir=None, hardware=A100, protocol="paper", abstain=True,
                          parse_retries=1, prefix_cache=False)
        first = fc.forecast_many("cross_entropy", REF, [CAND])[0]
        deferred = fc.forecast_many("cross_entropy", REF, [CAND + "#2\n"])[0]
        retried = fc.forecast_many("cross_entropy", REF, [CAND + "#3\n"])[0]
    assert not first.parse_failed and first.predicted_bin == 5  # the fake's default: the original's names
    assert deferred.deferred and deferred.reasoning == reason
    assert retried.attempts == 2 and not retried.parse_failed and retried.probs == pytest.approx(list(PROBS))
    req = server.requests[0]
    assert [t["function"]["name"] for t in req["tools"]] == [TOOL_NAME, DEFER_TOOL_NAME]
    assert req["tools"][0] == forecast_tool("paper") and "Operation: cross_entropy" in req["messages"][1]["content"]
    assert req["max_tokens"] == 4096


def test_harmony_renders_both_tools_and_reads_a_deferral(o200k):
    from openai_harmony import Message, RenderOptions, Role

    from models import harmony
    enc = harmony.encoding()
    messages = build_messages("cross_entropy", REF, CAND, A100, protocol="paper", abstain=True)
    prompt = enc.decode(harmony.render(messages, answer_tools("paper", abstain=True), "medium"))
    assert f"type {TOOL_NAME} =" in prompt and f"type {DEFER_TOOL_NAME} =" in prompt
    assert "p_minor_slowdown" in prompt and "| 4 | minor slowdown | 0.71 < S <= 1.0 |" in prompt
    reply = [Message.from_role_and_content(Role.ASSISTANT, "Same library call.").with_channel("analysis"),
             Message.from_role_and_content(Role.ASSISTANT, json.dumps({"reason": "same library call"}))
             .with_channel("commentary").with_recipient(f"functions.{DEFER_TOOL_NAME}")
             .with_content_type("<|constrain|>json")]
    tokens = [t for m in reply for t in enc.render(m, RenderOptions(conversation_has_function_tools=True))][2:]
    f = parse_answer(enc.decode(tokens))
    assert f.deferred and f.reasoning == "same library call"


# ---- the command line ---------------------------------------------------------------------------------

def test_cli_paper_protocol_with_abstain_writes_deferrals_that_metrics_counts(tmp_path, capsys):
    from pathlib import Path

    import metrics
    fixtures = Path(__file__).parent / "fixtures"
    out = tmp_path / "p.jsonl"
    backend = Scripted(call({"reason": "unsure"}, DEFER_TOOL_NAME))
    argv = ["--eval", str(fixtures / "paper_eval_rows.jsonl"), "--out", str(out), "--no-cache",
            "--protocol", "paper", "--abstain"]
    assert F.main(argv, backend=backend) == 0
    err = capsys.readouterr().err
    assert "protocol: paper" in err and "16384 new tokens" in err and "1 retry" in err
    assert all(c["max_new_tokens"] == 16384 and len(c["tools"]) == 2 for c in backend.calls)
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(p["deferred"] for p in preds) == 1 and not any(p["parse_failed"] for p in preds)
    assert metrics.main([str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["deferral_rate"] == pytest.approx(1 / len(preds)) and rep["parse_rate"] == 1.0
    # the deferred row is never trusted: at most n - 1 of n rows are covered at any threshold
    from data.dataset import load_predictions
    from selective import risk_coverage, row_confidence
    rows = load_predictions(out)
    _, coverage, _ = risk_coverage([row_confidence(r) for r in rows], [False] * len(rows))
    assert rep["n"] == len(preds) and max(coverage) == pytest.approx((len(preds) - 1) / len(preds))
