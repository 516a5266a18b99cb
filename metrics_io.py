"""metrics_io.py: prediction files in, tables and JSON out (the command line of metrics.py).

metrics.py holds the mathematics; this module holds the records and the command line:
- load_predictions reads our prediction rows and the paper's published format (docs/PAPER.md §10:
  `bin_probabilities` as a list of {bin, p}, `parse_failed`, joined with the eval-set rows on
  `comparison_id`), detecting the format per line, and turns bad input into a MetricsInputError
  that names the file, the line and the fix;
- main() is `python metrics.py PREDICTIONS.jsonl [--rows ROWS.jsonl] [--plots DIR] [--json]`.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from metrics import BINS, N_BINS, forecaster_name, group_by, report, speedup_to_bin

# ---- reading prediction files ----------------------------------------------------------------
# One normalised row per forecast, whichever format it came from:
#   id, task, model, readout, repeat, probs (8 floats summing to 1, or None on a parse failure),
#   parse_failed, parse_error, stated_bin, predicted_bin (the bin scored), raw_sum, true_bin,
#   true_speedup (None when only the bin is known), where ("file:line").

class MetricsInputError(ValueError):
    """A prediction or eval-set file cannot be scored; the message names the file, line and fix."""


def _fail(where, problem):
    raise MetricsInputError(f"{where}: {problem}")


def _read_jsonl(path):
    """[(line_number, object)] for every non-blank line of a JSON Lines file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsInputError(f"{path}: cannot read the file ({e}); check the path") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            _fail(f"{path}:{i}", f"not valid JSON ({e.msg}); fix or delete this line")
        if not isinstance(obj, dict):
            _fail(f"{path}:{i}", "expected one JSON object per line")
        out.append((i, obj))
    return out


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bin_field(value, where, field):
    if not _is_number(value) or value != int(value) or not 1 <= value <= N_BINS:
        _fail(where, f"{field} must be an integer bin in 1..{N_BINS}, got {value!r}")
    return int(value)


def _probs_field(values, where, field):
    """(probs summing to 1, raw sum) from a list of 8 numbers; MetricsInputError if unusable."""
    if not isinstance(values, list) or len(values) != N_BINS or not all(map(_is_number, values)):
        _fail(where, f"{field} must be a list of {N_BINS} finite numbers, got {values!r}")
    if any(v < 0 for v in values):
        _fail(where, f"{field} has a negative probability: {values}")
    raw = float(sum(values))
    if not math.isfinite(raw):
        _fail(where, f"{field} sums to infinity: {values}")
    if raw <= 0:
        _fail(where, f"{field} is all zeros; a parser must mark such an answer parse_failed")
    return [v / raw for v in values], raw


def _paper_probs(items, where):
    """The paper's bin_probabilities, a list of {bin, p}, as 8 numbers in bin order."""
    if not isinstance(items, list) or not all(isinstance(d, dict) and "bin" in d and "p" in d
                                              for d in items):
        _fail(where, "bin_probabilities must be a list of {\"bin\": 1..8, \"p\": number}")
    by_bin = {}
    for d in items:
        b = _bin_field(d["bin"], where, "bin_probabilities bin")
        if b in by_bin:
            _fail(where, f"bin_probabilities lists bin {b} twice")
        by_bin[b] = d["p"]
    if sorted(by_bin) != list(BINS):
        _fail(where, f"bin_probabilities must give each of bins 1..{N_BINS}, got {sorted(by_bin)}")
    return _probs_field([by_bin[b] for b in BINS], where, "bin_probabilities")


def _truth(obj, where, speedup_key, bin_key, fix):
    """(true_bin, true_speedup) from a row holding either or both."""
    s, b = obj.get(speedup_key), obj.get(bin_key)
    if s is None and b is None:
        _fail(where, f"missing field {speedup_key!r} or {bin_key!r}; {fix}")
    if s is not None:
        if not _is_number(s) or s <= 0:
            _fail(where, f"{speedup_key} must be a finite number > 0, got {s!r}")
        s = float(s)
    if b is not None:
        b = _bin_field(b, where, bin_key)
        if s is not None and speedup_to_bin(s) != b:
            _fail(where, f"{bin_key} {b} disagrees with {speedup_key} {s} (bin {speedup_to_bin(s)})")
    return (b if b is not None else speedup_to_bin(s)), s


