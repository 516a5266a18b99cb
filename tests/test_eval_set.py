"""Tests of the data builders: pair_sampler.py (balanced pairs) and eval_set.py (harvest, eval
set, RL pool, discovery pairs, manifest), and of the paper's discovery pairs end to end (read by
dataset.load_rows, forecast child-against-parent by forecaster.py --eval, scored by metrics.py
--discovery; tests/fixtures/paper_discovery_pairs.jsonl is hand-made: real kernels of tasks/kernels,
invented speedups).

The searches harvested here are real search.py runs (search.Search writes their event logs and
training rows) with scripted collaborators: a measure function whose speedup is a hash of the
code, spread over every bin, and a mutator that appends a line to its parent.
"""
import hashlib
import json
import math
import random
from itertools import combinations
from pathlib import Path

import pytest

import eval_set
import forecaster
import metrics
import pair_sampler
from bins import speedup_to_bin
from dataset import load_rows
from forecaster_backends import Completion
from measure_pool import MeasurePool
from records import RecordError
from pair_sampler import Group, sample_pairs, water_fill
from search import Args, Search
from tasks import TASK_NAMES

FIX = Path(__file__).resolve().parent / "fixtures"


# ---- scripted searches --------------------------------------------------------------------------

class FakeMeasurement:
    def __init__(self, status, speedup):
        self.status, self.speedup = status, speedup

    def to_dict(self):
        return dict(status=self.status, speedup=self.speedup, cases=[], message="",
                    device="FakeGPU", scale="cpu")


def hashed_speedup(source):
    """A speedup in [0.25, 8) fixed by the code: 2^(5h - 2), h a hash of the source in [0, 1)."""
    h = int(hashlib.sha256(source.encode()).hexdigest()[:8], 16) / 16 ** 8
    return 2 ** (5 * h - 2)


def fake_measure(task, source, **kw):
    if "broken" in source:
        return FakeMeasurement("compile_error", None)
    return FakeMeasurement("ok", hashed_speedup(source))


class AppendMutator:
    name = "append"

    def propose(self, parent, n, seen, key):
        rng = random.Random(key)
        return [{"code": parent.code + f"# edit {rng.random():.6f}\n" + ("broken\n" if rng.random() < 0.1 else ""),
                 "error": None, "meta": {}} for _ in range(n)]


def make_search(folder, task, budget=30):
    cfg = Args(task=task, gate="none", steps=20, budget=budget, mutations=4, mutator="append", scale="cpu")
    with MeasurePool(["cpu"], measure_fn=fake_measure) as pool:
        Search(cfg, folder, seed_code=f"def custom_kernel(data):  # {task} seed\n    return data\n",
               mutator=AppendMutator(), pool=pool, progress=False, say=lambda *a: None).run()
    return folder


@pytest.fixture(scope="module")
def searches(tmp_path_factory):
    root = tmp_path_factory.mktemp("searches")
    return [make_search(root / "ce-run", "cross_entropy"), make_search(root / "tri-run", "trimul"),
            make_search(root / "ce-run-2", "cross_entropy", budget=10)]


def kernel(kid, task, speedup, code=None, seed=False, hardware="gpu", scale="benchmark"):
    return {"kernel_id": kid, "task": task, "code": code or f"# {kid}\n", "speedup": speedup,
            "hardware": hardware, "scale": scale, "is_seed": seed, "source_search": "s"}


# ---- pair_sampler: water-filling and the draw ----------------------------------------------------

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


# ---- eval_set: harvest, outputs, manifest --------------------------------------------------------

def _lines(path):
    return [json.loads(l) for l in path.read_text().splitlines()]


