"""Tests of scripts/gpu_check.py, the parts that run on CPU."""
import pytest
from test_forecast_prompt import CAND, REF
from tiny_models import HARMONY_VOCAB


@pytest.mark.e2e
def test_gpu_check_forecast_cost_table_runs_on_cpu(o200k):
    """scripts/gpu_check.py's forecast-cost section, here on CPU with a one-layer tiny-width model
    (on a GPU it runs GPT-OSS-20B's width): every read-out and setting is timed, the logits read-out
    agrees with and without prefix reuse, and a row's ratio is its cost over the measurement's."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import gpu_check
    lines = []
    model = gpu_check.config_model(1, width="tiny", device="cpu")
    assert model.config.vocab_size == HARMONY_VOCAB and model.config.num_hidden_layers == 1
    rows = gpu_check.forecast_costs(lines.append, model, [CAND, CAND + "# b\n"], REF, measurement_s=2.0,
                                    device="cpu", verbalized_tokens=2)
    assert [(r["readout"], r["reuse"]) for r in rows] == [("logits", False), ("logits", True),
                                                          ("verbalized", False), ("verbalized", True)]
    for r in rows:
        assert r["total_s"] > 0 and r["ratio"] == pytest.approx(r["per_s"] / 2.0)
        assert r["tokens_out"] == (2 if r["readout"] == "verbalized" else 0) and r["tokens_in"] > 500
    diff = next(line for line in lines if line.startswith("| logits | yes"))
    assert float(diff.split("|")[-2]) < 1e-4


# ---- the run's plumbing: budgets, time limits, the record, the sandbox choice --------------------

def _gpu_check():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import gpu_check
    return gpu_check


def _args(**kw):
    import types

    from tasks import TASK_NAMES
    return types.SimpleNamespace(**dict(quick=False, task_list=list(TASK_NAMES), no_tests=False, no_engine=False,
                                        no_surrogate=False, unsafe_no_sandbox=False, engine_layers=24) | kw)


def test_quick_fits_three_minutes_and_the_whole_run_eight():
    """Every section's limit and its child's start-up, added up, within the run's budget: a run
    skips nothing by design; a section that overruns is cut and the ones after it still run."""
    g = _gpu_check()
    quick, full = g.sections(_args(quick=True)), g.sections(_args())
    assert [name for name, _, _ in quick] == ["timer", "cross_entropy", "gpu tests"]
    assert [name for name, _, _ in full] == ["timer", "cross_entropy", "gpu tests", "other tasks", "engine", "surrogate"]
    for run, budget in ((quick, 180), (full, 480)):
        assert sum(limit + g.CHILD_START_S for _, limit, _ in run) <= budget
    assert g.QUICK_BUDGET_S == 180 and g.FULL_BUDGET_S == 480


def test_a_section_cut_at_its_limit_is_recorded_with_what_it_printed():
    import sys
    g = _gpu_check()
    recorded = []
    child = [sys.executable, "-c", "import time; print('| row 1 |', flush=True); time.sleep(60)"]
    assert not g.run_section("slow one", 3, child, recorded.extend)
    assert recorded[0] == "| row 1 |" and "**cut at its time limit of 3 s**" in recorded[1]
    recorded.clear()
    child = [sys.executable, "-c", "print('half a table'); raise SystemExit('CUDA error: an illegal memory access')"]
    assert not g.run_section("broken", 30, child, recorded.extend)
    assert recorded[:2] == ["half a table", "CUDA error: an illegal memory access"]
    assert "**failed** (exit 1" in recorded[2]
    recorded.clear()
    assert g.run_section("fine", 30, [sys.executable, "-c", "print('ok')"], recorded.extend)
    assert recorded[0] == "ok" and recorded[1].startswith("(section fine: ") and "failed" not in recorded[1]


def test_without_bubblewrap_it_says_so_and_measures_its_own_kernels_unsandboxed(monkeypatch):
    from harness import measure_sandbox
    g = _gpu_check()

    def missing():
        raise measure_sandbox.SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    monkeypatch.setattr(measure_sandbox, "require_sandbox", missing)
    unsafe, line = g.sandbox_choice(_args())
    assert unsafe and "--unsafe-no-sandbox" in line and "bwrap) is not installed" in line
    assert g.sandbox_choice(_args(unsafe_no_sandbox=True)) == (True, "sandbox: none (--unsafe-no-sandbox given)")
    monkeypatch.setattr(measure_sandbox, "require_sandbox", lambda: None)
    assert g.sandbox_choice(_args()) == (False, "sandbox: bubblewrap")


def test_the_gpu_tests_get_the_sandbox_choice(monkeypatch):
    import subprocess
    import types
    g = _gpu_check()
    seen = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: seen.append(cmd) or types.SimpleNamespace(
        returncode=0, stdout="3 passed in 9.00s\n", stderr=""))
    lines = []
    g.gpu_tests(lines.append, unsafe=True, files=g.QUICK_TEST_FILES)
    assert seen[0][-1] == "--unsafe-no-sandbox" and "tests/test_measure.py" in seen[0]
    assert "exit 0: 3 passed in 9.00s" in lines
