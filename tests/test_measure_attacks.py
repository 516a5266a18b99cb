"""measure.py against candidates that attack it (tests/attacks/, one file per attack).

Each attack runs through the real harness: a sandboxed candidate worker, the trusted reference
worker, the parent's clock. Each test asserts the status the attack must get (never `ok` with an
inflated speedup) and that nothing outside the sandbox changed: no file named pwned-* in the
project, the cache, /tmp or /dev/shm, no project file modified, no process left behind.
docs/MEASUREMENT.md lists the attack classes, the defences and these tests. The first part holds
the attacks of the redesign (the trusted side owns the clock, the inputs and the limits), by the
classes of docs/MEASUREMENT.md; the second the earlier rounds', which must all still hold.
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import measure
from harness import cpu_windows, measure_channel, measure_sandbox, worker_set
from harness.sides import HarnessError

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = ROOT / "tests" / "attacks"
TASK = "cross_entropy"
HONEST = 2.0  # the attacks that compute honestly use the reference itself: ~1x, never 2x
# A forgery that worked would show its claim (1.5x to 4x); an honest ~1x measures well under this
# even on a loaded machine (the A/A spread is a few percent, docs/MEASUREMENT.md).
FORGED = 1.3

# What the design guarantees of the CPU a frozen sandbox uses outside its windows: the kernel says a
# cgroup is frozen once its last task stopped, and the clock read then can miss that task's last
# microseconds, which land in the next reading, outside the window (docs/MEASUREMENT.md, What
# remains open: the freeze's last microseconds). Measured: 0.002 to 0.007 ms a case on an AMD EPYC
# VM, up to about 2 us a window on the Intel one; a thread left running outside the windows would
# use milliseconds. The bound: 10 us a window.
FREEZE_TAIL_MS = 0.010

# The suite keeps at least one attack of every class the harness defends (docs/MEASUREMENT.md)
# and every attack of round 3; the rest of the catalogue, one sandboxed measurement of 2 to 8 s
# each, runs as its own tier (`pytest -m attacks`, CI runs it after the suite), so that the suite
# stays under three minutes on 2 cores.
ATTACKS_TIER = pytest.mark.attacks


def tier(*names):
    """Parameters of the attacks tier."""
    return [pytest.param(n, marks=ATTACKS_TIER) for n in names]


def at_most_honest(attack, name):
    """The attack measured, for a check against FORGED: one quick figure of an honest ~1x reaches
    1.3 by noise alone now and then when the machine is loaded (the suite measures two candidates
    at once), so such a figure is measured again and the lower one stands, as the harness does for
    a very high speedup. A forgery that worked would reach its claim both times."""
    m = attack(name)
    if m.status == "ok" and m.speedup >= FORGED:
        again = attack(name)
        m = again if again.status != "ok" or again.speedup < m.speedup else m
    return m


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
    """Run an attack file through measure(); check that it left nothing behind. `kind` fills in an
    attack's KIND constant (malformed_reply.py)."""
    before = _project_digest()

    def run(name, kind=None, task=TASK, **kw):
        kw = {"device": "cpu", "quick": True, "use_cache": False, "cache_dir": tmp_path, **kw}
        source = (ATTACKS / f"{name}.py").read_text()
        if kind:
            source = source.replace('KIND = "missing_field"', f"KIND = {kind!r}")
        m = measure.measure(task, source, **kw)
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


@pytest.fixture
def no_cgroup(monkeypatch):
    """The sandbox of a machine where this process may not create cgroups: process clocks, and no
    new processes, memfds or SysV shared memory on CPU (measure_sandbox.py)."""
    worker_set.release_workers()  # workers booted under the cgroup plan
    monkeypatch.setenv("GPU_FORECASTERS_NO_CGROUP", "1")
    monkeypatch.setattr(measure_sandbox, "_PLAN", None)
    assert "no cgroup" in measure_sandbox.require_sandbox().describe()
    yield
    worker_set.release_workers()
    monkeypatch.setattr(measure_sandbox, "_PLAN", None)


def has_cgroup():
    return bool(measure_sandbox.require_sandbox().cgroups)


# ---- class 1: work the clock never sees --------------------------------------------------------

@pytest.mark.attacks
def test_work_in_a_helper_process_reaped_behind_the_clock_is_counted(attack):
    """With a cgroup, the helper's CPU time is in the sandbox's clock, reaped or not."""
    if not has_cgroup():
        pytest.skip("no cgroup on this machine: the no_cgroup test covers it")
    m = at_most_honest(attack, "helper_process_reaped")
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)


@ATTACKS_TIER
def test_without_a_cgroup_a_candidate_may_not_start_processes(attack, no_cgroup):
    m = attack("helper_process_reaped")
    assert m.status == "runtime_error" and "not permitted" in m.message, m.message


