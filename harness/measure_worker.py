"""measure_worker.py: the program on each side of measure.py's trust boundary.

measure.py (the trusted parent) starts this file in two roles, and talks to it through
cpu_windows.py on CPU and gpu_blocks.py on a GPU:

  reference  trusted. Never loads candidate code. Makes the inputs (on CPU it writes each call's
             to a file; the parent copies it into the timed workers' arena), runs the task's
             PyTorch reference (on a GPU it times it), and gives the verdict on a candidate's
             output bytes (the task's own check, run here), inputs checked unchanged.
  candidate  untrusted, in its sandbox (measure_sandbox.py). Loads the candidate once and runs
             `custom_kernel` one call at a time. On CPU its twin, the reference's timed side, is
             a worker of this role too that loaded the reference instead (cpu_windows.py).

On CPU a window is one call (`go`): the command, the call, a reply that says where the outputs
are. The parent froze the process before and freezes it after; it reads the clock (the sandbox's
CPU time) and the outputs' bytes (/proc/<pid>/mem) while the process is frozen. So the
candidate's process does nothing of the harness in its window that it could do cheaper (no
inputs to map: `setup` built them over the arena, outside the windows; no copy, fingerprint or
handover of outputs; no timer but the twin's), nothing of it runs outside its windows, and
nothing it says enters the verdict but where its outputs are (a lie reads the wrong bytes).

On a GPU a window is a block of calls, the parent's wall clock around it; each call is revealed on
its own (`run`): its inputs are made here from a seed sent with it, and the reply commits to the
call's outputs and inputs by their BLAKE3 digests, computed on the device (fingerprint.py), before
the parent sends the next call's seed. The bytes of the call the parent picks afterwards are handed
over and checked against the digest. Here the harness's own work in a window (making the inputs,
the L2 flush, the digests) runs in the candidate's process: docs/MEASUREMENT.md says what that
leaves open.

Protocol: one JSON object per line, but a CPU timed window's command `g<case>,<slot>` and reply
(measure_channel.parse_where). Commands arrive on stdin; replies leave on a private copy of the
original stdout; the candidate's own prints go to stderr (the parent keeps a bounded tail). Raw
output bytes follow a {"op": "bytes", "n": N} line on the same channel (a GPU handover).
"""
import array
import json
import math
import os
import re
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root: tasks/ lives there
MAX_SOURCE = 1 << 20          # a kernel source larger than 1 MB is not a kernel
CANDIDATE_FILE = "candidate_kernel.py"  # the candidate's source, in the sandbox's private /tmp
FLUSH_BYTES = 256 * 2**20     # >= the L2 of any GPU we know: evicts it between calls


def case_str(case):
    """A case in a verdict's message; a shape the CPU needs outside the original problem's set
    (the task marks it `cpu_only`) says so, so that a failure there reads as what it is."""
    text = ",".join(f"{k}={v}" for k, v in case.items() if k != "cpu_only")
    return text + (" (a CPU-only shape, outside the original problem's)" if case.get("cpu_only") else "")


# ---------------------------------------------------------------------------------------------
# Pieces both roles share: tensors in a nested input or output, their fingerprint, the timers.
# ---------------------------------------------------------------------------------------------

def tensors_of(x):
    """The tensors of a (nested) input or output, in a fixed order."""
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in tensors_of(item)]
    if isinstance(x, dict):
        return [t for k in x for t in tensors_of(x[k])]
    return []


# What a kernel that needs a GPU raises when it runs on CPU: torch without a CUDA device (a CPU
# build, or a CUDA build with no driver), Triton with no GPU driver, Triton's interpreter meeting
# inline PTX, a CUDA extension's build, or the kernel's own refusal. Matched against the whole
# chain of the exception, only on CPU: on a GPU these are real failures and say so as they are.
NEEDS_GPU = [
    (r"inline_asm not supported in interpreter", "inline assembly (tl.inline_asm_elementwise), which Triton's CPU interpreter does not run"),
    (r"not compiled with CUDA|[Nn]o NVIDIA driver|No CUDA GPUs are available|CUDA driver initialization failed",
     "a CUDA device (torch.cuda or device='cuda'), and none is here"),
    (r"\b0 active drivers\b", "Triton's GPU driver (a launch outside the interpreter, or the GPU's properties)"),
    (r"CUDA_HOME|\bnvcc\b|cuda_runtime|with_cuda", "a CUDA extension compiled with nvcc"),
    (r"\bCUDA\b.{0,40}\b(required|not available|unavailable|needed)|\b(requires?|needs?) (a )?(CUDA|GPU)\b",
     "a CUDA GPU (the kernel says so)"),
]


