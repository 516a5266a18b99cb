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

A step of `train` is the paper's GRPO, one function a line:
    samples = sample_groups(...)    G completions per prompt from the policy (grpo_sampling.py)
    kept = score_groups(...)        parse, reward against the measured bin, advantage within the group
    old_logprobs(...)               log pi_old of the sampled tokens, before any update
    policy_step(...)                the clipped token-level loss, backward, optimiser step
The loop's other lines are plumbing, marked so where they stand: resume (grpo_checkpoint.py),
several processes (grpo_ddp.py), the log. One speed-up sits behind one function, share_prompts:
the G samples of a prompt sharing one forward of it, the same log-probs and gradient.

The samples come from the policy itself, or with --server from a vLLM server (grpo_sampling.py:
sampled there, scored and trained on here; off-policy unless --server-sync-every reloads the
adapter into it; docs/GPU.md).

Reward (a parse failure scores 0 in every variant), y = the true bin of the measured speedup:
    correctness = 1[predicted bin == y]            (predicted bin = argmax of the probabilities;
                                                    --protocol paper: the bin the model stated)
    brier       = correctness + (1 - Brier(p, y))  (half-Brier, bins.brier)
    crps        = correctness + (1 - CRPS(p, y))   (ranked probability score / 7, bins.crps)
