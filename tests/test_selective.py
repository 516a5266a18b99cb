"""Tests for selective.py: calibration (reliability, ECE), risk-coverage, AURC, selective risk
and the guaranteed-risk threshold (SGR). Expected numbers are worked out by hand in the comments
or checked against closed forms and simulation."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import selective

# ---- calibration ----------------------------------------------------------------------------

def test_ece_hand_example():
    # confidences 0.95 (hit), 0.92 (miss) -> bucket 9: conf 0.935, acc 0.5, gap 0.435, weight 2/4
    # 0.35 (hit), 0.31 (hit)             -> bucket 3: conf 0.33, acc 1, gap 0.67, weight 2/4
    # ECE = 0.5 * 0.435 + 0.5 * 0.67 = 0.5525; the parse failure (None) is left out
    confs = [0.95, 0.92, 0.35, 0.31, None]
    hits = [True, False, True, True, False]
    assert selective.ece(confs, hits) == pytest.approx(0.5525)
    assert selective.reliability(confs, hits)[9] == (2, pytest.approx(0.935), 0.5)
    assert selective.reliability([1.0], [True])[9][0] == 1  # conf 1.0 falls in the last bucket
    assert selective.ece([None], [False]) is None


# ---- selective prediction -------------------------------------------------------------------

def test_risk_coverage_and_aurc_hand_example():
    confs = [0.9, 0.8, 0.6, 0.6, None]
    correct = [True, False, True, False, False]
    taus, cov, risk = selective.risk_coverage(confs, correct)
    # tau 0.6: 4 of 5 trusted, 2 wrong; tau 0.8: 2 trusted, 1 wrong; tau 0.9: 1 trusted, right
    assert list(taus) == [0.6, 0.8, 0.9]
    assert list(cov) == pytest.approx([0.8, 0.4, 0.2]) and list(risk) == pytest.approx([0.5, 0.5, 0])
    # trapezoids from coverage 0 (flat at risk 0): 0.2*0 + 0.2*(0+0.5)/2 + 0.4*(0.5+0.5)/2 = 0.25
    assert selective.aurc(confs, correct) == pytest.approx(0.25)
    assert selective.selective_risk(confs, correct, 0.3) == (0.5, pytest.approx(0.4), 0.8)
    assert selective.selective_risk(confs, correct, 0.9) is None  # above the parse rate
    # one confidence for every row: area = risk * coverage, not 0
    assert selective.aurc([0.5] * 4, [True, False, True, True]) == pytest.approx(0.25)
    assert selective.aurc([None, None], [False, False]) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 1)), st.booleans()), min_size=1,
                max_size=40))
def test_risk_coverage_monotone(pairs):
    confs, correct = [c for c, _ in pairs], [k for _, k in pairs]
    taus, cov, risk = selective.risk_coverage(confs, correct)
    assert np.all(np.diff(taus) > 0) and np.all(np.diff(cov) <= 0)
    assert np.all((risk >= 0) & (risk <= 1))
    n_scored = sum(c is not None for c in confs)
    if n_scored:
        assert cov[0] == pytest.approx(n_scored / len(confs))  # lowest tau trusts every parsed row
        assert 0 <= selective.aurc(confs, correct) <= 1


def test_risk_upper_bound_is_clopper_pearson():
    # zero errors: (1 - b)^n = delta has the closed form b = 1 - delta^(1/n)
    assert selective.risk_upper_bound(0, 100, 0.05) == pytest.approx(1 - 0.05 ** (1 / 100), rel=1e-9)
    b = selective.risk_upper_bound(7, 80, 0.01)
    tail = sum(math.comb(80, j) * b ** j * (1 - b) ** (80 - j) for j in range(8))
    assert tail == pytest.approx(0.01, rel=1e-6) and b > 7 / 80
    assert selective.risk_upper_bound(5, 5, 0.1) == 1.0


def draw_selective_set(rng, m):
    """Confidence u ~ U(0, 1); the forecast is wrong with probability 0.5 * (1 - u)^2."""
    u = rng.random(m)
    return u, rng.random(m) >= 0.5 * (1 - u) ** 2


def test_guaranteed_risk_threshold_holds_empirically():
    rng = np.random.default_rng(1)
    target, delta, violations, trials = 0.1, 0.1, 0, 40
    for _ in range(trials):
        conf, correct = draw_selective_set(rng, 2000)
        res = selective.guaranteed_risk_threshold(list(conf), list(correct), target, delta)
        assert res is not None and res["risk"] <= res["bound"] < target
        assert res["coverage"] == pytest.approx(np.mean(conf >= res["threshold"]))
        # true selective risk of "trust u >= tau": E[0.5 (1 - u)^2 | u >= tau] = (1 - tau)^2 / 6
        violations += (1 - res["threshold"]) ** 2 / 6 > target
        assert res["coverage"] > 0.4  # not vacuous: the risk-0.1 threshold is tau = 0.225
    assert violations <= delta * trials
    # unachievable targets give None: every forecast wrong
    assert selective.guaranteed_risk_threshold([0.9, 0.8, 0.7], [False] * 3, 0.05, 0.1) is None
    # parse failures count in the coverage's total
    res = selective.guaranteed_risk_threshold([0.9] * 50 + [None] * 50, [True] * 100, 0.2, 0.1)
    assert res["coverage"] == 0.5 and res["risk"] == 0.0
