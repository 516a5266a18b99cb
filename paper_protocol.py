"""paper_protocol.py: the paper's protocol: what `--protocol paper` changes, and the original's
selective-prediction definitions that `metrics.py --protocol paper` scores with.

What a protocol decides is one table, PROTOCOLS: `ours` is this project's way, `paper` the
original code release's (docs/FIDELITY.md lists each difference and why). The commands with a
--protocol flag offer its names; search.py, forecaster.py and metrics.py fill in from it what a
flag leaves unset (a flag the user sets wins). The prompt each protocol shows the model is
forecast_prompt.py's.

This project scores forecasts its own way (bins.py, selective.py, metrics.py). Under --protocol
paper, metrics.py reads the rows with the stated bin as the scored bin (dataset.load_predictions,
bin_rule="stated") and takes its selective-prediction figures from this module, which follows the
original's definitions:

1. The risk-coverage curve. Thresholds: -inf, every distinct score of a parsed row, +inf. At
   threshold tau a parsed row is trusted unless its score < tau (strict: a tie is trusted); a parse
   failure is always deferred but counts in coverage's denominator. Each point is (tau, coverage
   = trusted / all rows, risk of the trusted set), risk None where it is undefined (nothing
   trusted, for the pointwise risks).
2. Three risks of the trusted set:
   - binary mismatch: the share whose scored bin is not the true bin;
   - speedup distance: the mean |m(scored bin) - S|, S the true speedup, m the original's bin
     midpoints: 2^c with c = -1.5, -0.75, -0.25, 0.25, 0.75, 1.5 for bins 2..7 (the centres of its
     *prompt's* table, not of the bins its labels use), and for bins 1 and 8 the mean true speedup
     of the rows in that bin (0.125 and 4 sqrt 2 when there are none);
   - regret (set level): the best speedup of the rows minus the best one recovers by measuring the
     deferred rows and trusting, among the trusted, the rows forecast in the highest bin.
3. AURC: the trapezoid rule over the points with a risk, sorted by coverage (segments of zero
   width skipped). It spans only the covered range, from the highest threshold's coverage to the
   parse rate: not extended to coverage 0, not normalised; None with fewer than two points.
4. Risk at a coverage: linear interpolation between the two points around it, snapped to the end
   points outside the curve (the paper's selective risk at 50% coverage).
5. The threshold for a target coverage: trust the k = round(coverage * n) highest scores, the
   threshold halfway between the k-th and the (k+1)-th (+inf when k <= 0, -inf when k is at least
   the number of parsed rows). Two gates' agreement: the Jaccard index of their deferred sets
   (None when neither defers).
"""
import math
from dataclasses import dataclass

import numpy as np

from bins import CONFIDENCE_KINDS, confidence

# ---- the protocols: what each decides where a flag is left unset -----------------------------------

@dataclass(frozen=True)
class Protocol:
    """One protocol's defaults; each comment names the flag it fills in when that flag is unset."""
    bin_rule: str         # the scored bin, "argmax" of the probabilities or the "stated" one (metrics.py --bin-rule)
    parse_retries: int    # an answer that does not parse is generated again this often (--parse-retries)
    max_new_tokens: int   # the forecaster's generation budget (forecaster.py --max-new-tokens)
    keep_children: int    # children of one expansion kept in the archive (search.py --keep-children)
    exact_budget: bool    # the search ends when --budget is spent: --steps defaults to the budget, not 40
    paper_scale: bool     # the paper's --budget 320 and 16 --mutations per gated parent on any machine


PROTOCOLS = {
    "ours": Protocol(bin_rule="argmax", parse_retries=0, max_new_tokens=4096, keep_children=2,
                     exact_budget=False, paper_scale=False),
    "paper": Protocol(bin_rule="stated", parse_retries=1, max_new_tokens=16384, keep_children=4,
                      exact_budget=True, paper_scale=True),
}


# ---- the original's selective-prediction definitions ---------------------------------------------

RISKS = ("binary_mismatch", "speedup_distance", "regret")
PROMPT_TABLE_LOG2_CENTRES = {2: -1.5, 3: -0.75, 4: -0.25, 5: 0.25, 6: 0.75, 7: 1.5}


def score(row, kind):
    """A parsed row's confidence; max-prob is p[scored bin] (under this protocol the stated bin)."""
    if kind == "maxprob":
        return float(row["probs"][row["predicted_bin"] - 1])
    return confidence(row["probs"], kind)


# ---- the curve ----------------------------------------------------------------------------------

def _midpoints(rows):
    """Bin -> the original's speedup midpoint, bins 1 and 8 from these rows' true speedups."""
    mids = {b: 2.0 ** c for b, c in PROMPT_TABLE_LOG2_CENTRES.items()}
    for b, fallback in ((1, 0.125), (8, 4.0 * math.sqrt(2))):
        inside = [r["true_speedup"] for r in rows if r["true_bin"] == b]
        mids[b] = float(np.mean(inside)) if inside else fallback
    return mids


