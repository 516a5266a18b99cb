"""train_grpo.py: GRPO with proper-scoring-rule rewards trains the forecaster (docs/PAPER.md §6).

The paper turns every measured kernel into a labelled training row (anchor code, candidate code,
measured speedup) and trains GPT-OSS-20B + LoRA with GRPO so that its 8 bin probabilities become
accurate *and calibrated*. The original ran GRPO on a hosted service; this file is the same
algorithm on transformers + peft + accelerate, readable top to bottom (the mechanics of the model
under training, loading, LoRA, sampling and log-probabilities, are lm.py's, shared with the
forecaster):

    rows ─▶ prompt (forecast_prompt.build_messages) ─▶ G samples per prompt (temperature 1.0)
         ─▶ parse (forecast_answer.parse_answer) ─▶ reward ─▶ advantage ─▶ clipped policy gradient
         ─▶ LoRA adapter ─▶ forecaster.py's TransformersBackend / vLLM LoRA

Reward (a parse failure scores 0 in every variant), y = the true bin of the measured speedup:
    correctness = 1[predicted bin == y]            (predicted bin = argmax of the probabilities)
    brier       = correctness + (1 - Brier(p, y))  (half-Brier, bins.brier)
    crps        = correctness + (1 - CRPS(p, y))   (ranked probability score / 7, bins.crps)
Advantage: A = reward - mean of its group (the G samples of one prompt); --scale-std also divides
by the group's sample std. Groups whose rewards are all equal carry no signal and are dropped.

Loss, per completion token t of sample i, with ratio r = exp(logp - logp_old):
    l_t = -min(r * A_i, clip(r, 1 - eps, 1 + eps) * A_i) + beta * k3_t,
    k3_t = exp(logp_ref - logp) - (logp_ref - logp) - 1     (only when --kl-coef beta > 0)
    loss = sum of l_t over every completion token of the kept samples of the step / their count.
This is DAPO's token-level normalisation: each token weighs the same, so a long completion is not
averaged down to the weight of a short one (GRPO's original per-sample mean did that). The count is
global (all micro-batches, all processes), so micro-batching and multi-GPU give the same gradient
as one big batch. logp_old is recorded by a no-grad forward right after sampling, before any
update, so --ppo-epochs > 1 (several optimiser steps on the same samples) is sound; with one epoch
r == 1 and the clip never acts. The reference policy for the KL term is the base model, i.e. the
policy with its adapter disabled.

Two answer formats:
  json   (default, the paper's): the model writes the forecaster's JSON answer freely, parsed by
         forecast_answer.parse_answer. This is the production path.
  votes  the prompt ends with an answer prefix and the completion is K tokens constrained to the
         bin digits 1..8; the forecast is the vote histogram (probabilities in steps of 1/K). A tiny
         or untrained model always answers parseably, so it learns from step one; the learning
         test uses it. Sampling and the loss use the same constrained (renormalised) policy.

Defaults are the paper's: LoRA rank 32, lr 4e-5 (AdamW), G = 8, 8 prompts per step, 20 steps,
temperature 1.0, 8192 new tokens, no KL, eps 0.2. Unlike the original, rows are shuffled (seeded).
The final adapter is OUT/adapter/; checkpoints (OUT/checkpoint-NNNNNN/) hold it in peft format
(forecaster.py's TransformersBackend(adapter=...) loads it; for vLLM's --lora-modules, whose LoRA
support may not cover GPT-OSS's MoE experts, train with --no-expert-lora), the optimiser state and
the step.
Instead of saving each process's RNG state, every step reseeds python, numpy and torch from
(seed, step, process), and the rows of a step are a function of (seed, step): so the step *is* the
RNG state and the data position, and --resume reproduces an uninterrupted run bit for bit on CPU.
Multi-GPU (accelerate launch) splits each step's prompts across processes; only the main process
writes files and runs the final evaluation. Tested here on CPU in one process only.

GPU (GPT-OSS-20B in bf16, LoRA on attention and MoE experts, gradient checkpointing):
    accelerate launch --num_processes 1 train_grpo.py --model openai/gpt-oss-20b \\
        --data training_rows.jsonl --reward brier --holdout-task gdn_chunk_fwd_o --out runs/brier
  (more GPUs: --num_processes N; the 8 prompts of a step are split across processes; the same
  command works as plain `python train_grpo.py ...` on one GPU.)
CPU (tiny scale): python train_grpo.py --data rows.jsonl --reward brier --out runs/x --embedded \\
        --answer-format votes --steps 4 --prompts-per-step 2 --group-size 4 --eval-fraction 0.2
"""
import argparse
import contextlib
import json
import random
import resource
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import lm
import bins
import metrics
from dataset import load_predictions
from forecast_answer import DIGITS, Forecast, failure, parse_answer
from forecast_prompt import FORECAST_TOOL, build_messages, hardware_info
from lm import LM, backward_prompt, checkpointing, collate, completion_logprobs, detached, prompt_kv

