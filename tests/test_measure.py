"""measure.py against ordinary failures and the classic timing and correctness tricks (one test
each that can be staged on CPU), the sandbox's start-up check, the command line and the cache.
Attacks on the harness itself are in test_measure_attacks.py.

Every candidate below is a real module source run through the real sandboxed worker.
"""
import json
import subprocess
import sys

import pytest

import measure
from tasks import seed_source, variant_paths

ROOT = measure.Path(__file__).resolve().parent.parent
TASK = "cross_entropy"

# A correct pure-PyTorch candidate the tricks below are built from.
BODY = '''
import torch

def _ce(logits, targets, grad_output):
    x = logits.float()
    losses = torch.logsumexp(x, dim=-1) - x.gather(1, targets[:, None]).squeeze(1)
    p = torch.softmax(x, dim=-1)
    p[torch.arange(len(targets)), targets] -= 1.0
    return losses, (p * grad_output[:, None]).to(torch.bfloat16)
'''


def run(source, **kw):
    kw.setdefault("use_cache", False)
    kw.setdefault("quick", True)
    kw.setdefault("device", "cpu")
    return measure.measure(TASK, source, **kw)


def test_correct_candidate_is_ok_with_times_and_speedup(tmp_path):
    m = run(BODY + "def custom_kernel(data):\n    return _ce(*data)\n")
    assert m.status == "ok", m.message
    assert m.speedup > 0 and len(m.cases) >= 1
    row = m.cases[0]
    assert row["reference_ms"] > 0 and row["candidate_ms"] > 0 and row["reps"] >= 2
    assert abs(row["speedup"] - row["reference_ms"] / row["candidate_ms"]) < 1e-9
    assert m.timer.startswith("parent clock") and "not GPU" in m.timer and m.sandbox.startswith("bubblewrap, seccomp")
    assert m.harness_version == measure.HARNESS_VERSION
    assert m.noise > 0 and isinstance(m.within_noise, bool) and m.candidate_peak_gb >= 0


def test_on_cpu_the_reference_side_of_every_window_is_its_timing_twin(monkeypatch):
    """The reference's timed calls run in its twin: a worker started with the candidate, in its
    role (the same command line, sandbox and hash seed), that loaded the task's reference as a
    candidate's source (tasks.reference_candidate), and that gets the candidate's sequence of
    commands (the same arenas, the same checked and timed windows, on the same slots). The
    reference worker makes the inputs and judges the calls whose outputs differ from the twin's,
    and times nothing; the candidate hands nothing over (the parent reads its outputs)."""
    from harness import measure_channel
    from tasks import reference_candidate
    sent, send_raw, seeds = [], measure_channel.WorkerProcess.send_raw, {}

    def spy(self, data, deadline=None):
        obj = json.loads(data) if data[:1] == b"{" else {"op": "go", "line": data}
        sent.append((self, obj))
        if obj["op"] == "load":  # the hash seed the process really started with
            environ = open(f"/proc/{self.tree()[-1]}/environ", "rb").read().split(b"\0")
            seeds[self.trusted] = [e for e in environ if e.startswith(b"PYTHONHASHSEED=")]
        return send_raw(self, data, deadline)
    monkeypatch.setattr(measure_channel.WorkerProcess, "send_raw", spy)
    m = run(BODY + "def custom_kernel(data):\n    return _ce(*data)\n")
    assert m.status == "ok", m.message
    ops = {who: [obj for w, obj in sent if (w.role, w.trusted) == who]
           for who in [("reference", True), ("candidate", True), ("candidate", False)]}
    reference, twin, candidate = ops.values()
    assert {c["op"] for c in reference} <= {"prepare", "compare"} and any(c["op"] == "prepare" for c in reference)
    assert not any(c["op"] == "handover" for c in candidate)
    loads = [c for c in twin if c["op"] == "load"]
    assert loads == [{"op": "load", "source": reference_candidate(TASK), "twin": True}]  # never a candidate's code
    # Born as a pair: one hash seed; the same commands but the load, in the same order
    assert len(seeds[True]) == 1 and seeds[True] == seeds[False]
    assert [c for c in twin if c["op"] != "load"] == [c for c in candidate if c["op"] != "load"]
    assert sum(c["op"] == "go" for c in candidate) > 10 and sum(c["op"] == "call" for c in candidate) > 0


