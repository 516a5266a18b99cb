"""Tests for metrics.py: bins, scores, dataset report, selective prediction, budgets, CLI.

Expected numbers come from the paper (docs/PAPER.md §2, §5: bins, uniform Brier/CRPS), from
independent code (scoringrules, brute-force enumeration) or are worked out by hand in the comments.
"""
import inspect
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metrics
import metrics_io
from metrics_io import MetricsInputError

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).resolve().parent / "fixtures"
UNIFORM = [1 / 8] * 8


def onehot(b):
    p = [0.0] * 8
    p[b - 1] = 1.0
    return p


# ---- bins -----------------------------------------------------------------------------------

@pytest.mark.parametrize("s, b", [(0.4, 1), (0.6, 2), (0.8, 3), (1.0, 4), (1.2, 4), (1.5, 5),
                                  (2.0, 6), (3.0, 7), (4.0, 8), (5.0, 8), (1e-3, 1), (1e4, 8)])
def test_bin_checks_from_paper(s, b):
    assert metrics.speedup_to_bin(s) == b


def test_bin_edges_are_lower_inclusive():
    for k, edge in enumerate(metrics.BIN_EDGES):
        assert metrics.speedup_to_bin(edge) == k + 2
        assert metrics.speedup_to_bin(math.nextafter(edge, 0)) == k + 1
    assert metrics.speedup_to_bin(math.sqrt(2)) == 5
    assert metrics.speedup_to_bin(1.414) == 4  # just below sqrt(2)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_bad_speedups_raise(bad):
    with pytest.raises(ValueError, match="finite number > 0"):
        metrics.speedup_to_bin(bad)


def test_bin_intervals_labels_and_representatives():
    assert metrics.bin_interval(1) == (0.0, 0.5)
    assert metrics.bin_interval(4) == (1.0, pytest.approx(math.sqrt(2)))
    assert metrics.bin_interval(8) == (4.0, math.inf)
    assert metrics.bin_label(1) == "< 0.50x"
    assert metrics.bin_label(4) == "[1.00x, 1.41x)"
    assert metrics.bin_label(8) == ">= 4.00x"
    for b in range(2, 8):  # interior bins: the representative is the half-octave's log2 centre
        lo, hi = metrics.bin_interval(b)
        assert metrics.BIN_LOG2_SPEEDUP[b - 1] == pytest.approx((math.log2(lo) + math.log2(hi)) / 2)
    # the open bins: the next half-octave beyond the edge, 2^-1.25 = 0.42x and 2^2.25 = 4.76x
    assert metrics.BIN_LOG2_SPEEDUP[0] == -1.25 and metrics.BIN_LOG2_SPEEDUP[7] == 2.25
    for bad in (0, 9, True, 2.0):
        with pytest.raises(ValueError):
            metrics.bin_interval(bad)


# ---- per-forecast scores --------------------------------------------------------------------

def test_uniform_values():
    crps_table = [0.3125, 0.2054, 0.1339, 0.0982, 0.0982, 0.1339, 0.2054, 0.3125]  # docs/PAPER.md §5
    for y in range(1, 9):
        assert metrics.brier(UNIFORM, y) == pytest.approx(0.4375)
        assert metrics.crps(UNIFORM, y) == pytest.approx(crps_table[y - 1], abs=5e-5)
        assert metrics.nll(UNIFORM, y) == pytest.approx(math.log(8))
    assert metrics.confidence(UNIFORM, "maxprob") == 0.125
    assert metrics.confidence(UNIFORM, "entropy") == pytest.approx(0.0, abs=1e-12)
    assert metrics.confidence(UNIFORM, "margin") == 0.0
    assert metrics.expected_bin(UNIFORM) == 4.5 and metrics.expected_log2_speedup(UNIFORM) == 0.5


def test_perfect_and_far_miss():
    for y in range(1, 9):
        assert metrics.brier(onehot(y), y) == 0 and metrics.crps(onehot(y), y) == 0
        assert metrics.nll(onehot(y), y) == 0
        assert metrics.hit(onehot(y), y) and metrics.confidence(onehot(y), "entropy") == 1.0
    assert metrics.crps(onehot(1), 8) == 1.0 and metrics.brier(onehot(1), 8) == 1.0
    assert metrics.nll(onehot(1), 8) == pytest.approx(-math.log(1e-12))
    # near miss beats far miss under CRPS; Brier cannot tell them apart
    assert metrics.crps(onehot(7), 8) == pytest.approx(1 / 7)
    assert metrics.crps(onehot(2), 8) == pytest.approx(6 / 7)
    assert metrics.brier(onehot(7), 8) == metrics.brier(onehot(2), 8)
    assert metrics.off_by_one_hit(onehot(7), 8) and not metrics.off_by_one_hit(onehot(6), 8)


