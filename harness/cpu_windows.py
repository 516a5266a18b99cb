"""cpu_windows.py: the CPU protocol. One call a window, the candidate's beside its twin's.

On CPU the reference's timed side is the twin: a worker born with the candidate's, exactly as it
is (worker_set.WorkerSet.candidate_pair), that loaded the task's reference as a candidate's source.
Both are frozen from the moment they report ready, and run only inside their commands. For every
call of a case, with both frozen:

  1. the parent copies the call's inputs (a file the reference worker made) into a random slot
     of the case's arena, a file both sides map read-only (arena, copy_into); each side holds
     sets of input objects over every slot, built before any window (fresh): every call gets
     objects of its own;
  2. the twin's window and the candidate's, in a random order (window): the core's caches
     evicted, the side's clock read, the side thawed and told `g<case>,<slot>`, its call, its
     reply saying where the outputs are, the side frozen, its clock read again;
  3. after each window the parent reads the side's outputs from its frozen memory
     (read_outputs); the twin's are the expected ones. The candidate's are judged: byte for byte
     the twin's, or else the task's check against them, by the reference worker (judge_later),
     on another core while the next block is timed.

So no call sees another call's inputs before its own outputs are fixed, nothing of the harness is
left in a window for the candidate to do more cheaply, and nothing it says enters the verdict but
where its outputs are (a lie reads the wrong bytes, which the check rejects). Whatever its sandbox
used outside its windows, beyond what the twin's did, is charged to it (hidden_ms).
"""
import math
import os
import secrets
import time

from harness.measure_channel import WorkerFailed, parse_where
from harness.measure_worker import DTYPES, case_str
from harness.sides import DTYPE_BYTES, HarnessError, Outcome, Sides, describe, unlink
from harness.worker_set import new_token
from tasks import reference_candidate

# Each case's inputs are copied, call by call, into one of this many slots of its arena, and each
# side holds this many sets of input objects per slot not yet used (every call takes its own).
ARENA_SLOTS = 4
FRESH_PER_SLOT = 32
# A block is the pairs of one-call windows whose outputs one message to the reference worker
# judges: as many as take about BLOCK_MS of the slower side's time, at most BLOCK_CALLS, within a
# memory budget for their inputs (block_pairs).
BLOCK_BYTES, BLOCK_MS, BLOCK_CALLS = 64 << 20, 6.0, 8