def test_seed_is_ok_and_the_cache_is_hit_the_second_time(tmp_path):
    first = run(seed_source(TASK), use_cache=True, cache_dir=tmp_path)
    assert first.status == "ok" and not first.cached
    second = run(seed_source(TASK), use_cache=True, cache_dir=tmp_path)
    assert second.cached and second.speedup == first.speedup
    assert len(list(tmp_path.glob("*.json"))) == 1


# ---- caching the output ---------------------------------------------------------------------------

@pytest.mark.attacks  # the rest of the catalogue: tests/test_measure_attacks.py
def test_output_computed_once_and_replayed_is_incorrect():
    src = BODY + '''
_saved = {}
def custom_kernel(data):
    key = tuple(data[0].shape)
    if key not in _saved:
        _saved[key] = _ce(*data)
    return _saved[key]
'''
    m = run(src)
    assert m.status == "incorrect", m.message


@pytest.mark.attacks
def test_cache_keyed_by_pointer_is_caught_on_unseen_inputs():
    src = BODY + '''
_saved = {}
def custom_kernel(data):
    key = data[0].data_ptr()
    if key not in _saved:
        _saved[key] = _ce(*data)
    return _saved[key]
'''
    m = run(src)
    assert m.status in ("incorrect", "ok")
    # Fresh pointers mostly miss the cache; whenever a pointer is reused the stale output fails.
    # The property that matters: a pointer-keyed cache never passes with a wrong output.
    if m.status == "ok":
        assert m.speedup < 2


# ---- writing into the inputs, unwritten outputs ---------------------------------------------------

@pytest.mark.attacks
def test_writing_into_inputs_is_stopped():
    """On CPU the inputs are the trusted side's, mapped read-only: the first write faults, and the
    verdict says what that means (on a GPU the reference checks the inputs' fingerprint instead)."""
    src = BODY + '''
def custom_kernel(data):
    logits, targets, grad_output = data
    out = _ce(logits, targets, grad_output)
    logits.mul_(0.5)   # scribble on the input after use
    return out
'''
    m = run(src)
    assert m.status == "crashed" and "read-only input tensor" in m.message, m.message


@pytest.mark.attacks
def test_partially_written_output_is_incorrect():
    src = BODY + '''
def custom_kernel(data):
    logits, targets, grad_output = data
    losses, grad = _ce(logits, targets, grad_output)
    out = torch.empty_like(grad)          # never fully written: the rest holds whatever was there
    half = grad.shape[0] // 2
    out[:half] = grad[:half]
    return losses, out
'''
    m = run(src)
    assert m.status == "incorrect" and "grad_logits" in m.message, m.message


# ---- lazy or downgraded outputs ---------------------------------------------------------------------

@pytest.mark.attacks
def test_a_wrong_answer_in_a_timed_block_is_caught_while_the_next_is_timed(monkeypatch):
    """On CPU the reference worker judges a block's calls while the next block is timed, and
    makes that block's inputs meanwhile (harness.cpu_windows.CpuWindows.ref_later). A kernel that turns
    wrong once its correctness calls are behind it is still caught; so is one that dies there,
    and either way no reply of the reference worker is left unread for the next measurement (it
    is kept) and no input file is left behind."""
    import os

    from harness import worker_set
    from harness.cpu_windows import CpuWindows
    from tasks import cross_entropy
    honest = (len(cross_entropy.CPU_CASES) * measure.TRIALS
              + len(cross_entropy.CPU_CHECK_CASES) * measure.CHECK_TRIALS)  # the correctness calls
    turns = BODY + f"""
_calls = [0]
def custom_kernel(data):
    _calls[0] += 1
    losses, grad = _ce(*data)
    if _calls[0] > {honest}:
        {{}}
    return losses, grad
"""
    wrong = turns.format("grad = grad * 0")
    dies = turns.format("import os; os._exit(3)")
    waiting = []  # replies awaited as each command to the reference worker was sent
    later = CpuWindows.ref_later
    monkeypatch.setattr(CpuWindows, "ref_later",
                        lambda self, *a, **kw: (waiting.append(len(self.ref_pending)), later(self, *a, **kw))[1])
    for source, status in [(wrong, "incorrect"), (dies, "crashed"), (BODY + "def custom_kernel(data):\n    return _ce(*data)\n", "ok")]:
        m = run(source)
        assert m.status == status, (status, m.message)
        left = {name: os.listdir(path) for name, path in worker_set.workers().dirs.items()}
        assert not any(left.values()), left
    assert max(waiting) >= 1 or len(os.sched_getaffinity(0)) == 1  # it did work beside the timed pair


