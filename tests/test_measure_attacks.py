"""measure.py against candidates that attack it (tests/attacks/, one file per attack).

Each attack runs through the real harness: a sandboxed candidate worker, the trusted reference
worker, the parent's clock. Each test asserts the status the attack must get (never `ok` with an
inflated speedup) and that nothing outside the sandbox changed: no file named pwned-* in the
project, the cache, /tmp or /dev/shm, no project file modified, no process left behind.
docs/MEASUREMENT.md lists the attack classes, the defences and these tests.
"""
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import measure

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = ROOT / "tests" / "attacks"
TASK = "cross_entropy"
HONEST = 2.0  # the attacks that compute honestly use the reference itself: ~1x, never 2x


def _pwned_processes():
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith("pwned"):
                found.append(int(comm.parent.name))
        except OSError:
            pass
    return found


def _pwned_files(cache_dir):
    places = [ROOT / "tasks", ROOT, Path("/tmp"), Path("/dev/shm"), Path(cache_dir), Path.home()]
    return [p for place in places if place.exists() for p in place.glob("pwned*")] + \
        [p for p in (ROOT / "tasks").rglob("*") if "pwned" in p.name]


def _project_digest():
    h = hashlib.sha256()
    for p in sorted(list(ROOT.glob("*.py")) + list((ROOT / "tasks").rglob("*"))):
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def attack(tmp_path):
    """Run an attack file through measure(); check that it left nothing behind."""
    before = _project_digest()

    def run(name, **kw):
        kw = {"device": "cpu", "quick": True, "use_cache": False, "cache_dir": tmp_path, **kw}
        m = measure.measure(TASK, (ATTACKS / f"{name}.py").read_text(), **kw)
        deadline = time.monotonic() + 5
        while _pwned_processes() and time.monotonic() < deadline:  # SIGKILLed trees take a moment to go
            time.sleep(0.1)
        assert not _pwned_processes(), "a process of the attack outlived its measurement"
        assert not _pwned_files(tmp_path), "the attack left a file outside its sandbox"
        assert _project_digest() == before, "the attack changed the project's files"
        return m
    yield run
    for pid in _pwned_processes():  # never leave one to the next test, whatever happened
        os.kill(pid, signal.SIGKILL)


# ---- class 1: tampering inside the worker ---------------------------------------------------------

def test_replacing_the_checkers_code_does_not_reach_the_verdict(attack):
    m = attack("code_of_check")
    assert m.status == "incorrect", m.message


def test_a_forged_timer_is_overruled_by_the_parents_clock(attack):
    m = attack("timer_via_gc")
    if m.status == "rejected":  # on a heavily loaded machine the clock's noise can hide it once;
        assert "did not reproduce" in m.message, m.message  # the confirmation run then catches it
        return
    assert m.status == "ok", m.message  # it computes honestly: it is correct, just not fast
    assert m.speedup < HONEST, m.cases
    assert any("parent's clock" in f for f in m.flags), m.flags


def test_a_claimed_speedup_needs_the_parents_clock_to_agree(attack, monkeypatch):
    """The forged timer again, with the parent clock's noise test blinded, as a heavily loaded
    machine can blind it: a claimed speedup stands only if the parent's clock saw at least half of
    each call's claim (the forgery claims 3x to 500x per case depending on the machine's load; once
    it claimed 8x, and a rule kept for claims above 10x let it through)."""
    monkeypatch.setattr(measure, "CLOCK_FLOOR_REL", 1e9)
    m = attack("timer_via_gc")
    if m.status == "rejected":  # under heavy load the parent's clock itself missed once (a 1079x
        assert "did not reproduce" in m.message, m.message  # claim): the confirmation run caught it
        return
    assert m.status == "ok", m.message
    assert m.speedup < HONEST, m.cases
    assert any("parent's clock is taken" in f for f in m.flags), m.flags


def test_on_cpu_a_claim_above_2x_is_measured_twice(attack, monkeypatch):
    """Both tests of the parent's clock blinded in the first measurement only, as a heavily loaded
    CPU can blind them by chance: a forged timer's modest 4x claim (below the 10x that a GPU
    measurement confirms) is measured a second time, in a fresh worker, where the clock sees the
    work and the claim does not reproduce."""
    once, blinded = measure._measure_once, []

    def first_blinded(**run):
        blinded.append(not blinded)
        monkeypatch.setattr(measure, "CLOCK_FLOOR_REL", 1e9 if blinded[-1] else 0.1)
        monkeypatch.setattr(measure, "PARENT_CLOCK_SLACK", math.inf if blinded[-1] else 2.0)
        return once(**run)
    monkeypatch.setattr(measure, "_measure_once", first_blinded)
    m = attack("timer_a_quarter")
    assert blinded == [True, False]
    assert m.status == "rejected" and "did not reproduce" in m.message, (m.status, m.message)


