"""measure.py: the ground truth. Time a candidate kernel against the task's PyTorch reference.

Every number in this project (the forecaster's labels, the GRPO rewards, the search's decisions)
stands on the speedups measured here, S = reference_time / candidate_time, and a kernel search
feeds this file code that an LLM wrote and that reinforcement learning rewards for anything that
gets through. So the harness treats a candidate as hostile, and nothing the verdict rests on comes
from the candidate's process (docs/MEASUREMENT.md lists each attack, its defence and its test):

  parent (this file)       draws the seeds, owns the clock, reads the timed workers' outputs from
                           their frozen memory, decides the status, writes the cache. It never
                           imports, unpickles or runs candidate code, and reads the workers'
                           replies with a typed parser.
  reference worker         trusted, never loads a candidate: makes the inputs, judges the
                           candidate's output bytes against the reference's for the same inputs
                           (on CPU the twin's), and on a GPU runs and times the reference
                           (measure_worker.py).
  timing twin (CPU)        trusted: a fresh worker started with the candidate's, exactly as it is
                           (same role, sandbox, limits, address layout, hash seed, arenas), that
                           loads the task's reference as a candidate's source, the candidate's way
                           (tasks.reference_candidate). Its windows are the reference's side, its
                           outputs the expected ones: a process's speed follows its history and its
                           start, and the twin's are the candidate's (both allocate with jemalloc:
                           under glibc the allocation history alone set a process's speed).
  candidate worker         untrusted, in a sandbox (measure_sandbox.py: bubblewrap, seccomp, its
                           own cgroup and host uid), frozen except inside its commands: loads the
                           candidate and runs it one call at a time. Nothing it says is believed
                           but where its outputs are (CPU) or its digests (GPU); its error is its
                           kernel's, in its own words, never a verdict of the harness's.

The measurement, one candidate:
1. Load. A fresh sandboxed worker imports the candidate. Only then does the parent draw seeds, so
   nothing computed at import can know an input.
2. Correctness. Two seeds of every timed case and of every check case (odd shapes, and inputs
   that expose precision loss), each run on both sides; the candidate's outputs must be plain
   contiguous tensors of the reference's dtype (or one the task allows), shape and device, its
   inputs unchanged, its values within the task's tolerance of the reference's.
3. Timing, case by case, each call on fresh inputs (input objects of its own) on both sides, the
   reference's window and the candidate's one after the other, in a random order. On CPU a window
   is one call: the timed core's caches are evicted, the side is thawed, calls the kernel on inputs
   the parent copied into its arena while both sides were frozen, replies where its outputs are,
   and is frozen again; the parent reads the outputs' bytes from the frozen process, and every
   call is judged: byte for byte the twin's, or the task's check against them. On a GPU a window
   is a block of calls, each call's seed sent only once the call before it replied with the BLAKE3
   digests (computed on the device) of its outputs and inputs; a picked call's bytes (of every
   correctness block, of a random quarter of the timed ones) are handed over against the digest
   and checked by the reference worker. No call sees another's inputs, no work can be deferred
   past a window, and garbage is caught.
4. The clock is the parent's. A window's time is what the parent saw around it: on CPU the CPU
   time of the sandbox's cgroup (every thread and process the candidate ever started, reaped or
   not) between its thaw and its freeze; on a GPU the wall clock from the block's first command
   to its last reply. Both sides of a comparison run on one CPU core. The reference's time per
   call is the lower quartile of its own (trusted) timer (on CPU the twin's); the candidate's is
   that plus the median over pairs of its window less the reference's (per order within the
   pair, averaged), in which the harness's share of a window, the machine's drift and the order
   cancel. On CPU, whatever the candidate's sandbox used between its windows (it is frozen there)
   beyond what the twin's did is charged to it. Noise: a bootstrap over blocks of neighbouring
   pairs and the process noise; a speedup within twice that of 1.0 says so. The disturbance: the
   reference's windows right after the candidate's may not cost more than elsewhere (beyond the
   candidate's own difference): else measured again, then rejected.
5. Plausibility. On a GPU, a time below the task's unavoidable memory traffic (`min_bytes`) at the
   device's bandwidth is impossible: rejected when it is below by more than the noise, clamped to
   the floor when within it (apply_floor); a speedup above CONFIRM_SPEEDUP is measured again in a
   fresh worker, and the slower figure stands (not cached when the two disagree beyond their noise).

speedup = geometric mean over the timed cases (the paper's reward). On CPU, Triton runs in its
interpreter and the times are CPU time: they exercise the machinery and say nothing about GPU speed.

Usage:
    python measure.py --task cross_entropy --candidate tasks/kernels/cross_entropy/fused_online.py --json
"""
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import secrets
import statistics
import sys
import time
from pathlib import Path

from data.records import cache_dir, write_atomic
from harness.measure_channel import WorkerFailed, parse_where, printable
from harness.measure_sandbox import jemalloc, require_sandbox
from harness.measure_worker import CANDIDATE_FILE, DTYPES, case_str
from harness.worker_set import new_token, pin, workers
from runtime import cli
from runtime.cli import flag

