"""metrics.py: how good is a forecaster? Every dataset score, and the command line that prints them.

`python metrics.py PREDICTIONS.jsonl [MORE.jsonl ...] [--rows ROWS.jsonl] [--protocol ours|paper] [--plots DIR]
[--json]` reads prediction rows (ours or the paper's published format; dataset.py), from files or
from the Hugging Face Hub by name (`hf:codezakh/gpu-forecasters-eval-set-predictions`, with
`--rows hf:codezakh/gpu-forecasters-eval-set`), splits them by forecaster and prints, per forecaster
and per task, the paper's scores. The score of one forecast
(the bins, Brier, CRPS, NLL, confidence) is in bins.py; calibration and selective prediction in
selective.py; the plots in plots.py.

Two protocols (docs/FIDELITY.md lists every difference). `ours` (the default) scores the argmax of
the probabilities and uses selective.py's risk-coverage. `paper` follows the original code: the
bin the model stated is the scored bin (accuracy, off-by-one, ECE, max-prob confidence =
p[stated bin]), and AURC, selective risk at 50% coverage, the other risks, the threshold for a
coverage and the agreement of two gates come from paper_protocol.py. Its report holds `overall`,
`tasks`, and `repeats` (each repeat alone and the mean over repeats).

Reading top to bottom:
1. dataset scores: parse rate (a deferral of the abstain variant is an answer; its share is the
   deferral rate), accuracy and off-by-one accuracy, Brier/CRPS/NLL with parse failures and
   deferrals scored as a uniform forecast, ECE (10 buckets), AURC per confidence score, selective
   risk at 50% coverage; per task, and mean/std over repeats (scores, report);
2. the paper protocol's figures (paper_scores, paper_report);
3. speedup recovered under a measurement budget (speedup_recovered, speedup_recovered_rows);
4. discovery moments (discovery_moments);
5. the command line: tables or JSON, and plots on request (format_report, main).

Speedup recovered under a measurement budget (our definition; the paper's Table 1 has no code):
within each task's pool of n candidates with measured speedups, rank the candidates by the
forecast's expected log2-speedup (parse failures last), "measure" the top k = ceil(b * n) for
b in {1, 2, 5, 10, 20, 50}%, and score best-speedup-found / best-speedup-in-pool (a ratio of
speedups, 1 = the pool's best was found). Candidates with equal keys are ordered at random, and
we report the exact expectation over that random tie-breaking, so ties never favour the truth. The
random-ranking baseline is the exact expectation of the best of a uniformly random k-subset:
with the pool sorted ascending s_(1) <= ... <= s_(n), E = sum_i s_(i) * C(i-1, k-1) / C(n, k).
A task's figure is the mean over budgets; the overall figure is the mean over tasks (each task
counts once, whatever its pool size); repeats are scored as separate rankings and averaged.

Discovery moments (our definition; the paper has no code): over parent->child pairs whose truth
is the child's speedup over its parent, a discovery is a child at least sqrt(2) = 1.414x faster
(bin 5 or above). The forecaster flags a pair when P(S >= 1.414x) = p_5 + ... + p_8 >= tau; a
parse failure never flags. We report precision, recall, the base rate (precision of flagging
every pair) and the precision-recall curve over every observed tau.
"""
import json
import math
import os
import sys
from dataclasses import dataclass, replace

import numpy as np

from bins import (
    BIN_EDGES,
    CONFIDENCE_KINDS,
    UNIFORM,
    brier,
    crps,
    expected_log2_speedup,
    hit,
    nll,
    off_by_one_hit,
    predicted_bin,
    prob_at_least,
)
from data.dataset import load_predictions
from data.records import RecordError
from paper_protocol import PROTOCOLS, selective_scores
from runtime import cli
from runtime.cli import flag
from selective import aurc, ece, row_confidence, selective_risk


def forecaster_name(row):
    """Name a forecaster by model, and by read-out when the row records one."""
    return row["model"] + (f" [{row['readout']}]" if row.get("readout") else "")


def group_by(rows, key):
    groups = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


