"""Tests of prefix_attention.py: attention of new tokens over a cached prefix, split in two parts."""
import pytest

from forecast_answer import ANSWER_PREFIX, DIGITS
from forecaster_backends import TransformersBackend


def test_split_attention_after_a_prefix_is_sdpa():
    """prefix_attention.py: the new tokens' attention over a cached prefix, run as two unmasked
    parts merged by their log-sum-exps, equals SDPA with the explicit mask (grouped-query heads,
    prefixes longer and shorter than the new part); a Llama (SDPA) backend forecasting one row at a
    time over a cached prefix gets the full prompts' probabilities."""
    import types
    import torch
    import prefix_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
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
    backend, full, reused = forecast_over_a_prefix(torch.float32)
    assert backend.model.config._attn_implementation == prefix_attention.PREFIX_SDPA
    for a, b in zip(full, reused):  # a random model's digits are unlikely: compare relatively
        assert a == pytest.approx(b, rel=1e-4, abs=1e-12)


def test_split_attention_in_bf16_keeps_the_models_dtype():
    """A bf16 model (the embedded one on a CPU with AMX): the split's merge runs in fp32 (the
    log-sum-exps are fp32) and hands the layer bf16 back; the forecasts over a cached prefix agree
    with the full prompts' to bf16's precision."""
    import torch
    _, full, reused = forecast_over_a_prefix(torch.bfloat16)
    for a, b in zip(full, reused):
        assert sum(a) > 0 and a == pytest.approx(b, rel=0.1, abs=0.01)


def forecast_over_a_prefix(dtype):
    """A tiny Llama (SDPA) backend in `dtype` forecasting two prompts one row at a time, whole and
    over their cached shared prefix: (backend, full probabilities, reused probabilities); the
    prefix is computed once."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from tiny_models import tiny_tokenizer
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                         eos_token_id=0, bos_token_id=None, initializer_range=0.5,  # answers that feel the attention
                                         attn_implementation="sdpa")).eval().to(dtype)
    backend = TransformersBackend(model=model, tokenizer=tiny_tokenizer(), name="tiny llama", batch_size=1)
    shared = [{"role": "system", "content": "| bin | name | speedup interval |\n" * 12}, {"role": "user", "content": "ref"}]
    prompts = [backend.answer_prompt(shared[:1] + [{"role": "user", "content": "ref" + tail}], "", ANSWER_PREFIX)
               for tail in (" fused", " a longer candidate kernel " * 8)]
    full = backend.next_token_probs(prompts, DIGITS)
    reused = backend.next_token_probs(prompts, DIGITS, shared=backend.answer_prompt(shared, None, ""))
    assert backend.prefix_stats["computed"] == 1
    return backend, full, reused