@pytest.mark.attacks
@pytest.mark.slow
def test_on_one_core_the_reference_worker_works_between_blocks(monkeypatch):
    """With a core of its own the reference worker makes the next block's inputs and checks the
    last one's while a block is timed (test_a_wrong_answer_in_a_timed_block_is_caught_while_the_
    next_is_timed); where the measuring thread has one core, that work would share the timed
    pair's core, so each of its commands is answered before the next block starts."""
    import os
    import threading

    from harness import worker_set
    from harness.cpu_windows import CpuWindows
    waiting = {}  # beside -> the most replies awaited when a command was sent
    later = CpuWindows.ref_later

    def spy(self, cmd, op, then=None, files=()):
        waiting[self.beside] = max(waiting.get(self.beside, 0), len(self.ref_pending))
        return later(self, cmd, op, then, files)
    monkeypatch.setattr(CpuWindows, "ref_later", spy)
    source = BODY + "def custom_kernel(data):\n    return _ce(*data)\n"
    results = []

    def one_core():
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # this thread, and what it starts
        try:
            results.append(run(source))
        finally:
            worker_set.release_workers()
    thread = threading.Thread(target=one_core)
    thread.start()
    thread.join()
    assert results[0].status == "ok", results[0].message
    assert waiting == {False: 0}


@pytest.mark.attacks
def test_tensor_subclass_output_is_incorrect():
    src = BODY + '''
class Lazy(torch.Tensor):
    pass

def custom_kernel(data):
    losses, grad = _ce(*data)
    return losses, grad.as_subclass(Lazy)
'''
    m = run(src)
    assert m.status == "incorrect" and "plain torch.Tensor" in m.message


@pytest.mark.attacks  # the rest of the catalogue: tests/test_measure_attacks.py
def test_wrong_output_dtype_is_incorrect():
    # cross_entropy's original checker asserts its dtypes (trimul's casts: test_gpumode_submissions)
    src = BODY + '''
def custom_kernel(data):
    losses, grad = _ce(*data)
    return losses, grad.float()
'''
    m = run(src)
    assert m.status == "incorrect" and "dtype" in m.message


# ---- near-identity output ---------------------------------------------------------------------------

@pytest.mark.attacks  # the rest of the catalogue: tests/test_measure_attacks.py
def test_output_that_skips_the_softmax_term_is_incorrect():
    src = BODY + '''
def custom_kernel(data):
    logits, targets, grad_output = data
    losses, _ = _ce(logits, targets, grad_output)
    grad = torch.zeros(logits.shape, dtype=torch.float32)
    grad[torch.arange(len(targets)), targets] = -grad_output   # only the one-hot part
    return losses, grad.to(torch.bfloat16)
'''
    m = run(src)
    assert m.status == "incorrect", m.message


# ---- tampering stays inside the candidate's own process (the attacks are in test_measure_attacks) --

@pytest.mark.attacks  # the rest of the catalogue: tests/test_measure_attacks.py
def test_patching_torch_in_the_candidates_process_only_hurts_itself():
    src = BODY + '''
def custom_kernel(data):
    torch.Tensor.float = lambda self: self
    return _ce(*data)
'''
    m = run(src)
    assert m.status == "incorrect" and "dtype" in m.message, m.message


# ---- the static screen: a courtesy that turns obvious hacks away before they run --------------------

@pytest.mark.parametrize("snippet", [
    "import threading\n",
    "s = torch.cuda.Stream()\n",
    "import subprocess\n",
    "import os\nos.fork()\n",
    "import ctypes\n",
])
def test_static_screen_rejects_threads_streams_processes(snippet):
    m = run(snippet + BODY + "def custom_kernel(data):\n    return _ce(*data)\n")
    assert m.status == "rejected"


# ---- crashes, hangs, exits, memory, output floods ---------------------------------------------------

@pytest.mark.attacks  # the rest of the catalogue: tests/test_measure_attacks.py
def test_os_exit_is_crashed():
    m = run("import os\ndef custom_kernel(data):\n    os._exit(7)\n")
    assert m.status == "crashed" and "code 7" in m.message


