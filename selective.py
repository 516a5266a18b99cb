"""selective.py: is a forecast's confidence honest, and how far can it be trusted?

The paper's selective surrogate trusts a confident forecast and sends an uncertain one to the GPU.
That works only if confidence means something. This module measures both halves, over a set of
labelled forecasts (confidence per row: None for a parse failure, always deferred; correct: the
predicted bin is the true bin):
1. calibration: the reliability diagram's buckets and the expected calibration error (ECE) - does
   a forecast that says 80% land in its bin 80% of the time?
2. selective prediction: the gate "trust when confidence >= tau". Sweeping tau gives the
   risk-coverage curve (coverage = trusted / all rows, risk = bin-mismatch rate among trusted);
   AURC is its area; selective_risk reads the curve at one coverage;
3. a threshold with a guarantee: Geifman & El-Yaniv's selection with guaranteed risk (SGR, 2017),
   the threshold whose true risk stays below a target with probability 1 - delta. gate.py's
   Gate.from_labelled learns the gate's threshold with it (the search's confidence gate); the
   threshold's use, trust or defer, is gate.py's.
"""
import math

import numpy as np

from bins import confidence

# ---- calibration ----------------------------------------------------------------------------

def row_confidence(row, kind="maxprob"):
    """Confidence of a normalised row, None on a parse failure. maxprob = p[predicted bin]."""
    if row["probs"] is None:
        return None
    if kind == "maxprob":
        return float(row["probs"][row["predicted_bin"] - 1])
    return confidence(row["probs"], kind)


def reliability(confidences, correct, n_buckets=10):
    """Per equal-width bucket (index min(int(conf * 10), 9)): (count, mean confidence, accuracy).

    Rows with confidence None (parse failures) are left out. Empty buckets give (0, None, None).
    """
    sums = np.zeros((n_buckets, 3))
    for c, ok in zip(confidences, correct):
        if c is not None:
            i = min(int(c * n_buckets), n_buckets - 1)
            sums[i] += (1, c, bool(ok))
    return [(int(n), s / n if n else None, a / n if n else None) for n, s, a in sums]


def ece(confidences, correct, n_buckets=10):
    """Expected calibration error sum_i n_i/N |mean_conf_i - acc_i| over scored rows, None if none."""
    buckets = reliability(confidences, correct, n_buckets)
    total = sum(n for n, _, _ in buckets)
    if total == 0:
        return None
    return float(sum(n / total * abs(c - a) for n, c, a in buckets if n))


# ---- selective prediction: trust confident forecasts, defer the rest to the GPU ----------------

def _selective_arrays(confidences, correct):
    if len(confidences) != len(correct):
        raise ValueError(f"{len(confidences)} confidences but {len(correct)} correctness flags")
    conf = np.array([np.nan if c is None else float(c) for c in confidences], dtype=np.float64)
    return conf, np.asarray(correct, dtype=bool)


def risk_coverage(confidences, correct):
    """The risk-coverage curve of the gate "trust when confidence >= tau".

    confidences: one per row, None for a parse failure (always deferred, but counted in the total).
    correct: whether each row's predicted bin is the true bin. tau sweeps every observed
    confidence, ascending, so coverage (trusted / all rows) never increases along the curve; risk is
    the bin-mismatch rate among trusted rows. Returns (thresholds, coverage, risk) arrays.
    """
    conf, ok = _selective_arrays(confidences, correct)
    scored = ~np.isnan(conf)
    taus = np.unique(conf[scored])
    coverage, risk = [], []
    for tau in taus:
        trusted = scored & (conf >= tau)
        coverage.append(trusted.sum() / len(conf))
        risk.append(1.0 - ok[trusted].mean())
    return taus, np.array(coverage), np.array(risk)