def test_scores_hand_example():
    p = [0, 0, 0.1, 0.9, 0, 0, 0, 0]
    assert metrics.brier(p, 3) == pytest.approx(0.81)  # 0.5 * (0.9^2 + 0.9^2)
    assert metrics.crps(p, 3) == pytest.approx(0.81 / 7)  # only F_3 = 0.1 vs 1 differs
    assert metrics.nll(p, 3) == pytest.approx(math.log(10))
    assert metrics.confidence(p, "margin") == pytest.approx(0.8)
    assert metrics.predicted_bin([0, 0, 0, 0.5, 0.5, 0, 0, 0]) == 4  # lowest bin on ties
    assert metrics.prob_at_least([0, 0, 0, 0.25, 0.25, 0.5, 0, 0], math.sqrt(2)) == 0.75
    assert metrics.as_probs([2, 2, 0, 0, 0, 0, 0, 0])[0] == 0.5
    for bad in ([1] * 7, [-1, 2, 0, 0, 0, 0, 0, 0], [0] * 8, [float("nan")] + [1] * 7):
        with pytest.raises(ValueError):
            metrics.as_probs(bad)


def test_crps_matches_scoringrules():
    import scoringrules as sr

    params = list(inspect.signature(sr.rps_score).parameters)
    assert params[:2] == ["obs", "fct"]  # obs is the 1-based category, fct the probabilities
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = rng.dirichlet(np.full(8, 0.5))
        y = int(rng.integers(1, 9))
        assert metrics.crps(p, y) == pytest.approx(float(sr.rps_score(y, p)) / 7, abs=1e-12)


probs_st = st.lists(st.floats(0, 1, allow_nan=False), min_size=8, max_size=8).filter(
    lambda p: sum(p) > 1e-6)
bins_st = st.integers(1, 8)


@settings(max_examples=150, deadline=None)
@given(probs_st, bins_st)
def test_score_ranges_and_invariants(raw, y):
    p = metrics.as_probs(raw)
    b, c, n = metrics.brier(p, y), metrics.crps(p, y), metrics.nll(p, y)
    assert -1e-12 <= b <= 1 + 1e-12 and -1e-12 <= c <= 1 + 1e-12 and n >= 0
    for kind in metrics.CONFIDENCE_KINDS:
        assert 0 <= metrics.confidence(p, kind) <= 1 + 1e-12
    # CRPS is convex in p: at most the mixture of point-mass scores, E|B - y| / 7
    assert c <= np.dot(p, np.abs(np.arange(1, 9) - y)) / 7 + 1e-12
    assert b <= 1 - p[y - 1] + 1e-12  # since sum p_b^2 <= 1
    # reversing the bin order (and the truth) leaves CRPS unchanged
    assert metrics.crps(p[::-1], 9 - y) == pytest.approx(c, abs=1e-12)
    assert metrics.expected_log2_speedup(p) == pytest.approx((metrics.expected_bin(p) - 3.5) / 2)
    assert 1 <= metrics.expected_bin(p) <= 8 + 1e-12


@settings(max_examples=60, deadline=None)
@given(probs_st, bins_st, st.permutations(list(range(8))))
def test_brier_and_nll_permutation_invariant(raw, y, perm):
    p = metrics.as_probs(raw)
    q = p[perm]  # q[i] = p[perm[i]]: the true bin moves to where p[y-1] went
    y2 = perm.index(y - 1) + 1
    assert metrics.brier(q, y2) == pytest.approx(metrics.brier(p, y), abs=1e-12)
    assert metrics.nll(q, y2) == pytest.approx(metrics.nll(p, y), abs=1e-12)
    assert metrics.confidence(q, "entropy") == pytest.approx(metrics.confidence(p, "entropy"))


# ---- dataset report ------------------------------------------------------------------------

def make_row(probs, true_bin, task="t", repeat=None, speedup=None, rid=None):
    return {"id": rid, "task": task, "model": "m", "readout": None, "repeat": repeat,
            "probs": None if probs is None else list(metrics.as_probs(probs)),
            "parse_failed": probs is None, "parse_error": None, "stated_bin": None,
            "predicted_bin": None if probs is None else metrics.predicted_bin(probs),
            "raw_sum": None, "true_bin": true_bin, "true_speedup": speedup, "where": "x"}


