"""Tests of forecaster.py: prompt, parser, harmony format, backends, cache, gate, CLI and --eval."""
import hashlib
import json
import math
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forecaster as F
import bins
from fake_openai_server import FakeOpenAIServer, default_reply, error, final_text, logprobs
from forecast_answer import ANSWER_PREFIX, DIGITS, Forecast, failure, parse_answer, parse_completion, reasoning_of
from forecast_prompt import (FORECAST_TOOL, HARDWARE_PROFILES, PROB_FIELDS, TOOL_NAME, build_messages, hardware_info,
                             shared_messages)
from forecaster_backends import Completion, OpenAIServerBackend, TransformersBackend, embedded_backend
from tiny_models import HARMONY_VOCAB, O200K_SHA256, load_smollm2, tiny_gpt_oss

A100 = hardware_info("a100-80gb")
REF = "import torch\n\ndef custom_kernel(data):\n    logits, targets, g = data\n    return reference(logits, targets, g)\n"
CAND = "import triton\n\ndef custom_kernel(data):\n    return fused_cross_entropy(*data)\n"
TOOL = f"functions.{TOOL_NAME}"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models are dominated by thread overhead: on 2 shared cores one thread is ~5x faster."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def args(probs=(0, 0, 0.1, 0.2, 0.5, 0.2, 0, 0), stated=5, reasoning="Fewer passes over memory."):
    return {"predicted_bin": stated, **dict(zip(PROB_FIELDS, probs)), "reasoning": reasoning}


def call(a, analysis="Compare memory traffic.", end="<|call|>"):
    body = a if isinstance(a, str) else json.dumps(a)
    text = f"<|channel|>analysis<|message|>{analysis}<|end|>" if analysis is not None else ""
    return text + f"<|start|>assistant to={TOOL}<|channel|>commentary <|constrain|>json<|message|>{body}{end}"


# ---- prompt ---------------------------------------------------------------------------------------

def test_prompt_has_task_code_bins_and_hardware():
    from tasks import get_task
    system, user = build_messages("cross_entropy", REF, CAND, A100)
    assert (system["role"], user["role"]) == ("system", "user")
    for b in bins.BINS:  # the table is bins.py's bins, names and intervals
        assert f"| {b} | {bins.BIN_NAMES[b - 1]} | {bins.bin_label(b)} |" in system["content"]
    for edge in bins.BIN_EDGES:
        assert f"{edge:.4f}".rstrip("0").rstrip(".") in system["content"]
    assert "GPU execution simulator" in system["content"] and TOOL_NAME in system["content"]
    assert all(f in system["content"] for f in PROB_FIELDS)
    u = user["content"]
    assert get_task("cross_entropy").DESCRIPTION.strip() in u
    assert f"```python\n{REF.rstrip()}\n```" in u and f"```python\n{CAND.rstrip()}\n```" in u
    assert "```cuda" not in u
    assert u.count("cross_entropy") >= 3 and "Reference kernel (task cross_entropy)" in u
    for key in ("NVIDIA A100-SXM4-80GB", "| compute capability | 8.0 |", "| SMs | 108 |",
                "| memory bus width (bits) | 5120 |", "| memory clock (GHz) | 1.512 |"):
        assert key in u


def test_candidate_comes_last_after_the_shared_prefix():
    shared = shared_messages("cross_entropy", REF, A100)
    a = build_messages("cross_entropy", REF, CAND, A100)
    b = build_messages("cross_entropy", REF, CAND + "# other\n", A100)
    assert a[0] == b[0] == shared[0]
    for msgs in (a, b):  # everything but the candidate is one prefix, the same for every candidate
        user = msgs[1]["content"]
        assert user.startswith(shared[1]["content"])
        rest = user[len(shared[1]["content"]):]
        assert rest.startswith("Candidate kernel (task cross_entropy)") and "| SMs |" not in rest
    assert "Reference kernel" in shared[1]["content"] and "| SMs | 108 |" in shared[1]["content"]
    assert CAND not in shared[1]["content"]
    assert shared_messages("cross_entropy", CAND, A100) != shared  # the reference is part of it


def test_fence_survives_backticks_in_code():
    _, user = build_messages("cross_entropy", REF, 'DOC = """```python\nx```"""\n', A100)
    assert "````python\n" in user["content"]


