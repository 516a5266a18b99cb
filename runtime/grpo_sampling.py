"""grpo_sampling.py: where GRPO's samples come from (train_grpo.py, phase 1).

Each step needs G completions of every prompt from the policy being trained:
- locally (the default): lm.LM.generate on the policy itself, the G rows of a prompt generating
  from one forward of it (its KV cache), batches sized from the GPU's free memory, with the
  adapter's expert matrices merged into the weights for the duration (lm.AdapterSwitch, as the
  forecaster does): peft applies an unmerged expert LoRA by rebuilding each layer's whole expert
  stack W + A B at every forward, decoding steps included (about 77 GB of memory traffic a step
  for GPT-OSS-20B). They are unmerged, the base restored bit for bit, before the log-probs and
  the update, which need peft's unmerged path (its gradients reach A and B). The merged weights
  round W + A B once where peft adds the two products: the samples' distribution differs from the
  policy's by that rounding, well inside what the ratio's clip tolerates;
- on a server (--server, vLLM serving the base model): the completions endpoint continues the
  policy's own prompt token ids and returns the sampled token ids, so that train_grpo.py scores
  exactly those tokens under the local policy. The server's weights are not the policy's: unless
  its adapter is reloaded (sync_server_adapter, every --server-sync-every steps) it samples from the
  base model, and the samples are off-policy by as many steps as the adapter has moved since
  (docs/GPU.md).

The server's samples are therefore drawn from another distribution than the policy's, which the
loss corrects with truncated importance sampling (as verl and OpenRLHF do for vLLM rollouts): the
server also returns its log-prob of each sampled token, and each token's policy-gradient term is
weighted by w_t = min(exp(logp_old_t - logp_server_t), C) (importance_weights), a constant of the
step. The cap C bounds the variance a token the server found unlikely would bring. Both
log-probs must be of the distribution sampled from: the policy's are tempered and restricted to
the allowed tokens (lm.completion_logprobs), vLLM's by default raw (the same only at temperature 1
without allowed tokens): serve with --logprobs-mode processed_logprobs (docs/GPU.md).
"""
import contextlib
import math
import time



def sample_groups(policy, prompts, G, *, temperature, max_new_tokens, batch_size, allowed=None,
                  share_prompt=True, server=None, served_model=None, sampler_logprobs=False, switch=None):
    """G completions of each prompt (token ids) from the policy (an lm.LM), prompt-major:
    [{prompt, completion, text, seconds, sampler_logp}]. share_prompt: a prompt's forward runs once
    and its G rows generate from its KV cache. switch: the policy's lm.AdapterSwitch, under which
    local generation runs with the adapter's experts merged. server (forecaster_backends.OpenAIServerBackend):
    the G completions are sampled there instead, by `served_model` (the adapter last loaded into it,
    or the base model). sampler_logp: with server and sampler_logprobs, the server's log-prob of
    each completion token (None for a token it gave none for); else None."""
    import torch
    flat = [p for p in prompts for _ in range(G)]
    if server is not None:
        t0 = time.perf_counter()
        groups = server.sample_ids(prompts, n=G, max_new_tokens=max_new_tokens, temperature=temperature,
                                   stop_ids=policy.stop_ids, model=served_model, seed=int(torch.randint(2 ** 31, ())),
                                   allowed_ids=None if allowed is None else allowed.nonzero().flatten().tolist(),
                                   logprobs=sampler_logprobs)
        seconds = (time.perf_counter() - t0) / max(1, len(flat))
        got = [s if sampler_logprobs else (s, None) for group in groups for s in group]  # (ids, log-probs)
        done = [(ids, seconds, lp) for ids, lp in got]
    else:
        was_training = policy.model.training
        policy.model.eval()
        with switch.experts_merged() if switch is not None else contextlib.nullcontext():
            done = policy.generate(flat, max_new_tokens=max_new_tokens, temperature=temperature, batch_size=batch_size,
                                   prefixes=[p[:-1] for p in flat] if share_prompt else None, allowed=allowed)
        done = [(ids, s, None) for ids, s in done]
        policy.model.train(was_training)
    return [{"prompt": p, "completion": c, "text": policy.decode(c), "seconds": s, "sampler_logp": lp}
            for p, (c, s, lp) in zip(flat, done)]


def importance_weights(old_logp, sampler_logp, mask, cap):
    """Truncated importance weights [B, T] of samples drawn on a server: min(exp(old_logp -
    sampler_logp), cap), without gradient; 1 where mask is 0 or the server's log-prob is unknown
    (NaN: a stop token appended locally). old_logp: the policy's log-probs at sampling time."""
    import torch
    log_ratio = old_logp.detach().float() - sampler_logp
    known = (mask > 0) & ~torch.isnan(log_ratio)
    return torch.where(known, log_ratio.clamp(max=math.log(cap)).exp(), 1.0)


def sampler_logprobs_batch(samples, width, device):
    """The samples' `sampler_logp` as [B, width], lm.collate's completion columns; NaN where unknown."""
    import torch
    out = torch.full((len(samples), width), float("nan"))
    for i, s in enumerate(samples):
        out[i, :len(s["completion"])] = torch.tensor([math.nan if x is None else x for x in s["sampler_logp"]])
    return out.to(device)


def sync_server_adapter(acc, server, model, out, step):
    """Save the adapter as it is now and have --server load it (under a new name, so no request
    can meet a half-loaded one); returns the name the step's requests ask for."""
    name, folder = f"grpo-step-{step:06d}", (out / "served" / f"step-{step:06d}").resolve()
    if acc.is_main_process:
        acc.unwrap_model(model).save_pretrained(folder, save_embedding_layers=False)
        server.load_adapter(name, folder)
    acc.wait_for_everyone()
    return name