--score-weight w multiplies the proper-score term, correctness + w * (1 - score); the paper's is 1.
(w = 7 with crps makes its term the ranked probability score without the /7, whose pay for an honest
spread over adjacent bins is about Brier's; see docs/FIDELITY.md and scripts/calibration_demo.py.)
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
update (old_logprobs), so --ppo-epochs > 1 (several optimiser steps on the same samples) is sound;
with one epoch r == 1 and the clip never acts. The reference policy for the KL term is the base
model, i.e. the policy with its adapter disabled. Samples drawn on --server come from another
policy: the surrogate (not the KL) of each token is weighted by min(exp(logp_old - logp_server),
--tis-cap) (old_logprobs records the weights; grpo_sampling.py).

Two answer formats:
  json   (default, the paper's): the model writes the forecaster's JSON answer freely, parsed by
         forecast_answer.parse_answer. This is the production path.
  votes  the prompt ends with an answer prefix and the completion is K tokens constrained to the
         bin digits 1..8; the forecast is the vote histogram (probabilities in steps of 1/K). A tiny
         or untrained model always answers parseably, so it learns from step one; the learning
         test uses it. Sampling and the loss use the same constrained (renormalised) policy.

--protocol paper: the original's prompt (forecast_prompt.py), correctness on the stated bin; `ours`:
on the argmax, the bin the gate and metrics use. A row is shown the hardware it was measured on.

Defaults are the paper's: LoRA rank 32, lr 4e-5 (AdamW), G = 8, 8 prompts per step, 20 steps,
temperature 1.0, 8192 new tokens, no KL, eps 0.2. Unlike the original, rows are shuffled (seeded).
The final adapter is OUT/adapter/; checkpoints (OUT/checkpoint-NNNNNN/) hold it in peft format
(forecaster.py's TransformersBackend(adapter=...) loads it; for vLLM's --lora-modules, whose LoRA
support may not cover GPT-OSS's MoE experts, train with --no-expert-lora), the optimiser state and
the step. --resume reproduces an uninterrupted run bit for bit on CPU (grpo_checkpoint.py: the
step is the RNG state and the data position).
Multi-GPU (accelerate launch) splits each step's prompts across processes; only the main process
writes files and runs the final evaluation. The suite runs it with 2 CPU processes.

GPU (GPT-OSS-20B in bf16, LoRA on attention and MoE experts, gradient checkpointing):
    accelerate launch --num_processes 1 train_grpo.py --model openai/gpt-oss-20b \\
        --data rl_pool.jsonl --reward brier --out runs/brier
  (the paper's RL pool has no gdn_chunk_fwd_o row, the task it holds out: judge the adapter on the
  eval set with forecaster.py --eval; --holdout-task must name a task in the data.) (more GPUs: --num_processes N; the 8 prompts of a step are split across processes; the same
  command works as plain `python train_grpo.py ...` on one GPU.)
CPU (tiny scale): python train_grpo.py --data rows.jsonl --reward brier --out runs/x --embedded \\
        --answer-format votes --steps 4 --prompts-per-step 2 --group-size 4 --eval-fraction 0.2
"""
from runtime import cli  # first, on its own: a Ctrl-C while the rest loads is one line (runtime/cli.py)

# isort: split
import contextlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import bins
import metrics
from data.dataset import load_predictions, load_rows, prediction_row, source_exists
from data.records import write_atomic
from forecast_answer import DIGITS, Forecast, failure, parse_answer
from forecast_prompt import answer_tools, build_messages, hardware_info, row_hardware
from models import lm, lm_memory
from models.forecaster_backends import OpenAIServerBackend, ServerError
from models.lm import LM, Batch, backward_prompt, checkpointing, collate, completion_logprobs, detached, no_grad, prompt_kv
from paper_protocol import PROTOCOLS
from runtime.cli import flag
from runtime.grpo_checkpoint import load_checkpoint, save_checkpoint, seed_everything
from runtime.grpo_ddp import average_gradients, balance_micro_batches, filler_mask, my_share, step_record, sync_context
from runtime.grpo_sampling import importance_weights, sample_groups, sampler_logprobs_batch, sync_server_adapter

REWARDS = ("correctness", "brier", "crps")


@dataclass
class Args:
    """GRPO training of the forecaster's LoRA adapter with correctness, Brier or CRPS rewards
    (docs/PAPER.md §6)."""
    data: str = flag(None, "training rows: pack, anchor_code, candidate_code, aggregated_speedup; a JSON Lines "
                     "file or a Hub dataset hf:OWNER/NAME[/CONFIG][:SPLIT] (the paper's RL pool: "
                     "hf:codezakh/gpu-forecasters-rl-training-pool)", required=True)
    out: str = flag(None, "output folder: log.jsonl, checkpoint-*/, adapter/, predictions", required=True)
    model: str = flag(lm.DEFAULT_MODEL, "causal LM name or local path")
    embedded: bool = flag(False, "the embedded SmolLM2-135M-Instruct (CPU; exercises the pipeline, "
                          "its forecasts mean nothing)")
    reward: str = flag("brier", "correctness, +Brier or +CRPS", choices=REWARDS)
    score_weight: float = flag(1.0, "w in correctness + w * (1 - score) of the brier and crps rewards; "
                               "1 is the paper's (docs/FIDELITY.md)")
    answer_format: str = flag("json", "json: the forecaster's answer and parser; votes: K constrained bin digits",
                              choices=("json", "votes"))
    votes: int = flag(4, "K of the votes format")
    steps: int = flag(20, "optimisation steps")
    prompts_per_step: int = flag(8, "training rows per step")
    group_size: int = flag(8, "G, completions per prompt")
    lr: float = flag(4e-5, "AdamW learning rate")
    weight_decay: float = flag(0.0, "AdamW weight decay")
    lora_rank: int = flag(32, "LoRA rank")
    lora_alpha: float = flag(32, "LoRA alpha")
    lora_targets: str = flag("q_proj,k_proj,v_proj,o_proj", "LoRA module names, comma-separated "
                             "(GPT-OSS also gets its MoE expert weights)")
    no_expert_lora: bool = flag(False, "GPT-OSS: LoRA on attention only (for a server whose LoRA "
                                "support does not cover MoE expert weights)")
    temperature: float = flag(1.0, "sampling temperature")
    max_new_tokens: int = flag(8192, "completion budget")
    reasoning_effort: str = flag("medium", "GPT-OSS reasoning effort", choices=lm.REASONING_EFFORTS)
    protocol: str = flag("ours", "ours: our prompt, correctness on the argmax; paper: the original's prompt, "
                         "correctness on the stated bin (docs/FIDELITY.md)", choices=PROTOCOLS)
    hardware: str | None = flag(None, "hardware profile for rows without a `hardware` field "
                                "(forecast_prompt.HARDWARE_PROFILES; default a100-80gb, the paper's); a row "
                                "that names its hardware is shown that")
    clip_eps: float = flag(0.2, "PPO clip range of the ratio")
    kl_coef: float = flag(0.0, "weight of the k3 KL to the base model")
    scale_std: bool = flag(False, "divide advantages by the group std")
    ppo_epochs: int = flag(1, "optimiser steps per batch of samples")
    micro_batch_size: int = flag(1, "sequences per forward/backward")
    gen_batch_size: int = flag(0, "sequences generated at once; 0: as many as the GPU's free memory holds "
                               "(lm.rows_that_fit), all of a step's on a CPU")
    attention: str = flag("auto", "attention implementation; auto: flex attention for GPT-OSS on a GPU (eager "
                          "attention's score tensors do not fit), the model's default otherwise")
    server: str | None = flag(None, "sample on this OpenAI-compatible server (vLLM serving --model) instead of "
                              "with transformers; log-probs and updates stay local (docs/GPU.md)")
    server_sync_every: int = flag(0, "with --server: load the adapter into the server every N steps (vLLM "
                                  "runtime LoRA loading), so that it samples from the policy of at most N steps "
                                  "ago; 0: never, it samples from the base model (off-policy)")
    tis_cap: float = flag(2.0, "with --server: truncated importance sampling, each token's policy-gradient term "
                          "weighted by min(exp(logp_policy - logp_server), C); 0: off. The server's log-probs must "
                          "be of the distribution it sampled from: vLLM's are raw (before temperature and "
                          "allowed tokens) unless it serves with --logprobs-mode processed_logprobs, the same only "
                          "at temperature 1 with the json format (docs/GPU.md)")
    no_memory_check: bool = flag(False, "skip the start-up check that the weights and a micro-batch fit in the "
                                 "GPU's free memory (beside a --server on the same GPU, say; docs/GPU.md)")
    max_grad_norm: float = flag(1.0, "gradient clipping norm")
    no_gradient_checkpointing: bool = flag(False, "keep every activation for the backward pass instead of "
                                           "recomputing: faster, more memory (on a GPU whole layers are "
                                           "recomputed, and a group's samples then cannot share their prompt's "
                                           "forward; on a CPU only the MLPs, lm.checkpoint_mlps)")
    no_prefix_cache: bool = flag(False, "run every sample's prompt forward separately (by default the G samples "
                                 "of a group share one, in generation and the log-prob passes); for comparison")
    share_min_tokens: int = flag(1024, "the G samples share a prompt forward when (G - 1) x its tokens reach this "
                                 "(lm.sharing_pays; 0: always); on short prompts sharing costs more than it saves")
    seed: int = flag(0, "seed of shuffle, split and sampling")
    holdout_task: str | None = flag(None, "evaluate on this task's rows, train on the others")
    eval_fraction: float = flag(0.0, "or evaluate on this fraction of the rows")
    eval_samples: int = flag(3, "forecasts per held-out row")
    eval_temperature: float = flag(1.0, "0 = greedy, one forecast per row")
    save_every: int = flag(5, "checkpoint every N steps")
    resume: bool = flag(False, "continue from the latest checkpoint in --out")


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
    fallback = hardware_info(args.hardware or "a100-80gb")
    tools = answer_tools(args.protocol)

    def prompt(row):
        messages = build_messages(row["pack"], row["anchor_code"], row["candidate_code"],
                                  row_hardware(row, fallback), protocol=args.protocol)
        if args.answer_format == "votes":
            messages[-1] = dict(messages[-1], content=messages[-1]["content"]
                                + VOTES_INSTRUCTION.format(k=args.votes))
            return policy.answer_prompt(messages, None, VOTES_PREFIX)
        return policy.render(messages, tools=tools)
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

PROTOCOL_SAYS = {"ours": "our prompt, correctness on the argmax",
                 "paper": "the original's prompt, correctness on the stated bin"}


def scored_bin(forecast, protocol="ours"):
    """The bin correctness judges, by the protocol's bin rule (paper_protocol.PROTOCOLS): the argmax,
    or under the paper protocol the stated bin (the argmax when none was stated: the votes format)."""
    if PROTOCOLS[protocol].bin_rule == "stated" and forecast.stated_bin is not None:
        return forecast.stated_bin
    return bins.predicted_bin(forecast.probs)


def reward(forecast, true_bin, kind, protocol="ours", *, weight=1.0):
    """The paper's rewards (weight: of the proper-score term, 1 in the paper); a parse failure (or a
    deferral: no probabilities) scores 0 in every variant."""
    if forecast.parse_failed or forecast.probs is None:
        return 0.0
    correct = float(scored_bin(forecast, protocol) == true_bin)
    if kind == "correctness":
        return correct
    if kind == "brier":
        return correct + weight * (1.0 - bins.brier(forecast.probs, true_bin))
    if kind == "crps":
        return correct + weight * (1.0 - bins.crps(forecast.probs, true_bin))
    raise ValueError(f"unknown reward {kind!r}; choose one of: {', '.join(REWARDS)}")


def group_advantages(rewards, scale_std=False):
    """rewards [n_groups, G] -> (advantages [n_groups, G], keep [n_groups] bool).

    A = r - group mean (divided by the group's sample std with scale_std). A group whose rewards
    are all equal has A = 0 everywhere and is marked dropped.
    """
    import torch
    r = torch.as_tensor(rewards, dtype=torch.float64)
    keep = r.max(dim=1).values > r.min(dim=1).values
    adv = r - r.mean(dim=1, keepdim=True)
    if scale_std:
        adv = torch.where(keep[:, None], adv / r.std(dim=1, keepdim=True).clamp_min(1e-12), 0.0)
    adv[~keep] = 0.0
    return adv, keep


def grpo_loss(logp, old_logp, advantages, mask, n_tokens, clip_eps=0.2, ref_logp=None,
              kl_coef=0.0, weights=None):
    """Clipped token-level policy-gradient loss (see the module docstring).

    logp, old_logp, ref_logp, mask: [B, T] (mask 1 on completion tokens); advantages: [B].
    n_tokens: the completion-token count of the whole step (all micro-batches and processes).
    weights: [B, T] constants multiplying each token's clipped surrogate, not its KL term (the
    importance weights of samples drawn on a server). Returns (loss, stats) where loss = sum over
    this micro-batch's tokens / n_tokens.
    """
    import torch
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype)[:, None]
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    if weights is not None:
        per_token = per_token * weights.to(logp.dtype)
    stats = {"clipped": float(((ratio - 1).abs() > clip_eps).to(logp.dtype).mul(mask).sum())}
    if kl_coef > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        per_token = per_token + kl_coef * kl
        stats["kl"] = float((kl.detach() * mask).sum())
    return (per_token * mask).sum() / n_tokens, stats


# ---- evaluation ----------------------------------------------------------------------------------

def evaluate(policy, rows, prompt_fn, parse, args, out, max_new, allowed=None, switch=None):
    """Forecast the held-out rows, write OUT/predictions.jsonl (ARCHITECTURE.md's prediction rows,
    readable by `python metrics.py`) and OUT/eval_summary.json (metrics.report)."""
    n = args.eval_samples if args.eval_temperature > 0 else 1
    prompts = [prompt_fn(r) for r in rows]
    share = not args.no_prefix_cache and lm.sharing_pays(prompts, n, args.share_min_tokens)
    samples = sample_groups(policy, prompts, n, temperature=args.eval_temperature, max_new_tokens=max_new,
                            batch_size=args.gen_batch_size or None, allowed=allowed, share_prompt=share, switch=switch)
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


# ---- the GPU's memory: the trainer, and a server beside it ----------------------------------------

def training_memory_problem(free, total, *, weights, step, loaded=False, device="cuda:0", server=None,
                            server_weights=0):
    """None if `free` of `total` bytes of the trainer's GPU hold its `weights` (already in memory
    when `loaded`: `free` is then measured after them) and a micro-batch's `step` bytes
    (lm_memory.training_bytes), with a fifth kept back, as the search's check keeps; else one line
    naming the fix. A vLLM server on the same GPU holds --gpu-memory-utilization of it from its
    start: the fix is the fraction that leaves the trainer its share, where what remains holds the
    server's own `server_weights` and a fifth; else another GPU (docs/GPU.md, "GRPO with a server")."""
    need, gib = 1.2 * (weights + step), 2 ** 30
    if (1.2 * step if loaded else need) <= free:
        return None
    what = (f"after the weights a micro-batch needs about {1.2 * step / gib:.0f} GiB" if loaded else
            f"training needs about {need / gib:.0f} GiB ({weights / gib:.1f} GiB of bf16 weights and "
            f"{step / gib:.1f} GiB for a micro-batch, plus a fifth)")
    util = math.floor((total - need) / total * 100) / 100
    if server and total - need >= 1.2 * server_weights:
        fix = (f"if the server shares this GPU, restart it with --gpu-memory-utilization {util:.2f} or on another "
               "GPU (CUDA_VISIBLE_DEVICES)")
    elif server:
        fix = "serve the model on another GPU (CUDA_VISIBLE_DEVICES)"
    else:
        fix = "free the GPU, or train on another one"
    if loaded or step > weights:
        fix += ", or lower --micro-batch-size or --max-new-tokens"
    return f"{device} has {free / gib:.0f} of {total / gib:.0f} GiB free; {what}: {fix}; --no-memory-check skips this check"


def check_training_memory(args, device, *, config=None, prompt_tokens=0, max_new=None, loaded=False):
    """training_memory_problem for this process's GPU (ValueError), before the weights load (from
    the model's config: lm.weights_on_load) and again after them with the prompts' real length."""
    import torch
    if device.type != "cuda" or args.no_memory_check:
        return
    if config is None:
        from transformers import AutoConfig
        if not lm.weights_available(args.model):
            return  # load_model says what to do
        config = AutoConfig.from_pretrained(args.model)
    step = lm_memory.training_bytes(config, tokens=prompt_tokens + (max_new or args.max_new_tokens),
                                    rows=args.micro_batch_size, logit_positions=lm.LOGPROB_CHUNK)
    free, total = torch.cuda.mem_get_info(device)
    if loaded:
        free = lm_memory.free_gpu_bytes(device)
    served = lm_memory.weights_bytes(config, mxfp4=lm.mxfp4_checkpoint(config))  # vLLM runs MXFP4 itself
    problem = training_memory_problem(free, total, weights=lm.weights_on_load(config, training=True)[0], step=step,
                                      loaded=loaded, device=str(device), server=args.server, server_weights=served)
    if problem:
        raise ValueError(problem)


# ---- the GRPO step: score the groups, the behaviour policy's log-probs, the policy step ------------

def group_scores(forecasts, true_bin, kind, protocol="ours", weight=1.0):
    """Rewards and the step's logging scores of one group (a parse failure scores as uniform p)."""
    rewards = [reward(f, true_bin, kind, protocol, weight=weight) for f in forecasts]
    parsed = [f for f in forecasts if f.probs is not None]
    probs = [bins.UNIFORM if f.probs is None else f.probs for f in forecasts]
    return rewards, {
        "n": len(forecasts), "reward": sum(rewards), "parsed": len(parsed),
        "correct": sum(scored_bin(f, protocol) == true_bin for f in parsed),
        "brier": sum(bins.brier(p, true_bin) for p in probs),
        "crps": sum(bins.crps(p, true_bin) for p in probs)}


def score_groups(samples, rows, parse, args):
    """GRPO's reward and advantage: parse each sample of a step into a forecast, reward it against
    its row's measured bin, and compare it with its group (group_advantages). samples: prompt-major,
    args.group_size per row. Returns (the samples of the kept groups, each with its advantage `adv`;
    keep [n_groups] bool; the step's logging totals, summed over groups)."""
    G, rewards, totals = args.group_size, [], {}
    for i, row in enumerate(rows):
        forecasts = [parse(s["text"]) for s in samples[i * G:(i + 1) * G]]
        group_rewards, scores = group_scores(forecasts, row["true_bin"], args.reward, args.protocol,
                                             args.score_weight)
        rewards.append(group_rewards)
        totals = {k: totals.get(k, 0) + v for k, v in scores.items()}
    advantages, keep = group_advantages(rewards, args.scale_std)  # (n_groups, G), (n_groups,)
    kept = [dict(s, adv=float(advantages[i // G, i % G])) for i, s in enumerate(samples) if keep[i // G]]
    return kept, keep, totals


@dataclass
class MicroBatch:
    """The samples of one forward and backward pass, and what old_logprobs records of them."""
    samples: list                  # B sample dicts (grpo_sampling.sample_groups), each with its `adv`
    batch: Batch
    prompt: tuple                  # the first sample's prompt token ids (with shared prompts, every sample's)
    adv: "torch.Tensor"                     # (B,) group advantages
    old_logp: "torch.Tensor | None" = None  # (B, Tc) log-probs under the policy that sampled them
    ref_logp: "torch.Tensor | None" = None  # (B, Tc) under the base model (adapter off), for the KL term
    weights: "torch.Tensor | None" = None   # (B, Tc) truncated importance weights of a server's samples


def make_micro_batches(acc, kept, filler, args, share, pad_id, device):
    """The kept samples in micro-batches of --micro-batch-size, and the step's completion-token
    count over all processes (grpo_loss's normaliser). With shared prompts a micro-batch never
    mixes groups, so that one prompt forward serves each (share_prompts)."""
    import torch
    G, size = args.group_size, args.micro_batch_size
    if share:
        split = [kept[g + j:g + min(j + size, G)] for g in range(0, len(kept), G) for j in range(0, G, size)]
    else:
        split = [kept[j:j + size] for j in range(0, len(kept), size)]
    # plumbing (DDP): the same number of backward passes on every process, zero-weight fillers
    n_tokens, split = balance_micro_batches(acc, split, filler)
    micro_batches = []
    for samples in split:
        batch = collate(samples, pad_id, device)
        batch = batch._replace(completion_mask=filler_mask(samples, batch.completion_mask))  # plumbing (DDP)
        adv = torch.tensor([s["adv"] for s in samples], device=device)  # (B,)
        micro_batches.append(MicroBatch(samples, batch, tuple(samples[0]["prompt"]), adv))
    return micro_batches, n_tokens


def share_prompts(model, micro_batches, share, *, reference=False, sync=None):
    """The prompt-sharing path, all of it. Yields (micro-batch, prefix, ref_prefix): the prompt KV
    (lm.prompt_kv) the micro-batch's forward starts from under the policy and, with `reference`,
    under the base model (adapter off). Without `share` both are None: every forward runs over
    its whole prompt, and the micro-batches come through as they are.

    With `share` one prompt forward serves a run of micro-batches of the same prompt (a group's;
    make_micro_batches never mixes groups then), G - 1 prompt forwards saved. Under grad (the
    training pass) the samples' backward stops at detached leaves of that KV, gathering their
    gradient, and after the run's last micro-batch one backward sends it through the prompt's
    forward (lm.backward_prompt): the same gradient. sync(is_last): the context in which a
    micro-batch's forward and backward run, its prompt's with it (DDP: grpo_ddp.sync_context)."""
    import torch
    grad = torch.is_grad_enabled()
    for j, mb in enumerate(micro_batches):
        is_last = j == len(micro_batches) - 1
        with sync(is_last) if sync else contextlib.nullcontext():
            if not share:
                yield mb, None, None
                continue
            if j == 0 or micro_batches[j - 1].prompt != mb.prompt:  # the first micro-batch of a group
                kv = prompt_kv(model, list(mb.prompt))  # per layer (keys, values), each (1, heads, P - 1, head_dim)
                prefix = detached(kv) if grad else kv  # leaves that gather the samples' gradient
                ref_prefix = None
                if reference:
                    with model.disable_adapter():
                        ref_prefix = prompt_kv(model, list(mb.prompt))
            yield mb, prefix, ref_prefix
            if grad and (is_last or micro_batches[j + 1].prompt != mb.prompt):  # the group's last
                backward_prompt(kv, prefix)


@no_grad
def old_logprobs(model, micro_batches, args, allowed, share, tis):
    """GRPO's behaviour policy: log pi_old of every sampled token, recorded before any update, so
    that the ratio of the --ppo-epochs steps is pi / pi_old (and 1 on the first); with --kl-coef
    the reference policy's, the base model with its adapter off; with tis (samples drawn on
    --server) the truncated importance weights min(pi_old / pi_server, --tis-cap)
    (grpo_sampling.importance_weights). Sets each MicroBatch's old_logp, ref_logp and weights;
    returns (the weights' sum, the capped tokens' count) over the completion tokens, for the log."""
    tis_sums = [0.0, 0.0]
    for mb, prefix, ref_prefix in share_prompts(model, micro_batches, share, reference=args.kl_coef > 0):
        mask = mb.batch.completion_mask  # (B, Tc)
        mb.old_logp = completion_logprobs(model, mb.batch, args.temperature, allowed, prefix=prefix)  # (B, Tc)
        if args.kl_coef > 0:
            with model.disable_adapter():
                mb.ref_logp = completion_logprobs(model, mb.batch, args.temperature, allowed,
                                                  prefix=ref_prefix)  # (B, Tc)
        if tis:
            server_logp = sampler_logprobs_batch(mb.samples, mb.old_logp.shape[1], mb.adv.device)  # (B, Tc)
            mb.weights = importance_weights(mb.old_logp, server_logp, mask, args.tis_cap)  # (B, Tc)
            capped = (mb.old_logp - server_logp > math.log(args.tis_cap)) & (mask > 0)  # (B, Tc)
            tis_sums[0] += float((mb.weights * mask).sum())
            tis_sums[1] += float(capped.sum())
    return tis_sums


def policy_step(acc, wrapped, optimizer, params, micro_batches, n_tokens, args, allowed, share):
    """GRPO's update: the token-level clipped loss (grpo_loss) of every micro-batch, backward,
    then one optimiser step; --ppo-epochs such steps on the same samples. Returns (the loss, the
    clipped tokens, the KL summed over tokens, each a mean over epochs; the last gradient norm)."""
    loss_sum, clipped, kl, grad_norm = 0.0, 0.0, 0.0, None
    sync = lambda is_last: sync_context(acc, wrapped, is_last, share)  # noqa: E731  plumbing (DDP)
    for _ in range(args.ppo_epochs if n_tokens > 0 else 0):
        for mb, prefix, _ in share_prompts(wrapped, micro_batches, share, sync=sync):
            logp = completion_logprobs(wrapped, mb.batch, args.temperature, allowed, prefix=prefix)  # (B, Tc)
            # the sum over this micro-batch's tokens / the step's count; DDP averages over processes
            loss, stats = grpo_loss(logp, mb.old_logp, mb.adv, mb.batch.completion_mask,
                                    n_tokens / acc.num_processes, args.clip_eps, mb.ref_logp,
                                    args.kl_coef, mb.weights)  # ()
            acc.backward(loss)
            loss_sum += loss.detach().item() / args.ppo_epochs
            clipped += stats["clipped"] / args.ppo_epochs
            kl += stats.get("kl", 0.0) / args.ppo_epochs
        average_gradients(acc, params, share)  # plumbing (DDP): by hand when prompts are shared
        grad_norm = float(acc.clip_grad_norm_(params, args.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss_sum, clipped, kl, grad_norm


# ---- the GRPO loop -------------------------------------------------------------------------------

def train(args, prompt_fn=None, parse=None, model=None, tokenizer=None, progress=True):
    """Run GRPO as configured by `args` (an Args); returns {"log": [...], "eval": {...}}.

    prompt_fn (row -> prompt token ids) and parse (text -> Forecast) default to the forecaster's
    prompt and parser; tests inject a synthetic pair. model/tokenizer: a base model in memory
    instead of --model (an adapter is added to it). progress=False: no start-up estimate and no
    progress (the calibration demo's runs, which it reports itself)."""
    import torch
    from accelerate import Accelerator
    acc = Accelerator()  # plumbing (DDP): one process per GPU under accelerate launch
    device, out = acc.device, Path(args.out)
    rows = load_rows(args.data)
    for row in rows:  # an unknown hardware name fails before any model loads
        row_hardware(row, None)
    train_rows, eval_rows = split_rows(rows, args.seed, args.holdout_task, args.eval_fraction)
    if not train_rows:
        raise ValueError(f"{args.data}: no training rows left after holding out --holdout-task "
                         f"{args.holdout_task}; hold out another task")
    if args.prompts_per_step < acc.num_processes:  # plumbing (DDP)
        raise ValueError(f"--prompts-per-step {args.prompts_per_step} < {acc.num_processes} "
                         f"processes; give every process at least one prompt")
    if (out / "log.jsonl").exists() and not args.resume:  # plumbing (resume)
        raise ValueError(f"{out} already holds a run; pass --resume or choose another --out")
    acc.print(f"protocol: {args.protocol} ({PROTOCOL_SAYS[args.protocol]}; docs/FIDELITY.md)", file=sys.stderr)
    max_new = args.votes if args.answer_format == "votes" else args.max_new_tokens
    if device.type == "cpu":  # the resident memory is then what the tensors hold (lm_memory.py), not twice it
        lm_memory.tensors_back_to_the_system()
    if model is None:
        if not args.embedded:  # before a 42 GB load that would not fit (a server on the same GPU, say)
            check_training_memory(args, device, max_new=max_new)
        else:  # seconds to minutes on a loaded CPU, before the estimate and the progress can say anything
            acc.print(f"loading {lm.EMBEDDED_NAME} (the expected duration follows once a forward is timed)",
                      file=sys.stderr)
        model, tokenizer = (lm.load_embedded() if args.embedded else
                            lm.load_model(args.model, device=device, training=True, attention=args.attention,
                                          say=lambda line: acc.print(line, file=sys.stderr)))
    seed_everything(args.seed, -1, 0)  # the same fresh adapter on every process
    model = lm.add_lora(model, rank=args.lora_rank, alpha=args.lora_alpha, targets=args.lora_targets.split(","),
                        expert_lora=not args.no_expert_lora, device=device,
                        gradient_checkpointing=not args.no_gradient_checkpointing)
    policy = LM(model, tokenizer, reasoning_effort=args.reasoning_effort)
    switch = lm.AdapterSwitch(model)  # local sampling merges the adapter's experts (grpo_sampling.py)
    model.train()
    prompt_fn = prompt_fn or make_prompt_fn(policy, args)
    parse = parse or ((lambda text: parse_votes(text, args.votes)) if args.answer_format == "votes"
                      else parse_answer)
    allowed = None
    if args.answer_format == "votes":  # the completion is exactly K bin digits
        allowed = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=device)  # (vocab,)
        allowed[policy.candidate_ids(DIGITS)] = True  # ValueError unless each is one token
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    start = load_checkpoint(model, optimizer, out, args) if args.resume else 0  # plumbing (resume)
    acc.wait_for_everyone()  # plumbing (DDP)
    out.mkdir(parents=True, exist_ok=True)
    wrapped, optimizer = acc.prepare(model, optimizer)  # plumbing (DDP): the model DDP-wrapped
    G, records = args.group_size, []
    # one prompt forward serves a group's samples (lm.prompt_kv) where that pays, the same in every process
    probe = [prompt_fn(r) for r in train_rows[:8]]
    if device.type == "cuda":  # with the weights loaded: a micro-batch at the longest row's real prompt length
        longest = max(train_rows, key=lambda r: len(r["anchor_code"]) + len(r["candidate_code"]))
        check_training_memory(args, device, config=model.config, prompt_tokens=len(prompt_fn(longest)),
                              max_new=max_new, loaded=True)
    share_prompt = not args.no_prefix_cache and lm.sharing_pays(probe, G, args.share_min_tokens)
    share = share_prompt and not checkpointing(model)  # the training pass too (a checkpointed layer drops caches)
    server = OpenAIServerBackend(args.server, model=args.model) if args.server else None
    served = args.model  # the model the server samples from: the base, or the adapter it last loaded
    tis = server is not None and args.tis_cap > 0  # weight the server's samples by min(pi / pi_server, C)
    expected = None  # plumbing (logging): the run's expected duration, from a forward timed here
    if progress and acc.is_main_process:
        expected, words = expected_duration(model, probe, args, start, max_new, (share_prompt, share),
                                            acc.num_processes, len(eval_rows))
        acc.print(words, file=sys.stderr)
    bar = cli.Progress("GRPO", args.steps, "steps", initial=start, expected_s=expected,
                       enabled=progress and acc.is_main_process, pace_from_start=True)  # the model is loaded
    for step in range(start, args.steps):
        t0 = time.perf_counter()  # plumbing (logging)
        if device.type == "cuda":  # plumbing (logging)
            torch.cuda.reset_peak_memory_stats(device)
        seed_everything(args.seed, step, acc.process_index)  # plumbing (resume): the step is the RNG state
        rows = rows_for_step(train_rows, step, args.prompts_per_step, args.seed)
        rows = my_share(acc, rows)  # plumbing (DDP): this process's prompts of the step

        # 1. sample a group of G completions per prompt from the current policy (or, on --server,
        #    from the adapter it last loaded)
        if server is not None and args.server_sync_every and (step % args.server_sync_every == 0 or step == start):
            # --server-sync-every: the server samples from the adapter of at most N steps ago
            served = sync_server_adapter(acc, server, wrapped, out, step)
        samples = sample_groups(policy, [prompt_fn(r) for r in rows], G, temperature=args.temperature,
                                max_new_tokens=max_new, batch_size=args.gen_batch_size or None, allowed=allowed,
                                share_prompt=share_prompt, server=server, served_model=served, sampler_logprobs=tis,
                                switch=switch)
        # 2. reward each completion against the measured bin; 3. group advantages (groups whose
        #    rewards are all equal carry no signal and are dropped)
        kept, keep, totals = score_groups(samples, rows, parse, args)
        # (micro-batches bound the memory a forward holds; the loss counts every token of the step)
        micro_batches, n_tokens = make_micro_batches(acc, kept, samples[0], args, share, policy.pad_id, device)
        # 4. the log-probs of the sampled tokens under the policy that sampled them, before any update
        tis_sums = old_logprobs(model, micro_batches, args, allowed, share, tis)
        # 5. the clipped policy loss, backward, optimiser step (--ppo-epochs of them on these samples)
        loss_sum, clipped, kl, grad_norm = policy_step(acc, wrapped, optimizer, params, micro_batches, n_tokens,
                                                       args, allowed, share)

        # plumbing (logging, resume): the step's log line, a checkpoint every --save-every steps
        rec = step_record(acc, step, totals, int(keep.sum()), len(rows), n_tokens, loss_sum, clipped, kl, args,
                          tis_sums)
        rec.update(grad_norm=grad_norm, step_time_s=round(time.perf_counter() - t0, 4),
                   peak_memory_bytes=lm.peak_memory_bytes(device), processes=acc.num_processes)
        records.append(rec)
        if acc.is_main_process:
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            bar.update()
            bar.set_words(step_words(rec))
            if progress and step == start and args.ppo_epochs == 1 and rec["groups_kept"]:
                acc.print(ZERO_LOSS_NOTE, file=sys.stderr)
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_checkpoint(acc, wrapped, optimizer, step + 1, out, args)
    bar.close()
    # the final adapter, then the held-out evaluation on the main process alone (no barrier after
    # it: a long evaluation must not hit the other processes' collective timeout)
    summary = None
    if acc.is_main_process:
        acc.unwrap_model(wrapped).save_pretrained(out / "adapter", save_embedding_layers=False)
        if eval_rows:
            seed_everything(args.seed, args.steps, 0)  # the same forecasts after a --resume
            summary = evaluate(policy, eval_rows, prompt_fn, parse, args, out, max_new, allowed, switch)
    return {"log": records, "eval": summary}


# ---- what the log says: the step's words, the start-up estimate --------------------------------------

# GRPO's loss is not a figure of progress: with one epoch (ratio 1) it is minus the token-weighted
# mean of the advantages, which sum to zero within a group, so it is 0 (exactly, when a group's
# completions are equally long) while its gradient is not. The reward and the gradient's norm move.
ZERO_LOSS_NOTE = ("note: log.jsonl's loss is ~0 at every step of one --ppo-epochs by construction (the ratio is 1 "
                  "and a group's advantages sum to zero), not a sign that nothing is learnt: its gradient is not "
                  "zero (grad_norm); watch reward, brier and crps move")
PROBE_TOKENS = 512  # of a prompt, timed for the start-up estimate (a forward's cost grows about linearly)


def step_words(rec):
    """What the progress shows of a step: its reward, the groups that carried a signal, the gradient."""
    words = f"reward {rec['reward']:.3f}, {rec['groups_kept']}/{rec['groups']} groups kept"
    if not rec["groups_kept"]:
        return words + " (every group's rewards equal: nothing to learn from this step)"
    return words + (f", grad norm {rec['grad_norm']:.3g}" if rec.get("grad_norm") is not None else "")


def expected_duration(model, prompts, args, start, max_new, shared, processes, n_eval):
    """(seconds, the start-up line): the steps left and the evaluation, timed from a forward of a
    typical prompt here (the median length of the first rows; its first PROBE_TOKENS tokens timed,
    the second of two runs, and scaled to its length). A sample costs about 1 + 1 + 3 x
    --ppo-epochs forwards of its prompt (sampling, pi_old, forward and backward; one more each for
    --kl-coef and gradient checkpointing; `shared`: whether a group's samples share the sampling
    forward, and pi_old's) and a one-token forward per completion token; the evaluation one forward
    and the completion per forecast. The progress lines go by the steps' own pace once one is done."""
    import torch
    prompt = sorted(prompts, key=len)[len(prompts) // 2]
    ids = torch.tensor([prompt[:PROBE_TOKENS]], device=model.device)

    def timed(x):
        with torch.no_grad():
            for _ in range(2):  # the first call warms up (allocations, kernels)
                t0 = time.perf_counter()
                model(input_ids=x)
                if x.device.type == "cuda":
                    torch.cuda.synchronize(x.device)
        return time.perf_counter() - t0
    full, token = timed(ids) * len(prompt) / ids.shape[1], timed(ids[:, -1:])
    completion = args.votes if args.answer_format == "votes" else max_new
    in_sampling, in_passes = (1 / args.group_size if on else 1 for on in shared)
    forwards = in_sampling + in_passes * (1 + (args.kl_coef > 0)) + args.ppo_epochs * (3 + checkpointing(model))
    samples = args.prompts_per_step * args.group_size / processes
    step_s = samples * (forwards * full + completion * token)
    eval_s = n_eval * args.eval_samples * (full + completion * token)
    total = (args.steps - start) * step_s + eval_s
    bound = "" if args.answer_format == "votes" else f", at most: every completion {max_new} tokens long"
    return total, (f"expected duration: about {cli.duration(total)} here{bound} ({args.steps - start} steps of "
                   f"{samples:g} samples at ~{cli.duration(step_s)} a step, and {n_eval} x {args.eval_samples} "
                   f"held-out forecasts; a forward of a {len(prompt)}-token prompt, the median of the first rows', "
                   f"takes ~{full:.2f} s here); the progress lines correct it from the steps' own pace")


# ---- command line --------------------------------------------------------------------------------

def check_args(args):
    """One line naming the problem and the fix, before anything is written."""
    positive = ("steps", "prompts_per_step", "group_size", "lora_rank", "max_new_tokens",
                "ppo_epochs", "micro_batch_size", "save_every", "votes", "eval_samples")
    for name in positive:
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    for name in ("gen_batch_size", "server_sync_every"):
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} must be >= 0"
    if args.server_sync_every and not args.server:
        return "--server-sync-every needs --server"
    if not (args.tis_cap == 0 or args.tis_cap >= 1):
        return "--tis-cap must be 0 (no correction) or >= 1 (the cap of the importance weights; 2 is common)"
    if args.server and args.embedded:
        return "--server samples from the served model; drop --embedded (the embedded model is local)"
    if args.group_size < 2:
        return "--group-size must be >= 2: an advantage compares samples of the same prompt"
    if not args.score_weight >= 0:
        return "--score-weight must be >= 0 (1 is the paper's; 0 leaves correctness alone)"
    if not args.temperature > 0:
        return "--temperature must be > 0: GRPO learns from sampled completions"
    if not 0 <= args.eval_fraction < 1:
        return "--eval-fraction must be in [0, 1)"
    if args.holdout_task and args.eval_fraction:
        return "give --holdout-task or --eval-fraction, not both"
    if not source_exists(args.data):
        return f"--data {args.data}: no such file"
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return f"--out {args.out} is an existing file; pass a folder"
    if (out / "log.jsonl").exists() and not args.resume:
        return f"--out {args.out} already holds a run; pass --resume or choose another --out"
    return None


def build_parser():
    """The command line of Args (cli.py): one --flag per field, with its default and help."""
    return cli.parser(Args)


def main(argv=None):
    args = cli.parse(Args, argv)
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        result = train(args)
    except (ValueError, OSError, lm.ModelNotFound, ServerError) as e:
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
