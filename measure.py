"""measure.py: the ground truth. Time a candidate kernel against the task's PyTorch reference.

Every number in this project (the forecaster's labels, the GRPO rewards, the search's decisions)
stands on the speedups measured here, S = reference_time / candidate_time, and a kernel search
feeds this file code that an LLM wrote and that reinforcement learning rewards for anything that
gets through. So the harness treats a candidate as hostile, and puts the trust boundary between
processes, never inside one (docs/MEASUREMENT.md lists each attack, its defence and its test):

  parent (this file)       draws the seeds, picks which calls to verify, reads the clock that
                           bounds every timing, decides the status, writes the cache. It never
                           imports, unpickles or runs candidate code.
  reference worker         trusted, never loads a candidate: makes the inputs of a seed, runs and
                           times the reference, and checks the candidate's output bytes against
                           its own outputs for the same inputs (measure_worker.py).
  candidate worker         untrusted, in a bubblewrap sandbox (measure_sandbox.py): loads the
                           candidate, makes the same inputs, runs and times it, hands bytes over.

The measurement, one candidate:
1. Load. A fresh sandboxed worker imports the candidate. Only then does the parent draw seeds, so
   nothing computed at import can know an input.
2. Correctness. Two seeds of every timed case and one of every extra check case, each run on both
   sides; the candidate's outputs must be plain contiguous tensors of the reference's dtype, shape
   and device, its inputs unchanged, its values within the task's tolerance of the reference's.
3. Timing, case by case, in blocks of n calls on fresh seeds, reference and candidate blocks
   interleaved. After a block's calls return, the parent picks one call and two random keys; the
   worker answers with an integer fingerprint of that call's outputs (and inputs), which stops the
   parent's clock, then hands the bytes over; the reference worker checks them and their
   fingerprint. So timed calls are verified too, with no global state that differs between a
   checked call and a timed one, and work cannot be deferred past the clock.
4. The clock. Inside a worker, times come from CUDA events (GPU; L2 flushed before every call,
   end event right after the call) or the wall clock (CPU). The parent's monotonic clock around
   each whole block, less the harness's own share of a block (measured on the trusted reference
   side), is the authority: a candidate cannot appear faster than it allows.
5. Plausibility. On a GPU, a time below the task's unavoidable memory traffic (`min_bytes`) at the
   device's bandwidth is impossible and rejected; a speedup above CONFIRM_SPEEDUP (10x on a GPU,
   2x on CPU) is measured again in a fresh worker before it is reported.

speedup = geometric mean over the timed cases of median(reference_ms) / median(candidate_ms)
(the paper's reward). On CPU, Triton runs in its interpreter and the times are wall clock: they
exercise the machinery and say nothing about GPU speed.

Usage:
    python measure.py --task cross_entropy --candidate tasks/kernels/cross_entropy/fused_online.py --json
"""
import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from measure_sandbox import EXCHANGE, WorkerFailed, require_sandbox, workers
from measure_worker import case_str
from records import cache_dir, write_atomic

HARNESS_VERSION = "2.0"
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected")
DEFAULT_CACHE_DIR = cache_dir("measurements")
# Peak DRAM bandwidth (bytes/s) of GPUs we know; the physical bound uses the larger of this and
# the copy bandwidth the reference worker measured.
PEAK_BANDWIDTH = {"A100": 2.0e12, "H100": 3.35e12, "H200": 4.8e12, "B200": 8.0e12, "L40S": 0.864e12}
# Above this speedup a second, fresh measurement must agree. On CPU a measurement costs seconds
# and a heavily loaded machine can blind the parent's clock (docs/MEASUREMENT.md), so every claim
# of more than 2x is measured twice there; on a GPU only extraordinary ones.
CONFIRM_SPEEDUP = {"cuda": 10.0, "cpu": 2.0}
# The smallest excess of a candidate block over its paired reference block (in ms) that the
# parent's clock acts on: below it lies the noise of pipes and scheduling.
CLOCK_FLOOR_MS = {"cuda": 0.05, "cpu": 0.3}
CLOCK_FLOOR_REL = 0.1
# A case that claims to beat the reference is credited with at least 1 / PARENT_CLOCK_SLACK of
# what the parent's clock saw of its calls.
PARENT_CLOCK_SLACK = 2.0
# A timed block holds enough calls that the reference's compute in it (BLOCK_MS) stands well above
# the noise of the parent's clock, within a memory budget for the block's inputs and outputs.
BLOCK_BYTES = {"cuda": 4 << 30, "cpu": 64 << 20}
BLOCK_MS = {"cuda": 2.0, "cpu": 10.0}
BLOCK_CALLS = {"cuda": 10, "cpu": 16}
REPS = {  # (seconds per case and side, min blocks, max blocks), normal and --quick
    ("cuda", False): (2.0, 5, 20), ("cuda", True): (0.5, 3, 6),
    ("cpu", False): (1.0, 5, 10), ("cpu", True): (0.3, 4, 5),
}


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
    import_s: float | None = None     # importing the candidate
    check_s: float | None = None      # the correctness calls (Triton's JIT compiles in the first ones)
    time_s: float | None = None       # the timed blocks, both sides, verification included
    reference_peak_gb: float | None = None  # the trusted worker's peak memory (GPU memory on a GPU)
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
            return f"uses {what}: {m.group(0)!r} is not allowed in a candidate"
    return None