def test_ece_hand_example():
    # confidences 0.95 (hit), 0.92 (miss) -> bucket 9: conf 0.935, acc 0.5, gap 0.435, weight 2/4
    # 0.35 (hit), 0.31 (hit)             -> bucket 3: conf 0.33, acc 1, gap 0.67, weight 2/4
    # ECE = 0.5 * 0.435 + 0.5 * 0.67 = 0.5525; the parse failure (None) is left out
    confs = [0.95, 0.92, 0.35, 0.31, None]
    hits = [True, False, True, True, False]
    assert metrics.ece(confs, hits) == pytest.approx(0.5525)
    assert metrics.reliability(confs, hits)[9] == (2, pytest.approx(0.935), 0.5)
    assert metrics.reliability([1.0], [True])[9][0] == 1  # conf 1.0 falls in the last bucket
    assert metrics.ece([None], [False]) is None


def test_report_failure_scored_uniform_and_repeats():
    rows = [make_row(onehot(3), 3, repeat=0), make_row(None, 5, repeat=0),
            make_row(onehot(3), 3, repeat=1), make_row(onehot(2), 3, repeat=1)]
    rep = metrics.report(rows)
    assert rep["parse_rate"] == 0.75 and rep["accuracy"] == pytest.approx(2 / 3)
    assert rep["off_by_one"] == 1.0
    # Brier: 0, 0.4375 (uniform for the failure), 0, 1  -> mean 1.4375 / 4; parsed-only 1 / 3
    assert rep["brier"] == pytest.approx(1.4375 / 4)
    assert rep["brier_parsed"] == pytest.approx(1 / 3)
    assert rep["nll"] == pytest.approx((math.log(8) - math.log(1e-12)) / 4)
    # per repeat accuracy: 1/1 and 1/2 -> mean 0.75, sample std sqrt(2 * 0.25^2) = 0.35355
    assert rep["repeats"]["n"] == 2
    assert rep["repeats"]["mean"]["accuracy"] == pytest.approx(0.75)
    assert rep["repeats"]["std"]["accuracy"] == pytest.approx(math.sqrt(0.125))
    assert rep["speedup_recovered"] is None  # only bins known


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), probs_st), bins_st,
                          st.floats(0.1, 10)), min_size=1, max_size=12), st.randoms())
def test_report_invariant_to_row_order(items, rnd):
    rows = [make_row(p, metrics.speedup_to_bin(s), speedup=s) for p, _, s in items]
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    a, b = metrics.report(rows), metrics.report(shuffled)
    for key in ("parse_rate", "accuracy", "brier", "crps", "nll", "ece"):
        assert (a[key] is None and b[key] is None) or a[key] == pytest.approx(b[key])
    assert a["aurc"]["maxprob"] == pytest.approx(b["aurc"]["maxprob"]) if a["aurc"]["maxprob"] \
        is not None else b["aurc"]["maxprob"] is None
    assert a["speedup_recovered"]["mean"] == pytest.approx(b["speedup_recovered"]["mean"])
    for key in ("brier", "crps"):
        assert 0 <= a[key] <= 1 + 1e-12


# ---- selective prediction -------------------------------------------------------------------

def test_risk_coverage_and_aurc_hand_example():
    confs = [0.9, 0.8, 0.6, 0.6, None]
    correct = [True, False, True, False, False]
    taus, cov, risk = metrics.risk_coverage(confs, correct)
    # tau 0.6: 4 of 5 trusted, 2 wrong; tau 0.8: 2 trusted, 1 wrong; tau 0.9: 1 trusted, right
    assert list(taus) == [0.6, 0.8, 0.9]
    assert list(cov) == pytest.approx([0.8, 0.4, 0.2]) and list(risk) == pytest.approx([0.5, 0.5, 0])
    # trapezoids from coverage 0 (flat at risk 0): 0.2*0 + 0.2*(0+0.5)/2 + 0.4*(0.5+0.5)/2 = 0.25
    assert metrics.aurc(confs, correct) == pytest.approx(0.25)
    assert metrics.selective_risk(confs, correct, 0.3) == (0.5, pytest.approx(0.4), 0.8)
    assert metrics.selective_risk(confs, correct, 0.9) is None  # above the parse rate
    # one confidence for every row: area = risk * coverage, not 0
    assert metrics.aurc([0.5] * 4, [True, False, True, True]) == pytest.approx(0.25)
    assert metrics.aurc([None, None], [False, False]) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 1)), st.booleans()), min_size=1,
                max_size=40))