def test_tool_schema_matches_bins():
    params = FORECAST_TOOL["function"]["parameters"]
    assert FORECAST_TOOL["function"]["name"] == TOOL_NAME
    assert params["required"] == ["predicted_bin", *PROB_FIELDS, "reasoning"]
    assert PROB_FIELDS[0] == "p_severe_slowdown" and PROB_FIELDS[-1] == "p_extreme_speedup"
    assert params["properties"]["predicted_bin"]["maximum"] == bins.N_BINS


def test_hardware_profiles_and_bad_profile():
    assert A100["sm_count"] == 108 and A100["compute_capability"] == "8.0" and A100["clock_ghz"] == 1.41
    assert set(HARDWARE_PROFILES) >= {"a100-80gb", "h100", "h200"}
    with pytest.raises(ValueError, match="unknown hardware profile"):
        hardware_info("tpu")
    import torch
    if not torch.cuda.is_available():
        assert hardware_info() == A100


def test_unknown_task_is_clear():
    with pytest.raises(ValueError, match="unknown task"):
        build_messages("matmul", REF, CAND, A100)


# ---- parser ---------------------------------------------------------------------------------------

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


# ---- harmony format with the real o200k vocabulary ------------------------------------------------

def test_o200k_vocabulary_is_the_official_file(o200k):
    """The o200k fixture (conftest.py) rebuilt the vocabulary from quicktok-v1, as the official one."""
    data = (o200k / "o200k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_SHA256
    assert data.count(b"\n") == 199998


def test_harmony_render_and_parse_round_trip(o200k):
    from openai_harmony import Message, RenderOptions, Role
    import harmony
    enc = harmony.encoding()
    messages = build_messages("cross_entropy", REF, CAND, A100)
    prompt = enc.decode(harmony.render(messages, [FORECAST_TOOL], "high"))
    assert prompt.startswith("<|start|>system<|message|>") and "Reasoning: high" in prompt
    assert "<|start|>developer<|message|># Instructions" in prompt and f"type {TOOL_NAME} =" in prompt
    assert "GPU execution simulator" in prompt and CAND.strip() in prompt
    assert prompt.endswith("<|start|>assistant")
    # the assistant's answer, rendered by harmony itself, decoded and parsed back
    answer = [Message.from_role_and_content(Role.ASSISTANT, "Two passes become one.").with_channel("analysis"),
              Message.from_role_and_content(Role.ASSISTANT, json.dumps(args(stated=6)))
              .with_channel("commentary").with_recipient(TOOL).with_content_type("<|constrain|>json")]
    tokens = [t for m in answer for t in enc.render(m, RenderOptions(conversation_has_function_tools=True))]
    tokens = tokens[2:]  # a completion starts after the prompt's "<|start|>assistant"
    assert tokens[-1] in enc.stop_tokens_for_assistant_actions()
    f = parse_answer(enc.decode(tokens))
    assert not f.parse_failed and f.stated_bin == 6 and f.predicted_bin == 5
    channels = harmony.messages(enc.decode(tokens))  # the one parser reads what harmony rendered
    assert [c.channel for c in channels] == ["analysis", "commentary"] and all(c.complete for c in channels)
    assert channels[1].recipient == TOOL and json.loads(channels[1].content)["predicted_bin"] == 6


# ---- a tiny random GPT-OSS, end to end --------------------------------------------------------------

@pytest.mark.slow
def test_tiny_gpt_oss_end_to_end_both_readouts(o200k):
    import torch
    model = tiny_gpt_oss(vocab_size=HARMONY_VOCAB)
    backend = TransformersBackend(model=model, tokenizer=None, name="tiny-gpt-oss", batch_size=4)
    assert backend.harmony and sorted(backend.stop_ids) == [200002, 200012]
    short, long = CAND, CAND + "\n# padding\n" * 40
    n_short = len(backend.render(build_messages("cross_entropy", REF, short, A100), [FORECAST_TOOL]))
    backend.context_length = n_short + 60  # the long candidate no longer fits: that row fails alone

    fc = F.Forecaster(backend, cache_dir=None, max_new_tokens=4, temperature=1.0, seed=1, hardware=A100)
    ok, too_long = fc.forecast_many("cross_entropy", REF, [short, long])
    assert too_long.parse_failed and too_long.parse_error.startswith("prompt too long:")
    assert f"> context {n_short + 60}" in too_long.parse_error
    assert ok.tokens_in == n_short and 1 <= ok.tokens_out <= 4 and ok.model == "tiny-gpt-oss"
    assert ok.parse_failed and ok.parse_error  # a random model writes no forecast: a reason, not a crash

    backend.context_length = 1 << 20
    logit = F.Forecaster(backend, readout="logits", cache_dir=None, hardware=A100)
    batched = logit.forecast_many("cross_entropy", REF, [short, long])
    for f in batched:
        assert not f.parse_failed and f.readout == "logits" and sum(f.probs) == pytest.approx(1.0)
        assert 0 < f.raw_sum <= 1 and f.predicted_bin == bins.predicted_bin(f.probs)
    # the read-out is the model's own next-token distribution over the digits, and the left
    # padding of the batch (the short row) changes nothing: compare with an unpadded forward
    prompt = backend.answer_prompt(build_messages("cross_entropy", REF, short, A100), "", ANSWER_PREFIX,
                                   [FORECAST_TOOL])
    assert backend.decode(prompt).endswith(f"to={TOOL}<|channel|>commentary <|constrain|>json<|message|>"
                                           + ANSWER_PREFIX)
    assert batched[0].tokens_in == len(prompt)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    p = torch.softmax(logits.float(), -1)[backend.candidate_ids(DIGITS)]
    assert batched[0].probs == pytest.approx((p / p.sum()).tolist(), abs=1e-4)
    assert batched[0].raw_sum == pytest.approx(float(p.sum()), rel=1e-3)


def _counting(model):
    """Record how many tokens each forward runs through the model."""
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True)
    return seen