# ---------------------------------------------------------------------------------------------
# The measurement.
# ---------------------------------------------------------------------------------------------

def measure(task, source, *, device=None, gpu=None, scale=None, timeout_s=None, memory_gb=None,
            use_cache=True, cache_dir=None, quick=False, unsafe_no_sandbox=False):
    """Measure one candidate source against the task's reference. Never raises for a bad kernel:
    its fate is `Measurement.status`. Raises ValueError for bad usage (unknown task, no GPU, no
    sandbox: measure_sandbox.SandboxUnavailable) and HarnessError when the trusted side fails.

    device: "cuda" or "cpu" (default: cuda when available). gpu: on a GPU machine, which GPU the
    workers run on (its index among those this process sees; default: the first). Each thread that
    calls measure() has its own workers (measure_pool.py measures on several GPUs at once).
    scale: "benchmark" (the paper's shapes,
    default on GPU) or "cpu" (small shapes, default on CPU). quick: fewer timed calls.
    unsafe_no_sandbox: run the candidate's worker without bubblewrap (see the README).
    """
    from tasks import TASK_NAMES, get_task

    # The parent never imports the task module or, on CPU, torch: the workers do (and boot faster
    # for it), and the reference worker tells the parent what it needs to know of the task.
    if task not in TASK_NAMES:
        get_task(task)  # raises the ValueError that names the valid tasks
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
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
    if not unsafe_no_sandbox:
        require_sandbox()
    timeout_s = timeout_s or (600.0 if scale == "benchmark" else 240.0)
    memory_gb = memory_gb or (32.0 if device == "cuda" else 6.0)
    sha = hashlib.sha256(source.encode()).hexdigest()
    device_name = _device_name(device, gpu)
    sandbox = "none (--unsafe-no-sandbox)" if unsafe_no_sandbox else "bubblewrap"
    base = dict(task=task, device=device_name, scale=scale, source_sha256=sha, sandbox=sandbox,
                timer="cuda-events" if device == "cuda" else "cpu-time (Triton interpreter; not GPU times)")

    reason = screen_source(source)
    if reason:
        return Measurement(status="rejected", message=reason, **base)

    key = hashlib.sha256(json.dumps([task, sha, device_name, scale, sandbox, HARNESS_VERSION]).encode())
    cache_file = Path(cache_dir or DEFAULT_CACHE_DIR) / f"{key.hexdigest()[:32]}.json"
    if use_cache and cache_file.exists():
        try:
            return Measurement(**{**json.loads(cache_file.read_text()), "cached": True})
        except (ValueError, TypeError):
            pass  # an unreadable entry is measured again

    start = time.perf_counter()
    run = dict(task=task, source=source, device=device, gpu=gpu if device == "cuda" else None,
               device_name=device_name, scale=scale, timeout_s=timeout_s,
               memory_bytes=memory_gb * 2**30, quick=quick, sandboxed=not unsafe_no_sandbox)
    result = _measure_once(**run)
    confirm = CONFIRM_SPEEDUP[device]
    if result["status"] == "ok" and result["speedup"] > confirm:
        again = _measure_once(**run)  # fresh worker, fresh seeds
        if again["status"] != "ok" or not 0.5 < again["speedup"] / result["speedup"] < 2.0:
            result = dict(status="rejected", message=(
                f"a {result['speedup']:.1f}x speedup did not reproduce in a second, fresh measurement "
                f"({again['status']}" + (f", {again['speedup']:.1f}x)" if again.get("speedup") else ")")))
        else:
            if again["speedup"] < result["speedup"]:
                result = again
            result["flags"].append(f"a speedup above {confirm:g}x: confirmed by a second, fresh measurement")
    m = Measurement(**base, **result)
    m.wall_s = round(time.perf_counter() - start, 3)
    # Timeouts and crashes can depend on machine load and limits: measure those again next time.
    if use_cache and m.status not in ("timeout", "crashed"):
        write_atomic(cache_file, json.dumps(m.to_dict()))
    return m


