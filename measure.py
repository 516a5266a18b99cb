"""measure.py: the ground truth. Time a candidate kernel against the task's PyTorch reference.

Every number in this project (the forecaster's labels, the GRPO rewards, the search's decisions)
stands on the speedups measured here, S = reference_time / candidate_time, and a kernel search
feeds this file code that an LLM wrote and that reinforcement learning rewards for anything that
gets through. So the harness treats a candidate as hostile, and nothing the verdict rests on comes
from the candidate's process (docs/MEASUREMENT.md: each property, the code that makes it true, the
attacks on it and their tests):

  parent (this file)       draws the seeds, owns the clock, reads the timed workers' outputs from
                           their frozen memory, decides the status, writes the cache. It never
                           imports, unpickles or runs candidate code, and reads the workers'
                           replies with a typed parser (harness/measure_channel.py).
  reference worker         trusted, never loads a candidate: makes the inputs, judges the
                           candidate's output bytes against the reference's for the same inputs
                           (on CPU the twin's), and on a GPU runs and times the reference
                           (harness/measure_worker.py).
  timing twin (CPU)        trusted: a fresh worker started with the candidate's, exactly as it is
                           (same role, sandbox, limits, address layout, hash seed, arenas), that
                           loads the task's reference as a candidate's source, the candidate's way
                           (tasks.reference_candidate). Its windows are the reference's side, its
                           outputs the expected ones: a process's speed follows its history and its
                           start, and the twin's are the candidate's (both allocate with jemalloc:
                           under glibc the allocation history alone set a process's speed).
  candidate worker         untrusted, in a sandbox (harness/measure_sandbox.py: bubblewrap,
                           seccomp, its own cgroup and host uid), frozen except inside its commands:
                           loads the candidate and runs it one call at a time. Nothing it says is
                           believed but where its outputs are (CPU) or its digests (GPU); its error
                           is its kernel's, in its own words, never a verdict of the harness's.

The protocol (`protocol`), in the order it happens:
1. Load (`load`). A fresh sandboxed worker imports the candidate, timed by the parent's clock. Only
   then does the parent draw seeds, so nothing computed at import can know an input.
2. Correctness (`correctness`). Two seeds of every timed case and of every check case (odd shapes,
   and inputs that expose precision loss), each run on both sides; the candidate's outputs must be
   plain contiguous tensors of the reference's dtype (or one the task allows), shape and device, its
   inputs unchanged, its values within the task's tolerance of the reference's.
3. Timing (`time_case`), case by case: the reference's side and the candidate's, each call on
   fresh inputs (input objects of its own), their windows one after the other in a random order,
   on one CPU core, every call judged. On CPU (harness/cpu_windows.py) a window is one call, both
   sides frozen outside their windows, the inputs copied into an arena while both are frozen, the
   outputs read by the parent from the frozen process and compared with the twin's; on a GPU
   (harness/gpu_blocks.py) a window is a block of calls, each call's seed revealed only once the
   call before it committed to its outputs and inputs by their digests, a picked call's bytes
   handed over and checked. No call sees another's inputs, no work can be deferred past a window,
   and garbage is caught.

   The clock is the parent's: on CPU the CPU time of the side's sandbox between its thaw and its
   freeze (every thread and process the candidate ever started, reaped or not), on a GPU the wall
   clock around the block. A case's row (harness/estimate.py, `case_times`): the reference's time
   per call is the lower quartile of its own timer (on CPU the twin's); the candidate's is that
   plus the median over pairs of its window less the reference's (per order within the pair), in
   which the harness's share of a window, the machine's drift and the order cancel; on CPU what
   the candidate's sandbox used outside its windows beyond the twin's is charged to it. Noise: a
   bootstrap over blocks of neighbouring pairs, and the process noise. The disturbance: the
   reference's windows right after the candidate's may not cost more than elsewhere (beyond the
   candidate's own difference), or the measurement is taken again, then rejected.
4. The verdict (`verdict`): speedup = geometric mean over the timed cases (the paper's reward),
   with its noise; a speedup within two standard errors of 1.0 says so. Plausibility: on a GPU, a
   time below the task's unavoidable memory traffic (`min_bytes`) at the device's bandwidth is
   impossible: rejected when it is below by more than the noise, clamped to the floor when within
   it; a speedup above CONFIRM_SPEEDUP is measured again in a fresh worker, and the slower figure
   stands (not cached when the two disagree beyond their noise: `measure`).

On CPU, Triton runs in its interpreter and the times are CPU time: they exercise the machinery and
say nothing about GPU speed.

Usage:
    python measure.py --task cross_entropy --candidate tasks/kernels/cross_entropy/fused_online.py --json
"""
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from data.records import cache_dir, write_atomic
from harness.cpu_windows import CpuWindows
from harness.estimate import case_times
from harness.gpu_blocks import GpuBlocks
from harness.measure_channel import WorkerFailed, printable
from harness.measure_sandbox import jemalloc, require_sandbox
from harness.measure_worker import CANDIDATE_FILE, case_str
from harness.sides import Disturbed, HarnessError, Outcome
from harness.worker_set import pin, workers
from runtime import cli
from runtime.cli import flag