@pytest.mark.attacks
def test_work_while_the_reference_runs_is_impossible_the_candidate_is_frozen(attack):
    """A thread means to thrash the caches while the reference is timed. The candidate's sandbox
    is frozen outside its own windows, so the thread runs only inside them, on the candidate's
    clock: no CPU outside its windows at all."""
    m = at_most_honest(attack, "slow_the_reference")
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)
    assert all(c["hidden_ms"] <= FREEZE_TAIL_MS * c["windows"] for c in m.cases), [(c["hidden_ms"], c["windows"]) for c in m.cases]


@pytest.mark.attacks
def test_inputs_appear_only_when_the_candidates_call_starts(attack):
    m = at_most_honest(attack, "early_inputs")
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)


def test_work_deferred_into_the_next_calls_window_is_caught(attack):
    """Each call's outputs are fingerprinted before its window closes: outputs finished in a later
    window were committed unfinished, and the checked call gives them away."""
    m = attack("defer_to_next_call")
    assert m.status in ("rejected", "incorrect"), (m.status, m.message, m.speedup)


# ---- class 2: forged timers, at any size ---------------------------------------------------------

@pytest.mark.parametrize("name", ["timer_noise", *tier("timer_fraction", "timer_a_quarter", "timer_via_gc")])
def test_the_candidates_own_timer_is_never_read(attack, name):
    """The timer runs in the candidate's process, so it is run (the harness's cost stays the same
    on both sides) and thrown away: forged times of any size, noisy or not, move nothing."""
    m = at_most_honest(attack, name)
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)


def test_a_candidates_reply_cannot_carry_times():
    ran = b'"op": "ran", "id": 3, "index": 0, "spec": [], "in_digests": []'
    with pytest.raises(measure_channel.ProtocolError, match="unexpected field 'ms'"):
        measure_channel.parse_reply(b"{" + ran + b', "ms": 0.001}', "ran")
    assert measure_channel.parse_reply(b"{" + ran + b', "ms": 0.5, "bytes_per_call": 9, "peak_bytes": 1}', "ran",
                                       trusted=True)["ms"] == 0.5
    with pytest.raises(measure_channel.ProtocolError):  # nor a timed window's reply (parse_where)
        measure_channel.parse_where(b"7f:1 500")


# ---- class 3: input integrity --------------------------------------------------------------------

def test_inputs_are_the_trusted_sides_and_read_only(attack):
    """Every way of making the mapped inputs writable is refused (mprotect, /proc/self/mem, reopening
    the file), and the write in place faults."""
    m = attack("write_into_inputs")
    assert m.status == "crashed" and "read-only input tensor" in m.message, (m.status, m.message)


# ---- class 4: a reply that stops the parent -------------------------------------------------------