def test_segfault_is_crashed():
    m = run("import faulthandler\ndef custom_kernel(data):\n    faulthandler._sigsegv()\n")
    assert m.status == "crashed" and "SIGSEGV" in m.message


@pytest.mark.attacks
def test_sys_exit_is_the_kernels_runtime_error():
    """sys.exit inside the kernel is an exception it raised, reported by its worker: a runtime
    error, said to be the worker's words (never the harness's), and cached like any."""
    m = run("import sys\ndef custom_kernel(data):\n    sys.exit(3)\n")
    assert m.status == "runtime_error" and "SystemExit: 3" in m.message, (m.status, m.message)
    assert m.message.startswith("the candidate's worker reported: ")


def test_infinite_loop_times_out():
    m = run("def custom_kernel(data):\n    while True:\n        pass\n", timeout_s=2)
    assert m.status == "timeout"


def test_memory_hog_is_killed():
    src = '''
import torch
def custom_kernel(data):
    hog = [torch.ones(2**28) for _ in range(64)]   # 64 GiB, well above the cap
    return hog
'''
    m = run(src, memory_gb=0.75, timeout_s=60)
    assert m.status in ("crashed", "runtime_error") and "memory" in m.message.lower()


def test_flooding_stdout_is_contained():
    src = 'import sys\ndef custom_kernel(data):\n    while True:\n        sys.stdout.write("x" * 2**20)\n'
    m = run(src, timeout_s=60)
    assert m.status == "crashed" and "output flood" in m.message, m.message


# ---- ordinary failures --------------------------------------------------------------------

def test_syntax_error_is_compile_error():
    m = run("def custom_kernel(data)\n    return data\n")
    assert m.status == "compile_error" and "SyntaxError" in m.message


def test_missing_custom_kernel_is_compile_error():
    m = run("import torch\ndef kernel(data):\n    return data\n")
    assert m.status == "compile_error" and "custom_kernel" in m.message


def test_exception_is_runtime_error():
    m = run("def custom_kernel(data):\n    raise ValueError('boom')\n")
    assert m.status == "runtime_error" and "boom" in m.message


def test_unknown_task_and_missing_gpu_are_usage_errors():
    with pytest.raises(ValueError, match="unknown task"):
        measure.measure("nope", "x")
    if not measure.measure.__globals__.get("torch"):
        import torch
        if not torch.cuda.is_available():
            with pytest.raises(ValueError, match="no CUDA GPU"):
                measure.measure(TASK, "x", device="cuda")


# ---- the sandbox's start-up check, the unsandboxed mode, plausibility ------------------------------

def test_without_bubblewrap_measure_refuses_in_one_line(monkeypatch):
    from harness import measure_sandbox
    monkeypatch.setattr(measure_sandbox, "_PLAN", None)
    monkeypatch.setattr(measure_sandbox.shutil, "which", lambda name: None)
    with pytest.raises(measure_sandbox.SandboxUnavailable, match="bubblewrap.*not installed.*--unsafe-no-sandbox"):
        run(seed_source(TASK))


@pytest.mark.slow
def test_unsafe_no_sandbox_measures_where_bubblewrap_cannot_run(monkeypatch):
    from harness import measure_sandbox

    def no_bwrap(*args, **kwargs):
        raise FileNotFoundError("bwrap")
    monkeypatch.setattr(measure_sandbox, "bwrap_argv", no_bwrap)  # neither side may reach for it
    monkeypatch.setattr(measure_sandbox, "sandbox_plan", no_bwrap)
    m = run(seed_source(TASK), unsafe_no_sandbox=True)
    assert m.status == "ok" and m.speedup > 0, m.message
    assert "unsafe" in m.sandbox


@pytest.mark.attacks
def test_a_sandboxed_measurement_after_an_unsandboxed_one_in_the_same_thread():
    """The thread's folders were made by the unsandboxed measurement; the sandboxed reference
    worker (the sandbox's uid, where the sandbox drops root) still writes its inputs there."""
    from harness import measure_sandbox
    if measure_sandbox.sandbox_plan().problem:
        pytest.skip("bubblewrap cannot run here")
    for unsafe in (True, False):
        m = run(seed_source(TASK), unsafe_no_sandbox=unsafe)
        assert m.status == "ok" and ("unsafe" in m.sandbox) == unsafe, m.message


