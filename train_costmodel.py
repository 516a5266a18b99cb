"""train_costmodel.py: train the learned cost model (costmodel.py) on measured rows, in seconds on a CPU.

    python train_costmodel.py --data rows.jsonl --out runs/cm
    python forecaster.py --eval eval_rows.jsonl --costmodel runs/cm --out cm_preds.jsonl
    python metrics.py llm_preds.jsonl cm_preds.jsonl        # the LLM and the cost model side by side

Any training rows will do (dataset.py's schemas): a search's training_rows.jsonl, several
concatenated or given as several --data, the paper's RL pool or an eval set, as JSON Lines files or
by their Hugging Face Hub names (`--data hf:codezakh/gpu-forecasters-rl-training-pool`). Each row's features
are read from its anchor and candidate code, its task and the hardware it names (--hardware for
rows that name none); its label is log2 of its measured speedup. The command prints the
calibration of the model's bin probabilities on held-out rows (costmodel.py: out-of-fold
forecasts, kernels grouped by code), uniform and uncalibrated beside it, and writes the model to
--out (a folder, replaced whole or not at all; its costmodel.json repeats the report).
Rows measured on a CPU carry CPU times (of CPU kernels, or of Triton kernels in its interpreter),
not GPU times: the report says so when they are among the rows.
"""
import json
import sys
import time
from dataclasses import dataclass

from data.dataset import load_rows, source_exists
from data.records import RecordError
from forecast_prompt import HARDWARE_PROFILES, hardware_info, row_hardware
from models.costmodel import MIN_ROWS, CostModel, CostModelError, check_out, labelled
from models.costmodel_features import FEATURE_VERSION
from runtime import cli
from runtime.cli import flag


@dataclass
class Args:
    """Train the learned cost model (gradient-boosted trees on features of the code) that forecasts a
    candidate's speedup bin, calibrated on held-out rows."""
    data: list[str] = flag(None, "training rows: a JSON Lines file (a search's training_rows.jsonl, an eval set) or a "
                           "Hub dataset hf:OWNER/NAME[/CONFIG][:SPLIT] (the paper's RL pool: "
                           "hf:codezakh/gpu-forecasters-rl-training-pool); repeat the flag to pool several",
                           required=True, metavar="ROWS")
    out: str = flag(None, "model folder to write (new, empty, or a cost model folder, which is replaced)",
                    required=True, metavar="DIR")
    hardware: str = flag("a100-80gb", "hardware profile of rows that name none (the paper's); every other row's own "
                         "hardware is a feature", choices=sorted(HARDWARE_PROFILES))
    seed: int = flag(0, "seed of the folds and of the trees' bagging")
    json: bool = flag(False, "print the calibration report as JSON too")


def build_parser():
    """The command line of Args (cli.py): one --flag per field, with its default and help."""
    return cli.parser(Args)


def format_report(report):
    lines = [f"held-out calibration: {report['rows']} rows ({report['distinct_candidates']} distinct candidates), "
             f"{report['folds']}-fold out-of-fold forecasts, kernels grouped by code; each fold's width fitted "
             "on the other folds",
             f"{'':<14}{'acc':>7}{'ece':>7}{'brier':>7}{'crps':>7}{'nll':>7}"]
    for name, s in report["held_out"].items():
        lines.append(f"{name:<14}" + "".join(f"{s[k]:>7.3f}" for k in ("accuracy", "ece", "brier", "crps", "nll")))
    lines.append(f"width sigma = sqrt(a^2 + (b * spread)^2) in log2 speedup: a = {report['a']:.3f}, b = {report['b']:.1f} "
                 f"(mean ensemble spread {report['mean_spread']:.3f}); out-of-fold RMSE of log2 speedup "
                 f"{report['rmse_log2']:.3f}")
    return "\n".join(lines)


def main(argv=None):
    args = cli.parse(Args, argv, gpu=False)
    try:
        check_out(args.out)  # before any work: a bad --out fails at once
        rows = []
        for path in args.data:
            if not source_exists(path):
                raise CostModelError(f"cannot read rows file {path}; pass a JSON Lines file of training rows "
                                     "or a Hub dataset's name (hf:OWNER/NAME)")
            rows += load_rows(path)
        if len(rows) < MIN_ROWS:
            raise CostModelError(f"{', '.join(args.data)} hold {len(rows)} row(s); the cost model needs at least "
                                 f"{MIN_ROWS} to train and calibrate on held-out rows: pass more rows (several "
                                 "searches' training_rows.jsonl, repeating --data)")
        t0 = time.perf_counter()
        default = hardware_info(args.hardware)
        X, y, groups, true_bins = labelled(rows, default, where=", ".join(args.data))
        t_features = time.perf_counter() - t0
        model = CostModel.train(X, y, groups, true_bins, seed=args.seed)
        cpu_rows = sum(row_hardware(r, default)["name"].upper().startswith("CPU") for r in rows)
        model.save(args.out, data=args.data, seed=args.seed, rows=len(rows), cpu_rows=cpu_rows,
                   tasks=sorted({r["pack"] for r in rows}))
    except (CostModelError, RecordError) as e:
        print(f"train_costmodel.py: error: {e}", file=sys.stderr)
        return 2
    rep = model.report
    print(f"cost model (feature version {FEATURE_VERSION}, {len(model.boosters)} LightGBM boosters) trained on "
          f"{len(rows)} rows of {', '.join(sorted({r['pack'] for r in rows}))} in {rep['train_seconds']:.1f} s "
          f"(features {t_features:.1f} s)")
    if cpu_rows:
        print(f"note: {cpu_rows} of the {len(rows)} rows were measured on a CPU: their labels are CPU times on one core "
              "(CPU kernels, or Triton kernels in its interpreter), not GPU times")
    print(format_report(rep))
    print(f"wrote {args.out}/ (costmodel.json, booster*.txt); forecast with: python forecaster.py --eval ROWS.jsonl "
          f"--costmodel {args.out} --out PRED.jsonl")
    if args.json:
        print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