def _row(where, *, rid, task, model, readout, repeat, probs, raw_sum, failed, error, stated,
         truth, bin_rule):
    if not isinstance(task, str) or not task:
        _fail(where, "missing field 'task' (or 'pack'): the task this forecast is for")
    if repeat is not None and (not _is_number(repeat) or repeat != int(repeat)):
        _fail(where, f"repeat must be an integer or null, got {repeat!r}")
    if failed:
        probs = raw_sum = predicted = None
    else:
        predicted = int(np.argmax(probs)) + 1
        if bin_rule == "stated" and stated is not None:
            predicted = stated
    return {"id": rid, "task": task, "model": str(model), "readout": readout,
            "repeat": None if repeat is None else int(repeat), "probs": probs,
            "parse_failed": bool(failed), "parse_error": error if failed else None,
            "stated_bin": stated, "predicted_bin": predicted,
            "raw_sum": None if raw_sum is None else float(raw_sum),
            "true_bin": truth[0], "true_speedup": truth[1], "where": where}


def _failed_flag(obj, where):
    failed = obj.get("parse_failed", False)
    if not isinstance(failed, bool):
        _fail(where, f"parse_failed must be true or false, got {failed!r}")
    return failed


def _our_row(obj, where, bin_rule):
    failed = _failed_flag(obj, where)
    probs = raw = stated = None
    if not failed:
        if obj.get("probs") is None:
            _fail(where, "missing field 'probs' (8 probabilities); set parse_failed: true if the "
                         "answer could not be parsed")
        probs, raw = _probs_field(obj["probs"], where, "probs")
        if _is_number(obj.get("raw_sum")):
            raw = obj["raw_sum"]  # the parser's sum before it renormalised
        if obj.get("stated_bin") is not None:
            stated = _bin_field(obj["stated_bin"], where, "stated_bin")
    truth = _truth(obj, where, "true_speedup", "true_bin", "our prediction rows carry the label")
    return _row(where, rid=obj.get("id", where), task=obj.get("task"),
                model=obj.get("model", "unknown"), readout=obj.get("readout"),
                repeat=obj.get("repeat"), probs=probs, raw_sum=raw, failed=failed,
                error=obj.get("parse_error"), stated=stated, truth=truth, bin_rule=bin_rule)


def _paper_row(obj, where, eval_rows, rows_path, bin_rule):
    cid = obj.get("comparison_id")
    if cid is None:
        _fail(where, "missing field 'comparison_id' (paper-format prediction row)")
    failed = _failed_flag(obj, where)
    probs = raw = stated = None
    if not failed:  # a row the paper marked parse_failed is a failure whatever else it holds
        if obj.get("bin_probabilities") is None:
            _fail(where, "missing field 'bin_probabilities'; or mark the row parse_failed: true")
        probs, raw = _paper_probs(obj["bin_probabilities"], where)
        if _is_number(obj.get("raw_probability_sum")):
            raw = obj["raw_probability_sum"]
        if obj.get("predicted_bin") is not None:
            stated = _bin_field(obj["predicted_bin"], where, "predicted_bin")
    task = obj.get("pack")
    if obj.get("true_bin") is not None or obj.get("aggregated_speedup") is not None:
        truth = _truth(obj, where, "aggregated_speedup", "true_bin", "")
    elif eval_rows is None:
        _fail(where, "paper-format row without true_bin; pass the eval-set rows with --rows")
    elif cid not in eval_rows:
        _fail(where, f"comparison_id {cid!r} is not in {rows_path}; pass the matching eval set")
    else:
        ev_where, ev = eval_rows[cid]
        truth = _truth(ev, ev_where, "aggregated_speedup", "true_bin", "eval rows carry the label")
        task = task or ev.get("pack")
    return _row(where, rid=cid, task=task, model=obj.get("surrogate_label", "unknown"),
                readout=None, repeat=obj.get("repeat"), probs=probs, raw_sum=raw, failed=failed,
                error=obj.get("parse_error"), stated=stated, truth=truth, bin_rule=bin_rule)


def load_predictions(path, rows_path=None, bin_rule="argmax"):
    """Read a predictions file (ours or the paper's format, detected per line) into normalised rows.

    rows_path: the paper's eval-set rows, joined on comparison_id for true_bin, aggregated_speedup
    and pack. bin_rule: "argmax" (default) or "stated" (see the module docstring). Raises
    MetricsInputError naming the file and line for anything that cannot be scored.
    """
    if bin_rule not in ("argmax", "stated"):
        raise ValueError(f"bin_rule must be 'argmax' or 'stated', got {bin_rule!r}")
    eval_rows = None
    if rows_path is not None:
        eval_rows = {}
        for i, obj in _read_jsonl(rows_path):
            if obj.get("comparison_id") is None:
                _fail(f"{rows_path}:{i}", "missing field 'comparison_id' (eval-set row)")
            if obj["comparison_id"] in eval_rows:
                _fail(f"{rows_path}:{i}", f"comparison_id {obj['comparison_id']!r} appears twice")
            eval_rows[obj["comparison_id"]] = (f"{rows_path}:{i}", obj)
    rows = []
    for i, obj in _read_jsonl(path):
        where = f"{path}:{i}"
        if any(k in obj for k in ("comparison_id", "bin_probabilities", "surrogate_label")):
            rows.append(_paper_row(obj, where, eval_rows, rows_path, bin_rule))
        else:
            rows.append(_our_row(obj, where, bin_rule))
    if not rows:
        _fail(path, "holds no prediction rows")
    return rows