REWARDS = ("correctness", "brier", "crps")


# ---- data: training rows (ours or the paper's RL pool), shuffled, split ------------------------

def split_rows(rows, seed, holdout_task=None, eval_fraction=0.0):
    """(train, eval): shuffled with the seed; eval = one held-out task or a fraction of the rows."""
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    if holdout_task:
        held = [r for r in rows if r["pack"] == holdout_task]
        if not held:
            raise ValueError(f"--holdout-task {holdout_task}: no row has that pack; tasks in the "
                             f"data: {', '.join(sorted({r['pack'] for r in rows}))}")
        return [r for r in rows if r["pack"] != holdout_task], held
    n_eval = round(len(rows) * eval_fraction) if eval_fraction > 0 else 0
    if eval_fraction > 0:
        n_eval = min(max(n_eval, 1), len(rows) - 1)
    return rows[n_eval:], rows[:n_eval]


def rows_for_step(train_rows, step, per_step, seed):
    """The prompts of one step: positions step*per_step... of an endless stream of epochs, each a
    fresh seeded shuffle. The data position is a function of the step, so a resumed run sees the
    same rows."""
    n, out = len(train_rows), []
    for i in range(step * per_step, (step + 1) * per_step):
        order = np.random.default_rng([seed, i // n]).permutation(n)
        out.append(train_rows[order[i % n]])
    return out


VOTES_PREFIX = "Bin votes: "
VOTES_INSTRUCTION = ("\n\nAnswer format for this run: after \"" + VOTES_PREFIX.strip() + "\" write "
                     "exactly {k} bin numbers (1-8) and nothing else. Each is a vote; the share of "
                     "votes on a bin is your probability that the speedup falls in it.")


# ---- the prompt and the two answer formats --------------------------------------------------------

def make_prompt_fn(policy, args):
    """row -> prompt token ids: build_messages rendered exactly as forecaster.py's
    TransformersBackend renders it (harmony for GPT-OSS, the chat template otherwise)."""
    hardware = hardware_info(args.hardware)

    def prompt(row):
        messages = build_messages(row["pack"], row["anchor_code"], row["candidate_code"],
                                             hardware)
        if args.answer_format == "votes":
            messages[-1] = dict(messages[-1], content=messages[-1]["content"]
                                + VOTES_INSTRUCTION.format(k=args.votes))
            return policy.answer_prompt(messages, None, VOTES_PREFIX)
        return policy.render(messages, tools=[FORECAST_TOOL])
    return prompt


def parse_votes(text, k):
    """The votes answer: k digits 1..8 -> a Forecast whose probabilities are the vote shares."""
    votes = [int(c) for c in text if c in DIGITS]
    if len(votes) != k:
        return failure(f"expected {k} bin votes, got {text!r}", readout="votes")
    probs = (np.bincount(votes, minlength=bins.N_BINS + 1)[1:] / k).tolist()
    return Forecast(probs=probs, predicted_bin=bins.predicted_bin(probs), raw_sum=1.0,
                               readout="votes")


# ---- rewards, advantages, loss -------------------------------------------------------------------

def reward(forecast, true_bin, kind):
    """The paper's rewards; a parse failure scores 0 in every variant."""
    if forecast.parse_failed or forecast.probs is None:
        return 0.0
    correct = float(bins.predicted_bin(forecast.probs) == true_bin)
    if kind == "correctness":
        return correct
    if kind == "brier":
        return correct + 1.0 - bins.brier(forecast.probs, true_bin)
    if kind == "crps":
        return correct + 1.0 - bins.crps(forecast.probs, true_bin)
    raise ValueError(f"unknown reward {kind!r}; choose one of: {', '.join(REWARDS)}")


def group_advantages(rewards, scale_std=False):
    """rewards [n_groups, G] -> (advantages [n_groups, G], keep [n_groups] bool).

    A = r - group mean (divided by the group's sample std with scale_std). A group whose rewards
    are all equal has A = 0 everywhere and is marked dropped.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    keep = r.max(dim=1).values > r.min(dim=1).values
    adv = r - r.mean(dim=1, keepdim=True)
    if scale_std:
        adv = torch.where(keep[:, None], adv / r.std(dim=1, keepdim=True).clamp_min(1e-12), 0.0)
    adv[~keep] = 0.0
    return adv, keep


def grpo_loss(logp, old_logp, advantages, mask, n_tokens, clip_eps=0.2, ref_logp=None,
              kl_coef=0.0):
    """Clipped token-level policy-gradient loss (see the module docstring).

    logp, old_logp, ref_logp, mask: [B, T] (mask 1 on completion tokens); advantages: [B].
    n_tokens: the completion-token count of the whole step (all micro-batches and processes).
    Returns (loss, stats) where loss = sum over this micro-batch's tokens / n_tokens.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype)[:, None]
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    stats = {"clipped": float(((ratio - 1).abs() > clip_eps).to(logp.dtype).mul(mask).sum())}
    if kl_coef > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        per_token = per_token + kl_coef * kl
        stats["kl"] = float((kl.detach() * mask).sum())
    return (per_token * mask).sum() / n_tokens, stats


# ---- checkpoints ---------------------------------------------------------------------------------

def seed_everything(seed, step, rank):
    """Every step's randomness is a function of (seed, step, process): resuming needs only the step."""
    s = int(np.random.SeedSequence([seed, step + 1, rank]).generate_state(1)[0])
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)  # also seeds every CUDA device


def save_checkpoint(accelerator, model, optimizer, step, out, args):
    """OUT/checkpoint-NNNNNN/: the adapter (peft format), optimiser state and the step. Written to
    a temporary folder and renamed, so a crash never leaves half a checkpoint."""
    if accelerator.is_main_process:
        final, tmp = out / f"checkpoint-{step:06d}", out / f".tmp-checkpoint-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        # embeddings are never trained; saying so also spares peft a Hub lookup of the base model
        accelerator.unwrap_model(model).save_pretrained(tmp, save_embedding_layers=False)
        torch.save({"optimizer": optimizer.state_dict(), "step": step, "args": vars(args)},
                   tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    accelerator.wait_for_everyone()


def load_checkpoint(model, optimizer, out, args):
    """Restore the latest checkpoint in OUT into model and optimiser; returns its step."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    found = sorted(out.glob("checkpoint-*"))
    if not found:
        raise ValueError(f"--resume: no checkpoint in {out}; drop --resume to start a new run")
    state = torch.load(found[-1] / "trainer_state.pt", map_location="cpu")
    for key in ("seed", "reward", "group_size", "prompts_per_step", "answer_format", "lora_rank"):
        if state["args"].get(key) != getattr(args, key):
            warnings.warn(f"--resume: {key} was {state['args'].get(key)!r}, now {getattr(args, key)!r}")
    set_peft_model_state_dict(model, load_file(found[-1] / "adapter_model.safetensors"))
    optimizer.load_state_dict(state["optimizer"])
    log = out / "log.jsonl"
    if log.exists():  # drop records of steps after the checkpoint: they will be redone
        keep = [r for _, r in read_jsonl(log, cut_torn_tail=True) if r["step"] <= state["step"]]
        write_atomic(log, "".join(json.dumps(r) + "\n" for r in keep))
    return state["step"]


# ---- evaluation ----------------------------------------------------------------------------------

def evaluate(policy, rows, prompt_fn, parse, args, out, max_new, allowed=None):
    """Forecast the held-out rows, write OUT/predictions.jsonl (ARCHITECTURE.md's prediction rows,
    readable by `python metrics.py`) and OUT/eval_summary.json (metrics.report)."""
    n = args.eval_samples if args.eval_temperature > 0 else 1
    samples = []
    for i in range(0, len(rows), args.gen_batch_size):
        chunk = rows[i:i + args.gen_batch_size]
        samples += sample_groups(policy, [prompt_fn(r) for r in chunk], n,
                                 temperature=args.eval_temperature, max_new_tokens=max_new,
                                 batch_size=args.gen_batch_size, allowed=allowed)
    name = lm.EMBEDDED_NAME if args.embedded else args.model
    preds = []
    for j, s in enumerate(samples):
        row, f = rows[j // n], parse(s["text"])
        preds.append(prediction_row(
            row, f, j % n, model=f"{name}+grpo-{args.reward}",
            readout="votes" if args.answer_format == "votes" else "verbalized",
            tokens_in=len(s["prompt"]), tokens_out=len(s["completion"]), seconds=round(s["seconds"], 4)))
    path = out / "predictions.jsonl"
    write_atomic(path, "".join(json.dumps(p) + "\n" for p in preds))
    summary = metrics.report(load_predictions(path))
    (out / "eval_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# ---- the GRPO loop -------------------------------------------------------------------------------

def score_samples(forecasts, true_bin, kind):
    """Rewards and the step's logging scores of one group (a parse failure scores as uniform p)."""
    rewards = [reward(f, true_bin, kind) for f in forecasts]
    parsed = [f for f in forecasts if not f.parse_failed]
    probs = [bins.UNIFORM if f.parse_failed else f.probs for f in forecasts]
    return rewards, {
        "n": len(forecasts), "reward": sum(rewards), "parsed": len(parsed),
        "correct": sum(bins.predicted_bin(f.probs) == true_bin for f in parsed),
        "brier": sum(bins.brier(p, true_bin) for p in probs),
        "crps": sum(bins.crps(p, true_bin) for p in probs)}


def sample_groups(policy, prompts, G, *, temperature, max_new_tokens, batch_size, allowed=None,
                  share_prompt=True):
    """G completions of each prompt (token ids) from the policy (an lm.LM), prompt-major:
    [{prompt, completion, text, seconds}]. share_prompt: a prompt's forward runs once and its G
    rows generate from its KV cache."""
    flat = [p for p in prompts for _ in range(G)]
    was_training = policy.model.training
    policy.model.eval()
    done = policy.generate(flat, max_new_tokens=max_new_tokens, temperature=temperature, batch_size=batch_size,
                           prefixes=[p[:-1] for p in flat] if share_prompt else None, allowed=allowed)
    policy.model.train(was_training)
    return [{"prompt": p, "completion": c, "text": policy.decode(c), "seconds": s} for p, (c, s) in zip(flat, done)]


def peak_memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def train(args, prompt_fn=None, parse=None, model=None, tokenizer=None):
    """Run GRPO as configured by `args` (see build_parser); returns {"log": [...], "eval": {...}}.

    prompt_fn (row -> prompt token ids) and parse (text -> Forecast) default to the forecaster's
    prompt and parser; tests inject a synthetic pair. model/tokenizer: a base model in memory
    instead of --model (an adapter is added to it)."""
    from accelerate import Accelerator
    from tqdm import tqdm
    acc = Accelerator()
    device, out = acc.device, Path(args.out)
    train_rows, eval_rows = split_rows(load_rows(args.data), args.seed, args.holdout_task,
                                       args.eval_fraction)
    if not train_rows:
        raise ValueError(f"{args.data}: no training rows left after holding out --holdout-task "
                         f"{args.holdout_task}; hold out another task")
    if args.prompts_per_step < acc.num_processes:
        raise ValueError(f"--prompts-per-step {args.prompts_per_step} < {acc.num_processes} "
                         f"processes; give every process at least one prompt")
    if (out / "log.jsonl").exists() and not args.resume:
        raise ValueError(f"{out} already holds a run; pass --resume or choose another --out")
    if model is None:
        model, tokenizer = lm.load_embedded() if args.embedded else lm.load_model(args.model, device=device, training=True)
    seed_everything(args.seed, -1, 0)  # the same fresh adapter on every process
    model = lm.add_lora(model, rank=args.lora_rank, alpha=args.lora_alpha, targets=args.lora_targets.split(","),
                        expert_lora=not args.no_expert_lora, device=device,
                        gradient_checkpointing=not args.no_gradient_checkpointing)
    policy = LM(model, tokenizer, reasoning_effort=args.reasoning_effort)
    model.train()
    prompt_fn = prompt_fn or make_prompt_fn(policy, args)
    parse = parse or ((lambda text: parse_votes(text, args.votes)) if args.answer_format == "votes"
                      else parse_answer)
    allowed, max_new = None, args.max_new_tokens
    if args.answer_format == "votes":  # the completion is exactly K bin digits
        allowed = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=device)
        allowed[policy.candidate_ids(DIGITS)] = True  # ValueError unless each is one token
        max_new = args.votes
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    start = load_checkpoint(model, optimizer, out, args) if args.resume else 0
    acc.wait_for_everyone()
    out.mkdir(parents=True, exist_ok=True)
    wrapped, optimizer = acc.prepare(model, optimizer)
    G, mb, records = args.group_size, args.micro_batch_size, []
    bar = tqdm(range(start, args.steps), initial=start, total=args.steps, desc="GRPO",
               disable=not acc.is_main_process)
    for step in bar:
        t0 = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seed_everything(args.seed, step, acc.process_index)
        rows = rows_for_step(train_rows, step, args.prompts_per_step, args.seed)
        rows = rows[acc.process_index::acc.num_processes]
        # 1. sample G completions per prompt with the current policy; parse; reward
        samples = sample_groups(policy, [prompt_fn(r) for r in rows], G, temperature=args.temperature,
                         max_new_tokens=max_new, batch_size=args.gen_batch_size, allowed=allowed,
                         share_prompt=not args.no_prefix_cache)
        rewards, totals = [], {}
        for i, row in enumerate(rows):
            r, stats = score_samples([parse(s["text"]) for s in samples[i * G:(i + 1) * G]],
                                     row["true_bin"], args.reward)
            rewards.append(r)
            totals = {k: totals.get(k, 0) + v for k, v in stats.items()}
        # 2. advantages; groups with equal rewards carry no signal and are dropped
        adv, keep = group_advantages(rewards, args.scale_std)
        kept = [dict(s, adv=float(adv[i // G, i % G])) for i, s in enumerate(samples) if keep[i // G]]
        # micro-batches never mix prompts: with `share`, each prompt's forward runs once per pass
        # and serves all of its group's micro-batches (lm.prompt_kv)
        share = not args.no_prefix_cache and not checkpointing(model)
        batches = [kept[g + j:g + min(j + mb, G)] for g in range(0, len(kept), G) for j in range(0, G, mb)]
        local = torch.tensor([sum(len(s["completion"]) for s in kept), len(batches)],
                             device=device)
        n_tokens = int(acc.reduce(local[:1].clone(), "sum"))
        n_micro = int(acc.gather(local[1:]).max())
        # DDP needs the same number of backward passes on every process: pad with zero-weight ones
        batches += [[dict(samples[0], adv=0.0, filler=True)]] * (n_micro - len(batches))
        # 3. old (and reference) log-probs of the sampled tokens, before any update
        prepared, kv_of = [], {}
        with torch.no_grad():
            for b in batches:
                t = collate(b, policy.pad_id, device)
                if b[0].get("filler"):
                    t = t[:3] + (torch.zeros_like(t[3]), t[4])
                key = tuple(b[0]["prompt"])
                if share and key not in kv_of:
                    kv_of[key] = (prompt_kv(model, b[0]["prompt"]), None)
                    if args.kl_coef > 0:
                        with model.disable_adapter():
                            kv_of[key] = (kv_of[key][0], prompt_kv(model, b[0]["prompt"]))
                kv, ref_kv = kv_of.get(key, (None, None))
                old = completion_logprobs(model, t, args.temperature, allowed, prefix=kv)
                ref = None
                if args.kl_coef > 0:
                    with model.disable_adapter():
                        ref = completion_logprobs(model, t, args.temperature, allowed, prefix=ref_kv)
                prepared.append((t, old, ref, torch.tensor([s["adv"] for s in b], device=device), key))
        del kv_of
        # 4. --ppo-epochs optimiser steps on these samples, each accumulating every micro-batch
        loss_sum, clipped, kl, grad_norm = 0.0, 0.0, 0.0, None
        for _ in range(args.ppo_epochs if n_tokens > 0 else 0):
            prompt = None  # (prompt KV with its graph, detached leaves) of the current group
            for j, (t, old, ref, a, key) in enumerate(prepared):
                # a shared prompt's gradient arrives in parts (samples, then the prompt), which DDP's
                # all-reduce on the first backward cannot follow: averaged by hand below instead
                last = j == len(prepared) - 1 and not share
                with contextlib.nullcontext() if last else acc.no_sync(wrapped):
                    if share and prompt is None:
                        kv = prompt_kv(wrapped, list(key))
                        prompt = (kv, detached(kv))
                    logp = completion_logprobs(wrapped, t, args.temperature, allowed,
                                               prefix=prompt[1] if share else None)
                    loss, st = grpo_loss(logp, old, a, t[3], n_tokens / acc.num_processes,
                                         args.clip_eps, ref, args.kl_coef)
                    acc.backward(loss)
                    if share and (j == len(prepared) - 1 or prepared[j + 1][4] != key):
                        backward_prompt(*prompt)  # the group's last micro-batch
                        prompt = None
                loss_sum += loss.detach().item() / args.ppo_epochs
                clipped += st["clipped"] / args.ppo_epochs
                kl += st.get("kl", 0.0) / args.ppo_epochs
            if share and acc.num_processes > 1:
                for p in params:
                    if p.grad is not None:
                        p.grad = acc.reduce(p.grad, "mean")
            grad_norm = float(acc.clip_grad_norm_(params, args.max_grad_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        # 5. log (sums over processes), checkpoint
        keys = ["n", "reward", "parsed", "correct", "brier", "crps"]
        vals = [totals[k] for k in keys] + [int(keep.sum()), len(rows), loss_sum, clipped, kl]
        t = acc.reduce(torch.tensor(vals, dtype=torch.float64, device=device), "sum").tolist()
        s = dict(zip(keys + ["kept", "groups", "loss", "clipped", "kl"], t))
        rec = {"step": step + 1, "reward": s["reward"] / s["n"], "parse_rate": s["parsed"] / s["n"],
               "accuracy": s["correct"] / s["parsed"] if s["parsed"] else None,
               "brier": s["brier"] / s["n"], "crps": s["crps"] / s["n"],
               "groups_kept": int(s["kept"]), "groups": int(s["groups"]), "tokens": n_tokens,
               "loss": s["loss"] / acc.num_processes, "clip_frac": s["clipped"] / max(n_tokens, 1),
               "kl": s["kl"] / max(n_tokens, 1) if args.kl_coef > 0 else None,
               "grad_norm": grad_norm, "step_time_s": round(time.perf_counter() - t0, 4),
               "peak_memory_bytes": peak_memory_bytes(device)}
        records.append(rec)
        if acc.is_main_process:
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            bar.set_postfix(reward=f"{rec['reward']:.3f}", kept=f"{rec['groups_kept']}/{rec['groups']}")
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_checkpoint(acc, wrapped, optimizer, step + 1, out, args)
    # the final adapter, then the held-out evaluation on the main process alone (no barrier after
    # it: a long evaluation must not hit the other processes' collective timeout)
    summary = None
    if acc.is_main_process:
        acc.unwrap_model(wrapped).save_pretrained(out / "adapter", save_embedding_layers=False)
        if eval_rows:
            seed_everything(args.seed, args.steps, 0)  # the same forecasts after a --resume
            summary = evaluate(policy, eval_rows, prompt_fn, parse, args, out, max_new, allowed)
    return {"log": records, "eval": summary}


# ---- command line --------------------------------------------------------------------------------

def build_parser():
    ap = argparse.ArgumentParser(description="GRPO training of the forecaster's LoRA adapter with "
                                 "correctness, Brier or CRPS rewards (docs/PAPER.md §6).")
    a = ap.add_argument
    a("--data", required=True, help="training rows (JSON Lines): pack, anchor_code, "
      "candidate_code, aggregated_speedup (ours or the paper's RL pool)")
    a("--out", required=True, help="output folder: log.jsonl, checkpoint-*/, adapter/, predictions")
    a("--model", default=lm.DEFAULT_MODEL, help="causal LM name or local path")
    a("--embedded", action="store_true", help="the embedded SmolLM2-135M-Instruct (CPU; "
      "exercises the pipeline, its forecasts mean nothing)")
    a("--reward", choices=REWARDS, default="brier", help="correctness, +Brier or +CRPS")
    a("--answer-format", choices=("json", "votes"), default="json", help="json: the forecaster's "
      "answer and parser (default); votes: K constrained bin digits")
    a("--votes", type=int, default=4, help="K of the votes format (default 4)")
    a("--steps", type=int, default=20, help="optimisation steps (default 20)")
    a("--prompts-per-step", type=int, default=8, help="training rows per step (default 8)")
    a("--group-size", type=int, default=8, help="G, completions per prompt (default 8)")
    a("--lr", type=float, default=4e-5, help="AdamW learning rate (default 4e-5)")
    a("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    a("--lora-rank", type=int, default=32, help="LoRA rank (default 32)")
    a("--lora-alpha", type=float, default=32, help="LoRA alpha (default 32)")
    a("--lora-targets", default="q_proj,k_proj,v_proj,o_proj", help="LoRA module names, comma-"
      "separated (GPT-OSS also gets its MoE expert weights)")
    a("--no-expert-lora", action="store_true", help="GPT-OSS: LoRA on attention only (for a "
      "server whose LoRA support does not cover MoE expert weights)")
    a("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    a("--max-new-tokens", type=int, default=8192, help="completion budget (default 8192)")
    a("--reasoning-effort", choices=lm.REASONING_EFFORTS, default="medium",
      help="GPT-OSS reasoning effort (default medium)")
    a("--hardware", default=None, help="hardware profile in the prompt (forecast_prompt.HARDWARE_"
      "PROFILES; default the local GPU, else the paper's A100)")
    a("--clip-eps", type=float, default=0.2, help="PPO clip range of the ratio (default 0.2)")
    a("--kl-coef", type=float, default=0.0, help="weight of the k3 KL to the base model (default 0)")
    a("--scale-std", action="store_true", help="divide advantages by the group std")
    a("--ppo-epochs", type=int, default=1, help="optimiser steps per batch of samples (default 1)")
    a("--micro-batch-size", type=int, default=1, help="sequences per forward/backward (default 1)")
    a("--gen-batch-size", type=int, default=64, help="sequences generated at once (default 64)")
    a("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (default 1.0)")
    a("--no-gradient-checkpointing", action="store_true", help="faster on a GPU, more memory; "
      "lets the training pass share each prompt's forward too (a checkpointed layer drops caches)")
    a("--no-prefix-cache", action="store_true", help="run every sample's prompt forward separately "
      "(by default the G samples of a group share one, in generation and the log-prob passes); "
      "for comparison")
    a("--seed", type=int, default=0, help="seed of shuffle, split and sampling (default 0)")
    a("--holdout-task", default=None, help="evaluate on this task's rows, train on the others")
    a("--eval-fraction", type=float, default=0.0, help="or evaluate on this fraction of the rows")
    a("--eval-samples", type=int, default=3, help="forecasts per held-out row (default 3)")
    a("--eval-temperature", type=float, default=1.0, help="0 = greedy, one forecast per row")
    a("--save-every", type=int, default=5, help="checkpoint every N steps (default 5)")
    a("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    return ap


def check_args(args):
    """One line naming the problem and the fix, before anything is written."""
    positive = ("steps", "prompts_per_step", "group_size", "lora_rank", "max_new_tokens",
                "ppo_epochs", "micro_batch_size", "gen_batch_size", "save_every", "votes",
                "eval_samples")
    for name in positive:
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if args.group_size < 2:
        return "--group-size must be >= 2: an advantage compares samples of the same prompt"
    if not args.temperature > 0:
        return "--temperature must be > 0: GRPO learns from sampled completions"
    if not 0 <= args.eval_fraction < 1:
        return "--eval-fraction must be in [0, 1)"
    if args.holdout_task and args.eval_fraction:
        return "give --holdout-task or --eval-fraction, not both"
    if not Path(args.data).is_file():
        return f"--data {args.data}: no such file"
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return f"--out {args.out} is an existing file; pass a folder"
    if (out / "log.jsonl").exists() and not args.resume:
        return f"--out {args.out} already holds a run; pass --resume or choose another --out"
    return None


def main(argv=None):
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        result = train(args)
    except (ValueError, OSError, lm.ModelNotFound) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result["eval"]:
        ev = result["eval"]
        print(f"held-out: n {ev['n']}, parse rate {ev['parse_rate']:.3f}, accuracy "
              f"{ev['accuracy'] if ev['accuracy'] is None else round(ev['accuracy'], 3)}, "
              f"brier {ev['brier']:.4f}, crps {ev['crps']:.4f}; details in {args.out}/eval_summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
