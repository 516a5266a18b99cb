"""Tests of forecaster_backends.py: a local transformers model, the embedded SmolLM2, an OpenAI-compatible server."""
import json
import socket
import time

import pytest
from fake_openai_server import (
    MODELS,
    FakeOpenAIServer,
    default_reply,
    error,
    final_text,
    logprobs,
    text_completion,
    token_logprobs,
)
from test_forecast_answer import TOOL, args
from test_forecast_prompt import A100, CAND, REF
from tiny_models import HARMONY_VOCAB, load_smollm2, tiny_gpt_oss

import bins
import forecaster as F
from forecast_answer import ANSWER_PREFIX, DIGITS, parse_completion, reasoning_of
from forecast_prompt import FORECAST_TOOL, build_messages, shared_messages
from models.forecaster_backends import OpenAIServerBackend, ServerError, TransformersBackend, embedded_backend, embedded_dtype

# ---- a tiny random GPT-OSS, end to end -----------------------------------------------------------

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


# ---- an OpenAI-compatible server (loopback fake) -------------------------------------------------

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
    from models import harmony
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
    # a server that cannot be reached, or does not serve the model, stops the run before any forecast
    with pytest.raises(ServerError, match=f"cannot list the models served at http://127.0.0.1:{port}/v1"):
        F.Forecaster(server_backend(f"http://127.0.0.1:{port}/v1", retries=1), cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])
    with FakeOpenAIServer() as server:
        with pytest.raises(ServerError, match="does not serve a model named 'gpt-oss-120b'; it serves openai/gpt-oss-20b"):
            F.Forecaster(OpenAIServerBackend(server.url, model="gpt-oss-120b"), cache_dir=None, hardware=A100) \
                .forecast_many("cross_entropy", REF, [CAND])
    refused = error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    with FakeOpenAIServer(replies=[refused]) as server:
        with pytest.raises(ServerError, match="answers no tool calls: start it with --enable-auto-tool-choice"):
            F.Forecaster(server_backend(server.url), cache_dir=None, hardware=A100) \
                .forecast_many("cross_entropy", REF, [CAND])
    assert F.main(["--task", "cross_entropy", "--candidate", __file__, "--server",
                   f"http://127.0.0.1:{port}/v1"]) == 2  # one line on stderr, no forecast


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