# ---- dataset scores -------------------------------------------------------------------------

def _mean(xs):
    return float(np.mean(xs)) if len(xs) else None


def scores(rows):
    """Scalar scores of rows from one forecaster (no per-task split, no repeats)."""
    parsed = [r for r in rows if r["probs"] is not None]
    deferred = [r for r in rows if r.get("deferred")]  # the abstain variant's native deferrals
    hits = [hit(r["predicted_bin"], r["true_bin"]) for r in parsed]
    full = {name: [] for name in ("brier", "crps", "nll")}
    for r in rows:  # a parse failure is scored as the uniform forecast
        p = UNIFORM if r["probs"] is None else r["probs"]
        for name, fn in (("brier", brier), ("crps", crps), ("nll", nll)):
            full[name].append(fn(p, r["true_bin"]))
    ok = [r["probs"] is not None for r in rows]
    stated = [r for r in parsed if r["stated_bin"] is not None]
    # the selective view counts every row: a parse failure or a deferral is deferred (confidence None)
    correct = [r["probs"] is not None and hit(r["predicted_bin"], r["true_bin"]) for r in rows]
    at_half = selective_risk([row_confidence(r) for r in rows], correct, 0.5)
    return {
        "n": len(rows),
        # a deferral is an answer (not a parse failure) but no forecast: deferred by the gate, so it
        # lowers coverage like a low confidence does, and it is scored as uniform in the means
        "parse_rate": (len(parsed) + len(deferred)) / len(rows) if rows else None,
        "deferral_rate": len(deferred) / len(rows) if rows else None,
        "accuracy": _mean(hits),
        "off_by_one": _mean([off_by_one_hit(r["predicted_bin"], r["true_bin"]) for r in parsed]),
        **{k: _mean(v) for k, v in full.items()},
        **{f"{k}_parsed": _mean([x for x, o in zip(v, ok) if o]) for k, v in full.items()},
        "ece": ece([row_confidence(r) for r in parsed], hits),
        "mean_raw_sum": _mean([r["raw_sum"] for r in parsed if r["raw_sum"] is not None]),
        "stated_disagreement": _mean([r["stated_bin"] != predicted_bin(r["probs"]) for r in stated]),
        "aurc": {kind: aurc([row_confidence(r, kind) for r in rows], correct)
                 for kind in CONFIDENCE_KINDS},
        # risk of the max-prob gate that trusts (at least) half the rows; None below that parse rate
        "selective_risk_50": None if at_half is None else at_half[0],
    }


SPREAD_KEYS = ("parse_rate", "accuracy", "off_by_one", "brier", "crps", "nll", "ece")


def report(rows, budgets=None, discovery_tau=None):
    """Everything about one forecaster's rows: overall scores, per task, over repeats, budgets.

    Scores pool all rows; when rows carry more than one repeat index, "repeats" adds the mean and
    sample std (ddof=1) of the main scores computed on each repeat alone. Pass the rows of one
    forecaster (split a mixed file with group_by(rows, forecaster_name)).
    """
    budgets = budgets or BUDGETS_PCT
    out = {"forecasters": sorted({forecaster_name(r) for r in rows}), **scores(rows)}
    sr = speedup_recovered_rows(rows, budgets)
    out["speedup_recovered"] = sr
    out["tasks"] = {}
    for task, task_rows in sorted(group_by(rows, lambda r: r["task"]).items()):
        out["tasks"][task] = {**scores(task_rows),
                              "speedup_recovered": sr["tasks"][task] if sr else None}
    repeats = group_by(rows, lambda r: r["repeat"])
    if len(repeats) > 1:
        per = [scores(rs) for _, rs in sorted(repeats.items(), key=lambda kv: str(kv[0]))]
        per_sr = [speedup_recovered_rows(rs, budgets) for rs in repeats.values()]
        table = {k: [p[k] for p in per] for k in SPREAD_KEYS}
        table["aurc_maxprob"] = [p["aurc"]["maxprob"] for p in per]
        if sr:
            table["speedup_recovered"] = [s["mean"] for s in per_sr]
        out["repeats"] = {"n": len(repeats), "mean": {}, "std": {}}
        for k, vals in table.items():
            vals = [v for v in vals if v is not None]
            out["repeats"]["mean"][k] = _mean(vals)
            out["repeats"]["std"][k] = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
    if discovery_tau is not None:
        out["discovery"] = discovery_moments(rows, discovery_tau)
    return out