def test_work_in_threads_that_exit_still_counts(attack):
    m = attack("work_in_exiting_threads")
    assert m.status == "ok" and m.speedup < HONEST, (m.status, m.message, m.speedup)
    assert any("parent's clock" in f for f in m.flags), m.flags


def test_computing_only_the_handed_over_call_is_a_forgery(attack):
    m = attack("defer_to_handover")
    assert m.status == "rejected" and "committed" in m.message, m.message


@pytest.mark.parametrize("name", ["setprofile_sleep", "torch_library_override"])
def test_slowing_the_reference_from_the_candidates_process_does_nothing(attack, name):
    m = attack(name)
    assert m.status == "ok", m.message
    assert m.speedup < HONEST, m.cases


@pytest.mark.parametrize("name", ["function_mode_isclose", "frame_expected"])
def test_faking_the_comparison_or_stealing_the_expected_output_is_incorrect(attack, name):
    m = attack(name)
    assert m.status == "incorrect", m.message


def test_filling_outputs_from_a_thread_after_return_is_caught(attack):
    m = attack("thread_after_return")
    # Unfilled at commit time: incorrect; filled later than the commitment: a forged handover.
    # Filled within the parent's clock: its time is counted. Never a free speedup.
    assert m.status in ("incorrect", "rejected") or m.speedup < HONEST, (m.status, m.message, m.speedup)


# ---- class 2: timed calls never checked, few and predictable inputs --------------------------------

def test_garbage_once_timing_starts_is_incorrect(attack):
    m = attack("garbage_unless_checked")
    assert m.status == "incorrect", m.message


def test_a_content_keyed_cache_never_hits(attack):
    m = attack("content_cache")
    assert m.status == "ok" and m.speedup < HONEST, (m.status, m.message, m.speedup)


def test_answers_precomputed_at_import_are_useless(attack):
    m = attack("precompute_at_import")
    assert m.status == "incorrect", m.message


# ---- class 3: the result channel -------------------------------------------------------------------

def test_a_pickle_on_the_channel_never_runs_in_the_parent(attack):
    m = attack("pickle_channel")
    assert m.status in ("rejected", "crashed", "incorrect"), m.message
    assert not Path("/tmp/pwned-pickle").exists()


def test_forged_replies_are_not_believed(attack):
    m = attack("forged_reply")
    assert m.status in ("rejected", "crashed"), m.message


def test_half_a_reply_then_silence_times_out(attack):
    t0 = time.monotonic()
    m = attack("silent_header", timeout_s=2)
    assert m.status == "timeout", m.message
    assert time.monotonic() - t0 < 30


# ---- class 4: escapes --------------------------------------------------------------------------------

def test_the_cache_is_written_by_the_parent_alone(attack, tmp_path):
    m = attack("write_cache", use_cache=True)
    assert m.status == "ok" and m.speedup < HONEST, m.message
    entries = list(tmp_path.glob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["speedup"] == m.speedup


def test_planted_byte_code_and_sitecustomize_do_not_land(attack):
    m = attack("plant_pyc")
    assert m.status == "ok", m.message
    assert not Path("/tmp/pwned-sitecustomize").exists()
    assert not list((ROOT / "tasks" / "__pycache__").glob("_check*")) if (ROOT / "tasks" / "__pycache__").exists() else True


@pytest.mark.parametrize("name", ["daemon", "sigterm_grandchild"])
def test_daemons_and_grandchildren_die_with_the_sandbox(attack, name):
    m = attack(name)  # the fixture asserts that no pwned-* process is left
    assert m.status == "ok", m.message


def test_memory_held_in_a_child_process_counts(attack):
    m = attack("memory_in_child", memory_gb=1.5, timeout_s=60)
    assert m.status == "crashed" and "memory" in m.message, m.message


def test_a_fork_bomb_is_stopped(attack):
    m = attack("fork_bomb", timeout_s=60)
    assert m.status == "crashed" and "processes" in m.message, m.message


def test_the_worker_dies_with_a_parent_killed_by_sigkill():
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import measure; "
            f"measure.measure({TASK!r}, open({str(ATTACKS / 'hang.py')!r}).read(), device='cpu', use_cache=False, timeout_s=120)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not _pwned_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pwned_processes(), "the hanging candidate never started"
    finally:
        parent.kill()  # SIGKILL: no cleanup code of the parent runs
        parent.wait()
    deadline = time.monotonic() + 10
    while _pwned_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _pwned_processes()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the measure worker outlived its SIGKILLed parent"


# ---- class 5: outputs ------------------------------------------------------------------------------

def test_a_non_contiguous_output_is_incorrect(attack):
    m = attack("noncontiguous")
    assert m.status == "incorrect" and "non-contiguous" in m.message, m.message
