"""bench_grpo.py: step time and peak memory of train_grpo.py's GRPO step, measured, never estimated.

Always: a random tiny GPT-OSS (2 layers, hidden 64, 4 experts) on CPU (the GPU hidden from it, even
on a GPU machine) with the votes answer format on a synthetic task (8 prompts x G = 8 samples per
step, as the paper), twice: as train_grpo.py decides (its prompts of a few tokens are far too short
for a group to share its prompt's forward, lm.sharing_pays) and with sharing forced
(--share-min-tokens 0), which shows what sharing costs on such prompts. With a CUDA GPU as well: the model given by --gpu-model (default
openai/gpt-oss-20b, if its weights are on the machine) with the forecaster's real prompt on training
rows from --gpu-data. Its default answer format is votes (K constrained bin digits after the real
prompt): the prompt's thousands of tokens, the policy's log-probs and the backward pass are what a
step costs, and every sample gets a reward. With --gpu-answer-format json the model reasons first:
give it enough --gpu-max-new-tokens, or every completion is truncated, every reward is 0, every
group is dropped and no backward pass runs; such a row is labelled and the script exits 1.

With --cpu-data ROWS (the training rows of the README's CPU search, runs/cross_entropy-topk-0/
training_rows.jsonl): the README's CPU command itself, `train_grpo.py --embedded --answer-format
votes --steps 2 --prompts-per-step 1 --group-size 4 --eval-fraction 0.25 --eval-samples 1`, whose
peak resident memory is what a laptop must hold (every prompt holds two whole kernels, ~3,300
tokens). Measured 2026-12-04 on the 2-core Intel Xeon (24 GiB) the README's figures come from, on
the 9 rows of that search: 2.6 GB at its peak, every run (the training pass, whose activations
and glibc's handling of them lm.checkpoint_mlps, prefix_attention.py and
lm_memory.tensors_back_to_the_system bring down); before them, the same command held 6.2 and 6.3 GB
in two runs. Wall time 76 s against 54 s before (the price of memory handed back to
the system and taken again, lm_memory.py).

Each run is its own process (peak memory and the accelerate state are per process). The first step
is a warm-up and is not counted. Prints one table row per run with the machine name.

    python scripts/bench_grpo.py [--steps 4] [--cpu-data rows.jsonl] [--gpu-model openai/gpt-oss-20b --gpu-data rows.jsonl]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
import train_grpo  # noqa: E402
from runtime import cli  # noqa: E402


def machine():
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return platform.processor() or platform.machine()


def summarise(name, log):
    timed = log[1:] or log  # step 1 includes one-off work (allocator, kernels)
    # A step whose groups were all dropped (equal rewards: no advantage) runs no backward pass:
    # its time is sampling and scoring only.
    trained = [r for r in timed if r["groups_kept"] > 0]
    return {"run": name, "steps": len(timed), "trained_steps": len(trained),
            "step_s": statistics.median(r["step_time_s"] for r in (trained or timed)),
            "peak_gib": max(r["peak_memory_bytes"] for r in log) / 2 ** 30,
            "tokens/step": statistics.mean(r["tokens"] for r in timed),
            "parse_rate": statistics.mean(r["parse_rate"] for r in timed)}


def bench_tiny(steps, folder, forced_sharing=False):
    import tiny_models
    from test_train_grpo import synthetic_rows
    data = synthetic_rows(folder / "rows.jsonl")
    model = tiny_models.tiny_gpt_oss(seed=0)
    tok = tiny_models.tiny_tokenizer()
    args = cli.parse(train_grpo.Args, 
        ["--data", str(data), "--out", str(folder / "tiny"), "--answer-format", "votes",
         "--steps", str(steps), "--lora-rank", "8", "--micro-batch-size", "64", "--save-every", "1000"]
        + (["--share-min-tokens", "0"] if forced_sharing else []))
    result = train_grpo.train(args, prompt_fn=lambda r: tok.encode(f"speedup:{r['candidate_code']}"),
                              model=model, tokenizer=tok)
    return summarise("tiny GPT-OSS, votes, 8x8" + (", prompt shared (forced)" if forced_sharing else ""),
                     result["log"])


README_CPU = ["--embedded", "--reward", "brier", "--answer-format", "votes", "--steps", "2", "--prompts-per-step", "1",
              "--group-size", "4", "--eval-fraction", "0.25", "--eval-samples", "1"]


def bench_readme(args, folder):
    """The README's CPU command on --cpu-data, in this process: its step time and its peak resident
    memory over the whole run (loading, the steps, the held-out evaluation)."""
    import resource
    import time
    targs = cli.parse(train_grpo.Args, ["--data", args.cpu_data, "--out", str(folder / "readme")] + README_CPU)
    t0 = time.perf_counter()
    result = train_grpo.train(targs)
    row = summarise("embedded SmolLM2-135M, the README's CPU command", result["log"])
    row["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2 ** 30
    row["wall_s"] = time.perf_counter() - t0
    return row


def bench_gpu(args, folder):
    if not args.gpu_data:
        print("GPU run skipped: pass --gpu-data (training rows, JSON Lines)", file=sys.stderr)
        return None
    fmt = args.gpu_answer_format
    targs = cli.parse(train_grpo.Args, 
        ["--data", args.gpu_data, "--out", str(folder / "gpu"), "--model", args.gpu_model,
         "--steps", str(args.steps), "--max-new-tokens", str(args.gpu_max_new_tokens),
         "--answer-format", fmt, "--reasoning-effort", args.gpu_reasoning,
         "--save-every", "1000", "--micro-batch-size", "1"])
    try:
        result = train_grpo.train(targs)
    except (ValueError, OSError, torch.cuda.OutOfMemoryError) as e:
        print(f"GPU run with {args.gpu_model} failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return None
    what = "4 vote digits" if fmt == "votes" else f"<= {args.gpu_max_new_tokens} new tokens, {args.gpu_reasoning} reasoning"
    return summarise(f"{args.gpu_model}, {fmt}, 8x8, {what}", result["log"])


def run_in_child(which, args):
    """One run in its own process: the tiny run never sees a GPU, and neither run inherits the
    other's peak memory or accelerate state."""
    env = dict(os.environ)
    if which != "gpu":
        env.update(CUDA_VISIBLE_DEVICES="", ACCELERATE_USE_CPU="true")
    argv = [sys.executable, __file__, "--one", which, "--steps", str(args.steps), "--gpu-model", args.gpu_model,
            "--gpu-max-new-tokens", str(args.gpu_max_new_tokens), "--gpu-answer-format", args.gpu_answer_format,
            "--gpu-reasoning", args.gpu_reasoning] + (["--gpu-data", args.gpu_data] if args.gpu_data else []) \
        + (["--cpu-data", args.cpu_data] if args.cpu_data else [])
    r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if r.returncode != 0 or not r.stdout.strip():
        print(f"{which} run failed (exit {r.returncode})", file=sys.stderr)
        return None
    row = json.loads(r.stdout.strip().splitlines()[-1])
    if row:
        row["machine"] = "CPU: " + machine() if which != "gpu" else machine()
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description="Measure GRPO step time and peak memory.")
    ap.add_argument("--steps", type=int, default=4, help="steps per run, the first not counted (default 4)")
    ap.add_argument("--gpu-model", default="openai/gpt-oss-20b", help="model for the GPU run")
    ap.add_argument("--gpu-data", default=None, help="training rows for the GPU run (JSON Lines; without it no GPU run)")
    ap.add_argument("--gpu-answer-format", choices=("votes", "json"), default="votes",
                    help="votes: 4 constrained digits after the real prompt (default); json: the forecaster's "
                    "reasoned answer (needs thousands of new tokens)")
    ap.add_argument("--gpu-max-new-tokens", type=int, default=4096,
                    help="completion budget of the GPU run with --gpu-answer-format json (default 4096)")
    ap.add_argument("--gpu-reasoning", choices=("low", "medium", "high"), default="low",
                    help="GPT-OSS reasoning effort of the GPU run (default low)")
    ap.add_argument("--cpu-data", default=None, help="training rows for the README's CPU command (JSON Lines: a CPU "
                    "search's training_rows.jsonl; without it that run is skipped)")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    ap.add_argument("--one", choices=("tiny", "tiny-shared", "readme", "gpu"), help=argparse.SUPPRESS)  # a child's single run
    args = ap.parse_args(argv)
    if args.steps < 2:
        print("error: --steps must be >= 2 (the first step is a warm-up)", file=sys.stderr)
        return 2
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            row = (bench_gpu(args, Path(tmp)) if args.one == "gpu" else bench_readme(args, Path(tmp))
                   if args.one == "readme" else bench_tiny(args.steps, Path(tmp), forced_sharing=args.one == "tiny-shared"))
        print(json.dumps(row))
        return 0
    rows = [run_in_child("tiny", args), run_in_child("tiny-shared", args)]
    if args.cpu_data:
        rows.append(run_in_child("readme", args))
    else:
        print("README CPU run skipped: pass --cpu-data (a CPU search's training_rows.jsonl)", file=sys.stderr)
    if torch.cuda.is_available():
        rows.append(run_in_child("gpu", args))
    rows = [r for r in rows if r]
    print(f"\ntorch {torch.__version__}")
    print(f"{'run':<66} {'machine':<40} {'steps':>5} {'trained':>7} {'step s':>8} {'peak GiB':>9} {'tokens/step':>11}")
    for r in rows:
        print(f"{r['run']:<66} {r['machine'][:40]:<40} {r['steps']:>5} {r['trained_steps']:>7} {r['step_s']:>8.3f} "
              f"{r['peak_gib']:>9.2f} {r['tokens/step']:>11.0f}")
    print("trained: timed steps with a backward pass (a step whose groups all got equal rewards has none)")
    print("peak memory: torch.cuda.max_memory_allocated on a GPU, the process's ru_maxrss on CPU")
    for r in rows:
        if "wall_s" in r:
            print(f"{r['run']}: {r['wall_s']:.0f} s in all (loading, 2 steps, the held-out evaluation)")
    untrained = [r["run"] for r in rows if r["trained_steps"] == 0]
    for name in untrained:
        print(f"warning: {name}: no timed step ran a backward pass, so its step time leaves out training "
              "(completions truncated or unparsed: raise --gpu-max-new-tokens or use --gpu-answer-format votes)",
              file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
    return 1 if untrained else 0


if __name__ == "__main__":
    sys.exit(main())