def test_a_speedup_above_the_confirmation_line_is_measured_twice(monkeypatch, tmp_path):
    """The slower of two fresh measurements stands; when they disagree beyond their noise the
    verdict is the noise's as much as the kernel's, and it is not cached."""
    def result(speedup, noise=0.02):
        return dict(status="ok", speedup=speedup, noise=noise, flags=[])
    results = iter([result(40.0), result(1.1)])
    monkeypatch.setattr(measure, "_measure_once", lambda **kw: next(results))
    m = run(seed_source(TASK), use_cache=True, cache_dir=tmp_path)
    assert m.status == "ok" and m.speedup == 1.1 and any("not cached" in f for f in m.flags)
    assert not list(tmp_path.glob("*.json"))
    results = iter([result(40.0), result(38.0)])
    m = run(seed_source(TASK), use_cache=True, cache_dir=tmp_path)
    assert m.status == "ok" and m.speedup == 38.0 and any("measured twice" in f for f in m.flags)
    assert len(list(tmp_path.glob("*.json"))) == 1
    results = iter([result(40.0), dict(status="incorrect", message="wrong on fresh inputs")])
    m = run(seed_source(TASK), use_cache=False)
    assert m.status == "incorrect"


def test_physical_floor_uses_the_faster_of_datasheet_and_measured_bandwidth():
    from harness.estimate import physical_floor_ms
    gb = 4 * 4096 * 128256
    assert physical_floor_ms(gb, "NVIDIA H200", 4.3e12) == pytest.approx(gb / 4.8e12 * 1e3)
    # the most specific name wins: an H100 NVL's HBM is faster than the SXM part's
    assert physical_floor_ms(gb, "NVIDIA H100 NVL", None) == pytest.approx(gb / 3.9e12 * 1e3)
    assert physical_floor_ms(gb, "NVIDIA H100 80GB HBM3", None) == pytest.approx(gb / 3.35e12 * 1e3)
    assert physical_floor_ms(gb, "NVIDIA L4", None) == pytest.approx(gb / 0.3e12 * 1e3)
    assert physical_floor_ms(gb, "Some Future GPU", 9e12) == pytest.approx(gb / 9e12 * 1e3)
    assert physical_floor_ms(gb, "Some Future GPU", None) is None


# ---- command line ---------------------------------------------------------------------------

def cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "measure.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


