"""Tests of prefix_attention.py: attention of new tokens over a cached prefix, split in two parts."""
import pytest
import torch

from forecast_answer import ANSWER_PREFIX, DIGITS
from models.forecaster_backends import TransformersBackend


def test_split_attention_after_a_prefix_is_sdpa():
    """prefix_attention.py: the new tokens' attention over a cached prefix, run as two unmasked
    parts merged by their log-sum-exps, equals SDPA with the explicit mask (grouped-query heads,
    prefixes longer and shorter than the new part); a Llama (SDPA) backend forecasting one row at a
    time over a cached prefix gets the full prompts' probabilities."""
    import types

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from models import prefix_attention
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
    from tiny_models import tiny_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM
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


# ---- GPT-OSS: flex attention with sinks (on a CPU dynamo compiles it with the eager backend) ------

def test_flex_sinks_keeps_the_log_sum_exp_in_fp32():
    """Issue 22: transformers' flex path rounds the fp32 log-sum-exp L to bf16 before the sinks'
    renormalisation exp(L - logaddexp(L, s)). Where L is large (sharp attention: here L ~ 30) bf16's
    8-bit mantissa moves it by up to L x 2^-9 and every row's weight with it. flex_sinks_attention's
    output is the renormalisation of flex's output done exactly, to within bf16's rounding of the
    result; renormalised from a bf16 log-sum-exp, it is not."""
    import types

    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    from models import prefix_attention
    torch.manual_seed(0)
    B, H, KV, n, d = 1, 4, 2, 64, 16
    q, k, v = (torch.randn(B, h, n, d).to(torch.bfloat16) for h in (H, KV, KV))
    q, sinks = q * 16, torch.full((H,), 30.0)
    prefix_attention.use_flex_sinks()
    mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, B, None, n, n, device="cpu")
    got, _ = prefix_attention.flex_sinks_attention(types.SimpleNamespace(training=False), q, k, v, mask,
                                                   scaling=0.25, s_aux=sinks)
    assert got.dtype == torch.bfloat16
    flex = prefix_attention._compile(flex_attention, "cpu", fullgraph=True)
    out, aux = flex(q, k, v, block_mask=mask, scale=0.25, enable_gqa=True, return_aux=AuxRequest(lse=True))
    exact_lse, sink = aux.lse.double()[..., None], sinks.double().view(1, -1, 1, 1)
    assert exact_lse.median() > 20  # the sharp regime
    want = (out.double() * (exact_lse - torch.logaddexp(exact_lse, sink)).exp()).transpose(1, 2)
    lse = aux.lse.to(torch.bfloat16).double()[..., None]  # what transformers renormalises with
    rounded = (out.double() * (lse - torch.logaddexp(lse, sink)).exp()).transpose(1, 2)

    def error(x):
        return float(((x.double() - want).abs() / want.abs().clamp_min(1e-3)).max())
    assert error(got) <= 2 ** -8 < 4 * 2 ** -8 < error(rounded), (error(got), error(rounded))


@pytest.mark.e2e
def test_flex_sinks_matches_eager_and_decoding_does_not_recompile():
    """A tiny GPT-OSS (sliding and full layers, left padding) under FLEX_SINKS: its logits are
    eager attention's, and once two generations of different lengths have compiled what the mix
    of shapes needs, a third, whose offsets and lengths differ at every step, compiles nothing new:
    the limit is never reached, so flex never falls back to materialising the scores."""
    import tiny_models

    from models import prefix_attention
    torch.manual_seed(0)
    model = tiny_models.tiny_gpt_oss()
    ids = torch.randint(5, 500, (3, 48))
    mask = torch.ones_like(ids)
    mask[0, :10], mask[1, :3] = 0, 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        prefix_attention.use_flex_sinks()
        model.set_attn_implementation(prefix_attention.FLEX_SINKS)
        assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits[mask.bool()], want, atol=1e-4)
        counts = []
        for n in (40, 44, 47):
            model.generate(input_ids=ids[:, -n:], attention_mask=mask[:, -n:], max_new_tokens=4, do_sample=False,
                           pad_token_id=0, eos_token_id=None)
            counts.append(prefix_attention.flex_compiles())
    assert counts[0] <= counts[1] == counts[2] <= prefix_attention.FLEX_RECOMPILE_LIMIT, counts


def test_flex_sinks_fails_loudly_at_the_recompile_limit(monkeypatch):
    """Where dynamo would give up compiling flex attention (its silent fall-back materialises the
    scores), it raises instead."""
    import types

    from torch._dynamo.exc import FailOnRecompileLimitHit
    from torch.nn.attention.flex_attention import create_block_mask

    from models import prefix_attention
    prefix_attention.use_flex_sinks()
    assert torch._dynamo.config.recompile_limit >= prefix_attention.FLEX_RECOMPILE_LIMIT
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    module = types.SimpleNamespace(training=False)
    with pytest.raises(FailOnRecompileLimitHit):
        for d in (24, 40):  # head_dim is static in flex attention: each one is a new compile
            q = torch.randn(1, 2, 8, d)
            mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, 1, None, 8, 8, device="cpu")
            prefix_attention.flex_sinks_attention(module, q, q, q, mask, s_aux=torch.zeros(2))
