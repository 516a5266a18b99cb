"""Tests of lm_memory.py: how many rows a GPU holds, with GPT-OSS-20B's real config."""
import pytest

from models import lm_memory

GIB = 2 ** 30


def gpt_oss_20b_config(**kw):
    """GPT-OSS-20B's config as published (no weights): the numbers the memory plan depends on."""
    from transformers import GptOssConfig
    return GptOssConfig(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                        num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072,
                        layer_types=["sliding_attention", "full_attention"] * 12, **kw)


def test_kv_cache_bytes_of_gpt_oss_20b():
    cfg = gpt_oss_20b_config()
    per_token_layer = 2 * 8 * 64 * 2  # keys and values, 8 KV heads of 64, bf16
    assert lm_memory.kv_bytes(cfg, 1000, sliding_capped=False) == 24 * 1000 * per_token_layer
    # the 12 sliding-window layers keep 128 tokens once their cache drops older ones
    assert lm_memory.kv_bytes(cfg, 12800) == (12 * 12800 + 12 * 128) * per_token_layer
    assert lm_memory.kv_bytes(cfg, 100) == 24 * 100 * per_token_layer  # shorter than the window


def test_batch_sizes_for_gpt_oss_20b_on_80_and_141_gb_cards():
    """GPT-OSS-20B is ~42 GB in bf16 (an adapter or training dequantises it), ~14 GB with MXFP4
    experts; forecast prompts run 2.5k-4.6k tokens."""
    cfg = gpt_oss_20b_config()
    h100_bf16, h200_mxfp4 = 36 * GIB, 125 * GIB  # free after the weights, CUDA context and adapter
    forecast = dict(prompt_tokens=4600, new_tokens=4096)
    flex = lm_memory.rows_that_fit(cfg, h100_bf16, **forecast)
    eager = lm_memory.rows_that_fit(cfg, h100_bf16, eager_attention=True, **forecast)
    assert 8 <= flex <= 32 and eager <= 2  # eager: 10.8 GB of scores a row at 4,600 tokens
    # what fits does fit, with the headroom kept, and one more row would not
    per_row = lm_memory.row_bytes(cfg, computed_tokens=4600, **forecast)
    assert flex * per_row <= 0.8 * h100_bf16 < (flex + 1) * per_row
    assert lm_memory.rows_that_fit(cfg, h200_mxfp4, **forecast) > 2 * flex
    shorter = lm_memory.rows_that_fit(cfg, h100_bf16, prompt_tokens=2500, new_tokens=4096)
    assert shorter > flex
    # GRPO: G rows generate from their prompt's cache (1 token each computed; a shared-prefix cache
    # keeps every token in every layer) to 8,192 new tokens. The old fixed 64 did not fit an 80 GB card.
    grpo = dict(prompt_tokens=4600, new_tokens=8192, computed_tokens=1, sliding_capped=False)
    assert 32 <= lm_memory.rows_that_fit(cfg, h100_bf16, **grpo) < 64
    assert lm_memory.rows_that_fit(cfg, h200_mxfp4, **grpo) >= 128
    assert lm_memory.rows_that_fit(cfg, 1 * GIB, **forecast) == 1  # never 0
    assert lm_memory.rows_that_fit(cfg, 10 ** 15, most=7, **forecast) == 7