def test_risk_coverage_monotone(pairs):
    confs, correct = [c for c, _ in pairs], [k for _, k in pairs]
    taus, cov, risk = metrics.risk_coverage(confs, correct)
    assert np.all(np.diff(taus) > 0) and np.all(np.diff(cov) <= 0)
    assert np.all((risk >= 0) & (risk <= 1))
    n_scored = sum(c is not None for c in confs)
    if n_scored:
        assert cov[0] == pytest.approx(n_scored / len(confs))  # lowest tau trusts every parsed row
        assert 0 <= metrics.aurc(confs, correct) <= 1


def test_risk_upper_bound_is_clopper_pearson():
    # zero errors: (1 - b)^n = delta has the closed form b = 1 - delta^(1/n)
    assert metrics.risk_upper_bound(0, 100, 0.05) == pytest.approx(1 - 0.05 ** (1 / 100), rel=1e-9)
    b = metrics.risk_upper_bound(7, 80, 0.01)
    tail = sum(math.comb(80, j) * b ** j * (1 - b) ** (80 - j) for j in range(8))
    assert tail == pytest.approx(0.01, rel=1e-6) and b > 7 / 80
    assert metrics.risk_upper_bound(5, 5, 0.1) == 1.0


def draw_selective_set(rng, m):
    """Confidence u ~ U(0, 1); the forecast is wrong with probability 0.5 * (1 - u)^2."""
    u = rng.random(m)
    return u, rng.random(m) >= 0.5 * (1 - u) ** 2


def test_guaranteed_risk_threshold_holds_empirically():
    rng = np.random.default_rng(1)
    target, delta, violations, trials = 0.1, 0.1, 0, 40
    for _ in range(trials):
        conf, correct = draw_selective_set(rng, 2000)
        res = metrics.guaranteed_risk_threshold(list(conf), list(correct), target, delta)
        assert res is not None and res["risk"] <= res["bound"] < target
        assert res["coverage"] == pytest.approx(np.mean(conf >= res["threshold"]))
        # true selective risk of "trust u >= tau": E[0.5 (1 - u)^2 | u >= tau] = (1 - tau)^2 / 6
        violations += (1 - res["threshold"]) ** 2 / 6 > target
        assert res["coverage"] > 0.4  # not vacuous: the risk-0.1 threshold is tau = 0.225
    assert violations <= delta * trials
    # unachievable targets give None: every forecast wrong
    assert metrics.guaranteed_risk_threshold([0.9, 0.8, 0.7], [False] * 3, 0.05, 0.1) is None
    # parse failures count in the coverage's total
    res = metrics.guaranteed_risk_threshold([0.9] * 50 + [None] * 50, [True] * 100, 0.2, 0.1)
    assert res["coverage"] == 0.5 and res["risk"] == 0.0


# ---- speedup recovered and discovery moments ------------------------------------------------

def brute_force_random(values, k):
    subsets = list(itertools.combinations(values, k))
    return sum(max(s) for s in subsets) / len(subsets)


def test_expected_best_of_random_subset_matches_enumeration():
    values = [0.3, 1.7, 1.1, 2.9, 0.8, 1.7, 5.0]
    for k in range(1, len(values) + 1):
        assert metrics.expected_best_of_random_subset(values, k) == pytest.approx(
            brute_force_random(values, k))


def test_ties_are_an_expectation_over_tie_breaking():
    keys = [3.0, 1.0, 1.0, 1.0, None]
    speedups = [1.2, 4.0, 0.5, 2.0, 9.0]
    for k in range(1, 6):
        found = []  # enumerate every order of the tied keys (and of the failure at the end)
        for perm in itertools.permutations([1, 2, 3]):
            order = [0, *perm, 4]
            found.append(max(speedups[i] for i in order[:k]))
        assert metrics.expected_best_of_top(keys, speedups, k) == pytest.approx(np.mean(found))