def describe_error(e, device=None):
    """A kernel's exception in one line; a Triton API the installed Triton removed (block pointers,
    `tl.make_block_ptr` and `tl.advance`, are gone from recent Triton) is named as such, not left
    as the interpreter's or the compiler's bare error. On CPU, a kernel that needs a GPU (NEEDS_GPU)
    says that it cannot run here and why, so that the verdict is not read as a bug in it."""
    text = f"{type(e).__name__}: {e}"
    chain, x = [], e
    while x is not None and len(chain) < 8:
        chain.append(f"{type(x).__name__}: {x}")
        x = x.__cause__ or x.__context__
    for said in chain:
        gone = re.search(r"module '(triton(?:\.language)?)' has no attribute '(\w+)'", said)
        what = f"{gone.group(1)}.{gone.group(2)}" if gone else None
        if what is None and re.search(r"[Bb]lock pointers have been removed", said):
            what = "block pointers (tl.make_block_ptr, tl.advance; recent Triton has tensor descriptors instead)"
        if what:
            import triton
            return f"the kernel needs {what}, which the installed Triton {triton.__version__} removed: rewrite that part without it"
    if device == "cpu":
        for said in chain:
            for pattern, needs in NEEDS_GPU:
                if re.search(pattern, said):
                    first = said.strip().splitlines()[0] if said.strip() else said
                    return (f"cannot run on CPU: the kernel needs {needs} ({first[:160]}); "
                            "measure it on a GPU with --device cuda")
    return text


def bytes_of_call(inputs, outputs):
    """The bytes one call reads and writes at least: its input and output tensors."""
    return sum(t.numel() * t.element_size() for t in tensors_of(inputs) + tensors_of(outputs))


def spec_of(out):
    """What a returned object is, for the parent to compare with the reference's outputs."""
    import torch
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [{"type": type(t).__name__, "plain": type(t) is torch.Tensor,
             **({"dtype": str(t.dtype), "shape": list(t.shape), "device": t.device.type,
                 "nbytes": t.numel() * t.element_size(),
                 "contiguous": t.is_contiguous()}
                if isinstance(t, torch.Tensor) else {})} for t in items]


def shared_outputs(outs):
    """(i, j) for two calls of a block whose outputs share memory (a buffer handed back by every
    call), or None."""
    seen = {}
    for j, out in enumerate(outs):
        for t in tensors_of(out):
            if t.numel() == 0:
                continue
            key = (t.device.type, t.untyped_storage().data_ptr())
            if seen.get(key, j) != j:
                return seen[key], j
            seen.setdefault(key, j)
    return None


class CudaTimer:
    """CUDA events on the current stream: an L2 flush before each call, the end event recorded
    right after the call (no device-wide sync inside the timed region: that would add the host's
    return from the sync to every sample). Work a call leaves on other streams is not in its
    events; the device sync at the end of the block puts it in the parent's clock instead."""

    def __init__(self):
        import torch
        self.torch = torch
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def run(self, fn, inputs):
        torch = self.torch
        outs, events = [], []
        for data in inputs:
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            outs.append(fn(data))
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return outs, [s.elapsed_time(e) for s, e in events]


CUDA_GRID_LIMITS = (2**31 - 1, 65535, 65535)


def enforce_cuda_grid_limits():
    """Triton's interpreter runs any grid; a GPU refuses more than 65,535 programs on axes 1 and 2
    (2^31 - 1 on axis 0). On CPU the worker refuses them too, so that a kernel that would fail to
    launch on a GPU fails here, and says what to change."""
    from triton.runtime import interpreter
    original = interpreter.InterpreterBuilder.set_grid_dim

    def set_grid_dim(self, nx, ny, nz):
        for axis, (n, limit) in enumerate(zip((nx, ny, nz), CUDA_GRID_LIMITS)):
            if n > limit:
                raise ValueError(f"grid ({nx}, {ny}, {nz}): {n} programs on axis {axis}, above CUDA's "
                                 f"limit of {limit}; put the largest axis first")
        return original(self, nx, ny, nz)
    interpreter.InterpreterBuilder.set_grid_dim = set_grid_dim


def autotune_without_a_gpu():
    """`@triton.autotune` under the interpreter: Triton times each config with the GPU driver's
    benchmarker, and on CPU there is none ("0 active drivers"). Here every config scores the same
    without being run, so the autotuner takes the first one listed: a config its author offered,
    checked like any other, at no cost of interpreted trial runs. Timing configs under the
    interpreter would say nothing about which one a GPU prefers."""
    from triton.runtime import autotuner

    def same_for_all(kernel_call, quantiles=None):
        return [0.0, 0.0, 0.0] if quantiles else 0.0
    autotuner.Autotuner.do_bench = property(lambda self: same_for_all)


