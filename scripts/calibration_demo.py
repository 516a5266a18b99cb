"""calibration_demo.py: does a proper scoring rule in the GRPO reward calibrate the forecaster?

The paper's claim beyond "an LLM can forecast speedups" (its section 6): GRPO whose reward adds a
proper scoring rule to correctness (+Brier, +CRPS) yields better calibrated bin probabilities than
GRPO on correctness alone, at similar accuracy. Calibration needs real uncertainty to be calibrated
about, and a kernel's measured speedup gives one bin, not the distribution it was drawn from. So
this demo builds a synthetic forecasting task whose right answer is a known distribution:

    prompt "L<level> <shape> votes:"  ->  true bin ~ q(level, shape) over the 8 bins
    shapes: sharp {level: 1}, skewed {level: .75, level+1: .25},
            split {level: .5, level+1: .5}, wide {level-1: .25, level: .5, level+1: .25}

The best accuracy any forecaster can reach is the mean probability of the mode (0.69 here). A
policy that puts every vote on the mode reaches it with confidence 1, so its expected calibration
error is 1 - 0.69 = 0.31; a policy that reports q reaches the same accuracy with ECE near 0.

It trains a tiny language model (a Llama of 2 layers, hidden 64, built from a config with a
23-word vocabulary; or the tiny GPT-OSS) three times on the same rows and seeds, once per reward,
through train_grpo.train itself (the votes answer format: K constrained bin digits, the forecast
is the vote histogram), evaluates each on held-out rows of the same task (train_grpo's own
evaluation, scored by metrics.report), and reports per reward the mean and spread over seeds of
accuracy, mean confidence, ECE, Brier, CRPS, NLL and the total-variation distance of the forecast
from q, the ratio of each proper reward's ECE to correctness's, and the incentive: how much more
reward reporting q earns than reporting the mode alone. A reliability diagram puts the three
rewards side by side (plots.plot_reliability_panels). Every number is measured by the run.

Why the votes format: a model that must write 8 probabilities as text cannot learn to in minutes on
a CPU, while K = 4 constrained digits parse from the first step. It also makes correctness's
preference strict: a forecast stated once, deterministically, earns the same correctness whether
it is q or the mode alone (the argmax is the same), but sampled votes that spread over two bins
sometimes outvote the mode, so correctness pays for putting every vote on it. The proper rewards
pay for the spread: +Brier 0.125 per answer on average over this task's kinds, +CRPS an eighth of
that (its score is divided by 7, and only the thresholds between the adjacent bins move).

    python scripts/calibration_demo.py                 # 3 seeds x 3 rewards, minutes on 2 CPU cores
    python scripts/calibration_demo.py --json          # one JSON object keyed by reward
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import bins  # noqa: E402
import cli  # noqa: E402
import plots  # noqa: E402
import train_grpo  # noqa: E402
from dataset import load_predictions  # noqa: E402
from forecast_answer import DIGITS, Forecast  # noqa: E402
from records import read_jsonl  # noqa: E402

REWARDS = train_grpo.REWARDS  # correctness, brier, crps
SHAPES = {  # offset from the level -> probability of that bin
    "sharp": {0: 1.0},
    "skewed": {0: 0.75, 1: 0.25},
    "split": {0: 0.5, 1: 0.5},
    "wide": {-1: 0.25, 0: 0.5, 1: 0.25},
}
LEVELS = (3, 6)  # every bin in reach is an inner bin (a finite speedup interval)
KINDS = tuple((level, shape) for level in LEVELS for shape in SHAPES)
PROMPT_END = "votes:"
VOCAB = ("<pad>", "<eos>", *DIGITS, PROMPT_END, *(f"L{b}" for b in bins.BINS), *SHAPES)
LABELS = {"correctness": "correctness", "brier": "correctness + Brier",
          "crps": "correctness + CRPS"}
SCORES = ("accuracy", "confidence", "ece", "brier", "crps", "nll", "tv")


# ---- the synthetic task: features -> a known distribution over the bins -------------------------

def true_distribution(level, shape):
    """q: the 8 bin probabilities the true bin of a (level, shape) prompt is drawn from."""
    q = np.zeros(bins.N_BINS)
    for offset, p in SHAPES[shape].items():
        q[level + offset - 1] = p
    return q


def prompt_text(level, shape):
    return f"L{level} {shape} {PROMPT_END}"


def make_rows(n, seed):
    """n training rows (train_grpo's schema): a uniformly drawn kind, then its true bin drawn from
    q, stored as the log-centre speedup of that bin so that bins.speedup_to_bin gives it back."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        level, shape = KINDS[rng.integers(len(KINDS))]
        b = int(rng.choice(bins.BINS, p=true_distribution(level, shape)))
        rows.append({"row_id": f"s{seed}-{i}", "pack": "synthetic", "anchor_code": "",
                     "candidate_code": prompt_text(level, shape),
                     "aggregated_speedup": 2.0 ** bins.BIN_LOG2_SPEEDUP[b - 1],
                     "level": level, "shape": shape})
    return rows


def incentive(kind):
    """Mean over the prompt kinds of E_y~q[reward] of reporting q minus that of reporting the mode
    with probability 1: what a reward pays a policy for telling the truth about its uncertainty."""
    def one(probs, level, shape):
        f = Forecast(probs=list(probs), predicted_bin=bins.predicted_bin(probs), raw_sum=1.0)
        q = true_distribution(level, shape)
        return sum(q[y - 1] * train_grpo.reward(f, y, kind) for y in bins.BINS if q[y - 1] > 0)
    gains = []
    for level, shape in KINDS:
        q = true_distribution(level, shape)
        gains.append(one(q, level, shape) - one(np.eye(bins.N_BINS)[np.argmax(q)], level, shape))
    return float(np.mean(gains))


# ---- the tiny policy ----------------------------------------------------------------------------

def tiny_tokenizer():
    """One token per word of VOCAB; the bin digits are single tokens, as the votes format needs."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_model(arch, seed):
    """A random tiny causal LM built from a config (fp32, CPU), deterministic for a seed."""
    torch.manual_seed(seed)
    common = dict(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                  bos_token_id=None)
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(intermediate_size=128, **common))
    else:
        from transformers import GptOssConfig, GptOssForCausalLM
        model = GptOssForCausalLM(GptOssConfig(
            intermediate_size=64, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=32, layer_types=["sliding_attention", "full_attention"], **common))
    # At the default init (std 0.02, hidden 64) the largest logit gap is about 2.5, which caps any
    # vote's probability near 0.3: no policy could be confident. Scaling the output layer lifts it.
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model.eval()


LORA_TARGETS = {"llama": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                "gpt_oss": "q_proj,k_proj,v_proj,o_proj"}  # GPT-OSS adds its experts itself


def train_args(opts, reward, seed, data, out):
    """train_grpo's own command line for one run: the demo trains exactly what a user would."""
    argv = ["--data", str(data), "--out", str(out), "--reward", reward, "--seed", str(seed),
            "--answer-format", "votes", "--votes", str(opts.votes), "--steps", str(opts.steps),
            "--prompts-per-step", str(opts.prompts_per_step), "--group-size", str(opts.group_size),
            "--lr", str(opts.lr), "--lora-rank", "8", "--lora-alpha", "16",
            "--lora-targets", LORA_TARGETS[opts.arch],
            "--micro-batch-size", str(opts.prompts_per_step * opts.group_size),
            "--eval-fraction", str(opts.eval_fraction), "--eval-samples", str(opts.eval_samples),
            "--save-every", str(opts.steps),
            "--no-prefix-cache"]  # a 3-token prompt: sharing its forward only adds passes
    args = cli.parse(train_grpo.Args, argv)
    problem = train_grpo.check_args(args)
    if problem:
        raise ValueError(problem)
    return args


def run_one(opts, reward, seed, data, out):
    """Train one policy with train_grpo.train; returns its held-out scores against the drawn bins
    (metrics.report's accuracy, ECE, Brier, CRPS, NLL) and against q (mean confidence, TV)."""
    tok = tiny_tokenizer()
    result = train_grpo.train(train_args(opts, reward, seed, data, out),
                              prompt_fn=lambda row: tok.encode(row["candidate_code"]),
                              model=tiny_model(opts.arch, seed), tokenizer=tok)
    ev = result["eval"]
    preds = load_predictions(out / "predictions.jsonl")
    kind_of = {r["row_id"]: (r["level"], r["shape"]) for _, r in read_jsonl(data)}
    parsed = [p for p in preds if p["probs"] is not None]
    tv = [0.5 * np.abs(np.asarray(p["probs"]) - true_distribution(*kind_of[p["id"]])).sum()
          for p in parsed]
    confidence = float(np.mean([max(p["probs"]) for p in parsed]))
    return {"accuracy": ev["accuracy"], "confidence": confidence, "ece": ev["ece"],
            "brier": ev["brier"], "crps": ev["crps"], "nll": ev["nll"], "tv": float(np.mean(tv)),
            "parse_rate": ev["parse_rate"]}, preds


# ---- the experiment -----------------------------------------------------------------------------

def mean_std(values):
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def summarise(per_seed):
    """{reward: [scores per seed]} -> {reward: means, "std": stds, "seeds": [...], ECE ratio}."""
    out = {}
    for reward, runs in per_seed.items():
        entry = {k: mean_std([r[k] for r in runs])[0] for k in SCORES}
        entry["std"] = {k: mean_std([r[k] for r in runs])[1] for k in SCORES}
        if reward != "correctness":  # per seed: same rows, same init, only the reward differs
            ratio = mean_std([r["ece"] / c["ece"] for r, c in zip(runs, per_seed["correctness"])])
            entry["ece_ratio_to_correctness"] = {"mean": ratio[0], "std": ratio[1]}
        entry["incentive"] = incentive(reward)
        entry["seeds"] = runs
        out[reward] = entry
    return out


def machine():
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        name = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                     if line.startswith("model name")), name)
    threads = torch.get_num_threads()
    return f"{name}, {os.cpu_count()} cores, torch on {threads} thread(s), no GPU used"


