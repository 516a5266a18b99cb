"""bins.py: the 8 speedup bins, and the score of one forecast.

The paper turns a candidate kernel's speedup S = reference_time / candidate_time into one of 8
log-spaced bins (half-octave wide, bin 4 starts at S = 1). A forecaster answers with 8
probabilities, one per bin. This module is the project's single bin definition: the forecaster's
prompt table, the training labels and the GRPO rewards all come from it, so the prompt and the
labels can never disagree (the original's mismatch). It imports nothing from the project.

Bins: bin = clamp(floor(2 * log2(S)) + 4, 1, 8), lower edge inclusive.

Reading top to bottom:
1. the bins: speedup -> bin, each bin's interval, label and representative log2-speedup;
2. the score of one forecast p against the true bin y: the proper scoring rules the paper trains
   and judges by (Brier = the paper's half-Brier, CRPS over the ordered bins / 7, NLL);
3. what one forecast says: its predicted bin (the argmax, lowest bin on ties), exact and off-by-one
   hits, its confidence (the selective gate's score), expected bin and expected log2-speedup;
4. what a search's measured candidates say: fast_p, KernelBench's share of correct, faster kernels.
Scores over a whole dataset are in metrics.py; trusting confident forecasts in selective.py.
"""
import math

import numpy as np

N_BINS = 8
BIN_EDGES = tuple(2.0 ** (k / 2) for k in range(-2, 5))  # 0.5, 0.707, 1, 1.414, 2, 2.828, 4
# Names that fit the intervals: bins 1-3 are slowdowns, bin 4 [1, 1.41x) is parity to a slight
# speedup, bins 5-8 are speedups. (The original named bin 4 "minor slowdown": its prompt's table
# had other intervals than its labels; forecast_prompt.py shows that table under --protocol paper.)
BIN_NAMES = (
    "severe slowdown",
    "significant slowdown",
    "slight slowdown",
    "parity to slight speedup",
    "moderate speedup",
    "significant speedup",
    "high speedup",
    "extreme speedup",
)
BINS = tuple(range(1, N_BINS + 1))


def speedup_to_bin(speedup):
    """Ground-truth bin (1..8) of a speedup S > 0; raises ValueError for S <= 0, NaN or inf."""
    s = float(speedup)
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"speedup must be a finite number > 0, got {speedup!r}")
    b = min(max(math.floor(2 * math.log2(s)) + 4, 1), N_BINS)
    # The float log can land one off at an exact edge (e.g. S = sqrt(2)); the edges are
    # lower-inclusive, so settle it against the edges themselves.
    if b < N_BINS and s >= BIN_EDGES[b - 1]:
        b += 1
    elif b > 1 and s < BIN_EDGES[b - 2]:
        b -= 1
    return b


def bin_interval(b):
    """(low, high) speedup interval of bin b; the open ends are 0 and inf."""
    _check_bin(b)
    low = 0.0 if b == 1 else BIN_EDGES[b - 2]
    high = math.inf if b == N_BINS else BIN_EDGES[b - 1]
    return low, high


def bin_label(b):
    """Human-readable interval, e.g. '[1.00x, 1.41x)' or '< 0.50x'."""
    low, high = bin_interval(b)
    if b == 1:
        return f"< {high:.2f}x"
    if b == N_BINS:
        return f">= {low:.2f}x"
    return f"[{low:.2f}x, {high:.2f}x)"


# Representative log2-speedup of each bin: the centre of the half-octave for bins 2..7. The open
# bins get the centre of the next half-octave beyond their edge (S = 2^-1.25 = 0.42x for bin 1,
# S = 2^2.25 = 4.76x for bin 8), i.e. they are treated as if they were as wide as the others.
# This keeps expected log-speedup linear in the expected bin index: E[log2 S] = (E[bin] - 3.5) / 2.
# (Bin b spans log2 S in [(b - 4) / 2, (b - 3) / 2); an earlier (b - 4.5) / 2 was a bin too low.)
BIN_LOG2_SPEEDUP = tuple((b - 3.5) / 2 for b in BINS)


def _check_bin(b):
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 1 <= b <= N_BINS:
        raise ValueError(f"bin must be an integer in 1..{N_BINS}, got {b!r}")


