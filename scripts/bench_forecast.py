"""bench_forecast.py: what a forecast costs against the measurement it would replace, measured.

The paper's gate pays only when a forecast is much cheaper than a measurement. On the machine at
hand, side by side in one run:
  1. eight candidates of one task (cross_entropy's hand-written variants and `# tune:` edits of
     them, against the seed kernel) are forecast by the CLI exactly as a user runs it,
         python forecaster.py --eval ROWS --out PRED --embedded --readout logits --no-cache ...
     once per setting, each in a fresh process (model load included in its wall time):
         one at a time, no prefix reuse     --batch-size 1 --no-prefix-cache
         batched 8, no prefix reuse         --batch-size 8 --no-prefix-cache
         one at a time, prefix reuse        --batch-size 1   (the embedded model's default)
         batched 8, prefix reuse            --batch-size 8
     and each setting's probabilities are compared with the first's. With --repeats N every setting
     runs N times, the settings interleaved (a round runs each once, in a rotated order), and the
     medians are reported: wall time, and the CPU seconds the process used (user + system), which
     other jobs on a shared machine disturb far less. --passive-wait lets idle threads sleep
     (OMP_WAIT_POLICY=PASSIVE) instead of spinning, so that CPU seconds count work only;
  2. measure.py times some of the same candidates (no cache): the cost of one measurement;
  3. with --grpo, train_grpo.py runs GRPO steps (embedded model, G = 4, votes) with and without
     --no-prefix-cache; the median step time after the first step is compared.
It also prints the arithmetic floor of prefix reuse for these prompts (flop_floor): the flops of
the forwards with reuse over those without, below which no implementation of reuse can go.
A forecast's cost is wall time / 8 (model load included) and its compute alone (the CLI's
forecast time / 8); every ratio is against the mean wall time of one measurement. The machine's
load average is printed before and after: other jobs sharing it inflate and scatter wall times. The embedded
model's converted copy (forecaster_backends.embedded_backend) is made before any timing. The rows' labels
are placeholders: forecasts ignore them, and GRPO only uses them to score its samples. The rows
name the paper's A100 as their hardware (a row is shown the hardware it names).

    python scripts/bench_forecast.py [--repeats 3] [--batch-sizes 1,8] [--measurements 2] [--grpo]
                                     [--embedded-dtype auto|float32|bfloat16] [--json]
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench_grpo import machine  # noqa: E402  (this script's folder is on sys.path)

from data.records import read_jsonl  # noqa: E402
from models.forecaster_backends import EMBEDDED_DTYPES, embedded_dtype  # noqa: E402

TASK = "cross_entropy"
HARDWARE = "NVIDIA A100-SXM4-80GB"  # the rows' hardware (see the docstring)
SETTINGS = (("one at a time, no prefix reuse", ["--batch-size", "1", "--no-prefix-cache"]),
            ("batched 8, no prefix reuse", ["--batch-size", "8", "--no-prefix-cache"]),
            ("one at a time, prefix reuse", ["--batch-size", "1"]),
            ("batched 8, prefix reuse", ["--batch-size", "8"]))


def candidates(n=8):
    """The task's variants, then `# tune:` edits of them, until there are n distinct sources."""
    import mutators
    from tasks import variant_sources
    variants = list(variant_sources(TASK).values())
    out = list(variants)
    for code in variants:
        for name, (value, choices) in mutators.tunables(code).items():
            for c in choices:
                if c != value and len(out) < n:
                    out.append(mutators.set_tunable(code, name, c))
    return out[:n]


def write_rows(path, codes):
    from tasks import seed_source
    labels = [0.6, 1.1, 2.4, 0.8]  # placeholders (see the docstring)
    with open(path, "w") as f:
        for i, code in enumerate(codes):
            f.write(json.dumps(dict(row_id=f"b{i}", pack=TASK, anchor_code=seed_source(TASK), candidate_code=code,
                                    aggregated_speedup=labels[i % len(labels)], relative_bin=None,
                                    hardware=HARDWARE, pair_type="pair", source_id="bench")) + "\n")
    return path