def test_weights_as_they_load_mxfp4_only_where_transformers_runs_it(monkeypatch):
    """GPT-OSS-20B: 20.91 B parameters, 19.11 B of them in the experts' matrices: 13.8 GB with
    MXFP4 experts, 41.8 GB in bf16 (issue 22: the memory plan counted the checkpoint's 13.8 GB
    where the pinned stack loads bf16). MXFP4 is planned only for inference without an adapter
    and where lm.mxfp4_problem finds transformers' requirements met."""
    from models import lm
    cfg = gpt_oss_20b_config(quantization_config={"quant_method": "mxfp4"})
    total, experts = lm_memory.parameter_counts(cfg)
    assert round(total / 1e9, 2) == 20.91 and round(experts / 1e9, 2) == 19.11
    bf16 = lm_memory.weights_bytes(cfg, mxfp4=False)
    assert bf16 == 2 * total and round(bf16 / 1e9, 1) == 41.8
    assert round(lm_memory.weights_bytes(cfg, mxfp4=True) / 1e9, 1) == 13.8
    monkeypatch.setattr(lm, "mxfp4_problem", lambda: "the `kernels` package is not installed")
    assert lm.weights_on_load(cfg) == (bf16, "bf16")
    monkeypatch.setattr(lm, "mxfp4_problem", lambda: None)
    assert lm.weights_on_load(cfg)[1] == "mxfp4"
    assert lm.weights_on_load(cfg, dequantize=True) == lm.weights_on_load(cfg, training=True) == (bf16, "bf16")
    assert lm.weights_on_load(gpt_oss_20b_config()) == (bf16, "bf16")  # a checkpoint saved in bf16


def test_mxfp4_problem_names_what_transformers_needs(monkeypatch):
    """The installed transformers' own test: here (no GPU) the first thing missing is the GPU; with
    one, the `kernels` package in the version window transformers names; with it, the MXFP4 kernels
    it loads from the Hugging Face Hub, which offline must be in the cache (here they are not)."""
    import torch
    from transformers.utils import import_utils

    from models import lm
    assert lm.mxfp4_problem() == "no CUDA GPU" or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(import_utils, "is_triton_available", lambda *a: True)
    monkeypatch.setattr(import_utils, "is_kernels_available", lambda *a: False)
    why = lm.mxfp4_problem()
    assert "`kernels`" in why and import_utils.KERNELS_MIN_VERSION in why
    monkeypatch.setattr(import_utils, "is_kernels_available", lambda *a: True)
    why = lm.mxfp4_problem()
    assert why.startswith(f"transformers' MXFP4 kernels ({lm.MXFP4_KERNELS}) do not load: ") and "offline" in why
    monkeypatch.setattr(lm, "mxfp4_kernels_problem", lambda: None)
    assert lm.mxfp4_problem() is None


def test_training_bytes_of_a_grpo_row():
    """A 12,792-token GRPO row (4,600 prompt + 8,192 completion) of GPT-OSS-20B with gradient
    checkpointing: 24 layers' 2880-wide bf16 inputs (1.77 GB), one layer's activations and their
    gradients (2 x 0.36 MB a token, 9.3 GB), 1,024 positions of fp32 logits and their gradient."""
    cfg = gpt_oss_20b_config()
    one = lm_memory.training_bytes(cfg, tokens=12792)
    assert 10e9 < one < 14e9
    assert lm_memory.training_bytes(cfg, tokens=12792, rows=2) == 2 * one


@pytest.mark.gpu
def test_training_bytes_bounds_a_micro_batch_on_cuda():
    """What train_grpo.py's start-up check plans for a micro-batch (lm_memory.training_bytes)
    against what one takes on a GPU: 2 layers at GPT-OSS-20B's width and vocabulary, bf16, flex
    attention, LoRA on attention and experts with gradient checkpointing, one 4,096-token row (1,024
    prompt + 3,072 completion), forward and backward of the completion's log-probs."""
    import torch
    from transformers import GptOssForCausalLM

    from models import lm
    cfg = gpt_oss_20b_config(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    with torch.device("cuda"):
        model = lm.use_attention(GptOssForCausalLM(cfg).to(torch.bfloat16))
    model = lm.add_lora(model, rank=32, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj"]).train()
    g = torch.Generator().manual_seed(0)
    row = torch.randint(1000, 200000, (4096,), generator=g).tolist()
    batch = lm.collate([{"prompt": row[:1024], "completion": row[1024:]}], 0, "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    lm.completion_logprobs(model, batch).float().sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= lm_memory.training_bytes(cfg, tokens=4096, logit_positions=lm.LOGPROB_CHUNK), f"{peak / GIB:.1f} GiB"