MALFORMED = [  # (the command's op, the reply)
    ("ran", b'{"op": "ran"}'), ("ran", b'{"op": "ran", "id": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
    ("ran", b'{"op": "ran", "id": ' + b"9" * 400 + b"}"), ("ran", b'{"op": "ran", "id": "seven"}'),
    ("ran", b'{"op": "ran", "id": NaN}'), ("ran", b'{"op": "ran", "id": 1e400}'), ("ran", b'{"op": "ran", "id": -5}'),
    ("ran", b'{"op": "ran", "id": 2.5}'), ("ran", b'{"op": "ran", "id": true}'), ("ran", b"[1, 2, 3]"),
    ("ran", b'"ran"'), ("ran", b""), ("ran", b"\xff\xfe{"), ("ran", b'{"op": "ran", "id": 3, "verdict": "ok"}'),
    ("ran", b'{"op": "checked", "id": 3, "ok": true}'), ("loaded", b'{"op": "loaded", "import_s": -1}'),
    ("ran", b'{"op": "ran", "id": 3, "index": 0, "spec": {"type": "x"}, "in_digests": []}'),
    ("ran", b'{"op": "ran", "id": 3, "index": 0, "spec": [{"type": "Tensor", "plain": "yes"}], "in_digests": []}'),
    ("ran", b'{"op": "ran", "id": 3, "index": 0, "spec": [], "in_digests": [' + b'"a",' * 5000 + b'"a"]}'),
    ("ran", b'{"op": "ran", "id": 3, "index": 0, "spec": [], "in_digests": [], "ms": 0.001}'),  # a time, from a candidate
    ("called", b'{"op": "called", "specs": [], "where": "0:1", "bytes_per_call": 1}'),
    ("bytes", b'{"op": "bytes", "id": 3, "n": 99999999999999999999}'),
    ("ran", b'{"op": "error", "error": 7, "message": "x"}'),
]


@pytest.mark.parametrize("op,line", MALFORMED, ids=range(len(MALFORMED)))
def test_the_typed_parser_turns_every_malformed_reply_into_one_line(op, line):
    with pytest.raises(measure_channel.ProtocolError) as e:
        measure_channel.parse_reply(line, op)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


TIMED_MALFORMED = [b"", b"zz:1", b"7f:1,", b"7f:1 12", b"7f:123", b"7f:1;rm -rf", b"-7f:1", b"7f:1\x1b[31m",
                   b"1" * 17 + b":1", b",".join([b"7f:1"] * 65), b"7f:1 " + b"9" * 16, b"7F:1"]


@pytest.mark.parametrize("line", TIMED_MALFORMED, ids=range(len(TIMED_MALFORMED)))
def test_a_timed_windows_reply_is_where_its_outputs_are_and_nothing_else(line):
    """A timed window's reply is where the outputs are, nothing else: a time, or anything but
    hexadecimal addresses and small dtype codes, is a one-line error."""
    with pytest.raises(measure_channel.ProtocolError) as e:
        measure_channel.parse_where(line)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400
    assert measure_channel.parse_where(b"7f:1,a0:3") == [(0x7f, 1), (0xa0, 3)]


@pytest.mark.attacks
@pytest.mark.parametrize("kind", ["deep", *tier("string_for_number")])  # every kind through the parser above
def test_a_malformed_reply_is_rejected_never_an_exception(attack, kind):
    m = attack("malformed_reply", kind=kind)
    assert m.status in ("rejected", "crashed"), (m.status, m.message)
    assert "\n" not in m.message


# ---- class 5: the sandbox sees the host ---------------------------------------------------------

@pytest.fixture
def host_secrets():
    """Things of the host a candidate must not reach: a file in the project and one in the home
    folder, a listening unix socket on a path the sandbox binds (the interpreter's prefix), and a
    key in this process's session keyring."""
    import ctypes
    import socket
    planted = [ROOT / "hush-secret-project.txt", Path.home() / "hush-secret-home.txt"]
    for p in planted:
        p.write_text("hush")
    sock_path = Path(sys.prefix) / f"hush-sock-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    server.listen(1)
    key = ctypes.CDLL(None).syscall(248, b"user", b"hush-key", b"hush", 4, -3)  # add_key(@s)
    yield
    server.close()
    for p in planted + [sock_path]:
        p.unlink(missing_ok=True)
    if key > 0:
        ctypes.CDLL(None).syscall(250, 21, key)  # keyctl(KEYCTL_INVALIDATE)


def test_the_sandbox_holds_nothing_of_the_host(attack, host_secrets):
    m = attack("read_host")
    assert "LOOT" not in m.message, m.message
    assert m.status == "ok", m.message


# ---- class 6: limits that count the right thing ---------------------------------------------------

@ATTACKS_TIER
def test_memory_in_memfds_counts(attack):
    m = attack("memfd_hog", memory_gb=0.75, timeout_s=60)
    if has_cgroup():
        assert m.status == "crashed" and "out of memory" in m.message, m.message
    else:
        assert m.status == "compile_error" and "not permitted" in m.message, m.message


@ATTACKS_TIER
def test_memory_in_memfds_is_refused_without_a_cgroup(attack, no_cgroup):
    m = attack("memfd_hog", memory_gb=0.75, timeout_s=60)
    assert m.status == "compile_error" and "not permitted" in m.message, m.message


@ATTACKS_TIER
@pytest.mark.slow
def test_memory_in_the_sandboxs_tmpfs_counts(attack):
    m = attack("tmpfs_hog", memory_gb=0.75, timeout_s=60)
    assert m.status == "crashed" and "out of memory" in m.message, m.message


@ATTACKS_TIER
def test_threads_count_as_tasks(attack):
    m = attack("thread_bomb", timeout_s=60)
    assert m.status == "crashed" and "tasks" in m.message, m.message


@ATTACKS_TIER
def test_descriptors_and_file_size_are_bounded(attack):
    m = attack("descriptors_and_files")
    assert "LOOT" not in m.message and m.status == "ok", m.message


# ---- class 7: raw terminal bytes ------------------------------------------------------------------

@ATTACKS_TIER
def test_a_candidates_text_is_escaped_wherever_it_is_shown(attack):
    """The candidate's message reaches the terminal (format_table), the JSON record and the
    mutator's prompt with every control character written as a visible escape."""
    import unicodedata

    from mutators import feedback_text
    m = attack("terminal_escape")
    assert m.status == "compile_error", m.message
    shown = [m.message, measure.format_table(m), json.dumps(m.to_dict(), ensure_ascii=False),
             feedback_text(m.to_dict())]
    for text in shown:
        bad = [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")]
        assert not bad, (bad, text[:200])
    assert "\\x1b]52;" in m.message and "\\u202e" in m.message  # visible, not lost


def test_printable_escapes_and_bounds():
    assert measure_channel.printable("a\x1b[31mb\u202ec\nd\x07") == "a\\x1b[31mb\\u202ec\\x0ad\\x07"
    assert measure_channel.printable("é ü 中文") == "é ü 中文"
    assert len(measure_channel.printable("x" * 10000)) == measure_channel.MAX_TEXT


# ==== the earlier rounds' attacks =====================================================================

# ---- class 1: tampering inside the worker ---------------------------------------------------------

@pytest.mark.attacks
def test_replacing_the_checkers_code_does_not_reach_the_verdict(attack):
    m = attack("code_of_check")
    assert m.status == "incorrect", m.message


@ATTACKS_TIER
def test_work_in_threads_that_exit_still_counts(attack):
    m = at_most_honest(attack, "work_in_exiting_threads")
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)


@pytest.mark.attacks
def test_computing_only_the_handed_over_call_is_caught(attack):
    """On CPU nothing is handed over: the parent reads every call's outputs from the frozen
    process as its window ends, so the placeholders are what is judged."""
    m = attack("defer_to_handover")
    assert m.status == "incorrect" and "outside rtol" in m.message, m.message


@pytest.mark.parametrize("name", ["setprofile_sleep", *tier("torch_library_override")])
def test_slowing_the_reference_from_the_candidates_process_does_nothing(attack, name):
    m = attack(name)
    assert m.status == "ok", m.message
    assert m.speedup < HONEST, m.cases


@pytest.mark.parametrize("name", ["function_mode_isclose", *tier("frame_expected")])
def test_faking_the_comparison_or_stealing_the_expected_output_is_incorrect(attack, name):
    m = attack(name)
    assert m.status == "incorrect", m.message


@ATTACKS_TIER
def test_filling_outputs_from_a_thread_after_return_is_caught(attack):
    m = attack("thread_after_return")
    # Unfilled at commit time: incorrect; filled later than the commitment: a forged handover.
    # Filled within the parent's clock: its time is counted. Never a free speedup.
    assert m.status in ("incorrect", "rejected") or m.speedup < HONEST, (m.status, m.message, m.speedup)


# ---- class 2: timed calls never checked, few and predictable inputs --------------------------------

@ATTACKS_TIER
def test_garbage_once_timing_starts_is_incorrect(attack):
    m = attack("garbage_unless_checked")
    assert m.status == "incorrect", m.message


@ATTACKS_TIER
def test_a_content_keyed_cache_never_hits(attack):
    m = attack("content_cache")
    assert m.status == "ok" and m.speedup < HONEST, (m.status, m.message, m.speedup)


@ATTACKS_TIER
def test_answers_precomputed_at_import_are_useless(attack):
    m = attack("precompute_at_import")
    assert m.status == "incorrect", m.message


# ---- class 3: the result channel -------------------------------------------------------------------

def test_a_pickle_on_the_channel_never_runs_in_the_parent(attack):
    m = attack("pickle_channel")
    assert m.status in ("rejected", "crashed", "incorrect"), m.message
    assert not Path("/tmp/pwned-pickle").exists()


@pytest.mark.attacks
def test_forged_replies_are_not_believed(attack):
    m = attack("forged_reply")
    assert m.status in ("rejected", "crashed"), m.message


@ATTACKS_TIER
def test_half_a_reply_then_silence_times_out(attack):
    t0 = time.monotonic()
    m = attack("silent_header", timeout_s=2)
    # the half line either stays half (the parent's timeout) or the worker's own error reply, sent
    # when the candidate overstays, completes it into a line that breaks the protocol
    assert m.status in ("timeout", "rejected"), m.message
    assert time.monotonic() - t0 < 30


# ---- class 4: escapes --------------------------------------------------------------------------------

def test_the_cache_is_written_by_the_parent_alone(attack, tmp_path):
    m = attack("write_cache", use_cache=True)
    assert m.status == "ok" and m.speedup < HONEST, m.message
    entries = list(tmp_path.glob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["speedup"] == m.speedup


@ATTACKS_TIER
def test_planted_byte_code_and_sitecustomize_do_not_land(attack):
    m = attack("plant_pyc")
    assert m.status == "ok", m.message
    assert not Path("/tmp/pwned-sitecustomize").exists()
    assert not list((ROOT / "tasks" / "__pycache__").glob("_check*")) if (ROOT / "tasks" / "__pycache__").exists() else True


@pytest.mark.attacks
@pytest.mark.parametrize("name", ["daemon", *tier("sigterm_grandchild")])
def test_daemons_and_grandchildren_die_with_the_sandbox(attack, name):
    m = attack(name)  # the fixture asserts that no pwned-* process is left
    assert m.status == "ok" or not has_cgroup(), m.message


@ATTACKS_TIER
def test_memory_held_in_a_child_process_counts(attack):
    m = attack("memory_in_child", memory_gb=0.75, timeout_s=60)
    if has_cgroup():
        assert m.status == "crashed" and "memory" in m.message, m.message
    else:  # no child process may start
        assert m.status == "compile_error" and "not permitted" in m.message, m.message


@pytest.mark.attacks
def test_a_fork_bomb_is_stopped(attack):
    m = attack("fork_bomb", timeout_s=60)
    if has_cgroup():
        assert m.status == "crashed" and "processes" in m.message, m.message
    else:
        assert m.status == "runtime_error" and "not permitted" in m.message, m.message


@ATTACKS_TIER
def test_the_worker_dies_with_a_parent_killed_by_sigkill(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import measure; "
            f"measure.measure({TASK!r}, open({str(ATTACKS / 'hang.py')!r}).read(), device='cpu', use_cache=False, timeout_s=120)")
    log = tmp_path / "parent.log"
    with open(log, "wb") as out:
        parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not _pwned_processes() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        assert _pwned_processes(), f"the hanging candidate never started (parent: {parent.poll()}): {log.read_text()[-2000:]}"
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

@ATTACKS_TIER
def test_a_non_contiguous_output_is_incorrect(attack):
    m = attack("noncontiguous")
    assert m.status == "incorrect" and "non-contiguous" in m.message, m.message


# ---- round 3: nothing the candidate's process does moves its verdict ---------------------------

def test_a_leaner_timed_window_is_no_faster_than_the_honest_one(attack):
    """The candidate's timed window holds the command, the call and the reply: swapping the
    worker's window for the leanest code that gives the same reply leaves nothing to gain."""
    m = at_most_honest(attack, "lean_window")
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)


@pytest.mark.attacks
def test_housekeeping_between_windows_cannot_run_there(attack):
    """The sandbox is frozen outside the candidate's windows: a helper thread's housekeeping runs
    inside them, on the candidate's clock, and no CPU is used outside them at all."""
    m = at_most_honest(attack, "idle_housekeeping")
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)
    # What the clock reads as the sandbox freezes is all there is (FREEZE_TAIL_MS), where the
    # thread's housekeeping outside the windows would have been milliseconds.
    assert all(c["hidden_ms"] <= FREEZE_TAIL_MS * c["windows"] for c in m.cases), [(c["hidden_ms"], c["windows"]) for c in m.cases]


