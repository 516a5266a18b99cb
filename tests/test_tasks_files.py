"""--task PATH: KernelBench-format problems and task files of the project's own format.

The problem files below are written here for the tests (none is KernelBench's). Measurements run
through the real sandboxed CPU harness, so the problem file crosses into the sandbox as it would
for a user.
"""
import json
import re
from pathlib import Path

import pytest

import measure
import search
import tasks
from forecast_prompt import build_messages
from tasks import problem_file

ROOT = Path(__file__).resolve().parent.parent

# A small KernelBench-format problem: a residual MLP block (old-style super(Model, self), as many
# KernelBench files have it, so the seed's renaming must reach it too).
PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, hidden):
        super(Model, self).__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, features)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return [64, 128]
'''

# ModelNew with the same parameters created in the same order (so the same weights), fused ops.
GOOD = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, features)

    def forward(self, x):
        h = torch.addmm(self.fc1.bias, x, self.fc1.weight.t()).clamp_min_(0)
        return torch.addmm(self.fc2.bias, h, self.fc2.weight.t()).add_(x)
'''


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run(task, source):
    return measure.measure(task, source, device="cpu", quick=True, use_cache=False)


# ---- KernelBench format --------------------------------------------------------------------------

@pytest.mark.slow
def test_kernelbench_candidates_are_measured_right(tmp_path):
    task = write(tmp_path, "residual_mlp.py", PROBLEM)
    m = run(task, GOOD)
    assert m.status == "ok" and m.speedup > 0 and [r["case"] for r in m.cases] == [{"problem": "residual_mlp"}]
    m = run(task, GOOD.replace(".add_(x)", ""))  # forgets the residual
    assert m.status == "incorrect" and "outside" in m.message
    m = run(task, "import torch\n\ndef kernel(x):\n    return x\n")
    assert m.status == "compile_error" and "ModelNew" in m.message and "custom_kernel" in m.message


def test_kernelbench_rule_seed_and_inputs(tmp_path):
    import torch
    t = tasks.get_task(write(tmp_path, "residual_mlp.py", PROBLEM))
    # five trials: the timed case's two seeds and three check cases; one shape, the problem's
    assert len(t.BENCHMARK_CASES) == len(t.CPU_CASES) == 1 and len(t.CHECK_CASES) == 3
    a, b = t.generate_input(t.CPU_CASES[0], 7), t.generate_input(t.CPU_CASES[0], 7)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], t.generate_input(t.CPU_CASES[0], 8)[0])
    expected = t.reference(a)
    # KernelBench's fp32 tolerance, 1e-4: a 5e-4 error fails, a 5e-5 one passes
    assert t.check(expected + 5e-5, expected)[0] and not t.check(expected + 5e-4, expected)[0]
    assert not t.check(expected[:-1], expected)[0]
    # the seed is Model renamed ModelNew, and gets the reference's weights
    seed = tasks.seed_source(t.path)
    assert "class ModelNew(" in seed and "super(ModelNew, self)" in seed and not re.search(r"\bModel\b", seed)
    ns = {}
    exec(compile(seed, "seed", "exec"), ns)
    assert torch.equal(t.entry_point(type("m", (), ns), "cpu")(a), expected)
    assert tasks.variant_sources(t.path) == {}