def as_probs(p):
    """Validate 8 probabilities and return them as a float64 array summing to one."""
    arr = np.asarray(p, dtype=np.float64)
    if arr.shape != (N_BINS,):
        raise ValueError(f"expected {N_BINS} probabilities, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("probabilities must be finite and >= 0")
    total = arr.sum()
    if total <= 0:
        raise ValueError("probabilities are all zero")
    return arr / total


UNIFORM = np.full(N_BINS, 1.0 / N_BINS)


# ---- per-forecast scores (p: 8 probabilities, y: true bin 1..8) --------------------------------

def brier(p, y):
    """Half-Brier score 0.5 * sum_b (p_b - [b == y])^2, in [0, 1]; uniform p gives 0.4375."""
    p = as_probs(p)
    _check_bin(y)
    onehot = np.zeros(N_BINS)
    onehot[y - 1] = 1.0
    return float(0.5 * np.sum((p - onehot) ** 2))


def crps(p, y):
    """Ranked probability score over the ordered bins, normalised by 7, in [0, 1].

    F_k = sum_{b<=k} p_b; CRPS = (1/7) * sum_{k=1..7} (F_k - [k >= y])^2. A near miss costs less
    than a far miss, which the Brier score cannot tell apart.
    """
    p = as_probs(p)
    _check_bin(y)
    cdf = np.cumsum(p)[: N_BINS - 1]
    step = (np.arange(1, N_BINS) >= y).astype(np.float64)
    return float(np.sum((cdf - step) ** 2) / (N_BINS - 1))


def nll(p, y):
    """Negative log-likelihood of the true bin, -ln max(p_y, 1e-12)."""
    p = as_probs(p)
    _check_bin(y)
    return float(-math.log(max(p[y - 1], 1e-12)))


def predicted_bin(p):
    """The forecast's bin: the argmax of the probabilities (lowest bin on ties)."""
    return int(np.argmax(as_probs(p))) + 1


def hit(predicted, y):
    """Exact-bin hit: the forecast's predicted bin is the true bin (the paper's accuracy)."""
    return predicted == y


def off_by_one_hit(predicted, y):
    """Hit within one bin (a factor of sqrt(2) in speedup) of the true bin (off-by-one accuracy)."""
    return abs(predicted - y) <= 1


CONFIDENCE_KINDS = ("maxprob", "entropy", "margin")


def confidence(p, kind="maxprob"):
    """Confidence of a forecast, higher = more confident, in [0, 1].

    maxprob: p of the predicted bin; entropy: 1 - H(p) / ln 8 (H in nats); margin: top-1 minus
    top-2 probability.
    """
    p = as_probs(p)
    if kind == "maxprob":
        return float(p.max())
    if kind == "entropy":
        nz = p[p > 0]
        # Clamped: rounding can push a uniform forecast to -1e-16.
        return float(min(1.0, max(0.0, 1.0 + np.sum(nz * np.log(nz)) / math.log(N_BINS))))
    if kind == "margin":
        top = np.sort(p)[::-1]
        return float(top[0] - top[1])
    raise ValueError(f"unknown confidence kind {kind!r}; choose one of: {', '.join(CONFIDENCE_KINDS)}")


def expected_bin(p):
    """sum_b b * p_b: the paper's ranking key in the surrogate-filtered search."""
    return float(np.dot(as_probs(p), BINS))


def expected_log2_speedup(p):
    """Expected log2-speedup using BIN_LOG2_SPEEDUP as each bin's representative value."""
    return float(np.dot(as_probs(p), BIN_LOG2_SPEEDUP))


def prob_at_least(p, speedup):
    """P(S >= speedup) under the forecast: the mass of the bin holding `speedup` and all above.

    Exact at a bin edge (prob_at_least(p, math.sqrt(2)) = p_5 + ... + p_8); between edges the bin
    holding `speedup` counts whole. Note 1.414 itself is just below sqrt(2), i.e. in bin 4.
    """
    p = as_probs(p)
    b = speedup_to_bin(speedup)
    return float(p[b - 1:].sum())


# ---- a search's candidates -----------------------------------------------------------------------

def fast_p(speedups, p=1.0):
    """fast_p (KernelBench): the share of candidates that are correct and more than p times as fast
    as the reference. speedups: one per measured candidate, None when it failed; None if empty."""
    return sum(s is not None and s > p for s in speedups) / len(speedups) if speedups else None
