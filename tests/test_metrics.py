"""Tests for metrics.py: the dataset report, speedup recovered, discovery moments, the CLI.

Expected numbers come from the paper (docs/PAPER.md §2, §5: bins, uniform Brier/CRPS), from
independent code (scoringrules, brute-force enumeration) or are worked out by hand in the comments.
"""
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
from test_bins import onehot
from test_dataset import GOOD, write_lines

import bins
import metrics

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).resolve().parent / "fixtures"

probs_st = st.lists(st.floats(0, 1, allow_nan=False), min_size=8, max_size=8).filter(
    lambda p: sum(p) > 1e-6)
bins_st = st.integers(1, 8)


# ---- dataset report ------------------------------------------------------------------------

def make_row(probs, true_bin, task="t", repeat=None, speedup=None, rid=None):
    return {"id": rid, "task": task, "model": "m", "readout": None, "repeat": repeat,
            "probs": None if probs is None else list(bins.as_probs(probs)),
            "parse_failed": probs is None, "parse_error": None, "stated_bin": None,
            "predicted_bin": None if probs is None else bins.predicted_bin(probs),
            "raw_sum": None, "true_bin": true_bin, "true_speedup": speedup, "where": "x"}


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
    # max-prob gate: every parsed row has confidence 1, so tau 1 trusts 3 of 4 rows, 1 of them wrong
    assert rep["selective_risk_50"] == pytest.approx(1 / 3)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), probs_st), bins_st,
                          st.floats(0.1, 10)), min_size=1, max_size=12), st.randoms())
def test_report_invariant_to_row_order(items, rnd):
    rows = [make_row(p, bins.speedup_to_bin(s), speedup=s) for p, _, s in items]
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

# ---- CLI end to end -------------------------------------------------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "metrics.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_cli_loads_the_metrics_module_once():
    # `python metrics.py` runs as __main__; a module it imports that imported metrics back would
    # load a second copy of it (the import cycle this layout avoids)
    res = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "metrics.py"),
                          str(FIX / "our_predictions.jsonl")], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines()}
    assert {"bins", "selective", "data.dataset"} <= imported and "metrics" not in imported


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
    assert metrics.main([str(FIX / "our_predictions.jsonl"), "--json", "--discovery", "0.5"]) == 0
    d = json.loads(capsys.readouterr().out)["discovery"]
    # P(bin >= 5): c1 1.0 (y7, discovery), c2 .5 (y4), c3 .8 (y2), c4 failed (y4), f1 1.0 (y8,
    # discovery), f2 0 (y3), f3 .5 (y8, discovery) -> flagged c1 c2 c3 f1 f3, 3 true
    assert (d["flagged"], d["precision"], d["recall"]) == (5, 0.6, 1.0)
    assert d["base_rate"] == pytest.approx(3 / 7)
    args = [str(FIX / "paper_predictions.jsonl"), "--rows", str(FIX / "paper_eval_rows.jsonl"),
            "--json", "--bin-rule", "stated"]
    assert metrics.main(args) == 0
    base = json.loads(capsys.readouterr().out)["forecasters"]["base"]
    # stated bins: r0 e3 states 3 (truth 4) misses, r1 e4 states 8 hits -> still 5 of 7, but
    # ECE with conf = p[stated]: bucket 6 {.6 hit} .4; 3 {.3 miss} .3; 9 {1 hit, 1 miss, 1 hit}
    # 1/3 each row; 5 {.5 hit, .5 hit} .5 each -> (.4 + .3 + 1 + 1) / 7
    assert base["accuracy"] == pytest.approx(5 / 7)
    assert base["ece"] == pytest.approx(2.7 / 7)
    assert metrics.main([str(FIX / "missing.jsonl")]) == 2
    assert "missing.jsonl: cannot read" in capsys.readouterr().err


def test_side_by_side_and_the_plots_aurc_say_what_the_table_says(tmp_path, capsys, monkeypatch):
    # the side-by-side block ends with its table (names in full below only where the column cut
    # them), and each risk-coverage plot's legend gives the AURC of the table printed beside it,
    # by the same protocol's definition (the two definitions differ on these rows)
    from data import plots
    args = [str(FIX / "paper_predictions.jsonl"), "--rows", str(FIX / "paper_eval_rows.jsonl")]
    for protocol, column in (("paper", None), ("ours", "maxprob")):
        figures = []
        monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append((Path(path).name, fig)))
        assert metrics.main(args + ["--protocol", protocol, "--plots", str(tmp_path)]) == 0
        table = capsys.readouterr().out
        side = table[table.index("== side by side"):].split("\n\n")[0].splitlines()
        assert [line.split()[1] for line in side[2:]] == ["base", "brier"], side
        assert metrics.main(args + ["--protocol", protocol, "--json"]) == 0
        base = json.loads(capsys.readouterr().out)["forecasters"]["base"]
        aurc = base["overall"]["aurc"] if column is None else base["aurc"][column]
        fig = dict(figures)["base_risk_coverage.png"]
        labels = fig.axes[0].get_legend_handles_labels()[1]
        assert f"maxprob (AURC {aurc:.3f})" in labels, (protocol, labels, aurc)
    long = {"a forecaster with a very long name": metrics.report([make_row([1] + [0] * 7, 1)]),
            "b": metrics.report([make_row([1] + [0] * 7, 1)])}
    text = metrics.format_side_by_side(long)
    assert text.splitlines()[-2:] == ["names in full:", "  1. a forecaster with a very long name"]