def test_harvest_reads_kernels_and_parents_from_a_search(searches):
    ks = eval_set.harvest_search(searches[0], "ce-run")
    events = _lines(searches[0] / "events.jsonl")
    measured = {e["request_id"]: e for e in events if e["kind"] == "measurement"}
    ok = [rid for rid, e in measured.items() if e["payload"]["measurement"]["status"] == "ok"]
    assert sorted(k["kernel_id"] for k in ks) == sorted(f"ce-run/{rid}" for rid in ok)
    for k in ks:
        rid = k["kernel_id"].split("/")[1]
        assert k["speedup"] == measured[rid]["payload"]["measurement"]["speedup"]
        assert k["is_seed"] == (rid == "seed") and k["scale"] == "cpu" and k["hardware"] == "FakeGPU"
        parent = measured[rid]["parent_id"]
        assert k["parent_id"] == (None if parent is None else f"ce-run/{parent}")


def test_build_writes_balanced_eval_set_disjoint_pool_discovery_pairs_and_manifest(searches, tmp_path, capsys):
    out = tmp_path / "data"
    rc = eval_set.main([*map(str, searches), "--out", str(out), "--per-bin", "4", "--seed", "1",
                        "--holdout-task", "trimul"])
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    for name, info in manifest["outputs"].items():  # the manifest describes the files on disk
        text = (out / name).read_text()
        assert info == {"rows": len(text.splitlines()), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    kernels = _lines(out / "kernels.jsonl")
    by_code = {}
    for k in kernels:
        by_code.setdefault((k["task"], k["code"].strip()), k)

    ev = load_rows(out / "eval_set.jsonl")
    assert len(ev) == sum(b["taken"] for b in manifest["bins"].values())
    assert all(b["taken"] <= 4 for b in manifest["bins"].values())
    used = set()
    for r in ev:
        a, c = by_code[(r["pack"], r["anchor_code"].strip())], by_code[(r["pack"], r["candidate_code"].strip())]
        assert r["aggregated_speedup"] == pytest.approx(pair_sampler.effective_speedup(c) / pair_sampler.effective_speedup(a))
        used |= {(r["pack"], code.strip()) for code, k in ((r["anchor_code"], a), (r["candidate_code"], c))
                 if not k["is_seed"]}

    pool = _lines(out / "rl_pool.jsonl")
    assert len(load_rows(out / "rl_pool.jsonl")) == len(pool) > 0
    assert {r["pair_type"] for r in pool} == {"seed", "parent_edit"}
    for r in pool:
        assert r["pack"] != "trimul"  # the held-out task
        for code in (r["anchor_code"], r["candidate_code"]):
            assert (r["pack"], code.strip()) not in used  # no eval kernel in the pool
        assert r["relative_bin"] == speedup_to_bin(r["aggregated_speedup"])

    disc = _lines(out / "discovery_pairs.jsonl")
    assert {"pair_id", "problem_id", "benchmark_family", "parent_code", "child_code", "g_speedup",
            "true_bin", "hardware"} <= set(disc[0])
    for d in disc:
        p, c = by_code[(d["problem_id"], d["parent_code"].strip())], by_code[(d["problem_id"], d["child_code"].strip())]
        assert d["g_speedup"] == pytest.approx(pair_sampler.effective_speedup(c) / pair_sampler.effective_speedup(p))
        assert d["true_bin"] == speedup_to_bin(d["g_speedup"])
    # one pair per distinct measured step: the second cross_entropy run repeats the first's first
    # steps (same search seed, same mutations), and its seed kernel is the first run's
    steps = set()
    for s in searches:
        ks = {k["kernel_id"]: k for k in eval_set.harvest_search(s, "x")}
        steps |= {(k["task"], ks[k["parent_id"]]["code"], k["code"]) for k in ks.values() if k["parent_id"]}
    assert len(disc) == len(steps) == len({(d["problem_id"], d["parent_code"], d["child_code"]) for d in disc})
    assert len(steps) < sum(1 for s in searches for k in eval_set.harvest_search(s, "x") if k["parent_id"])

    # the kernels file alone rebuilds the same eval set
    again = tmp_path / "again"
    assert eval_set.main([str(out / "kernels.jsonl"), "--out", str(again), "--per-bin", "4", "--seed", "1",
                          "--holdout-task", "trimul"]) == 0
    for name in ("eval_set.jsonl", "rl_pool.jsonl", "discovery_pairs.jsonl"):
        assert (again / name).read_text() == (out / name).read_text(), name


def test_build_bad_inputs_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for argv, needle in (([str(tmp_path / "empty")], "not a search output folder"),
                         ([str(tmp_path / "missing")], "does not exist"),
                         ([str(tmp_path / "empty"), "--per-bin", "0"], "--per-bin")):
        assert eval_set.main(argv + ["--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and needle in err, err
    assert not (tmp_path / "o").exists()


def test_mirrors_allows_a_pair_and_its_mirror():
    ks = [kernel("s", "t", 1.0, seed=True), kernel("a", "t", 3.0)]
    pairs, _ = sample_pairs(ks, 5, seed=0, mirrors=True)
    assert sorted((p["anchor"]["kernel_id"], p["candidate"]["kernel_id"], p["bin"]) for p in pairs) == \
        [("a", "s", 1), ("s", "a", 7)]
    assert len(sample_pairs(ks, 5, seed=0)[0]) == 1


# ---- the paper's discovery pairs: read, forecast child against parent, score --------------------

class ChildRecorder:
    """A backend that records each prompt and answers with the forecast tool's own fields: most of
    the mass on bin 6 when the child is one of the fused or chunked kernels, else on bin 3."""
    name, adapter, reasoning_effort = "scripted", None, "medium"

    def __init__(self):
        self.prompts = []

    def generate(self, conversations, *, max_new_tokens, temperature, seed, tools=None, shared=None):
        fields = [f for f in tools[0]["function"]["parameters"]["properties"] if f.startswith("p_")]
        out = []
        for conv in conversations:
            text = "\n".join(m["content"] for m in conv)
            self.prompts.append(text)
            child = text[text.rindex("Candidate kernel"):]
            top = 6 if ("fused" in child.lower() or "chunk" in child.lower()) else 3
            probs = [0.8 if b == top else 0.2 / 7 for b in range(1, 9)]
            answer = {"predicted_bin": top, **dict(zip(fields, probs)), "reasoning": "scripted"}
            out.append(Completion(json.dumps(answer), 10, 5))
        return out


def test_discovery_pairs_are_forecast_child_against_parent_and_scored(tmp_path, capsys):
    pairs = [json.loads(line) for line in (FIX / "paper_discovery_pairs.jsonl").read_text().splitlines()]
    rows = load_rows(FIX / "paper_discovery_pairs.jsonl", tasks=TASK_NAMES)
    for r, pair in zip(rows, pairs):
        assert (r["row_id"], r["pack"], r["anchor_code"], r["candidate_code"], r["aggregated_speedup"]) == \
            (pair["pair_id"], pair["problem_id"], pair["parent_code"], pair["child_code"], pair["g_speedup"])
    out = tmp_path / "preds.jsonl"
    backend = ChildRecorder()
    argv = ["--eval", str(FIX / "paper_discovery_pairs.jsonl"), "--out", str(out), "--no-cache"]
    assert forecaster.main(argv, backend=backend) == 0
    capsys.readouterr()
    assert len(backend.prompts) == len(pairs)
    for pair in pairs:  # the parent is the prompt's reference, the child its candidate
        parent, child = pair["parent_code"].splitlines()[0], pair["child_code"].splitlines()[0]
        prompt = next(p for p in backend.prompts if child in p[p.rindex("Candidate kernel"):])
        assert parent in prompt[:prompt.rindex("Candidate kernel")]
    preds = {p["id"]: p for p in map(json.loads, out.read_text().splitlines())}
    assert {k: (p["true_speedup"], p["true_bin"]) for k, p in preds.items()} == \
        {pair["pair_id"]: (pair["g_speedup"], pair["true_bin"]) for pair in pairs}
    assert metrics.main([str(out), "--discovery", "0.5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["discovery"]
    # flagged (P(>= 1.414x) = .8 + 3 * .2/7 >= .5): d1 chunked (1.9x, a discovery), d2 fused_online
    # (1.25x, not), d4 fused_projections (3.1x, a discovery); not flagged: d3 (0.8x), d5 (1.0x)
    assert (d["flagged"], d["precision"], d["recall"], d["base_rate"]) == (3, pytest.approx(2 / 3), 1.0, 0.4)


def test_discovery_pairs_of_other_benchmarks_are_refused_with_the_fix(tmp_path, capsys):
    pair = json.loads((FIX / "paper_discovery_pairs.jsonl").read_text().splitlines()[0])
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({**pair, "problem_id": "L3/T11/vgg19", "benchmark_family": "kernelbench_l3"}) + "\n")
    assert len(load_rows(path)) == 1  # any problem, when no task list is given
    with pytest.raises(RecordError, match="gpu_mode"):
        load_rows(path, tasks=TASK_NAMES)
    assert forecaster.main(["--eval", str(path), "--out", str(tmp_path / "p.jsonl"), "--no-cache"],
                           backend=ChildRecorder()) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{path}:1" in err and "kernelbench_l3" in err


# ---- --fill: a goal-conditioned search per short bin, measured for real on CPU --------------------

@pytest.mark.slow
def test_fill_runs_a_goal_conditioned_search_for_the_short_bin_and_resumes(tmp_path, capsys, monkeypatch):
    import tasks
    catalog = tasks.variant_sources
    # the plain-PyTorch variant only: interpreted Triton would add ~15 s and test nothing more
    monkeypatch.setattr(tasks, "variant_sources", lambda name: {"torch_inplace": catalog(name)["torch_inplace"]})
    # speedups 1 (the seed), 1.2, 1.6, 2.2, 3.0: pairs in bins 1..7 (mirrors give 1..3), none in bin 8
    ks = [kernel("h/seed", "cross_entropy", 1.0, seed=True)]
    ks += [kernel(f"h/k{i}", "cross_entropy", s) for i, s in enumerate((1.2, 1.6, 2.2, 3.0))]
    src = tmp_path / "kernels.jsonl"
    src.write_text("".join(json.dumps(k) + "\n" for k in ks))
    out = tmp_path / "data"
    argv = [str(src), "--out", str(out), "--per-bin", "1", "--fill", "--fill-budget", "1",
            "--mutator", "catalog", "--scale", "cpu"]
    assert eval_set.main(argv) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "bin 8 is short (0 of 1): goal-conditioned search on cross_entropy" in said
    folder = out / "fill" / "cross_entropy-bin8"
    config = json.loads((folder / "events.jsonl").read_text().splitlines()[0])["payload"]
    assert (config["target_bin"], config["gate"], config["mutator"]) == (8, "none", "catalog")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["measurements"] == 1 and summary["target_bin"] == 8
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["fill_searches"] == [{"folder": "fill/cross_entropy-bin8", "task": "cross_entropy", "bin": 8}]
    harvested = [k for k in _lines(out / "kernels.jsonl") if k["source_search"] == "cross_entropy-bin8"]
    assert len(harvested) == summary["training_rows"] and harvested[0]["scale"] == "cpu"
    # a rerun resumes the finished fill search from its log: nothing is measured again
    before = {n: (out / n).read_text() for n in ("eval_set.jsonl", "kernels.jsonl", "manifest.json")}
    monkeypatch.setattr("measure.measure", lambda *a, **kw: pytest.fail("measured on a rerun"))
    assert eval_set.main(argv) == 0
    assert "resuming from" in capsys.readouterr().out
    assert {n: (out / n).read_text() for n in before} == before
