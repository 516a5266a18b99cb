"""scripts/reproduce_paper.py writes its report from the paper's datasets read by their Hub names.

It runs as a user runs it, in a process of its own with HF_HUB_OFFLINE=1 and HF_HUB_CACHE pointing
at a cache the test lays out (tests/hub_cache.py: the four datasets, small, with the published
columns); every figure it writes is checked against metrics.py's on the same rows read from the
fixture files, and each published value it sets beside them against docs/PAPER.md.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_cache import DISCOVERY, EVAL_SET, FIXTURES, PREDICTIONS, RL_POOL, paper_datasets

import metrics
from data.dataset import load_predictions

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "reproduce_paper.py"


def run(cache, *args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def script():
    spec = importlib.util.spec_from_file_location("reproduce_paper", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_report_from_the_hub_datasets_holds_metrics_figures_beside_the_published_values(tmp_path):
    cache = tmp_path / "hub"
    paper_datasets(cache)
    # forecasts of the discovery pairs (none are published): our prediction rows, one per pair
    pairs = [json.loads(x) for x in (FIXTURES / "paper_discovery_pairs.jsonl").read_text().splitlines() if x.strip()]
    disc = tmp_path / "disc.jsonl"
    disc.write_text("".join(json.dumps({"id": p["pair_id"], "task": p["problem_id"], "model": "m", "repeat": 0,
                                        "probs": [0, 0, 0, 0.4, 0.6, 0, 0, 0] if i % 2 else [0, 0, 0.7, 0.3, 0, 0, 0, 0],
                                        "true_speedup": p["g_speedup"]}) + "\n" for i, p in enumerate(pairs)))
    out = tmp_path / "paper"
    done = run(cache, "--out", str(out), "--discovery-predictions", str(disc))
    assert done.returncode == 0, done.stderr
    report = (out / "report.md").read_text()
    # section 2: metrics.py's paper-protocol figures of the same rows, read from the fixture files
    rows = load_predictions(FIXTURES / "paper_predictions.jsonl", FIXTURES / "paper_eval_rows.jsonl", bin_rule="stated")
    base = metrics.paper_report([r for r in rows if r["model"] == "base"])
    o = base["overall"]
    line = (f"| base | 8 | {o['parse_rate']:.3f} | {o['accuracy']:.3f} | {o['off_by_one']:.3f} | {o['ece']:.3f} | "
            f"{o['brier']:.3f} | {o['crps']:.3f} | {o['nll']:.3f} | {o['aurc']:.3f} | {o['selective_risk_at_50']:.3f} |")
    assert line in report
    # section 4: speedup recovered beside the paper's 82.88%, the Brier adapter's gain beside 2.10 points
    sr = base["speedup_recovered"]
    assert f"| base | {' | '.join(f'{v:.3f}' for v in sr['by_budget'].values())} | {sr['mean']:.3f} | " \
           f"{sr['random_mean']:.3f} | 82.88% |" in report
    assert f"Base GPT-OSS-20B (`base`, matched by its name): {100 * sr['mean']:.2f}% of the available speedup " \
           "(paper: 82.88%)." in report
    brier = metrics.paper_report([r for r in rows if r["model"] == "brier"])
    gain = 100 * (brier["speedup_recovered"]["mean"] - sr["mean"])
    assert f"{gain:+.2f} points of speedup recovered over the base (paper: +2.10)" in report
    # section 5: the base rate of the published pairs, and the precision and recall of the forecasts
    d = metrics.discovery_moments(load_predictions(disc), 0.5)
    assert "2 of the 5 published pairs are discoveries: base rate 0.400" in report
    assert f"| m | 5 | {d['flagged']} | {d['precision']:.3f} | {d['recall']:.3f} | 0.400 |" in report
    # sections 1 and 6: the datasets read, at the cached revision, beside the paper's counts
    assert "| eval set | `hf:codezakh/gpu-forecasters-eval-set` |" in report and "| 4 | 424 |" in report
    assert "9 rows (paper: 2322); gdn_chunk_fwd_o: 0 rows (paper: held out)." in report
    plots = sorted(p.name for p in (out / "plots").iterdir())
    assert plots == ["discovery_pr_m.png", "reliability_base.png", "reliability_brier.png", "risk_coverage.png",
                     "speedup_recovered.png"]
    assert all((out / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)


def test_without_the_hub_or_the_cache_it_stops_in_seconds_in_one_line_naming_every_dataset(tmp_path):
    # no HF_HUB_OFFLINE, and a Hub whose name does not resolve (as on a machine with no network):
    # the Hub's client would retry each file for half a minute; the command looks first
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT="https://hub.invalid")
    started = time.monotonic()
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                       env=env, timeout=120)
    took = time.monotonic() - started
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and took < 5 + 3, (took, r.stderr)  # 3 s: Python, loaded
    for name in (EVAL_SET, PREDICTIONS, DISCOVERY, RL_POOL):
        assert f"hf:{name}" in r.stderr
    assert "hf download NAME --repo-type dataset" in r.stderr and "--example" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_report_of_the_datasets_at_hand_names_those_missing_and_what_they_would_add(tmp_path):
    cache = tmp_path / "hub"
    paper_datasets(cache)
    out = tmp_path / "paper"
    done = run(cache, "--out", str(out), "--discovery-pairs", "hf:someone/not-fetched", "--rl-pool",
               str(tmp_path / "absent.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "warning" in done.stderr and "section 5" in done.stderr and "section 6" in done.stderr
    report = (out / "report.md").read_text()
    top = report.split("## 1.")[0]
    assert "## Not in this report" in top
    assert "the discovery pairs would add section 5 (discovery moments): hf:someone/not-fetched is not in the " \
           "Hugging Face cache" in top and "hf download someone/not-fetched --repo-type dataset" in top
    assert f"the RL pool would add section 6 (the RL pool): {tmp_path / 'absent.jsonl'}: no such file" in top
    # the sections the eval set and the predictions determine are there; those of the others are not
    assert "## 2. The forecasters on the eval set" in report and "## 4. Speedup recovered" in report
    assert "## 5." not in report and "## 6." not in report
    assert "| discovery pairs | `hf:someone/not-fetched` | not here | - | 1347 |" in report


@pytest.mark.slow
def test_example_builds_the_whole_report_from_the_shipped_data_and_says_so_at_its_top(tmp_path):
    out = tmp_path / "example"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_HUB_CACHE=str(tmp_path / "empty"), HF_ENDPOINT="https://hub.invalid")  # no Hub needed
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--example"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert "small example data" in done.stdout
    report = (out / "report.md").read_text()
    head = report.splitlines()[:4]
    assert head[2].startswith("> **Built from the project's small example data, not the paper's datasets**")
    for section in ("## 2.", "## 3.", "## 4.", "## 5.", "## 6."):
        assert section in report
    assert "| eval set | `tests/fixtures/paper_eval_rows.jsonl` | file | 4 | 424 |" in report
    assert "Not in this report" not in report
    # --example reads its own data: a dataset named beside it is refused in one line
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x"), "--example", "--rl-pool", "a.jsonl"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "drop --rl-pool" in r.stderr


def test_the_published_values_it_compares_with_are_docs_paper_md_s():
    paper = (ROOT / "docs" / "PAPER.md").read_text()
    p = script().PUBLISHED
    for text in (f"{p['eval_rows']} (anchor, candidate) pairs", f"{p['prediction_rows']:,} rows = "
                 f"{p['forecasters']} forecasters × {p['repeats']} repeats × {p['eval_rows']}",
                 f"{p['rl_rows']:,} rows", f"{p['rl_holdout']} is held out", f"{p['discovery_pairs']:,} parent→child",
                 f"recovers {p['base_speedup_recovered_pct']:.2f}% of the available speedup",
                 f"adds {p['brier_gain_points']:.2f} points of speedup recovered"):
        assert text in paper, text
    for task, n in p["eval_by_task"].items():
        assert f"{task} {n}" in paper, task


def test_the_forecasters_of_the_published_figures_are_named_or_matched_by_name():
    pick, pattern = script().pick_label, script().BASE_NAME
    trained = script().TRAINED_NAME
    labels = ["gpt_oss_20b", "gpt_oss_20b_correctness", "gpt_oss_20b_correctness_brier", "gpt_oss_120b", "gemini3_flash"]
    assert pick(labels, "auto", pattern, exclude=trained) == ("gpt_oss_20b", "matched by its name")
    assert pick(["a", "b"], "auto", pattern, exclude=trained)[0] is None
    assert pick(labels, "gemini3_flash", pattern) == ("gemini3_flash", "named with a flag")
    with pytest.raises(ValueError, match="no forecaster labelled 'x'"):
        pick(labels, "x", pattern)
