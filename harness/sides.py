"""sides.py: the two sides of one measurement, and what the CPU and the GPU protocols share.

measure.py runs the protocol (load, correctness, timing, the verdict) on one of two objects, each
a Sides: CpuWindows (cpu_windows.py: one call a window, the twin's and the candidate's) or
GpuBlocks (gpu_blocks.py: blocks of calls, the reference worker's and the candidate's). What both
need lives here, once:

  - the verdict's words: `Outcome` (the candidate's fate, decided by the parent), `Disturbed` (a
    reference disturbed by the candidate's windows) and `HarnessError` (the trusted side failed:
    never the candidate's fault, never cached);
  - the workers: the candidate's, frozen except inside its commands and held to its deadline, and
    the reference worker, whose failures are the harness's;
  - the check of a call's outputs as its worker described them (`check_spec`), against the
    reference's, and the reference worker's verdict on output bytes (`judged`);
  - the least time per call each side's timed windows showed (`saw_call`), which alone sizes the
    blocks (`block_pairs`, each protocol's own): nothing the candidate does in its correctness
    calls or says about itself enters it.
"""
import math
import os
import time

from harness.measure_channel import WorkerFailed
from harness.measure_worker import case_str
from harness.worker_set import new_token

# Bytes per element of the dtypes an output may have (the reference's, or one its task allows):
# the parent sizes what it reads, or what a GPU worker hands over, from the shape and this table.
DTYPE_BYTES = {"torch.float64": 8, "torch.float32": 4, "torch.float16": 2, "torch.bfloat16": 2,
               "torch.float8_e4m3fn": 1, "torch.float8_e5m2": 1, "torch.float8_e4m3fnuz": 1,
               "torch.float8_e5m2fnuz": 1, "torch.int64": 8, "torch.int32": 4, "torch.int16": 2,
               "torch.int8": 1, "torch.uint8": 1, "torch.bool": 1}


class HarnessError(RuntimeError):
    """The trusted side failed (the reference worker died, ran out of memory, ...): never the
    candidate's fault, never cached."""