@pytest.mark.attacks
def test_padded_correctness_calls_size_nothing(attack, monkeypatch):
    """Blocks are sized from the timed windows alone, and the warm-up is by time: a candidate
    that pads exactly its correctness calls still gets full blocks of one-call windows."""
    # Blocks of 100 ms instead of 6: sized from the 160 ms correctness calls every block would be
    # one pair, sized from the timed windows even a loaded 2-core machine's calls (CI's took 6 and
    # 34 ms) give several, so the check below tells the two apart on any machine.
    monkeypatch.setattr(cpu_windows, "BLOCK_MS", 100.0)
    m = at_most_honest(attack, "pad_correctness")
    assert m.status == "ok" and m.speedup < FORGED, (m.status, m.message, m.speedup)
    fast = [c for c in m.cases if max(c["reference_ms"], c["candidate_ms"]) < cpu_windows.BLOCK_MS / 2]
    assert fast and all(c["block_pairs"] > 1 for c in fast), [(c["reference_ms"], c["block_pairs"]) for c in m.cases]


def test_no_call_sees_another_calls_inputs_before_its_own_window(attack):
    """A call's inputs reach the arena only while both sides are frozen, after the last call's
    outputs were read: whatever a call finds of other calls' inputs is of calls already done."""
    m = attack("batch_calls")
    assert m.status == "ok", m.message