def _risk_fn(rows, risk):
    """risk(trusted: bool array over rows) -> float, or None where it is undefined."""
    if risk in ("binary_mismatch", "speedup_distance"):
        mids = _midpoints(rows) if risk == "speedup_distance" else None
        loss = np.array([0.0 if r["probs"] is None  # never trusted: its loss is never read
                         else float(r["predicted_bin"] != r["true_bin"]) if mids is None
                         else abs(mids[r["predicted_bin"]] - r["true_speedup"]) for r in rows])
        return lambda trusted: float(loss[trusted].mean()) if trusted.any() else None
    s = np.array([r["true_speedup"] for r in rows], float)
    forecast_bin = np.array([0 if r["probs"] is None else r["predicted_bin"] for r in rows])

    def regret(trusted):  # measure every deferred row; trust the trusted rows of the top bin
        found = s[~trusted].max() if (~trusted).any() else -math.inf
        if trusted.any():
            top = forecast_bin[trusted].max()
            found = max(found, s[trusted & (forecast_bin == top)].max())
        return float(s.max() - found)
    return regret


def curve(rows, kind="maxprob", risk="binary_mismatch"):
    """[(tau, coverage, risk or None)] in ascending threshold order (module docstring, 1-2)."""
    if not rows:
        return []
    if risk != "binary_mismatch" and any(r["true_speedup"] is None for r in rows):
        return []  # speedup distance and regret need every row's measured speedup
    sc = np.array([score(r, kind) if r["probs"] is not None else np.nan for r in rows])
    parsed = ~np.isnan(sc)
    fn = _risk_fn(rows, risk)
    points = []
    for tau in [-math.inf, *sorted(set(sc[parsed].tolist())), math.inf]:
        trusted = parsed & ~(sc < tau)
        points.append((tau, trusted.sum() / len(rows), fn(trusted)))
    return points


def _valid(points):
    return sorted(((c, r) for _, c, r in points if r is not None), key=lambda p: p[0])  # stable


def aurc(points):
    """Trapezoid area over the points with a risk, sorted by coverage; None below two points."""
    pts = _valid(points)
    if len(pts) < 2:
        return None
    return float(sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(pts, pts[1:]) if b[0] != a[0]))


def risk_at(points, coverage):
    """Linear interpolation of the curve at `coverage`, snapped to its end points."""
    pts = _valid(points)
    if not pts:
        return None
    if coverage <= pts[0][0]:
        return pts[0][1]
    if coverage >= pts[-1][0]:
        return pts[-1][1]
    for a, b in zip(pts, pts[1:]):
        if a[0] <= coverage <= b[0]:
            if a[0] == b[0]:
                return a[1]
            return a[1] + (coverage - a[0]) / (b[0] - a[0]) * (b[1] - a[1])
    return None


# ---- thresholds and agreement ------------------------------------------------------------------

def threshold_for_coverage(rows, coverage, kind="maxprob"):
    """The original's threshold trusting round(coverage * n) rows (module docstring, 5)."""
    scores = sorted((score(r, kind) for r in rows if r["probs"] is not None), reverse=True)
    k = round(coverage * len(rows))
    if not rows or k <= 0:
        return math.inf
    if k >= len(scores):
        return -math.inf
    return 0.5 * (scores[k - 1] + scores[k])


def deferred(rows, tau, kind="maxprob"):
    """Indices of the rows the gate (tau, kind) defers: parse failures and scores below tau."""
    return {i for i, r in enumerate(rows) if r["probs"] is None or score(r, kind) < tau}


def jaccard(a, b):
    """|a & b| / |a | b| of two deferred sets; None when both are empty."""
    union = a | b
    return len(a & b) / len(union) if union else None


def _finite(x):
    return x if x is None or math.isfinite(x) else ("inf" if x > 0 else "-inf")


def selective_scores(rows, coverage=0.5):
    """The selective-prediction figures of the paper protocol for one set of rows.

    aurc and selective_risk_at_50 are the max-prob score with the binary-mismatch risk (the paper's
    headline pair); "selective" has every score x risk; thresholds and the deferral agreement of
    each pair of scores at the same coverage."""
    out = {"selective": {}, "threshold_at_50": {}, "deferral_jaccard_at_50": {}}
    for kind in CONFIDENCE_KINDS:
        out["selective"][kind] = {}
        for risk in RISKS:
            pts = curve(rows, kind, risk)
            out["selective"][kind][risk] = {"aurc": aurc(pts), "selective_risk_at_50": risk_at(pts, coverage)}
    head = out["selective"]["maxprob"]["binary_mismatch"]
    out["aurc"], out["selective_risk_at_50"] = head["aurc"], head["selective_risk_at_50"]
    sets = {}
    for kind in CONFIDENCE_KINDS:
        tau = threshold_for_coverage(rows, coverage, kind)
        sets[kind] = deferred(rows, tau, kind)
        out["threshold_at_50"][kind] = {"threshold": _finite(tau),
                                        "coverage": 1 - len(sets[kind]) / len(rows) if rows else None}
    for i, a in enumerate(CONFIDENCE_KINDS):
        for b in CONFIDENCE_KINDS[i + 1:]:
            out["deferral_jaccard_at_50"][f"{a}/{b}"] = jaccard(sets[a], sets[b])
    return out