def patch_triton_when_imported():
    """The two patches above, applied as Triton is first imported, by whomever imports it (the
    candidate, usually). Importing Triton costs a quarter of a second of CPU, a tenth of a worker's
    boot, and most workers never use it: every reference worker and a plain-PyTorch candidate.
    (The patches serve the candidate's own kernels, in its own process: a candidate could undo
    them either way.)"""
    import importlib.abc

    class PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            # Every search for Triton (torch asks whether it is there without importing it) gets
            # the spec the other finders give, with the patches added to its loading.
            if name != "triton" or "triton" in sys.modules:
                return None
            spec = next((s for f in sys.meta_path if f is not self and hasattr(f, "find_spec")
                         for s in [f.find_spec(name, path, target)] if s is not None), None)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module):
                    run(module)
                    enforce_cuda_grid_limits()
                    autotune_without_a_gpu()
                spec.loader.exec_module = exec_module
            return spec
    if "triton" in sys.modules:
        enforce_cuda_grid_limits()
        autotune_without_a_gpu()
    else:
        sys.meta_path.insert(0, PatchOnImport())


def copy_bandwidth():
    """Bytes/s of a device-to-device copy (read + write), best of five: the measured bandwidth
    the parent's physical bound uses."""
    import torch
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    best = math.inf
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / best


# ---------------------------------------------------------------------------------------------
# The worker: set-up, then one command at a time.
# ---------------------------------------------------------------------------------------------

