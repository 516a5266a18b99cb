"""gate.py: the selective gate: trust a confident forecast, defer the rest to the GPU (docs/PAPER.md §4, §7).

The paper's idea in one place: a surrogate that knows when to defer. A forecast (forecast_answer.py)
is 8 probabilities over the speedup bins of bins.py, a parse failure, or a deferral of the abstain
variant (the model declined to forecast). The gate reads it top to bottom:

1. Trust or defer (Gate.decide). A forecast's confidence score (bins.confidence: maxprob, entropy
   or margin) at or above the threshold tau is trusted; below it, and every parse failure and every
   deferral, is deferred: the GPU measures it.
2. The threshold (Gate.from_labelled, confidence_gate). Fixed (--threshold), or learnt from the
   search's own labels: the forecasts of the children measured so far against their true bins,
   with selective.guaranteed_risk_threshold (SGR: the bin-mismatch rate of trusted forecasts stays
   below --target-risk with probability 1 - --delta). Until --min-labels labels exist, or when no
   threshold meets the target risk, every child is deferred. Only successful measurements are
   labels (a failed kernel has no true bin). The learning is selective prediction (selective.py);
   its use, here.
3. The three modes of the search's gate phase (select, search.py --gate):
       none        measure every child (the paper's standard search; no forecasts).
       topk        measure the --measure-per-parent best by the ranking key (expected bin, or
                   expected log2-speedup): the paper's surrogate-filtered search. Parsed forecasts
                   rank first, then deferrals, then parse failures.
       confidence  the selective gate: a deferred child is measured; a trusted one is measured
                   when it predicts a gain over its parent and skipped otherwise.
   At most --measure-per-parent children per parent are measured in both gated modes.
4. Forecast as reward (--forecast-reward, with the confidence gate): a trusted child is not
   measured at all; its forecast's expected speedup (forecast_speedup) is its reward in the
   archive, with no GPU run.
5. The budget (select's `room`): never more measurements than --budget; the children past it are
   skipped, "budget spent".

The forecaster forecasts speedup over the task's reference (the seed code is the anchor), so
"predicts a gain over its parent" means E[log2 S] under the forecast exceeds log2 of the parent's
reward (bins.BIN_LOG2_SPEEDUP gives each bin's log-speedup).

Pure decisions, no bookkeeping: search.py counts and logs them. forecaster.py's command line and
--eval use Gate too.
"""
import math
from dataclasses import dataclass

import bins
import selective

GATES = ("none", "topk", "confidence")
RANK_KEYS = ("expected_bin", "expected_log_speedup")


# ---- 1, 2. trust or defer, with a fixed or a learnt threshold -------------------------------------

# The learnt threshold's guarantee unless asked otherwise, the defaults of search.py's --target-risk
# and --delta as well: a bin-mismatch rate of trusted forecasts at most 0.3, with probability 0.9.
TARGET_RISK, DELTA = 0.3, 0.1


@dataclass
class Gate:
    """Trust a forecast whose confidence score reaches the threshold; defer the rest (every parse
    failure and every native deferral of the abstain variant too) to a GPU measurement."""
    score: str = "maxprob"
    threshold: float = 0.5

    def __post_init__(self):
        if self.score not in bins.CONFIDENCE_KINDS:
            raise ValueError(f"unknown gate score {self.score!r}; choose one of: {', '.join(bins.CONFIDENCE_KINDS)}")

    def decide(self, forecast):
        if forecast.parse_failed or forecast.probs is None:
            return "defer"
        return "trust" if forecast.confidence(self.score) >= self.threshold else "defer"

    @classmethod
    def from_labelled(cls, forecasts, true_bins, target_risk=TARGET_RISK, delta=DELTA, score="maxprob"):
        """The threshold that keeps the bin-mismatch rate of trusted forecasts below target_risk
        with probability 1 - delta (SGR, Geifman & El-Yaniv 2017), from labelled forecasts; the
        defaults are search.py's --target-risk and --delta.
        Parse failures are always deferred (confidence None) but count in the coverage. When no
        threshold meets the target the gate defers everything (threshold inf)."""
        conf = [f.confidence(score) for f in forecasts]
        correct = [f.predicted_bin == int(y) for f, y in zip(forecasts, true_bins)]
        best = selective.guaranteed_risk_threshold(conf, correct, target_risk, delta)
        return cls(score=score, threshold=math.inf if best is None else best["threshold"])


def confidence_gate(args, labels):
    """The confidence gate of this step: --threshold, or learnt from the labels so far
    ((forecast, true bin) of measured children) by Gate.from_labelled (threshold inf when none
    meets the target risk); None (defer everything) until --min-labels labels exist."""
    if args.threshold is not None:
        return Gate(args.score, args.threshold)
    if len(labels) < args.min_labels:
        return None
    forecasts, true_bins = zip(*labels)
    return Gate.from_labelled(forecasts, true_bins, args.target_risk, args.delta, score=args.score)


# ---- 3, 4. what a forecast says about a child ------------------------------------------------------

def rank_key(f, rank_by):
    """Ranking key of a forecast: parsed forecasts by the key, then deferrals, then parse failures."""
    if f.probs is None:
        return (1 if f.deferred else 0, 0.0)
    return (2, f.expected_bin if rank_by == "expected_bin" else f.expected_log2_speedup)


def predicts_gain(f, parent_reward):
    """A forecast of speedup over the reference 'predicts a gain over the parent' when its expected
    log2-speedup exceeds log2 of the parent's measured reward."""
    return f.expected_log2_speedup > math.log2(parent_reward)


def forecast_speedup(f):
    """The speedup a forecast stands for when it replaces a measurement: 2 ** E[log2 S]."""
    return 2.0 ** f.expected_log2_speedup


# ---- 3, 5. the gate phase of the search --------------------------------------------------------------

def select(args, parent_reward, forecasts, labels, n, room):
    """(chosen, trusted, skipped, threshold) for n children: `chosen` the indices to measure, best
    first (at most --measure-per-parent with a gate, and at most `room`, the measurements left in
    the budget); `trusted` the indices admitted on their forecast (--forecast-reward); `skipped`
    {index: reason}; the threshold of the confidence gate (None when it had none)."""
    chosen, trusted, skipped, tau = _choose(args, parent_reward, forecasts, labels, n)
    for j in chosen[room:]:
        skipped[j] = "budget spent"
    return chosen[:room], trusted, skipped, tau


def _choose(args, parent_reward, forecasts, labels, n):
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