def _measure_once(task, source, device, gpu, device_name, scale, timeout_s, memory_bytes, quick, sandboxed):
    """One measurement in a fresh candidate worker; a dict of Measurement fields."""
    ws = workers(gpu)  # this thread's workers on that GPU
    for attempt in (0, 1):
        cand = ws.candidate_worker(task, device, sandboxed, memory_bytes)  # boots while the reference does
        try:
            try:
                ref, ready = ws.reference_worker(task, device, sandboxed)
            except WorkerFailed as e:
                raise HarnessError(f"the reference worker did not start: {e.message}") from None
            return _Session(ref, ready, cand, device, device_name, scale, timeout_s, quick).run(source)
        except HarnessError:
            ws.drop_reference()  # restart the trusted side once: a transient failure must not stop a search
            if attempt:
                raise
        finally:
            cand.kill()


class _Session:
    """The protocol of one candidate measurement (see the module docstring)."""

    def __init__(self, ref, ready, cand, device, device_name, scale, timeout_s, quick):
        self.ref, self.cand, self.device, self.device_name, self.quick = ref, cand, device, device_name, quick
        cases = ready["cases"]
        self.timed_cases = cases["benchmark"] if scale == "benchmark" else cases["cpu"]
        self.check_cases = cases["check"] if scale == "benchmark" else cases["cpu_check"]
        self.min_bytes = dict(zip(map(case_str, cases["benchmark"]), ready["min_bytes"]))
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.bandwidth = ready.get("copy_bandwidth")
        self.block_id, self.bytes_per_call, self.call_ms, self.wall_s, self.ref_peak = 0, {}, {}, 0.0, 0
        self.files = tempfile.mkdtemp(dir=EXCHANGE, prefix="handover-")

    def run(self, source):
        try:
            self.cand.recv(time.monotonic() + 300, "ready")  # booting is the harness's time, not the candidate's
            self.deadline = time.monotonic() + self.timeout_s
            self.cand.send({"op": "load", "source": source})
            import_s = self.cand.recv(self.deadline, "loaded")["import_s"]
            t1 = time.perf_counter()
            # Seeds are drawn now, after the candidate was loaded.
            for case in self.timed_cases:
                for _ in range(2):
                    self.pair(case, 1, cand_first=secrets.randbits(1))
            for case in self.check_cases:
                self.pair(case, 1, cand_first=secrets.randbits(1))
            t2 = time.perf_counter()
            rows = [self.time_case(case) for case in self.timed_cases]
        except WorkerFailed as e:
            return dict(status=e.status, message=e.message)
        except _Outcome as o:
            return dict(status=o.status, message=o.message[:2000])
        finally:
            shutil.rmtree(self.files, ignore_errors=True)
        speedup = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
        return dict(status="ok", speedup=speedup, cases=rows, flags=[f for r in rows for f in r["flags"]],
                    message=f"geomean speedup {speedup:.3f}x over {len(rows)} case(s)",
                    import_s=round(import_s, 3), check_s=round(t2 - t1, 3),
                    time_s=round(time.perf_counter() - t2, 3), reference_peak_gb=round(self.ref_peak / 2**30, 3))

    # -- one pair of blocks: the same seeds on both sides, one call verified ---------------------

    def pair(self, case, n, cand_first):
        """Run n calls on fresh seeds on both sides; verify one call of the candidate's, picked
        after its calls ran and it committed to all of them. Returns (ref_ms, ref_window_ms,
        cand_ms, cand_window_ms)."""
        self.block_id += 1
        seeds = [secrets.randbits(31) for _ in range(n)]
        keys = dict(a=secrets.randbits(20) | 1, b=secrets.randbits(40))  # a * byte index stays within int64
        sides = ("cand", "ref") if cand_first else ("ref", "cand")
        res = {side: self.block(side, case, seeds, keys) for side in sides}
        ref_ms, ref_win, ref_commit = res["ref"]
        cand_ms, cand_win, commit = res["cand"]
        self.bytes_per_call[case_str(case)] = ref_commit["bytes_per_call"]
        # Per-call times of either side as the parent's clock sees them: they size the timed blocks.
        per_call = max(sum(ref_ms), cand_win - (ref_win - sum(ref_ms))) / n
        self.call_ms[case_str(case)] = min(per_call, self.call_ms.get(case_str(case), math.inf))
        self.verify(case, dict(keys, index=secrets.randbelow(n)), ref_commit["spec"], commit)
        return ref_ms, ref_win, cand_ms, cand_win

    def block(self, side, case, seeds, keys):
        """Block + commitment, timed by the parent's clock from the command to the commitment."""
        w = self.ref if side == "ref" else self.cand
        deadline = self.deadline if side == "cand" else time.monotonic() + 600
        cmd = {"id": self.block_id}
        try:
            t0, c0 = time.monotonic(), (w.cpu_ms() if self.device == "cpu" else 0.0)
            w.send({**cmd, "op": "block", "case": case, "seeds": seeds})
            ran = w.recv(deadline, "ran")
            w.send({**cmd, "op": "commit", **keys})
            commit = w.recv(deadline, "committed")
            # The parent's clock: wall time on a GPU; on CPU the kernel's account of the CPU time
            # the worker's whole process tree used (the workers' timers measure CPU time there).
            window_ms = (time.monotonic() - t0) * 1e3 if self.device == "cuda" else w.cpu_ms() - c0
            self.wall_s += time.monotonic() - t0
        except WorkerFailed as e:
            if side == "ref":
                raise HarnessError(f"the reference worker failed on {case_str(case)}: {e.message}") from None
            raise
        ms = ran.get("ms")
        if side == "cand" and (ran.get("id") != self.block_id or commit.get("id") != self.block_id
                               or not isinstance(ms, list) or len(ms) != len(seeds)
                               or not all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in ms)):
            raise _Outcome("rejected", "the worker broke the measurement protocol (ids or times)")
        commit["bytes_per_call"] = ran.get("bytes_per_call", 0)
        if side == "ref":
            self.ref_peak = max(self.ref_peak, commit.get("peak_bytes", 0))
        return [float(t) for t in ms], window_ms, commit

    def verify(self, case, pick, ref_spec, commit):
        """The candidate's picked outputs against the reference's: spec, then bytes (checked by
        the reference worker, with the fingerprint the candidate committed to)."""
        where = case_str(case)
        if commit.get("bad_spec") is not None:
            raise _Outcome("incorrect", f"{where}: a call returned {_describe(commit['bad_spec'])}")
        spec = commit.get("spec")
        if not isinstance(spec, list) or len(spec) != len(ref_spec):
            raise _Outcome("incorrect", f"{where}: expected {len(ref_spec)} output tensor(s), got {_describe(spec)}")
        for i, (got, exp) in enumerate(zip(spec, ref_spec)):
            for field in ("dtype", "shape", "device"):
                if not isinstance(got, dict) or got.get(field) != exp[field]:
                    value = got.get(field) if isinstance(got, dict) else got
                    raise _Outcome("incorrect", f"{where}: output[{i}] {field} {value}, expected {exp[field]}")
        digests = commit.get("out_digests")
        if not isinstance(digests, list) or pick["index"] >= len(digests):
            raise _Outcome("rejected", "the worker broke the measurement protocol (no fingerprint)")
        n = sum(s["nbytes"] for s in ref_spec)  # sizes come from the trusted side
        self.cand.send({"id": self.block_id, "op": "handover", **pick})
        header = self.cand.recv(self.deadline, "bytes")
        if header.get("n") != n:
            raise _Outcome("incorrect", f"{where}: handed over {header.get('n')} bytes of output; the reference's take {n}")
        path = os.path.join(self.files, f"out-{self.block_id}.bin")
        with open(path, "wb") as f:
            f.write(self.cand.recv_bytes(n, self.deadline))
        try:
            self.ref.send({"id": self.block_id, "op": "check", "path": path, "out_digest": digests[pick["index"]],
                           "in_digest": header.get("in_digest"), **pick})
            verdict = self.ref.recv(time.monotonic() + 600, "checked")
        except WorkerFailed as e:
            raise HarnessError(f"the reference worker failed checking {where}: {e.message}") from None
        finally:
            os.unlink(path)
        if not verdict["ok"]:
            raise _Outcome("rejected" if verdict.get("forged") else "incorrect", verdict["message"])

    # -- timing one case ----------------------------------------------------------------------------

    def time_case(self, case):
        budget, min_blocks, max_blocks = REPS[(self.device, self.quick)]
        per_call_bytes = max(1, self.bytes_per_call.get(case_str(case), 1))
        call_ms = max(1e-3, self.call_ms.get(case_str(case), 1.0))
        n = max(1, min(BLOCK_CALLS[self.device], BLOCK_BYTES[self.device] // per_call_bytes,
                       math.ceil(BLOCK_MS[self.device] / call_ms)))
        if self.device == "cuda":  # warm up by time (clocks, caches); on CPU the checks warmed up
            warm_until = time.monotonic() + 0.025
            while True:
                self.pair(case, n, cand_first=secrets.randbits(1))
                if time.monotonic() >= warm_until:
                    break
        ref_t, cand_t, ref_over, cand_over, ref_win, cand_sums = [], [], [], [], [], []
        start = self.wall_s
        while len(ref_over) < max_blocks and (len(ref_over) < min_blocks or self.wall_s - start < budget):
            ref_ms, r_win, cand_ms, c_win = self.pair(case, n, cand_first=len(ref_over) % 2)
            ref_t += ref_ms
            cand_t += cand_ms
            ref_over.append(r_win - sum(ref_ms))
            cand_over.append(c_win - sum(cand_ms))
            ref_win.append(r_win)
            cand_sums.append(sum(cand_ms))
        # The parent's clock. A block costs the harness (inputs, L2 flushes, fingerprint, pipes)
        # the same on both sides; what a candidate block costs beyond its paired reference block
        # is work the candidate's own timer did not see (another stream, a thread, a forged
        # clock). When that excess stands out of the clock's noise (three standard errors, at
        # least CLOCK_FLOOR_MS and CLOCK_FLOOR_REL of the reference's block), it is added to the
        # candidate's calls. Random delays do not help a forger: they raise the mean excess along
        # with its noise.
        excess = [c - r for c, r in zip(cand_over, ref_over)]
        mean = sum(excess) / len(excess)
        # The spread of a few blocks can come out small by chance: it is taken at least 10% of
        # the harness's own share of a reference block.
        sd = max(statistics.stdev(excess) if len(excess) > 1 else 0.0, 0.1 * _median(ref_over))
        se = sd / math.sqrt(len(excess))
        flags = []
        if mean > max(CLOCK_FLOOR_MS[self.device], CLOCK_FLOOR_REL * _median(ref_win), 3 * se):
            per_call = mean * len(excess) / len(cand_t)
            cand_t = [t + per_call for t in cand_t]
            flags.append(f"{case_str(case)}: the worker's timer missed {per_call:.3f} ms per call that the "
                         "parent's clock saw; added to the candidate's time")
        # A claimed speedup needs both clocks to agree. When the calls claim to beat the
        # reference, the candidate's time per call is at least what the parent's clock saw of it
        # (the median over blocks of the candidate's block less the harness's share, taken from
        # its paired reference block), whenever that is over twice the claim. A forged timer whose
        # excess hides in the noise of the test above (a heavily loaded machine blinds it) wins at
        # most that factor of 2, at any claim; an honest kernel's two clocks agree within the
        # noise (the median over blocks), so it is never touched.
        claimed = _median(cand_t)
        parent_ms = _median([(s + e) / n for s, e in zip(cand_sums, excess)])
        if claimed < _median(ref_t) and parent_ms > PARENT_CLOCK_SLACK * claimed:
            cand_t = [t + parent_ms - claimed for t in cand_t]
            flags.append(f"{case_str(case)}: the worker's timer claimed {claimed:.4f} ms per call, the parent's "
                         f"clock saw {parent_ms:.4f} ms; the parent's clock is taken")
        row = dict(case=case, reference_ms=_median(ref_t), candidate_ms=_median(cand_t),
                   reference_spread=_spread(ref_t), candidate_spread=_spread(cand_t), reps=len(cand_t),
                   block_calls=n, clock_excess_ms=round(mean, 4), flags=flags)
        if row["candidate_ms"] <= 0:
            raise _Outcome("rejected", f"{case_str(case)}: a timed call took no measurable time")
        row["speedup"] = row["reference_ms"] / row["candidate_ms"]
        self.physical_bound(case, row)
        return row

    def physical_bound(self, case, row):
        """On a GPU: no kernel moves the task's unavoidable bytes faster than the memory allows."""
        if self.device != "cuda":
            return
        min_bytes = self.min_bytes.get(case_str(case))
        floor_ms = physical_floor_ms(min_bytes, self.device_name, self.bandwidth) if min_bytes else None
        if floor_ms is not None:
            row["floor_ms"] = floor_ms
            if row["candidate_ms"] < floor_ms:
                raise _Outcome("rejected", f"{case_str(case)}: {row['candidate_ms']:.4f} ms is below the physical "
                                           f"floor {floor_ms:.4f} ms of this GPU ({min_bytes / 1e9:.2f} GB "
                                           "of unavoidable memory traffic): impossible")


