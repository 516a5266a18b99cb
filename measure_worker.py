"""measure_worker.py: the half of measure.py that runs inside the isolated worker process.

measure.py (the trusted parent) screens a candidate, forks a worker, watches it and labels its
fate. Everything here runs in that worker, next to the candidate's code: the fingerprint of the
trusted symbols, the correctness checks (NaN-filled fresh memory, pristine inputs, unseen seeds),
and the two timers (CUDA events with an L2 flush and rotated inputs; CPU wall clock). The worker
sends one dict back: status, message, and on success the per-case times and the geomean speedup.
"""
import math
import os
import sys
import time

# Peak DRAM bandwidth (bytes/s) of GPUs we know, for the physical floor of each case.
PEAK_BANDWIDTH = {"A100": 2.0e12, "H100": 3.35e12, "H200": 4.8e12, "B200": 8.0e12, "L40S": 0.864e12}
SUSPICIOUS_SPEEDUP = 10.0


class _Verdict(Exception):
    """A candidate's fate, raised from deep in the worker and reported as the result."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def worker_main(job, conn):
    os.setsid()  # own process group: the parent can kill everything the candidate starts
    fd = os.open(job["log_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 2**20, 256 * 2**20))  # huge stdout, disk fills
    if job["device"] == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # must precede every @triton.jit decoration
        import torch
        torch.set_num_threads(1)  # steadier wall-clock times on a shared machine
    try:
        result = _measure_in_worker(job)
    except _Verdict as v:
        result = dict(status=v.status, message=v.message[:2000])
    except SystemExit as e:
        result = dict(status="crashed", message=f"candidate called sys.exit({e.code})")
    except BaseException as e:  # noqa: BLE001 - the harness itself must report, not die
        result = dict(status="runtime_error", message=f"{type(e).__name__}: {e}"[:2000])
    sys.stdout.flush()
    conn.send(result)
    conn.close()
    os._exit(0)  # skip interpreter teardown: a candidate's atexit hooks or threads must not run


def _snapshot(objects):
    """Identity of every attribute of the trusted modules and classes (classes with their bases,
    so an override added to a subclass shows up as a new key)."""
    snap = {}
    for obj in objects:
        for owner in (obj.__mro__ if isinstance(obj, type) else (obj,)):
            for name, value in list(vars(owner).items()):
                snap[(id(owner), isinstance(obj, type), name)] = id(value)
    return snap


def _tampered(before, after):
    """Names whose binding changed; for classes also names that appeared (modules may grow lazily)."""
    changed = {key[2] for key, value in before.items() if after.get(key) != value}
    changed |= {key[2] for key in after if key[1] and key not in before}
    return sorted(changed)


def _measure_in_worker(job):
    import importlib.util

    import torch
    import torch.utils.deterministic

    import tasks._check
    from tasks import get_task

    task = get_task(job["task"])
    device, scale, quick = job["device"], job["scale"], job["quick"]
    torch.backends.cuda.matmul.allow_tf32 = False  # pin precision for both sides (pitfall 8)
    torch.backends.cudnn.allow_tf32 = False

    # Capture the trusted callables before any candidate code runs, and fingerprint their homes.
    perf_counter = time.perf_counter
    reference, check = task.reference, task.check
    trusted = [time, torch, torch.Tensor, torch.cuda, torch.utils.deterministic, task, tasks._check,
               sys.modules[__name__]]
    if device == "cuda":
        trusted.append(torch.cuda.Event)
        elapsed_time, cuda_sync = torch.cuda.Event.elapsed_time, torch.cuda.synchronize
    # Some of torch's bindings replace themselves on first use; use them once before fingerprinting.
    import torch._dynamo  # noqa: F401  (rebinds torch.manual_seed on import)
    import triton  # noqa: F401
    warm_case = (task.CPU_CASES if scale == "cpu" else task.BENCHMARK_CASES)[0]
    reference(task.generate_input(warm_case, 0, device=device))
    torch.manual_seed(0)
    fingerprint = _snapshot(trusted)

    def verify_untouched():
        changed = _tampered(fingerprint, _snapshot(trusted))
        if changed:
            raise _Verdict("rejected", f"candidate modified trusted symbols: {', '.join(changed[:5])}")

    # Import the candidate (compile errors are its own status; Triton compiles lazily at first call).
    t0 = perf_counter()
    try:
        spec = importlib.util.spec_from_file_location("candidate_kernel", job["candidate_path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernel = module.custom_kernel
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        raise _Verdict("compile_error", f"{type(e).__name__}: {e}")
    if not callable(kernel):
        raise _Verdict("compile_error", "custom_kernel is not callable")
    verify_untouched()
    import_s = perf_counter() - t0

    timed_cases = task.BENCHMARK_CASES if scale == "benchmark" else task.CPU_CASES
    check_cases = task.CHECK_CASES if scale == "benchmark" else task.CPU_CHECK_CASES

    def run_checked(case, seed, what):
        """One correctness call: NaN-filled fresh memory, pristine inputs compared afterwards."""
        data = task.generate_input(case, seed, device=device)
        expected = reference(_clone(data))  # computed first and kept alive (pitfall 6)
        pristine = _clone(data)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True  # unwritten outputs read as NaN
        try:
            out = kernel(data)
            if device == "cuda":
                torch.cuda.synchronize()
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001
            raise _Verdict("runtime_error", f"{what} {case_str(case)}: {type(e).__name__}: {e}")
        finally:
            torch.use_deterministic_algorithms(False)
        verify_untouched()
        if not _same(data, pristine):
            raise _Verdict("incorrect", f"{what} {case_str(case)}: candidate modified its input tensors")
        ok, msg = check(out, expected)
        verify_untouched()
        if not ok:
            raise _Verdict("incorrect", f"{what} {case_str(case)} (seed {seed}): {msg}")

    # 1. Correctness on two seeds of every timed case and one of every extra check case.
    t0 = perf_counter()
    for i, case in enumerate(timed_cases):
        for seed in (11 + i, 101 + i):
            run_checked(case, seed, "case")
    for i, case in enumerate(check_cases):
        run_checked(case, 211 + i, "check case")
    compile_s = import_s + perf_counter() - t0  # first calls include Triton JIT (pitfall 12)

    # 2. Timing, reference and candidate interleaved, case by case.
    timer = _CudaTimer(elapsed_time, cuda_sync) if device == "cuda" else _CpuTimer(perf_counter)
    results, flags = [], []
    for i, case in enumerate(timed_cases):
        sets = [task.generate_input(case, 1000 * (i + 1) + k, device=device) for k in range(timer.n_sets)]
        ref_t, cand_t = timer.time_pair(reference, kernel, sets, quick, verify_untouched)
        row = dict(case=case, reference_ms=_median(ref_t), candidate_ms=_median(cand_t),
                   reference_spread=_spread(ref_t), candidate_spread=_spread(cand_t), reps=len(cand_t))
        row["speedup"] = row["reference_ms"] / row["candidate_ms"] if row["candidate_ms"] > 0 else math.inf
        row["flags"] = _suspicions(task, case, row, device)
        flags += [f"{case_str(case)}: {f}" for f in row["flags"]]
        results.append(row)

    # 3. Inputs the candidate has never seen, from a seed drawn after it was loaded (pitfall 3).
    for i, case in enumerate(list(timed_cases) + list(check_cases[:1])):
        run_checked(case, job["unseen_seed"] + i, "unseen input")
    verify_untouched()

    speedups = [r["speedup"] for r in results]
    speedup = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    if speedup is not None and not math.isfinite(speedup):
        raise _Verdict("rejected", "a timed case took no measurable time")
    return dict(status="ok", speedup=speedup, cases=results, flags=flags, compile_s=round(compile_s, 3),
                message=f"geomean speedup {speedup:.3f}x over {len(results)} case(s)")


class _CpuTimer:
    """Wall clock around each call; a handful of repetitions (interpreted Triton is slow)."""
    n_sets = 2

    def __init__(self, perf_counter):
        self.clock = perf_counter

    def time_pair(self, reference, kernel, sets, quick, verify):
        budget, min_reps, max_reps = (0.3, 2, 5) if quick else (1.0, 3, 15)
        for fn in (reference, kernel):  # warm-up: one call each
            fn(_clone(sets[0]))
        ref_t, cand_t, spent, rep = [], [], 0.0, 0
        while rep < max_reps and (rep < min_reps or spent < budget):
            data = sets[rep % len(sets)]
            order = ((reference, ref_t), (kernel, cand_t)) if rep % 2 == 0 else ((kernel, cand_t), (reference, ref_t))
            for fn, store in order:
                args = _clone(data)
                t0 = self.clock()
                out = fn(args)
                dt = self.clock() - t0
                store.append(dt * 1e3)
                spent += dt
                _check_types(out, fn is kernel)
            verify()
            rep += 1
        return ref_t, cand_t


class _CudaTimer:
    """CUDA events with an L2 flush, rotated inputs, warm-up by time and a device-wide sync."""
    n_sets = 3

    def __init__(self, elapsed_time, sync):
        import torch
        self.torch, self.elapsed, self.sync = torch, elapsed_time, sync
        self.flush_buf = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # >= 256 MB

    def _call(self, fn, data):
        torch = self.torch
        self.flush_buf.zero_()  # evict L2 outside the timed region (pitfall 10)
        self.sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(data)
        self.sync()  # device-wide: work on another stream cannot escape the end event (pitfall 5)
        end.record()
        end.synchronize()
        return self.elapsed(start, end), out

    def time_pair(self, reference, kernel, sets, quick, verify):
        for fn in (reference, kernel):  # warm up by time, >= 25 ms and >= 3 calls (pitfall 11)
            t_end, n = time.monotonic() + 0.025, 0
            while n < 3 or time.monotonic() < t_end:
                fn(_clone(sets[n % len(sets)]))
                n += 1
            self.sync()
        verify()
        budget, min_reps, max_reps = (0.5, 5, 20) if quick else (2.0, 10, 100)
        ref_t, cand_t, t_start, rep = [], [], time.monotonic(), 0
        while rep < max_reps and (rep < min_reps or time.monotonic() - t_start < budget):
            data = sets[rep % len(sets)]
            order = ((reference, ref_t), (kernel, cand_t)) if rep % 2 == 0 else ((kernel, cand_t), (reference, ref_t))
            for fn, store in order:
                args = _clone(data)  # fresh copy, made outside the timed region
                ms, out = self._call(fn, args)
                store.append(ms)
                _check_types(out, fn is kernel)
                del args, out
            verify()
            rep += 1
        return ref_t, cand_t


def _clone(data):
    import torch
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, (tuple, list)):
        return type(data)(_clone(x) for x in data)
    if isinstance(data, dict):
        return {k: _clone(v) for k, v in data.items()}
    return data


def _same(a, b):
    import torch
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _check_types(out, is_candidate):
    """Outputs of timed calls must stay plain tensors: a lazy object would push work out of the
    timed region into whatever reads it later (pitfall 4)."""
    import torch
    if not is_candidate:
        return
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for o in outs:
        if type(o) is not torch.Tensor:
            raise _Verdict("incorrect", f"timed call returned {type(o).__name__}, not a plain torch.Tensor")


def _suspicions(task, case, row, device):
    flags = []
    if row["speedup"] > SUSPICIOUS_SPEEDUP:
        flags.append(f"suspicious: {row['speedup']:.1f}x faster than the reference")
    if device == "cuda":
        import torch
        name = torch.cuda.get_device_name(0)
        peak = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)
        if peak:
            floor_ms = task.min_bytes(case) / peak * 1e3
            if row["candidate_ms"] < 0.9 * floor_ms:
                flags.append(f"suspicious: {row['candidate_ms']:.4f} ms is below the memory floor {floor_ms:.4f} ms")
    return flags


def _median(xs):
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2


def _spread(xs):
    """Interquartile range relative to the median: 0.02 means the middle half is within 2%."""
    s = sorted(xs)
    n = len(s)
    q1, q3 = s[int(0.25 * (n - 1))], s[int(math.ceil(0.75 * (n - 1)))]
    med = _median(s)
    return (q3 - q1) / med if med > 0 else 0.0


def case_str(case):
    return ",".join(f"{k}={v}" for k, v in case.items())

