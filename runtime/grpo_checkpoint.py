"""grpo_checkpoint.py: a GRPO run that stops can be resumed and ends as if it had not stopped
(train_grpo.py --resume).

A checkpoint (OUT/checkpoint-NNNNNN/) holds what a step changes: the LoRA adapter (peft format,
which forecaster.py's TransformersBackend(adapter=...) loads), the optimiser state and the step.
The rest of a run's state is a function of the step: every step reseeds python, numpy and torch
from (seed, step, process) (seed_everything) instead of saving each process's RNG state, and
train_grpo.rows_for_step picks a step's rows from (seed, step). So the step *is* the RNG state and
the data position, and a resumed run reproduces an uninterrupted one bit for bit on CPU. Log lines
of steps after the checkpoint are dropped on resume: those steps are redone.
"""
import json
import random
import shutil
import warnings
from dataclasses import asdict

import numpy as np

from data.records import read_jsonl, write_atomic


def seed_everything(seed, step, rank):
    """Every step's randomness is a function of (seed, step, process): resuming needs only the step."""
    import torch
    s = int(np.random.SeedSequence([seed, step + 1, rank]).generate_state(1)[0])
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)  # also seeds every CUDA device


def save_checkpoint(accelerator, model, optimizer, step, out, args):
    """OUT/checkpoint-NNNNNN/: the adapter (peft format), optimiser state and the step. Written to
    a temporary folder and renamed, so a crash never leaves half a checkpoint."""
    import torch
    if accelerator.is_main_process:
        final, tmp = out / f"checkpoint-{step:06d}", out / f".tmp-checkpoint-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        # embeddings are never trained; saying so also spares peft a Hub lookup of the base model
        accelerator.unwrap_model(model).save_pretrained(tmp, save_embedding_layers=False)
        torch.save({"optimizer": optimizer.state_dict(), "step": step, "args": asdict(args)},
                   tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    accelerator.wait_for_everyone()


def load_checkpoint(model, optimizer, out, args):
    """Restore the latest checkpoint in OUT into model and optimiser; returns its step."""
    import torch
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