def physical_floor_ms(min_bytes, device_name, measured_bandwidth):
    """The least time in which a GPU can move `min_bytes`: at the larger of its datasheet peak
    (when known) and the copy bandwidth measured on it. None when neither is known."""
    peak = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in device_name), 0.0)
    bandwidth = max(peak, measured_bandwidth or 0.0)
    return min_bytes / bandwidth * 1e3 if bandwidth > 0 else None


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


def _device_name(device, gpu=None):
    if device == "cpu":
        import platform
        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    import torch
    return torch.cuda.get_device_name(gpu or 0)


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
    lines = [f"task {m.task}: {m.status}" + (f", speedup {m.speedup:.3f}x (geomean)" if m.speedup else ""),
             f"device {m.device}; timer {m.timer}; scale {m.scale}; sandbox {m.sandbox}" + (" (cached)" if m.cached else "")]
    if m.status != "ok":
        lines.append(f"reason: {m.message}")
    if m.cases:
        lines.append(f"{'case':<40} {'reference ms':>13} {'candidate ms':>13} {'spread':>7} {'speedup':>8}")
        for r in m.cases:
            lines.append(f"{case_str(r['case']):<40} {r['reference_ms']:>13.4f} {r['candidate_ms']:>13.4f} "
                         f"{r['candidate_spread']:>7.1%} {r['speedup']:>7.3f}x")
        lines.append(f"import {m.import_s:.2f} s, correctness {m.check_s:.2f} s (JIT compile included), timing {m.time_s:.2f} s")
        if m.reference_peak_gb:
            what = "GPU memory reserved" if m.timer == "cuda-events" else "resident memory"
            lines.append(f"reference worker's peak {what}: {m.reference_peak_gb:.2f} GiB (a candidate worker needs about as much)")
    lines += [f"flag: {f}" for f in m.flags]
    if m.timer.startswith("cpu"):
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


