"""Tests of pair_sampler.py: bin-balanced pairs of kernels of one task, and its command line."""
import json
import math
import random
from itertools import combinations

import pytest

from bins import speedup_to_bin
from data import pair_sampler
from data.dataset import load_rows
from data.pair_sampler import Group, sample_pairs, water_fill


def kernel(kid, task, speedup, code=None, seed=False, hardware="gpu", scale="benchmark"):
    return {"kernel_id": kid, "task": task, "code": code or f"# {kid}\n", "speedup": speedup,
            "hardware": hardware, "scale": scale, "is_seed": seed, "source_search": "s"}


# ---- water-filling and the draw ------------------------------------------------------------------

def test_water_fill_levels_the_tasks_and_passes_shortfalls_on():
    assert water_fill({"a": 10, "b": 2, "c": 10}, 12, ["a", "b", "c"]) == {"a": 5, "b": 2, "c": 5}
    # 13 = 2 + 5 + 6: the odd one goes to the first task in the (seeded) order
    assert water_fill({"a": 10, "b": 2, "c": 10}, 13, ["c", "a", "b"]) == {"a": 5, "b": 2, "c": 6}
    assert water_fill({"a": 1, "b": 0}, 5, ["a", "b"]) == {"a": 1, "b": 0}  # supply runs out
    assert water_fill({"a": 4, "b": 4, "c": 4}, 2, ["b", "c", "a"]) == {"a": 0, "b": 1, "c": 1}


def test_group_bins_agree_with_the_one_bin_definition():
    ks = [kernel(f"k{i}", "t", s) for i, s in enumerate([0.3, 0.5, 1.0, math.sqrt(2), 2.0, 4.0, 7.7])]
    g = Group(ks)
    for i, j in combinations(range(len(ks)), 2):
        for a, b in ((i, j), (j, i)):
            assert g.bins[a, b] == speedup_to_bin(ks[b]["speedup"] / ks[a]["speedup"])


def test_seed_is_speedup_one_and_duplicate_codes_are_one_kernel():
    ks = [kernel("seed", "t", 0.93, code="SEED\n", seed=True), kernel("a", "t", 3.0),
          kernel("a-again", "t", 2.9, code="# a\n"), kernel("seed-2", "t", 1.05, code="SEED\n", seed=True)]
    pairs, report = sample_pairs(ks, 5, seed=0)
    assert report["kernels"] == 2 and report["duplicates"] == 2
    assert len(pairs) == 1  # (seed, a) and its mirror (a, seed) are one unordered pair
    (p,) = pairs
    if p["anchor"]["kernel_id"] == "seed":
        assert (p["speedup"], p["bin"]) == (3.0, 7)  # 3.0, not 3.0 / 0.93
    else:
        assert (p["speedup"], p["bin"]) == (1 / 3.0, 1)


def test_pairs_are_within_a_task_and_group_balanced_unique_and_reproducible():
    rng = random.Random(1)
    ks = []
    for task in ("t1", "t2", "t3"):
        ks.append(kernel(f"{task}/seed", task, 1.0, seed=True))
        ks += [kernel(f"{task}/k{i}", task, 2 ** rng.uniform(-2.5, 2.5)) for i in range(25)]
    ks.append(kernel("t1/cpu", "t1", 9.0, hardware="cpu", scale="cpu"))  # alone in its group
    pairs, report = sample_pairs(ks, 12, seed=3)
    seen = set()
    for p in pairs:
        a, c = p["anchor"], p["candidate"]
        assert a["task"] == c["task"] and (a["hardware"], a["scale"]) == (c["hardware"], c["scale"])
        assert p["bin"] == speedup_to_bin(p["speedup"])
        assert p["speedup"] == pytest.approx(pair_sampler.effective_speedup(c) / pair_sampler.effective_speedup(a))
        key = frozenset((a["kernel_id"], c["kernel_id"]))
        assert key not in seen  # never a pair and its mirror
        seen.add(key)
    for b, r in report["bins"].items():
        assert r["taken"] == sum(p["bin"] == b for p in pairs) == min(12, r["taken"])
        if b not in report["short_bins"]:
            counts = [r["by_task"].get(t, 0) for t in ("t1", "t2", "t3")]
            assert r["taken"] == 12 and max(counts) - min(counts) <= 1 or min(counts) == 0
    assert len(report["short_bins"]) < 8
    # the same kernels in another order and the same seed: the same rows, in the same order
    again, _ = sample_pairs(list(reversed(ks)), 12, seed=3)
    ids = [pair_sampler.eval_row(p)["comparison_id"] for p in pairs]
    assert ids == [pair_sampler.eval_row(p)["comparison_id"] for p in again]
    other, _ = sample_pairs(ks, 12, seed=4)
    assert ids != [pair_sampler.eval_row(p)["comparison_id"] for p in other]


def test_a_short_bin_is_reported_and_filled_as_far_as_supply_goes():
    ks = [kernel("s", "t", 1.0, seed=True), kernel("a", "t", 1.1), kernel("b", "t", 1.2)]
    pairs, report = sample_pairs(ks, 2, seed=0)
    # three unordered pairs, each 1.09x-1.2x one way (bin 4) and 0.83x-0.92x the other (bin 3):
    # bin 3 draws first (equal supply, lower bin) and takes two, bin 4 gets the third
    assert report["bins"][3]["taken"] == 2 and report["bins"][4]["taken"] == 1
    assert report["bins"][8]["taken"] == 0 and report["short_bins"] == [1, 2, 4, 5, 6, 7, 8]
    assert len(pairs) == sum(r["taken"] for r in report["bins"].values())


def test_mirrors_allows_a_pair_and_its_mirror():
    ks = [kernel("s", "t", 1.0, seed=True), kernel("a", "t", 3.0)]
    pairs, _ = sample_pairs(ks, 5, seed=0, mirrors=True)
    assert sorted((p["anchor"]["kernel_id"], p["candidate"]["kernel_id"], p["bin"]) for p in pairs) == \
        [("a", "s", 1), ("s", "a", 7)]
    assert len(sample_pairs(ks, 5, seed=0)[0]) == 1


# ---- command line --------------------------------------------------------------------------------

def test_sampler_cli_writes_eval_rows_that_the_readers_accept(tmp_path, capsys):
    rng = random.Random(0)
    ks = [kernel("seed", "cross_entropy", 1.0, seed=True)]
    ks += [kernel(f"k{i}", "cross_entropy", 2 ** rng.uniform(-2.5, 2.5)) for i in range(30)]
    src = tmp_path / "kernels.jsonl"
    src.write_text("".join(json.dumps(k) + "\n" for k in ks))
    out = tmp_path / "pairs.jsonl"
    assert pair_sampler.main([str(src), "--per-bin", "3", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = load_rows(out, tasks=("cross_entropy",))  # the reader of forecaster --eval and train_grpo
    assert len(rows) == sum(r["taken"] for r in report["bins"].values()) > 0
    for r in rows:
        assert r["true_bin"] == speedup_to_bin(r["aggregated_speedup"])


def test_sampler_cli_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "k.jsonl"
    bad.write_text(json.dumps({"kernel_id": "a", "task": "t", "code": "x"}) + "\n")
    assert pair_sampler.main([str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}:1" in err and "speedup" in err
    assert not (tmp_path / "o.jsonl").exists()
