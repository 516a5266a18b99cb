"""Tests for bins.py: the bins and the score of one forecast.

Expected numbers come from the paper (docs/PAPER.md §2, §5: bins, uniform Brier/CRPS), from
independent code (scoringrules) or are worked out by hand in the comments.
"""
import inspect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bins
from forecast_prompt import PAPER_PROB_FIELDS, PROB_FIELDS

UNIFORM = [1 / 8] * 8


def onehot(b):
    p = [0.0] * 8
    p[b - 1] = 1.0
    return p


# ---- bins -----------------------------------------------------------------------------------

@pytest.mark.parametrize("s, b", [(0.4, 1), (0.6, 2), (0.8, 3), (1.0, 4), (1.2, 4), (1.5, 5),
                                  (2.0, 6), (3.0, 7), (4.0, 8), (5.0, 8), (1e-3, 1), (1e4, 8)])
def test_bin_checks_from_paper(s, b):
    assert bins.speedup_to_bin(s) == b


def test_bin_edges_are_lower_inclusive():
    for k, edge in enumerate(bins.BIN_EDGES):
        assert bins.speedup_to_bin(edge) == k + 2
        assert bins.speedup_to_bin(math.nextafter(edge, 0)) == k + 1
    assert bins.speedup_to_bin(math.sqrt(2)) == 5
    assert bins.speedup_to_bin(1.414) == 4  # just below sqrt(2)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_bad_speedups_raise(bad):
    with pytest.raises(ValueError, match="finite number > 0"):
        bins.speedup_to_bin(bad)


def test_bin_intervals_labels_and_representatives():
    assert bins.bin_interval(1) == (0.0, 0.5)
    assert bins.bin_interval(4) == (1.0, pytest.approx(math.sqrt(2)))
    assert bins.bin_interval(8) == (4.0, math.inf)
    assert bins.bin_label(1) == "< 0.50x"
    assert bins.bin_label(4) == "[1.00x, 1.41x)"
    assert bins.bin_label(8) == ">= 4.00x"
    for b in range(2, 8):  # interior bins: the representative is the half-octave's log2 centre
        lo, hi = bins.bin_interval(b)
        assert bins.BIN_LOG2_SPEEDUP[b - 1] == pytest.approx((math.log2(lo) + math.log2(hi)) / 2)
    # the open bins: the next half-octave beyond the edge, 2^-1.25 = 0.42x and 2^2.25 = 4.76x
    assert bins.BIN_LOG2_SPEEDUP[0] == -1.25 and bins.BIN_LOG2_SPEEDUP[7] == 2.25
    for bad in (0, 9, True, 2.0):
        with pytest.raises(ValueError):
            bins.bin_interval(bad)


def test_every_bin_name_fits_its_interval():
    for b in bins.BINS:
        low, high = bins.bin_interval(b)
        name = bins.BIN_NAMES[b - 1]
        if high <= 1.0:
            assert "slowdown" in name and "speedup" not in name, (b, name)
        elif low >= bins.BIN_EDGES[3]:  # 1.414x and above
            assert "speedup" in name and "slowdown" not in name and "parity" not in name, (b, name)
        else:  # [1, 1.41x): parity to a slight speedup, never a slowdown
            assert name == "parity to slight speedup"
    assert len(set(bins.BIN_NAMES)) == bins.N_BINS
    assert PROB_FIELDS[3] == "p_parity_to_slight_speedup" and PAPER_PROB_FIELDS[3] == "p_minor_slowdown"


# ---- per-forecast scores --------------------------------------------------------------------

def test_uniform_values():
    crps_table = [0.3125, 0.2054, 0.1339, 0.0982, 0.0982, 0.1339, 0.2054, 0.3125]  # docs/PAPER.md §5
    for y in range(1, 9):
        assert bins.brier(UNIFORM, y) == pytest.approx(0.4375)
        assert bins.crps(UNIFORM, y) == pytest.approx(crps_table[y - 1], abs=5e-5)
        assert bins.nll(UNIFORM, y) == pytest.approx(math.log(8))
    assert bins.confidence(UNIFORM, "maxprob") == 0.125
    assert bins.confidence(UNIFORM, "entropy") == pytest.approx(0.0, abs=1e-12)
    assert bins.confidence(UNIFORM, "margin") == 0.0
    assert bins.expected_bin(UNIFORM) == 4.5 and bins.expected_log2_speedup(UNIFORM) == 0.5