def child_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cli(argv, env):
    """(wall s, CPU s, stderr) of one command in a fresh process."""
    t0, c0 = time.perf_counter(), child_cpu_s()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, child_cpu_s() - c0
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(argv[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return wall, cpu, proc.stderr


def bench_forecasts(rows, folder, env, settings, repeats, dtype):
    """Every setting `repeats` times, interleaved; per setting the medians and each run's figures."""
    runs = {name: [] for name, _ in settings}
    for k in range(repeats):
        for name, flags in settings[k % len(settings):] + settings[:k % len(settings)]:
            pred = folder / f"pred{len(runs[name])}_{len(flags)}_{flags[1]}.jsonl"
            pred.unlink(missing_ok=True)
            wall, cpu, err = run_cli(["forecaster.py", "--eval", str(rows), "--out", str(pred), "--embedded",
                                      "--readout", "logits", "--no-cache", "--embedded-dtype", dtype, *flags], env)
            said = re.search(r"model load ([\d.]+) s, forecasts ([\d.]+) s", err)
            preds = [p for _, p in read_jsonl(pred)]
            runs[name].append(dict(wall_s=wall, cpu_s=cpu, load_s=float(said.group(1)),
                                   forecast_s=float(said.group(2)), n=len(preds), probs=[p["probs"] for p in preds]))
            print(f"  {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
    first = runs[settings[0][0]][0]["probs"]
    results = []
    for name, flags in settings:
        rs = runs[name]
        diff = max(abs(a - b) for r in rs for pa, pb in zip(first, r.pop("probs")) for a, b in zip(pa, pb))
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "load_s", "forecast_s")}
        results.append(dict(setting=name, flags=" ".join(flags), n=rs[0]["n"], runs=rs, max_prob_diff=diff, **med))
    return results


def flop_floor(backend, codes):
    """The least fraction of the forwards' arithmetic that prefix reuse can leave, for these
    prompts: (floor, prompt token counts, shared prefix tokens). Both settings run every token of
    a prompt through the same layers; reuse runs the shared prefix once instead of once per
    candidate, and nothing else. A forward costs 2 x (the layers' matrix weights) flops per token
    (the read-out's vocabulary projection is one position, negligible) and 4 x heads x head_dim x
    layers per (query, key) pair of causal attention. No implementation of reuse can go below this
    ratio of the compute; model load and start-up, the same in both settings, only raise it."""
    from forecast_prompt import build_messages, hardware_profile, shared_messages
    from forecaster import ANSWER_PREFIX
    from tasks import seed_source
    hw = hardware_profile(HARDWARE)  # what the rows name (write_rows), so what the CLI shows the model
    rows = [backend.answer_prompt(build_messages(TASK, seed_source(TASK), c, hw), "", ANSWER_PREFIX) for c in codes]
    shared = backend.answer_prompt(shared_messages(TASK, seed_source(TASK), hw), None, "")
    p = len((backend._shared_prefixes(rows, shared) or [[]])[0])  # what the backend itself reuses
    cfg = backend.model.config
    per_token = 2 * sum(w.numel() for w in backend.model.model.layers.parameters() if w.dim() == 2)
    per_pair = 4 * cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads) \
        * cfg.num_hidden_layers

    def forward(new, cached=0):  # flops of `new` tokens after `cached` ones
        return per_token * new + per_pair * (new * cached + new * (new + 1) / 2)
    no_reuse = sum(forward(len(r)) for r in rows)
    reuse = forward(p) + sum(forward(len(r) - p, p) for r in rows)
    return reuse / no_reuse, [len(r) for r in rows], p


def bench_measurements(codes, n):
    import measure
    walls = []
    for code in codes[:n]:
        t0 = time.perf_counter()
        m = measure.measure(TASK, code, use_cache=False)
        walls.append(time.perf_counter() - t0)
        print(f"  measurement: {m.status}, {walls[-1]:.1f} s", file=sys.stderr, flush=True)
    return walls