# ---- CLI ------------------------------------------------------------------------------------

def _fmt(x, width=7, digits=3):
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.{digits}f}"


def format_report(name, rep):
    """A readable table in the spirit of the paper's: overall, per task, budgets, repeats."""
    cols = ("n", "parse", "acc", "acc±1", "brier", "crps", "nll", "ece", "aurc", "SR")
    lines = [f"== {name}", f"{'':<20}" + "".join(f"{c:>7}" for c in cols)]

    def line(label, s):
        sr = s["speedup_recovered"]["mean"] if s.get("speedup_recovered") else None
        vals = (s["parse_rate"], s["accuracy"], s["off_by_one"], s["brier"], s["crps"], s["nll"],
                s["ece"], s["aurc"]["maxprob"], sr)
        return f"{label:<20}{s['n']:>7}" + "".join(_fmt(v) for v in vals)

    lines.append(line("overall", rep))
    lines += [line("  " + task, s) for task, s in rep["tasks"].items()]
    sr = rep["speedup_recovered"]
    if sr:
        budgets = list(sr["by_budget"])
        lines.append(f"{'speedup recovered':<20}" + "".join(f"{b:>7}" for b in budgets) + "   mean")
        lines.append(f"{'  forecast':<20}" + "".join(_fmt(v) for v in sr["by_budget"].values())
                     + _fmt(sr["mean"]))
        lines.append(f"{'  random (exact)':<20}"
                     + "".join(_fmt(v) for v in sr["random_by_budget"].values())
                     + _fmt(sr["random_mean"]))
    else:
        lines.append("speedup recovered: needs every row's measured speedup (true_speedup)")
    if "repeats" in rep:
        r = rep["repeats"]
        spread = ", ".join(f"{k} {_fmt(r['mean'][k], 0)} ± {_fmt(r['std'][k], 0)}"
                           for k in r["mean"] if r["mean"][k] is not None)
        lines.append(f"over {r['n']} repeats (mean ± std): {spread}")
    if "discovery" in rep:
        d = rep["discovery"]
        lines.append(f"discovery (>= 1.414x) at tau {d['tau']}: precision {_fmt(d['precision'], 0)}"
                     f", recall {_fmt(d['recall'], 0)}, base rate {_fmt(d['base_rate'], 0)}"
                     f" ({d['discoveries']} of {d['n']} pairs)")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Score forecasts: accuracy, calibration, selective risk and speedup recovered "
                    "under a measurement budget, per forecaster and per task.")
    ap.add_argument("predictions", help="predictions in JSON Lines: our prediction rows or the "
                                        "paper's published format (detected per line)")
    ap.add_argument("--rows", help="the paper's eval-set rows (JSON Lines), joined on "
                                   "comparison_id to get true_bin, aggregated_speedup and pack")
    ap.add_argument("--plots", metavar="DIR", help="write PNG plots (reliability, risk-coverage, "
                                                   "speedup recovered) into DIR")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables "
                    "(a single forecaster's report, or {\"forecasters\": {name: report}})")
    ap.add_argument("--bin-rule", choices=("argmax", "stated"), default="argmax",
                    help="which bin is scored: the argmax of the probabilities (default) or the "
                         "model's stated bin (the paper's tables)")
    ap.add_argument("--discovery", type=float, metavar="TAU", default=None,
                    help="the rows are parent->child pairs: add discovery-moment precision and "
                         "recall of flagging P(child >= 1.414x parent) >= TAU")
    args = ap.parse_args(argv)
    try:
        rows = load_predictions(args.predictions, args.rows, args.bin_rule)
    except MetricsInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    groups = group_by(rows, forecaster_name)
    reports = {name: report(rs, discovery_tau=args.discovery) for name, rs in sorted(groups.items())}
    if args.plots:
        import metrics_plots  # matplotlib only when plots are asked for
        try:
            metrics_plots.write_plots(groups, reports, args.plots)
        except OSError as e:
            print(f"error: cannot write plots to {args.plots} ({e}); pass a writable folder",
                  file=sys.stderr)
            return 2
    if args.json:
        out = next(iter(reports.values())) if len(reports) == 1 else {"forecasters": reports}
        print(json.dumps(out, indent=1))
    else:
        print("\n\n".join(format_report(name, rep) for name, rep in reports.items()))
        print("\nbrier = half-Brier; crps = ranked probability score / 7; brier/crps/nll score a "
              "parse failure as uniform; acc, ece over parsed rows; aurc over max-prob; "
              "SR = speedup recovered, mean over budgets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