HARNESS_VERSION = "5.0"  # 5.0: the twin loads the reference through the candidate's own load path, every call gets input objects of its own and is judged (on CPU against the twin's outputs), the timed core's caches evicted before every window, the disturbance check, the process noise, timers and AIO refused and no shared count to fill, the candidate's words never the harness's; 4.0: on CPU every call is a window of its own, the timed workers frozen between windows, their outputs read by the parent from their frozen memory, inputs copied into a mapped arena just before each call (nothing of the harness left in a window to make cheaper); exact output dtypes and the 1-norm check; 3.6: on CPU the workers allocate with jemalloc (under glibc a process's speed followed its allocation history); 3.5: the candidate's difference is a median per order within the pairs; 3.4: a side's CPU clock is read once its worker sleeps again (the wait watched bubblewrap before); 3.3: on CPU the twin shares the candidate's hash seed (3.2 figures scattered more); 3.2: on CPU the reference timed in a twin (older CPU figures leaned 5-10%); 3.1: GPU MODE's judging
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected")
DEFAULT_CACHE_DIR = cache_dir("measurements")
# Above this speedup a second, fresh measurement is taken and the slower of the two stands: an
# extraordinary claim should not rest on one run of a noisy machine.
CONFIRM_SPEEDUP = {"cuda": 10.0, "cpu": 10.0}
# Correctness calls before any timing: seeds of each timed case and of each check case. Every timed
# call is judged too (at least a warm-up pair and two blocks of them): a timed case gets at least
# KernelBench's five trials, and a kernel that is slow to call (interpreted Triton: a second a call)
# pays for the ones that time it, not for three more before.
TRIALS, CHECK_TRIALS = 2, 2
WARM_S = {"cuda": 0.025, "cpu": 0.15}
REPS = {  # (seconds per measurement and side, shared by its timed cases; min, max blocks per case), normal and --quick
    ("cuda", False): (2.0, 8, 80), ("cuda", True): (0.5, 5, 10),
    ("cpu", False): (0.7, 3, 600), ("cpu", True): (0.05, 2, 12),
}
# A case whose noise (the standard error of its log speedup) is still above NOISE_TARGET when its
# budget is spent is timed on, up to STRETCH times its budget (not with --quick): a kernel equal to
# its reference should come out within 5% of 1.0, three standard errors, on a quiet machine.
NOISE_TARGET = 0.015
STRETCH = 2.0
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
    # A compiled CPU kernel builds inside its sandbox within this too: load_inline and torch.compile
    # took 80 to 220 s on a loaded 2-core VM
    timeout_s = timeout_s or 600.0
    memory_gb = memory_gb or (32.0 if device == "cuda" else 6.0)
    sha = hashlib.sha256(source.encode()).hexdigest()
    device_name = _device_name(device, gpu)
    base = dict(task=task, device=device_name, scale=scale, baseline=baseline, source_sha256=sha, sandbox=sandbox,
                timer=("parent clock: wall time of each block, paired with the reference's (GPU)" if device == "cuda" else
                       "parent clock: CPU time of each sandbox per window, paired with the reference's "
                       f"(one core; Triton runs in its interpreter; not GPU times; allocator: {'jemalloc' if jemalloc() else 'glibc'})"))

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
    ws = workers(gpu)  # this thread's workers on that GPU (harness/worker_set.py)
    for attempt in (0, 1):
        try:
            cand, twin = ws.candidate_pair(task, device, sandboxed, memory_bytes)  # they boot while the reference does
        except WorkerFailed as e:  # no candidate code has run: the harness's failure (or the set was closed)
            raise HarnessError(f"the candidate's worker did not start: {e.message}") from None
        try:
            try:
                ref, ready = ws.reference_worker(task, device, sandboxed, baseline)
            except WorkerFailed as e:
                raise HarnessError(f"the reference worker did not start: {e.message}") from None
            # Both timed sides on one core. On CPU the reference worker makes inputs and judges
            # outputs on another core while they are timed, or, where the thread has one core,
            # between blocks; on a GPU it is the reference's timed side.
            for w in (cand, twin):
                if w is not None:
                    pin(w, ws.core)
            beside = twin is not None and ws.spare_cores != ws.core
            pin(ref, ws.spare_cores if beside else ws.core)
            cases = ready["cases"]
            timed, checks = ((cases["benchmark"], cases["check"]) if scale == "benchmark"
                             else (cases["cpu"], cases["cpu_check"]))
            if device == "cpu":
                sides = CpuWindows(task, ref, ready, cand, twin, ws.dirs, timeout_s, baseline, beside,
                                   flush=ws.cache_flusher().flush)
            else:
                sides = GpuBlocks(task, ref, ready, cand, ws.dirs, timeout_s, device_name)
            result = protocol(sides, source, timed, checks, quick)
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