class CpuWindows(Sides):
    """The twin's windows and the candidate's, for one measurement on CPU. `beside`: the reference
    worker has a core of its own, where it makes the next block's inputs and judges the last one's
    while a block is timed (else it works between blocks); `flush` evicts the timed core's caches
    (worker_set.CacheFlusher)."""

    device = "cpu"

    def __init__(self, task, ref, ready, cand, twin, dirs, timeout_s, baseline, beside, flush):
        super().__init__(task, ref, ready, cand, twin, dirs, timeout_s)
        self.baseline, self.beside, self.flush = baseline, beside, flush
        self.twin_clock = None  # where in the twin's memory its last timed call's time is (Worker.go)
        # Each side's clock at the end of its last command, and the CPU time it used between its
        # commands (it is frozen there: normally none).
        self.clock_end, self.outside_ms = {}, {"ref": 0.0, "cand": 0.0}
        self.arenas = {}  # by case: its arena (arena)
        self.ref_specs, self.ref_container = {}, {}  # by case: the reference's outputs, from the twin's checked windows
        self.checked_s = {}  # by case: the candidate's checked windows, the parent's wall clock (build_extra)
        # The reference worker's replies come in the order of its commands: each awaited one is
        # (command, op, what to do with the reply, files to remove once it came); `ahead` is the
        # next block, its inputs being made; `inputs_made` every file the measurement made.
        self.ref_pending, self.ahead, self.inputs_made, self.last_id = [], None, [], 0

    def start(self):
        """Both timed sides have booted; the twin loads the reference as a candidate's source,
        the way the candidate's is loaded (Worker.load): whatever the harness does around a
        candidate's call it does around the reference's. Its failures are the harness's."""
        super().start()
        try:
            self.twin.recv(time.monotonic() + 300, "ready")
            self.twin.freeze(time.monotonic() + 60)
        except WorkerFailed as e:
            raise HarnessError(f"the worker that times the reference did not start: {e.message}; {self.twin.log_tail()}") from None
        cmd = ({"op": "load", "source": reference_candidate(self.task), "twin": True} if self.baseline == "eager"
               else {"op": "load", "reference": self.baseline})
        self.twin_clock = self.command("ref", cmd, "loaded")["clock_at"]

    @property
    def twin(self):
        return self.timed_ref

    def check_call(self, case):
        """A correctness call: one checked window on either side, judged."""
        return self.calls(case, 1, timed=False)

    def timed_block(self, case, n, ahead=False):
        """A timed block of n pairs of windows, every call judged; `ahead`: another block of the
        case follows, whose inputs the reference worker makes meanwhile."""
        return self.calls(case, n, timed=True, ahead=ahead)

    def calls(self, case, n, timed, ahead=False):
        """n calls on fresh inputs, each call one window on either side (the twin's and the
        candidate's, in a random order; a checked window first when not `timed`). Returns the
        trusted side's figures only, per pair: dict(ref_ms: the twin's own time of its call
        (when `timed`), ref_win, cand_win: each window's CPU ms, cand_first)."""
        block, self.ahead = self.ahead, None
        if block is None or block["case"] != case or len(block["paths"]) != n:
            block = self.prepare(case, n)  # (one made for another shape goes unused: close)
        paths = block["paths"]
        self.block_id = block["id"]
        ref_ms, ref_win, cand_win, cand_first, differ = [], [], [], [], []
        try:
            if "layouts" not in block:
                self.ref_settle(block["cmd"])
            layouts = block["layouts"]
            if ahead and self.beside:  # the next block's inputs are made on the other core while this one is timed
                self.ahead = self.prepare(case, n)
            for j in range(n):
                # The call's inputs into a random slot of its arena, both sides frozen.
                arena = self.arena(case, layouts[j])
                slot = secrets.randbelow(ARENA_SLOTS)
                if not arena["left"][slot]:
                    self.fresh(arena)
                arena["left"][slot] -= 1
                copy_into(paths[j], arena["fd"], arena["bases"][slot], layouts[j]["size"])
                # The twin's checked window first: its outputs are the reference's shapes and dtypes.
                order = ("cand", "ref") if timed and secrets.randbits(1) else ("ref", "cand")
                cand_first.append(order[0] == "cand")
                got = {}
                for side in order:
                    if timed:
                        where, ms, window = self.window(side, arena["index"], slot)
                    else:
                        where, window = self.checked_window(side, case, arena["index"], slot)
                        ms = None
                    got[side] = self.read_outputs(side, case, where)
                    if side == "cand":
                        cand_win.append(window)
                    else:
                        ref_win.append(window)
                        if ms is not None:
                            ref_ms.append(ms)
                            self.saw_call(case, "ref", ms)
                if timed:  # the candidate's call: its window less the twin's share of a window
                    self.saw_call(case, "cand", cand_win[-1] - (ref_win[-1] - ref_ms[-1]))
                if got["cand"] != got["ref"]:  # not the reference's very bytes: the task's check decides
                    differ.append((got["cand"], got["ref"]))
            if differ:
                self.judge_later(case, differ)
        finally:
            for p in paths:
                unlink(p)
        return dict(ref_ms=ref_ms, ref_win=ref_win, cand_win=cand_win, cand_first=cand_first)

    # -- one window ------------------------------------------------------------------------------

    def window(self, side, case_index, slot):
        """One side's timed window: one call on the inputs in arena slot `slot` of case
        `case_index`. Returns (where its outputs are, the twin's own time of its call in ms or
        None for the candidate, the window's CPU ms).

        Why the candidate cannot move it. The side is frozen before the window and after it, so
        the window's time is all the CPU its sandbox used in between (its cgroup's clock, or its
        processes' without a cgroup): every thread and process the candidate ever started, reaped
        or not, and nothing of it runs outside its windows. Between the command and the reply its
        worker runs nothing of the harness's that a candidate could do more cheaply (Worker.go:
        its input objects were built before, no output is copied, fingerprinted or handed over),
        and the parent, not the worker, reads the outputs after the window (read_outputs)."""
        w = self.worker(side)
        self.flush()               # every window starts from the same cache state, whoever ran before
        c0 = self.clock_in(side)   # frozen: its clock stands still until it is thawed
        try:
            w.thaw()
            w.send_raw(b"g%d,%d\n" % (case_index, slot), self.deadline_of(side))
            where = w.recv_where(self.deadline_of(side))  # the call returned: where its outputs are
            w.freeze(self.deadline_of(side))              # until the kernel says every task stopped
        except WorkerFailed as e:
            if side == "ref":
                raise self.ref_failed({"op": "go"}, w, e) from None
            raise
        window = self.clock_out(side) - c0
        if side == "cand":
            return where, None, window
        raw = self.twin.read_memory(self.twin_clock or 0, 8)  # its call's own time, from its frozen memory
        if raw is None:
            raise HarnessError("the parent could not read the clock of the worker that times the reference")
        return where, int.from_bytes(raw, "little", signed=True) / 1e6, window

    def checked_window(self, side, case, case_index, slot):
        """One side's checked window (a correctness call): the call, and a full description of its
        outputs, checked against the reference's (the twin's is the reference's). Returns (where
        its outputs are, the window's CPU ms)."""
        self.flush()
        c0, w0 = self.clock_in(side), time.perf_counter()
        reply = self.command(side, {"op": "call", "case": case, "case_index": case_index, "slot": slot}, "called")
        window = self.clock_out(side) - c0
        key = case_str(case)
        if side == "cand":  # its first calls of a case may build (build_extra)
            self.checked_s.setdefault(key, []).append(time.perf_counter() - w0)
            self.check_spec(case, self.ref_specs[key], reply["specs"])
        else:
            self.ref_specs[key], self.ref_container[key] = reply["specs"], reply["container"]
            self.bytes_per_call[key] = reply["bytes_per_call"]
        if reply["where"] is None:
            if side == "ref":
                raise HarnessError("the worker that times the reference got outputs from it that are not tensors")
            raise Outcome("incorrect", f"{key}: a call returned {describe(reply['specs'])}")
        try:
            where = parse_where(reply["where"].encode())
        except ValueError as e:
            raise (HarnessError(str(e)) if side == "ref" else Outcome("rejected", f"the worker broke the measurement protocol: {e}"))
        return where, window

    def read_outputs(self, side, case, where):
        """A side's outputs of its last window, read by the parent from its frozen process: one
        bytes object per output, sized by the reference's shape and the output's dtype (the
        reference's, or one the task allows). The twin's are the expected outputs of the call."""
        spec, key = self.ref_specs[case_str(case)], case_str(case)
        if len(where) != len(spec):
            if side == "ref":
                raise HarnessError("the worker that times the reference got another number of outputs from it")
            raise Outcome("incorrect", f"{key}: expected {len(spec)} output tensor(s), got {len(where)}")
        got = []
        for i, ((address, code), exp) in enumerate(zip(where, spec)):
            dtype = "torch." + DTYPES[code] if 0 < code < len(DTYPES) else "another dtype"
            if dtype != exp["dtype"] and dtype not in self.allowed_dtypes:
                if side == "ref":
                    raise HarnessError("the worker that times the reference got an output of another dtype from it")
                raise Outcome("incorrect", f"{key}: output[{i}] dtype {dtype.removeprefix('torch.')}, "
                                           f"expected {exp['dtype'].removeprefix('torch.')}")
            data = self.worker(side).read_memory(address, math.prod(exp["shape"]) * DTYPE_BYTES[dtype])
            if data is None:
                if side == "ref":
                    raise HarnessError("the parent could not read the outputs of the worker that times the reference")
                raise Outcome("incorrect", f"{key}: output[{i}]'s bytes are not in the worker's memory where "
                                           "its reply said (an output must be a tensor of the reference's shape)")
            got.append((dtype, data))
        return got

    def clock_in(self, side):
        """A frozen side's clock before its window: what it used since its last window it used
        outside its windows (hidden_ms)."""
        c0 = self.worker(side).cpu_ms()
        if side in self.clock_end:
            self.outside_ms[side] += max(0.0, c0 - self.clock_end[side])
        return c0

    def clock_out(self, side):
        self.clock_end[side] = self.worker(side).cpu_ms()
        return self.clock_end[side]

    # -- the inputs: each case's arena, and input objects of every call's own --------------------

    def arena(self, case, layout):
        """The case's arena, made (and mapped by both sides, Worker.setup) the first time the case
        is seen, or again when a call's layout differs from the one its objects were built for: a
        file of ARENA_SLOTS slots in the folder both sandboxes see read-only, each slot at its own
        random 64-byte offset of a page (where a call's inputs sit against its outputs' addresses,
        their cache sets, varies from call to call instead of repeating). Each side builds
        FRESH_PER_SLOT sets of input objects over each slot (`left`: those not yet used)."""
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
            unlink(arena["path"])
        arena = self.arenas[key] = dict(index=index, path=path, fd=fd, layout=layout, bases=bases,
                                        left=[FRESH_PER_SLOT] * ARENA_SLOTS)
        self.inputs_made.append(path)
        cmd = {"op": "setup", "case_index": index, "arena": path, "layout": layout, "bases": bases,
               "fresh": FRESH_PER_SLOT}
        for side in ("ref", "cand"):
            self.command(side, cmd, "set")
        return arena

    def fresh(self, arena):
        """Both sides build new input objects for every slot of the arena (Worker.fresh), an
        untimed command between windows (its CPU is each side's time outside its windows)."""
        cmd = {"op": "fresh", "case_index": arena["index"], "per_slot": FRESH_PER_SLOT}
        for side in ("ref", "cand"):
            self.command(side, cmd, "freshened")
        arena["left"] = [FRESH_PER_SLOT] * ARENA_SLOTS

    # -- the reference worker, beside the timed pair: it makes inputs and judges outputs ----------

    def prepare(self, case, n):
        """A block of n calls: the reference worker makes and writes its inputs (ref_later)."""
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
        self.ref_later(cmd, "prepared", then=made)
        return block

    def judge_later(self, case, differ):
        """The calls of a block whose candidate outputs are not byte for byte the twin's, judged by
        the reference worker with the task's own check against the twin's outputs of the same call
        (Worker.compare), on the other core while the next block is timed; its verdict is read
        before that block's inputs (ref_settle), so a wrong answer still ends the measurement.
        `differ`: [(the candidate's [(dtype, bytes)], the twin's)] per call."""
        t0 = time.perf_counter()
        key = case_str(case)
        path = self.handover_file(b"".join(data for cand, ref in differ for data in [d for _, d in cand] + [d for _, d in ref]))
        short = lambda got: [d.removeprefix("torch.") for d, _ in got]  # noqa: E731
        cmd = {"id": self.block_id, "op": "compare", "path": path, "case": case,
               "shapes": [spec["shape"] for spec in self.ref_specs[key]], "container": self.ref_container[key],
               "calls": [{"cand": short(cand), "ref": short(ref)} for cand, ref in differ]}
        try:
            self.ref_later(cmd, "checked", then=self.judged, files=[path])
        except HarnessError:
            unlink(path)
            raise
        finally:
            self.verify_s += time.perf_counter() - t0

    def ref_later(self, cmd, op, then=None, files=()):
        """A command to the reference worker whose reply is read later (ref_settle), in order: it
        works on the other core while the timed pair runs. `then(reply)` acts on the reply;
        `files` are removed once it came. Without a core of its own it is answered now."""
        self.ref_send(cmd)
        self.ref_pending.append((cmd, op, then, list(files)))
        if not self.beside:
            self.ref_settle()

    def ref_settle(self, upto=None):
        """Read the reference worker's awaited replies, in order, up to and including `upto` (a
        command sent with ref_later; None: all of them), acting on each; returns that reply."""
        while self.ref_pending:
            cmd, op, then, files = self.ref_pending.pop(0)
            try:
                reply = self.ref_recv(cmd, op)
            finally:
                for path in files:
                    unlink(path)
            if then is not None:
                then(reply)
            if cmd is upto:
                return reply
        return None

    def settle(self):
        """After the last block: the reference worker's last verdicts."""
        self.ref_settle()

    def close(self):
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
                unlink(path)
        self.ref_pending, self.ahead = [], None
        for arena in self.arenas.values():
            os.close(arena["fd"])
        self.arenas = {}
        for path in self.inputs_made:
            unlink(path)

    # -- what the protocol asks of the windows: block sizes, time charged, time building ---------

    def block_pairs(self, case):
        """Pairs of one-call windows per block: as many as take about BLOCK_MS of the slower side's
        time, at most BLOCK_CALLS, within a memory budget for their inputs. Only the timed windows'
        times count (saw_call), seen by the parent's clock (the candidate's) or the twin's own (the
        reference's): a candidate that pads its calls makes its blocks shorter. Before any timed
        window of the case: one pair."""
        if (case_str(case), "cand") not in self.call_ms:
            return 1
        per_call_bytes = max(1, self.bytes_per_call.get(case_str(case), 1))
        call_ms = max(self.call_ms.get((case_str(case), "ref"), 1.0), self.call_ms[(case_str(case), "cand")])
        return max(1, min(BLOCK_CALLS, BLOCK_BYTES // per_call_bytes, math.ceil(BLOCK_MS / call_ms)))

    def calls_per_window(self, n):
        return 1

    def outside_now(self):
        """Each side's CPU time outside its windows so far."""
        return dict(self.outside_ms)

    def hidden_ms(self, since):
        """What the candidate's sandbox used outside its windows since `since` (outside_now),
        beyond what the twin's used outside its own: work it hid (both are frozen there, so
        normally nothing), charged to it (case_times)."""
        return max(0.0, (self.outside_ms["cand"] - since["cand"]) - (self.outside_ms["ref"] - since["ref"]))

    def build_extra(self):
        """Seconds the candidate's first call of each case took beyond its second (both correctness
        calls, on fresh inputs of the same shape): what a kernel that builds at its first call (a
        torch.compile, Triton's JIT for a new shape) spent building."""
        return sum(max(0.0, s[0] - s[1]) for s in self.checked_s.values() if len(s) >= 2)

    def physical_floor(self, case, row):
        return None  # CPU times of interpreted kernels have no physical floor to stand on


def copy_into(path, fd, offset, size):
    """A call's input file into an arena slot, by the kernel (the parent never reads it)."""
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