def test_prefix_reuse_matches_full_prompts():
    """The shared prefix's KV cache, shifted under each row's left padding, gives the same next-token
    probabilities and the same greedy generations as running every full prompt, on a model with
    sliding-window layers (window 32, far shorter than the prefix) and rows of different lengths."""
    from tiny_models import tiny_tokenizer
    model = tiny_gpt_oss(vocab_size=512)
    backend = TransformersBackend(model=model, tokenizer=tiny_tokenizer(), name="tiny", batch_size=3)
    system = {"role": "system", "content": "| bin | name | speedup interval |\n" * 12}
    shared = [system, {"role": "user", "content": "def custom_kernel(data):\n    return torch.matmul(x, y)\n"}]
    convs = [[system, {"role": "user", "content": shared[1]["content"] + tail}]
             for tail in ("fused", "The candidate kernel fuses the softmax.", "x" * 45)]
    prompts = [backend.answer_prompt(c, "", ANSWER_PREFIX) for c in convs]
    cut = backend.answer_prompt(shared, None, "")
    seen = _counting(model)
    full = backend.next_token_probs(prompts, DIGITS)
    assert min(len(p) for p in prompts) > 100 and seen == [max(len(p) for p in prompts)]
    reused = backend.next_token_probs(prompts, DIGITS, shared=cut)
    assert backend.prefix_stats["computed"] == 1 and seen[-1] < seen[0] - 80  # the prefix was not rerun
    for a, b in zip(full, reused):
        assert a == pytest.approx(b, abs=1e-5)
    again = backend.next_token_probs(prompts[1:], DIGITS, shared=cut)
    assert backend.prefix_stats == {"computed": 1, "reused": 1, "prefix_tokens": backend.prefix_stats["prefix_tokens"]}
    assert again[0] == pytest.approx(full[1], abs=1e-5)
    # generation continues from the cached prefix: the same greedy tokens
    plain = backend.generate(convs, max_new_tokens=6, temperature=0, seed=0)
    cached = backend.generate(convs, max_new_tokens=6, temperature=0, seed=0, shared=shared)
    assert [c.completion_ids for c in plain] == [c.completion_ids for c in cached]
    assert [c.tokens_in for c in plain] == [c.tokens_in for c in cached]
    # a prefix the rows do not start with is not used: nothing is reused that would be wrong
    wrong = backend.answer_prompt([system, {"role": "user", "content": "another task"}], None, "")
    before = dict(backend.prefix_stats)
    backend.next_token_probs(prompts[:1], DIGITS, shared=wrong)
    assert backend.prefix_stats["computed"] == before["computed"] + 1  # only the common part, a new key
    assert backend.prefix_stats["prefix_tokens"] - before["prefix_tokens"] < len(cut) - 20


