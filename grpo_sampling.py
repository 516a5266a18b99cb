"""grpo_sampling.py: where GRPO's samples come from (train_grpo.py, phase 1).

Each step needs G completions of every prompt from the policy being trained:
- locally (the default): lm.LM.generate on the policy itself, the G rows of a prompt generating
  from one forward of it (its KV cache), batches sized from the GPU's free memory;
- on a server (--server, vLLM serving the base model): the completions endpoint continues the
  policy's own prompt token ids and returns the sampled token ids, so that train_grpo.py scores
  exactly those tokens under the local policy. The server's weights are not the policy's: unless
  its adapter is reloaded (sync_server_adapter, every --server-sync-every steps) it samples from the
  base model, and the samples are off-policy by as many steps as the adapter has moved since
  (docs/GPU.md).
"""
import time

import torch


def sample_groups(policy, prompts, G, *, temperature, max_new_tokens, batch_size, allowed=None,
                  share_prompt=True, server=None, served_model=None):
    """G completions of each prompt (token ids) from the policy (an lm.LM), prompt-major:
    [{prompt, completion, text, seconds}]. share_prompt: a prompt's forward runs once and its G
    rows generate from its KV cache. server (forecaster_backends.OpenAIServerBackend): the G
    completions are sampled there instead, by `served_model` (the adapter last loaded into it, or
    the base model)."""
    flat = [p for p in prompts for _ in range(G)]
    if server is not None:
        t0 = time.perf_counter()
        groups = server.sample_ids(prompts, n=G, max_new_tokens=max_new_tokens, temperature=temperature,
                                   stop_ids=policy.stop_ids, model=served_model, seed=int(torch.randint(2 ** 31, ())),
                                   allowed_ids=None if allowed is None else allowed.nonzero().flatten().tolist())
        seconds = (time.perf_counter() - t0) / max(1, len(flat))
        done = [(ids, seconds) for group in groups for ids in group]
    else:
        was_training = policy.model.training
        policy.model.eval()
        done = policy.generate(flat, max_new_tokens=max_new_tokens, temperature=temperature, batch_size=batch_size,
                               prefixes=[p[:-1] for p in flat] if share_prompt else None, allowed=allowed)
        policy.model.train(was_training)
    return [{"prompt": p, "completion": c, "text": policy.decode(c), "seconds": s} for p, (c, s) in zip(flat, done)]


def sync_server_adapter(acc, server, model, out, step):
    """Save the adapter as it is now and have --server load it (under a new name, so no request
    can meet a half-loaded one); returns the name the step's requests ask for."""
    name, folder = f"grpo-step-{step:06d}", (out / "served" / f"step-{step:06d}").resolve()
    if acc.is_main_process:
        acc.unwrap_model(model).save_pretrained(folder, save_embedding_layers=False)
        server.load_adapter(name, folder)
    acc.wait_for_everyone()
    return name
