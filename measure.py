"""measure.py: the ground truth. Time a candidate kernel against the task's PyTorch reference.

Everything in this project (the forecaster's labels, the GRPO rewards, the search's decisions)
stands on the speedups measured here, S = reference_time / candidate_time, so this module is built
to be hard to fool (see MEASUREMENT_PITFALLS in the project's reference notes):

1. Isolation. Each candidate runs in its own worker process (forked from a server that has torch
   preloaded, so a worker starts in a fraction of a second), in its own process group, with a
   wall-clock timeout, a host-memory cap watched by the parent, a cap on the size of files it may
   write, and stdout/stderr sent to a file. A segfault, `os._exit`, `sys.exit`, a hang, an illegal
   memory access or running out of memory becomes a labelled outcome and the harness goes on.
2. A static screen rejects code that reaches for threads, processes, side streams, frames or the
   interpreter's internals before anything runs.
3. Trusted callables (the timer, the reference, the checker) are captured before the candidate is
   imported, and the identities of the attributes of the modules they live in are verified after
   every candidate call: monkeypatching anything there rejects the candidate.
4. Correctness on several seeds and shapes, with uninitialised memory filled with NaN (so an output
   element the kernel never writes fails the check), the candidate's inputs compared with their
   pristine copies afterwards (writing into inputs fails), exact output types, and after timing a
   re-check on inputs drawn from fresh random seeds the candidate has never seen (defeats caching).
5. Timing. On a GPU: CUDA events, warm-up by time (Triton JIT included, reported separately), an L2
   flush with a 256 MB buffer before every timed call (outside the timed region), inputs generated
   and cloned outside the timed region and rotated among several sets, a device-wide synchronise
   before the end event (work on side streams cannot escape), reference and candidate timed
   interleaved, the median reported with its spread (IQR / median), and results faster than the
   memory floor or more than 10x faster flagged as suspicious. On CPU (no GPU): the same checks, with
   Triton in interpreter mode and wall-clock times that are labelled as such: they say nothing about
   GPU speed.

speedup = geometric mean over the timed cases of reference_ms / candidate_ms (the paper's reward).

Usage:
    python measure.py --task cross_entropy --candidate tasks/kernels/cross_entropy/fused_online.py --json
"""
import argparse
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

HARNESS_VERSION = "1.0"
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected")
DEFAULT_CACHE_DIR = Path(os.environ.get("GPU_FORECASTERS_CACHE", Path.home() / ".cache" / "gpu-forecasters")) / "measurements"

# Peak DRAM bandwidth (bytes/s) of GPUs we know, for the physical floor of each case.
PEAK_BANDWIDTH = {"A100": 2.0e12, "H100": 3.35e12, "H200": 4.8e12, "B200": 8.0e12, "L40S": 0.864e12}
SUSPICIOUS_SPEEDUP = 10.0

# Static screen: each pattern is something a kernel never needs and a hack often does.
BANNED = [
    (r"\bthreading\b|\b_thread\b|concurrent\.futures", "threads (work could escape the timed region)"),
    (r"\bmultiprocessing\b|\bsubprocess\b|os\.fork|os\.spawn|os\.system|os\.exec|os\.popen", "processes"),
    (r"torch\.cuda\.Stream|torch\.cuda\.stream\s*\(|\.Stream\s*\(|torch\.cuda\.set_stream", "side streams"),
    (r"_getframe|currentframe|\bf_back\b|\bf_locals\b|\bf_globals\b|gc\.get_referrers|gc\.get_objects", "frame or heap inspection"),
    (r"\bctypes\b|\bcffi\b|/dev/shm|\bsys\.modules\b|\bbuiltins\b|__builtins__", "interpreter internals"),
    (r"\bsignal\.|\bsys\.settrace|\bsys\.setprofile|\batexit\b", "signal/trace hooks"),
    (r"torch\.cuda\.Event|elapsed_time|perf_counter|\bsynchronize\s*=", "the timer"),
]


@dataclasses.dataclass
class Measurement:
    task: str
    status: str
    speedup: float | None = None
    cases: list = dataclasses.field(default_factory=list)
    message: str = ""
    device: str = ""
    timer: str = ""
    scale: str = ""
    flags: list = dataclasses.field(default_factory=list)
    compile_s: float | None = None
    wall_s: float | None = None
    source_sha256: str = ""
    harness_version: str = HARNESS_VERSION
    cached: bool = False

    def to_dict(self):
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Parent side: screen, cache, spawn the worker, watch it, label its fate.
# ---------------------------------------------------------------------------------------------