def run_demo(opts):
    from tqdm import tqdm
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per_seed, preds = {r: [] for r in REWARDS}, {r: [] for r in REWARDS}
    bar = tqdm(total=opts.seeds * len(REWARDS), desc="runs (seed x reward)", position=0)
    for seed in range(opts.seeds):
        data = out / f"seed{seed}" / "rows.jsonl"
        data.parent.mkdir()
        data.write_text("".join(json.dumps(r) + "\n" for r in make_rows(opts.rows, seed)))
        for reward in REWARDS:
            t = time.perf_counter()
            scores, p = run_one(opts, reward, seed, data, data.parent / reward)
            seconds = round(time.perf_counter() - t, 1)
            per_seed[reward].append(dict(scores, seed=seed, seconds=seconds))
            preds[reward] += p
            bar.update()
    bar.close()
    summary = summarise(per_seed)
    plot = out / "reliability.png"
    pooled = f"{opts.seeds} seed{'s' if opts.seeds > 1 else ''} pooled"
    plots.plot_reliability_panels(
        {f"GRPO reward: {LABELS[r]} ({pooled})": preds[r] for r in REWARDS}, plot)
    meta = {"machine": machine(), "wall_seconds": round(time.perf_counter() - t0, 1),
            "config": vars(opts), "plot": str(plot)}
    (out / "results.json").write_text(json.dumps({"rewards": summary, **meta}, indent=1))
    return summary, meta