# ---------------------------------------------------------------------------------------------
# The protocol: load the candidate, check it, time it case by case, judge it.
# ---------------------------------------------------------------------------------------------

def protocol(sides, source, timed_cases, check_cases, quick):
    """One candidate against the reference on `sides` (harness/cpu_windows.py or
    harness/gpu_blocks.py), in the order it happens. A dict of Measurement fields: whatever the
    candidate does, a verdict on it (its fate is the status); the trusted side's failure raises
    HarnessError."""
    try:
        sides.start()  # both sides booted (the harness's time: no candidate code has run yet)
        import_s = load(sides, source)
        check_s = correctness(sides, timed_cases, check_cases)
        timing = time.perf_counter()
        rows = [time_case(sides, case, len(timed_cases), quick) for case in timed_cases]
        sides.settle()  # the last blocks' verdicts
    except WorkerFailed as e:  # what the parent saw of the candidate's worker: its error, a limit, its end
        return dict(status=e.status, message=e.message, cacheable=e.cacheable)
    except Disturbed as o:
        return dict(status=o.status, message=printable(o.message), cacheable=False, disturbed=True)
    except Outcome as o:
        return dict(status=o.status, message=printable(o.message))
    except HarnessError:
        raise
    except Exception as e:  # noqa: BLE001 - a reply the typed parser let through and the parent then tripped on
        return dict(status="rejected", cacheable=False,
                    message=printable(f"the harness could not finish this measurement ({type(e).__name__}: {e}); not cached"))
    finally:
        sides.close()  # no reply of the reference worker left unread, no input file left behind
    return verdict(sides, rows, import_s, check_s, time.perf_counter() - timing)


def load(sides, source):
    """1. The candidate imports its source in its fresh worker; seconds, by the parent's clock (not
    the candidate's word). Seeds are drawn only after it."""
    t0 = time.perf_counter()
    sides.load(source)
    return time.perf_counter() - t0


def correctness(sides, timed_cases, check_cases):
    """2. Before any timing, every call checked in full: TRIALS seeds of every timed case,
    CHECK_TRIALS of every check case (odd shapes, and inputs that expose precision loss). Seconds."""
    t0 = time.perf_counter()
    for case in timed_cases + check_cases:
        for _ in range(TRIALS if case in timed_cases else CHECK_TRIALS):
            sides.check_call(case)
    return time.perf_counter() - t0