def test_split_attention_after_a_prefix_is_sdpa():
    """prefix_attention.py: the new tokens' attention over a cached prefix, run as two unmasked
    parts merged by their log-sum-exps, equals SDPA with the explicit mask (grouped-query heads,
    prefixes longer and shorter than the new part); a Llama (SDPA) backend forecasting one row at a
    time over a cached prefix gets the full prompts' probabilities."""
    import types
    import torch
    import prefix_attention
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from tiny_models import tiny_tokenizer
    torch.manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    for width, new in ((40, 9), (5, 30)):
        q = torch.randn(2, 6, new, 16)
        k, v = torch.randn(2, 2, width + new, 16), torch.randn(2, 2, width + new, 16)
        mask = torch.ones(new, width + new, dtype=torch.bool).tril(width)[None, None].expand(2, 1, -1, -1)
        with torch.no_grad():
            want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
            # without the mask: the split needs none, where plain SDPA would go wrong
            got, _ = prefix_attention.prefix_attention(module, q, k, v, None, scaling=0.25, cached_prefix=width)
            plain, _ = prefix_attention.prefix_attention(module, q, k, v, None, scaling=0.25)
        assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(plain, want, atol=1e-3)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                         eos_token_id=0, bos_token_id=None, initializer_range=0.5,  # answers that feel the attention
                                         attn_implementation="sdpa")).eval()
    backend = TransformersBackend(model=model, tokenizer=tiny_tokenizer(), name="tiny llama", batch_size=1)
    assert model.config._attn_implementation == prefix_attention.PREFIX_SDPA
    shared = [{"role": "system", "content": "| bin | name | speedup interval |\n" * 12}, {"role": "user", "content": "ref"}]
    prompts = [backend.answer_prompt(shared[:1] + [{"role": "user", "content": "ref" + tail}], "", ANSWER_PREFIX)
               for tail in (" fused", " a longer candidate kernel " * 8)]
    full = backend.next_token_probs(prompts, DIGITS)
    reused = backend.next_token_probs(prompts, DIGITS, shared=backend.answer_prompt(shared, None, ""))
    assert backend.prefix_stats["computed"] == 1
    for a, b in zip(full, reused):  # a random model's digits are unlikely: compare relatively
        assert a == pytest.approx(b, rel=1e-4, abs=1e-12)


def test_forecaster_hands_each_tasks_prefix_to_the_backend():
    class Recording(ScriptedBackend):
        def generate(self, conversations, *, shared=None, **kw):
            self.shared = getattr(self, "shared", []) + [(len(conversations), shared)]
            return super().generate(conversations, **kw)
    backend = Recording()
    pairs = [("cross_entropy", REF, CAND), ("fp8_quant", REF, CAND), ("cross_entropy", REF, CAND + "#2\n")]
    F.Forecaster(backend, cache_dir=None, hardware=A100).forecast_pairs(pairs)
    assert backend.shared == [(2, shared_messages("cross_entropy", REF, A100)),
                              (1, shared_messages("fp8_quant", REF, A100))]
    F.Forecaster(backend, cache_dir=None, hardware=A100, prefix_cache=False).forecast_pairs(pairs[:1])
    assert backend.shared[-1] == (1, None)