def print_table(summary, meta, opts):
    n_eval = round(opts.rows * opts.eval_fraction)
    print(f"{opts.arch} (2 layers, hidden 64), votes K={opts.votes}, {opts.steps} GRPO steps x "
          f"{opts.prompts_per_step} prompts x G={opts.group_size}; {opts.seeds} seeds; held-out "
          f"{n_eval} rows x {opts.eval_samples} forecasts per seed")
    print(f"{meta['machine']}; {meta['wall_seconds'] / 60:.1f} min")
    print(f"{'reward':12}" + "".join(f"{k:>16}" for k in SCORES))
    for reward, e in summary.items():
        cells = [f"{e[k]:.3f}" + (f" ± {e['std'][k]:.3f}" if e["std"][k] is not None else "")
                 for k in SCORES]
        print(f"{reward:12}" + "".join(f"{c:>16}" for c in cells))
    for reward, e in summary.items():
        ratio = e.get("ece_ratio_to_correctness")
        if ratio:
            spread = f" ± {ratio['std']:.2f}" if ratio["std"] is not None else ""
            print(f"ECE {reward} / ECE correctness: {ratio['mean']:.2f}{spread} "
                  f"(ratio per seed, mean ± std)")
    print("incentive, E[reward | report q] - E[reward | report the mode alone]: " +
          ", ".join(f"{r} {e['incentive']:+.4f}" for r, e in summary.items()))
    print(f"reliability diagram: {meta['plot']}")