def aurc(confidences, correct):
    """Area under the risk-coverage curve (trapezoid rule), lower is better; None if nothing parsed.

    The curve runs from the highest threshold's coverage to the parse rate; we extend it flat to
    coverage 0 so that a forecaster with one confidence value for every row gets risk * coverage,
    not a zero-width area of 0. Parse failures shorten the curve (less area): read AURC next to
    the parse rate.
    """
    _, coverage, risk = risk_coverage(confidences, correct)
    if len(coverage) == 0:
        return None
    x = np.concatenate([[0.0], coverage[::-1]])
    y = np.concatenate([[risk[-1]], risk[::-1]])
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def selective_risk(confidences, correct, coverage):
    """(risk, achieved coverage, tau) of the highest threshold whose coverage >= `coverage`.

    None when no threshold reaches that coverage (e.g. above the parse rate).
    """
    taus, cov, risk = risk_coverage(confidences, correct)
    ok = np.nonzero(cov >= coverage - 1e-12)[0]
    if len(ok) == 0:
        return None
    i = ok[-1]
    return float(risk[i]), float(cov[i]), float(taus[i])


# ---- a threshold with a guaranteed risk (SGR) ---------------------------------------------------

def binomial_cdf(k, n, p):
    """P(Binomial(n, p) <= k), summed in log space so large n does not overflow."""
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    j = np.arange(1, k + 1)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log(n - j + 1) - np.log(j))])  # ln C(n, j)
    j = np.arange(k + 1)
    log_terms = log_comb + j * math.log(p) + (n - j) * math.log1p(-p)
    top = log_terms.max()
    return float(min(1.0, math.exp(top) * np.exp(log_terms - top).sum()))


def risk_upper_bound(errors, n, delta):
    """B*(r_hat, delta, n): the largest risk b with P(Binomial(n, b) <= errors) >= delta.

    The exact one-sided (Clopper-Pearson) binomial upper bound: with probability >= 1 - delta the
    true risk of n i.i.d. trusted rows with `errors` mistakes is at most B*. The tail probability
    decreases in b, so bisection on [0, 1] finds the root to ~1e-12.
    """
    if n <= 0:
        return 1.0
    lo, hi = 0.0, 1.0
    if errors >= n:
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if binomial_cdf(errors, n, mid) >= delta:
            lo = mid
        else:
            hi = mid
    return hi


def guaranteed_risk_threshold(confidences, correct, target_risk, delta):
    """Selection with guaranteed risk (SGR; Geifman & El-Yaniv, 2017, Algorithm 1).

    Finds a threshold tau such that, with probability >= 1 - delta over the draw of these labelled
    rows, the gate "trust when confidence >= tau" has true selective risk <= target_risk on new rows
    from the same distribution. Sort the m parsed rows' confidences; binary-search the threshold
    index for ceil(log2 m) steps; at each candidate tau with n trusted rows of which e are wrong
    (empirical risk r_hat = e / n), bound the risk by B*(r_hat, delta', n), the root in b of
        sum_{j=0..e} C(n, j) b^j (1 - b)^(n - j) = delta',   delta' = delta / ceil(log2 m)
    (Bonferroni over the steps); move toward more coverage when B* < target_risk, else toward
    less. Returns the accepted threshold with the highest coverage as a dict (threshold, coverage,
    risk, bound; coverage counts parse failures in the total), or None if no step achieved the
    target.
    """
    conf, ok = _selective_arrays(confidences, correct)
    if not 0 < target_risk < 1 or not 0 < delta < 1:
        raise ValueError("target_risk and delta must lie strictly between 0 and 1")
    scored = ~np.isnan(conf)
    sorted_conf = np.sort(conf[scored])
    m = len(sorted_conf)
    if m == 0:
        return None
    steps = max(1, math.ceil(math.log2(m)))
    delta_step = delta / steps
    z_min, z_max, best = 0, m - 1, None
    for _ in range(steps):
        z = math.ceil((z_min + z_max) / 2)
        tau = sorted_conf[z]
        trusted = scored & (conf >= tau)
        n, errors = int(trusted.sum()), int((~ok[trusted]).sum())
        bound = risk_upper_bound(errors, n, delta_step)
        if bound < target_risk:
            if best is None or n / len(conf) > best["coverage"]:
                best = {"threshold": float(tau), "coverage": n / len(conf),
                        "risk": errors / n, "bound": bound}
            z_max = z
        else:
            z_min = z
    return best