def screen_source(source):
    """Return a reason to reject the source, or None. The candidate contract is a module with
    `custom_kernel(data)`; anything in BANNED is refused before it runs."""
    for pattern, what in BANNED:
        m = re.search(pattern, source)
        if m:
            return f"uses {what}: {m.group(0)!r} is not allowed in a candidate"
    if not re.search(r"^\s*def\s+custom_kernel\s*\(|^\s*custom_kernel\s*=", source, re.MULTILINE):
        return None  # reported as a compile_error by the worker, with the import's own message
    return None


def _device_name(device):
    if device == "cpu":
        import platform
        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    import torch
    return torch.cuda.get_device_name(0)


def _cache_key(task, sha, device_name, scale):
    text = json.dumps([task, sha, device_name, scale, HARNESS_VERSION])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_FORKSERVER_DEVICE = None


def _context(device):
    """Workers fork from a server that already imported torch (and torch._dynamo, which imports
    Triton): a worker starts in a fraction of a second instead of ~3 s. Triton decides between
    compiled and interpreted kernels when its own @jit functions are defined, i.e. at that import,
    so the server serves one device kind; a call for the other kind gets a plain spawned worker."""
    global _FORKSERVER_DEVICE
    if _FORKSERVER_DEVICE is None:
        _FORKSERVER_DEVICE = device
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch._dynamo"])
        return ctx
    if _FORKSERVER_DEVICE == device:
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


class _worker_env:
    """Environment a new worker (or the fork server) starts with: interpreter mode on CPU only."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "OPENBLAS_NUM_THREADS")}
        if self.device == "cpu":
            os.environ["TRITON_INTERPRET"] = "1"
            # The interpreter's tl.dot runs on numpy's BLAS; one thread keeps it from fighting torch.
            os.environ["OPENBLAS_NUM_THREADS"] = "1"
        else:
            os.environ.pop("TRITON_INTERPRET", None)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _tail(path, n=1500):
    try:
        data = Path(path).read_bytes()[-n:]
        return data.decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _kill_group(pid):
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def measure(task, source, *, device=None, scale=None, timeout_s=None, memory_gb=None,
            use_cache=True, cache_dir=None, quick=False):
    """Measure one candidate source against the task's reference. Never raises for a bad kernel:
    its fate is `Measurement.status`. Raises ValueError for bad usage (unknown task, no GPU).

    device: "cuda" or "cpu" (default: cuda when available). scale: "benchmark" (the paper's shapes,
    default on GPU) or "cpu" (small shapes, default on CPU). quick: fewer timed repetitions.
    """
    import torch

    from tasks import get_task

    task_module = get_task(task)  # ValueError for an unknown task
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    scale = scale or ("benchmark" if device == "cuda" else "cpu")
    if scale not in ("benchmark", "cpu"):
        raise ValueError(f"scale must be 'benchmark' or 'cpu', got {scale!r}")
    timeout_s = timeout_s or (600.0 if scale == "benchmark" else 240.0)
    memory_gb = memory_gb or (32.0 if device == "cuda" else 6.0)
    sha = hashlib.sha256(source.encode()).hexdigest()
    device_name = _device_name(device)
    timer = "cuda-events" if device == "cuda" else "cpu-wallclock (Triton interpreter; not GPU times)"
    base = dict(task=task_module.NAME, device=device_name, timer=timer, scale=scale, source_sha256=sha)

    reason = screen_source(source)
    if reason:
        return Measurement(status="rejected", message=reason, **base)

    cache_file = Path(cache_dir or DEFAULT_CACHE_DIR) / f"{_cache_key(task, sha, device_name, scale)}.json"
    if use_cache and cache_file.exists():
        try:
            return Measurement(**{**json.loads(cache_file.read_text()), "cached": True})
        except (ValueError, TypeError):
            pass  # an unreadable cache entry is measured again

    start = time.perf_counter()
    result = _run_worker(task_module.NAME, source, device, scale, timeout_s, memory_gb, quick)
    m = Measurement(**base, **result)
    m.wall_s = round(time.perf_counter() - start, 3)
    # Timeouts and crashes can depend on machine load and limits: measure those again next time.
    if use_cache and m.status not in ("timeout", "crashed"):
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(m.to_dict()))
        os.replace(tmp, cache_file)
    return m


def _run_worker(task, source, device, scale, timeout_s, memory_gb, quick):
    ctx = _context(device)
    with tempfile.TemporaryDirectory(prefix="measure-") as tmp:
        cand_path = Path(tmp) / "candidate_kernel.py"
        cand_path.write_text(source)  # a real file: @triton.jit reads its function's source
        log_path = Path(tmp) / "worker.log"
        job = dict(task=task, candidate_path=str(cand_path), device=device, scale=scale,
                   log_path=str(log_path), quick=quick, unseen_seed=secrets.randbits(31))
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker_main, args=(job, send), daemon=True)
        with _worker_env(device):
            proc.start()
        send.close()
        deadline = time.monotonic() + timeout_s
        limit = memory_gb * 2**30
        result = None
        try:
            while True:
                if recv.poll(0.05):
                    try:
                        result = recv.recv()
                    except (EOFError, OSError):
                        result = None  # the worker died while (or instead of) answering
                    break
                if not proc.is_alive():
                    if recv.poll(0.2):
                        continue
                    break
                if time.monotonic() > deadline:
                    _kill_group(proc.pid)
                    proc.join(5)
                    return dict(status="timeout", message=f"no result within {timeout_s:.0f} s (killed)")
                if _rss_bytes(proc.pid) > limit:
                    _kill_group(proc.pid)
                    proc.join(5)
                    return dict(status="crashed", message=f"out of memory: host memory above {memory_gb:g} GB (killed)")
        finally:
            recv.close()
        proc.join(10)
        if proc.is_alive() or proc.exitcode is None:
            _kill_group(proc.pid)
            proc.join(5)
        else:
            _kill_group(proc.pid)  # anything the candidate left behind in its process group
        if result is not None:
            return result
        code = proc.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"
        tail = _tail(log_path).splitlines()[-1:] or [""]
        return dict(status="crashed", message=f"worker {how} before reporting; last output: {tail[0][:300]}")


# ---------------------------------------------------------------------------------------------
# Worker side: everything below runs in the isolated worker process.
# ---------------------------------------------------------------------------------------------

class _Verdict(Exception):
    """A candidate's fate, raised from deep in the worker and reported as the result."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def _worker_main(job, conn):
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
            raise _Verdict("runtime_error", f"{what} {_case_str(case)}: {type(e).__name__}: {e}")
        finally:
            torch.use_deterministic_algorithms(False)
        verify_untouched()
        if not _same(data, pristine):
            raise _Verdict("incorrect", f"{what} {_case_str(case)}: candidate modified its input tensors")
        ok, msg = check(out, expected)
        verify_untouched()
        if not ok:
            raise _Verdict("incorrect", f"{what} {_case_str(case)} (seed {seed}): {msg}")

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
        flags += [f"{_case_str(case)}: {f}" for f in row["flags"]]
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


