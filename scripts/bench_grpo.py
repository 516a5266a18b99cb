"""bench_grpo.py: step time and peak memory of train_grpo.py's GRPO step, measured, never estimated.

Always: a random tiny GPT-OSS (2 layers, hidden 64, 4 experts) on CPU with the votes answer format
on a synthetic task (8 prompts x G = 8 samples per step, as the paper). With a CUDA GPU as well: the
model given by --gpu-model (default openai/gpt-oss-20b, if its weights are on the machine) with the
forecaster's real prompt on training rows from --gpu-data, max --gpu-max-new-tokens new tokens.
The first step is a warm-up and is not counted. Prints one table row per run with the machine name.

    python scripts/bench_grpo.py [--steps 4] [--gpu-model openai/gpt-oss-20b --gpu-data rows.jsonl]
"""
import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
import train_grpo  # noqa: E402


def machine():
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    return platform.processor() or platform.machine()


def summarise(name, log):
    timed = log[1:] or log  # step 1 includes one-off work (allocator, kernels)
    return {"run": name, "steps": len(timed),
            "step_s": statistics.median(r["step_time_s"] for r in timed),
            "peak_gib": max(r["peak_memory_bytes"] for r in log) / 2 ** 30,
            "tokens/step": statistics.mean(r["tokens"] for r in timed)}


def bench_tiny(steps, folder):
    import tiny_models
    from test_train_grpo import synthetic_rows
    data = synthetic_rows(folder / "rows.jsonl")
    model = tiny_models.tiny_gpt_oss(seed=0)
    tok = tiny_models.tiny_tokenizer()
    args = train_grpo.build_parser().parse_args(
        ["--data", str(data), "--out", str(folder / "tiny"), "--answer-format", "votes",
         "--steps", str(steps), "--lora-rank", "8", "--micro-batch-size", "64", "--save-every", "1000"])
    result = train_grpo.train(args, prompt_fn=lambda r: tok.encode(f"speedup:{r['candidate_code']}"),
                              model=model, tokenizer=tok)
    return summarise("tiny GPT-OSS, votes, 8x8", result["log"])


def bench_gpu(args, folder):
    if not args.gpu_data:
        print("GPU run skipped: pass --gpu-data (training rows, JSON Lines)", file=sys.stderr)
        return None
    targs = train_grpo.build_parser().parse_args(
        ["--data", args.gpu_data, "--out", str(folder / "gpu"), "--model", args.gpu_model,
         "--steps", str(args.steps), "--max-new-tokens", str(args.gpu_max_new_tokens),
         "--save-every", "1000", "--micro-batch-size", "1"])
    try:
        result = train_grpo.train(targs)
    except (ValueError, OSError, torch.cuda.OutOfMemoryError) as e:
        print(f"GPU run with {args.gpu_model} failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return None
    return summarise(f"{args.gpu_model}, json, 8x8, <= {args.gpu_max_new_tokens} new tokens",
                     result["log"])


def main(argv=None):
    ap = argparse.ArgumentParser(description="Measure GRPO step time and peak memory.")
    ap.add_argument("--steps", type=int, default=4, help="steps per run, the first not counted (default 4)")
    ap.add_argument("--gpu-model", default="openai/gpt-oss-20b", help="model for the GPU run")
    ap.add_argument("--gpu-data", default=None, help="training rows for the GPU run")
    ap.add_argument("--gpu-max-new-tokens", type=int, default=512, help="completion budget of the GPU run")
    ap.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = ap.parse_args(argv)
    if args.steps < 2:
        print("error: --steps must be >= 2 (the first step is a warm-up)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench_tiny(args.steps, Path(tmp))]
        if torch.cuda.is_available():
            rows.append(bench_gpu(args, Path(tmp)))
    rows = [r for r in rows if r]
    print(f"\nmachine: {machine()}   torch {torch.__version__}")
    print(f"{'run':<58} {'steps':>5} {'step s':>8} {'peak GiB':>9} {'tokens/step':>11}")
    for r in rows:
        print(f"{r['run']:<58} {r['steps']:>5} {r['step_s']:>8.3f} {r['peak_gib']:>9.2f} {r['tokens/step']:>11.0f}")
    print("peak memory: torch.cuda.max_memory_allocated on a GPU, the process's ru_maxrss on CPU")
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