def test_an_output_hiding_most_of_its_error_under_atol_is_incorrect(attack):
    m = attack("zero_below_atol")
    assert m.status == "incorrect" and "mean absolute error" in m.message, m.message


@pytest.mark.attacks
def test_an_output_of_another_dtype_than_the_tasks_is_incorrect(attack):
    m = attack("fp8_half_output", task="fp8_quant")
    assert m.status == "incorrect" and "dtype float16, expected float32" in m.message, m.message


@pytest.mark.attacks
def test_host_wide_quotas_other_sockets_and_host_proc_views_are_out_of_reach(attack):
    m = attack("host_quotas")
    assert m.status == "ok", m.message


@pytest.mark.attacks
def test_sibling_processes_are_out_of_reach(attack):
    m = attack("reach_siblings")
    assert m.status == "ok", m.message


@pytest.mark.attacks
def test_the_import_time_is_the_parents_clock(attack):
    m = attack("forged_load_reply")
    assert m.status == "rejected" and "unexpected field" in m.message, m.message


@pytest.mark.parametrize("name", ["poison_expected", *tier("reuse_freed_result")])
def test_attacks_of_the_public_suites_that_need_the_checkers_state_fail(attack, name):
    """The checker's state is in another process: poisoning what the candidate can reach writes
    into its read-only inputs (crashed) or nothing that matters (incorrect)."""
    m = attack(name)
    assert m.status in ("incorrect", "crashed"), m.message


@ATTACKS_TIER
def test_a_parent_whose_worker_parks_and_fills_its_command_pipe_times_out(attack):
    m = attack("fill_own_stdin", timeout_s=6)
    assert m.status == "timeout" and m.wall_s < 30, (m.status, m.message, m.wall_s)


def test_a_send_into_a_pipe_nobody_reads_ends_at_its_deadline():
    """The parent's writes to a worker are non-blocking with a deadline: a worker that stops
    reading costs the parent its deadline, never more."""
    w = measure_channel.WorkerProcess("candidate", TASK, "cpu", plan=None, memory_bytes=1 << 30)
    try:
        w.recv(time.monotonic() + 120, "ready")
        w.freeze(time.monotonic() + 10)  # reads nothing from now on
        start = time.monotonic()
        with pytest.raises(measure_channel.WorkerFailed) as e:
            w.send_raw(b"x" * (1 << 20), time.monotonic() + 1.0)
        assert e.value.status == "timeout" and time.monotonic() - start < 5
    finally:
        w.kill()


