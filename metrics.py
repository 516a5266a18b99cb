"""metrics.py: the bins, and every score a forecaster is judged and trained by.

The paper turns a candidate kernel's speedup S = reference_time / candidate_time into one of 8
log-spaced bins (half-octave wide, bin 4 starts at S = 1). A forecaster answers with 8
probabilities; this module scores those forecasts. It is the bottom layer of the project: the
forecaster's prompt table, the training labels and the GRPO rewards all come from the single bin
definition below, so the prompt and the labels can never disagree (the original's mismatch).

Bins: bin = clamp(floor(2 * log2(S)) + 4, 1, 8), lower edge inclusive.

Reading top to bottom:
1. bins and per-forecast scores (Brier = the paper's half-Brier, CRPS over ordered bins / 7, NLL,
   confidence scores, expected bin and expected log-speedup);
2. (in metrics_io.py) reading prediction files, ours and the paper's published format, into one
   normalised row, and the command line;
3. dataset scores: parse rate, accuracy, ECE (10 buckets), means with parse failures scored as a
   uniform forecast, per task, and mean/std over repeats;
4. selective prediction: risk-coverage, AURC, and Geifman & El-Yaniv's guaranteed-risk threshold;
5. speedup recovered under a measurement budget, and discovery moments;
6. `python metrics.py --help` runs metrics_io's command line; the plots live in metrics_plots.py.

Rule for the predicted bin: the argmax of the probabilities (lowest bin on ties), as in the
forecaster's contract. The paper's data also carries the model's *stated* bin, which can differ;
`load_predictions(..., bin_rule="stated")` scores the stated bin instead (the paper's tables use
it; ECE and max-prob confidence then use p[stated bin]). Either way the disagreement rate between
stated bin and argmax is reported.

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
import math
import sys

import numpy as np

N_BINS = 8
BIN_EDGES = tuple(2.0 ** (k / 2) for k in range(-2, 5))  # 0.5, 0.707, 1, 1.414, 2, 2.828, 4
BIN_NAMES = (
    "severe slowdown",
    "significant slowdown",
    "moderate slowdown",
    "minor slowdown",
    "minor speedup",
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


def hit(p, y):
    """Exact-bin hit: the forecast's argmax bin is the true bin."""
    return predicted_bin(p) == y


def off_by_one_hit(p, y):
    """Hit within one bin (a factor of sqrt(2) in speedup) of the true bin."""
    return abs(predicted_bin(p) - y) <= 1


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


def forecaster_name(row):
    """Name a forecaster by model, and by read-out when the row records one."""
    return row["model"] + (f" [{row['readout']}]" if row.get("readout") else "")


def group_by(rows, key):
    groups = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


# ---- dataset scores -------------------------------------------------------------------------

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


def _mean(xs):
    return float(np.mean(xs)) if len(xs) else None


def scores(rows):
    """Scalar scores of rows from one forecaster (no per-task split, no repeats)."""
    parsed = [r for r in rows if r["probs"] is not None]
    hits = [r["predicted_bin"] == r["true_bin"] for r in parsed]
    full = {name: [] for name in ("brier", "crps", "nll")}
    for r in rows:  # a parse failure is scored as the uniform forecast
        p = UNIFORM if r["probs"] is None else r["probs"]
        for name, fn in (("brier", brier), ("crps", crps), ("nll", nll)):
            full[name].append(fn(p, r["true_bin"]))
    ok = [r["probs"] is not None for r in rows]
    stated = [r for r in parsed if r["stated_bin"] is not None]
    out = {
        "n": len(rows),
        "parse_rate": len(parsed) / len(rows) if rows else None,
        "accuracy": _mean(hits),
        "off_by_one": _mean([abs(r["predicted_bin"] - r["true_bin"]) <= 1 for r in parsed]),
        **{k: _mean(v) for k, v in full.items()},
        **{f"{k}_parsed": _mean([x for x, o in zip(v, ok) if o]) for k, v in full.items()},
        "ece": ece([row_confidence(r) for r in parsed], hits),
        "mean_raw_sum": _mean([r["raw_sum"] for r in parsed if r["raw_sum"] is not None]),
        "stated_disagreement": _mean([r["stated_bin"] != int(np.argmax(r["probs"])) + 1
                                      for r in stated]),
        "aurc": {},
    }
    correct = [r["probs"] is not None and r["predicted_bin"] == r["true_bin"] for r in rows]
    for kind in CONFIDENCE_KINDS:
        out["aurc"][kind] = aurc([row_confidence(r, kind) for r in rows], correct)
    return out


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


if __name__ == "__main__":
    from metrics_io import main  # the command line lives beside the reader of prediction files
    try:
        sys.exit(main())
    except BrokenPipeError:  # `python metrics.py ... | head`: the reader left; exit quietly
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
