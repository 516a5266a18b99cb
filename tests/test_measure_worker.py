"""Tests of measure_worker.py on its own: the GPU path's commitments, CUDA's grid limits, the CUDA timer, the twin."""
import pytest


def test_the_gpu_protocol_commits_each_call_and_checks_a_handover_against_its_digest(monkeypatch, tmp_path):
    """The GPU path's commands, run here on CPU tensors: each call (`run`) makes its inputs from its
    seed and replies with the BLAKE3 digests of its outputs and of its inputs after the call (the
    device's digest stood in for by the blake3 package, which fingerprint.py equals: its own
    tests); the reference worker's input digests of the same seed equal an honest candidate's and
    differ from those of a candidate that wrote into its inputs; a handover is checked against the
    committed digests (other bytes: forged) and then against the reference's outputs."""
    import io
    import os

    import blake3

    from harness import fingerprint, measure_worker
    monkeypatch.setattr(fingerprint, "blake3_digest", lambda raw, key=None: blake3.blake3(raw.numpy()).digest())

    class Timer:  # the CUDA timer's place: the call, and a time
        def run(self, fn, inputs):
            return [fn(x) for x in inputs], [0.5 for _ in inputs]

    def worker(role, source=None):
        out = open(tmp_path / f"{role}-{len(os.listdir(tmp_path))}.out", "wb+")
        w = measure_worker.Worker(role, "fp8_quant", "cpu", out)
        w.timer = Timer()
        if source:
            assert w.load({"op": "load", "source": source})["op"] == "loaded"
        return w, out

    ref, _ = worker("reference")
    honest, out = worker("candidate", "from tasks.fp8_quant import reference\n\ndef custom_kernel(data):\n"
                                      "    return reference(data)\n")
    writer, _ = worker("candidate", "from tasks.fp8_quant import reference\n\ndef custom_kernel(data):\n"
                                    "    result = reference(data)\n    data[0].mul_(2)\n    return result\n")
    case = ref.task.CPU_CASES[0]
    calls = [{"op": "run", "id": 7, "case": case, "index": i, "seed": seed} for i, seed in enumerate((11, 12))]
    refs = [ref.run(c) for c in calls]
    assert all(r["ms"] == 0.5 and len(r["out_digests"]) == 2 for r in refs)
    mine = [honest.run(c) for c in calls]
    assert [m["in_digests"] for m in mine] == [r["in_digests"] for r in refs]
    assert [m["out_digests"] for m in mine] == [r["out_digests"] for r in refs]  # the same computation
    assert writer.run(calls[0])["in_digests"] != refs[0]["in_digests"]
    with pytest.raises(RuntimeError, match="no block 8"):  # a call of a block that did not start with call 0
        honest.run({**calls[1], "id": 8})

    out.seek(0)
    out.truncate()
    honest.handover({"op": "handover", "id": 7, "index": 1})
    out.seek(0)
    header, payload = out.read().split(b"\n", 1)
    path = tmp_path / "handed.bin"
    path.write_bytes(payload)
    check = {"op": "check", "id": 7, "index": 1, "case": case, "path": str(path),
             "out_digests": mine[1]["out_digests"], "dtypes": ["torch.float32", "torch.float32"]}
    assert ref.check(check)["ok"]
    path.write_bytes(payload[:-4] + bytes(4))  # other bytes than those committed to
    verdict = ref.check(check)
    assert not verdict["ok"] and verdict["forged"]


def test_the_cpu_worker_refuses_grids_a_gpu_refuses(monkeypatch):
    from triton.runtime import interpreter

    from harness import measure_worker
    monkeypatch.setattr(interpreter.InterpreterBuilder, "set_grid_dim", interpreter.InterpreterBuilder.set_grid_dim)
    measure_worker.enforce_cuda_grid_limits()
    with pytest.raises(ValueError, match="65536 programs on axis 1.*put the largest axis first"):
        interpreter.InterpreterBuilder.set_grid_dim(interpreter.interpreter_builder, 4, 65536, 1)