def test_server_logits_readout_for_gpt_oss_sends_our_harmony_ids(o200k):
    """vLLM's harmony renderer ignores continue_final_message: GPT-OSS's read-out prompt is rendered
    here, up to `{"predicted_bin": ` inside the tool call, and sent as ids to the completions
    endpoint, which returns the 8 digits' log-probs by id (vLLM's logprob_token_ids)."""
    import math

    from models import harmony
    digits = [harmony.encoding().encode(d)[0] for d in DIGITS]
    probs = dict(zip(digits, [0.05, 0.05, 0.1, 0.2, 0.3, 0.1, 0.05, 0.05]))
    reply = token_logprobs({i: math.log(p) for i, p in probs.items()}, sampled=12)
    with FakeOpenAIServer(replies=[reply]) as server:
        backend = server_backend(server.url)
        f = F.Forecaster(backend, readout="logits", cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    req, path = server.requests[0], server.paths[0]
    prompt = harmony.answer_prompt(build_messages("cross_entropy", REF, CAND, A100), "", ANSWER_PREFIX,
                                   [FORECAST_TOOL], "medium")
    assert path.endswith("/completions") and not path.endswith("/chat/completions")
    assert req["prompt"] == prompt and req["logprob_token_ids"] == digits and req["return_tokens_as_token_ids"]
    assert req["max_tokens"] == 1 and req["logprobs"] == 1
    assert harmony.encoding().decode(prompt).endswith("<|constrain|>json<|message|>" + ANSWER_PREFIX)
    assert "Current date: " + harmony.START_DATE in harmony.encoding().decode(prompt)
    # the sampled token (12, not a digit) beside the digits is not counted
    assert f.probs == pytest.approx([p / 0.9 for p in probs.values()]) and f.raw_sum == pytest.approx(0.9)
    assert f.tokens_in == len(prompt) and not f.parse_failed


def test_server_logits_readout_through_a_chat_template():
    """A model that is not GPT-OSS (no "gpt-oss" in its name, its root or its parent) keeps the chat
    endpoint, whose template continues a partial assistant message; tokens_in is the server's count."""
    models = [{"id": "smollm2", "object": "model", "root": "/models/SmolLM2-135M-Instruct", "parent": None}]
    with FakeOpenAIServer(replies=[logprobs({"5": 0.4, "4": 0.3, " 5": 0.1, "x": 0.1})], models=models) as server:
        backend = OpenAIServerBackend(server.url, model="smollm2", backoff_s=0.01, timeout_s=10)
        f = F.Forecaster(backend, readout="logits", cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    assert not backend.harmony  # asked /v1/models: its root is no GPT-OSS
    req = server.requests[0]
    assert req["logprobs"] is True and req["max_tokens"] == 1 and req["continue_final_message"] is True
    assert req["messages"][-1] == {"role": "assistant", "content": ANSWER_PREFIX}
    assert f.raw_sum == pytest.approx(0.8) and f.probs[4] == pytest.approx(0.5 / 0.8) and f.predicted_bin == 5
    assert f.tokens_in == 100  # the fake's usage.prompt_tokens
    with FakeOpenAIServer(replies=[final_text("5")], models=models) as server:  # a server without logprobs
        backend = OpenAIServerBackend(server.url, model="smollm2", backoff_s=0.01, timeout_s=10)
        f = F.Forecaster(backend, readout="logits", cache_dir=None, hardware=A100) \
            .forecast_many("cross_entropy", REF, [CAND])[0]
    assert f.parse_failed and "unsupported" in f.parse_error


def test_a_served_adapter_that_changes_nothing_stops_the_run():
    """Item: some vLLM versions load a LoRA on GPT-OSS's experts and ignore it. Before its first
    request the backend compares the adapter's log-probs of a fixed prompt with its base model's."""
    import math
    models = MODELS + [{"id": "grpo-brier", "object": "model", "root": "runs/a", "parent": "openai/gpt-oss-20b"}]

    def replies(differ):
        def reply(request):
            if request.get("prompt") == OpenAIServerBackend.ADAPTER_PROBE:
                shift = 0.3 if differ and request["model"] == "grpo-brier" else 0.0
                top = {" 2": math.log(0.5) - shift, " 3": math.log(0.2) + shift}
                return 200, {
                    "id": "c", "object": "text_completion", "created": 0, "model": request["model"], "usage": None,
                    "choices": [{"index": 0, "text": " 2", "finish_reason": "length", "logprobs": {
                        "tokens": [" 2"], "token_logprobs": [top[" 2"]], "top_logprobs": [top], "text_offset": [0]}}]}
            return default_reply(request)
        return reply

    with FakeOpenAIServer(default=replies(True), models=models) as server:
        backend = server_backend(server.url, adapter="grpo-brier")
        backend.model = "grpo-brier"
        f = F.Forecaster(backend, cache_dir=None, hardware=A100).forecast_many("cross_entropy", REF, [CAND])[0]
        assert not f.parse_failed
        assert [r.get("model") for r in server.requests[:2]] == ["grpo-brier", "openai/gpt-oss-20b"]
        backend.generate([[{"role": "user", "content": "x"}]])
        assert len([r for r in server.requests if r.get("prompt") == backend.ADAPTER_PROBE]) == 2  # once
    with FakeOpenAIServer(default=replies(False), models=models) as server:
        backend = server_backend(server.url, adapter="grpo-brier")
        backend.model = "grpo-brier"
        with pytest.raises(ServerError, match="adapter grpo-brier .* does not change the log-probs .* does not apply it"):
            F.Forecaster(backend, cache_dir=None, hardware=A100).forecast_many("cross_entropy", REF, [CAND])
        backend.model = "openai/gpt-oss-20b"  # the base model named where the adapter should be
        with pytest.raises(ServerError, match="serves no adapter named 'openai/gpt-oss-20b'.*--lora-modules"):
            backend.check_adapter()
    assert F.main(["--task", "cross_entropy", "--candidate", __file__, "--server", "http://127.0.0.1:9/v1",
                   "--model", "grpo-brier", "--adapter", "runs/a"]) == 2  # unreachable: one line, no forecast


# ---- sampling token ids on a server (GRPO's --server) ----------------------------------------------

def test_server_samples_keep_their_stop_token_and_fail_loudly():
    replies = [text_completion([{"token_ids": [5, 6], "stop_reason": 99},                   # vLLM left the stop out
                                {"token_ids": [5, 99], "stop_reason": 99},                  # or kept it
                                {"token_ids": [5, 6, 7], "finish_reason": "length"}]),      # or ran out
               text_completion([{"token_ids": None, "text": "56"}]),
               error(500), error(500)]
    with FakeOpenAIServer(replies=replies) as server:
        backend = OpenAIServerBackend(server.url, backoff_s=0.01, retries=1)
        kw = dict(n=3, max_new_tokens=8, temperature=1.0, stop_ids=[99, 98])
        assert backend.sample_ids([[1, 2, 3]], **kw) == [[[5, 6, 99], [5, 99], [5, 6, 7]]]
        with pytest.raises(ServerError, match="no token ids"):
            backend.sample_ids([[1, 2, 3]], **kw)
        with pytest.raises(ServerError, match="after 2 tries"):
            backend.sample_ids([[1, 2, 3]], **kw)
    assert server.requests[0]["prompt"] == [1, 2, 3] and server.requests[0]["stop_token_ids"] == [99, 98]
    assert server.requests[0]["return_token_ids"] is True


def test_server_log_probs_come_back_beside_the_sampled_ids():
    replies = [text_completion([{"token_ids": [5, 6], "stop_reason": 99, "token_logprobs": [-0.1, -0.2]},
                                {"token_ids": [5, 7, 8], "finish_reason": "length", "token_logprobs": [-1, -2, -3]}]),
               text_completion([{"token_ids": [5, 6], "finish_reason": "length"}])]
    with FakeOpenAIServer(replies=replies) as server:
        backend = OpenAIServerBackend(server.url, backoff_s=0.01, retries=0)
        kw = dict(n=2, max_new_tokens=8, temperature=1.0, stop_ids=[99], logprobs=True)
        # the stop token appended here has no server log-prob
        assert backend.sample_ids([[1, 2, 3]], **kw) == [[([5, 6, 99], [-0.1, -0.2, None]),
                                                          ([5, 7, 8], [-1, -2, -3])]]
        with pytest.raises(ServerError, match="no log-probs.*--tis-cap 0"):
            backend.sample_ids([[1, 2, 3]], **kw)
    assert [r.get("logprobs") for r in server.requests] == [1, 1]


# ---- the real SmolLM2 (the embedded model) -------------------------------------------------------

@pytest.mark.e2e
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


# ---- the chat-template path (any non-harmony model), with the tiny tokenizer ---------------------

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


def test_embedded_dtype_is_bf16_only_on_cpus_that_compute_bf16_natively(monkeypatch):
    import torch
    # AMX tiles (Intel Sapphire Rapids on) or AVX512-BF16 (AMD Zen 4 on, Intel Cooper Lake): bf16
    for amx, avx512_bf16, want in ((True, False, torch.bfloat16), (False, True, torch.bfloat16),
                                   (True, True, torch.bfloat16), (False, False, torch.float32)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        assert embedded_dtype() == embedded_dtype("auto") == want
        assert embedded_dtype("float32") == torch.float32 and embedded_dtype("bfloat16") == torch.bfloat16
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")  # a torch without the queries: the exact numbers
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert embedded_dtype() == torch.float32
    with pytest.raises(ValueError, match="float16"):
        embedded_dtype("float16")


def test_embedded_backend_loads_the_model_in_the_dtype_asked_for(monkeypatch, capsys):
    import torch
    from tiny_models import tiny_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from models import lm

    def tiny_embedded():
        config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, eos_token_id=0)
        return LlamaForCausalLM(config).eval(), tiny_tokenizer()
    monkeypatch.setattr(lm, "load_embedded", tiny_embedded)
    for dtype, want in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        backend = embedded_backend(dtype=dtype)
        assert backend.model.dtype == want and backend.embedded
        assert f"embedded model in {str(want)[6:]} (--embedded-dtype {dtype})" in capsys.readouterr().err
        probs = backend.next_token_probs([backend.answer_prompt([{"role": "user", "content": "fused?"}], "",
                                                                ANSWER_PREFIX)], DIGITS)[0]
        assert len(probs) == 8 and 0 < sum(probs) <= 1