class Outcome(Exception):
    """The candidate's fate, decided by the parent."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class Disturbed(Outcome):
    """The reference's windows cost more right after the candidate's than elsewhere (case_times'
    disturbance): measured once more, then rejected, never cached."""

    def __init__(self, message):
        super().__init__("rejected", message)


class Sides:
    """The reference's timed side (`timed_ref`: on CPU the twin, on a GPU the reference worker
    itself) and the candidate's, for one measurement; `ref` is the reference worker, `ready` its
    account of the task (cases, the output dtypes it allows), `dirs` the set's exchange folders."""

    def __init__(self, task, ref, ready, cand, timed_ref, dirs, timeout_s):
        self.task, self.ref, self.cand, self.timed_ref, self.dirs = task, ref, cand, timed_ref, dirs
        # The output dtypes a task accepts besides the reference's (its original's checker casts).
        self.allowed_dtypes = {f"torch.{d}" for d in ready.get("allowed_dtypes") or ()}
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s  # the candidate's; set again when it loads
        self.call_ms, self.bytes_per_call = {}, {}    # by (case, side): the least time per call seen timed
        self.block_id = 0
        self.ref_peak = 0     # the reference worker's peak memory, from its replies
        self.verify_s = 0.0   # wall time spent judging outputs in full, within the budget's time

    # -- the candidate: booted, then frozen except inside its commands ------------------------------

    def start(self):
        """The candidate's worker has booted (its failure is the harness's: no candidate code has
        run yet); from now on it runs only inside its commands."""
        try:
            self.cand.recv(time.monotonic() + 300, "ready")
        except WorkerFailed as e:
            raise HarnessError(f"the candidate's worker did not start: {e.message}; {self.cand.log_tail()}") from None
        self.cand.freeze(time.monotonic() + 60)

    def load(self, source):
        """The candidate imports its source; its deadline (timeout_s) runs from here."""
        self.deadline = time.monotonic() + self.timeout_s
        self.command("cand", {"op": "load", "source": source}, "loaded")

    def worker(self, side):
        return self.timed_ref if side == "ref" else self.cand

    def deadline_of(self, side):
        return self.deadline if side == "cand" else time.monotonic() + 600

    def command(self, side, cmd, op):
        """An untimed command to the reference's timed side ("ref") or the candidate ("cand"),
        thawed for it and frozen again once it replied. The reference's side failing is the
        harness's failure."""
        w = self.worker(side)
        try:
            w.thaw()
            w.send(cmd, self.deadline_of(side))
            reply = w.recv(self.deadline_of(side), op)
            w.freeze(self.deadline_of(side))
            return reply
        except WorkerFailed as e:
            if side == "ref":
                raise self.ref_failed(cmd, w, e) from None
            raise

    # -- the reference worker: trusted, its failures the harness's ----------------------------------

    def ref_send(self, cmd):
        try:
            self.ref.send(cmd, time.monotonic() + 600)
        except WorkerFailed as e:
            raise self.ref_failed(cmd, self.ref, e) from None

    def ref_recv(self, cmd, op):
        try:
            return self.ref.recv(time.monotonic() + 600, op)
        except WorkerFailed as e:
            raise self.ref_failed(cmd, self.ref, e) from None

    def ref_failed(self, cmd, worker, e):
        who = "reference worker" if worker is self.ref else "worker that times the reference"
        return HarnessError(f"the {who} failed ({cmd['op']}, {case_str(cmd.get('case', {}))}): {e.message}")

    # -- the checks both protocols make --------------------------------------------------------------

    def check_spec(self, case, ref_spec, spec):
        """A call's outputs as the candidate's worker described them, against the reference's: the
        count, and each a plain contiguous tensor of the reference's shape, device and dtype (or a
        dtype the task allows: its original's checker casts)."""
        where = case_str(case)
        bad = next((s for s in spec if not (s["plain"] and s.get("contiguous"))), None)
        if bad is not None:
            raise Outcome("incorrect", f"{where}: a call returned {describe(spec)}; expected {describe(ref_spec)}")
        if len(spec) != len(ref_spec):
            raise Outcome("incorrect", f"{where}: expected {len(ref_spec)} output tensor(s), got {describe(spec)}")
        for i, (got, exp) in enumerate(zip(spec, ref_spec)):
            for field in ("shape", "device"):
                if got[field] != exp[field]:
                    raise Outcome("incorrect", f"{where}: output[{i}] {field} {got[field]}, expected {exp[field]}")
            if got["dtype"] != exp["dtype"] and got["dtype"] not in self.allowed_dtypes:
                allowed = sorted({exp["dtype"]} | self.allowed_dtypes)
                raise Outcome("incorrect", f"{where}: output[{i}] dtype {got['dtype'].removeprefix('torch.')}, expected "
                                           + " or ".join(d.removeprefix("torch.") for d in allowed))

    def judged(self, verdict):
        """The reference worker's verdict on a candidate's output bytes (Worker.compare, Worker.check)."""
        self.ref_peak = max(self.ref_peak, verdict["peak_bytes"] or 0)
        if not verdict["ok"]:
            raise Outcome("rejected" if verdict["forged"] else "incorrect", verdict["message"])

    def saw_call(self, case, side, ms):
        """One side's time per call in the timed windows, as the parent's clock (the candidate)
        or the reference's own timer saw it; the least seen sizes the blocks (block_pairs)."""
        key = (case_str(case), side)
        self.call_ms[key] = min(max(ms, 1e-3), self.call_ms.get(key, math.inf))

    def handover_file(self, data):
        """Output bytes written to a file of the exchange's handover folder, which the reference
        worker reads (and only reads); its path."""
        room_for(self.dirs["handover"], len(data))
        path = os.path.join(self.dirs["handover"], f"out-{self.block_id}-{new_token()}.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path


def room_for(folder, n):
    """A handover of n bytes must fit where it is written (in memory, under /dev/shm)."""
    st = os.statvfs(folder)
    if st.f_bavail * st.f_frsize < n + (16 << 20):
        raise HarnessError(f"{folder} has {st.f_bavail * st.f_frsize >> 20} MB free and a handover needs "
                           f"{n >> 20} MB: give the machine more shared memory (docker run --shm-size=16g) "
                           "or set GPU_FORECASTERS_EXCHANGE to a folder on a disk")


def unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def describe(spec):
    """A call's outputs, as its worker described them, in a verdict's words."""
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