# ---- the paper protocol (docs/FIDELITY.md; the rows are read with the stated bin as scored bin) --

def paper_scores(rows):
    """scores() with the original's selective-prediction figures in place of ours."""
    common = {k: v for k, v in scores(rows).items() if k not in ("aurc", "selective_risk_50")}
    return {**common, **selective_scores(rows)}


def paper_report(rows, budgets=None, discovery_tau=None):
    """One forecaster under the paper protocol: overall, per task, each repeat and their mean.

    Speedup recovered (our definition; the original has none) is added under both protocols."""
    budgets = budgets or BUDGETS_PCT
    sr = speedup_recovered_rows(rows, budgets)
    out = {"protocol": "paper", "forecasters": sorted({forecaster_name(r) for r in rows}),
           "overall": {**paper_scores(rows), "speedup_recovered": sr["mean"] if sr else None},
           "tasks": {}, "speedup_recovered": sr}
    for task, task_rows in sorted(group_by(rows, lambda r: r["task"]).items()):
        out["tasks"][task] = {**paper_scores(task_rows),
                              "speedup_recovered": sr["tasks"][task]["mean"] if sr else None}
    per = {}
    for k, rs in sorted(group_by(rows, lambda r: r["repeat"]).items(), key=lambda kv: str(kv[0])):
        sr_k = speedup_recovered_rows(rs, budgets)
        per[str(k)] = {**paper_scores(rs), "speedup_recovered": sr_k["mean"] if sr_k else None}
    numbers = [k for k, v in out["overall"].items() if not isinstance(v, dict)]
    mean = {k: _mean([p[k] for p in per.values() if p[k] is not None]) for k in numbers}
    out["repeats"] = {"n": len(per), "per_repeat": per, "mean": mean}
    if discovery_tau is not None:
        out["discovery"] = discovery_moments(rows, discovery_tau)
    return out


# ---- speedup recovered under a measurement budget (definition in the module docstring) -------

BUDGETS_PCT = (1, 2, 5, 10, 20, 50)