def test_a_cpu_worker_patches_triton_only_as_it_is_first_imported():
    """A worker boots without Triton (a quarter of a second of CPU that a reference worker and a
    plain-PyTorch candidate never use), and whoever imports it first gets it patched: the grid
    limits and the autotuner's stand-in (test above, test_gpumode_submissions)."""
    import subprocess
    import sys
    from pathlib import Path
    code = """
import io, sys
sys.path.insert(0, sys.argv[1])
from harness import measure_worker
measure_worker.Worker("candidate", "cross_entropy", "cpu", io.BytesIO())
assert "triton" not in sys.modules, "the worker's boot imported Triton"
import importlib.util
assert importlib.util.find_spec("triton") and "triton" not in sys.modules  # asked for, not imported
import triton.language
from triton.runtime import autotuner, interpreter
print(interpreter.InterpreterBuilder.set_grid_dim.__qualname__, type(autotuner.Autotuner.__dict__["do_bench"]).__name__)
"""
    root = str(Path(__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["enforce_cuda_grid_limits.<locals>.set_grid_dim", "property"]


# ---- on a GPU only (`pytest -m gpu`) -------------------------------------------------------------

@pytest.mark.gpu
def test_cuda_timer_agrees_with_do_bench_and_its_fixed_cost_is_small():
    """The worker's timer against Triton's do_bench on a bf16 matmul of ~0.1-1 ms, and on an empty
    callable (what the timer adds by itself: two events and nothing between them)."""
    import statistics

    import torch
    import triton.testing

    from harness.measure_worker import CudaTimer
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    timer = CudaTimer()
    timer.run(lambda x: x @ x, [a] * 5)  # warm-up: cuBLAS picks its kernel
    ours = statistics.median(timer.run(lambda x: x @ x, [a] * 50)[1])
    theirs = triton.testing.do_bench(lambda: a @ a, warmup=25, rep=100, return_mode="median")
    assert 0.8 < ours / theirs < 1.25, (ours, theirs)
    empty = statistics.median(timer.run(lambda x: None, [None] * 200)[1])
    assert empty < 0.02, f"the timer alone costs {empty * 1e3:.1f} us per call"


def test_the_compile_baseline_times_the_reference_through_torch_compile(monkeypatch):
    """--baseline compile: the reference worker's timed function is torch.compile of the task's
    reference (compiling happens at its first call, not here); with the eager baseline it is the
    reference as a candidate's source, imported the way a candidate's is (tasks.reference_candidate);
    the candidate's worker never gets one, and a bad baseline is a one-line usage error before any
    worker starts."""
    import io

    from triton.runtime import interpreter

    import measure
    from harness import measure_worker
    monkeypatch.setattr(interpreter.InterpreterBuilder, "set_grid_dim", interpreter.InterpreterBuilder.set_grid_dim)
    eager = measure_worker.Worker("reference", "cross_entropy", "cpu", io.BytesIO())
    compiled = measure_worker.Worker("reference", "cross_entropy", "cpu", io.BytesIO(), baseline="compile")
    candidate = measure_worker.Worker("candidate", "cross_entropy", "cpu", io.BytesIO(), baseline="compile")
    assert eager.fn.__module__ == "candidate_kernel" and eager.fn.__globals__["_reference"] is eager.task.reference
    assert getattr(compiled.fn, "_torchdynamo_orig_callable", None) is compiled.task.reference
    assert candidate.fn is None
    with pytest.raises(ValueError, match="baseline"):
        measure.measure("cross_entropy", "def custom_kernel(data):\n    return data\n", device="cpu", baseline="jit")


def test_the_timing_twin_is_a_candidate_worker_that_loaded_the_reference(tmp_path, monkeypatch):
    """The twin (measure.py, CPU): a worker started in the candidate's role that loads the task's
    reference as a candidate's source, the way the candidate loads its own (tasks.reference_candidate);
    it tells the parent where in its memory each timed call's time is (the candidate's reply to its
    load carries nothing), and both reply to a timed window with where their outputs are and nothing
    else. Both build sets of a case's input objects over the arena before the windows (setup, fresh),
    each call taking a set of its own, and a timed window holds the call and its reply: the reply's
    addresses hold the outputs' bytes. Loading it through compile takes the compiled reference
    (--baseline compile)."""
    import ctypes
    import io
    import os

    from triton.runtime import interpreter  # imported before the workers' import hooks (one per Worker here)

    from harness import measure_channel, measure_worker
    from tasks import reference_candidate
    monkeypatch.setattr(interpreter.InterpreterBuilder, "set_grid_dim", interpreter.InterpreterBuilder.set_grid_dim)
    ref = measure_worker.Worker("reference", "fp8_quant", "cpu", io.BytesIO())
    case = ref.task.CPU_CASES[0]
    path = str(tmp_path / "in-0.bin")
    layout = ref.prepare({"id": 1, "case": case, "seeds": [5], "paths": [path]})["layouts"][0]
    arena = tmp_path / "arena.bin"
    arena.write_bytes(bytes(64) + open(path, "rb").read())  # slot 0 at byte 64
    setup = {"op": "setup", "case_index": 0, "arena": str(arena), "layout": layout, "bases": [64], "fresh": 3}
    expected = ref.fn(measure_worker.views(measure_worker.map_file(path), layout)[0])

    def timed(worker):
        read_fd, write_fd = os.pipe()
        worker.reply_fd = write_fd
        worker.go(b"g0,0")
        os.close(write_fd)
        line = os.read(read_fd, 4096).rstrip(b"\n")
        os.close(read_fd)
        return measure_channel.parse_where(line)

    twin = measure_worker.Worker("candidate", "fp8_quant", "cpu", io.BytesIO())
    loaded = twin.load({"op": "load", "source": reference_candidate("fp8_quant"), "twin": True})
    assert loaded["op"] == "loaded" and loaded["clock_at"] == twin.clock.buffer_info()[0]
    assert twin.fn.__globals__["_reference"] is twin.task.reference and twin.setup(setup)["op"] == "set"
    where = timed(twin)
    assert twin.clock[0] > 0 and len(where) == len(expected)  # the call's time, where the parent reads it
    for (address, code), e in zip(where, expected):
        assert measure_worker.DTYPES[code] == str(e.dtype).removeprefix("torch.")
        assert ctypes.string_at(address, e.numel() * e.element_size()) == e.numpy().tobytes()

    cand = measure_worker.Worker("candidate", "fp8_quant", "cpu", io.BytesIO())
    source = "from tasks.fp8_quant import reference\n\ndef custom_kernel(data):\n    return reference(data)\n"
    assert cand.load({"op": "load", "source": source}) == {"op": "loaded"}  # no figure of its own
    cand.setup(setup)
    assert len(timed(cand)) == len(expected)
    reply = cand.call({"op": "call", "case": case, "case_index": 0, "slot": 0})
    assert "bytes_per_call" not in reply and [s["shape"] for s in reply["specs"]] == [list(e.shape) for e in expected]
    # every call had input objects of its own over the same bytes; the used ones go at the next
    # untimed command, which tops the slot up again
    first, second = cand.spent
    assert first is not second and first[0] is not second[0] and first[0].data_ptr() == second[0].data_ptr()
    assert len(cand.views[0]["slots"][0]) == 1
    assert cand.fresh({"case_index": 0, "per_slot": 3}) == {"op": "freshened"}
    assert cand.spent == [] and len(cand.views[0]["slots"][0]) == 3

    compiled = measure_worker.Worker("candidate", "fp8_quant", "cpu", io.BytesIO())
    compiled.load({"op": "load", "reference": "compile"})
    assert getattr(compiled.fn, "_torchdynamo_orig_callable", None) is compiled.task.reference


def test_the_candidate_and_its_twin_start_without_address_randomisation_the_reference_with_it():
    """On CPU both timed sides start with one address layout (measure_sandbox.fixed_address_layout),
    through bubblewrap as without it; the reference worker, which reads candidates' bytes, and the
    parent itself keep theirs."""
    import subprocess
    import sys

    from harness import measure_sandbox
    show = [sys.executable, "-S", "-c", "print(open('/proc/self/personality').read().strip())"]
    plans = [None] + ([measure_sandbox.require_sandbox()] if not measure_sandbox.sandbox_plan().problem else [])
    for plan in plans:
        for fixed in (True, False):
            box = measure_sandbox.Sandbox.start(show, "cpu", plan, memory_bytes=float("inf"), fixed_layout=fixed,
                                                stderr=subprocess.DEVNULL)
            flags = int(box.popen.stdout.read().decode().split()[0], 16)
            box.popen.wait()
            box.close()
            assert bool(flags & measure_sandbox.ADDR_NO_RANDOMIZE) == fixed, (plan, fixed, hex(flags))
    assert not int(open("/proc/self/personality").read(), 16) & measure_sandbox.ADDR_NO_RANDOMIZE


def test_the_timed_workers_on_cpu_allocate_with_jemalloc(monkeypatch):
    """On CPU every worker's process allocates with jemalloc (measure_sandbox.jemalloc: under glibc
    a process's speed followed its allocation history), through bubblewrap as without it; a GPU
    worker keeps glibc, and so does every worker with GPU_FORECASTERS_NO_JEMALLOC=1."""
    import subprocess
    import sys

    import pytest

    from harness import measure_sandbox
    if measure_sandbox.jemalloc() is None:
        pytest.skip("libjemalloc2 is not installed (README: the apt-get line)")
    show = [sys.executable, "-S", "-c", "print(any('libjemalloc' in l for l in open('/proc/self/maps')))"]
    plans = [None] + ([measure_sandbox.require_sandbox()] if not measure_sandbox.sandbox_plan().problem else [])

    def loaded(device, plan):
        env = measure_sandbox.worker_env(device, "/tmp")
        box = measure_sandbox.Sandbox.start(show, "cpu", plan, memory_bytes=float("inf"), env=env,
                                            stderr=subprocess.DEVNULL)
        out = box.popen.stdout.read().decode().strip()
        box.popen.wait()
        box.close()
        return out == "True"

    for plan in plans:
        assert loaded("cpu", plan), plan
    assert not loaded("cuda", None)
    monkeypatch.setenv("GPU_FORECASTERS_NO_JEMALLOC", "1")
    assert not loaded("cpu", plans[-1])


def test_the_reference_peak_on_a_gpu_leaves_out_the_harnesss_flush_buffer(monkeypatch):
    """What a plan of the GPU's memory reads (Measurement.reference_peak_gb) is the reference's own
    need: the allocator's peak less the timer's L2 flush buffer, held by every worker alike."""
    import torch

    from harness import measure_worker
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 5 * 2**30)
    assert measure_worker.peak_memory_bytes("cuda") == 5 * 2**30 - measure_worker.FLUSH_BYTES
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 0)
    assert measure_worker.peak_memory_bytes("cuda") == 0


def test_the_cache_flusher_runs_on_the_timed_core_and_ends():
    """measure.py asks the set's CacheFlusher to evict the timed core's own caches before every CPU
    window: a thread of the parent's pinned to that core, writing a buffer the size of its L2."""
    import os
    import threading

    from harness import worker_set
    core = {sorted(os.sched_getaffinity(0))[-1]}
    flusher = worker_set.CacheFlusher(core)
    try:
        flusher.flush()
        flusher.flush()
        tid = flusher.thread.native_id
        assert os.sched_getaffinity(tid) == core
        assert flusher.size == worker_set.l2_bytes(core) >= 256 << 10
    finally:
        flusher.close()
    assert not flusher.thread.is_alive() and flusher.thread not in threading.enumerate()
