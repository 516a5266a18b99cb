"""prefix_attention.py: the attention functions of our own that lm.py gives transformers' models.

1. New tokens over a cached prompt prefix, without a mask (CPU, SDPA models).
lm.py runs a forecast prompt's shared prefix once and each candidate's tokens over its KV cache
(the paper's forecaster sees the same system text, bins, task, reference and hardware before every
candidate of a task). Those new tokens see every prefix key and themselves causally. transformers'
SDPA attention does that as one call with an explicit mask (queries and keys differ in number),
and on a CPU the masked kernel computes the whole rectangle of queries x keys, masked half
included, about twice as slow per pair as the causal kernel: over a cached 1,500-token prefix
that attention was more than half of a forecast's cost. Split in two, the prefix part needs no
mask and the new part is square, so the causal kernel skips what it masks; each part's
log-sum-exp merges the two exactly (as cascade attention does for shared prefixes on GPUs): the
same numbers, half the time.
use_prefix_attention(model) registers it with transformers' AttentionInterface (documented for
custom attention functions) and switches an SDPA model to it; a forward asks for the split by
passing cached_prefix=<cached columns>, which lm.LM.next_token_probs does for a single row (no
padding). Every other call is plain SDPA.

With gradients (GRPO's training pass, where a group's samples continue their shared prompt's
cache, train_grpo.share_prompts) the attention over the cache is recomputed in the backward pass
instead of kept: SDPA with a mask expands grouped-query keys and values to every query head and
keeps the copies for its backward (three times the cache for SmolLM2, 430 MB a sample over a
3,300-token prompt), where its few queries make recomputing it cheap.

2. GPT-OSS on a GPU: flex attention with the attention sinks (FLEX_SINKS, lm.attention_for).
PyTorch's flex attention computes the softmax in tiles and never holds the [heads, L, L] scores;
GPT-OSS's sinks (a learnt extra column in every softmax) are applied afterwards from the
log-sum-exp (LSE) flex returns. transformers' own flex path has two faults this one fixes:
- it casts the fp32 LSE to bf16 before that renormalisation (8 bits of mantissa: a relative error
  up to 2^-9 in every row's sink weight); here the LSE and the renormalisation stay in fp32;
- it compiles flex attention with dynamo's defaults. Each forward brings new mask closures (their
  code differs between sliding and full layers, with and without padding), decoding changes the
  shapes every step, and dynamo recompiles for each new combination. After `recompile_limit` (8)
  compiles it silently runs flex attention uncompiled, which materialises the whole score matrix:
  the memory plan (lm_memory.py) no longer holds and a batch sized by it runs out of memory.
  Here flex attention is compiled with fullgraph=True, the limit raised to FLEX_RECOMPILE_LIMIT
  (the compiles a search or a GRPO run needs, with room to spare) and dynamo told to fail on reaching it (fail_on_recompile_limit_hit), so a fall-back
  is an error, never a silent slowdown; flex_compiles() counts the compiles (scripts/gpu_check.py
  reports them).
"""

PREFIX_SDPA = "sdpa_after_prefix"


def prefix_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, cached_prefix=0,
                     **kwargs):
    """transformers' SDPA attention, split in two where a forward continues `cached_prefix` cached
    columns. The caller passes cached_prefix only for rows without padding; anything else (no
    prefix, a GPU, gradients: the kernel's log-sum-exp has none, sliding windows, sinks) is plain
    SDPA."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    width = key.shape[2] - query.shape[2]
    if torch.is_grad_enabled() and width > 0:  # a training forward over a cached prompt (the docstring)
        from torch.utils.checkpoint import checkpoint
        return checkpoint(sdpa_attention_forward, module, query, key, value, attention_mask, use_reentrant=False,
                          dropout=dropout, scaling=scaling, **kwargs)
    if (not cached_prefix or width != cached_prefix or query.shape[2] < 2 or query.device.type != "cpu"
            or dropout or torch.is_grad_enabled() or kwargs.get("sliding_window") or "s_aux" in kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: a key head per `groups` queries
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # the kernel SDPA calls, with its log-sum-exp
    old, old_lse = flash(query, key[:, :, :width], value[:, :, :width], 0.0, False, scale=scaling)[:2]
    new, new_lse = flash(query, key[:, :, width:], value[:, :, width:], 0.0, True, scale=scaling)[:2]
    lse = torch.logaddexp(old_lse, new_lse)
    out = old * (old_lse - lse).exp()[..., None] + new * (new_lse - lse).exp()[..., None]  # fp32: the lse's
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def use_prefix_attention(model):
    """An SDPA model's attention becomes prefix_attention (the same numbers, faster after a prefix)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    AttentionInterface.register(PREFIX_SDPA, prefix_attention)
    AttentionMaskInterface.register(PREFIX_SDPA, sdpa_mask)  # its masks are SDPA's
    model.set_attn_implementation(PREFIX_SDPA)