def _case_str(case):
    return ",".join(f"{k}={v}" for k, v in case.items())


# ---------------------------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------------------------

def format_table(m):
    lines = [f"task {m.task}: {m.status}" + (f", speedup {m.speedup:.3f}x (geomean)" if m.speedup else ""),
             f"device {m.device}; timer {m.timer}; scale {m.scale}" + (" (cached)" if m.cached else "")]
    if m.status != "ok":
        lines.append(f"reason: {m.message}")
    if m.cases:
        lines.append(f"{'case':<40} {'reference ms':>13} {'candidate ms':>13} {'spread':>7} {'speedup':>8}")
        for r in m.cases:
            lines.append(f"{_case_str(r['case']):<40} {r['reference_ms']:>13.4f} {r['candidate_ms']:>13.4f} "
                         f"{r['candidate_spread']:>7.1%} {r['speedup']:>7.3f}x")
    lines += [f"flag: {f}" for f in m.flags]
    if m.timer.startswith("cpu"):
        lines.append("note: CPU wall-clock times of interpreted kernels; they say nothing about GPU speed.")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Measure a candidate kernel against a task's PyTorch reference.")
    parser.add_argument("--task", required=True, help="task name, e.g. cross_entropy (see tasks/)")
    parser.add_argument("--candidate", required=True, help="path to a Python file defining custom_kernel(data)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is visible, else cpu")
    parser.add_argument("--scale", choices=["benchmark", "cpu"],
                        help="shapes to use: the paper's benchmark shapes (GPU default) or small CPU shapes (CPU default)")
    parser.add_argument("--timeout", type=float, help="wall-clock limit for the candidate's worker in seconds "
                        "(default 600 at benchmark scale, 240 at CPU scale)")
    parser.add_argument("--memory-gb", type=float, help="host memory cap of the worker (default 32 on GPU, 6 on CPU)")
    parser.add_argument("--quick", action="store_true", help="fewer timed repetitions (a faster, noisier figure)")
    parser.add_argument("--no-cache", action="store_true", help="measure even if this exact candidate was measured before")
    parser.add_argument("--cache-dir", help=f"result cache folder (default {DEFAULT_CACHE_DIR})")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)

    path = Path(args.candidate)
    try:
        source = path.read_text()
    except OSError as e:
        print(f"error: cannot read candidate {path}: {e.strerror}; pass a Python file defining custom_kernel(data)", file=sys.stderr)
        return 2
    try:
        m = measure(args.task, source, device=args.device, scale=args.scale, timeout_s=args.timeout,
                    memory_gb=args.memory_gb, use_cache=not args.no_cache, cache_dir=args.cache_dir, quick=args.quick)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(m.to_dict(), indent=None) if args.json else format_table(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