def test_perfect_and_far_miss():
    for y in range(1, 9):
        assert bins.brier(onehot(y), y) == 0 and bins.crps(onehot(y), y) == 0
        assert bins.nll(onehot(y), y) == 0
        assert bins.hit(bins.predicted_bin(onehot(y)), y) and bins.confidence(onehot(y), "entropy") == 1.0
    assert bins.crps(onehot(1), 8) == 1.0 and bins.brier(onehot(1), 8) == 1.0
    assert bins.nll(onehot(1), 8) == pytest.approx(-math.log(1e-12))
    # near miss beats far miss under CRPS; Brier cannot tell them apart
    assert bins.crps(onehot(7), 8) == pytest.approx(1 / 7)
    assert bins.crps(onehot(2), 8) == pytest.approx(6 / 7)
    assert bins.brier(onehot(7), 8) == bins.brier(onehot(2), 8)
    assert bins.off_by_one_hit(bins.predicted_bin(onehot(7)), 8)
    assert not bins.off_by_one_hit(bins.predicted_bin(onehot(6)), 8)


def test_scores_hand_example():
    p = [0, 0, 0.1, 0.9, 0, 0, 0, 0]
    assert bins.brier(p, 3) == pytest.approx(0.81)  # 0.5 * (0.9^2 + 0.9^2)
    assert bins.crps(p, 3) == pytest.approx(0.81 / 7)  # only F_3 = 0.1 vs 1 differs
    assert bins.nll(p, 3) == pytest.approx(math.log(10))
    assert bins.confidence(p, "margin") == pytest.approx(0.8)
    assert bins.predicted_bin([0, 0, 0, 0.5, 0.5, 0, 0, 0]) == 4  # lowest bin on ties
    assert bins.prob_at_least([0, 0, 0, 0.25, 0.25, 0.5, 0, 0], math.sqrt(2)) == 0.75
    assert bins.as_probs([2, 2, 0, 0, 0, 0, 0, 0])[0] == 0.5
    for bad in ([1] * 7, [-1, 2, 0, 0, 0, 0, 0, 0], [0] * 8, [float("nan")] + [1] * 7):
        with pytest.raises(ValueError):
            bins.as_probs(bad)


def test_crps_matches_scoringrules():
    import scoringrules as sr

    params = list(inspect.signature(sr.rps_score).parameters)
    assert params[:2] == ["obs", "fct"]  # obs is the 1-based category, fct the probabilities
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = rng.dirichlet(np.full(8, 0.5))
        y = int(rng.integers(1, 9))
        assert bins.crps(p, y) == pytest.approx(float(sr.rps_score(y, p)) / 7, abs=1e-12)


probs_st = st.lists(st.floats(0, 1, allow_nan=False), min_size=8, max_size=8).filter(
    lambda p: sum(p) > 1e-6)
bins_st = st.integers(1, 8)


@settings(max_examples=150, deadline=None)
@given(probs_st, bins_st)
def test_score_ranges_and_invariants(raw, y):
    p = bins.as_probs(raw)
    b, c, n = bins.brier(p, y), bins.crps(p, y), bins.nll(p, y)
    assert -1e-12 <= b <= 1 + 1e-12 and -1e-12 <= c <= 1 + 1e-12 and n >= 0
    for kind in bins.CONFIDENCE_KINDS:
        assert 0 <= bins.confidence(p, kind) <= 1 + 1e-12
    # CRPS is convex in p: at most the mixture of point-mass scores, E|B - y| / 7
    assert c <= np.dot(p, np.abs(np.arange(1, 9) - y)) / 7 + 1e-12
    assert b <= 1 - p[y - 1] + 1e-12  # since sum p_b^2 <= 1
    # reversing the bin order (and the truth) leaves CRPS unchanged
    assert bins.crps(p[::-1], 9 - y) == pytest.approx(c, abs=1e-12)
    assert bins.expected_log2_speedup(p) == pytest.approx((bins.expected_bin(p) - 3.5) / 2)
    assert 1 <= bins.expected_bin(p) <= 8 + 1e-12


@settings(max_examples=60, deadline=None)
@given(probs_st, bins_st, st.permutations(list(range(8))))
def test_brier_and_nll_permutation_invariant(raw, y, perm):
    p = bins.as_probs(raw)
    q = p[perm]  # q[i] = p[perm[i]]: the true bin moves to where p[y-1] went
    y2 = perm.index(y - 1) + 1
    assert bins.brier(q, y2) == pytest.approx(bins.brier(p, y), abs=1e-12)
    assert bins.nll(q, y2) == pytest.approx(bins.nll(p, y), abs=1e-12)
    assert bins.confidence(q, "entropy") == pytest.approx(bins.confidence(p, "entropy"))