def test_bad_problems_and_names_fail_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(problem_file.KERNELBENCH_ENV, raising=False)
    no_inputs = write(tmp_path, "broken.py", PROBLEM.replace("def get_inputs", "def make_inputs"))
    with pytest.raises(ValueError, match="lacks get_inputs"):
        tasks.get_task(no_inputs)
    cand = write(tmp_path, "cand.py", GOOD)
    assert measure.main(["--task", no_inputs, "--candidate", cand, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "get_inputs" in err
    with pytest.raises(ValueError, match="no such task file"):
        tasks.get_task(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="--kernelbench-dir"):
        tasks.get_task("kernelbench:3/1_Tiny")
    checkout = tmp_path / "KernelBench"
    (checkout / "KernelBench" / "level3").mkdir(parents=True)
    (checkout / "KernelBench" / "level3" / "1_Tiny.py").write_text(PROBLEM)
    monkeypatch.setenv(problem_file.KERNELBENCH_ENV, str(checkout))
    assert tasks.get_task("kernelbench:3/1_Tiny").NAME == "1_Tiny"
    with pytest.raises(ValueError, match="no KernelBench problem '3/2_Other'"):
        tasks.get_task("kernelbench:3/2_Other")
    assert search.main(["--task", "kernelbench:3/2_Other", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "2_Other" in err


def test_forecast_prompt_of_a_problem_file_shows_its_source_not_its_path(tmp_path):
    path = write(tmp_path, "residual_mlp.py", PROBLEM)
    messages = build_messages(path, tasks.reference_source(path), GOOD)
    user = messages[1]["content"]
    assert "Task: residual_mlp" in user and str(tmp_path) not in user
    assert "super(Model, self)" in user and "KernelBench problem" in user  # the problem itself is the reference


# ---- the project's own format, and the search on both ----------------------------------------------

def readme_task():
    """The task file the README shows under "Your own op"."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Your own op"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("\n```", start)] + "\n"


def test_readme_task_file_is_short_and_a_task(tmp_path):
    from mutators import set_tunable, tunables
    source = readme_task()
    assert len(source.splitlines()) <= 34
    t = tasks.get_task(write(tmp_path, "my_op.py", source))
    data = t.generate_input(t.CPU_CASES[0], 0)
    assert t.check(t.reference(data), t.reference(data)) == (True, "ok")
    # its kernel is correct at every value of its marked constant: the catalog's edits are real kernels
    (name, (_, values)), = tunables(source).items()
    for v in values:
        edited = tasks.get_task(write(tmp_path, f"my_op_{v}.py", set_tunable(source, name, v)))
        assert edited.check(edited.module.custom_kernel(data), t.reference(data)) == (True, "ok")
    with pytest.raises(ValueError, match="lacks CASES"):
        tasks.get_task(write(tmp_path, "no_cases.py", source.replace("CASES = ", "SHAPES = ")))


@pytest.mark.slow
@pytest.mark.parametrize("name, text, first", [
    ("my_op.py", None, "variant my_op"),  # the README's file: its own kernel is the first child
    # a marked constant, edited (in the Triton space: on a CPU the compiled form would come first)
    pytest.param("residual_mlp.py", PROBLEM + "\nCHUNK = 8  # tune: 4, 8\n", "CHUNK 8 -> 4", marks=pytest.mark.e2e)])
@pytest.mark.e2e
def test_search_runs_end_to_end_on_a_problem_file(tmp_path, name, text, first, capsys, monkeypatch):
    # real measurements of the seed and of one mutation, timed as briefly as --quick times them:
    # nothing here reads how precise a speedup is (a full CPU timing costs ~3 s of CPU, both sides)
    monkeypatch.setitem(measure.REPS, ("cpu", False), measure.REPS[("cpu", True)])
    path = write(tmp_path, name, text or readme_task())
    out = tmp_path / "run"
    argv = ["--task", path, "--out", str(out), "--mutator", "catalog", "--gate", "none", "--budget", "1",
            "--no-progress"] + (["--space", "triton"] if "CHUNK" in first else [])
    assert search.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_speedup"] > 0 and summary["measurements"] == 1
    assert "mutator: offline catalog" in capsys.readouterr().out
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    mutation = next(e["payload"]["candidates"] for e in events if e["kind"] == "mutation")
    measured = [e["payload"]["measurement"] for e in events if e["kind"] == "measurement" and e["request_id"] != "seed"]
    assert mutation[0]["meta"]["edit"] == first and [m["status"] for m in measured] == ["ok"]
