"""prefix_attention.py: the attention of new tokens over a cached prompt prefix, without a mask.

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
"""
import torch

PREFIX_SDPA = "sdpa_after_prefix"


def prefix_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, cached_prefix=0,
                     **kwargs):
    """transformers' SDPA attention, split in two where a forward continues `cached_prefix` cached
    columns. The caller passes cached_prefix only for rows without padding; anything else (no
    prefix, a GPU, gradients: the kernel's log-sum-exp has none, sliding windows, sinks) is plain
    SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    width = key.shape[2] - query.shape[2]
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
