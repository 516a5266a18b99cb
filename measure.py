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

This file is the trusted parent (screen, cache, spawn, watch, label, command line);
measure_worker.py is the half that runs inside the worker, next to the candidate.

Usage:
    python measure.py --task cross_entropy --candidate tasks/kernels/cross_entropy/fused_online.py --json
"""
import argparse
import dataclasses
import hashlib
import json
import multiprocessing
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

from measure_worker import PEAK_BANDWIDTH, SUSPICIOUS_SPEEDUP, case_str, worker_main  # noqa: F401

HARNESS_VERSION = "1.0"
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected")
DEFAULT_CACHE_DIR = Path(os.environ.get("GPU_FORECASTERS_CACHE", Path.home() / ".cache" / "gpu-forecasters")) / "measurements"


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
        proc = ctx.Process(target=worker_main, args=(job, send), daemon=True)
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
            lines.append(f"{case_str(r['case']):<40} {r['reference_ms']:>13.4f} {r['candidate_ms']:>13.4f} "
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