def test_a_worker_whose_isolation_fails_stops_before_any_candidate_code(monkeypatch, tmp_path):
    """Its second filter cannot be loaded (simulated: a program the kernel refuses): the worker
    stops before it reads a command, and the measurement is the harness's failure, not a verdict
    on the candidate, which never ran."""
    worker_set.release_workers()
    monkeypatch.setattr(measure_channel, "after_join_filter", lambda: bytes(8))
    try:
        with pytest.raises(HarnessError, match="loading the second seccomp filter failed"):
            measure.measure(TASK, (ATTACKS / "lean_window.py").read_text(), device="cpu", quick=True,
                            use_cache=False, cache_dir=tmp_path)
    finally:
        worker_set.release_workers()


NORMAL_USER = 1234  # any uid but root's and the sandbox's


def _as_a_normal_user():
    """(argv prefix, env) to run this project's Python as a normal user, or None where that cannot
    be done here (not root, no setpriv, or no interpreter that user may run)."""
    import shutil
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    site = [p for p in sys.path if p.endswith("site-packages")]
    check = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from harness import measure_sandbox as s; s.require_sandbox()"
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(["setpriv", f"--reuid={NORMAL_USER}", f"--regid={NORMAL_USER}", "--clear-groups",
                                python, "-c", check], capture_output=True,
                               env={**os.environ, "PYTHONPATH": ":".join(site), "HOME": "/tmp"})
        if probe.returncode == 0:
            return ["setpriv", f"--reuid={NORMAL_USER}", f"--regid={NORMAL_USER}", "--clear-groups", python], \
                {"PYTHONPATH": ":".join(site)}
    return None


