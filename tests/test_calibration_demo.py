"""Tests of scripts/calibration_demo.py: the synthetic task is what the demo's argument needs, and
the demo's plumbing (one train_grpo run per seed and reward setting, in worker processes,
evaluation, JSON, plot) works on one step.

The full run (does +Brier/+CRPS calibrate better than correctness?) is a benchmark, not a test: its
measured numbers are in docs/CALIBRATION.md. What is asserted here holds by construction or not at all:
rows follow their kind's distribution, reporting the true distribution is calibrated while
reporting the mode alone is not (at the same accuracy), and only the proper rewards pay for it.
"""
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import bins
import selective
from data import dataset
from forecast_answer import DIGITS, Forecast
from train_grpo import parse_votes, reward

# imported by name (not from its path): the demo's worker processes must import it too
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import calibration_demo as demo  # noqa: E402


def test_true_distributions():
    for level, shape in demo.KINDS:
        q = demo.true_distribution(level, shape)
        assert q.sum() == pytest.approx(1.0) and (q >= 0).all()
        support = np.flatnonzero(q) + 1
        assert np.argmax(q) + 1 == level  # the mode is the level (lowest bin on the split's tie)
        assert list(support) == list(range(support[0], support[-1] + 1))  # adjacent bins
        assert 1 < support[0] and support[-1] < bins.N_BINS  # inner bins only
        assert (q * 4 == np.round(q * 4)).all()  # K = 4 votes can state q exactly
    assert [len(np.flatnonzero(demo.true_distribution(3, s))) for s in demo.SHAPES] == [1, 2, 2, 3]


def test_rows_follow_their_distribution(tmp_path):
    rows = demo.make_rows(4000, seed=1)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = dataset.load_rows(path)  # the training-row reader recomputes the bin from the speedup
    by_kind = {}
    for r in loaded:
        assert r["candidate_code"] == demo.prompt_text(r["level"], r["shape"])
        by_kind.setdefault((r["level"], r["shape"]), []).append(r["true_bin"])
    assert set(by_kind) == set(demo.KINDS)
    for kind, drawn in by_kind.items():
        counts = Counter(drawn)
        freq = np.array([counts[b] for b in bins.BINS]) / len(drawn)
        # ~500 rows a kind: a binomial share's std is <= 0.023; 0.08 is > 3 std
        assert np.abs(freq - demo.true_distribution(*kind)).max() < 0.08, (kind, freq)
    assert demo.make_rows(50, 3) == demo.make_rows(50, 3) != demo.make_rows(50, 4)


def test_reporting_the_truth_is_calibrated_and_the_mode_is_not():
    rows = demo.make_rows(8000, seed=2)
    truth = [demo.true_distribution(r["level"], r["shape"]) for r in rows]
    ys = [bins.speedup_to_bin(r["aggregated_speedup"]) for r in rows]
    for probs, expect_ece in ((truth, 0.0), ([np.eye(8)[np.argmax(q)] for q in truth], 0.31)):
        conf = [bins.confidence(p) for p in probs]
        hits = [bins.predicted_bin(p) == y for p, y in zip(probs, ys)]
        # the same predicted bins, so the same accuracy: the mean mode probability, 0.6875
        assert np.mean(hits) == pytest.approx(0.6875, abs=0.02)
        assert selective.ece(conf, hits) == pytest.approx(expect_ece, abs=0.03)


def test_only_the_proper_rewards_pay_for_the_truth():
    # correctness scores q and the mode alike; +Brier pays 1/8 of a reward point on average for
    # reporting q, +CRPS (whose score is divided by 7) one eighth of that; weighted by 7 (the
    # ranked probability score without the /7) it pays 7/8 of Brier's
    assert demo.incentive("correctness") == pytest.approx(0.0)
    assert demo.incentive("brier") == pytest.approx(0.125)
    assert demo.incentive("crps") == pytest.approx(0.015625)
    assert demo.incentive("crps", weight=7) == pytest.approx(0.109375)


def test_on_split_prompts_the_best_independent_votes_are_q():
    # what docs/CALIBRATION.md says of +CRPS at the paper's weight: its optimum is right, its pay is small.
    # A policy that draws its 4 votes independently, the level with probability a and the next bin
    # otherwise; exact expectation over the votes and over y ~ q = (.5, .5).
    level, q = 3, demo.true_distribution(3, "split")

    def expected(a, kind):
        total = 0.0
        for votes in itertools.product((level, level + 1), repeat=4):
            chance = np.prod([a if v == level else 1 - a for v in votes])
            probs = np.bincount(votes, minlength=bins.N_BINS + 1)[1:] / 4
            f = Forecast(probs=list(probs), predicted_bin=bins.predicted_bin(probs), raw_sum=1.0)
            total += chance * sum(q[y - 1] * reward(f, y, kind) for y in (level, level + 1))
        return total
    grid = np.linspace(0, 1, 21)
    for kind in ("brier", "crps"):
        values = [expected(a, kind) for a in grid]
        assert grid[int(np.argmax(values))] == pytest.approx(0.5)
    gain = {kind: expected(0.5, kind) - expected(1.0, kind) for kind in ("brier", "crps")}
    assert gain["crps"] < gain["brier"] / 6  # the same optimum, a seventh of the pay
    # correctness cannot tell these policies apart (a tie goes to the lower bin, the level)
    assert [expected(a, "correctness") for a in grid] == pytest.approx([0.5] * len(grid))