class Worker:
    def __init__(self, role, task_name, device, out, baseline="eager"):
        import torch

        from tasks import get_task
        self.role, self.device, self.out = role, device, out
        self.task_name, self.task = task_name, get_task(task_name)
        torch.backends.cuda.matmul.allow_tf32 = False  # one precision for both sides
        torch.backends.cudnn.allow_tf32 = False
        if device == "cpu":
            torch.set_num_threads(1)  # steadier times on a shared machine
            patch_triton_when_imported()
        # Whose per-call times the parent reads: the reference worker's, and on CPU the timing
        # twin's (a candidate worker that loaded the reference: load), never a candidate's.
        self.reports_times = role == "reference"
        self.fn = self.reference_fn(baseline) if role == "reference" else None
        # No mode differs between a checked call and a timed one (a kernel could tell them apart),
        # so no NaN-filled allocations for checks only: every call has fresh inputs, and output
        # elements a kernel leaves unwritten hold values of other inputs, which the check rejects.
        self.timer = CudaTimer() if device == "cuda" else None
        self.block = None  # (id, case, inputs, outputs) of the last block
        # CPU: arena path -> its mapping; case index -> per arena slot, the input objects not yet
        # used (each call takes its own: fresh); those used, kept until the next untimed command
        self.arenas, self.views, self.spent = {}, {}, []
        self.held = None  # CPU: the last window's outputs, alive until the parent has read them
        self.clock = array.array("q", [0])  # CPU: the last timed call's wall ns (go), where the parent reads it
        self.reply_fd = out.fileno() if hasattr(out, "name") else None  # a real file (tests pass a BytesIO)

    def reference_fn(self, baseline):
        """The reference as the timed side calls it: the task's reference as a candidate source
        (tasks.reference_candidate), imported the way a candidate is (import_kernel), so that
        whatever the harness does around a candidate's call (a KernelBench model built and called
        under no_grad) it does around the reference's too; or, for KernelBench's second baseline,
        the reference as torch.compile makes it (its first calls, the correctness calls, compile)."""
        if baseline == "compile":
            import torch
            return torch.compile(self.task.reference)
        from tasks import reference_candidate
        fn = self.import_kernel(reference_candidate(self.task_name))
        if isinstance(fn, dict):  # the task's own reference failed to import: the harness's failure
            raise RuntimeError(f"the task's reference did not load: {fn['message']}")
        return fn

    def send(self, obj, payload=b""):
        self.out.write(json.dumps(obj).encode() + b"\n")
        self.out.write(payload)  # apart: a gigabyte of output is not copied into the header
        self.out.flush()

    # -- commands ------------------------------------------------------------------------------

    def load(self, cmd):
        """Load the kernel the parent sent (import_kernel). The parent times the import itself: no
        figure of a verdict comes from the candidate's process. The timing twin loads the task's
        reference the same way (`twin`: it then reports where its calls' times are), or for the
        compile baseline the compiled reference (`reference`)."""
        if cmd.get("reference"):
            self.fn, self.reports_times = self.reference_fn(cmd["reference"]), True
            return {"op": "loaded", "clock_at": self.clock.buffer_info()[0]}
        fn = self.import_kernel(cmd["source"])
        if isinstance(fn, dict):
            return fn
        self.fn = fn
        if cmd.get("twin"):
            self.reports_times = True
            return {"op": "loaded", "clock_at": self.clock.buffer_info()[0]}  # where its calls' times are
        return {"op": "loaded"}

    def import_kernel(self, source):
        """The callable of a kernel's source, imported from a real file in this worker's private
        /tmp (@triton.jit reads its function's source from the file): its `custom_kernel`, or what
        the task builds from the module (a KernelBench task builds ModelNew); or an error reply."""
        import importlib.util
        if len(source) > MAX_SOURCE:
            return {"op": "error", "error": "compile_error", "message": "candidate source over 1 MB"}
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), CANDIDATE_FILE)
        with open(path, "w") as f:
            f.write(source)
        # GPU MODE's template imports `task` (input_t, output_t): its stand-in is on the path.
        shim = os.path.join(ROOT, "tasks", "gpumode_shim")
        if shim not in sys.path:
            sys.path.insert(0, shim)
        try:
            spec = importlib.util.spec_from_file_location("candidate_kernel", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            entry = getattr(self.task, "entry_point", None)  # a KernelBench task builds ModelNew
            fn = entry(module, self.device) if entry else getattr(module, "custom_kernel", None)
        except BaseException as e:  # noqa: BLE001 - any failure to import (sys.exit too) is the candidate's compile error
            return {"op": "error", "error": "compile_error", "message": describe_error(e, self.device)}
        if fn is None:
            return {"op": "error", "error": "compile_error", "message": "the candidate does not define custom_kernel(data)"}
        if not callable(fn):
            return {"op": "error", "error": "compile_error", "message": "custom_kernel is not callable"}
        return fn

    def prepare(self, cmd):
        """Reference role, on CPU: make the inputs of every seed of a block and write each call's,
        raw, to its own file (`paths`, in a folder only this worker may write), its tensors one
        after the other, 64-byte aligned: the same layout for every call of a case. The parent
        copies a call's file into the arena the timed workers map read-only (setup) only while
        they are frozen, just before that call's window: the inputs they get are the trusted
        side's, they cannot change them, and no call's inputs exist for them before its window."""
        collect_between_calls()
        layouts = []
        for seed, path in zip(cmd["seeds"], cmd["paths"]):
            data = self.task.generate_input(cmd["case"], seed, device="cpu")
            found, tensors, pos = [], [], 0
            call = skeleton(data, found)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                for t in found:
                    raw = raw_bytes(t).numpy()
                    pad = -raw.nbytes % 64  # 64-byte aligned: every dtype views cleanly
                    tensors.append([pos, raw.nbytes, str(t.dtype).removeprefix("torch."), list(t.shape)])
                    f.write(memoryview(raw))
                    f.write(bytes(pad))
                    pos += raw.nbytes + pad
            layouts.append({"calls": [call], "tensors": tensors, "size": pos})
        return {"op": "prepared", "id": cmd["id"], "layouts": layouts, "peak_bytes": peak_memory_bytes(self.device)}

    # -- CPU: the arena and the two kinds of window ----------------------------------------------

    def setup(self, cmd):
        """CPU, untimed: map a case's arena (a file the parent writes, read-only here) once, and
        build `fresh` sets of the case's input objects over each of its slots now, so that a
        window holds nothing of the harness but reading its command, the call and its reply."""
        mm = self.arenas.get(cmd["arena"])
        if mm is None:
            mm = self.arenas[cmd["arena"]] = map_file(cmd["arena"])
        self.views[cmd["case_index"]] = {"mm": mm, "layout": cmd["layout"], "bases": cmd["bases"],
                                         "slots": [[] for _ in cmd["bases"]]}
        return self.fresh({"case_index": cmd["case_index"], "per_slot": cmd["fresh"]}, "set")

    def fresh(self, cmd, op="freshened"):
        """CPU, untimed: each arena slot of a case topped up to `per_slot` sets of input objects
        not yet used. Every call takes a set of its own (new tensors, tuples and dicts over the
        slot's bytes), as the original harnesses hand each call objects of its own: a kernel may
        keep what it derived from its inputs on them (a dict of weights given a cache), and the
        next call must not find it there. Building them here keeps it out of the windows; the
        sets the last calls used are let go here too, not in a window."""
        case = self.views[cmd["case_index"]]
        for base, left in zip(case["bases"], case["slots"]):
            while len(left) < cmd["per_slot"]:
                left.append(views(case["mm"], case["layout"], base)[0])
        self.spent = []
        collect_between_calls()
        return {"op": op}

    def _take(self, case_index, slot):
        """A call's own input objects (fresh); kept, once used, until the next untimed command."""
        data = self.views[case_index]["slots"][slot].pop()
        self.spent.append(data)
        return data

    def call(self, cmd):
        """CPU: a checked window (the correctness calls): the call on the inputs in arena slot
        `slot` of case `case_index`, and a full description of its outputs, which the parent
        compares with the reference's before it reads their bytes (spec_of)."""
        self.held = None
        data = self._take(cmd["case_index"], cmd["slot"])
        try:
            out = self.fn(data)
        except BaseException as e:  # noqa: BLE001 - any failure inside the kernel (sys.exit too) is its runtime error
            return {"op": "error", "error": "runtime_error", "message": f"{case_str(cmd['case'])}: {describe_error(e, self.device)}"}
        self.held = out
        reply = {"op": "called", "specs": spec_of(out), "container": type(out).__name__}
        try:
            reply["where"] = where(out).decode()
        except (AttributeError, TypeError, RuntimeError):
            reply["where"] = None  # not tensors: the parent names what came back
        if self.reports_times:
            reply["bytes_per_call"] = bytes_of_call(data, out)
        return reply

    def go(self, line):
        """CPU: a timed window, `g<case index>,<slot>`: the call, and where its outputs are (their
        addresses and dtypes), nothing else. The parent froze this process before the window and
        freezes it again after the reply; it reads the clock and the outputs' bytes while the
        process is frozen. So everything the candidate's process does from the command to the
        reply is its time, and nothing of the harness runs in it that a candidate could make
        cheaper: reading the command, taking the call's input objects (built before, setup and
        fresh), the call, where its outputs are, writing the reply. Both sides also time the call
        with the wall clock, two vDSO reads (tens of nanoseconds), into `self.clock`: the parent
        reads the twin's from its frozen memory, for the reference's time per call, and never the
        candidate's (the same code on both sides, the same reply)."""
        self.held = None  # the last window's outputs, read by the parent: freed now, in the window
        case_index, slot = line[1:].split(b",")
        data = self._take(int(case_index), int(slot))
        try:
            t0 = time.perf_counter_ns()
            out = self.fn(data)
            self.clock[0] = time.perf_counter_ns() - t0
            self.held = out
            os.write(self.reply_fd, where(out) + b"\n")
        except BaseException as e:  # noqa: BLE001 - the kernel's error (sys.exit too), or outputs that are not tensors
            self.send({"op": "error", "error": "runtime_error", "message": describe_error(e, self.device)})

    def compare(self, cmd):
        """Reference role, CPU: the verdict on calls whose candidate outputs are not byte for byte
        the twin's. The parent read both sides' outputs of each such call from their frozen
        processes (the twin ran the task's reference on the same read-only inputs: the expected
        outputs) into one file, the candidate's bytes then the twin's; the task's own check
        decides on each. Replies with the first failure, or ok."""
        import torch
        reply = {"op": "checked", "id": cmd["id"], "ok": False}
        shapes = cmd["shapes"]
        size = sum(math.prod(shape) * getattr(torch, d).itemsize
                   for c in cmd["calls"] for shape, d in zip(shapes + shapes, c["cand"] + c["ref"]))
        data = _read_exact(cmd["path"], size)
        if data is None:
            return {**reply, "message": "the outputs to compare are missing or of the wrong size"}
        pos = 0

        def tensors(dtypes):
            nonlocal pos
            got = []
            for shape, d in zip(shapes, dtypes):
                dtype = getattr(torch, d)
                n = math.prod(shape) * dtype.itemsize
                raw = torch.frombuffer(bytearray(data[pos:pos + n]), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
                got.append(raw.view(dtype).reshape(shape))
                pos += n
            return got[0] if cmd["container"] == "Tensor" else (list if cmd["container"] == "list" else tuple)(got)
        for c in cmd["calls"]:
            candidate, expected = tensors(c["cand"]), tensors(c["ref"])
            try:
                ok, msg = self.task.check(candidate, expected)
            except Exception as e:  # noqa: BLE001 - outputs that break the check fail it
                ok, msg = False, f"the check failed on these outputs: {type(e).__name__}: {e}"
            if not ok:
                return {**reply, "message": f"{case_str(cmd['case'])}: {msg}", "peak_bytes": peak_memory_bytes(self.device)}
        return {**reply, "ok": True, "message": "ok", "peak_bytes": peak_memory_bytes(self.device)}

    def _run(self, case, inputs):
        """(outputs, per-call ms) of the kernel on each input, timed; or (an error reply, None)."""
        try:
            return self.timer.run(self.fn, inputs)
        except BaseException as e:  # noqa: BLE001 - any failure inside the kernel (sys.exit too) is its runtime error
            return {"op": "error", "error": "runtime_error", "message": f"{case_str(case)}: {describe_error(e, self.device)}"}, None

    def run(self, cmd):
        """GPU, both roles: one call of a block, revealed on its own (the parent sends the next
        call's seed only once this reply is in): make its inputs from `seed`, call the kernel
        (timed by CUDA events after an L2 flush), and commit to what it returned and to its inputs
        as they are after the call, before the reply leaves: BLAKE3 of each tensor's bytes,
        computed on the device (fingerprint.py), read back. A digest is binding: no other bytes
        give it, so the bytes handed over later are these; no call can wait for the next call's
        inputs to finish its own; and the inputs' digests, which the reference worker's inputs of
        the same seed give too, show any write into them."""
        from harness.fingerprint import blake3_digest
        if cmd["index"] == 0:
            self.block = (cmd["id"], cmd["case"], [], [])
        bid, case, inputs, outs = self._block(cmd)
        if cmd["index"] != len(outs):
            raise RuntimeError(f"call {cmd['index']} of block {bid} out of order")
        data = self.task.generate_input(case, cmd["seed"], device=self.device)
        # The input tensors the call was given, listed before the call: "modified its inputs"
        # means their values changed; a key a kernel adds to a dict argument (a cache) is not one.
        given = tensors_of(data)
        out, ms = self._run(case, [data])
        if ms is None:
            return out  # the kernel's error
        out = out[0]
        shared = shared_outputs(outs + [out])
        if shared:  # an earlier output now holds this call's answer: name it, not "incorrect"
            return {"op": "error", "error": "runtime_error", "message": (
                f"{case_str(case)}: calls {shared[0]} and {shared[1]} returned the same memory (an output buffer "
                "reused across calls); on a GPU the harness holds every output of a block of calls until it is "
                "checked: return a new tensor from each call")}
        inputs.append(given)
        outs.append(out)
        spec = spec_of(out)
        plain = all(x["plain"] and x.get("contiguous") for x in spec)
        reply = {"op": "ran", "id": bid, "index": cmd["index"], "spec": spec,
                 "out_digests": [blake3_digest(raw_bytes(t)).hex() for t in tensors_of(out)] if plain else None,
                 "in_digests": [blake3_digest(raw_bytes(t)).hex() for t in given]}
        if self.role == "reference":  # a candidate's own times are never read
            reply.update(ms=ms[0], bytes_per_call=bytes_of_call(data, out), peak_bytes=peak_memory_bytes(self.device))
        return reply

    def handover(self, cmd):
        """GPU: the raw bytes of the picked call's outputs, one tensor after the other."""
        _, _, _, outs = self._block(cmd)
        self.send({"op": "bytes", "id": cmd["id"], "n": len(payload := output_bytes(outs[cmd["index"]]))}, payload)

    def check(self, cmd):
        """Reference role, GPU: the verdict on a candidate's output bytes for call `index` of the
        last block, handed over by the candidate into the file at `path` after it committed to
        their BLAKE3 digests (run). That call ran here on the same inputs (run). (On CPU every call
        is judged against the twin's outputs instead: compare.)"""
        import torch
        j = cmd["index"]
        bid, case, inputs, outs = self._block(cmd)
        expected = outs[j]
        exp_tensors = tensors_of(expected)
        reply = {"op": "checked", "id": bid, "ok": False}
        # The candidate's dtype of each output (the parent let through only the reference's, or
        # one the task allows): the task's check decides on the values.
        dtypes = [getattr(torch, str(d).removeprefix("torch."), None) for d in cmd.get("dtypes") or [e.dtype for e in exp_tensors]]
        if len(dtypes) != len(exp_tensors) or not all(isinstance(d, torch.dtype) for d in dtypes):
            return {**reply, "message": "the candidate's outputs have dtypes the check cannot read"}
        data = _read_exact(cmd["path"], sum(e.numel() * d.itemsize for e, d in zip(exp_tensors, dtypes)))
        if data is None:
            return {**reply, "message": "handed-over bytes missing or of the wrong size"}
        got, pos, hexes = [], 0, []
        for e, d in zip(exp_tensors, dtypes):
            n = e.numel() * d.itemsize
            raw = torch.frombuffer(bytearray(data[pos:pos + n]), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
            hexes.append(blake3_hex(raw))
            got.append(raw.view(d).reshape(e.shape).to(e.device))
            pos += n
        if hexes != cmd["out_digests"]:
            return {**reply, "forged": True,
                    "message": "handed-over bytes differ from what the worker committed to when its call returned"}
        candidate = type(expected)(got) if isinstance(expected, (tuple, list)) else got[0]
        try:
            ok, msg = self.task.check(candidate, expected)
        except Exception as e:  # noqa: BLE001 - outputs that break the check fail it
            ok, msg = False, f"the check failed on these outputs: {type(e).__name__}: {e}"
        return {**reply, "ok": bool(ok), "message": f"{case_str(case)}: {msg}", "peak_bytes": peak_memory_bytes(self.device)}

    def _block(self, cmd):
        if self.block is None or self.block[0] != cmd["id"]:
            raise RuntimeError(f"no block {cmd['id']} to {cmd['op']}")
        return self.block


# ---------------------------------------------------------------------------------------------
# Inputs in a file: the trusted side writes them, both sides map them read-only.
# ---------------------------------------------------------------------------------------------

def skeleton(data, tensors):
    """A JSON description of a (nested) input, its tensors replaced by their index in `tensors`."""
    import torch
    if isinstance(data, torch.Tensor):
        tensors.append(data)
        return {"t": len(tensors) - 1}
    if isinstance(data, (tuple, list)):
        return {"tuple" if isinstance(data, tuple) else "list": [skeleton(x, tensors) for x in data]}
    if isinstance(data, dict):
        return {"dict": [[k, skeleton(v, tensors)] for k, v in data.items()]}
    if data is None or isinstance(data, (bool, int, float, str)):
        return {"v": data}
    raise TypeError(f"an input of type {type(data).__name__} cannot be handed to a worker")


def map_file(path):
    """A read-only shared mapping of a whole file (None for an empty one): a write through it
    faults, and no copy exists that the process could change."""
    import mmap
    size = os.path.getsize(path)
    if not size:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def views(mm, layout, base=0):
    """Every call's inputs of a layout as tensors over the mapping `mm`, the layout's offsets
    counted from `base`."""
    import warnings

    import torch
    tensors = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "non-writable buffer": exactly the point
        for offset, nbytes, dtype, shape in layout["tensors"]:
            raw = (torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=base + offset) if nbytes
                   else torch.empty(0, dtype=torch.uint8))
            tensors.append(raw.view(getattr(torch, dtype)).reshape(shape))

    def build(node):
        if "t" in node:
            return tensors[node["t"]]
        if "tuple" in node:
            return tuple(build(x) for x in node["tuple"])
        if "list" in node:
            return [build(x) for x in node["list"]]
        if "dict" in node:
            return {k: build(v) for k, v in node["dict"]}
        return node["v"]
    return [build(c) for c in layout["calls"]]


# The dtypes an output may have, by the code a timed window's reply names them with (0: another).
DTYPES = ("", "float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "int64", "int32", "int16", "int8", "uint8", "bool")
_DTYPE_CODE = {}


def where(out):
    """Where a call's outputs are, for the parent to read while the worker is frozen: each
    tensor's address and dtype code, b"7f3a1c000040:1,7f3a1c100000:3". Raises for an output that
    is not a tensor (or a tuple of them)."""
    if not _DTYPE_CODE:
        import torch
        _DTYPE_CODE.update({getattr(torch, name): code for code, name in enumerate(DTYPES) if name})
    if isinstance(out, (tuple, list)):
        return b",".join(b"%x:%d" % (t.data_ptr(), _DTYPE_CODE.get(t.dtype, 0)) for t in out)
    return b"%x:%d" % (out.data_ptr(), _DTYPE_CODE.get(out.dtype, 0))


def blake3_hex(t):
    """BLAKE3 of a CPU tensor's bytes, as the GPU workers commit to it (fingerprint.blake3_digest)."""
    import blake3
    return blake3.blake3(raw_bytes(t).numpy()).hexdigest()


def raw_bytes(t):
    """A tensor's bytes as a flat uint8 tensor on its device (a view where it is contiguous)."""
    import torch
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def output_bytes(out):
    """The raw bytes of an output's tensors, one after the other (what a handover sends)."""
    return b"".join(raw_bytes(t).cpu().numpy().tobytes() for t in tensors_of(out))


def peak_memory_bytes(device):
    """This worker's peak memory so far: GPU memory its allocator reserved (what another tenant
    of the GPU cannot have), or its resident memory on CPU. Only the reference worker's number is
    trusted; it is what a plan of the GPU's memory needs (each measurement also holds a candidate
    worker of about the same size)."""
    if device == "cuda":
        import torch
        # Less the harness's own L2 flush buffer (CudaTimer), held from start to end; the copy
        # bandwidth probe's 2 GiB are out too (main resets the peak after it).
        return max(0, torch.cuda.max_memory_reserved() - FLUSH_BYTES)
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _read_exact(path, n):
    """The file's bytes if it is a regular file of exactly n bytes (never follow a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        import stat
        if not stat.S_ISREG(st.st_mode) or st.st_size != n:
            return None
        return f.read(n)


def collect_between_calls():
    """On CPU, where automatic collections are off (main): a full one, outside every window."""
    import gc
    if not gc.isenabled():
        gc.collect()


# A spare worker boots at idle priority (measure_sandbox.idle_priority). Where the kernel groups
# processes by session (autogroup), its session's group, which bubblewrap's new session made, would
# still weigh as much as the reference worker's: the worker lowers it itself as it starts, before it
# imports torch. The parent raises it again when it takes the spare (measure_sandbox.wake_up).
IDLE_ENV = "GPU_FORECASTERS_BOOT_IDLE"
ISOLATE_ENV = "GPU_FORECASTERS_ISOLATE"  # the second filter's BPF (hex), set by the parent for a sandboxed worker


def lower_own_session_group():
    for _ in range(50):  # one change per 100 ms on the whole machine for processes without privileges
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write("19")
            return
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            return  # no autogroups here: the thread policy is all there is


def isolate(bpf):
    """The worker's own isolation step, before it reads any command (so before any candidate
    code): leave the session keyring inherited from whoever started the measurement for a new,
    empty, anonymous one (the sandbox's seccomp filter allows this keyctl call and no other), then
    load `bpf`, a second seccomp filter the parent built with libseccomp that refuses every
    keyring call (measure_sandbox.after_join_filter): each would charge the host user's key
    quota. A step that fails raises: the worker then stops before it loads a candidate, never
    running one with less isolation."""
    import ctypes
    import platform
    number = {"x86_64": 250, "aarch64": 219}.get(platform.machine())  # keyctl's system call number
    if number is None:
        raise RuntimeError(f"no keyctl system call number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING, no name
        raise OSError(ctypes.get_errno(), f"joining a fresh session keyring failed: {os.strerror(ctypes.get_errno())}")

    class SockFprog(ctypes.Structure):  # struct sock_fprog: the filter's length and its instructions
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    program = bytes.fromhex(bpf)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(SockFprog(len(program) // 8, program)), 0, 0) < 0:
        raise OSError(ctypes.get_errno(), f"loading the second seccomp filter failed: {os.strerror(ctypes.get_errno())}")


def commands(fd):
    """The lines arriving on `fd`, read with plain os.read: no buffered text layer between the
    parent's command and the call, whose window it opens."""
    buf = b""
    while True:
        line, nl, buf = buf.partition(b"\n")
        if nl:
            yield line
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buf = line + chunk


def main():
    role, task_name, device = sys.argv[1], sys.argv[2], sys.argv[3]
    baseline = sys.argv[4] if len(sys.argv) > 4 else "eager"
    # Replies go to a private copy of stdout; print() and the candidate's writes go to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.path.insert(0, ROOT)
    if os.environ.pop(IDLE_ENV, None):
        lower_own_session_group()
    bpf = os.environ.pop(ISOLATE_ENV, None)
    if bpf:  # the parent asks for it in every sandbox
        try:
            isolate(bpf)
        except BaseException as e:  # noqa: BLE001 - a harness failure, before any candidate code
            out.write(json.dumps({"op": "error", "error": "isolation", "message": f"{type(e).__name__}: {e}"}).encode() + b"\n")
            out.flush()
            os._exit(70)
    worker = Worker(role, task_name, device, out, baseline)
    ready = {"op": "ready", "role": role, "pid": os.getpid()}
    if role == "reference":  # what the parent needs of the task, so that it never imports it
        t = worker.task
        ready["cases"] = {"benchmark": t.BENCHMARK_CASES, "check": t.CHECK_CASES,
                          "cpu": t.CPU_CASES, "cpu_check": t.CPU_CHECK_CASES}
        ready["min_bytes"] = [t.min_bytes(c) for c in t.BENCHMARK_CASES]
        ready["allowed_dtypes"] = list(getattr(t, "ALLOWED_OUTPUT_DTYPES", ()))
        if device == "cuda":
            ready["copy_bandwidth"] = copy_bandwidth()
            import torch
            torch.cuda.reset_peak_memory_stats()  # the probe's 2 GiB are not the reference's need
    # The objects of the boot (torch, the task) move to a generation the collector never scans
    # again: a full collection over them costs tens of milliseconds, at random moments, in a window.
    import gc
    gc.freeze()
    if device == "cpu":
        # A collection costs tens of microseconds, about a small CPU call's share of noise, and
        # the reference worker allocates more between its calls (inputs, checks) than a candidate
        # does, so automatic collections would land in its windows more often: none run inside a
        # window, on either side. Each collects between blocks instead (collect_between_calls).
        gc.disable()
    worker.send(ready)
    handlers = {"load": worker.load, "prepare": worker.prepare, "setup": worker.setup, "fresh": worker.fresh,
                "call": worker.call, "run": worker.run, "handover": worker.handover, "check": worker.check,
                "compare": worker.compare}
    for line in commands(0):
        if line[:1] == b"g":  # a timed window (CPU): nothing but the call between command and reply
            worker.go(line)
            continue
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            reply = handlers[cmd["op"]](cmd)
        except BaseException as e:  # noqa: BLE001 - report, then let the parent decide
            # What the parent makes of it is its own call: from a trusted worker a failure of the
            # harness, from a candidate's the kernel's error (its worker's words, never a verdict
            # of the harness's: measure_channel.WorkerProcess.recv).
            traceback.print_exc()
            reply = {"op": "error", "error": "runtime_error", "message": f"{type(e).__name__}: {e}"}
        if reply is not None:
            worker.send(reply)
    out.flush()
    os._exit(0)  # skip interpreter teardown: a candidate's atexit hooks or threads must not run


if __name__ == "__main__":
    main()
