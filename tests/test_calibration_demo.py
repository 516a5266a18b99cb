"""Tests of scripts/calibration_demo.py: the synthetic task is what the demo's argument needs, and
the demo's plumbing (three train_grpo runs per seed, evaluation, JSON, plot) works on one step.

The full run (does +Brier/+CRPS calibrate better than correctness?) is a benchmark, not a test: its
measured numbers are in the README. What is asserted here holds by construction or not at all:
rows follow their kind's distribution, reporting the true distribution is calibrated while
reporting the mode alone is not (at the same accuracy), and only the proper rewards pay for it.
"""
import importlib.util
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import bins
import dataset
import selective
from forecast_answer import DIGITS
from train_grpo import parse_votes

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("calibration_demo",
                                               ROOT / "scripts" / "calibration_demo.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


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
    # reporting q, +CRPS (whose score is divided by 7) one eighth of that
    assert demo.incentive("correctness") == pytest.approx(0.0)
    assert demo.incentive("brier") == pytest.approx(0.125)
    assert demo.incentive("crps") == pytest.approx(0.015625)


def test_tokenizer_and_votes():
    tok = demo.tiny_tokenizer()
    prompts = {tuple(tok.encode(demo.prompt_text(*kind))) for kind in demo.KINDS}
    assert len(prompts) == len(demo.KINDS)  # every kind is told apart
    assert all(len(ids) == 3 and tok.unk_token_id not in ids for ids in prompts)
    assert [len(tok.encode(d)) for d in DIGITS] == [1] * 8
    assert len(set(tok.encode(" ".join(DIGITS)))) == 8
    text = tok.decode(tok.encode("4 4 5 4"))
    assert parse_votes(text, 4).probs == [0, 0, 0, 0.75, 0.25, 0, 0, 0]


def test_demo_plumbing(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["--out", str(out), "--seeds", "2", "--steps", "1", "--rows", "16", "--prompts-per-step",
            "2", "--group-size", "2", "--eval-samples", "1", "--json"]
    assert demo.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result) == ["correctness", "brier", "crps"]
    for reward, e in result.items():
        for k in ("accuracy", "ece", "confidence", "brier", "crps", "tv"):
            assert 0 <= e[k] <= 1 and e["std"][k] is not None
        assert [s["seed"] for s in e["seeds"]] == [0, 1]
        assert all(s["parse_rate"] == 1.0 for s in e["seeds"])  # votes always parse
        # the means are the means of what each run wrote (train_grpo's own evaluation)
        summaries = [json.loads((out / f"seed{s}" / reward / "eval_summary.json").read_text())
                     for s in (0, 1)]
        assert e["ece"] == pytest.approx(np.mean([s["ece"] for s in summaries]))
        assert e["accuracy"] == pytest.approx(np.mean([s["accuracy"] for s in summaries]))
    ratios = [b["ece"] / c["ece"]
              for b, c in zip(result["brier"]["seeds"], result["correctness"]["seeds"])]
    assert result["brier"]["ece_ratio_to_correctness"]["mean"] == pytest.approx(np.mean(ratios))
    assert "ece_ratio_to_correctness" not in result["correctness"]
    # each run trained (the same rows for the three rewards of a seed) and wrote its log
    for reward in demo.REWARDS:
        log = (out / "seed1" / reward / "log.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in log] == [1]
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
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, message):
    assert demo.main(["--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "o").exists()
