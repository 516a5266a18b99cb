"""Tests of eval_set.py: harvest, eval set, RL pool, discovery pairs, manifest, and --fill.

The searches harvested here are real search.py runs (search.Search writes their event logs and
training rows) with scripted collaborators: a measure function whose speedup is a hash of the
code, spread over every bin, and a mutator that appends a line to its parent.
"""
import hashlib
import json
import random

import pytest
from test_pair_sampler import kernel

import eval_set
from bins import speedup_to_bin
from data import pair_sampler
from data.dataset import load_rows
from runtime.measure_pool import MeasurePool
from search import Args, Search

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


# ---- harvest, outputs, manifest ----------------------------------------------------------------

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


# ---- --fill: a goal-conditioned search per short bin, measured for real on CPU --------------------

@pytest.mark.e2e
@pytest.mark.slow
def test_fill_runs_a_goal_conditioned_search_for_the_short_bin_and_resumes(tmp_path, capsys, monkeypatch):
    import tasks
    catalog = tasks.variant_sources
    # the plain-PyTorch variant only: interpreted Triton would add ~15 s and test nothing more
    monkeypatch.setattr(tasks, "variant_sources", lambda name, space="triton": {"torch_inplace": catalog(name)["torch_inplace"]})
    import measure
    # real measurements, timed as briefly as --quick times them: nothing here reads how precise a
    # speedup is (a full CPU timing costs ~3 s of CPU a measurement, both sides)
    monkeypatch.setitem(measure.REPS, ("cpu", False), measure.REPS[("cpu", True)])
    # speedups 1 (the seed), 1.2, 1.6, 2.2, 3.0: pairs in bins 1..7 (mirrors give 1..3), none in bin 8
    ks = [kernel("h/seed", "cross_entropy", 1.0, seed=True)]
    ks += [kernel(f"h/k{i}", "cross_entropy", s) for i, s in enumerate((1.2, 1.6, 2.2, 3.0))]
    src = tmp_path / "kernels.jsonl"
    src.write_text("".join(json.dumps(k) + "\n" for k in ks))
    out = tmp_path / "data"
    argv = [str(src), "--out", str(out), "--per-bin", "1", "--fill", "--fill-budget", "1",
            "--mutator", "catalog", "--scale", "cpu", "--space", "triton"]
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
    said = capsys.readouterr().out
    # Where the fill search's own quick CPU figures filled bin 8 (its seed measured at 0.75x or
    # less pairs with the 3.0x kernel at 4x: a loaded machine did it once), no fill search is due.
    assert "resuming from" in said or "short bins: none" in said, said
    assert {n: (out / n).read_text() for n in before} == before
