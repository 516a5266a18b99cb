"""lm_memory.py: what a language model's batch takes of a GPU's memory, and how many rows fit.

A generation batch holds, beside the weights, per row: its KV cache (growing to prompt + new
tokens), the activations of its first forward (the prompt, or what follows a cached prefix), eager
attention's [heads, L, L] score tensors if the model runs eager attention, and its last logits.
lm.LM.rows_at_once sizes each batch from these and the GPU's free memory, instead of a fixed
batch size that fits one prompt length and one GPU and overflows the next. The arithmetic is from
the model's config; scripts/gpu_check.py puts it beside the peak memory measured on a real GPU, and
docs/GPU.md works it through for GPT-OSS-20B.

The start-up checks (search_setup.gpu_memory_problem, train_grpo.training_memory_problem) plan
the weights as they will load (weights_bytes: GPT-OSS's checkpoint keeps its experts in MXFP4 only
where transformers can run MXFP4, lm.mxfp4_problem; otherwise, and for training or an adapter, they
load as bf16, three times the size) and a training micro-batch's activations (training_bytes).

On a CPU the memory is the process's own, and glibc's allocator decides how much of it a run
holds: tensors_back_to_the_system.
"""
import ctypes
import ctypes.util

MXFP4_BITS = 4.25  # bits a weight: 4-bit values and one 8-bit scale per block of 32 (OCP microscaling)
MXFP4_PARAMETERS = ("experts.gate_up_proj", "experts.down_proj")  # what GPT-OSS's checkpoint holds in MXFP4


def parameter_counts(config):
    """(parameters, of which in MXFP4_PARAMETERS) of a model with this config, counted on the meta
    device: no memory, no weights."""
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = dict(model.named_parameters())  # tied weights once
    return (sum(p.numel() for p in params.values()),
            sum(p.numel() for n, p in params.items() if n.endswith(MXFP4_PARAMETERS)))


def weights_bytes(config, *, mxfp4, dtype_bytes=2):
    """Bytes of the weights in memory: the MXFP4_PARAMETERS at MXFP4_BITS when `mxfp4` (GPT-OSS's
    checkpoint loaded where transformers runs MXFP4), everything else at dtype_bytes (bf16)."""
    total, quantized = parameter_counts(config)
    if not mxfp4:
        return total * dtype_bytes
    return int((total - quantized) * dtype_bytes + quantized * MXFP4_BITS / 8)


def training_bytes(config, *, tokens, rows=1, logit_positions=1024, dtype_bytes=2):
    """Peak bytes a training micro-batch of `rows` sequences of `tokens` adds beside the weights,
    with gradient checkpointing (lm.add_lora turns it on on a GPU): every layer's input kept as its
    checkpoint, one layer's activations recomputed with their gradients (taken as twice a no-grad
    forward's, activation_bytes_per_token), and `logit_positions` positions of fp32 logits with
    their gradient (lm.completion_logprobs projects a chunk at a time). The adapter and its
    optimiser state are small beside these (a rank-32 LoRA on GPT-OSS-20B: tens of millions of
    parameters)."""
    checkpoints = config.num_hidden_layers * config.hidden_size * dtype_bytes
    per_token = checkpoints + 2 * activation_bytes_per_token(config, dtype_bytes)
    return rows * (tokens * per_token + 2 * min(tokens, logit_positions) * config.vocab_size * 4)


def kv_bytes(config, tokens, *, sliding_capped=True, dtype_bytes=2):
    """Bytes of one row's KV cache holding `tokens` tokens: keys and values of every layer,
    2 x kv_heads x head_dim values a token. A sliding-window layer (GPT-OSS: every other one, 128
    tokens) needs only its window, where its cache drops older tokens (transformers' cache built
    from the model's config does; a cache built from a shared prefix keeps every token:
    sliding_capped=False)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token_layer = 2 * config.num_key_value_heads * head_dim * dtype_bytes
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or tokens
    kept = [min(tokens, window) if t == "sliding_attention" and sliding_capped else tokens for t in types]
    return sum(kept) * per_token_layer


def activation_bytes_per_token(config, dtype_bytes=2):
    """A generous estimate of the memory one token of a no-grad forward holds at its peak inside a
    layer (earlier layers' activations are freed): the residual stream and its fp32 norm, the
    attention projections and their rotary copies, and the MoE experts' inputs, gate/up outputs and
    gating temporaries for each of the token's experts (a dense MLP counts as one expert)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    experts = getattr(config, "num_experts_per_tok", 1)
    return dtype_bytes * (8 * config.hidden_size + 4 * qkv + 6 * experts * 2 * config.intermediate_size)


def row_bytes(config, *, prompt_tokens, new_tokens, computed_tokens, eager_attention=False, sliding_capped=True,
              dtype_bytes=2):
    """Peak bytes one row of a generation batch adds: its KV cache at full length, the activations
    of the `computed_tokens` its first forward runs (the whole prompt, or what follows a cached
    prefix), eager attention's score tensors over the prompt (four copies: scores, masked, with the
    sinks' column, softmax) and its last-position logits (bf16 and fp32)."""
    scores = 4 * config.num_attention_heads * computed_tokens * prompt_tokens * dtype_bytes if eager_attention else 0
    return (kv_bytes(config, prompt_tokens + new_tokens, sliding_capped=sliding_capped, dtype_bytes=dtype_bytes)
            + computed_tokens * activation_bytes_per_token(config, dtype_bytes) + scores
            + config.vocab_size * (dtype_bytes + 4))


def rows_that_fit(config, free_bytes, *, prompt_tokens, new_tokens, computed_tokens=None, eager_attention=False,
                  sliding_capped=True, dtype_bytes=2, headroom=0.8, most=256):
    """How many rows to generate at once with `free_bytes` of GPU memory (row_bytes each; computed
    tokens default to the whole prompt). `headroom` keeps a fifth back for what the estimate
    misses (allocator fragmentation as caches grow, the sampler's temporaries). At least 1, at
    most `most`."""
    per_row = row_bytes(config, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                        computed_tokens=prompt_tokens if computed_tokens is None else computed_tokens,
                        eager_attention=eager_attention, sliding_capped=sliding_capped, dtype_bytes=dtype_bytes)
    return int(max(1, min(most, headroom * free_bytes // per_row)))


def free_gpu_bytes(device):
    """GPU memory this process can still use: what the driver reports free plus what PyTorch's
    allocator holds cached but unused (mem_get_info counts that as taken)."""
    import torch
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 1 << 20


def tensors_back_to_the_system():
    """Have glibc's malloc serve every allocation from 1 MB up by its own mapping, returned to the
    system when freed. By default glibc raises that threshold as large blocks are freed (to 32 MB)
    and then serves tensors of a few MB from its heaps, where freed memory stays resident: a GRPO
    training pass of the embedded model (train_grpo.py, the README's command: ~3,300-token prompts)
    interleaves kept activations with temporaries of 2 to 20 MB, and its resident memory, 2.8 GB of
    live tensors, came out anywhere between 3 and 5.5 GB from one run to the next. Mapped, it is
    the live figure every time; a fresh mapping costs its page faults (the training pass took a
    third longer). Returns whether the setting took (False without glibc: macOS, musl)."""
    libc = ctypes.util.find_library("c")
    try:
        return bool(ctypes.CDLL(libc).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) if libc else False
    except (OSError, AttributeError):
        return False
