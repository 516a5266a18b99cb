"""grpo_ddp.py: the plumbing that lets train_grpo.py's GRPO loop run in several processes.

`accelerate launch --num_processes N train_grpo.py ...` runs the loop once per GPU (DDP). The
algorithm is the same in every process; what several processes add is kept here, out of the
loop's phases:
  - my_share: each process takes every N-th prompt of a step;
  - balance_micro_batches: the step's completion-token count over all processes (the loss
    normaliser), and zero-weight filler micro-batches, so that every process runs the same number
    of backward passes (DDP's all-reduce waits for all of them); filler_mask gives a filler's
    completion tokens zero weight;
  - sync_context / average_gradients: when gradients are all-reduced (a shared prompt's gradient
    arrives in parts, which DDP's own all-reduce cannot follow, so then it is done by hand);
  - step_record: the step's log line, sums over processes, then means.
With one process every function is the identity of the single-process loop.
"""
import contextlib



def my_share(acc, rows):
    """This process's prompts of a step (each process takes every num_processes-th)."""
    return rows[acc.process_index::acc.num_processes]


def balance_micro_batches(acc, micro_batches, filler):
    """(completion tokens of the whole step over all processes, micro-batches padded with
    zero-weight `filler` ones): DDP needs the same number of backward passes on every process."""
    import torch
    local = torch.tensor([sum(len(s["completion"]) for mb in micro_batches for s in mb), len(micro_batches)],
                         device=acc.device)
    n_tokens = int(acc.reduce(local[:1].clone(), "sum"))
    n_micro = int(acc.gather(local[1:]).max())
    return n_tokens, micro_batches + [[dict(filler, adv=0.0, filler=True)]] * (n_micro - len(micro_batches))


def filler_mask(samples, completion_mask):
    """The completion mask [B, Tc] of a micro-batch of `samples`: zeros for a filler one
    (balance_micro_batches), whose backward pass then adds nothing to the gradient or the loss."""
    import torch
    return torch.zeros_like(completion_mask) if samples[0].get("filler") else completion_mask


def sync_context(acc, wrapped, is_last, share):
    """DDP all-reduces gradients on the step's last backward only. A shared prompt's gradient
    arrives in parts (samples, then the prompt), which that all-reduce cannot follow: then no
    backward syncs and average_gradients does it by hand."""
    return contextlib.nullcontext() if is_last and not share else acc.no_sync(wrapped)


def average_gradients(acc, params, share):
    """With shared prompts no backward synced (sync_context): average the gradients over the
    processes here. Otherwise DDP did, on the step's last backward."""
    if share and acc.num_processes > 1:
        for p in params:
            if p.grad is not None:
                p.grad = acc.reduce(p.grad, "mean")


def step_record(acc, step, totals, kept_groups, groups, n_tokens, loss, clipped, kl, args, tis=(0.0, 0.0)):
    """The step's log line: sums over processes, then means. tis: (the importance weights' sum, the
    capped tokens' count) over this process's completion tokens; logged with --server."""
    import torch
    keys = ["n", "reward", "parsed", "correct", "brier", "crps", "kept", "groups", "loss", "clipped", "kl",
            "tis_weight", "tis_capped"]
    vals = [totals[k] for k in keys[:6]] + [kept_groups, groups, loss, clipped, kl, *tis]
    s = dict(zip(keys, acc.reduce(torch.tensor(vals, dtype=torch.float64, device=acc.device), "sum").tolist()))
    rec = {"step": step + 1, "reward": s["reward"] / s["n"], "parse_rate": s["parsed"] / s["n"],
           "accuracy": s["correct"] / s["parsed"] if s["parsed"] else None,
           "brier": s["brier"] / s["n"], "crps": s["crps"] / s["n"],
           "groups_kept": int(s["kept"]), "groups": int(s["groups"]), "tokens": n_tokens,
           "loss": s["loss"] / acc.num_processes, "clip_frac": s["clipped"] / max(n_tokens, 1),
           "kl": s["kl"] / max(n_tokens, 1) if args.kl_coef > 0 else None}
    if args.server:  # the mean importance weight and the share of tokens whose weight the cap cut
        on = args.tis_cap > 0 and n_tokens > 0
        rec.update(tis_weight=s["tis_weight"] / n_tokens if on else None,
                   tis_capped=s["tis_capped"] / n_tokens if on else None)
    return rec
