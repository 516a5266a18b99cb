"""bench_costmodel.py: the learned cost model against the embedded LLM and against no gate, measured.

Two questions, on the machine at hand, in one run:

1. Does the default CPU search find more with the cost model? For each --seeds seed it runs the
   CPU search of the Triton space (`python search.py --task T --seed S --space triton`: catalog
   mutator, budget 8, topk gate) three ways, each a fresh process as a user runs it:
       costmodel     --forecaster costmodel (refit online on the search's own measurements)
       embedded LLM  --forecaster llm: the embedded SmolLM2 forecasts, in --embedded-dtype auto
       no gate       --gate none: every mutation measured, 4 per parent
   and reports the best speedup each found after its 8 measurements. The three arms share one
   fresh measurement cache (under --out): a kernel two arms both measure gets the same label, so
   the arms differ by their choices, not by the machine's noise; what a measurement costs is
   taken from the measurements that were not cached. What a forecast costs, against a
   measurement, is reported for the embedded LLM (its compute per forecast, model load not
   included) and for the cost model (its refit and forecast per forecast).
2. How good are the forecasts? Every kernel the searches measured (their training rows, one row
   per distinct kernel) is forecast by the cost model, the embedded LLM and the uniform forecast,
   side by side: accuracy, ECE, Brier, CRPS and AURC (metrics.py's definitions), with train and
   forecast time per row. The cost model is scored by grouped K-fold cross-validation (each fold's
   rows forecast by a model trained on the other folds only); the embedded LLM forecasts every row
   (its forecasts in the searches are reused from the shared forecast cache, with the compute time
   they took when made). The searches of question 1 measure few distinct kernels of one task, so
   ungated searches of --row-tasks (default cross_entropy, fp8_quant and trimul, --row-budget 16
   measurements each) add rows; --rows adds other rows (e.g. earlier searches' training_rows.jsonl).

On a CPU every label is the CPU time of a kernel run by the Triton interpreter, not a GPU time: the
tables say so. The machine, its load average before and after, and whether its CPU computes bf16
natively (AMX, AVX512-BF16) are printed with the tables.

    python scripts/bench_costmodel.py [--task cross_entropy] [--seeds 0,1,2] [--out runs/bench_costmodel]
                                      [--row-tasks cross_entropy,fp8_quant,trimul] [--row-budget 16]
                                      [--rows MORE.jsonl] [--folds 5] [--json]

Rerunning with the same --out resumes: finished searches are answered from their event logs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench_grpo import machine  # noqa: E402  (this script's folder is on sys.path)

ARMS = (("costmodel", ["--forecaster", "costmodel"]), ("embedded LLM", ["--forecaster", "llm"]),
        ("no gate", ["--gate", "none"]))
# The figures of docs/COSTMODEL.md are the Triton space's, interpreted on a CPU; scripts/bench_figure4.py
# runs the CPU's own kernels (search.py --space cpu).
SPACE = ["--space", "triton"]
CPU_NOTE = "labels: CPU times of Triton kernels run by its interpreter, not GPU times"


def cpu_bf16():
    import torch
    found = [name for name, q in (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
             if getattr(torch.cpu, q, lambda: False)()]
    return ", ".join(found) or "none"


def run_searches(task, seeds, out, env):
    """{(arm, seed): summary + costs} of every search, each in a fresh process."""
    results = {}
    for seed in seeds:
        for arm, flags in ARMS:
            folder = out / "search" / f"{arm.replace(' ', '_')}-{seed}"
            argv = [sys.executable, "search.py", "--task", task, "--seed", str(seed), "--out", str(folder),
                    "--no-progress", *SPACE, *flags]
            t0 = time.perf_counter()
            proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"error: {' '.join(argv[1:])} failed ({proc.returncode}): {proc.stderr.strip()[-600:]}")
            s = json.loads((folder / "summary.json").read_text())
            events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
            fresh = [e["payload"]["seconds"] for e in events
                     if e["kind"] == "measurement" and not e["payload"]["measurement"].get("cached")]
            views = [v for e in events if e["kind"] == "forecast" for v in e["payload"]["forecasts"]]
            results[(arm, seed)] = dict(summary=s, wall_s=wall, folder=str(folder), fresh_measurement_s=fresh,
                                        forecast_s=[v["record"]["seconds"] for v in views],
                                        forecast_call_s=[e["payload"]["seconds"] for e in events
                                                         if e["kind"] == "forecast"],
                                        deferred=sum(v["deferred"] for v in views))
            print(f"  seed {seed}, {arm}: best {s['best_speedup']:.3f}x after {s['measurements']} measurements, "
                  f"{s['forecasts']} forecasts, {wall:.0f} s", file=sys.stderr, flush=True)
    return results


def run_row_searches(tasks, budget, out, env):
    """Ungated searches (--gate none: every mutation measured) of more tasks, for more measured rows."""
    folders = []
    for task in tasks:
        folder = out / "rows" / task
        argv = [sys.executable, "search.py", "--task", task, "--gate", "none", "--budget", str(budget), "--seed", "100",
                "--out", str(folder), "--no-progress", *SPACE]
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: {' '.join(argv[1:])} failed ({proc.returncode}): {proc.stderr.strip()[-600:]}")
        s = json.loads((folder / "summary.json").read_text())
        print(f"  rows of {task}: {s['training_rows']} measured kernels in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
        folders.append(folder)
    return folders


def pooled_rows(paths):
    """One row per distinct candidate code (the seed once), in the order first seen."""
    from data.dataset import load_rows
    rows, seen = [], set()
    for path in paths:
        for r in load_rows(path):
            key = r["candidate_code"].strip()
            if key not in seen:
                seen.add(key)
                rows.append(r)
    return rows


def costmodel_cv(rows, folds, seed=0):
    """Grouped K-fold: each row forecast by a cost model trained on the other folds. Returns
    (forecasts, train seconds per training row, forecast seconds per row)."""
    import numpy as np

    from forecast_prompt import hardware_info, row_hardware
    from models.costmodel import CostModel, CostModelForecaster, fold_of, labelled
    cpu = hardware_info("cpu")
    X, y, groups, true_bins = labelled(rows, cpu)
    fold, k = fold_of(groups, seed, folds)
    out, train_s, trained_rows, forecast_s = [None] * len(rows), 0.0, 0, 0.0
    for f in range(k):
        test = np.flatnonzero(fold == f)
        train = fold != f
        t0 = time.perf_counter()
        model = CostModel.train(X[train], y[train], groups[train], true_bins[train], seed=seed)
        train_s += time.perf_counter() - t0
        trained_rows += int(train.sum())
        fc = CostModelForecaster(model, hardware=cpu, name="costmodel (cross-validated)")
        t0 = time.perf_counter()
        fs = fc.forecast_pairs([(rows[i]["pack"], rows[i]["anchor_code"], rows[i]["candidate_code"]) for i in test],
                               hardware=[row_hardware(rows[i], cpu) for i in test])
        forecast_s += time.perf_counter() - t0
        for i, fcast in zip(test, fs):
            out[i] = fcast
    return out, train_s / trained_rows, forecast_s / len(rows)


def llm_forecasts(rows, dtype):
    """The embedded SmolLM2's forecasts of every row (the shared cache reuses the searches' ones)."""
    from forecast_prompt import hardware_info, row_hardware
    from forecaster import Forecaster
    from models.forecaster_backends import embedded_backend
    cpu = hardware_info("cpu")
    from data.records import cache_dir
    fc = Forecaster(embedded_backend(dtype=dtype), hardware=cpu, cache_dir=cache_dir("forecasts"))  # the bench's cache
    out = []
    for i, r in enumerate(rows):
        out += fc.forecast_pairs([(r["pack"], r["anchor_code"], r["candidate_code"])], hardware=[row_hardware(r, cpu)])
        print(f"  embedded LLM: row {i + 1}/{len(rows)}", file=sys.stderr, flush=True)
    return out, str(fc.backend.model.dtype).removeprefix("torch.")


def scores_of(rows, forecasts, path):
    """metrics.scores of the forecasts, through prediction rows written to `path` (metrics.py reads them too)."""
    import metrics
    from data.dataset import load_predictions, prediction_row
    with open(path, "w") as f:
        for r, fc in zip(rows, forecasts):
            f.write(json.dumps(prediction_row(r, fc, 0)) + "\n")
    loaded = load_predictions(path)
    sr = metrics.speedup_recovered_rows(loaded)
    return dict(metrics.scores(loaded), speedup_recovered=sr["mean"], speedup_recovered_random=sr["random_mean"])


def main(argv=None):
    ap = argparse.ArgumentParser(description="The learned cost model against the embedded LLM and the uniform "
                                             "forecast (scores on measured rows) and against the embedded LLM and "
                                             "no gate (the default CPU search's best speedup), on this machine.")
    ap.add_argument("--task", default="cross_entropy", help="the searches' task (default cross_entropy)")
    ap.add_argument("--seeds", default="0,1,2", help="search seeds, comma-separated (default 0,1,2)")
    ap.add_argument("--out", default="runs/bench_costmodel", help="searches, caches and prediction rows (default "
                                                                  "runs/bench_costmodel; rerun to resume)")
    ap.add_argument("--rows", action="append", default=[], help="more measured rows to score on (JSON Lines)")
    ap.add_argument("--row-tasks", default="cross_entropy,fp8_quant,trimul",
                    help="tasks of the ungated searches run for more rows to score on (default cross_entropy,"
                         "fp8_quant,trimul: those with hand-written variants; '' for none)")
    ap.add_argument("--row-budget", type=int, default=16, help="measurements of each of those searches (default 16)")
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds of the cost model (default 5)")
    ap.add_argument("--embedded-dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="the embedded LLM's dtype, in its searches and on the rows (default auto)")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        print(f"error: --seeds must be integers separated by commas, got {args.seeds!r}", file=sys.stderr)
        return 2
    from tasks import TASK_NAMES
    unknown = [t for t in [args.task, *args.row_tasks.split(",")] if t and t not in TASK_NAMES]
    if args.folds < 2 or not seeds or args.row_budget < 1 or unknown:
        print(f"error: --folds must be at least 2, --seeds name at least one seed, --row-budget be at least 1, and "
              f"the tasks be among {', '.join(TASK_NAMES)}" + (f" (not {', '.join(unknown)})" if unknown else ""),
              file=sys.stderr)
        return 2
    import torch
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GPU_FORECASTERS_CACHE=str(out / "cache"))  # fresh caches, shared by the arms
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    os.environ["GPU_FORECASTERS_CACHE"] = env["GPU_FORECASTERS_CACHE"]  # this process's LLM forecasts too
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    print(f"searches: {args.task}, seeds {seeds}, three arms each ...", file=sys.stderr)
    searches = run_searches(args.task, seeds, out, env)
    row_tasks = [t for t in args.row_tasks.split(",") if t]
    print(f"more rows: ungated searches of {', '.join(row_tasks) or 'no task'}, {args.row_budget} measurements "
          "each ...", file=sys.stderr)
    more = run_row_searches(row_tasks, args.row_budget, out, env)
    paths = [Path(r["folder"]) / "training_rows.jsonl" for r in searches.values()] + \
        [f / "training_rows.jsonl" for f in more] + [Path(p) for p in args.rows]
    rows = pooled_rows(paths)
    print(f"rows: {len(rows)} distinct measured kernels; cost model {args.folds}-fold ...", file=sys.stderr)
    cm, cm_train_s, cm_forecast_s = costmodel_cv(rows, args.folds)
    print("embedded LLM on the same rows ...", file=sys.stderr)
    llm, dtype = llm_forecasts(rows, args.embedded_dtype)
    from forecast_answer import Forecast
    uniform = [Forecast(probs=[1 / 8] * 8, predicted_bin=1, readout=None, model="uniform") for _ in rows]
    table = {"costmodel": dict(scores_of(rows, cm, out / "preds_costmodel.jsonl"), train_s_per_row=cm_train_s,
                               forecast_s_per_row=cm_forecast_s),
             "embedded LLM": dict(scores_of(rows, llm, out / "preds_llm.jsonl"), train_s_per_row=None,
                                  forecast_s_per_row=statistics.mean(f.seconds for f in llm)),
             "uniform": dict(scores_of(rows, uniform, out / "preds_uniform.jsonl"), train_s_per_row=0.0,
                             forecast_s_per_row=0.0)}
    load_after = os.getloadavg()

    on_cpu = not torch.cuda.is_available()
    print(f"\nmachine: {machine()}; bf16 natively: {cpu_bf16()}; embedded LLM in {dtype}; torch {torch.__version__}; "
          f"load average (1, 5, 15 min) before {', '.join(f'{x:.1f}' for x in load_before)}, after "
          f"{', '.join(f'{x:.1f}' for x in load_after)}; {time.perf_counter() - t_start:.0f} s in all")
    per_task = ", ".join(f"{t} {sum(r['pack'] == t for r in rows)}" for t in sorted({r["pack"] for r in rows}))
    per_bin = " ".join(str(sum(r["true_bin"] == b for r in rows)) for b in range(1, 9))
    print(f"\nForecasts of {len(rows)} measured kernels ({per_task}; every distinct kernel the searches measured, "
          f"the seeds' included; rows per bin 1..8: {per_bin}){'; ' + CPU_NOTE if on_cpu else ''}. Cost model: "
          f"{args.folds}-fold cross-validation, kernels grouped by code; uniform's predicted bin is bin 1 (the lowest "
          "on ties).\n")
    print("| forecaster | n | accuracy | ECE | Brier | CRPS | AURC | speedup recovered | train s / row | forecast s / row |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda x, d=3: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for name, s in table.items():
        print(f"| {name} | {s['n']} | {fmt(s['accuracy'])} | {fmt(s['ece'])} | {fmt(s['brier'])} | {fmt(s['crps'])} "
              f"| {fmt(s['aurc']['maxprob'])} | {fmt(s['speedup_recovered'])} | {fmt(s['train_s_per_row'], 4)} "
              f"| {fmt(s['forecast_s_per_row'], 4)} |")
    print(f"\nspeedup recovered: metrics.py's, per task the best measured speedup among the top-ranked rows over the "
          f"best of all, mean over budgets of 1 to 50% and over tasks; a random ranking recovers "
          f"{fmt(table['uniform']['speedup_recovered_random'])} (exact expectation). AURC over max-prob confidence.")

    fresh = [x for r in searches.values() for x in r["fresh_measurement_s"]]
    per_measurement = statistics.mean(fresh) if fresh else None
    print(f"\nThe default CPU search ({args.task}, budget {searches[(ARMS[0][0], seeds[0])]['summary']['measurements']} "
          f"measurements): best speedup over the reference after its measurements"
          f"{' (' + CPU_NOTE + ')' if on_cpu else ''}.\n")
    print("| seed | " + " | ".join(arm for arm, _ in ARMS) + " |")
    print("|---|" + "---|" * len(ARMS))
    best = {arm: [searches[(arm, s)]["summary"]["best_speedup"] for s in seeds] for arm, _ in ARMS}
    for i, s in enumerate(seeds):
        print(f"| {s} | " + " | ".join(f"{best[arm][i]:.3f}x" for arm, _ in ARMS) + " |")
    print("| mean | " + " | ".join(f"{statistics.mean(best[arm]):.3f}x" for arm, _ in ARMS) + " |")
    print("| best is the seed | " + " | ".join(
        f"{sum(searches[(arm, s)]['summary']['best_node'] == 'seed' for s in seeds)} of {len(seeds)}"
        for arm, _ in ARMS) + " |")
    print("| seed's own speedup (mean) | " + " | ".join(
        f"{statistics.mean(searches[(arm, s)]['summary']['seed_speedup'] for s in seeds):.3f}x" for arm, _ in ARMS) + " |")
    print("| forecasts (deferred) | " + " | ".join(
        f"{sum(searches[(arm, s)]['summary']['forecasts'] for s in seeds)} "
        f"({sum(searches[(arm, s)]['deferred'] for s in seeds)})" for arm, _ in ARMS) + " |")
    costs = {}
    for arm in ("embedded LLM", "costmodel"):
        per = [x for s in seeds for x in (searches[(arm, s)]["forecast_call_s"] if arm == "costmodel"
                                          else searches[(arm, s)]["forecast_s"])]
        n = sum(searches[(arm, s)]["summary"]["forecasts"] for s in seeds)
        costs[arm] = (sum(per) / n) if n and arm == "costmodel" else (statistics.mean(per) if per else None)
    if per_measurement:
        print(f"\nOne measurement (not cached, {len(fresh)} of them): {per_measurement:.2f} s. One forecast: embedded "
              f"LLM {fmt(costs['embedded LLM'], 2)} s compute ({dtype}, model load not included), "
              f"= {fmt(costs['embedded LLM'] and costs['embedded LLM'] / per_measurement, 2)} measurements; cost model "
              f"{fmt(costs['costmodel'], 4)} s (its refits included) = "
              f"{fmt(costs['costmodel'] and costs['costmodel'] / per_measurement, 4)} measurements.")
    print(f"\nprediction rows: {out}/preds_*.jsonl (python metrics.py {out}/preds_costmodel.jsonl "
          f"{out}/preds_llm.jsonl {out}/preds_uniform.jsonl)")
    if args.json:
        print(json.dumps({"machine": machine(), "bf16_native": cpu_bf16(), "embedded_dtype": dtype,
                          "rows": len(rows), "rows_per_task": per_task, "rows_per_bin": per_bin, "forecasts": table, "best_speedup": best,
                          "measurement_s": per_measurement, "forecast_s": costs,
                          "load_before": load_before, "load_after": load_after}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