def bench_grpo(rows, folder, env, steps):
    out = {}
    for name, flags in (("no prefix sharing", ["--no-prefix-cache"]), ("prompt shared by its group", [])):
        run = folder / f"grpo{len(out)}"
        run_cli(["train_grpo.py", "--data", str(rows), "--out", str(run), "--embedded", "--reward", "brier",
                 "--answer-format", "votes", "--steps", str(steps), "--prompts-per-step", "1",
                 "--group-size", "4", "--save-every", "1000", *flags], env)
        log = [r for _, r in read_jsonl(run / "log.jsonl")]
        out[name] = dict(step_s=statistics.median(r["step_time_s"] for r in log[1:]),
                         groups_kept=[r["groups_kept"] for r in log])
        print(f"  GRPO, {name}: {out[name]['step_s']:.1f} s/step", file=sys.stderr, flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="Cost of a forecast (with and without prefix reuse and "
                                             "batching) against the cost of a measurement, on this machine.")
    ap.add_argument("--measurements", type=int, default=2, help="candidates measured to time a measurement (default 2)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each forecast setting, interleaved; medians "
                                                           "are reported (default 1)")
    ap.add_argument("--batch-sizes", default="1,8", help="the settings' batch sizes: 1, 8 or 1,8 (default 1,8)")
    ap.add_argument("--passive-wait", action="store_true", help="idle threads of the timed processes sleep "
                    "(OMP_WAIT_POLICY=PASSIVE) instead of spinning: CPU seconds then count work only")
    ap.add_argument("--grpo", action="store_true", help="also time GRPO steps (embedded model, G = 4) with "
                                                        "and without prompt sharing")
    ap.add_argument("--grpo-steps", type=int, default=3, help="GRPO steps per run, the first not counted (default 3)")
    ap.add_argument("--embedded-dtype", choices=EMBEDDED_DTYPES, default="auto",
                    help="the embedded model's dtype in every forecast run (forecaster.py's flag; default auto)")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args(argv)
    sizes = args.batch_sizes.split(",")
    if args.measurements < 1 or args.grpo_steps < 2 or args.repeats < 1 or not set(sizes) <= {"1", "8"}:
        print("error: --measurements and --repeats must be >= 1, --grpo-steps >= 2 (the first step is a "
              "warm-up), --batch-sizes 1, 8 or 1,8", file=sys.stderr)
        return 2
    settings = [(name, flags) for name, flags in SETTINGS if flags[1] in sizes]
    import torch
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")  # the CPU stand-in for a GPU, as search.py uses it
    if args.passive_wait:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # the embedded model's converted copy is made once, before anything is timed (a first use
        # ever pays ~1 min for it; the forecast and measurement caches are off in every run)
        from models import forecaster_backends
        backend = forecaster_backends.embedded_backend()
        codes = candidates()
        floor, lengths, shared = flop_floor(backend, codes)
        del backend
        rows = write_rows(folder / "rows.jsonl", codes)
        print(f"forecasting {len(codes)} {TASK} candidates per setting ...", file=sys.stderr)
        forecasts = bench_forecasts(rows, folder, env, settings, args.repeats, args.embedded_dtype)
        print("measuring ...", file=sys.stderr)
        walls = bench_measurements(codes, args.measurements)
        grpo = bench_grpo(rows, folder, env, args.grpo_steps) if args.grpo else None
    m = statistics.mean(walls)
    load_after = os.getloadavg()
    print(f"\nmachine: {machine()}   torch {torch.__version__}   load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.1f}' for x in load_before)}, after {', '.join(f'{x:.1f}' for x in load_after)}"
          f"{'   idle threads sleep (OMP_WAIT_POLICY=PASSIVE)' if args.passive_wait else ''}")
    print(f"one measurement ({TASK}, measure.py, no cache): {m:.2f} s (mean of {len(walls)})")
    print(f"{len(codes)} forecasts, embedded SmolLM2-135M in {str(embedded_dtype(args.embedded_dtype))[6:]}, "
          "logits read-out, forecaster.py --eval in a fresh process"
          f" (medians of {args.repeats} interleaved runs):")
    print(f"{'setting':<32} {'wall s':>7} {'CPU s':>7} {'load s':>7} {'per forecast s':>15} {'/ measurement':>14} "
          f"{'compute only':>13} {'vs no reuse':>12} {'CPU vs':>7} {'max |dp|':>9}")
    base = forecasts[0]
    for r in forecasts:
        per, compute = r["wall_s"] / r["n"], r["forecast_s"] / r["n"]
        print(f"{r['setting']:<32} {r['wall_s']:>7.1f} {r['cpu_s']:>7.1f} {r['load_s']:>7.1f} {per:>15.2f} "
              f"{per / m:>14.2f} {compute / m:>13.2f} {r['wall_s'] / base['wall_s']:>12.2f} "
              f"{r['cpu_s'] / base['cpu_s']:>7.2f} {r['max_prob_diff']:>9.1e}")
    print("per forecast = wall / n (model load included); compute only = forecast time / n, over one "
          f"measurement; vs no reuse, CPU vs = wall and CPU seconds over those of {base['setting']!r}")
    reuse = next((r for r in forecasts if r["setting"] == "one at a time, prefix reuse"), None)
    print(f"prompts of {min(lengths)} to {max(lengths)} tokens ({sum(lengths)} in all), of which the first {shared} "
          f"are shared: the arithmetic floor of prefix reuse (flops of the forwards, reuse / no reuse) is "
          f"{floor:.2f}; with this run's start-up and model load ({base['wall_s'] - base['forecast_s']:.1f} s of "
          f"{base['wall_s']:.1f} s) added to both, {1 - base['forecast_s'] / base['wall_s'] * (1 - floor):.2f}")
    if reuse and base["setting"] == "one at a time, no prefix reuse":
        ratio = reuse["wall_s"] / base["wall_s"]
        print(f"target: 8 forecasts with prefix reuse (the default) take <= 0.6 of their wall time with "
              f"--no-prefix-cache, probabilities within 0.02: {ratio:.2f} (CPU {reuse['cpu_s'] / base['cpu_s']:.2f}), "
              f"max |dp| {reuse['max_prob_diff']:.1e}: {'met' if ratio <= 0.6 and reuse['max_prob_diff'] <= 0.02 else 'NOT met'}")
    if grpo:
        a, b = grpo["no prefix sharing"], grpo["prompt shared by its group"]
        print(f"GRPO step (embedded, votes, 1 prompt x G=4), median after the first: no sharing "
              f"{a['step_s']:.1f} s, shared {b['step_s']:.1f} s, ratio {b['step_s'] / a['step_s']:.2f} "
              f"(groups kept per step: {a['groups_kept']} / {b['groups_kept']})")
    if args.json:
        print(json.dumps({"machine": machine(), "measurement_s": walls, "forecasts": forecasts, "grpo": grpo,
                          "prompt_tokens": lengths, "shared_prefix_tokens": shared, "flop_floor": floor}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