# ---- GPT-OSS on a GPU: flex attention with sinks ---------------------------------------------------

FLEX_SINKS = "flex_sinks"
# Compiles of flex attention (and as many of its block masks) one process may need: the mask's
# structure (sliding or full layer, padded rows or not) x prefill or decoding and one row or
# several (dynamo specialises a size of 1) x no-grad or training x first static, then dynamic
# shapes: up to 64. On a CPU, five generations of a tiny GPT-OSS varying all but gradients
# compiled 14 (with dynamo's default limit of 8 the sixth would have fallen back); twice the worst
# case leaves room, and gpu_check reports the real count.
FLEX_RECOMPILE_LIMIT = 128
_compiled = {}  # (function, backend) -> its torch.compile'd form
_compiles = [0]


def flex_compiles():
    """How many graphs flex attention and its block masks have compiled in this process so far."""
    return _compiles[0]


def _counting(backend):
    """A dynamo backend that counts the graphs it compiles and hands them to `backend`."""
    from torch._dynamo.backends.registry import lookup_backend
    inner = lookup_backend(backend)

    def compile_graph(gm, example_inputs):
        _compiles[0] += 1
        return inner(gm, example_inputs)
    return compile_graph


def _compile(fn, device, fullgraph):
    """fn compiled for `device`: by inductor on a GPU (fused kernels); on a CPU (the tests) by
    dynamo with the eager backend, which guards and recompiles exactly as on a GPU but runs the
    dense reference computation instead of generating kernels."""
    import torch
    backend = "inductor" if torch.device(device).type == "cuda" else "eager"
    if (fn, backend) not in _compiled:
        _compiled[fn, backend] = torch.compile(fn, backend=_counting(backend), fullgraph=fullgraph)
    return _compiled[fn, backend]


def flex_block_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                    attention_mask=None, device="cpu", **kwargs):
    """transformers' flex block mask (masking_utils.flex_attention_mask), built by our compiled
    create_block_mask so that its compiles are counted and limited like the attention's."""
    from torch.nn.attention.flex_attention import create_block_mask
    from transformers.masking_utils import (
        add_offsets_to_mask_function,
        and_masks,
        causal_mask_function,
        padding_mask_function,
        prepare_padding_mask,
    )
    mask_function = mask_function or causal_mask_function
    if attention_mask is not None and not bool(attention_mask.all()):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        mask_function = and_masks(mask_function, padding_mask_function(padding))
    mask_function = add_offsets_to_mask_function(mask_function, q_offset, kv_offset)
    return _compile(create_block_mask, device, fullgraph=False)(mask_function, batch_size, None, q_length,
                                                                 kv_length, device=device)


def flex_sinks_attention(module, query, key, value, attention_mask, scaling=None, s_aux=None, dropout=0.0,
                         **kwargs):
    """Flex attention under `attention_mask` (a BlockMask, flex_block_mask's), then GPT-OSS's sinks:
    with L the log-sum-exp of a row's scores and s its head's sink logit, the softmax over the
    scores and the sink column weighs the scores exp(L) / (exp(L) + exp(s)) = exp(L - logaddexp(L,
    s)) times what flex returned, in fp32."""
    import torch
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention
    if dropout:
        raise ValueError("flex attention has no dropout; set the model's attention_dropout to 0")
    heads, kv_heads = query.shape[1], key.shape[1]
    gqa = heads & (heads - 1) == 0  # flex's grouped-query path wants a power-of-two number of heads
    if not gqa:
        key, value = key.repeat_interleave(heads // kv_heads, 1), value.repeat_interleave(heads // kv_heads, 1)
    flex = _compile(flex_attention, query.device, fullgraph=True)
    out, aux = flex(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=gqa and heads != kv_heads,
                    return_aux=AuxRequest(lse=True))
    if s_aux is not None:
        lse = aux.lse.float()[..., None]  # [batch, heads, queries, 1], fp32 as flex returns it
        sink = s_aux.float().view(1, -1, 1, 1)
        out = out.float() * (lse - torch.logaddexp(lse, sink)).exp()
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def use_flex_sinks():
    """Register flex_sinks_attention and its masks under FLEX_SINKS (before a model is loaded or
    switched to it), and make dynamo fail loudly where it would fall back to uncompiled flex
    attention (the module docstring). Process-wide: dynamo's limits are global."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(FLEX_SINKS, flex_sinks_attention)
    AttentionMaskInterface.register(FLEX_SINKS, flex_block_mask)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, FLEX_RECOMPILE_LIMIT)
    # and the limit over all code objects, flex attention's and its block masks' with the rest
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           4 * FLEX_RECOMPILE_LIMIT)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