def main(argv=None):
    parser = argparse.ArgumentParser(description="Measure a candidate kernel against a task's PyTorch reference.")
    parser.add_argument("--task", required=True, help="task name, e.g. cross_entropy (see tasks/)")
    parser.add_argument("--candidate", required=True, help="path to a Python file defining custom_kernel(data)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is visible, else cpu")
    parser.add_argument("--scale", choices=["benchmark", "cpu"],
                        help="shapes to use: the paper's benchmark shapes (GPU default) or small CPU shapes (CPU default)")
    parser.add_argument("--timeout", type=float, help="wall-clock limit for the candidate's worker in seconds "
                        "(default 600 at benchmark scale, 240 at CPU scale)")
    parser.add_argument("--memory-gb", type=float, help="host memory cap of the candidate's process tree (default 32 on GPU, 6 on CPU)")
    parser.add_argument("--quick", action="store_true", help="fewer timed calls (a faster, noisier figure)")
    parser.add_argument("--no-cache", action="store_true", help="measure even if this exact candidate was measured before")
    parser.add_argument("--cache-dir", help=f"result cache folder (default {DEFAULT_CACHE_DIR})")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="run the candidate without bubblewrap: it can then read and write what you can, "
                             "leave processes behind and forge later measurements; only for code you trust")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    try:
        source = read_candidate(args.candidate)
        m = measure(args.task, source, device=args.device, scale=args.scale, timeout_s=args.timeout,
                    memory_gb=args.memory_gb, use_cache=not args.no_cache, cache_dir=args.cache_dir,
                    quick=args.quick, unsafe_no_sandbox=args.unsafe_no_sandbox)
    except (ValueError, HarnessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 3
    print(json.dumps(m.to_dict()) if args.json else format_table(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