def test_speedup_recovered_oracle_constant_and_budgets():
    rng = np.random.default_rng(3)
    s = rng.lognormal(0, 0.7, size=37)
    oracle = metrics.speedup_recovered(np.log2(s), s)
    assert all(v == pytest.approx(1.0) for v in oracle["by_budget"].values())
    const = metrics.speedup_recovered([0.0] * 37, s)
    assert const["by_budget"] == pytest.approx(const["random_by_budget"])
    k5 = metrics.budget_size(5, 37)  # ceil(1.85) = 2
    assert k5 == 2 and const["by_budget"]["5%"] == pytest.approx(
        metrics.expected_best_of_random_subset(s, 2) / s.max())
    assert metrics.budget_size(10, 30) == 3 and metrics.budget_size(1, 5) == 1
    # an inverted ranking measures the worst first
    worst = metrics.speedup_recovered(-np.log2(s), s)
    assert worst["by_budget"]["1%"] == pytest.approx(s.min() / s.max())
    # parse failures rank last even below a pessimistic forecast
    res = metrics.speedup_recovered([None, -5.0], [10.0, 1.0], budgets=(50,))
    assert res["by_budget"]["50%"] == pytest.approx(0.1)


def test_discovery_moments_hand_example():
    rows = [make_row([0, 0, 0, 0.3, 0.7, 0, 0, 0], 5),  # P(>=1.414x) 0.7, a discovery
            make_row([0, 0, 0, 0.6, 0.4, 0, 0, 0], 6),  # 0.4, a discovery
            make_row([0, 0, 0.2, 0.2, 0, 0.6, 0, 0], 3),  # 0.6, not one
            make_row([0, 0, 0, 1, 0, 0, 0, 0], 4),  # 0.0, not one
            make_row(None, 8)]  # parse failure: never flagged, a discovery
    d = metrics.discovery_moments(rows, tau=0.5)
    # flagged: rows 1 and 3 -> precision 1/2; recall 1 of 3 discoveries; base rate 3/5
    assert (d["flagged"], d["precision"], d["recall"]) == (2, 0.5, pytest.approx(1 / 3))
    assert d["base_rate"] == 0.6 and d["discoveries"] == 3
    assert [c["tau"] for c in d["curve"]] == pytest.approx([0.0, 0.4, 0.6, 0.7])
    assert d["curve"][0]["recall"] == pytest.approx(2 / 3)  # tau 0 still misses the failure


# ---- reading files, bad input ---------------------------------------------------------------

def test_load_both_formats():
    ours = metrics_io.load_predictions(FIX / "our_predictions.jsonl")
    assert len(ours) == 7 and ours[3]["parse_failed"] and ours[3]["probs"] is None
    assert ours[1]["true_bin"] == 4 and ours[1]["stated_bin"] == 5 and ours[1]["predicted_bin"] == 4
    paper = metrics_io.load_predictions(FIX / "paper_predictions.jsonl", FIX / "paper_eval_rows.jsonl")
    assert {metrics.forecaster_name(r) for r in paper} == {"base", "brier"}
    e3 = paper[2]
    assert (e3["task"], e3["true_bin"], e3["true_speedup"], e3["raw_sum"]) == ("trimul", 4, 1.1, 0.8)
    assert e3["predicted_bin"] == 4 and e3["stated_bin"] == 3
    stated = metrics_io.load_predictions(FIX / "paper_predictions.jsonl", FIX / "paper_eval_rows.jsonl",
                                      bin_rule="stated")
    assert stated[2]["predicted_bin"] == 3 and stated[7]["predicted_bin"] == 8


GOOD = {"id": "a", "task": "fp8_quant", "model": "m", "probs": onehot(4), "parse_failed": False,
        "true_speedup": 1.2}
PAPER_GOOD = {"comparison_id": "e1", "pack": "trimul", "surrogate_label": "base", "repeat": 0,
              "predicted_bin": 6, "bin_probabilities": [{"bin": b, "p": 1.0 if b == 6 else 0.0}
                                                        for b in range(1, 9)],
              "parse_failed": False}


