"""gpu_blocks.py: the GPU protocol. Blocks of calls, each call committed before the next is revealed.

On a GPU the reference's timed side is the reference worker itself (its CUDA events), and a window
is a block of calls on either side, timed by the parent's wall clock from the block's first command
to its last reply: the reference's block and the candidate's, on the same seeds, in a random order.

  - Each call is revealed on its own (harness.measure_worker.Worker.run): the parent sends a
    call's seed only once the call before it replied with the BLAKE3 digests of its outputs and
    inputs, computed on the device (fingerprint.py). No call sees the next call's inputs, and no
    work can wait for them.
  - The candidate's process is thawed for its own block and frozen right after: none of it runs
    while the reference's block is timed.
  - A picked call's bytes (of every correctness block, of a random quarter of the timed ones,
    VERIFY_SHARE) are handed over after all its block's calls are committed, checked against the
    digest (no other bytes give it) and judged by the reference worker against its own outputs
    of the same seed; the inputs' digests, which the reference worker's inputs of that seed give
    too, show any write into them.
  - The physical floor: no kernel moves the task's unavoidable bytes faster than the memory
    allows (estimate.apply_floor).

What this leaves open (the inputs are made, the L2 flushed and the outputs digested in the
candidate's process, inside its block): docs/MEASUREMENT.md, What remains open.
"""
import math
import re
import secrets
import time

from harness.estimate import apply_floor, physical_floor_ms
from harness.measure_worker import case_str
from harness.sides import DTYPE_BYTES, Outcome, Sides, room_for, unlink

# A block is one window of calls whose compute (BLOCK_MS) stands well above the noise of the
# parent's wall clock, at most BLOCK_CALLS, within a memory budget for their inputs (block_pairs).
BLOCK_BYTES, BLOCK_MS, BLOCK_CALLS = 4 << 30, 20.0, 100
# The share of timed blocks whose picked call is handed over and checked in full (every
# correctness block is): a handover moves up to a gigabyte, so a random quarter, unknown to the
# candidate until its calls are committed.
VERIFY_SHARE = 0.25
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")  # a BLAKE3 digest as a GPU worker commits to it


