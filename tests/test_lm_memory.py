"""Tests of lm_memory.py: how many rows a GPU holds, with GPT-OSS-20B's real config."""
import lm_memory

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