@pytest.mark.e2e
@pytest.mark.slow
def test_cli_json_on_a_triton_variant(tmp_path):
    variant = next(p for p in variant_paths("fp8_quant") if p.stem == "triton_rowgroup")  # the quickest to interpret
    r = cli("--task", "fp8_quant", "--candidate", str(variant), "--json", "--quick", "--cache-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "ok" and out["speedup"] > 0
    assert {"status", "speedup", "cases", "device", "harness_version", "timer"} <= out.keys()
    assert out["cases"][0]["candidate_ms"] > 0 and "candidate_spread" in out["cases"][0]
    # The trusted worker's peak memory, what a plan of a shared GPU's memory needs: a Python with
    # torch resident, under the worker's memory cap.
    assert 0.05 < out["reference_peak_gb"] < 6.0


def test_cli_bad_usage_is_one_line_and_nonzero(tmp_path):
    r = cli("--task", "nope", "--candidate", str(ROOT / "tasks/kernels/cross_entropy/seed.py"))
    assert r.returncode == 2 and r.stderr.strip().startswith("error: unknown task") and "Traceback" not in r.stderr
    r = cli("--task", TASK, "--candidate", str(tmp_path / "missing.py"))
    assert r.returncode == 2 and "cannot read candidate" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_binary_or_non_utf8_candidate_is_one_line(tmp_path):
    for name, data in (("binary.py", b"\x7fELF\x00\x01\x02"), ("latin1.py", "x = 'caf\xe9'".encode("latin-1"))):
        bad = tmp_path / name
        bad.write_bytes(data)
        r = cli("--task", TASK, "--candidate", str(bad), "--device", "cpu")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and str(bad) in r.stderr and not r.stdout


@pytest.mark.e2e
def test_cli_a_failed_candidate_exits_1_with_its_verdict_and_its_own_file_named(tmp_path):
    """Test runners' convention: 0 for `ok`, 1 for a candidate that failed (its verdict printed all
    the same), 2 for a usage error (above). A syntax error names the user's file, not the name the
    worker imported it under."""
    bad = tmp_path / "bad.py"
    bad.write_text("def custom_kernel(data):\n    raise RuntimeError('nope')\n")
    r = cli("--task", TASK, "--candidate", str(bad), "--json", "--device", "cpu", "--no-cache")
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["status"] == "runtime_error"
    broken = tmp_path / "broken.py"
    broken.write_text("def custom_kernel(data):\n    return (\n")
    r = cli("--task", TASK, "--candidate", str(broken), "--device", "cpu", "--no-cache")
    assert r.returncode == 1 and "compile_error" in r.stdout, r.stdout + r.stderr
    assert f"{broken}, line 2" in r.stdout and "candidate_kernel.py" not in r.stdout, r.stdout
    assert "Exit status" in cli("--help").stdout


@pytest.mark.gpu
def test_seed_on_gpu_at_benchmark_shapes_is_about_one():
    m = measure.measure(TASK, seed_source(TASK), device="cuda", use_cache=False, quick=True)
    assert m.status == "ok", m.message
    assert "(GPU)" in m.timer and len(m.cases) == 3
    assert 0.6 < m.speedup < 1.6  # the seed is the reference itself; more would be a timing bug


def test_the_candidates_process_cannot_claim_a_failure_of_the_harness(tmp_path):
    """Building the inputs runs out of memory in the candidate's own process (simulated there: it
    could as well write the line itself). Whatever that process says is its worker's report, so the
    verdict is the kernel's runtime error in its worker's words, cached like any: `crashed`, which
    is never cached, the parent gives only from what it sees itself."""
    src = BODY + '''
import importlib
_main = importlib.import_module("__main__")  # the worker


def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("simulated: out of memory in the harness, outside the kernel's call")


_main.views = _oom


def custom_kernel(data):
    return _ce(*data)
'''
    m = run(src, use_cache=True, cache_dir=tmp_path)
    assert m.status == "runtime_error" and m.message.startswith("the candidate's worker reported: "), m.message
    assert list(tmp_path.glob("*.json"))


# ---- on a GPU only (`pytest -m gpu`) ------------------------------------------------------------

@pytest.mark.gpu
def test_reference_worker_reports_its_peak_gpu_memory():
    m = measure.measure(TASK, seed_source(TASK), device="cuda", use_cache=False, quick=True)
    assert m.status == "ok", m.message
    # cross_entropy's benchmark shapes hold GB of logits per call; a block holds several calls.
    assert 1.0 < m.reference_peak_gb < 80.0, m.reference_peak_gb


def test_an_interpreter_reached_through_a_link_is_bound_under_both_names(tmp_path, monkeypatch):
    """A virtualenv folder that is a symbolic link: the worker starts as sys.executable, the
    link's name, so the sandbox binds the real folder there too; and where what it was to run is
    missing inside, the error names that, not user namespaces (a new user's setpriv error)."""
    from harness import measure_sandbox
    real = tmp_path / "real-venv"
    (real / "bin").mkdir(parents=True)
    link = tmp_path / "venv"
    link.symlink_to(real)
    monkeypatch.setattr(sys, "prefix", str(link))
    monkeypatch.setattr(sys, "exec_prefix", str(link))
    monkeypatch.setattr(sys, "executable", str(link / "bin" / "python"))
    binds = measure_sandbox.python_paths()
    assert (str(real), str(link)) in binds and (str(real), str(real)) in binds
    assert not any(dest.startswith(str(real) + "/") or dest.startswith(str(link) + "/") for _, dest in binds)
    said = measure_sandbox._namespace_problem(f"setpriv: failed to execute {link}/bin/python: No such file or directory")
    assert "could not run this Python inside it" in said and "namespaces" not in said
    assert "namespaces" in measure_sandbox._namespace_problem("bwrap: No permissions to creating new namespace")


@pytest.mark.e2e
def test_a_measurement_from_a_virtualenv_reached_through_a_link(tmp_path):
    from harness import measure_sandbox
    if measure_sandbox.sandbox_plan().problem:
        pytest.skip("bubblewrap cannot run here")
    link = tmp_path / "venv"
    link.symlink_to(sys.prefix)
    candidate = tmp_path / "seed.py"
    candidate.write_text(seed_source(TASK))
    out = subprocess.run([str(link / "bin" / "python"), "measure.py", "--task", TASK, "--candidate", str(candidate),
                          "--quick", "--no-cache", "--json"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-800:]
    assert json.loads(out.stdout)["status"] == "ok"