def build_parser():
    ap = argparse.ArgumentParser(description="Trains a tiny forecaster with GRPO (train_grpo.py) "
                                 "once per reward on a synthetic task whose true bin is drawn from "
                                 "a known distribution, and compares calibration: correctness vs "
                                 "+Brier vs +CRPS, mean and spread over seeds.")
    a = ap.add_argument
    a("--out", default="runs/calibration_demo", help="output folder, must not hold a previous "
      "demo (default runs/calibration_demo): results.json, reliability.png, seed*/<reward>/ runs")
    a("--seeds", type=int, default=3, help="independent repetitions (seeds 0..N-1: rows, model "
      "init, sampling); each trains all three rewards (default 3)")
    a("--steps", type=int, default=600, help="GRPO steps per run (default 600)")
    a("--prompts-per-step", type=int, default=4, help="rows per step (default 4)")
    a("--group-size", type=int, default=16, help="G, sampled answers per row (default 16)")
    a("--votes", type=int, default=4, help="K, bin votes per answer; the forecast's probabilities "
      "are in steps of 1/K (default 4, which the task's probabilities are multiples of)")
    a("--lr", type=float, default=1e-3, help="AdamW learning rate of the LoRA adapter "
      "(default 1e-3)")
    a("--rows", type=int, default=800, help="synthetic rows per seed (default 800)")
    a("--eval-fraction", type=float, default=0.25, help="share of the rows held out (default 0.25)")
    a("--eval-samples", type=int, default=4, help="forecasts per held-out row (default 4)")
    a("--arch", choices=("llama", "gpt_oss"), default="llama", help="the tiny model: a Llama "
      "(default, faster on CPU) or a GPT-OSS with 4 experts, both built from a config")
    a("--json", action="store_true", help="print the results as one JSON object keyed by reward "
      "instead of the table")
    return ap


def check(opts):
    """One line naming the problem and the fix, before anything is written."""
    for name in ("seeds", "steps", "prompts_per_step", "eval_samples"):
        if getattr(opts, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if opts.group_size < 2:
        return "--group-size must be >= 2: GRPO compares the answers of one prompt"
    if opts.votes < 2:
        return ("--votes must be >= 2: with one vote every forecast is one-hot, and all three "
                "rewards rank answers alike")
    if not 0 < opts.eval_fraction < 1:
        return "--eval-fraction must be in (0, 1): the demo scores held-out rows"
    if round(opts.rows * opts.eval_fraction) < 1 or round(opts.rows * (1 - opts.eval_fraction)) < 1:
        return f"--rows {opts.rows} leaves no training or no held-out row; give more rows"
    out = Path(opts.out)
    if out.exists() and any(out.iterdir()):
        return f"--out {out} is not empty (a previous demo?); delete it or choose another --out"
    return None


def main(argv=None):
    opts = build_parser().parse_args(argv)
    problem = check(opts)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # tiny tensors gain nothing from a second thread, and on a busy 2-core machine waking the
    # pool costs more than the op
    torch.set_num_threads(1)
    try:
        summary, meta = run_demo(opts)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.json:
        print(json.dumps(summary))
    else:
        print_table(summary, meta, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