@pytest.mark.e2e
def test_as_a_normal_user_a_worker_that_fills_its_own_command_pipe_never_blocks_the_parent(tmp_path):
    """Run by a normal user, the sandbox's uid is that user outside, who owns the worker's
    command pipe: the candidate can reopen it and fill it. The parent's write has a deadline."""
    how = _as_a_normal_user()
    if how is None:
        pytest.skip("cannot run this project's Python as a normal user here (root with setpriv, and an "
                    "interpreter outside a private home, are needed)")
    prefix, env = how
    os.chmod(tmp_path, 0o777)
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import measure, json\n"
            f"m = measure.measure({TASK!r}, open({str(ATTACKS / 'fill_own_stdin.py')!r}).read(), device='cpu', "
            f"quick=True, use_cache=False, cache_dir={str(tmp_path)!r}, timeout_s=15)\n"
            "print(json.dumps([m.status, m.wall_s, m.sandbox]))")
    r = subprocess.run(prefix + ["-c", code], capture_output=True, text=True, timeout=180,
                       env={**os.environ, **env, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    status, wall_s, sandbox = json.loads(r.stdout.strip().splitlines()[-1])
    assert "your uid outside" in sandbox and status == "timeout" and wall_s < 60, (status, wall_s, sandbox)


def test_every_cpu_millisecond_of_the_candidates_sandbox_is_in_a_window_or_charged(attack, monkeypatch):
    """The accounting, checked against the kernel's own: over each case's timing, the candidate's
    sandbox's CPU time (its cgroup, or its processes' clocks) equals the sum of its windows and of
    its time outside them, which is charged to it beyond the twin's (case_times). Here the
    candidate keeps a thread busy the whole time: it runs only inside its windows."""
    seen = []
    time_case, window = measure.time_case, cpu_windows.CpuWindows.window

    def spy_time_case(sides, case, *args):
        sides.windows_seen, start, outside = [], sides.cand.cpu_ms(), sides.outside_ms["cand"]
        row = time_case(sides, case, *args)
        seen.append((sides.cand.cpu_ms() - start, sum(sides.windows_seen), sides.outside_ms["cand"] - outside))
        return row

    def spy_window(self, side, case_index, slot):
        where, ms, window_ms = window(self, side, case_index, slot)
        if side == "cand" and hasattr(self, "windows_seen"):
            self.windows_seen.append(window_ms)
        return where, ms, window_ms
    monkeypatch.setattr(measure, "time_case", spy_time_case)
    monkeypatch.setattr(cpu_windows.CpuWindows, "window", spy_window)
    m = attack("idle_housekeeping")
    assert m.status == "ok", m.message
    # A task's last microseconds before it stops are accounted after the freezer has reported
    # it frozen (FREEZE_TAIL_MS; CI saw 4 us): the next window's start charges them as time
    # outside, but the tails of a case's last window and of the one before it fall beyond the spy
    for total, windows, outside in seen:
        assert total == pytest.approx(windows + outside, abs=2 * FREEZE_TAIL_MS), (total, windows, outside)
        assert outside < 0.05 * total, (total, windows, outside)


@pytest.mark.e2e
def test_a_measurement_whose_workers_another_thread_closes_is_the_harnesss_not_a_verdict(tmp_path, monkeypatch):
    """A Ctrl-C ends a run's workers from the main thread while a measuring thread is inside a
    measurement: that measurement raises HarnessError (never a verdict that a search would log),
    and nothing raises anywhere else."""
    import threading
    got, timing, closed = [], threading.Event(), threading.Event()
    time_case = measure.time_case

    def signalling(sides, case, *args):  # the workers are closed while the first case is being timed
        timing.set()
        closed.wait(60)  # (however loaded the machine, the close comes first)
        return time_case(sides, case, *args)
    monkeypatch.setattr(measure, "time_case", signalling)

    def measuring():
        try:
            got.append(measure.measure(TASK, (ATTACKS / "lean_window.py").read_text(), device="cpu",
                                       use_cache=False, cache_dir=tmp_path))
        except BaseException as e:  # noqa: BLE001 - what the thread ended with is the test's subject
            got.append(e)
        finally:
            worker_set.release_workers()
    t = threading.Thread(target=measuring)
    t.start()
    assert timing.wait(120)
    with worker_set._ALL_LOCK:
        sets = list(worker_set._ALL_SETS)
    for each in sets:
        each.close()
    closed.set()
    t.join(120)
    assert not t.is_alive() and len(got) == 1
    assert isinstance(got[0], HarnessError) and "interrupted" in str(got[0]), got[0]


def test_a_worker_ended_from_several_threads_at_once_ends_once():
    """A Ctrl-C's exit closes the set while the measuring thread's clean-up kills the same worker
    (a CI run of the Ctrl-C tier saw the second close of /proc/<pid>/mem fail with EBADF, a
    traceback at exit; a second close could as well close a descriptor another thread had just
    opened). Every caller returns, the first ends it, and its memory is no longer read."""
    import threading
    w = measure_channel.WorkerProcess("candidate", TASK, "cpu", plan=None, memory_bytes=1 << 30)
    w.recv(time.monotonic() + 120, "ready")
    assert w.read_memory(0, 0) == b""  # opens /proc/<pid>/mem, as a measurement's first read does
    start, errors = threading.Barrier(8), []

    def end():
        start.wait()
        try:
            w.kill()
        except BaseException as e:  # noqa: BLE001 - any is the test's failure
            errors.append(e)
    threads = [threading.Thread(target=end) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and w.mem is None and not w.alive(), errors
    with pytest.raises(measure_channel.WorkerFailed, match="ended"):
        w.read_memory(0, 8)


# ---- round 4 (harness 5.0): nothing a candidate leaves behind moves the verdict, or the host -------

def test_timers_armed_to_fire_in_the_twins_windows_are_refused(attack):
    """Class 5: work the kernel would do for the candidate while it is frozen and the twin is timed
    (a timer's expiry, amplified by hundreds of epoll instances watching it; a POSIX and an
    interval timer; sleepers whose timeouts would land there): every arming call is refused, and
    the sleepers' waits end with the freeze. It measures as the honest reference does (it pays
    for its hundred threads in its own windows), or, were anything left to run in the twin's
    windows, the disturbance check rejects it."""
    m = at_most_honest(attack, "interrupt_timers")
    assert (m.status == "ok" and m.speedup < FORGED) or (m.status == "rejected" and "right after the candidate" in m.message), \
        (m.status, m.message, m.speedup)


PROBE = '''
import ctypes, errno, fcntl, os, signal, socket, json
libc = ctypes.CDLL(None, use_errno=True)
def refused(number, *args):
    return libc.syscall(number, *args) < 0 and ctypes.get_errno() in (errno.EPERM, errno.ENOSYS)
timer_id, ctx = ctypes.c_long(0), ctypes.c_ulong(0)
got = {"timerfd_create": refused(283, 1, 0), "timer_create": refused(222, 1, None, ctypes.byref(timer_id)),
       "setitimer": refused(38, 0, None, None), "alarm": refused(37, 1), "io_setup": refused(206, 8, ctypes.byref(ctx))}
try:
    socket.socketpair()
    got["socketpair"] = False
except OSError:
    got["socketpair"] = True
r, w = os.pipe()
try:
    fcntl.fcntl(w, 1031, 1 << 20)
    got["F_SETPIPE_SZ"] = False
except OSError:
    got["F_SETPIPE_SZ"] = True
try:
    os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    got["/dev/ptmx"] = False
except OSError:
    got["/dev/ptmx"] = True
print(json.dumps(got))
'''


def _sandboxed(script, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(script)
    plan = measure_sandbox.require_sandbox()
    box = measure_sandbox.Sandbox.start([sys.executable, "-S", str(path)], "cpu", plan, memory_bytes=2 << 30,
                                        binds_ro=[str(path)])
    return box, plan


def test_the_sandbox_refuses_what_would_run_on_its_behalf_later_or_fill_a_shared_count(tmp_path):
    """Classes 5 and 6 as properties of every sandbox: no timer (timerfd, POSIX timer, interval
    timer, alarm) and no asynchronous I/O, whose completions run later and whose contexts are a
    machine-wide count; no unix socket pair (descriptors in flight are a per-user count); no pipe
    grown past its default (pipe buffers are a per-user count); no pseudo-terminal (a machine-wide
    count for every devpts but the host's)."""
    box, _ = _sandboxed(PROBE, tmp_path)
    try:
        out, err = box.popen.communicate(timeout=60)
    finally:
        box.close()
    got = json.loads(out.decode().strip().splitlines()[-1])
    assert all(got.values()), {k: v for k, v in got.items() if not v}


def test_a_sandbox_holding_all_it_can_leaves_the_hosts_counts_alone(tmp_path):
    """Class 6: a sandbox takes all it may of every count the kernel keeps per host user or for the
    whole machine (tests/attacks/fill_host_counts.py) and holds it; meanwhile this process (the
    user who made the sandbox) can still queue real-time signals, set up asynchronous I/O, open a
    pseudo-terminal and make a pipe of the default size. Each sandbox's pending signals stop at its
    own limit; as root it runs as a host uid of its own, so that what is counted per user is its
    own (epoll watches, pipe buffers)."""
    import ctypes
    import fcntl
    script = (ATTACKS / "fill_host_counts.py").read_text()
    box, plan = _sandboxed(script, tmp_path)
    try:
        got = json.loads(box.popen.stdout.readline())
        # the host uids of bwrap's processes and the probe's (the last of them)
        tree, todo = [], [box.popen.pid]
        while todo:
            tree.append(todo.pop())
            todo += [int(c) for t in Path(f"/proc/{tree[-1]}/task").glob("*/children") for c in t.read_text().split()]
        uids = {int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0]) for pid in tree}
        assert got["pending signals"] <= measure_sandbox.MAX_PENDING_SIGNALS
        assert got["pipes grown to 1 MB"] == got["unix socket pair"] == got["aio contexts"] == got["pseudo-terminals"] == 0, got
        if plan.drop_uid:  # root: a host uid of its own, in the range no user has
            uid = max(uids)
            assert measure_sandbox.HOST_UID_BASE <= uid < measure_sandbox.HOST_UID_BASE + measure_sandbox.HOST_UID_SPAN, uids
        # meanwhile, out here
        import threading
        libc = ctypes.CDLL(None, use_errno=True)
        sig = signal.SIGRTMIN + 2
        old = signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
        try:  # queued to this thread alone (rt_tgsigqueueinfo), which blocks it: the test's other threads never see one
            info = (ctypes.c_int * 32)(sig, 0, -1)
            tid = threading.get_native_id()
            assert sum(libc.syscall(297, os.getpid(), tid, sig, info) == 0 for _ in range(100)) == 100
        finally:
            signal.signal(sig, signal.SIG_IGN)  # the queued ones are dropped
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        ctx = ctypes.c_ulong(0)
        assert libc.syscall(206, 128, ctypes.byref(ctx)) == 0 and libc.syscall(207, ctx) == 0  # io_setup, io_destroy
        a, b = os.openpty()
        r, w = os.pipe()
        assert fcntl.fcntl(w, 1032) == 65536  # F_GETPIPE_SZ
        for fd in (a, b, r, w):
            os.close(fd)
    finally:
        box.close()


@pytest.mark.attacks
def test_a_candidate_cannot_speak_for_the_harness(attack):
    """Class 7: a wrong kernel writes the worker's own out-of-memory-in-the-harness line and exits.
    The parent takes a candidate worker's error as the kernel's runtime error, in its worker's
    words, and caches it: the next time it is proposed it is not measured again."""
    m = attack("harness_words", use_cache=True)
    assert m.status == "runtime_error" and m.message.startswith("the candidate's worker reported: "), (m.status, m.message)
    again = attack("harness_words", use_cache=True)
    assert again.cached and again.status == "runtime_error"


def test_a_kernel_computing_below_its_contracts_precision_is_incorrect(attack):
    """Class A3: cross_entropy's log-sum-exp and softmax in bf16, within tolerance on plain logits:
    the shifted check cases, on several seeds each, catch it every time."""
    m = attack("bf16_softmax")
    assert m.status == "incorrect" and "shift" in m.message, (m.status, m.message)


@pytest.mark.attacks
def test_no_candidates_build_reaches_another_candidates_measurement(attack, tmp_path):
    """Property 16: a candidate's builds (C++ extensions, inductor's and Triton's caches, the
    precompiled header) land in its sandbox's private /tmp, gone with it; the next candidate,
    measured by the same thread and worker set, finds none of what the first one planted."""
    planted = attack("poison_build_cache")
    assert planted.status == "ok", planted.message
    looked = attack("poison_build_cache_look")
    assert looked.status == "ok", looked.message
    # the look can fail: where a plant is in its view (one shared HOME), it raises
    home = tmp_path / "shared-home"
    victim = home / ".cache" / "torch_extensions" / "py311_cpu" / "victim_op" / "victim_op.so"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"planted")
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ATTACKS / "poison_build_cache_look.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "planted by another candidate is here" in out.stderr, out.stderr[-400:]
