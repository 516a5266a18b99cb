"""prefix_cache.py: compute a shared prompt prefix once, reuse its keys and values for every row.

The paper's gate only pays if a forecast costs far less than the measurement it replaces. Every
forecast prompt of a task repeats the same ~3,000 tokens (system text, bin table, task, reference
kernel, hardware) before the candidate, and GRPO samples G completions of one and the same prompt.
A transformer's keys and values at a position depend only on the tokens up to it, so the shared
part can be run once and its per-layer keys/values (the "KV cache") handed to every row: the
model then runs only over what differs. forecaster_backends.py uses it for forecasts (the
logits read-out and generation), grpo_policy.py for GRPO's G samples and their log-prob passes.

The one subtle part is padding. Rows of a batch are left-padded so that they all end in the same
column (generation appends there). Row i of width T with pad p_i holds its prefix's token j in
column p_i + j, so its cached columns are the prefix shifted right by p_i, zeros under the padding
(masked out). The first `width` = min_i(p_i + len(prefix_i)) columns come from the cache and the
rest is computed; a row with more padding recomputes a few prefix tokens in the columns where the
others have their suffix, which costs what padding costs anyway. Keeping all padding on the left
is what makes this exact for sliding-window layers too (GPT-OSS): a hole between prefix and
suffix would sit inside the window and hide prefix tokens from it. For the same reason the prefix
is computed into a cache without the model's config: every layer then keeps every prefix token
(a sliding-window layer would keep only its last window, and a shifted copy needs them all).
"""
import inspect

import torch


def common_prefix_len(a, b):
    """Number of leading tokens two id lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cache_keyword(model):
    """The keyword under which this model's forward takes a cache: transformers renamed
    `past_key_values` to `cache` in 5.2x and keeps the old name only as a deprecated alias."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def prefix_kv(model, ids):
    """[(keys, values)] per layer, each [1, heads, len(ids), head_dim], after one forward over `ids`.

    Gradients flow through them when grad is enabled (GRPO's training pass)."""
    from transformers import DynamicCache
    cache = DynamicCache()  # no config: full layers only, so every prefix token is kept
    x = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
    model(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache})
    return [(layer.keys, layer.values) for layer in cache.layers]


def shifted_cache(prefixes, pads, width):
    """A cache holding the first `width` columns of a left-padded batch: row i's prefix keys and
    values (prefixes[i], from prefix_kv) shifted right by pads[i], zeros where the row is padding.
    Needs width <= pads[i] + prefix length for every row (columns past a prefix are not known)."""
    from transformers import DynamicCache
    layers = []
    for layer in range(len(prefixes[0])):
        kv = []
        for which in (0, 1):  # keys, values
            ref = prefixes[0][layer][which]
            out = ref.new_zeros((len(prefixes), ref.shape[1], width, ref.shape[3]))
            for i, (prefix, pad) in enumerate(zip(prefixes, pads)):
                n = width - pad
                if n > 0:
                    if n > prefix[layer][which].shape[2]:
                        raise ValueError(f"row {i}: cached width {width} reaches past its prefix")
                    out[i, :, pad:] = prefix[layer][which][0, :, :n]
            kv.append(out)
        layers.append(tuple(kv))
    return DynamicCache(layers)


def cache_columns(rows, prefix_lens):
    """(width, pads): how many leading columns of the left-padded `rows` their prefixes cover
    (row i starts with a cached prefix of prefix_lens[i] tokens), and each row's left padding.
    Every row keeps at least its last token to compute: its logits are needed."""
    T = max(len(r) for r in rows)
    pads = [T - len(r) for r in rows]
    width = min(min(p + n for p, n in zip(pads, prefix_lens)), T - 1)
    return max(width, 0), pads
