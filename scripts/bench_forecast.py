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
     and each setting's probabilities are compared with the first's;
  2. measure.py times some of the same candidates (no cache): the cost of one measurement;
  3. with --grpo, train_grpo.py runs GRPO steps (embedded model, G = 4, votes) with and without
     --no-prefix-cache; the median step time after the first step is compared.
A forecast's cost is wall time / 8 (model load included) and its compute alone (the CLI's
forecast time / 8); every ratio is against the mean wall time of one measurement. The embedded
model's converted copy (forecaster_backends.embedded_backend) is made before any timing. The rows' labels
are placeholders: forecasts ignore them, and GRPO only uses them to score its samples. The rows
name the paper's A100 as their hardware (a row is shown the hardware it names).

    python scripts/bench_forecast.py [--measurements 2] [--grpo] [--json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench_grpo import machine  # noqa: E402  (this script's folder is on sys.path)
from records import read_jsonl  # noqa: E402

TASK = "cross_entropy"
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
                                    hardware="NVIDIA A100-SXM4-80GB", pair_type="pair", source_id="bench")) + "\n")
    return path


def run_cli(argv, env):
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(argv[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return wall, proc.stderr


def bench_forecasts(rows, folder, env):
    results = []
    for name, flags in SETTINGS:
        pred = folder / f"pred{len(results)}.jsonl"
        wall, err = run_cli(["forecaster.py", "--eval", str(rows), "--out", str(pred), "--embedded",
                             "--readout", "logits", "--no-cache", *flags], env)
        said = re.search(r"model load ([\d.]+) s, forecasts ([\d.]+) s", err)
        preds = [p for _, p in read_jsonl(pred)]
        results.append(dict(setting=name, flags=" ".join(flags) or "(default)", n=len(preds), wall_s=wall,
                            load_s=float(said.group(1)), forecast_s=float(said.group(2)),
                            probs=[p["probs"] for p in preds]))
        print(f"  {name}: {wall:.1f} s", file=sys.stderr, flush=True)
    first = results[0]["probs"]
    for r in results:
        r["max_prob_diff"] = max(abs(a - b) for pa, pb in zip(first, r.pop("probs")) for a, b in zip(pa, pb))
    return results


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
    ap.add_argument("--grpo", action="store_true", help="also time GRPO steps (embedded model, G = 4) with "
                                                        "and without prompt sharing")
    ap.add_argument("--grpo-steps", type=int, default=3, help="GRPO steps per run, the first not counted (default 3)")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args(argv)
    if args.measurements < 1 or args.grpo_steps < 2:
        print("error: --measurements must be >= 1 and --grpo-steps >= 2 (the first step is a warm-up)",
              file=sys.stderr)
        return 2
    import torch
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")  # the CPU stand-in for a GPU, as search.py uses it
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # the embedded model's converted copy is made once, before anything is timed (a first use
        # ever pays ~1 min for it; the forecast and measurement caches are off in every run)
        import forecaster_backends
        forecaster_backends.embedded_backend()
        codes = candidates()
        rows = write_rows(folder / "rows.jsonl", codes)
        print(f"forecasting {len(codes)} {TASK} candidates per setting ...", file=sys.stderr)
        forecasts = bench_forecasts(rows, folder, env)
        print("measuring ...", file=sys.stderr)
        walls = bench_measurements(codes, args.measurements)
        grpo = bench_grpo(rows, folder, env, args.grpo_steps) if args.grpo else None
    m = statistics.mean(walls)
    print(f"\nmachine: {machine()}   torch {torch.__version__}")
    print(f"one measurement ({TASK}, measure.py, no cache): {m:.2f} s (mean of {len(walls)})")
    print(f"{len(codes)} forecasts, embedded SmolLM2-135M, logits read-out, forecaster.py --eval in a fresh process:")
    print(f"{'setting':<32} {'wall s':>7} {'load s':>7} {'per forecast s':>15} {'/ measurement':>14} "
          f"{'compute only':>13} {'vs no reuse':>12} {'max |dp|':>9}")
    base = next(r for r in forecasts if r["setting"] == "one at a time, no prefix reuse")
    for r in forecasts:
        per, compute = r["wall_s"] / r["n"], r["forecast_s"] / r["n"]
        print(f"{r['setting']:<32} {r['wall_s']:>7.1f} {r['load_s']:>7.1f} {per:>15.2f} {per / m:>14.2f} "
              f"{compute / m:>13.2f} {r['wall_s'] / base['wall_s']:>12.2f} {r['max_prob_diff']:>9.1e}")
    print("per forecast = wall / n (model load included); compute only = forecast time / n, over one "
          "measurement; vs no reuse = wall over the wall of the first setting (the embedded model's "
          "default batch size without prefix reuse: --no-prefix-cache)")
    if grpo:
        a, b = grpo["no prefix sharing"], grpo["prompt shared by its group"]
        print(f"GRPO step (embedded, votes, 1 prompt x G=4), median after the first: no sharing "
              f"{a['step_s']:.1f} s, shared {b['step_s']:.1f} s, ratio {b['step_s'] / a['step_s']:.2f} "
              f"(groups kept per step: {a['groups_kept']} / {b['groups_kept']})")
    if args.json:
        print(json.dumps({"machine": machine(), "measurement_s": walls, "forecasts": forecasts, "grpo": grpo}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