def test_reward_settings():
    assert demo.parse_settings(demo.DEFAULT_SETTINGS) == [
        ("correctness", 1.0), ("brier", 1.0), ("crps", 1.0), ("crps", 7.0)]
    assert [demo.setting_name(*s) for s in demo.parse_settings("correctness, brier:2.5")] == [
        "correctness", "brier:2.5"]
    assert "the paper's" in demo.setting_label("crps", 1.0)
    assert demo.setting_label("crps", 7.0) == "correctness + 7 x (1 - CRPS)"


def test_tokenizer_and_votes():
    tok = demo.tiny_tokenizer()
    prompts = {tuple(tok.encode(demo.prompt_text(*kind))) for kind in demo.KINDS}
    assert len(prompts) == len(demo.KINDS)  # every kind is told apart
    assert all(len(ids) == 3 and tok.unk_token_id not in ids for ids in prompts)
    assert [len(tok.encode(d)) for d in DIGITS] == [1] * 8
    assert len(set(tok.encode(" ".join(DIGITS)))) == 8
    text = tok.decode(tok.encode("4 4 5 4"))
    assert parse_votes(text, 4).probs == [0, 0, 0, 0.75, 0.25, 0, 0, 0]


@pytest.fixture
def stops_the_forkserver():
    """The demo's runs are forked from a forkserver, beside which multiprocessing runs a resource
    tracker; both live as long as the process that started them. A command ends with its process;
    a test must end them itself, or a later test of the same process finds them there."""
    yield
    from multiprocessing import forkserver, resource_tracker
    forkserver._forkserver._stop()  # the test suite's own stop (CPython's tests use it too)
    resource_tracker._resource_tracker._stop()


@pytest.mark.e2e
def test_demo_plumbing(tmp_path, capsys, stops_the_forkserver):
    out = tmp_path / "demo"
    argv = ["--out", str(out), "--seeds", "2", "--steps", "1", "--rows", "16", "--prompts-per-step",
            "2", "--group-size", "2", "--eval-samples", "1", "--json", "--jobs", "2"]
    assert demo.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result) == ["correctness", "brier", "crps", "crps:7"]
    assert [(e["reward"], e["score_weight"]) for e in result.values()] == demo.parse_settings(
        demo.DEFAULT_SETTINGS)
    folders = {"correctness": "correctness", "brier": "brier", "crps": "crps", "crps:7": "crps-w7"}
    for name, e in result.items():
        for k in ("accuracy", "ece", "confidence", "brier", "crps", "tv"):
            assert 0 <= e[k] <= 1 and e["std"][k] is not None
        assert set(e["confidence_by_shape"]) <= set(demo.SHAPES)
        assert all(0.25 <= c <= 1 for c in e["confidence_by_shape"].values())  # K = 4 votes: max >= 1/4
        assert [s["seed"] for s in e["seeds"]] == [0, 1]
        assert all(s["parse_rate"] == 1.0 for s in e["seeds"])  # votes always parse
        # the means are the means of what each run wrote (train_grpo's own evaluation)
        summaries = [json.loads((out / f"seed{s}" / folders[name] / "eval_summary.json").read_text())
                     for s in (0, 1)]
        assert e["ece"] == pytest.approx(np.mean([s["ece"] for s in summaries]))
        assert e["accuracy"] == pytest.approx(np.mean([s["accuracy"] for s in summaries]))
    ratios = [b["ece"] / c["ece"]
              for b, c in zip(result["brier"]["seeds"], result["correctness"]["seeds"])]
    assert result["brier"]["ece_ratio_to_correctness"]["mean"] == pytest.approx(np.mean(ratios))
    assert "ece_ratio_to_correctness" not in result["correctness"]
    assert result["crps:7"]["incentive"] == pytest.approx(7 * result["crps"]["incentive"])
    # each run trained (the same rows for every setting of a seed) with its setting's reward:
    # the logged mean reward is accuracy + w * (1 - mean score), every answer parsing
    weights = {"correctness": 0, "brier": 1, "crps": 1, "crps:7": 7}
    for name, folder in folders.items():
        log = [json.loads(x) for x in (out / "seed1" / folder / "log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log] == [1]
        score = log[0]["brier" if name == "brier" else "crps"]
        assert log[0]["reward"] == pytest.approx(log[0]["accuracy"] + weights[name] * (1 - score))
    # a worker process gives the numbers this process would: every run seeds itself
    opts = demo.build_parser().parse_args(argv[:-2] + ["--out", str(tmp_path / "again")])
    here, _ = demo.run_one(opts, "crps", 7.0, 1, out / "seed1" / "rows.jsonl", tmp_path / "again")
    there = result["crps:7"]["seeds"][1]
    assert {k: here[k] for k in demo.SCORES} == {k: there[k] for k in demo.SCORES}
    assert (out / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((out / "results.json").read_text())
    assert saved["rewards"] == result and saved["wall_seconds"] > 0 and "cores" in saved["machine"]
    # a second run into the same folder is refused before anything is trained
    assert demo.main(argv) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--votes", "1"], "--votes must be >= 2"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--eval-fraction", "0"], "--eval-fraction must be in (0, 1)"),
    (["--rows", "1"], "give more rows"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--rewards", "brier,crps"], "must include correctness"),
    (["--rewards", "correctness,nll"], "unknown reward 'nll'"),
    (["--rewards", "correctness,crps:x"], "must be a number"),
    (["--rewards", "correctness,crps:0"], "must be > 0"),
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, message):
    assert demo.main(["--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "o").exists()