def write_lines(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


BAD_CASES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "one JSON object"),
    ({**GOOD, "probs": None}, "missing field 'probs'"),
    ({k: v for k, v in GOOD.items() if k != "true_speedup"}, "missing field 'true_speedup'"),
    ({k: v for k, v in GOOD.items() if k != "task"}, "missing field 'task'"),
    ({**GOOD, "probs": [0.5, -0.1, 0.6, 0, 0, 0, 0, 0]}, "negative"),
    ({**GOOD, "probs": [0] * 8}, "all zeros"),
    ({**GOOD, "probs": [0.5, 0.5]}, "list of 8"),
    ({**GOOD, "probs": [0.5, "x", 0.5, 0, 0, 0, 0, 0]}, "list of 8"),
    ({**GOOD, "true_bin": 9}, "true_bin must be an integer bin"),
    ({**GOOD, "stated_bin": 0}, "stated_bin must be an integer bin"),
    ({**GOOD, "true_speedup": -2.0}, "true_speedup must be a finite number > 0"),
    ({**GOOD, "true_bin": 7}, "disagrees"),
    ({**GOOD, "parse_failed": "no"}, "parse_failed must be"),
    ({**PAPER_GOOD, "bin_probabilities": [{"bin": 9, "p": 1.0}]}, "bin_probabilities bin"),
    ({**PAPER_GOOD, "bin_probabilities": [{"bin": 6, "p": 1.0}]}, "each of bins"),
    ({**PAPER_GOOD, "predicted_bin": 12}, "predicted_bin must be an integer bin"),
    ({**PAPER_GOOD, "comparison_id": "nope"}, "not in"),
    ({k: v for k, v in PAPER_GOOD.items() if k != "comparison_id"}, "missing field 'comparison_id'"),
]


@pytest.mark.parametrize("line, message", BAD_CASES)
def test_bad_input_names_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path, [GOOD, line])
    rows = write_lines(tmp_path, [{"comparison_id": "e1", "pack": "trimul", "true_bin": 6}],
                       "rows.jsonl")
    with pytest.raises(MetricsInputError, match=message) as err:
        metrics_io.load_predictions(path, rows)
    assert str(err.value).startswith(f"{path}:2: ")


def test_bad_input_other_cases(tmp_path):
    with pytest.raises(MetricsInputError, match="with --rows"):
        metrics_io.load_predictions(write_lines(tmp_path, [PAPER_GOOD]))
    with pytest.raises(MetricsInputError, match="cannot read"):
        metrics_io.load_predictions(tmp_path / "missing.jsonl")
    with pytest.raises(MetricsInputError, match="no prediction rows"):
        metrics_io.load_predictions(write_lines(tmp_path, ["", "  "]))
    bad_rows = write_lines(tmp_path, [{"comparison_id": "e1", "pack": "trimul",
                                       "aggregated_speedup": 0}], "rows.jsonl")
    with pytest.raises(MetricsInputError, match=rf"{bad_rows}:1: aggregated_speedup"):
        metrics_io.load_predictions(write_lines(tmp_path, [PAPER_GOOD]), bad_rows)


def test_paper_parse_failed_rows_count_as_failures(tmp_path):
    # garbage probabilities on a row the paper marked parse_failed: a parse failure, not an error
    failed = {**PAPER_GOOD, "parse_failed": True, "predicted_bin": 11, "parse_error": "bad",
              "bin_probabilities": [{"bin": 1, "p": -3}], "true_bin": 6}
    rows = metrics_io.load_predictions(write_lines(tmp_path, [failed, {**PAPER_GOOD, "true_bin": 6}]))
    assert rows[0]["parse_failed"] and rows[0]["probs"] is None and rows[0]["parse_error"] == "bad"
    rep = metrics.report(rows)
    assert rep["parse_rate"] == 0.5 and rep["accuracy"] == 1.0


