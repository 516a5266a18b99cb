"""gate.py: which of a parent's children deserve a GPU measurement (docs/PAPER.md §4, §7).

The search's fourth phase. Each child has a forecast of its speedup over the reference (a Forecast:
8 probabilities, a parse failure, or a deferral of the abstain variant); `select` decides, from
the forecasts alone, which children are measured (search.py --gate):

    none        measure every child (the paper's standard search; no forecasts).
    topk        measure the --measure-per-parent best by the ranking key (expected bin, or
                expected log2-speedup): the paper's surrogate-filtered search. Parsed forecasts
                rank first, then deferrals, then parse failures.
    confidence  the selective gate (forecaster.Gate, with --threshold or a threshold learnt from
                the labels so far): a child whose forecast the gate defers (unsure, a parse
                failure, a deferral) is measured; a trusted one is measured when it predicts a gain
                over its parent and skipped otherwise, or, with --forecast-reward, admitted to the
                archive with its forecast as its reward (`trusted`), with no GPU run.

The forecaster forecasts speedup over the task's reference (the seed code is the anchor), so
"predicts a gain over its parent" means E[log2 S] under the forecast exceeds log2 of the parent's
reward (bins.BIN_LOG2_SPEEDUP gives each bin's log-speedup). The confidence gate's threshold is
--threshold, or is learnt from the forecasts of the children measured so far (forecast bin vs true
bin) by forecaster.Gate.from_labelled; until --min-labels labels exist (or when no threshold meets
the target risk) every child is deferred. Only successful measurements are labels (a failed kernel
has no true bin). At most --measure-per-parent children per parent are measured in both gated
modes.

Pure decisions, no bookkeeping: search.py applies the budget, counts, and logs them. Kept apart
from the loop because this is where the paper's idea, a surrogate that knows when to defer, meets
the search.
"""
import math

import bins
from forecast_answer import Forecast
from forecaster import Gate

GATES = ("none", "topk", "confidence")
RANK_KEYS = ("expected_bin", "expected_log_speedup")


def as_forecast(view):
    """The Forecast of a logged forecast view (live and replayed runs read the same log)."""
    probs = view["probs"]
    return Forecast(probs=probs, parse_failed=view["parse_failed"], deferred=view.get("deferred", False),
                    predicted_bin=None if probs is None else bins.predicted_bin(probs))


def rank_key(f, rank_by):
    """Ranking key of a forecast: parsed forecasts by the key, then deferrals, then parse failures."""
    if f.probs is None:
        return (1 if f.deferred else 0, 0.0)
    return (2, f.expected_bin if rank_by == "expected_bin" else f.expected_log2_speedup)


def forecast_speedup(f):
    """The speedup a forecast stands for when it replaces a measurement: 2 ** E[log2 S]."""
    return 2.0 ** f.expected_log2_speedup


def predicts_gain(f, parent_reward):
    """A forecast of speedup over the reference 'predicts a gain over the parent' when its expected
    log2-speedup exceeds log2 of the parent's measured reward."""
    return f.expected_log2_speedup > math.log2(parent_reward)


def confidence_gate(args, labels):
    """The confidence gate of this step: --threshold, or learnt from the labels so far
    ((forecast, true bin) of measured children) by forecaster.Gate.from_labelled (threshold inf
    when none meets the target risk); None (defer everything) until --min-labels labels exist."""
    if args.threshold is not None:
        return Gate(args.score, args.threshold)
    if len(labels) < args.min_labels:
        return None
    forecasts, true_bins = zip(*labels)
    return Gate.from_labelled(forecasts, true_bins, args.target_risk, args.delta, score=args.score)


def select(args, parent_reward, forecasts, labels, n):
    """(chosen, trusted, skipped, threshold) for n children: `chosen` the indices to measure, best
    first (at most --measure-per-parent with a gate); `trusted` the indices admitted on their
    forecast (--forecast-reward); `skipped` {index: reason}; the threshold of the confidence gate
    (None when it had none)."""
    if args.gate == "none":
        return list(range(n)), [], {}, None
    order = sorted(range(n), key=lambda j: rank_key(forecasts[j], args.rank_by), reverse=True)  # stable
    if args.gate == "topk":
        chosen = order[: args.measure_per_parent]
        return chosen, [], {j: "below top-k" for j in order[len(chosen):]}, None
    gate, wanted, trusted, skipped = confidence_gate(args, labels), [], [], {}
    for j in order:
        if gate is None or gate.decide(forecasts[j]) == "defer":
            wanted.append(j)
        elif args.forecast_reward:  # trusted: its forecast is its reward, no GPU run
            trusted.append(j)
        elif predicts_gain(forecasts[j], parent_reward):
            wanted.append(j)
        else:
            skipped[j] = "confident: no gain over parent"
    for j in wanted[args.measure_per_parent:]:
        skipped[j] = "over the per-parent cap"
    tau = None if gate is None or math.isinf(gate.threshold) else gate.threshold
    return wanted[: args.measure_per_parent], trusted, skipped, tau