class GpuBlocks(Sides):
    """The reference worker's blocks and the candidate's, for one measurement on a GPU."""

    device = "cuda"

    def __init__(self, task, ref, ready, cand, dirs, timeout_s, device_name):
        super().__init__(task, ref, ready, cand, ref, dirs, timeout_s)
        self.device_name, self.bandwidth = device_name, ready.get("copy_bandwidth")
        self.min_bytes = dict(zip(map(case_str, ready["cases"]["benchmark"]), ready["min_bytes"]))

    def check_call(self, case):
        """A correctness call: a block of one call on either side, verified in full."""
        return self.pair(case, 1, verify=True, timed=False)

    def timed_block(self, case, n, ahead=False):
        """A timed pair of blocks of n calls; one call of the candidate's verified with VERIFY_SHARE."""
        return self.pair(case, n, verify=False, timed=True)

    def pair(self, case, n, verify, timed):
        """n calls on fresh inputs on both sides, the reference's block and the candidate's in a
        random order; one call of the candidate's verified in full, picked after all n returned
        (always when `verify`, else with VERIFY_SHARE). Returns the trusted side's figures only:
        dict(ref_ms, ref_win, cand_win, cand_first), one figure each for the pair of blocks."""
        self.block_id += 1
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
            self.saw_call(case, "ref", sum(ref_ms) / n)
            self.saw_call(case, "cand", (cand_win - (ref_win - sum(ref_ms))) / n)
        for ref, cand in zip(refs, cands):
            self.check_commit(case, ref, cand)
        if verify or secrets.randbelow(10**6) < VERIFY_SHARE * 10**6:
            self.verify(case, secrets.randbelow(n), refs[0]["spec"], cands)
        return dict(ref_ms=[sum(ref_ms)], ref_win=[ref_win], cand_win=[cand_win], cand_first=[bool(cand_first)])

    def block(self, side, case, seeds):
        """One side's block, timed by the parent's wall clock from its first call's command to its
        last call's reply (each reply follows the call's digests, read back from the device).
        Returns (window ms, the calls' replies)."""
        cmds = [{"id": self.block_id, "op": "run", "case": case, "index": i, "seed": seed} for i, seed in enumerate(seeds)]
        if side == "ref":
            t0 = time.monotonic() * 1e3
            replies = []
            for cmd in cmds:
                self.ref_send(cmd)
                replies.append(self.ref_recv(cmd, "ran"))
            return time.monotonic() * 1e3 - t0, replies
        self.cand.thaw()
        t0 = time.monotonic() * 1e3
        replies = []
        for cmd in cmds:  # a call's seed leaves only once the call before it is committed
            self.cand.send(cmd, self.deadline)
            replies.append(self.cand.recv(self.deadline, "ran"))
        window = time.monotonic() * 1e3 - t0
        self.cand.freeze(self.deadline)
        if any(r["id"] != self.block_id or r["index"] != i for i, r in enumerate(replies)):
            raise Outcome("rejected", "the worker broke the measurement protocol (call ids)")
        return window, replies

    def check_commit(self, case, ref, cand):
        """A call's commitment against the reference's for the same seed: its outputs described
        and digested, and its inputs' digests equal to the reference worker's inputs of that seed
        (made the same way on the same kind of device): any write into them shows."""
        self.check_spec(case, ref["spec"], cand["spec"])
        digests = cand["out_digests"]
        if digests is None or len(digests) != len(ref["spec"]) or not all(HEX_DIGEST.fullmatch(d) for d in digests):
            raise Outcome("rejected", "the worker broke the measurement protocol (digests)")
        if cand["in_digests"] != ref["in_digests"]:
            raise Outcome("incorrect", f"{case_str(case)}: the candidate modified its input tensors")

    def verify(self, case, j, ref_spec, cands):
        """The candidate's call j, its outputs handed over as bytes and checked by the reference
        worker against the digests the candidate committed to when the call returned, then
        against the reference's outputs of that call."""
        t0 = time.perf_counter()
        try:
            dtypes = [c["dtype"] for c in cands[j]["spec"]]
            # Sizes from the trusted side's shapes and the candidate's dtype of each output.
            n = sum(math.prod(r["shape"]) * DTYPE_BYTES[d] for r, d in zip(ref_spec, dtypes))
            room_for(self.dirs["handover"], n)
            self.cand.thaw()
            self.cand.send({"id": self.block_id, "op": "handover", "index": j}, self.deadline)
            header = self.cand.recv(self.deadline, "bytes")
            if header["id"] != self.block_id:
                raise Outcome("rejected", "the worker broke the measurement protocol (block ids)")
            if header["n"] != n:
                raise Outcome("incorrect", f"{case_str(case)}: handed over {header['n']} bytes of output; the reference's take {n}")
            path = self.handover_file(self.cand.recv_bytes(n, self.deadline))
            self.cand.freeze(self.deadline)
            cmd = {"id": self.block_id, "op": "check", "path": path, "index": j, "case": case,
                   "out_digests": cands[j]["out_digests"], "dtypes": dtypes}
            try:
                self.ref_send(cmd)
                self.judged(self.ref_recv(cmd, "checked"))
            finally:
                unlink(path)
        finally:
            self.verify_s += time.perf_counter() - t0

    def block_pairs(self, case):
        """Calls per block: as many as take about BLOCK_MS of the reference's compute (of the
        candidate's when it is much slower, so that its blocks stay short), at most BLOCK_CALLS,
        within a memory budget for their inputs; a much faster candidate still gets a quarter of
        BLOCK_MS of its own compute per block, so that the harness's jitter (a tenth of a
        millisecond or more per block) stays small beside what it measures. Only the timed
        blocks' times count (saw_call): a candidate that pads its calls makes its blocks shorter,
        and more of its calls checked. Before any timed block of the case: one call."""
        if (case_str(case), "cand") not in self.call_ms:
            return 1
        per_call_bytes = max(1, self.bytes_per_call.get(case_str(case), 1))
        ref_call = self.call_ms.get((case_str(case), "ref"), 1.0)
        cand_call = self.call_ms[(case_str(case), "cand")]
        call_ms = cand_call if cand_call > 3 * ref_call else ref_call
        call_ms = min(call_ms, 4 * cand_call)
        return max(1, min(BLOCK_CALLS, BLOCK_BYTES // per_call_bytes, math.ceil(BLOCK_MS / call_ms)))

    def calls_per_window(self, n):
        return n  # a block of n calls is one window

    def outside_now(self):
        return None

    def hidden_ms(self, since):
        """The candidate is frozen outside its blocks and handovers, and the wall clock times the
        blocks: work it left queued on the GPU would show in the reference's block (disturbance)."""
        return 0.0

    def build_extra(self):
        return 0.0  # the blocks' calls are not timed one by one

    def settle(self):
        pass

    def close(self):
        pass

    def physical_floor(self, case, row):
        """No kernel moves the task's unavoidable bytes faster than the memory allows."""
        min_bytes = self.min_bytes.get(case_str(case))
        floor_ms = physical_floor_ms(min_bytes, self.device_name, self.bandwidth) if min_bytes else None
        if floor_ms is not None:
            apply_floor(row, floor_ms, case_str(case), f"{min_bytes / 1e9:.2f} GB of unavoidable memory traffic")
        return floor_ms