# ---- CLI end to end -------------------------------------------------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "metrics.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_cli_our_fixture_json():
    res = run_cli(FIX / "our_predictions.jsonl", "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    # Rows (p = probs, y = true bin; hit uses the argmax, lowest bin on ties):
    #  c1 onehot(7), y7: hit, brier 0, crps 0, nll 0, conf 1.0
    #  c2 {4: .5, 5: .5}, y4 (S 1.2): hit, brier .5*(.25+.25)=.25, crps (.5^2)/7, nll ln2, conf .5
    #  c3 {2: .2, 5: .8}, y2: miss (3 off), brier .5*(.64+.64)=.64, crps 3*.64/7, nll ln5, conf .8
    #  c4 parse failure, y4: uniform: brier .4375, crps (14+30)/64/7 = .6875/7, nll ln8
    #  f1 {7: .25, 8: .75}, y8: hit, brier .0625, crps .0625/7, nll ln(4/3), conf .75
    #  f2 {3: .1, 4: .9}, y3: miss (1 off), brier .81, crps .81/7, nll ln10, conf .9
    #  f3 uniform (parsed), y8 (S 6.0): miss (argmax 1), brier .4375, crps 2.1875/7, nll ln8, conf .125
    assert rep["n"] == 7 and rep["parse_rate"] == pytest.approx(6 / 7)
    assert rep["accuracy"] == pytest.approx(3 / 6) and rep["off_by_one"] == pytest.approx(4 / 6)
    # Brier sum 0+.25+.64+.4375+.0625+.81+.4375 = 2.6375
    assert rep["brier"] == pytest.approx(2.6375 / 7) and rep["brier_parsed"] == pytest.approx(2.2 / 6)
    # CRPS sum (x 7) 0+.25+1.92+.6875+.0625+.81+2.1875 = 5.9175
    assert rep["crps"] == pytest.approx(5.9175 / 7 / 7)
    assert rep["crps_parsed"] == pytest.approx(5.23 / 7 / 6)
    assert rep["nll"] == pytest.approx(math.log(2 * 5 * 8 * 4 / 3 * 10 * 8) / 7)
    # ECE buckets: 9 {1.0 hit, .9 miss}: |.95-.5|; 8 {.8 miss}: .8; 7 {.75 hit}: .25;
    # 5 {.5 hit}: .5; 1 {.125 miss}: .125  -> (2*.45 + .8 + .25 + .5 + .125) / 6
    assert rep["ece"] == pytest.approx(2.575 / 6)
    assert rep["mean_raw_sum"] == pytest.approx(6.05 / 6)  # 1 + .95 + 1 + 1.1 + 1 + 1
    assert rep["stated_disagreement"] == pytest.approx(1 / 5)  # c2 states 5; f3 states none
    # risk-coverage (maxprob), tau ascending .125 .5 .75 .8 .9 1.0: coverage 6/7..1/7,
    # risk .5 .4 .5 2/3 .5 0; trapezoids of width 1/7 from (0, 0):
    # (0 + .25 + 7/12 + 7/12 + .45 + .45) / 7
    assert rep["aurc"]["maxprob"] == pytest.approx((0.25 + 7 / 6 + 0.9) / 7)
    # speedup recovered. cross_entropy pool (3.0, 1.2, 0.6, 1.0), keys E[bin] 7, 4.5, 4.4, fail:
    # top 1 (budgets 1-20%) and top 2 (50%) both hold the 3.0x -> 1.0 everywhere.
    # fp8_quant pool (5.0, 0.8, 6.0), keys 7.75, 3.9, 4.5: top 1 = 5.0 -> 5/6; top 2 = 6.0 -> 1
    # -> mean (5 * 5/6 + 1) / 6 = 31/36; overall = (1 + 31/36) / 2
    sr = rep["speedup_recovered"]
    assert sr["mean"] == pytest.approx((1 + 31 / 36) / 2)
    assert sr["by_budget"]["1%"] == pytest.approx((1 + 5 / 6) / 2) and sr["by_budget"]["50%"] == 1
    # random: cross_entropy k=1 mean 5.8/4/3 = .48333, k=2 (1.0*1 + 1.2*2 + 3.0*3)/6/3 = .68889;
    # fp8_quant k=1 11.8/3/6 = .65556, k=2 (5*1 + 6*2)/3/6 = .94444
    assert sr["random_by_budget"]["1%"] == pytest.approx((5.8 / 12 + 11.8 / 18) / 2)
    assert sr["random_by_budget"]["50%"] == pytest.approx((12.4 / 18 + 17 / 18) / 2)
    assert rep["tasks"]["cross_entropy"]["accuracy"] == pytest.approx(2 / 3)
    assert rep["tasks"]["fp8_quant"]["speedup_recovered"]["mean"] == pytest.approx(31 / 36)
    assert "repeats" not in rep  # a single repeat index


@pytest.mark.slow
def test_cli_paper_fixture_json_and_plots(tmp_path):
    res = run_cli(FIX / "paper_predictions.jsonl", "--rows", FIX / "paper_eval_rows.jsonl",
                  "--json", "--plots", tmp_path / "plots")
    assert res.returncode == 0, res.stderr
    reps = json.loads(res.stdout)["forecasters"]
    base, brier_model = reps["base"], reps["brier"]
    # base, 8 rows (repeats 0 and 1), truth e1 6 (2.5x), e2 3 (0.9x), e3 4 (1.1x), e4 8 (4.5x):
    #  r0 e1 {6:.6,7:.4} hit brier .16 | r0 e2 failed, uniform .4375 | r0 e3 {3:.3,4:.5,5:.2}
    #  argmax 4 hit brier .5*(.09+.25+.04)=.19 | r0 e4 onehot 8 hit 0 | r1 e1 onehot 3 miss 1
    #  r1 e2 onehot 3 hit 0 | r1 e3 as r0 .19 hit | r1 e4 {7:.5,8:.5} argmax 7 miss .25
    assert base["parse_rate"] == 7 / 8 and base["accuracy"] == pytest.approx(5 / 7)
    assert base["brier"] == pytest.approx(2.2275 / 8)
    # ECE: bucket 6 {.6 hit} .4; bucket 5 {.5 hit, .5 hit, .5 miss} |.5-2/3|; bucket 9
    # {1 hit, 1 miss, 1 hit} |1-2/3| -> (.4 + 3/6 + 3/3) / 7
    assert base["ece"] == pytest.approx(1.9 / 7)
    assert base["stated_disagreement"] == pytest.approx(2 / 7)  # r0 e3 states 3, r1 e4 states 8
    # speedup recovered: r0 trimul keys 6.4, fail, 3.9 -> the 2.5x first -> 1 at all budgets;
    # r1 trimul keys 3, 3, 3.9: top 1 = 1.1x -> .44; top 2 = 1.1x + one of the tie (2.5x or
    # 0.9x) -> (2.5 + 1.1) / 2 / 2.5 = .72; mean (5 * .44 + .72) / 6. fp8_quant (one row): 1.
    r1_trimul = (5 * 0.44 + 0.72) / 6
    assert base["speedup_recovered"]["mean"] == pytest.approx((1 + (r1_trimul + 1) / 2) / 2)
    assert base["tasks"]["trimul"]["speedup_recovered"]["mean"] == pytest.approx((1 + r1_trimul) / 2)
    # repeats: accuracy 3/3 and 2/4 -> mean .75, sample std .35355
    assert base["repeats"]["mean"]["accuracy"] == pytest.approx(0.75)
    assert base["repeats"]["std"]["accuracy"] == pytest.approx(math.sqrt(0.125))
    assert brier_model["accuracy"] == 1 and brier_model["brier"] == 0 and brier_model["crps"] == 0
    assert brier_model["speedup_recovered"]["mean"] == 1
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["base_reliability.png", "base_risk_coverage.png", "brier_reliability.png",
                    "brier_risk_coverage.png", "speedup_recovered.png"]
    for p in (tmp_path / "plots").iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_cli_table_and_bad_input(tmp_path):
    res = run_cli(FIX / "our_predictions.jsonl")
    assert res.returncode == 0, res.stderr
    assert "cross_entropy" in res.stdout and "fp8_quant" in res.stdout
    assert "speedup recovered" in res.stdout and "random (exact)" in res.stdout
    bad = write_lines(tmp_path, [GOOD, {**GOOD, "probs": [0] * 8}])
    res = run_cli(bad)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and f"{bad}:2:" in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_flags_in_process(capsys):
    assert metrics_io.main([str(FIX / "our_predictions.jsonl"), "--json", "--discovery", "0.5"]) == 0
    d = json.loads(capsys.readouterr().out)["discovery"]
    # P(bin >= 5): c1 1.0 (y7, discovery), c2 .5 (y4), c3 .8 (y2), c4 failed (y4), f1 1.0 (y8,
    # discovery), f2 0 (y3), f3 .5 (y8, discovery) -> flagged c1 c2 c3 f1 f3, 3 true
    assert (d["flagged"], d["precision"], d["recall"]) == (5, 0.6, 1.0)
    assert d["base_rate"] == pytest.approx(3 / 7)
    args = [str(FIX / "paper_predictions.jsonl"), "--rows", str(FIX / "paper_eval_rows.jsonl"),
            "--json", "--bin-rule", "stated"]
    assert metrics_io.main(args) == 0
    base = json.loads(capsys.readouterr().out)["forecasters"]["base"]
    # stated bins: r0 e3 states 3 (truth 4) misses, r1 e4 states 8 hits -> still 5 of 7, but
    # ECE with conf = p[stated]: bucket 6 {.6 hit} .4; 3 {.3 miss} .3; 9 {1 hit, 1 miss, 1 hit}
    # 1/3 each row; 5 {.5 hit, .5 hit} .5 each -> (.4 + .3 + 1 + 1) / 7
    assert base["accuracy"] == pytest.approx(5 / 7)
    assert base["ece"] == pytest.approx(2.7 / 7)
    assert metrics_io.main([str(FIX / "missing.jsonl")]) == 2
    assert "missing.jsonl: cannot read" in capsys.readouterr().err