def test_gpu_check_forecast_cost_table_runs_on_cpu(o200k):
    """scripts/gpu_check.py's forecast-cost section, here on CPU with a one-layer tiny-width model
    (on a GPU it runs GPT-OSS-20B's width): every read-out and setting is timed, the logits read-out
    agrees with and without prefix reuse, and a row's ratio is its cost over the measurement's."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import gpu_check
    lines = []
    model = gpu_check.config_model(1, width="tiny", device="cpu")
    assert model.config.vocab_size == HARMONY_VOCAB and model.config.num_hidden_layers == 1
    rows = gpu_check.forecast_costs(lines.append, model, [CAND, CAND + "# b\n"], REF, measurement_s=2.0,
                                    device="cpu", verbalized_tokens=2)
    assert [(r["readout"], r["reuse"]) for r in rows] == [("logits", False), ("logits", True),
                                                          ("verbalized", False), ("verbalized", True)]
    for r in rows:
        assert r["total_s"] > 0 and r["ratio"] == pytest.approx(r["per_s"] / 2.0)
        assert r["tokens_out"] == (2 if r["readout"] == "verbalized" else 0) and r["tokens_in"] > 500
    diff = next(line for line in lines if line.startswith("| logits | yes"))
    assert float(diff.split("|")[-2]) < 1e-4


# ---- an OpenAI-compatible server (loopback fake) ------------------------------------------------------

def server_backend(url, **kw):
    return OpenAIServerBackend(url, model="openai/gpt-oss-20b", backoff_s=0.01, timeout_s=10, **kw)


def test_server_forecast_end_to_end():
    with FakeOpenAIServer() as server:
        fc = F.Forecaster(server_backend(server.url, reasoning_effort="low"), cache_dir=None, hardware=A100)
        fs = fc.forecast_many("cross_entropy", REF, [CAND, CAND + "# v2\n"])
        fc.forecast_many("cross_entropy", REF, [CAND + "# v3\n", CAND + "# v4\n"])
    # the shared prefix goes first, alone and once (the server's prefix cache then holds it)
    assert len(server.requests) == 5
    warm, rows = server.requests[0], server.requests[1:]
    assert warm["max_tokens"] == 1 and warm["messages"] == shared_messages("cross_entropy", REF, A100)
    for f in fs:
        assert not f.parse_failed and f.predicted_bin == 5 and f.probs[4] == pytest.approx(0.5)
        assert (f.tokens_in, f.tokens_out, f.model) == (100, 20, "openai/gpt-oss-20b")
    for req in [warm] + rows:  # the same tools and system text, so the same prompt prefix
        assert req["tools"] == [FORECAST_TOOL] and req["tool_choice"] == "auto"
        assert req["reasoning_effort"] == "low" and req["messages"][0]["role"] == "system"
    for req in rows:
        assert req["messages"][1]["content"].startswith(warm["messages"][1]["content"])
        assert req["max_tokens"] == 4096


def test_server_final_content_answer_is_parsed():
    with FakeOpenAIServer(replies=[final_text("```json\n" + json.dumps(args(stated=4)) + "\n```", reasoning="hm")]) as server:
        c = server_backend(server.url).generate([[{"role": "user", "content": "x"}]], max_new_tokens=9,
                                                temperature=1.0, seed=0)[0]
    import harmony
    assert [m.channel for m in harmony.messages(c.text)] == ["analysis", "final"]
    f = parse_completion(c)
    assert not f.parse_failed and f.stated_bin == 4 and reasoning_of(c) == "hm"


def test_server_retries_then_succeeds():
    with FakeOpenAIServer(replies=[error(500), error(503)]) as server:
        f = F.Forecaster(server_backend(server.url, retries=3), cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    assert len(server.requests) == 3 and not f.parse_failed


def test_server_errors_become_parse_failures():
    with FakeOpenAIServer(default=lambda r: error(500)) as server:
        f = F.Forecaster(server_backend(server.url, retries=1), cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    assert len(server.requests) == 2 and f.parse_failed and "server error after 2 tries" in f.parse_error
    with FakeOpenAIServer(replies=[error(400, "maximum context length is 131072 tokens")]) as server:
        f = F.Forecaster(server_backend(server.url), cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    assert len(server.requests) == 1 and "refused the request (400)" in f.parse_error
    assert "maximum context length" in f.parse_error
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f = F.Forecaster(server_backend(f"http://127.0.0.1:{port}/v1", retries=1), cache_dir=None, hardware=A100) \
        .forecast_many("cross_entropy", REF, [CAND])[0]
    assert f.parse_failed and "APIConnectionError" in f.parse_error


def test_server_replicas_share_the_rows_least_loaded_first_and_a_retry_goes_to_another():
    def slow_rows(request):  # rows take a while, so all of a batch's are in flight at once
        if request.get("max_tokens") != 1:
            time.sleep(0.5)
        return default_reply(request)

    with FakeOpenAIServer(default=slow_rows) as a, FakeOpenAIServer(default=slow_rows) as b:
        fs = F.Forecaster(server_backend(f"{a.url},{b.url}"), cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND + f"# v{i}\n" for i in range(8)])
    assert not any(f.parse_failed for f in fs)
    for server in (a, b):  # each replica computed the shared prefix (its own cache), then took half the rows
        assert server.requests[0]["max_tokens"] == 1 and len(server.requests) == 1 + 4
    with FakeOpenAIServer(default=lambda r: error(503)) as down, FakeOpenAIServer() as up:
        f = F.Forecaster(server_backend(f"{down.url},{up.url}", retries=1), cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    assert not f.parse_failed and (len(down.requests), len(up.requests)) == (1, 1)


def test_server_logits_readout():
    with FakeOpenAIServer(replies=[logprobs({"5": 0.4, "4": 0.3, " 5": 0.1, "x": 0.1})]) as server:
        f = F.Forecaster(server_backend(server.url), readout="logits", cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    req = server.requests[0]
    assert req["logprobs"] is True and req["max_tokens"] == 1 and req["continue_final_message"] is True
    assert req["messages"][-1] == {"role": "assistant", "content": ANSWER_PREFIX}
    assert f.raw_sum == pytest.approx(0.8) and f.probs[4] == pytest.approx(0.5 / 0.8) and f.predicted_bin == 5
    with FakeOpenAIServer(replies=[final_text("5")]) as server:  # a server without logprobs
        f = F.Forecaster(server_backend(server.url), readout="logits", cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    assert f.parse_failed and "unsupported" in f.parse_error


# ---- the gate ---------------------------------------------------------------------------------------------

def test_gate_decisions():
    sure = Forecast(probs=[0, 0, 0, 0.05, 0.9, 0.05, 0, 0], predicted_bin=5)
    unsure = Forecast(probs=[0.125] * 8, predicted_bin=1)
    failed = failure("bad JSON")
    gate = F.Gate("maxprob", 0.5)
    assert [gate.decide(f) for f in (sure, unsure, failed)] == ["trust", "defer", "defer"]
    assert F.Gate("entropy", 0.5).decide(sure) == "trust" and F.Gate("entropy", 0.5).decide(unsure) == "defer"
    assert F.Gate("margin", 0.9).decide(sure) == "defer" and F.Gate("margin", 0.8).decide(sure) == "trust"
    assert F.Gate("maxprob", 0.0).decide(failed) == "defer"
    with pytest.raises(ValueError):
        F.Gate("variance", 0.5)


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
    gate = F.Gate.from_labelled(forecasts, truth, target_risk=0.1, delta=0.05)
    trusted = [(f, y) for f, y in zip(forecasts, truth) if gate.decide(f) == "trust"]
    risk = sum(f.predicted_bin != y for f, y in trusted) / len(trusted)
    assert 0.5 < gate.threshold < 0.9 and len(trusted) > 100 and risk < 0.1
    always_wrong = F.Gate.from_labelled(forecasts[:200], [1] * 200, target_risk=0.1, delta=0.05)
    assert always_wrong.threshold == math.inf and always_wrong.decide(forecasts[199]) == "defer"


# ---- cache -----------------------------------------------------------------------------------------------

class ScriptedBackend:
    """Answers every conversation with a fixed tool call; counts calls; can fail after n calls."""
    name, adapter, reasoning_effort = "scripted", None, "medium"

    def __init__(self, fail_after=None, answer=None):
        self.calls, self.rows, self.fail_after = 0, 0, fail_after
        self.answer = answer or call(args())

    def generate(self, conversations, *, max_new_tokens, temperature, seed, tools=None, shared=None):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("backend went away")
        self.calls += 1
        self.rows += len(conversations)
        return [Completion(self.answer, 10, 5) for _ in conversations]


def test_cache_hits_do_not_touch_the_backend(tmp_path):
    backend = ScriptedBackend()
    fc = F.Forecaster(backend, cache_dir=tmp_path, hardware=A100)
    first = fc.forecast_many("cross_entropy", REF, [CAND, REF])
    assert backend.calls == 1 and backend.rows == 2 and len(list(tmp_path.glob("*.json"))) == 2
    again = fc.forecast_many("cross_entropy", REF, [REF, CAND, CAND + "#new\n"])
    assert backend.rows == 3  # only the new candidate was generated
    assert again[0].to_dict() == first[1].to_dict() and again[1].to_dict() == first[0].to_dict()
    F.Forecaster(backend, cache_dir=tmp_path, hardware=A100, seed=7).forecast_many("cross_entropy", REF, [CAND])
    assert backend.rows == 4  # another seed is another forecast
    fc.forecast_many("cross_entropy", REF, [CAND], repeat=1)
    assert backend.rows == 5
    entry = tmp_path / f"{fc.cache_key(build_messages('cross_entropy', REF, CAND, A100), 0)}.json"
    assert entry.exists()
    entry.write_text("{half")  # a damaged entry is recomputed, not fatal
    fc.forecast_many("cross_entropy", REF, [CAND, REF])
    assert backend.rows == 6
    F.Forecaster(backend, cache_dir=None, hardware=A100).forecast_many("cross_entropy", REF, [CAND])
    assert backend.rows == 7


def test_errors_are_not_cached(tmp_path):
    class Down(ScriptedBackend):
        def generate(self, conversations, **kw):
            self.rows += len(conversations)
            return [Completion("", error="server error after 4 tries") for _ in conversations]
    backend = Down()
    fc = F.Forecaster(backend, cache_dir=tmp_path, hardware=A100)
    assert fc.forecast_many("cross_entropy", REF, [CAND])[0].parse_error == "server error after 4 tries"
    fc.forecast_many("cross_entropy", REF, [CAND])
    assert backend.rows == 2 and not list(tmp_path.glob("*.json"))


# ---- command line -----------------------------------------------------------------------------------------

def test_cli_single_forecast(tmp_path, capsys):
    cand = tmp_path / "k.py"
    cand.write_text(CAND)
    argv = ["--task", "cross_entropy", "--candidate", str(cand), "--no-cache", "--hardware", "h100"]
    assert F.main(argv, backend=ScriptedBackend()) == 0
    out = capsys.readouterr().out
    assert "5 moderate speedup" in out and "[1.41x, 2.00x)" in out and "| 0.500" in out
    assert "expected speedup" in out and "gate (>= 0.5): trust" in out
    assert F.main(argv + ["--json", "--threshold", "0.9"], backend=ScriptedBackend()) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["gate"] == "defer" and row["predicted_bin"] == 5 and row["confidence"] == pytest.approx(0.5)
    assert F.main(argv, backend=ScriptedBackend(answer="no idea")) == 1
    assert "forecast failed" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--task", "matmul", "--candidate", "k.py"], "unknown task"),
    (["--task", "cross_entropy", "--candidate", "missing.py"], "cannot read kernel file"),
    (["--task", "cross_entropy"], "give --task and --candidate"),
    (["--eval", "missing.jsonl", "--out", "p.jsonl"], "cannot read rows file"),
    (["--task", "cross_entropy", "--candidate", "k.py", "--model", "no/such-model-here"], "hf download"),
])
def test_cli_bad_input_is_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text(CAND)
    assert F.main(argv + ["--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


# ---- --eval, resumable -----------------------------------------------------------------------------------

def _rows(path, n):
    with open(path, "w") as f:
        for i in range(n):
            if i % 2:  # the paper's eval-set schema and our training-row schema, mixed
                r = dict(comparison_id=f"c{i}", pack="cross_entropy", anchor_code=REF, candidate_code=CAND + f"#{i}\n",
                         aggregated_speedup=1.7, true_bin=5, hardware="A100", source_id="s")
            else:
                r = dict(row_id=f"r{i}", pack="fp8_quant", anchor_code=REF, candidate_code=CAND + f"#{i}\n",
                         aggregated_speedup=0.6, relative_bin=2, pair_type="pair")
            f.write(json.dumps(r) + "\n")


def test_cli_eval_reports_time_and_prefix_setting(tmp_path, capsys):
    class Recording(ScriptedBackend):
        def generate(self, conversations, *, shared=None, **kw):
            self.shared = shared
            return super().generate(conversations, **kw)
    _rows(tmp_path / "rows.jsonl", 3)
    for flag, said in (([], "computed once per task"), (["--no-prefix-cache"], "recomputed for every candidate")):
        backend = Recording()
        argv = ["--eval", str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / f"p{len(flag)}.jsonl"), "--no-cache"]
        assert F.main(argv + flag, backend=backend) == 0
        err = capsys.readouterr().err
        assert "wrote 3 prediction rows" in err and said in err and "model load" in err
        assert (backend.shared is None) == bool(flag)


def test_eval_resumes_after_interruption(tmp_path):
    rows, out = tmp_path / "rows.jsonl", tmp_path / "pred.jsonl"
    _rows(rows, 7)
    # rows run task by task (c1 c3 | c5, r0 | r2 r4 ...), one backend call per task in a batch
    fc = F.Forecaster(ScriptedBackend(fail_after=3), cache_dir=None, hardware=A100)
    with pytest.raises(RuntimeError):
        F.run_eval(fc, rows, out, repeats=2, batch_size=2, progress=False)
    written = out.read_text().splitlines()
    assert len(written) == 4
    with open(out, "a") as f:
        f.write('{"id": "c5", "rep')  # killed mid-line
    backend = ScriptedBackend()
    n = F.run_eval(F.Forecaster(backend, cache_dir=None, hardware=A100), rows, out, repeats=2, batch_size=2,
                   progress=False)
    assert n == 10 and backend.rows == 10
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(p["id"], p["repeat"]) for p in preds]
    assert len(keys) == len(set(keys)) == 14
    assert set(keys) == {(i, k) for i in ["r0", "c1", "r2", "c3", "r4", "c5", "r6"] for k in (0, 1)}
    c1 = next(p for p in preds if p["id"] == "c1")
    assert (c1["task"], c1["true_bin"], c1["true_speedup"], c1["predicted_bin"]) == ("cross_entropy", 5, 1.7, 5)
    r0 = next(p for p in preds if p["id"] == "r0")
    assert (r0["task"], r0["true_bin"], r0["model"], r0["readout"]) == ("fp8_quant", 2, "scripted", "verbalized")
    assert {"probs", "parse_failed", "parse_error", "stated_bin", "raw_sum", "tokens_in", "tokens_out",
            "seconds"} <= set(r0)
    assert F.run_eval(F.Forecaster(backend, cache_dir=None, hardware=A100), rows, out, repeats=2,
                      progress=False) == 0


def test_eval_cli_and_bad_rows(tmp_path, capsys):
    rows, out = tmp_path / "rows.jsonl", tmp_path / "pred.jsonl"
    _rows(rows, 3)
    assert F.main(["--eval", str(rows), "--out", str(out), "--no-cache"], backend=ScriptedBackend()) == 0
    assert len(out.read_text().splitlines()) == 3
    rows.write_text('{"row_id": "x", "pack": "nope", "anchor_code": "", "candidate_code": ""}\n')
    assert F.main(["--eval", str(rows), "--out", str(tmp_path / "p2.jsonl"), "--no-cache"]) == 2
    assert "rows.jsonl:1:" in capsys.readouterr().err and not (tmp_path / "p2.jsonl").exists()


# ---- the real SmolLM2 (the embedded model) ---------------------------------------------------------------

@pytest.mark.slow
def test_embedded_smollm2_logits_forecast(capsys):
    model, tok = load_smollm2()  # shared with other tests in the session; embedded_backend() loads the same
    backend = embedded_backend(model=model, tokenizer=tok)
    assert "NOT meaningful" in capsys.readouterr().err
    fc = F.Forecaster(backend, cache_dir=None, hardware=A100)
    assert fc.readout == "logits"
    f = fc.forecast_many("cross_entropy", REF, [CAND])[0]
    assert not f.parse_failed and sum(f.probs) == pytest.approx(1.0) and 0 < f.raw_sum <= 1
    assert f.tokens_in > 500 and f.stated_bin is None
    assert backend.decode(backend.answer_prompt(build_messages("cross_entropy", REF, CAND, A100), "",
                                                ANSWER_PREFIX)).endswith("assistant\n" + ANSWER_PREFIX)


# ---- the chat-template path (any non-harmony model), with the tiny tokenizer --------------------------------

def test_template_backend_batches_like_single_rows():
    from tiny_models import tiny_tokenizer
    backend = TransformersBackend(model=tiny_gpt_oss(vocab_size=512), tokenizer=tiny_tokenizer(), name="tiny",
                                    batch_size=2)
    assert backend.chat_format == "template"
    convs = [[{"role": "user", "content": "Which kernel is faster?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fused or not fused, which wins?"}]]
    both = backend.generate(convs, max_new_tokens=5, temperature=0, seed=0)
    alone = backend.generate(convs[:1], max_new_tokens=5, temperature=0, seed=0)
    assert both[0].completion_ids == alone[0].completion_ids  # left padding changes nothing
    assert both[1].tokens_in == len(backend.encode(backend._template(convs[1], None)))
    assert backend.tokenizer.decode(both[1].prompt_ids).endswith("<|user|>\nFused or not fused, which wins?<|end|>\n<|assistant|>\n")
    prompts = [backend.answer_prompt(c, "", ANSWER_PREFIX) for c in convs]
    rows = backend.next_token_probs(prompts, DIGITS)
    single = backend.next_token_probs(prompts[1:], DIGITS)
    assert all(len(r) == 8 and 0 < sum(r) <= 1 for r in rows)
    assert rows[1] == pytest.approx(single[0], abs=1e-5)