HARNESS_VERSION = "5.0"  # 5.0: the twin loads the reference through the candidate's own load path, every call gets input objects of its own and is judged (on CPU against the twin's outputs), the timed core's caches evicted before every window, the disturbance check, the process noise, timers and AIO refused and no shared count to fill, the candidate's words never the harness's; 4.0: on CPU every call is a window of its own, the timed workers frozen between windows, their outputs read by the parent from their frozen memory, inputs copied into a mapped arena just before each call (nothing of the harness left in a window to make cheaper); exact output dtypes and the 1-norm check; 3.6: on CPU the workers allocate with jemalloc (under glibc a process's speed followed its allocation history); 3.5: the candidate's difference is a median per order within the pairs; 3.4: a side's CPU clock is read once its worker sleeps again (the wait watched bubblewrap before); 3.3: on CPU the twin shares the candidate's hash seed (3.2 figures scattered more); 3.2: on CPU the reference timed in a twin (older CPU figures leaned 5-10%); 3.1: GPU MODE's judging
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected")
DEFAULT_CACHE_DIR = cache_dir("measurements")
# Peak DRAM bandwidth (bytes/s) of GPUs we know, most specific name first; a family's fallback
# is its fastest variant, since a floor must never be above what the card can do. The physical
# bound uses the larger of this and the copy bandwidth the reference worker measured.
PEAK_BANDWIDTH = [("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("H200", 4.8e12),
                  ("GB200", 8.0e12), ("B200", 8.0e12), ("A100 80GB PCIe", 1.935e12), ("A100", 2.039e12),
                  ("L40S", 0.864e12), ("L40", 0.864e12), ("L4", 0.3e12)]
# Above this speedup a second, fresh measurement is taken and the slower of the two stands: an
# extraordinary claim should not rest on one run of a noisy machine.
CONFIRM_SPEEDUP = {"cuda": 10.0, "cpu": 10.0}
# Bytes per element of the dtypes an output may have (the reference's, or one its task allows):
# the parent sizes what it reads, or what a GPU worker hands over, from the shape and this table.
DTYPE_BYTES = {"torch.float64": 8, "torch.float32": 4, "torch.float16": 2, "torch.bfloat16": 2,
               "torch.float8_e4m3fn": 1, "torch.float8_e5m2": 1, "torch.float8_e4m3fnuz": 1,
               "torch.float8_e5m2fnuz": 1, "torch.int64": 8, "torch.int32": 4, "torch.int16": 2,
               "torch.int8": 1, "torch.uint8": 1, "torch.bool": 1}
# GPU: the share of timed blocks whose picked call is handed over and checked in full (every
# correctness block is): a handover moves up to a gigabyte, so a random quarter, unknown to the
# candidate until its calls are committed. (On CPU every call is judged: _Session.calls.)
VERIFY_SHARE = 0.25
# The reference's figure over a case's windows (see case_times): the lower quartile of its compute.
QUANTILE = 0.25
# A block's calls: on a GPU a block is one window of calls whose compute (BLOCK_MS) stands well
# above the noise of the parent's wall clock; on CPU each call is a window of its own on either
# side, and a block is the calls whose outputs one full check covers. Within a memory budget for
# their inputs (block_pairs).
BLOCK_BYTES = {"cuda": 4 << 30, "cpu": 64 << 20}
BLOCK_MS = {"cuda": 20.0, "cpu": 6.0}
BLOCK_CALLS = {"cuda": 100, "cpu": 8}
# CPU: each case's inputs are copied, call by call, into one of this many slots of its arena, and
# each side holds this many sets of input objects per slot not yet used (every call takes its own).
ARENA_SLOTS = 4
FRESH_PER_SLOT = 32
# Correctness calls before any timing: seeds of each timed case and of each check case. Every timed
# call is judged too (at least a warm-up pair and two blocks of them): a timed case gets at least
# KernelBench's five trials, and a kernel that is slow to call (interpreted Triton: a second a call)
# pays for the ones that time it, not for three more before.
TRIALS, CHECK_TRIALS = 2, 2
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")  # a BLAKE3 digest as a GPU worker commits to it
# The physical floor's significance test (apply_floor): standard errors of log time.
FLOOR_SIGMAS = 4.0
WARM_S = {"cuda": 0.025, "cpu": 0.15}
REPS = {  # (seconds per measurement and side, shared by its timed cases; min, max blocks per case), normal and --quick
    ("cuda", False): (2.0, 8, 80), ("cuda", True): (0.5, 5, 10),
    ("cpu", False): (0.7, 3, 600), ("cpu", True): (0.05, 2, 12),
}
# The candidate's difference is a median per order within the pairs (case_times) once each order
# has this many pairs.
MIN_PER_ORDER = 10
# The reference's windows right after the candidate's may cost more than those after the gap
# between pairs by DISTURB_TOLERANCE beyond what the candidate's own do (case_times: the
# disturbance), or DISTURB_SIGMAS standard errors, whichever is larger: beyond, the measurement was
# disturbed (measured once more, then rejected).
DISTURB_TOLERANCE, DISTURB_SIGMAS = 0.05, 4.0
# The part of a verdict's noise that no measurement sees from the inside: two fresh measurements of
# the same code, each with new workers, land apart by more than their windows' noise says (on CPU
# a process's speed is its own, from its start and its history). A standard error of log speedup,
# added to the windows' in quadrature; measured with scripts/bench_measure.py --coverage
# (docs/MEASUREMENT.md, The noise). No GPU has measured its own yet: the CPU's stands in for it.
PROCESS_NOISE = {"cpu": 0.01, "cuda": 0.01}
# A case whose noise (the standard error of its log speedup) is still above NOISE_TARGET when its
# budget is spent is timed on, up to STRETCH times its budget (not with --quick): a kernel equal to
# its reference should come out within 5% of 1.0, three standard errors, on a quiet machine.
NOISE_TARGET = 0.015
STRETCH = 2.0


@dataclasses.dataclass
class Measurement:
    task: str
    status: str
    speedup: float | None = None
    noise: float | None = None        # standard error of log(speedup): 0.02 means about +-2%
    within_noise: bool | None = None  # the speedup is within two standard errors of 1.0
    cases: list = dataclasses.field(default_factory=list)
    message: str = ""
    device: str = ""
    timer: str = ""
    scale: str = ""
    baseline: str = "eager"           # the reference as written, or through torch.compile (--baseline compile)
    flags: list = dataclasses.field(default_factory=list)
    import_s: float | None = None     # importing the candidate
    check_s: float | None = None      # the correctness calls (Triton's JIT compiles in the first ones)
    build_s: float | None = None      # of import_s + check_s: building the kernel (its import, and what its first call of each case took beyond its second: torch.compile, Triton's JIT)
    time_s: float | None = None       # the timed windows, both sides, verification included
    verify_s: float | None = None     # of check_s + time_s: handing outputs over and checking them in full (on CPU the checks run beside the next block: what the parent waited)
    reference_peak_gb: float | None = None  # the trusted worker's peak memory (on a GPU: reserved, less the 256 MB L2 flush buffer)
    candidate_peak_gb: float | None = None  # the candidate sandbox's peak host memory (its cgroup)
    wall_s: float | None = None
    sandbox: str = ""
    source_sha256: str = ""
    harness_version: str = HARNESS_VERSION
    cached: bool = False

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown measurement status {self.status!r}")

    def to_dict(self):
        return dataclasses.asdict(self)


class HarnessError(RuntimeError):
    """The trusted side failed (the reference worker died, ran out of memory, ...): never the
    candidate's fault, never cached."""


class _Outcome(Exception):
    """The candidate's fate, decided by the parent."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class _Disturbed(_Outcome):
    """The reference's windows cost more right after the candidate's than elsewhere (case_times'
    disturbance): measured once more, then rejected, never cached."""

    def __init__(self, message):
        super().__init__("rejected", message)


# Static screen: a courtesy, not a defence (string building or importlib walks past any regex).
# It turns away early, with a clear reason the mutator LLM can read, what a kernel never needs.
BANNED = [
    (r"\bthreading\b|\b_thread\b|concurrent\.futures", "threads (work could escape the timed region)"),
    (r"\bmultiprocessing\b|\bsubprocess\b|os\.fork|os\.spawn|os\.system|os\.exec|os\.popen", "processes"),
    (r"torch\.cuda\.Stream|torch\.cuda\.stream\s*\(|\.Stream\s*\(|torch\.cuda\.set_stream", "side streams"),
    (r"_getframe|currentframe|\bf_back\b|\bf_locals\b|\bf_globals\b|gc\.get_referrers|gc\.get_objects", "frame or heap inspection"),
    (r"\bctypes\b|\bcffi\b|/dev/shm|\bsys\.modules\b|\bbuiltins\b|__builtins__", "interpreter internals"),
    (r"\bsignal\.|\bsys\.settrace|\bsys\.setprofile|\batexit\b", "signal/trace hooks"),
    (r"torch\.cuda\.Event|elapsed_time|perf_counter|\bsynchronize\s*=", "the timer"),
]


def screen_source(source):
    """A reason to turn the source away before it runs, or None."""
    for pattern, what in BANNED:
        m = re.search(pattern, source)
        if m:
            return f"uses {what}: {printable(m.group(0), 80)!r} is not allowed in a candidate"
    return None


# ---------------------------------------------------------------------------------------------
# The measurement.
# ---------------------------------------------------------------------------------------------

def measure(task, source, *, device=None, gpu=None, scale=None, timeout_s=None, memory_gb=None,
            use_cache=True, cache_dir=None, quick=False, unsafe_no_sandbox=False, baseline="eager"):
    """Measure one candidate source against the task's reference. Never raises for a bad kernel:
    its fate is `Measurement.status`. Raises ValueError for bad usage (unknown task, no GPU, no
    sandbox: measure_sandbox.SandboxUnavailable) and HarnessError when the trusted side fails.

    device: "cuda" or "cpu" (default: cuda when available). gpu: on a GPU machine, which GPU the
    workers run on (its index among those this process sees; default: the first). Each thread that
    calls measure() has its own workers (measure_pool.py measures on several GPUs at once).
    scale: "benchmark" (the paper's shapes,
    default on GPU) or "cpu" (small shapes, default on CPU). quick: fewer timed calls.
    unsafe_no_sandbox: run the candidate's worker without bubblewrap (see the README).
    baseline: "eager" (the reference as written: KernelBench's fast_p baseline and the paper's) or
    "compile" (the reference through torch.compile, KernelBench's second baseline).
    """
    from tasks import TASK_NAMES, get_task, resolve_task

    # The parent never imports a built-in task's module or, on CPU, torch: the workers do (and
    # boot faster for it), and the reference worker tells the parent what it needs to know of the
    # task. A problem file (the user's code) is imported here once, so that one lacking what its
    # format needs fails now, in one line; the workers get its absolute path.
    task = resolve_task(task)  # raises the ValueError that names the valid tasks
    task_sha = ""
    if task not in TASK_NAMES:
        get_task(task)
        task_sha = hashlib.sha256(Path(task).read_bytes()).hexdigest()
    if baseline not in ("eager", "compile"):
        raise ValueError(f"baseline must be 'eager' or 'compile', got {baseline!r}")
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if device is None and not _gpu_driver_present():
        device = "cpu"  # without a GPU driver torch sees no GPU either: the parent need not import it
    if device != "cpu":
        import torch
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
        if device == "cuda" and gpu is not None and not 0 <= gpu < torch.cuda.device_count():
            raise ValueError(f"GPU {gpu} was asked for but this machine shows {torch.cuda.device_count()} "
                             f"(0..{torch.cuda.device_count() - 1})")
    scale = scale or ("benchmark" if device == "cuda" else "cpu")
    if scale not in ("benchmark", "cpu"):
        raise ValueError(f"scale must be 'benchmark' or 'cpu', got {scale!r}")
    sandbox = "none (--unsafe-no-sandbox)" if unsafe_no_sandbox else require_sandbox().describe()
    timeout_s = timeout_s or (600.0 if scale == "benchmark" else 240.0)
    memory_gb = memory_gb or (32.0 if device == "cuda" else 6.0)
    sha = hashlib.sha256(source.encode()).hexdigest()
    device_name = _device_name(device, gpu)
    base = dict(task=task, device=device_name, scale=scale, baseline=baseline, source_sha256=sha, sandbox=sandbox,
                timer=("parent clock: wall time of each block, paired with the reference's (GPU)" if device == "cuda" else
                       "parent clock: CPU time of each sandbox per window, paired with the reference's "
                       f"(Triton interpreter; not GPU times; allocator: {'jemalloc' if jemalloc() else 'glibc'})"))

    reason = screen_source(source)
    if reason:
        return Measurement(status="rejected", message=reason, **base)

    key = hashlib.sha256(json.dumps([task, task_sha, sha, device_name, scale, unsafe_no_sandbox, HARNESS_VERSION]
                                    + ([baseline] if baseline != "eager" else [])).encode())
    cache_file = Path(cache_dir or DEFAULT_CACHE_DIR) / f"{key.hexdigest()[:32]}.json"
    if use_cache and cache_file.exists():
        try:
            return Measurement(**{**json.loads(cache_file.read_text()), "cached": True})
        except (ValueError, TypeError):
            pass  # an unreadable entry is measured again

    start = time.perf_counter()
    run = dict(task=task, source=source, device=device, gpu=gpu if device == "cuda" else None,
               device_name=device_name, scale=scale, timeout_s=timeout_s,
               memory_bytes=memory_gb * 2**30, quick=quick, sandboxed=not unsafe_no_sandbox, baseline=baseline)
    result = _measure_once(**run)
    if result.pop("disturbed", False):  # once more, with fresh workers: a second one stands, whatever it says
        first = result["message"]
        result = _measure_once(**run)
        if result.pop("disturbed", False):
            result["message"] += "; the same the first time: rejected (not cached)"
        else:
            result.setdefault("flags", []).append(f"measured again: the first measurement was disturbed ({first})")
    cacheable = result.pop("cacheable", True)  # (a timeout or a crash: only where its WorkerFailed said so)
    confirm = CONFIRM_SPEEDUP[device]
    if result["status"] == "ok" and result["speedup"] > confirm:
        again = _measure_once(**run)  # fresh worker, fresh seeds
        cacheable = cacheable and again.pop("cacheable", True)
        if again["status"] != "ok":
            result, cacheable = again, False
        else:
            apart = abs(math.log(again["speedup"] / result["speedup"]))
            agree = apart <= 3 * math.hypot(result["noise"], again["noise"]) + math.log(1.1)
            cacheable = cacheable and agree
            if again["speedup"] < result["speedup"]:
                result = again
            result["flags"].append(f"a speedup above {confirm:g}x: measured twice, the slower figure stands"
                                   + ("" if agree else " (the two disagreed beyond their noise: not cached)"))
    m = Measurement(**base, **result)
    m.wall_s = round(time.perf_counter() - start, 3)
    # Timeouts and limits can depend on the machine's load and settings, and a verdict the harness
    # itself could not finish is not the candidate's: those are measured again next time. What
    # the parent saw the candidate do itself (an error, a broken protocol, an exit) is cached.
    if use_cache and cacheable:
        write_atomic(cache_file, json.dumps(m.to_dict()))
    return m


def _measure_once(task, source, device, gpu, device_name, scale, timeout_s, memory_bytes, quick, sandboxed, baseline):
    """One measurement in a fresh candidate worker; a dict of Measurement fields (and whether the
    verdict may be cached)."""
    ws = workers(gpu)  # this thread's workers on that GPU
    for attempt in (0, 1):
        # CPU: the reference's timed calls run in a twin, a fresh worker born with the candidate's
        # (worker_set.WorkerSet.candidate_pair); the reference worker makes inputs and checks.
        try:
            cand, twin = ws.candidate_pair(task, device, sandboxed, memory_bytes)  # they boot while the reference does
        except WorkerFailed as e:  # no candidate code has run: the harness's failure (or the set was closed)
            raise HarnessError(f"the candidate's worker did not start: {e.message}") from None
        try:
            try:
                ref, ready = ws.reference_worker(task, device, sandboxed, baseline)
            except WorkerFailed as e:
                raise HarnessError(f"the reference worker did not start: {e.message}") from None
            for w in (cand, twin):  # both sides of every comparison on one core (worker_set.WorkerSet)
                if w is not None:
                    pin(w, ws.core)
            # On a GPU the reference worker is the reference's timed side; on CPU it makes inputs and
            # checks outputs on another core while the twin and the candidate are timed (calls), or,
            # where the thread has one core, between blocks.
            beside = twin is not None and ws.spare_cores != ws.core
            pin(ref, ws.spare_cores if beside else ws.core)
            session = _Session(task, ref, ready, cand, ws.dirs, device, device_name, scale, timeout_s, quick, twin,
                               baseline, beside, flush=ws.cache_flusher().flush if twin is not None else None)
            result = session.run(source)
            if ws.closed:  # another thread ended the workers (an interrupted run): no verdict on the candidate
                raise HarnessError("the measurement was interrupted (its workers were closed)")
            return result
        except HarnessError:
            ws.drop_reference()  # restart the trusted side once: a transient failure must not stop a search
            if attempt:
                raise
        finally:
            cand.kill()
            if twin is not None:
                twin.kill()


class _Session:
    """The protocol of one candidate measurement (see the module docstring)."""

    def __init__(self, task, ref, ready, cand, dirs, device, device_name, scale, timeout_s, quick, twin=None,
                 baseline="eager", beside=False, flush=None):
        self.task, self.ref, self.cand, self.dirs, self.baseline = task, ref, cand, dirs, baseline
        self.flush = flush or (lambda: None)  # CPU: the timed core's caches evicted before each window
        # The worker whose timed calls are the reference's side of each pair: on CPU the twin, on
        # a GPU the reference worker itself (its CUDA events; no twin there yet, docs/MEASUREMENT.md).
        self.timed_ref = twin or ref
        self.device, self.device_name, self.quick = device, device_name, quick
        cases = ready["cases"]
        self.timed_cases = cases["benchmark"] if scale == "benchmark" else cases["cpu"]
        self.check_cases = cases["check"] if scale == "benchmark" else cases["cpu_check"]
        self.min_bytes = dict(zip(map(case_str, cases["benchmark"]), ready["min_bytes"]))
        # The output dtypes a task accepts besides the reference's (its original's checker casts).
        self.allowed_dtypes = {f"torch.{d}" for d in ready.get("allowed_dtypes") or ()}
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.bandwidth = ready.get("copy_bandwidth")
        self.block_id, self.last_id, self.bytes_per_call, self.call_ms, self.ref_peak = 0, 0, {}, {}, 0
        # CPU: each side's clock at the end of its last command, and the CPU time it used between
        # its commands. Both are frozen between their commands (they use none); whatever the
        # candidate's sandbox used there beyond what the twin's did is charged to it (case_times).
        self.clock_end, self.outside_ms = {}, {"ref": 0.0, "cand": 0.0}
        self.verify_s = 0.0  # wall time of the full checks (verify), within the budget's time
        # CPU: the reference worker makes the next block's inputs and checks the last block's
        # outputs while the twin and the candidate are timed on their own core (calls). Its replies
        # come in the order of its commands: each awaited one is (op, what to do with it, files
        # to remove once it came). `ahead`: the next block, its inputs being made.
        self.ref_pending, self.ahead, self.inputs_made = [], None, []
        self.beside = beside  # it has a core of its own (_measure_once); else it works between blocks
        # CPU: each case's arena (_arena) and the reference's outputs (shapes and dtypes, from the
        # twin's checked windows) by case.
        self.arenas, self.ref_specs, self.ref_container = {}, {}, {}
        self.checked_s = {}  # CPU: the candidate's checked windows by case, the parent's wall clock (build_s)
        self.twin_clock = None  # CPU: where in the twin's memory its last timed call's time is (Worker.go)

    def run(self, source):
        try:
            try:  # booting is the harness's time, and no candidate code has run yet: its failure is ours
                self.cand.recv(time.monotonic() + 300, "ready")
            except WorkerFailed as e:
                raise HarnessError(f"the candidate's worker did not start: {e.message}; {self.cand.log_tail()}") from None
            self.cand.freeze(time.monotonic() + 60)  # from now on it runs only inside its commands
            if self.timed_ref is not self.ref:
                self._start_twin()
            self.deadline = time.monotonic() + self.timeout_s
            t0 = time.perf_counter()
            self._command("cand", {"op": "load", "source": source}, "loaded")
            import_s = time.perf_counter() - t0  # the parent's clock, not the candidate's word
            t1 = time.perf_counter()
            # Seeds are drawn now, after the candidate was loaded. Every correctness call is
            # checked in full: TRIALS seeds of every timed case, CHECK_TRIALS of every check case
            # (odd shapes, and inputs that expose precision loss); then every timed call.
            for case in self.timed_cases + self.check_cases:
                for _ in range(TRIALS if case in self.timed_cases else CHECK_TRIALS):
                    self.pair(case, 1, verify=True, timed=False)
            t2 = time.perf_counter()
            rows = [self.time_case(case) for case in self.timed_cases]
            self._ref_settle()
        except WorkerFailed as e:
            return dict(status=e.status, message=e.message, cacheable=e.cacheable)
        except _Disturbed as o:
            return dict(status=o.status, message=printable(o.message), cacheable=False, disturbed=True)
        except _Outcome as o:
            return dict(status=o.status, message=printable(o.message))
        except HarnessError:
            raise
        except Exception as e:  # noqa: BLE001 - a reply the typed parser let through and the parent then tripped on
            return dict(status="rejected", cacheable=False,
                        message=printable(f"the harness could not finish this measurement ({type(e).__name__}: {e}); not cached"))
        finally:
            self._drop_pending()
        logs = [math.log(r["speedup"]) for r in rows]
        speedup = math.exp(sum(logs) / len(rows))
        # The windows' noise (each case's bootstrap), and the fresh pair of processes' own: a rerun
        # with new workers lands that far from this one even where the windows agree (PROCESS_NOISE)
        noise = math.hypot(math.sqrt(sum(r["noise"] ** 2 for r in rows)) / len(rows), PROCESS_NOISE[self.device])
        within = abs(math.log(speedup)) <= 2 * noise
        flags = [f for r in rows for f in r["flags"]]
        if within:
            flags.append(f"{speedup:.3f}x is within two standard errors of 1.0 (noise {noise:.1%}): no speedup the measurement can tell")
        return dict(status="ok", speedup=speedup, noise=noise, within_noise=within, cases=rows, flags=flags,
                    message=f"geomean speedup {speedup:.3f}x over {len(rows)} case(s)",
                    import_s=round(import_s, 3), check_s=round(t2 - t1, 3), build_s=round(import_s + self.build_extra(), 3),
                    time_s=round(time.perf_counter() - t2, 3), verify_s=round(self.verify_s, 3), reference_peak_gb=round(self.ref_peak / 2**30, 3),
                    candidate_peak_gb=round(self.cand.peak_bytes() / 2**30, 3))

    def build_extra(self):
        """Seconds the candidate's first call of each case took beyond its second (both correctness
        calls, on fresh inputs of the same shape): what a kernel that builds at its first call (a
        torch.compile, Triton's JIT for a new shape) spent building, for build_s. (On a GPU: 0,
        the blocks' calls are not timed one by one.)"""
        return sum(max(0.0, s[0] - s[1]) for s in self.checked_s.values() if len(s) >= 2)

    def _start_twin(self):
        """The twin has booted as the candidate did; it loads the reference (its failures are the harness's)."""
        try:
            self.timed_ref.recv(time.monotonic() + 300, "ready")
            self.timed_ref.freeze(time.monotonic() + 60)
        except WorkerFailed as e:
            raise HarnessError(f"the worker that times the reference did not start: {e.message}; {self.timed_ref.log_tail()}") from None
        # The reference as a candidate's source, loaded the way the candidate's is (Worker.load):
        # whatever the harness does around a candidate's call it does around the reference's.
        from tasks import reference_candidate
        cmd = ({"op": "load", "source": reference_candidate(self.task), "twin": True} if self.baseline == "eager"
               else {"op": "load", "reference": self.baseline})
        self.twin_clock = self._command("ref", cmd, "loaded")["clock_at"]

    # -- a command to a side that runs only inside its commands ------------------------------------

    def _worker(self, side):
        return self.timed_ref if side == "ref" else self.cand

    def _command(self, side, cmd, op):
        """An untimed command to the twin ("ref") or the candidate ("cand"), thawed for it and
        frozen again once it replied. The CPU it uses counts as its time outside its windows
        (_enter). The twin's failures are the harness's."""
        w = self._worker(side)
        try:
            w.thaw()
            w.send(cmd, self._deadline(side))
            reply = w.recv(self._deadline(side), op)
            w.freeze(self._deadline(side))
            return reply
        except WorkerFailed as e:
            if side == "ref":
                raise self._ref_failed(cmd, w, e) from None
            raise

    def _deadline(self, side):
        return self.deadline if side == "cand" else time.monotonic() + 600

    # -- one pair of windows: the same inputs on both sides, one call verified ---------------------

    def pair(self, case, n, verify, timed=True, ahead=False):
        """n calls on fresh inputs on both sides, the reference's and the candidate's in a random
        order: on CPU each call a window of its own on either side, every call judged; on a GPU a
        block of n calls on either side, one call of the candidate's verified in full, picked after
        all n returned (always when `verify`, else with VERIFY_SHARE). `timed`: the reference's own
        times are taken (the correctness calls are not timed). Returns the trusted side's figures
        only: dict(ref_ms, ref_win, cand_win, cand_first), lists of one figure per window pair (on
        a GPU one pair of blocks of n calls)."""
        if self.device == "cpu":
            return self.calls(case, n, timed, ahead)
        return self.gpu_pair(case, n, verify, timed)

    def _prepare(self, case, n):
        """A block of n calls: the reference worker makes and writes its inputs (_ref_later)."""
        self.last_id += 1
        bid = self.last_id
        names = [f"{bid}-{j}-{new_token()}.bin" for j in range(n)]
        paths = [os.path.join(self.dirs["inputs"], x) for x in names]
        cmd = {"id": bid, "op": "prepare", "case": case, "seeds": [secrets.randbits(31) for _ in range(n)], "paths": paths}
        block = dict(id=bid, case=case, names=names, paths=paths, cmd=cmd)
        self.inputs_made += paths
        def made(reply):
            block.update(layouts=reply["layouts"])
            self.ref_peak = max(self.ref_peak, reply["peak_bytes"] or 0)
        self._ref_later(cmd, "prepared", then=made)
        return block

    def calls(self, case, n, timed=True, ahead=False):
        """CPU: n calls on fresh inputs, each call one window on either side (the twin's and the
        candidate's, in a random order), each window timed by the parent's clock: the CPU time of
        the side's sandbox from before it is thawed to after it is frozen again. A call's inputs
        are copied into its case's arena only while both sides are frozen, just before its pair
        of windows, and the parent reads each side's outputs from its frozen memory right after
        its window: no call sees another call's inputs before its own outputs are fixed, and
        nothing the candidate's process does outside its windows or says about its outputs
        (but where they are) enters the verdict. Every call is judged: the candidate's outputs
        byte for byte the twin's (the reference, run by a trusted process on the same inputs), or
        else the task's check on both, by the reference worker (_compare_later). Returns
        dict(ref_ms, ref_win, cand_win, cand_first), per pair (ref_ms: the twin's own time of its
        call, when `timed`)."""
        block, self.ahead = self.ahead, None
        if block is None or block["case"] != case or len(block["paths"]) != n:
            block = self._prepare(case, n)  # (one made for another shape goes unused: _drop_pending)
        bid, paths = block["id"], block["paths"]
        self.block_id = bid
        ref_ms, ref_win, cand_win, cand_first, differ = [], [], [], [], []
        try:
            if "layouts" not in block:
                self._ref_settle(block["cmd"])
            layouts = block["layouts"]
            if ahead and self.beside:  # the next block's inputs are made on the other core while this one is timed
                self.ahead = self._prepare(case, n)
            for j in range(n):
                arena = self._arena(case, layouts[j])
                slot = secrets.randbelow(ARENA_SLOTS)
                if not arena["left"][slot]:
                    self._fresh(arena)
                arena["left"][slot] -= 1
                _copy_into(paths[j], arena["fd"], arena["bases"][slot], layouts[j]["size"])
                # The twin's checked window first: its outputs are the reference's shapes and dtypes.
                order = ("cand", "ref") if timed and secrets.randbits(1) else ("ref", "cand")
                cand_first.append(order[0] == "cand")
                got = {}
                for side in order:
                    self.flush()  # every window starts from the same cache state (CacheFlusher)
                    if timed:
                        where, ns, window = self._go(side, arena["index"], slot)
                    else:
                        where, window = self._checked_window(side, case, arena["index"], slot)
                        ns = None
                    got[side] = self._read_outputs(side, case, where)
                    if side == "ref":
                        ref_win.append(window)
                        if ns is not None:
                            ref_ms.append(ns / 1e6)
                            self._saw_call(case, "ref", ns / 1e6)
                    else:
                        cand_win.append(window)
                if timed:
                    self._saw_call(case, "cand", cand_win[-1] - (ref_win[-1] - ref_ms[-1]))
                if got["cand"] != got["ref"]:  # not the reference's very bytes: the task's check decides
                    differ.append((got["cand"], got["ref"]))
            if differ:
                self._compare_later(case, differ)
        finally:
            for p in paths:
                _unlink(p)
        return dict(ref_ms=ref_ms, ref_win=ref_win, cand_win=cand_win, cand_first=cand_first)

    def _arena(self, case, layout):
        """CPU: the case's arena, made (and mapped by both sides, setup) the first time the case
        is seen, or again when a call's layout differs from the one its views were built for: a
        file of ARENA_SLOTS slots in the folder both sandboxes see read-only, each slot at its
        own random 64-byte offset of a page (where a call's inputs sit against its outputs'
        addresses, their cache sets, varies from call to call instead of repeating). Each side
        builds FRESH_PER_SLOT sets of input objects over each slot (`left`: those not yet used)."""
        key = case_str(case)
        arena = self.arenas.get(key)
        if arena is not None and arena["layout"] == layout:
            return arena
        index = len(self.arenas) if arena is None else arena["index"]
        stride = -(-(layout["size"] + 4096) // 4096) * 4096
        bases = [s * stride + 64 * secrets.randbelow(64) for s in range(ARENA_SLOTS)]
        path = os.path.join(self.dirs["shown"], f"arena-{index}-{new_token()}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, ARENA_SLOTS * stride)
        if arena is not None:
            os.close(arena["fd"])
            _unlink(arena["path"])
        arena = self.arenas[key] = dict(index=index, path=path, fd=fd, layout=layout, bases=bases,
                                        left=[FRESH_PER_SLOT] * ARENA_SLOTS)
        self.inputs_made.append(path)
        cmd = {"op": "setup", "case_index": index, "arena": path, "layout": layout, "bases": bases,
               "fresh": FRESH_PER_SLOT}
        for side in ("ref", "cand"):
            self._command(side, cmd, "set")
        return arena

    def _fresh(self, arena):
        """CPU: both sides build new input objects for every slot of the arena (Worker.fresh), an
        untimed command between windows (its CPU is each side's time outside its windows)."""
        cmd = {"op": "fresh", "case_index": arena["index"], "per_slot": FRESH_PER_SLOT}
        for side in ("ref", "cand"):
            self._command(side, cmd, "freshened")
        arena["left"] = [FRESH_PER_SLOT] * ARENA_SLOTS

    def _go(self, side, case_index, slot):
        """CPU: one side's timed window on arena slot `slot`: (where its outputs are, the twin's
        own time of its call in ns or None, the window's CPU ms)."""
        w = self._worker(side)
        c0 = self._enter(side)
        try:
            w.thaw()
            w.send_raw(b"g%d,%d\n" % (case_index, slot), self._deadline(side))
            where = w.recv_where(self._deadline(side))
            w.freeze(self._deadline(side))
        except WorkerFailed as e:
            if side == "ref":
                raise self._ref_failed({"op": "go"}, w, e) from None
            raise
        window = self._leave(side) - c0
        if side == "cand":
            return where, None, window
        raw = self.timed_ref.read_memory(self.twin_clock or 0, 8)  # its call's time, from its frozen memory
        if raw is None:
            raise HarnessError("the parent could not read the clock of the worker that times the reference")
        return where, int.from_bytes(raw, "little", signed=True), window

    def _checked_window(self, side, case, case_index, slot):
        """CPU: one side's checked window (the correctness calls): the call, and a description of
        its outputs compared with the reference's (the twin's is the reference's); returns
        (where its outputs are, the window's CPU ms)."""
        c0, w0 = self._enter(side), time.perf_counter()
        reply = self._command(side, {"op": "call", "case": case, "case_index": case_index, "slot": slot}, "called")
        window = self._leave(side) - c0
        key = case_str(case)
        if side == "cand":  # its first calls of a case may build (build_s)
            self.checked_s.setdefault(key, []).append(time.perf_counter() - w0)
        if side == "ref":
            self.ref_specs[key] = reply["specs"]
            self.ref_container[key] = reply["container"]
            self.bytes_per_call[key] = reply["bytes_per_call"]
        else:
            self.check_spec(case, self.ref_specs[key], reply["specs"])
        if reply["where"] is None:
            if side == "ref":
                raise HarnessError("the worker that times the reference got outputs from it that are not tensors")
            raise _Outcome("incorrect", f"{case_str(case)}: a call returned {_describe(reply['specs'])}")
        try:
            where = parse_where(reply["where"].encode())
        except ValueError as e:
            raise (HarnessError(str(e)) if side == "ref" else _Outcome("rejected", f"the worker broke the measurement protocol: {e}"))
        return where, window

    def _read_outputs(self, side, case, where):
        """CPU: a side's outputs of its last window, read by the parent from its frozen process:
        one bytes object per output, sized by the reference's shape and the output's dtype (the
        reference's, or one the task allows). Nothing the worker says enters the verdict but where
        the bytes are: a lie about that reads the wrong bytes, which the check rejects. The twin's
        are the expected outputs of the same call (calls)."""
        spec = self.ref_specs[case_str(case)]
        where_ = case_str(case)
        if len(where) != len(spec):
            if side == "ref":
                raise HarnessError("the worker that times the reference got another number of outputs from it")
            raise _Outcome("incorrect", f"{where_}: expected {len(spec)} output tensor(s), got {len(where)}")
        got = []
        for i, ((address, code), exp) in enumerate(zip(where, spec)):
            dtype = "torch." + DTYPES[code] if 0 < code < len(DTYPES) else "another dtype"
            if dtype != exp["dtype"] and dtype not in self.allowed_dtypes:
                if side == "ref":
                    raise HarnessError("the worker that times the reference got an output of another dtype from it")
                raise _Outcome("incorrect", f"{where_}: output[{i}] dtype {dtype.removeprefix('torch.')}, "
                                            f"expected {exp['dtype'].removeprefix('torch.')}")
            data = self._worker(side).read_memory(address, math.prod(exp["shape"]) * DTYPE_BYTES[dtype])
            if data is None:
                if side == "ref":
                    raise HarnessError("the parent could not read the outputs of the worker that times the reference")
                raise _Outcome("incorrect", f"{where_}: output[{i}]'s bytes are not in the worker's memory where "
                                            "its reply said (an output must be a tensor of the reference's shape)")
            got.append((dtype, data))
        return got

    def _saw_call(self, case, side, ms):
        """One side's time per call in the timed windows, as the parent's clock (the candidate)
        or the twin's own (the reference) saw it; the least seen sizes the blocks (block_pairs)."""
        key = (case_str(case), side)
        self.call_ms[key] = min(max(ms, 1e-3), self.call_ms.get(key, math.inf))

    def _enter(self, side):
        """A side's clock before its window (frozen): what it used since its last window is its
        time outside its windows."""
        c0 = self._clock(self._worker(side))
        if side in self.clock_end:
            self.outside_ms[side] += max(0.0, c0 - self.clock_end[side])
        return c0

    def _leave(self, side):
        self.clock_end[side] = self._clock(self._worker(side))
        return self.clock_end[side]

    def _ref_call(self, cmd, op, deadline_s=600):
        """A command to the reference worker, answered now; its failures are the harness's."""
        self._ref_settle()  # its replies come in order: those awaited first
        self._ref_send(cmd, self.ref)
        return self._ref_recv(cmd, op, deadline_s, self.ref)

    def _ref_send(self, cmd, worker):
        try:
            worker.send(cmd, time.monotonic() + 600)
        except WorkerFailed as e:
            raise self._ref_failed(cmd, worker, e) from None

    def _ref_recv(self, cmd, op, deadline_s, worker):
        try:
            return worker.recv(time.monotonic() + deadline_s, op)
        except WorkerFailed as e:
            raise self._ref_failed(cmd, worker, e) from None

    def _ref_failed(self, cmd, worker, e):
        who = "reference worker" if worker is self.ref else "worker that times the reference"
        return HarnessError(f"the {who} failed ({cmd['op']}, {case_str(cmd.get('case', {}))}): {e.message}")

    def _ref_later(self, cmd, op, then=None, files=()):
        """A command to the reference worker whose reply is read later (_ref_settle), in order:
        it works on the other core while the timed pair runs. `then(reply)` acts on the reply;
        `files` are removed once it came. Without a core of its own it is answered now."""
        self._ref_send(cmd, self.ref)
        self.ref_pending.append((cmd, op, then, list(files)))
        if not self.beside:
            self._ref_settle()

    def _ref_settle(self, upto=None):
        """Read the reference worker's awaited replies, in order, up to and including `upto` (a
        command sent with _ref_later; None: all of them), acting on each; returns that reply."""
        while self.ref_pending:
            cmd, op, then, files = self.ref_pending.pop(0)
            try:
                reply = self._ref_recv(cmd, op, 600, self.ref)
            finally:
                for path in files:
                    _unlink(path)
            if then is not None:
                then(reply)
            if cmd is upto:
                return reply
        return None

    def _drop_pending(self):
        """After a measurement, however it ended: no reply of the reference worker is left unread
        (the next measurement talks to it), and no input file or arena is left behind (once the
        replies are in, no file is being written)."""
        for _, op, _, files in self.ref_pending:
            try:
                if self.ref.alive():
                    self.ref.recv(time.monotonic() + 600, op)
            except WorkerFailed:
                self.ref.kill()  # restarted by the next measurement (WorkerSet.reference_worker)
            for path in files:
                _unlink(path)
        self.ref_pending, self.ahead = [], None
        for arena in self.arenas.values():
            os.close(arena["fd"])
        self.arenas = {}
        for path in self.inputs_made:
            _unlink(path)

    # -- on a GPU: blocks of calls, each side's block timed by the parent's wall clock -------------

    def gpu_pair(self, case, n, verify, timed):
        """GPU: n calls on fresh inputs on both sides, the reference's block and the candidate's
        in a random order, each call's seed revealed only once the call before it is committed;
        one call of the candidate's verified (always when `verify`)."""
        self.last_id += 1
        self.block_id = self.last_id
        seeds = [secrets.randbits(31) for _ in range(n)]
        cand_first = secrets.randbits(1) if timed else 0
        out = {}
        for side in (("cand", "ref") if cand_first else ("ref", "cand")):
            out[side] = self.block(side, case, seeds)
        ref_win, refs = out["ref"]
        cand_win, cands = out["cand"]
        ref_ms = [r["ms"] for r in refs]
        self.bytes_per_call[case_str(case)] = refs[0]["bytes_per_call"]
        self.ref_peak = max([self.ref_peak] + [r["peak_bytes"] for r in refs])
        if timed:
            self._saw_call(case, "ref", sum(ref_ms) / n)
            self._saw_call(case, "cand", (cand_win - (ref_win - sum(ref_ms))) / n)
        for ref, cand in zip(refs, cands):
            self.check_commit(case, ref, cand)
        if verify or secrets.randbelow(10**6) < VERIFY_SHARE * 10**6:
            self.verify(case, secrets.randbelow(n), refs[0]["spec"], cands)
        return dict(ref_ms=[sum(ref_ms)], ref_win=[ref_win], cand_win=[cand_win], cand_first=[bool(cand_first)])

    def block(self, side, case, seeds):
        """GPU: one side's block, timed by the parent's wall clock from its first call's command
        to its last call's reply (each reply follows the call's digests, read back from the
        device). Returns (window ms, the calls' replies). The candidate's process is thawed for
        its block and frozen again right after, so that none of it runs while the reference's
        block is timed."""
        cmds = [{"id": self.block_id, "op": "run", "case": case, "index": i, "seed": seed} for i, seed in enumerate(seeds)]
        if side == "ref":
            c0 = self._clock(self.ref)
            replies = [self._ref_call(cmd, "ran") for cmd in cmds]
            return self._clock(self.ref) - c0, replies
        self.cand.thaw()
        c0 = self._clock(self.cand)
        replies = []
        for cmd in cmds:  # a call's seed leaves only once the call before it is committed
            self.cand.send(cmd, self.deadline)
            replies.append(self.cand.recv(self.deadline, "ran"))
        window = self._clock(self.cand) - c0
        self.cand.freeze(self.deadline)
        if any(r["id"] != self.block_id or r["index"] != i for i, r in enumerate(replies)):
            raise _Outcome("rejected", "the worker broke the measurement protocol (call ids)")
        return window, replies

    def _clock(self, worker):
        """The parent's clock of a worker: on CPU its sandbox's CPU time, on a GPU the wall clock."""
        return worker.cpu_ms() if self.device == "cpu" else time.monotonic() * 1e3

    # -- the checks ----------------------------------------------------------------------------

    def check_spec(self, case, ref_spec, spec):
        """A call's outputs as the candidate's worker described them (a checked window), against
        the reference's: the count, and each a plain contiguous tensor of the reference's shape,
        device and dtype (or a dtype the task allows: its original's checker casts)."""
        where = case_str(case)
        bad = next((s for s in spec if not (s["plain"] and s.get("contiguous"))), None)
        if bad is not None:
            raise _Outcome("incorrect", f"{where}: a call returned {_describe(spec)}; expected {_describe(ref_spec)}")
        if len(spec) != len(ref_spec):
            raise _Outcome("incorrect", f"{where}: expected {len(ref_spec)} output tensor(s), got {_describe(spec)}")
        for i, (got, exp) in enumerate(zip(spec, ref_spec)):
            for field in ("shape", "device"):
                if got[field] != exp[field]:
                    raise _Outcome("incorrect", f"{where}: output[{i}] {field} {got[field]}, expected {exp[field]}")
            if got["dtype"] != exp["dtype"] and got["dtype"] not in self.allowed_dtypes:
                allowed = sorted({exp["dtype"]} | self.allowed_dtypes)
                raise _Outcome("incorrect", f"{where}: output[{i}] dtype {got['dtype'].removeprefix('torch.')}, expected "
                                            + " or ".join(d.removeprefix("torch.") for d in allowed))

    def check_commit(self, case, ref, cand):
        """GPU: a call's commitment against the reference's for the same seed: its outputs
        described and digested, and its inputs' digests equal to the reference worker's inputs of
        that seed (made the same way on the same kind of device): any write into them shows."""
        where = case_str(case)
        self.check_spec(case, ref["spec"], cand["spec"])
        digests = cand["out_digests"]
        if digests is None or len(digests) != len(ref["spec"]) or not all(HEX_DIGEST.fullmatch(d) for d in digests):
            raise _Outcome("rejected", "the worker broke the measurement protocol (digests)")
        if cand["in_digests"] != ref["in_digests"]:
            raise _Outcome("incorrect", f"{where}: the candidate modified its input tensors")

    def _compare_later(self, case, differ):
        """CPU: the calls of a block whose candidate outputs are not byte for byte the twin's,
        judged by the reference worker with the task's own check against the twin's outputs of
        the same call (Worker.compare), on the other core while the next block is timed; its
        verdict is read before that block's inputs (_ref_settle), so a wrong answer still ends
        the measurement. `differ`: [(the candidate's [(dtype, bytes)], the twin's)] per call."""
        t0 = time.perf_counter()
        key = case_str(case)
        payload = b"".join(data for cand, ref in differ for data in [d for _, d in cand] + [d for _, d in ref])
        _room_for(self.dirs["handover"], len(payload))
        path = os.path.join(self.dirs["handover"], f"out-{self.block_id}-{new_token()}.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        short = lambda got: [d.removeprefix("torch.") for d, _ in got]  # noqa: E731
        cmd = {"id": self.block_id, "op": "compare", "path": path, "case": case,
               "shapes": [spec["shape"] for spec in self.ref_specs[key]], "container": self.ref_container[key],
               "calls": [{"cand": short(cand), "ref": short(ref)} for cand, ref in differ]}
        try:
            self._ref_later(cmd, "checked", then=self._checked, files=[path])
        except HarnessError:
            _unlink(path)
            raise
        finally:
            self.verify_s += time.perf_counter() - t0

    def verify(self, case, j, ref_spec, cands):
        """GPU: the candidate's call j, its outputs handed over as bytes and checked by the
        reference worker against the digests the candidate committed to when the call returned,
        then against the reference's outputs of that call."""
        t0 = time.perf_counter()
        try:
            cand_spec = cands[j]["spec"]
            dtypes = [c["dtype"] for c in cand_spec]
            # Sizes from the trusted side's shapes and the candidate's dtype of each output.
            n = sum(math.prod(r["shape"]) * DTYPE_BYTES[d] for r, d in zip(ref_spec, dtypes))
            _room_for(self.dirs["handover"], n)
            self.cand.thaw()
            self.cand.send({"id": self.block_id, "op": "handover", "index": j}, self.deadline)
            header = self.cand.recv(self.deadline, "bytes")
            if header["id"] != self.block_id:
                raise _Outcome("rejected", "the worker broke the measurement protocol (block ids)")
            if header["n"] != n:
                raise _Outcome("incorrect", f"{case_str(case)}: handed over {header['n']} bytes of output; the reference's take {n}")
            path = os.path.join(self.dirs["handover"], f"out-{self.block_id}-{new_token()}.bin")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(self.cand.recv_bytes(n, self.deadline))
            self.cand.freeze(self.deadline)
            cmd = {"id": self.block_id, "op": "check", "path": path, "index": j, "case": case,
                   "out_digests": cands[j]["out_digests"], "dtypes": dtypes}
            try:
                self._checked(self._ref_call(cmd, "checked"))
            finally:
                _unlink(path)
        finally:
            self.verify_s += time.perf_counter() - t0

    def _checked(self, verdict):
        self.ref_peak = max(self.ref_peak, verdict["peak_bytes"] or 0)
        if not verdict["ok"]:
            raise _Outcome("rejected" if verdict["forged"] else "incorrect", verdict["message"])

    # -- timing one case ----------------------------------------------------------------------------

    def time_case(self, case):
        budget, min_blocks, max_blocks = REPS[(self.device, self.quick)]
        # The verdict is the geometric mean over the cases: its noise is what the budget buys,
        # so the cases share it (a task with two CPU cases costs what a task with one does).
        budget /= len(self.timed_cases)
        # Warm up, by time (a GPU's clocks and caches; on CPU a fresh process grows its heap and
        # its caches), at least one pair: the timed windows seen here, on both sides, size the
        # blocks. Nothing of the correctness calls sizes anything (they are the candidate's to pad).
        warm_until = time.monotonic() + (0.0 if self.quick else WARM_S[self.device])
        while True:
            self.pair(case, self.block_pairs(case), verify=False)
            if time.monotonic() >= warm_until:
                break
        n = self.block_pairs(case)
        outside = dict(self.outside_ms)
        blocks, start = [], time.monotonic()
        spent, check_at = 2 * budget, 2 * budget  # both sides' windows: twice the budget per side
        while len(blocks) < max_blocks:
            elapsed = time.monotonic() - start
            if len(blocks) >= min_blocks and elapsed >= spent:
                if self.quick or elapsed >= STRETCH * spent:
                    break
                if elapsed >= check_at:  # noisy still? (a noise figure takes milliseconds: not every block)
                    if self._case_row(case, blocks, outside, n, final=False)["noise"] <= NOISE_TARGET:
                        break
                    check_at = elapsed + 0.1 * spent
            blocks.append(self.pair(case, n, verify=False, ahead=len(blocks) + 1 < max_blocks))
        row = self._case_row(case, blocks, outside, n)
        if row["disturbance"] > max(DISTURB_TOLERANCE, DISTURB_SIGMAS * row["disturbance_noise"]):
            raise _Disturbed(f"{case_str(case)}: the reference's windows right after the candidate's cost "
                             f"{row['disturbance']:.0%} more than after the gap between pairs, beyond the candidate's "
                             f"own (noise {row['disturbance_noise']:.1%}): work the candidate left to run outside "
                             "its windows")
        row["case"] = case
        row["block_pairs"] = n  # sized from the warm-up's timed windows alone (block_pairs)
        row["floor_ms"] = self.physical_floor(case, row)
        return row

    def _case_row(self, case, blocks, outside, n, final=True):
        # What the candidate's sandbox used between its windows, beyond what the twin's did
        # between its own (both are frozen there: normally nothing), is work it hid: charged.
        hidden = max(0.0, (self.outside_ms["cand"] - outside["cand"]) - (self.outside_ms["ref"] - outside["ref"]))
        windows = {key: [w for b in blocks for w in b[key]] for key in ("ref_ms", "ref_win", "cand_win", "cand_first")}
        return case_times(windows, 1 if self.device == "cpu" else n, hidden, case_str(case), disturbance_check=final)

    def block_pairs(self, case):
        """Calls per block. CPU: pairs of one-call windows per block (one of them checked in full
        per block), as many as take about BLOCK_MS of the slower side's time, at most
        BLOCK_CALLS, within a memory budget for their inputs. GPU: calls per block, as many as
        take about BLOCK_MS of the reference's compute (of the candidate's when it is much slower,
        so that its blocks stay short), at most BLOCK_CALLS; a much faster candidate still gets a
        quarter of BLOCK_MS of its own compute per block, so that the harness's jitter (a tenth of
        a millisecond or more per block on a GPU) stays small beside what it measures. Only the
        timed windows' times count, seen by the parent's clock (the candidate's) or the twin's own
        (the reference's): a candidate that pads its calls makes its blocks shorter, and more of
        its calls checked. Before any timed window of the case has been seen: one call."""
        if (case_str(case), "cand") not in self.call_ms:
            return 1  # the case's first timed pair: nothing seen yet, so the least block
        per_call_bytes = max(1, self.bytes_per_call.get(case_str(case), 1))
        ref_call = self.call_ms.get((case_str(case), "ref"), 1.0)
        cand_call = self.call_ms[(case_str(case), "cand")]
        if self.device == "cpu":
            call_ms = max(ref_call, cand_call)
        else:
            call_ms = cand_call if cand_call > 3 * ref_call else ref_call
            call_ms = min(call_ms, 4 * cand_call)
        return max(1, min(BLOCK_CALLS[self.device], BLOCK_BYTES[self.device] // per_call_bytes,
                          math.ceil(BLOCK_MS[self.device] / call_ms)))

    def physical_floor(self, case, row):
        """On a GPU: no kernel moves the task's unavoidable bytes faster than the memory allows."""
        if self.device != "cuda":
            return None
        min_bytes = self.min_bytes.get(case_str(case))
        floor_ms = physical_floor_ms(min_bytes, self.device_name, self.bandwidth) if min_bytes else None
        if floor_ms is not None:
            apply_floor(row, floor_ms, case_str(case), f"{min_bytes / 1e9:.2f} GB of unavoidable memory traffic")
        return floor_ms


def _copy_into(path, fd, offset, size):
    """CPU: a call's input file into an arena slot, by the kernel (the parent never reads it)."""
    src = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < size:
            n = os.copy_file_range(src, fd, size - done, done, offset + done)
            if n <= 0:
                raise HarnessError(f"an input file was shorter than its layout ({done} of {size} bytes)")
            done += n
    finally:
        os.close(src)


def apply_floor(row, floor_ms, where, why):
    """A time below the physical floor is impossible, but a fast honest kernel near the floor can
    come out below it by the measurement's noise alone. So the rule has a significance test: a
    time below the floor by more than FLOOR_SIGMAS standard errors is rejected; one below it
    within the noise is clamped to the floor (the fastest the kernel can be) and flagged."""
    ms = row["candidate_ms"]
    if ms >= floor_ms:
        return
    if math.log(floor_ms / ms) > FLOOR_SIGMAS * row["noise"] + math.log(1.02):
        raise _Outcome("rejected", f"{where}: {ms:.4f} ms is below the physical floor {floor_ms:.4f} ms of this "
                                   f"GPU ({why}) by more than the measurement's noise: impossible")
    row["candidate_ms"] = floor_ms
    row["speedup"] = row["reference_ms"] / floor_ms
    row["flags"].append(f"{where}: {ms:.4f} ms is below the physical floor {floor_ms:.4f} ms within the "
                        "measurement's noise: the floor stands as its time")


def case_times(windows, k, hidden_ms, where, disturbance_check=True):
    """A case's row from the parent's windows, the trusted side's figures only: `windows` holds
    per window the reference's compute (its own, trusted timer), the reference's window and the
    candidate's window (lists in step, the two windows of a pair on the same inputs, run one
    after the other; k calls per window), and `hidden_ms` the CPU the candidate used outside its
    windows beyond what the reference did.

    The reference's time per call is the lower quartile of its compute (QUANTILE: noise on a
    shared machine only ever adds time). The candidate's is that plus the median, over pairs,
    of its window less the reference's: the harness's share of a window (inputs, fingerprints,
    pipes: the same code on both sides) cancels within each pair, and so does the machine's
    drift, which on a shared CPU moves a window's cost by tens of percent over a few seconds.
    The side that runs second in a pair finds the inputs in the core's caches, which the first
    side brought there (on CPU fp8_quant's second side was about 5% faster): the order is drawn
    at random, so this only widens the spread of the differences, into two humps. So the
    candidate's difference is the mean of its medians over the two orders, where the order's
    share cancels (`cand_first`, per pair).
    The hidden CPU time is added whole, spread over the candidate's calls. The noise of the
    speedup is the standard error of its log, from a bootstrap over the pairs."""
    ref_win, cand_win, compute = windows["ref_win"], windows["cand_win"], windows["ref_ms"]
    m = len(ref_win)
    diff = [c - r for c, r in zip(cand_win, ref_win)]
    first = windows.get("cand_first") or [False] * m
    # With few pairs per order, a median of each would let one stall move it: one median then.
    split = min(sum(first), m - sum(first)) >= MIN_PER_ORDER

    def median_over_orders(picks):
        by_order = [[diff[i] for i in picks if first[i]], [diff[i] for i in picks if not first[i]]]
        if not (split and all(by_order)):
            return _quantile([diff[i] for i in picks], 0.5)
        return sum(_quantile(d, 0.5) for d in by_order) / 2

    def estimate(picks):
        r = max(_quantile([compute[i] for i in picks], QUANTILE), 1e-6)
        c = r + median_over_orders(picks) + hidden_ms / m
        return r / k, max(c, 0.02 * r) / k

    def disturbance(picks):
        """How much more the reference's window cost right after the candidate's (second in a pair
        it began) than first in a pair, beyond the same difference on the candidate's side, as a
        share of the reference's window: a difference in differences in which whatever the second
        place does to any window (the gap before it, what the first window left) cancels, and
        what remains is what the candidate's window left to run in the next one."""
        by = {(side, pos): [] for side in ("t", "c") for pos in (1, 2)}
        for i in picks:
            by[("c", 1) if first[i] else ("t", 1)].append(cand_win[i] if first[i] else ref_win[i])
            by[("t", 2) if first[i] else ("c", 2)].append(ref_win[i] if first[i] else cand_win[i])
        if not all(by.values()):
            return 0.0
        med = {key: _quantile(v, 0.5) for key, v in by.items()}
        did = (med[("t", 2)] - med[("t", 1)]) - (med[("c", 2)] - med[("c", 1)])
        return did / max(_quantile([ref_win[i] for i in picks], 0.5), 1e-9)

    reference_ms, candidate_ms = estimate(range(m))
    # Noise: a moving-block bootstrap over the pairs, in the order they were timed (blocks of about
    # the square root of their number): neighbouring pairs share the machine's moment, which an
    # independent resampling of pairs would count as independent evidence.
    rng = random.Random(m)  # a fixed draw: the same windows give the same noise figure
    length = max(1, round(math.sqrt(m)))
    draws = [_blocks(m, length, rng) for _ in range(200)]
    logs = [math.log(r / c) for r, c in (estimate(picks) for picks in draws)]
    noise = statistics.stdev(logs)
    check = split and disturbance_check  # (not while a case is still being timed: only its noise is asked then)
    disturbed = disturbance(range(m)) if check else 0.0
    disturbed_noise = statistics.stdev([disturbance(picks) for picks in draws[:100]]) if check else 0.0
    flags = []
    if hidden_ms > 0.05 * candidate_ms * m * k:
        flags.append(f"{where}: the candidate used {hidden_ms:.1f} ms of CPU outside its windows (while the "
                     "reference ran, or between calls): charged to its time")
    if candidate_ms <= 0.02 * reference_ms:
        flags.append(f"{where}: the candidate's time is below the resolution of the parent's clock; its "
                     "speedup is a lower bound")
    share = _quantile([w - c for w, c in zip(ref_win, compute)], 0.5)
    return dict(reference_ms=reference_ms, candidate_ms=candidate_ms, speedup=reference_ms / candidate_ms,
                noise=noise, reference_spread=_spread([c / k for c in compute]),
                candidate_spread=_spread([max(c + d, 1e-9) / k for c, d in zip(compute, diff)]),
                harness_ms=share / k, reps=m * k, windows=m, window_calls=k, hidden_ms=round(hidden_ms, 3), flags=flags,
                disturbance=disturbed, disturbance_noise=disturbed_noise)


def _blocks(m, length, rng):
    """A moving-block bootstrap draw of m indices: runs of `length` consecutive ones from random
    starts (wrapping around), as many as make up m."""
    picks = []
    while len(picks) < m:
        start = rng.randrange(m)
        picks += [(start + j) % m for j in range(length)]
    return picks[:m]


def peak_bandwidth(device_name):
    """PEAK_BANDWIDTH's figure for this GPU (its list is most specific name first), or None."""
    return next((bw for key, bw in PEAK_BANDWIDTH if key in device_name), None)


def physical_floor_ms(min_bytes, device_name, measured_bandwidth):
    """The least time in which a GPU can move `min_bytes`: at the larger of its datasheet peak
    (when known) and the copy bandwidth measured on it. None when neither is known."""
    bandwidth = max(peak_bandwidth(device_name) or 0.0, measured_bandwidth or 0.0)
    return min_bytes / bandwidth * 1e3 if bandwidth > 0 else None


def _room_for(folder, n):
    """A handover of n bytes must fit where it is written (in memory, under /dev/shm)."""
    st = os.statvfs(folder)
    if st.f_bavail * st.f_frsize < n + (16 << 20):
        raise HarnessError(f"{folder} has {st.f_bavail * st.f_frsize >> 20} MB free and a handover needs "
                           f"{n >> 20} MB: give the machine more shared memory (docker run --shm-size=16g) "
                           "or set GPU_FORECASTERS_EXCHANGE to a folder on a disk")


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _describe(spec):
    if not isinstance(spec, list):
        return repr(spec)[:80]
    parts = []
    for s in spec:
        if not isinstance(s, dict):
            parts.append(repr(s)[:40])
        elif not s.get("plain"):
            parts.append(f"{s.get('type')}, not a plain torch.Tensor")
        elif not s.get("contiguous"):
            parts.append(f"a non-contiguous tensor (shape {s.get('shape')})")
        else:
            parts.append(f"{s.get('dtype')} {s.get('shape')}")
    return "; ".join(parts) or "nothing"


def _gpu_driver_present():
    """Whether this machine has a GPU driver's device files (NVIDIA's, or ROCm's and WSL's, which
    torch.cuda also reaches); without one torch.cuda.is_available() is False, and importing torch
    to learn it costs a second of a CPU-only measurement."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg"))


def _device_name(device, gpu=None):
    if device == "cpu":
        import platform
        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    import torch
    return torch.cuda.get_device_name(gpu or 0)


def _quantile(xs, q):
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


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


# ---------------------------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------------------------

def format_table(m):
    """A measurement as the command line prints it. One word per quantity, the same as in the
    JSON: `noise` is one standard error of the speedup (of its log, from a bootstrap over the
    paired windows), and a speedup within two of them of 1.0 is flagged; `call spread` is how much
    the candidate's single calls vary (their interquartile range over their median), which many
    windows average away."""
    head = f"task {m.task}: {m.status}"
    if m.speedup:
        head += f", speedup {m.speedup:.3f}x (geomean over the cases), noise {m.noise:.1%}"
    lines = [head, f"device {m.device}; scale {m.scale}" + (" (cached)" if m.cached else ""),
             f"timer: {m.timer}", f"sandbox: {m.sandbox}"]
    if m.status != "ok":
        lines.append(f"reason: {m.message}")
    if m.cases:
        labels = [case_str({k: v for k, v in r["case"].items() if k != "cpu_only"}) + (" *" if r["case"].get("cpu_only") else "")
                  for r in m.cases]
        width = max(len("case"), *map(len, labels))
        lines.append(f"{'case':<{width}}  {'reference ms':>12}  {'candidate ms':>12}  {'speedup':>8}  {'noise':>6}  {'call spread':>11}")
        for label, r in zip(labels, m.cases):
            lines.append(f"{label:<{width}}  {r['reference_ms']:>12.4f}  {r['candidate_ms']:>12.4f}  {r['speedup']:>7.3f}x  "
                         f"{r['noise']:>6.1%}  {r['candidate_spread']:>11.1%}")
        if any(r["case"].get("cpu_only") for r in m.cases):
            lines.append("* a CPU-only shape, outside the original problem's")
        lines.append("noise: one standard error of the speedup (a bootstrap over the paired windows); "
                     "call spread: how much the candidate's single calls vary (interquartile range / median)")
        parts = [f"building the kernel {m.build_s:.2f} s" if m.build_s is not None else "",
                 f"judging outputs {m.verify_s:.2f} s" if m.verify_s is not None else ""]
        lines.append(f"import {m.import_s:.2f} s, correctness {m.check_s:.2f} s, timing {m.time_s:.2f} s"
                     + (f" (of these: {', '.join(p for p in parts if p)})" if any(parts) else ""))
        if m.reference_peak_gb:
            what = "GPU memory reserved" if "(GPU)" in m.timer else "resident memory"
            lines.append(f"reference worker's peak {what}: {m.reference_peak_gb:.2f} GiB (a candidate worker needs about as much)")
        if m.candidate_peak_gb:
            lines.append(f"candidate sandbox's peak host memory: {m.candidate_peak_gb:.2f} GiB")
    lines += [f"flag: {f}" for f in m.flags]
    if "Triton interpreter" in m.timer:
        lines.append("note: CPU times of interpreted kernels; they say nothing about GPU speed.")
    return "\n".join(lines)


def read_candidate(path):
    """The candidate's source, or a ValueError that says what is wrong with the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read candidate {path}: {e.strerror}; pass a Python file defining custom_kernel(data)") from None
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"candidate {path} is not UTF-8 text; pass a Python file defining custom_kernel(data)") from None
    if "\x00" in source:
        raise ValueError(f"candidate {path} holds NUL bytes (a binary file?); pass a Python file defining custom_kernel(data)")
    return source


@dataclasses.dataclass
class Args:
    """Measure a candidate kernel against a task's PyTorch reference.

    Exit status, as test runners have it: 0 when the verdict is `ok`; 1 when the candidate failed
    (compile_error, incorrect, runtime_error, timeout, crashed, rejected); 2 for a usage error
    (a bad flag, an unknown task, an unreadable file, no sandbox); 3 when the harness itself
    failed (the reference's side; not the candidate's fault, never cached)."""
    task: str = flag(None, "task name, e.g. cross_entropy (see tasks/); or a problem file (KernelBench's format, "
                     "or tasks/problem_file.py's); or kernelbench:LEVEL/NAME", required=True)
    kernelbench_dir: str | None = flag(None, "a KernelBench checkout, for --task kernelbench:LEVEL/NAME "
                                       "(default $KERNELBENCH_DIR)")
    candidate: str = flag(None, "path to a Python file defining custom_kernel(data) (for a KernelBench problem: "
                          "class ModelNew)", required=True)
    device: str | None = flag(None, "default: cuda when a GPU is visible, else cpu", choices=["cuda", "cpu"])
    scale: str | None = flag(None, "shapes to use: the paper's benchmark shapes (GPU default) or small CPU shapes "
                             "(CPU default)", choices=["benchmark", "cpu"])
    timeout: float | None = flag(None, "wall-clock limit for the candidate's worker in seconds (default 600 at "
                                 "benchmark scale, 240 at CPU scale)")
    memory_gb: float | None = flag(None, "host memory cap of the candidate's process tree (default 32 on GPU, 6 on CPU)")
    quick: bool = flag(False, "fewer timed calls (a faster, noisier figure)")
    no_cache: bool = flag(False, "measure even if this exact candidate was measured before")
    cache_dir: str | None = flag(None, f"result cache folder (default {DEFAULT_CACHE_DIR})")
    unsafe_no_sandbox: bool = flag(False, "run the candidate without bubblewrap: it can then read and write what you "
                                   "can, leave processes behind and forge later measurements; only for code you trust")
    baseline: str = flag("eager", "eager: the speedup over the reference as written (KernelBench's fast_p, the "
                         "paper's); compile: that, and beside it the speedup over torch.compile of the reference "
                         "(a second measurement; its first calls compile)", choices=["eager", "compile"])
    json: bool = flag(False, "print one JSON object instead of a table")


def build_parser():
    """The command line of Args (cli.py): one --flag per field, with its default and help."""
    return cli.parser(Args)


def main(argv=None):
    args = cli.parse(Args, argv, gpu=False)
    if args.kernelbench_dir:
        os.environ["KERNELBENCH_DIR"] = args.kernelbench_dir
    try:
        source = read_candidate(args.candidate)
        kw = dict(device=args.device, scale=args.scale, timeout_s=args.timeout, memory_gb=args.memory_gb,
                  use_cache=not args.no_cache, cache_dir=args.cache_dir, quick=args.quick,
                  unsafe_no_sandbox=args.unsafe_no_sandbox)
        m = measure(args.task, source, **kw)
        compiled = measure(args.task, source, baseline="compile", **kw) if args.baseline == "compile" else None
    except (ValueError, HarnessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 3
    for each in (m, compiled):  # the worker imports the source under its own name: say the user's
        if each is not None:
            each.message = each.message.replace(CANDIDATE_FILE, args.candidate)
    if args.json:
        print(json.dumps(m.to_dict() if compiled is None else {**m.to_dict(), "over_compile": compiled.to_dict()}))
    else:
        print(format_table(m))
        if compiled is not None:
            print("\nover torch.compile of the reference (--baseline compile):\n" + format_table(compiled))
    return 0 if all(each.status == "ok" for each in (m, compiled) if each is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