def time_case(sides, case, cases, quick):
    """3. One case's timed blocks, every call judged, until its share of the budget is spent (and,
    while its noise is above NOISE_TARGET, up to STRETCH times that); its row (case_times), after
    the disturbance check and, on a GPU, the physical floor."""
    budget, min_blocks, max_blocks = REPS[(sides.device, quick)]
    # The verdict is the geometric mean over the cases: its noise is what the budget buys, so the
    # cases share it (a task with two CPU cases costs what a task with one does).
    budget /= cases
    # Warm up, by time (a GPU's clocks and caches; on CPU a fresh process grows its heap and its
    # caches), at least one pair: the timed windows seen here, on both sides, size the blocks.
    # Nothing of the correctness calls sizes anything (they are the candidate's to pad).
    warm_until = time.monotonic() + (0.0 if quick else WARM_S[sides.device])
    while True:
        sides.timed_block(case, sides.block_pairs(case))
        if time.monotonic() >= warm_until:
            break
    n = sides.block_pairs(case)
    outside = sides.outside_now()
    blocks, start = [], time.monotonic()
    spent, check_at = 2 * budget, 2 * budget  # both sides' windows: twice the budget per side
    while len(blocks) < max_blocks:
        elapsed = time.monotonic() - start
        if len(blocks) >= min_blocks and elapsed >= spent:
            if quick or elapsed >= STRETCH * spent:
                break
            if elapsed >= check_at:  # noisy still? (a noise figure takes milliseconds: not every block)
                if _case_row(sides, case, blocks, outside, n, final=False)["noise"] <= NOISE_TARGET:
                    break
                check_at = elapsed + 0.1 * spent
        blocks.append(sides.timed_block(case, n, ahead=len(blocks) + 1 < max_blocks))
    row = _case_row(sides, case, blocks, outside, n)
    if row["disturbance"] > max(DISTURB_TOLERANCE, DISTURB_SIGMAS * row["disturbance_noise"]):
        raise Disturbed(f"{case_str(case)}: the reference's windows right after the candidate's cost "
                        f"{row['disturbance']:.0%} more than after the gap between pairs, beyond the candidate's "
                        f"own (noise {row['disturbance_noise']:.1%}): work the candidate left to run outside "
                        "its windows")
    row["case"] = case
    row["block_pairs"] = n  # sized from the warm-up's timed windows alone (block_pairs)
    row["floor_ms"] = sides.physical_floor(case, row)
    return row


def _case_row(sides, case, blocks, outside, n, final=True):
    windows = {key: [w for b in blocks for w in b[key]] for key in ("ref_ms", "ref_win", "cand_win", "cand_first")}
    return case_times(windows, sides.calls_per_window(n), sides.hidden_ms(outside), case_str(case), disturbance_check=final)


def verdict(sides, rows, import_s, check_s, time_s):
    """4. The speedup, the geometric mean over the timed cases (the paper's reward), its noise, and
    what the measurement cost."""
    logs = [math.log(r["speedup"]) for r in rows]
    speedup = math.exp(sum(logs) / len(rows))
    # The windows' noise (each case's bootstrap), and the fresh pair of processes' own: a rerun
    # with new workers lands that far from this one even where the windows agree (PROCESS_NOISE)
    noise = math.hypot(math.sqrt(sum(r["noise"] ** 2 for r in rows)) / len(rows), PROCESS_NOISE[sides.device])
    within = abs(math.log(speedup)) <= 2 * noise
    flags = [f for r in rows for f in r["flags"]]
    if within:
        flags.append(f"{speedup:.3f}x is within two standard errors of 1.0 (noise {noise:.1%}): no speedup the measurement can tell")
    return dict(status="ok", speedup=speedup, noise=noise, within_noise=within, cases=rows, flags=flags,
                message=f"geomean speedup {speedup:.3f}x over {len(rows)} case(s)",
                import_s=round(import_s, 3), check_s=round(check_s, 3), build_s=round(import_s + sides.build_extra(), 3),
                time_s=round(time_s, 3), verify_s=round(sides.verify_s, 3), reference_peak_gb=round(sides.ref_peak / 2**30, 3),
                candidate_peak_gb=round(sides.cand.peak_bytes() / 2**30, 3))


# ---------------------------------------------------------------------------------------------
# The static screen, and what measure() asks of this machine.
# ---------------------------------------------------------------------------------------------

# A courtesy, not a defence (string building or importlib walks past any regex): it turns away
# early, with a clear reason the mutator LLM can read, what a kernel never needs.
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
    timeout: float | None = flag(None, "wall-clock limit for the candidate's worker in seconds, its build "
                                 "included (default 600)")
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
