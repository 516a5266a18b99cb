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
23-word vocabulary; or the tiny GPT-OSS) once per reward setting on the same rows and seeds,
through train_grpo.train itself (the votes answer format: K constrained bin digits, the forecast
is the vote histogram), evaluates each on held-out rows of the same task (train_grpo's own
evaluation, scored by metrics.report), and reports per setting the mean and spread over seeds of
accuracy, mean confidence, ECE, Brier, CRPS, NLL and the total-variation distance of the forecast
from q, the ratio of each proper reward's ECE to correctness's, and the incentive: how much more
reward reporting q earns than reporting the mode alone. A reliability diagram puts the settings
side by side (plots.plot_reliability_panels). Every number is measured by the run.

The settings (--rewards): correctness, +Brier and +CRPS as the paper weighs them (w = 1 in
correctness + w * (1 - score)), and +CRPS with w = 7 ("crps:7", train_grpo's --score-weight 7):
the ranked probability score without its /7, which pays for the truth about as much as Brier does.

Why the votes format: a model that must write 8 probabilities as text cannot learn to in minutes on
a CPU, while K = 4 constrained digits parse from the first step. It also makes correctness's
preference strict: a forecast stated once, deterministically, earns the same correctness whether
it is q or the mode alone (the argmax is the same), but sampled votes that spread over two bins
sometimes outvote the mode, so correctness pays for putting every vote on it. The proper rewards
pay for the spread: +Brier 0.125 per answer on average over this task's kinds, +CRPS an eighth of
that (its score is divided by 7, and only the thresholds between the adjacent bins move), too
little to be learned against the noise of the correctness term in a few hundred steps; at w = 7 it
pays 0.109.

    python scripts/calibration_demo.py                 # 3 seeds x 4 settings, minutes on 2 CPU cores
    python scripts/calibration_demo.py --json          # one JSON object keyed by setting
    python scripts/calibration_demo.py --rewards correctness,brier,crps   # the paper's weights only
"""
import argparse
import contextlib
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, wait
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import bins  # noqa: E402
import train_grpo  # noqa: E402
from data.dataset import load_predictions  # noqa: E402
from data.records import read_jsonl  # noqa: E402
from forecast_answer import DIGITS, Forecast  # noqa: E402
from forecast_prompt import cpu_model  # noqa: E402
from runtime import cli  # noqa: E402

DEFAULT_SETTINGS = "correctness,brier,crps,crps:7"
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
LABELS = {"correctness": "correctness", "brier": "Brier", "crps": "CRPS"}
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


def incentive(kind, weight=1.0):
    """Mean over the prompt kinds of E_y~q[reward] of reporting q minus that of reporting the mode
    with probability 1: what a reward pays a policy for telling the truth about its uncertainty."""
    def one(probs, level, shape):
        f = Forecast(probs=list(probs), predicted_bin=bins.predicted_bin(probs), raw_sum=1.0)
        q = true_distribution(level, shape)
        return sum(q[y - 1] * train_grpo.reward(f, y, kind, weight=weight)
                   for y in bins.BINS if q[y - 1] > 0)
    gains = []
    for level, shape in KINDS:
        q = true_distribution(level, shape)
        gains.append(one(q, level, shape) - one(np.eye(bins.N_BINS)[np.argmax(q)], level, shape))
    return float(np.mean(gains))


# ---- the reward settings: a reward and the weight of its proper-score term ------------------------

def parse_settings(text):
    """"correctness,brier,crps:7" -> [("correctness", 1.0), ("brier", 1.0), ("crps", 7.0)]; a
    ValueError names the bad item."""
    settings = []
    for item in text.split(","):
        reward, _, weight = item.strip().partition(":")
        if reward not in train_grpo.REWARDS:
            raise ValueError(f"--rewards: unknown reward {reward!r} in {item!r}; choose from "
                             f"{', '.join(train_grpo.REWARDS)}, each optionally :WEIGHT")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"--rewards: {item!r}: the weight after ':' must be a number") from None
        if not w > 0 or (reward == "correctness" and w != 1):
            raise ValueError(f"--rewards: {item!r}: the weight of a proper score must be > 0 "
                             "(correctness has none)")
        settings.append((reward, w))
    if "correctness" not in [r for r, _ in settings]:
        raise ValueError("--rewards must include correctness: the ECE ratios compare against it")
    if len(set(settings)) < len(settings):
        raise ValueError(f"--rewards {text}: a setting is repeated")
    return settings


def setting_name(reward, weight):
    """The key of a setting in the results: its reward, with ":w" when w is not the paper's 1."""
    return reward if weight == 1 else f"{reward}:{weight:g}"


def setting_label(reward, weight):
    if reward == "correctness":
        return "correctness"
    if weight == 1:
        return f"correctness + {LABELS[reward]} (the paper's)"
    return f"correctness + {weight:g} x (1 - {LABELS[reward]})"


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
    import torch
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


def train_args(opts, reward, weight, seed, data, out):
    """train_grpo's own command line for one run: the demo trains exactly what a user would."""
    argv = ["--data", str(data), "--out", str(out), "--reward", reward, "--score-weight", f"{weight:g}",
            "--seed", str(seed),
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


def run_one(opts, reward, weight, seed, data, out):
    """Train one policy with train_grpo.train; returns its held-out scores against the drawn bins
    (metrics.report's accuracy, ECE, Brier, CRPS, NLL) and against q (mean confidence, overall and
    per shape, to set beside q's mode probability; TV), and
    its held-out forecasts. One torch thread: tiny tensors gain nothing from a second, and the
    demo's --jobs processes share the cores."""
    import torch
    torch.set_num_threads(1)
    t0, cpu0 = time.perf_counter(), time.process_time()
    tok = tiny_tokenizer()
    result = train_grpo.train(train_args(opts, reward, weight, seed, data, out),
                              prompt_fn=lambda row: tok.encode(row["candidate_code"]),
                              model=tiny_model(opts.arch, seed), tokenizer=tok, progress=False)
    ev = result["eval"]
    preds = load_predictions(out / "predictions.jsonl")
    kind_of = {r["row_id"]: (r["level"], r["shape"]) for _, r in read_jsonl(data)}
    parsed = [p for p in preds if p["probs"] is not None]
    tv = [0.5 * np.abs(np.asarray(p["probs"]) - true_distribution(*kind_of[p["id"]])).sum()
          for p in parsed]
    confidence = float(np.mean([max(p["probs"]) for p in parsed]))
    by_shape = {shape: float(np.mean([max(p["probs"]) for p in parsed if kind_of[p["id"]][1] == shape]))
                for shape in SHAPES if any(kind_of[p["id"]][1] == shape for p in parsed)}
    return {"accuracy": ev["accuracy"], "confidence": confidence, "confidence_by_shape": by_shape,
            "ece": ev["ece"],
            "brier": ev["brier"], "crps": ev["crps"], "nll": ev["nll"], "tv": float(np.mean(tv)),
            "parse_rate": ev["parse_rate"], "seed": seed,
            "seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(time.process_time() - cpu0, 1)}, preds


def run_quietly(*run):
    """run_one in a worker process, its progress bar silenced: several runs' bars would garble
    the terminal, and the demo's own bar counts the runs."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
        return run_one(*run)


# ---- the experiment -----------------------------------------------------------------------------

def mean_std(values):
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def summarise(settings, per_seed):
    """{setting: [scores per seed]} -> {setting: means, "std": stds, "seeds": [...], ECE ratio}."""
    out = {}
    for reward, weight in settings:
        name = setting_name(reward, weight)
        runs = per_seed[name]
        entry = {"reward": reward, "score_weight": weight, "label": setting_label(reward, weight)}
        entry.update({k: mean_std([r[k] for r in runs])[0] for k in SCORES})
        entry["std"] = {k: mean_std([r[k] for r in runs])[1] for k in SCORES}
        entry["confidence_by_shape"] = {  # mean over the seeds whose held-out rows had the shape
            shape: float(np.mean([r["confidence_by_shape"][shape] for r in runs
                                  if shape in r["confidence_by_shape"]]))
            for shape in SHAPES if any(shape in r["confidence_by_shape"] for r in runs)}
        if reward != "correctness":  # per seed: same rows, same init, only the reward differs
            pairs = list(zip(runs, per_seed["correctness"]))
            ratios = [r["ece"] / c["ece"] for r, c in pairs if c["ece"] > 0]  # a perfect ECE has no ratio
            entry["ece_ratio_to_correctness"] = dict(zip(("mean", "std"), mean_std(ratios))) if ratios else None
            entry["seeds_with_lower_ece"] = sum(r["ece"] < c["ece"] for r, c in pairs)
        entry["incentive"] = incentive(reward, weight)
        entry["seeds"] = runs
        out[name] = entry
    return out


def machine():
    load = f", load average {os.getloadavg()[0]:.1f} at the end" if hasattr(os, "getloadavg") else ""
    return f"{cpu_model()}, {os.cpu_count()} cores{load}, torch on 1 thread per run, no GPU used"


def worker_context(arch):
    """Where the --jobs processes come from: forked from a server process that imported what a run
    needs (this file, the model's code, peft; ~6 s of CPU) and never ran torch, so that each
    process does not import them again; a forked copy of a process that ran torch can hang, so
    never from this one. Fresh interpreters (spawn) where fork is missing."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # (as a script, this file reaches the server as its main module, and needs no name here)
    ctx.set_forkserver_preload(([__spec__.name] if __spec__ else [])
                               + [f"transformers.models.{arch}.modeling_{arch}", "peft",
                                  "transformers.tokenization_utils_fast"])
    return ctx


PROBE_STEPS = 4  # GRPO steps the start-up estimate times (the first warms up and is left out)


def expected_duration(opts, n_runs, folder):
    """(seconds, the start-up line): the runs' GRPO steps and evaluations, at the pace of a few
    steps of the tiny model trained here now (PROBE_STEPS, a run of its own in `folder`), --jobs
    runs at a time over the machine's cores beside its other load."""
    import torch
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_rows(max(8, opts.prompts_per_step * 2), 0)))
    probe = argparse.Namespace(**{**vars(opts), "steps": PROBE_STEPS, "eval_fraction": 0.0})
    tok, threads = tiny_tokenizer(), torch.get_num_threads()
    torch.set_num_threads(1)  # as each run has it
    t0 = time.perf_counter()
    try:
        log = train_grpo.train(train_args(probe, "brier", 1.0, 0, data, folder / "run"), prompt_fn=lambda row: tok.encode(row["candidate_code"]),
                               model=tiny_model(opts.arch, 0), tokenizer=tok, progress=False)["log"]
    finally:
        torch.set_num_threads(threads)
    step_s = float(np.median([r["step_time_s"] for r in log[1:]]))
    setup_s = time.perf_counter() - t0 - sum(r["step_time_s"] for r in log)  # a run's model, adapter, optimiser
    try:
        load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        load, cores = 0.0, os.cpu_count() or 1
    # the probe ran alone beside the load; the runs run --jobs at a time beside it
    crowding = max(1.0, (min(opts.jobs, n_runs) + load) / cores) / max(1.0, (1 + load) / cores)
    n_eval = round(opts.rows * opts.eval_fraction)
    # an evaluation samples its rows' forecasts, as a step samples its group's: a third of a step's work
    eval_s = step_s / 3 * n_eval * opts.eval_samples / (opts.prompts_per_step * opts.group_size)
    rounds = math.ceil(n_runs / opts.jobs)
    total = rounds * (setup_s + opts.steps * step_s + eval_s) * crowding
    return total, (f"expected duration: about {cli.duration(total)} here ({n_runs} runs of {opts.steps} GRPO steps, "
                   f"{opts.jobs} at a time, at ~{1000 * step_s:.0f} ms a step and {setup_s:.1f} s to set a run up, "
                   f"as {PROBE_STEPS} steps took here now"
                   + (f", x{crowding:.1f} for {opts.jobs} runs beside the load now ({load:.1f} on {cores} cores)"
                      if crowding > 1.05 else "") + "); the idle 2-core VM took 157 s for the defaults")


def steps_done(folders):
    """GRPO steps done so far by the runs writing into `folders` (a line of log.jsonl each)."""
    done = 0
    for f in folders:
        try:
            done += (f / "log.jsonl").read_bytes().count(b"\n")
        except OSError:
            pass  # not started yet
    return done


def run_demo(opts):
    """Every (seed, setting) run, --jobs at a time, each in its own process (or all in this one
    with --jobs 1: the numbers are the same, every run seeds itself); then the summary and plot."""
    import tempfile
    settings = parse_settings(opts.rewards)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs = []
    for seed in range(opts.seeds):
        data = out / f"seed{seed}" / "rows.jsonl"
        data.parent.mkdir()
        data.write_text("".join(json.dumps(r) + "\n" for r in make_rows(opts.rows, seed)))
        runs += [(opts, reward, weight, seed, data,
                  data.parent / setting_name(reward, weight).replace(":", "-w"))
                 for reward, weight in settings]
    with tempfile.TemporaryDirectory(prefix="calibration-probe-") as probe:
        expected, words = expected_duration(opts, len(runs), Path(probe))
    print(words, file=sys.stderr, flush=True)
    folders = [run[-1] for run in runs]
    bar = cli.Progress("calibration demo", len(runs) * opts.steps, "GRPO steps", expected_s=expected,
                       count=lambda: steps_done(folders))
    try:
        if opts.jobs == 1:
            results = []
            for run in runs:
                results.append(run_one(*run))
                bar.refresh()
        else:
            with ProcessPoolExecutor(opts.jobs, mp_context=worker_context(opts.arch)) as pool:
                futures = [pool.submit(run_quietly, *run) for run in runs]
                while wait(futures, timeout=1.0).not_done:  # the bar follows the runs' logs meanwhile
                    bar.refresh()
                results = [f.result() for f in futures]
    finally:
        bar.close()
    per_seed, preds = {}, {}
    for (_, reward, weight, *_), (scores, p) in zip(runs, results):
        name = setting_name(reward, weight)
        per_seed.setdefault(name, []).append(scores)
        preds.setdefault(name, []).extend(p)
    summary = summarise(settings, per_seed)
    plot = out / "reliability.png"
    pooled = f"{opts.seeds} seed{'s' if opts.seeds > 1 else ''} pooled"
    from data import plots  # matplotlib only when the plot is drawn
    plots.plot_reliability_panels(
        {f"{setting_label(*s)}\n({pooled})": preds[setting_name(*s)] for s in settings}, plot)
    meta = {"machine": machine(), "wall_seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(sum(r[0]["cpu_seconds"] for r in results), 1),
            "config": vars(opts), "plot": str(plot)}
    (out / "results.json").write_text(json.dumps({"rewards": summary, **meta}, indent=1))
    return summary, meta


def print_table(summary, meta, opts):
    n_eval = round(opts.rows * opts.eval_fraction)
    print(f"{opts.arch} (2 layers, hidden 64), votes K={opts.votes}, {opts.steps} GRPO steps x "
          f"{opts.prompts_per_step} prompts x G={opts.group_size}; {opts.seeds} seeds; held-out "
          f"{n_eval} rows x {opts.eval_samples} forecasts per seed")
    print(f"{meta['machine']}; {meta['wall_seconds'] / 60:.1f} min wall, {opts.jobs} run(s) at a "
          f"time; the runs used {meta['cpu_seconds'] / 60:.1f} min of CPU")
    for name, e in summary.items():
        print(f"  {name:12} {e['label']}")
    print(f"{'setting':12}" + "".join(f"{k:>16}" for k in SCORES))
    for name, e in summary.items():
        cells = [f"{e[k]:.3f}" + (f" ± {e['std'][k]:.3f}" if e["std"][k] is not None else "")
                 for k in SCORES]
        print(f"{name:12}" + "".join(f"{c:>16}" for c in cells))
    for name, e in summary.items():
        ratio = e.get("ece_ratio_to_correctness")
        if ratio:
            spread = f" ± {ratio['std']:.2f}" if ratio["std"] is not None else ""
            print(f"ECE {name} / ECE correctness: {ratio['mean']:.2f}{spread} (ratio per seed, "
                  f"mean ± std; lower in {e['seeds_with_lower_ece']} of {opts.seeds} seeds)")
    print("mean confidence by shape (q's mode probability: " +
          ", ".join(f"{shape} {max(offsets.values()):.2f}" for shape, offsets in SHAPES.items()) + ")")
    for name, e in summary.items():
        print(f"  {name:12}" + ", ".join(f"{shape} {c:.2f}" for shape, c in e["confidence_by_shape"].items()))
    print("incentive, E[reward | report q] - E[reward | report the mode alone]: " +
          ", ".join(f"{r} {e['incentive']:+.4f}" for r, e in summary.items()))
    print(f"reliability diagram: {meta['plot']}")


def build_parser():
    ap = argparse.ArgumentParser(description="Trains a tiny forecaster with GRPO (train_grpo.py) "
                                 "once per reward setting on a synthetic task whose true bin is "
                                 "drawn from a known distribution, and compares calibration: "
                                 "correctness vs +Brier vs +CRPS (at the paper's weight and at 7), "
                                 "mean and spread over seeds.")
    a = ap.add_argument
    a("--out", default="runs/calibration_demo", help="output folder, must not hold a previous "
      "demo (default runs/calibration_demo): results.json, reliability.png, seed*/<setting>/ runs")
    a("--rewards", default=DEFAULT_SETTINGS, help="the reward settings, comma-separated: "
      "correctness, brier or crps, each optionally :W, the weight w of its proper-score term in "
      "correctness + w * (1 - score) (train_grpo's --score-weight; 1, the paper's, when omitted); "
      f"must include correctness (default {DEFAULT_SETTINGS})")
    a("--seeds", type=int, default=3, help="independent repetitions (seeds 0..N-1: rows, model "
      "init, sampling); each trains every setting (default 3)")
    a("--jobs", type=int, default=2, help="runs trained at once, each in its own process on one "
      "torch thread (default 2; 1 runs them all in this process)")
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
    a("--json", action="store_true", help="print the results as one JSON object "
      "keyed by setting instead of the table")
    return ap


def check(opts):
    """One line naming the problem and the fix, before anything is written."""
    for name in ("seeds", "steps", "prompts_per_step", "eval_samples", "jobs"):
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
    try:
        parse_settings(opts.rewards)
    except ValueError as e:
        return str(e)
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