def budget_size(pct, n):
    """k = ceil(pct% of n), at least 1; integer arithmetic so 10% of 30 is 3, not 4."""
    return max(1, -(-pct * n // 100))


def expected_best_of_random_subset(values, k):
    """E[max of a uniformly random k-subset of values] = sum_i v_(i) C(i-1, k-1) / C(n, k)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = len(v)
    if not 1 <= k <= n:
        raise ValueError(f"subset size must be in 1..{n}, got {k}")
    total = math.comb(n, k)  # exact integers; int / int division stays accurate for huge n
    return float(sum(v[i - 1] * (math.comb(i - 1, k - 1) / total) for i in range(k, n + 1)))


def expected_best_of_top(keys, speedups, k):
    """E[best speedup among the k highest keys], ties among keys broken uniformly at random.

    A key of None or NaN (a parse failure) ranks below every forecast."""
    keys = np.array([-math.inf if k is None or math.isnan(k) else k for k in keys], dtype=float)
    speedups = np.asarray(speedups, dtype=np.float64)
    found, taken = -math.inf, 0
    for key in np.unique(keys)[::-1]:
        group = speedups[keys == key]
        if taken + len(group) <= k:
            found, taken = max(found, group.max()), taken + len(group)
            if taken == k:
                return float(found)
        else:  # only k - taken of this tied group get measured: expectation over which ones
            return expected_best_of_random_subset(np.maximum(group, found), k - taken)
    raise ValueError(f"budget {k} exceeds the pool of {len(keys)}")


def speedup_recovered(keys, speedups, budgets=BUDGETS_PCT):
    """One pool: {"b%": E[best found]/best} for the forecast ranking and a random ranking.

    keys: ranking key per candidate, higher is measured first; None or NaN (a parse failure) ranks
    last. Returns {"by_budget", "mean", "random_by_budget", "random_mean"}.
    """
    s = np.asarray(speedups, dtype=np.float64)
    if len(s) == 0 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("speedups must be a non-empty list of finite numbers > 0")
    if len(keys) != len(s):
        raise ValueError(f"{len(keys)} keys but {len(s)} speedups")
    best = s.max()
    ours, rand = {}, {}
    for pct in budgets:
        k = budget_size(pct, len(s))
        ours[f"{pct}%"] = expected_best_of_top(keys, s, k) / best
        rand[f"{pct}%"] = expected_best_of_random_subset(s, k) / best
    return {"by_budget": ours, "mean": float(np.mean(list(ours.values()))),
            "random_by_budget": rand, "random_mean": float(np.mean(list(rand.values())))}


def _average(results):
    """Mean of several speedup_recovered dicts, key by key."""
    avg = {}
    for key in ("by_budget", "random_by_budget"):
        avg[key] = {b: float(np.mean([r[key][b] for r in results])) for b in results[0][key]}
    avg["mean"] = float(np.mean([r["mean"] for r in results]))
    avg["random_mean"] = float(np.mean([r["random_mean"] for r in results]))
    return avg


def speedup_recovered_rows(rows, budgets=BUDGETS_PCT):
    """Speedup recovered of normalised rows: one pool per (repeat, task), ranked by expected
    log2-speedup; per task = mean over repeats; overall = mean over tasks, then over repeats.
    None when a row lacks its measured speedup (a bin alone cannot rank the pool's best)."""
    if not rows or any(r["true_speedup"] is None for r in rows):
        return None
    per_task, overall = {}, []
    for _, rep_rows in group_by(rows, lambda r: r["repeat"]).items():
        pools = []
        for task, pool in group_by(rep_rows, lambda r: r["task"]).items():
            keys = [None if r["probs"] is None else expected_log2_speedup(r["probs"]) for r in pool]
            res = speedup_recovered(keys, [r["true_speedup"] for r in pool], budgets)
            per_task.setdefault(task, []).append(res)
            pools.append(res)
        overall.append(_average(pools))
    return {**_average(overall), "tasks": {t: _average(v) for t, v in sorted(per_task.items())}}


# ---- discovery moments (definition in the module docstring) -------------------------------

DISCOVERY_SPEEDUP = BIN_EDGES[3]  # sqrt(2) = 1.414x, the lower edge of bin 5


def discovery_moments(rows, tau=0.5):
    """Precision/recall of flagging P(child >= 1.414x parent) >= tau over parent->child rows."""
    p_fast = np.array([-1.0 if r["probs"] is None else prob_at_least(r["probs"], DISCOVERY_SPEEDUP)
                       for r in rows])  # -1: a parse failure is never flagged
    truth = np.array([r["true_bin"] >= 5 for r in rows])

    def pr(t):
        flagged = p_fast >= t
        tp = int((flagged & truth).sum())
        precision = tp / flagged.sum() if flagged.any() else None
        recall = tp / truth.sum() if truth.any() else None
        return int(flagged.sum()), precision, recall

    flagged, precision, recall = pr(tau)
    curve = [{"tau": float(t), **dict(zip(("flagged", "precision", "recall"), pr(t)))}
             for t in np.unique(p_fast[p_fast >= 0])]
    return {"n": len(rows), "discoveries": int(truth.sum()),
            "base_rate": float(truth.mean()) if len(rows) else None, "tau": tau,
            "flagged": flagged, "precision": precision, "recall": recall, "curve": curve}


# ---- the command line -------------------------------------------------------------------------

def _fmt(x, width=7, digits=3):
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.{digits}f}"


def _header(name):
    cols = ("n", "parse", "acc", "acc±1", "brier", "crps", "nll", "ece", "aurc", "r@50%", "SR")
    return [f"== {name}", f"{'':<20}" + "".join(f"{c:>7}" for c in cols)]


def _discovery_line(d):
    return (f"discovery (>= 1.414x) at tau {d['tau']}: precision {_fmt(d['precision'], 0)}, recall "
            f"{_fmt(d['recall'], 0)}, base rate {_fmt(d['base_rate'], 0)} ({d['discoveries']} of {d['n']} pairs)")


def _line(label, s):
    """One row of format_report's table: a forecaster's (or a task's) scores under our protocol."""
    sr = s["speedup_recovered"]["mean"] if s.get("speedup_recovered") else None
    vals = (s["parse_rate"], s["accuracy"], s["off_by_one"], s["brier"], s["crps"], s["nll"],
            s["ece"], s["aurc"]["maxprob"], s["selective_risk_50"], sr)
    return f"{label:<20}{s['n']:>7}" + "".join(_fmt(v) for v in vals)


def _paper_line(label, s):
    vals = (s["parse_rate"], s["accuracy"], s["off_by_one"], s["brier"], s["crps"], s["nll"],
            s["ece"], s["aurc"], s["selective_risk_at_50"], s.get("speedup_recovered"))
    return f"{label:<20}{s['n']:>7.0f}" + "".join(_fmt(v) for v in vals)


def format_side_by_side(reports, protocol="ours"):
    """Several forecasters' overall scores in one table (e.g. an LLM and the cost model on one
    set of rows), a row each; a name too long for the column is cut there and given in full below."""
    lines = _header("side by side, overall")
    for k, (name, rep) in enumerate(reports.items(), 1):
        label = f"{k}. {name}"[:19]
        lines.append(_line(label, rep) if protocol == "ours" else _paper_line(label, rep["overall"]))
    cut = [f"  {k}. {name}" for k, name in enumerate(reports, 1) if len(f"{k}. {name}") > 19]
    return "\n".join(lines + (["names in full:"] + cut if cut else []))


def format_report(name, rep):
    """A readable table in the spirit of the paper's: overall, per task, budgets, repeats."""
    lines = _header(name)
    line = _line
    lines.append(line("overall", rep))
    if rep.get("deferral_rate"):  # the abstain variant: deferrals are answers, never trusted
        lines.append(f"{'  deferred':<20}{rep['deferral_rate']:>7.3f} of the rows by the model's own "
                     "choice (lower coverage; uniform in Brier/CRPS/NLL)")
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
        lines.append(_discovery_line(rep["discovery"]))
    return "\n".join(lines)


def format_paper_report(name, rep):
    """The paper protocol's table: overall, per task, per repeat and the mean over repeats."""
    lines = _header(name)
    line = _paper_line

    lines.append(line("overall", rep["overall"]))
    lines += [line("  " + task, s) for task, s in rep["tasks"].items()]
    if rep["repeats"]["n"] > 1:
        lines += [line(f"  repeat {k}", s) for k, s in rep["repeats"]["per_repeat"].items()]
        lines.append(line("  mean of repeats", rep["repeats"]["mean"]))
    if "discovery" in rep:
        lines.append(_discovery_line(rep["discovery"]))
    return "\n".join(lines)


@dataclass
class Args:
    """Score forecasts: accuracy, calibration, selective risk and speedup recovered under a
    measurement budget, per forecaster and per task."""
    predictions: list[str] = flag(None, "predictions: JSON Lines files or Hub datasets hf:OWNER/NAME[/CONFIG][:SPLIT], "
                                  "our prediction rows or the paper's published format (detected per row; "
                                  "hf:codezakh/gpu-forecasters-eval-set-predictions); several (e.g. an LLM's and a "
                                  "cost model's) are scored side by side", positional=True)
    rows: str | None = flag(None, "the paper's eval-set rows (a JSON Lines file or hf:codezakh/gpu-forecasters-eval-set), "
                            "joined on comparison_id to get true_bin, aggregated_speedup and pack")
    protocol: str = flag("ours", "ours: the argmax is the scored bin, this project's risk-coverage; paper: the "
                         "original's definitions (the stated bin, its AURC and selective risk; docs/FIDELITY.md), "
                         "to reproduce the paper's tables", choices=PROTOCOLS)
    plots: str | None = flag(None, "write PNG plots (reliability, risk-coverage, speedup recovered) into DIR; the "
                             "risk-coverage curves and their AURC follow --protocol, as the table does", metavar="DIR")
    json: bool = flag(False, "print one JSON object instead of tables (a single forecaster's report, or "
                      "{\"forecasters\": {name: report}}), with the protocol used")
    bin_rule: str | None = flag(None, "which bin is scored under --protocol ours: the argmax of the probabilities "
                                "(default) or the model's stated bin; --protocol paper always scores the stated bin",
                                choices=("argmax", "stated"))
    discovery: float | None = flag(None, "the rows are parent->child pairs: add discovery-moment precision and "
                                   "recall of flagging P(child >= 1.414x parent) >= TAU", metavar="TAU")


def build_parser():
    """The command line of Args (cli.py): one --flag per field, with its default and help."""
    return cli.parser(Args)


def parse_args(argv=None):
    """Args from the command line, checked (a ValueError names the flag to fix), with the scored bin
    the protocol's (paper_protocol.PROTOCOLS) when --bin-rule is left unset."""
    args = cli.parse(Args, argv, gpu=False)
    if args.protocol == "paper" and args.bin_rule == "argmax":
        raise ValueError("--protocol paper scores the stated bin; drop --bin-rule argmax or use --protocol ours")
    return replace(args, bin_rule=args.bin_rule or PROTOCOLS[args.protocol].bin_rule)


def main(argv=None):
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        rows = [r for path in args.predictions for r in load_predictions(path, args.rows, args.bin_rule)]
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    groups = group_by(rows, forecaster_name)
    make = paper_report if args.protocol == "paper" else report
    reports = {name: make(rs, discovery_tau=args.discovery) for name, rs in sorted(groups.items())}
    if args.plots:
        from data import plots  # matplotlib only when plots are asked for
        try:
            plots.write_plots(groups, reports, args.plots, protocol=args.protocol)
        except OSError as e:
            print(f"error: cannot write plots to {args.plots} ({e}); pass a writable folder",
                  file=sys.stderr)
            return 2
    if args.json:
        if len(reports) == 1:
            out = {**next(iter(reports.values())), "protocol": args.protocol}
        else:
            out = {"protocol": args.protocol, "forecasters": reports}
        print(json.dumps(out, indent=1, default=_json_number))
    elif args.protocol == "paper":
        print("protocol: paper (the original's definitions, docs/FIDELITY.md)\n")
        print("\n\n".join(format_paper_report(name, rep) for name, rep in reports.items()))
        if len(reports) > 1:
            print("\n" + format_side_by_side(reports, "paper"))
        print("\nscored bin = the stated bin; brier = half-Brier; crps = ranked probability score / 7; "
              "brier/crps/nll score a parse failure as uniform; acc, ece over parsed rows; aurc = "
              "trapezoid over the covered range (max-prob = p[stated bin], bin mismatch); r@50% = "
              "risk interpolated at 50% coverage; SR = speedup recovered (our definition)")
    else:
        print(f"protocol: ours ({args.bin_rule} bin scored; --protocol paper for the original's "
              "definitions, docs/FIDELITY.md)\n")
        print("\n\n".join(format_report(name, rep) for name, rep in reports.items()))
        if len(reports) > 1:
            print("\n" + format_side_by_side(reports))
        print("\nbrier = half-Brier; crps = ranked probability score / 7; brier/crps/nll score a "
              "parse failure as uniform; acc, ece over parsed rows; aurc over max-prob; r@50% = "
              "risk of the max-prob gate trusting half the rows; SR = speedup recovered, mean "
              "over budgets")
    return 0


def _json_number(x):
    """numpy scalars as plain numbers (json cannot write them)."""
    return x.item() if hasattr(x, "item") else str(x)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `python metrics.py ... | head`: the reader left; exit quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
