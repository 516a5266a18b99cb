"""measure_worker.py: the program on each side of measure.py's trust boundary.

measure.py (the trusted parent) starts this file twice per task, in two roles:

  reference  trusted. Never loads candidate code. Makes the inputs (on CPU it writes each call's
             to a file the candidate maps read-only), runs and times the task's PyTorch
             reference, keeps its outputs, and gives the verdict on the output bytes a candidate
             handed over (the task's own check, run here), inputs checked unchanged.
  candidate  untrusted, in its sandbox (measure_sandbox.py). Loads the candidate once, runs
             `custom_kernel` on the inputs of each window of calls, fingerprints every output
             before its reply, and hands over the outputs of the call the parent picks afterwards.

Both roles run the very same code for a window of calls (`call` on CPU, `run_block` and `commit`
on a GPU), so whatever the harness itself costs inside a window (mapping or making inputs, the L2
flush, the fingerprint, the pipe) costs both sides alike, and cancels in the parent's comparison
of the two windows. Nothing the candidate worker says is believed: its time is what the parent's
own clock saw (the candidate's timer is run, for symmetry, and its figures never sent), its bytes
are compared with the reference's by the reference worker, and its fingerprints, sent before the
window closes, prove that the bytes existed inside the window: work cannot be deferred past it.
On CPU the fingerprint is BLAKE3 (binding whatever the candidate knows); on a GPU, where a copy
to the host inside the window would dominate it, a byte sum keyed by numbers drawn after the
calls returned.

Protocol: one JSON object per line. Commands arrive on stdin; replies leave on a private copy of
the original stdout; the candidate's own prints go to stderr (the parent keeps a bounded tail).
Raw output bytes follow a {"op": "bytes", "n": N} line on the same channel.
"""
import json
import math
import os
import re
import random
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root: tasks/ lives there
MAX_SOURCE = 1 << 20          # a kernel source larger than 1 MB is not a kernel
FLUSH_BYTES = 256 * 2**20     # >= the L2 of any GPU we know: evicts it between calls
DIGEST_CHUNK = 1 << 24        # bytes per step of the fingerprint (bounded temporaries on the GPU)


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


def digest(tensors, a, b):
    """A fingerprint of each tensor's raw bytes, keyed by numbers (a, b). On a CPU: BLAKE3 of the
    key and the bytes (a cryptographic hash: no other bytes give the same value, so the bytes
    handed over later are the ones that existed now, key or no key; the CPU path passes 0, 0).
    It runs inside every timed window, on both sides, so its speed is the noise's: BLAKE3 hashes
    8 GB/s on one core with AVX-512, SHA-256 2 GB/s even in hardware, and for a small
    memory-bound kernel SHA-256 took three times the kernel's own time. On a GPU (no copy to the
    host inside the timed window): the weighted byte sum below. Either way the trusted side
    recomputes it from the bytes handed over, on the same kind of device."""
    import blake3
    import torch
    out = []
    for t in tensors:
        raw = raw_bytes(t)
        if raw.device.type == "cpu":
            h = blake3.blake3(a.to_bytes(8, "little") + b.to_bytes(8, "little"))
            h.update(raw.numpy())
            out.append(int.from_bytes(h.digest()[:8], "little"))
        else:
            out.append(weighted_sum(raw, a, b))
    return out


def weighted_sum(raw, a, b):
    """sum_i byte_i * w_i, w_i = ((a*i + b) >> 7) & 0xFFFF, over a flat uint8 tensor, on its own
    device, in chunks (bounded temporaries). Exact integer arithmetic: it does not depend on the
    order of the sum or on the chunking, and every byte counts."""
    import torch
    total = 0
    for start in range(0, raw.numel(), DIGEST_CHUNK):
        x = raw[start:start + DIGEST_CHUNK].to(torch.int32)
        idx = torch.arange(start, start + x.numel(), device=x.device, dtype=torch.int64)
        w = ((idx * a + b) >> 7) & 0xFFFF
        total += int((x * w.to(torch.int32)).sum(dtype=torch.int64))  # < 2^8 * 2^16 a term: exact
    return total


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


class CpuTimer:
    """CPU time of the process around each call (the Triton interpreter: not GPU times). CPU time,
    not wall clock: it is what the parent can check against the kernel's own accounting, and it
    does not grow when other programs share the machine's cores."""

    def run(self, fn, inputs):
        outs, ms = [], []
        for data in inputs:
            t0 = time.process_time()
            out = fn(data)
            ms.append((time.process_time() - t0) * 1e3)
            outs.append(snapshot(out))
        return outs, ms


def snapshot(out):
    """A call's output as it is when the call returns: each plain tensor copied. A kernel may hand
    back the same buffer from every call (a cache of scratch space, as GPU MODE submissions keep;
    GPU MODE checks each output before the next call): without the copy, the next call would
    overwrite the outputs this worker holds for the handover. Other objects are left as they are,
    for the output checks to refuse. On CPU only, in both roles (the copy is inside both windows):
    on a GPU a copy per call would cost the candidate and the reference unequally."""
    import torch
    if type(out) is torch.Tensor:
        return out.clone() if out.is_contiguous() else out
    if isinstance(out, (tuple, list)) and all(type(t) is torch.Tensor for t in out):
        return type(out)(snapshot(t) for t in out)
    return out


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
        self.task = get_task(task_name)
        self.fn = self.reference_fn(baseline) if role == "reference" else None
        # Whose per-call times the parent reads: the reference worker's, and on CPU the timing
        # twin's (a candidate worker that loaded the reference: load), never a candidate's.
        self.reports_times = role == "reference"
        torch.backends.cuda.matmul.allow_tf32 = False  # one precision for both sides
        torch.backends.cudnn.allow_tf32 = False
        if device == "cpu":
            torch.set_num_threads(1)  # steadier times on a shared machine
            patch_triton_when_imported()
        # No mode differs between a checked call and a timed one (a kernel could tell them apart),
        # so no NaN-filled allocations for checks only: every call has fresh inputs, and output
        # elements a kernel leaves unwritten hold values of other inputs, which the check rejects.
        self.timer = CudaTimer() if device == "cuda" else CpuTimer()
        self.block = None  # (id, case, inputs, outputs) of the last block
        self.prepared = {}  # reference, CPU: block id -> each call's input tensors, as generated

    def reference_fn(self, baseline):
        import torch
        fn = self.task.reference
        if baseline == "compile":
            # KernelBench's second baseline: the reference as torch.compile makes it. Its first
            # calls (the correctness calls) compile; its outputs are the ones candidates must match.
            fn = torch.compile(fn)
        return fn

    def send(self, obj, payload=b""):
        self.out.write(json.dumps(obj).encode() + b"\n")
        self.out.write(payload)  # apart: a gigabyte of output is not copied into the header
        self.out.flush()

    # -- commands ------------------------------------------------------------------------------

    def load(self, cmd):
        """Import the candidate from a real file in the sandbox's private /tmp (@triton.jit reads
        its function's source from the file)."""
        import importlib.util
        if cmd.get("reference"):  # the timing twin (measure.py): this task's reference, not a file
            t0 = time.perf_counter()
            self.fn, self.reports_times = self.reference_fn(cmd["reference"]), True
            return {"op": "loaded", "import_s": time.perf_counter() - t0}
        source = cmd["source"]
        if len(source) > MAX_SOURCE:
            return {"op": "loaded", "error": "compile_error", "message": "candidate source over 1 MB"}
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "candidate_kernel.py")
        with open(path, "w") as f:
            f.write(source)
        # GPU MODE's template imports `task` (input_t, output_t): its stand-in is on the path.
        sys.path.insert(0, os.path.join(ROOT, "tasks", "gpumode_shim"))
        t0 = time.perf_counter()
        try:
            spec = importlib.util.spec_from_file_location("candidate_kernel", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            entry = getattr(self.task, "entry_point", None)  # a KernelBench task builds ModelNew
            fn = entry(module, self.device) if entry else getattr(module, "custom_kernel", None)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - any failure to import is the candidate's compile error
            return {"op": "error", "error": "compile_error", "message": describe_error(e, self.device)}
        if fn is None:
            return {"op": "error", "error": "compile_error", "message": "the candidate does not define custom_kernel(data)"}
        if not callable(fn):
            return {"op": "error", "error": "compile_error", "message": "custom_kernel is not callable"}
        self.fn = fn
        return {"op": "loaded", "import_s": time.perf_counter() - t0}

    def prepare(self, cmd):
        """Reference role, on CPU: make the inputs of every seed of a block and write each call's,
        raw, to its own file (`paths`, in a folder only this worker may write). The candidate later
        maps a call's file read-only as that call starts: the inputs it gets are the trusted side's,
        it cannot change them, and it never sees the next call's before its clock runs. The tensors
        stay here while the block after next is made: the check compares the file with them, and
        the parent makes a block while the one before it is timed and then checked (measure.py)."""
        collect_between_calls()
        self.prepared = dict(list(self.prepared.items())[-1:])  # the block made last (ids restart per measurement)
        layouts, kept = [], []
        for seed, path in zip(cmd["seeds"], cmd["paths"]):
            data = self.task.generate_input(cmd["case"], seed, device="cpu")
            found, tensors, pos = [], [], 0
            call = skeleton(data, found)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                for t in found:
                    raw = raw_bytes(t).numpy()
                    # Each tensor at a random 64-byte offset of its page: where a call's inputs sit
                    # against its outputs' addresses (cache sets) varies from call to call instead
                    # of repeating in every call of a process.
                    shift = 64 * random.randrange(64)
                    f.write(bytes(shift))
                    pos += shift
                    pad = -raw.nbytes % 64  # 64-byte aligned: every dtype views cleanly
                    tensors.append([pos, raw.nbytes, str(t.dtype).removeprefix("torch."), list(t.shape)])
                    f.write(memoryview(raw))
                    f.write(bytes(pad))
                    pos += raw.nbytes + pad
            layouts.append({"calls": [call], "tensors": tensors, "size": pos})
            kept.append(found)
        self.prepared[cmd["id"]] = kept
        return {"op": "prepared", "id": cmd["id"], "layouts": layouts}

    def call(self, cmd):
        """CPU, both roles: one window's calls (a few, consecutive) on the inputs the trusted side
        wrote for each (mapped read-only), every output described and fingerprinted (BLAKE3)
        before the reply leaves. The parent's clock runs from this command to its reply, so the
        fingerprints prove the bytes existed inside the window: no work can be deferred past it,
        or moved into another window."""
        if cmd["index"] == 0:
            self.block = (cmd["id"], cmd["case"], [], [])
        bid, case, inputs, outs = self._block(cmd)
        if cmd["index"] != len(outs):
            raise RuntimeError(f"call {cmd['index']} of block {bid} out of order")
        data = [map_inputs(x["path"], x["layout"])[0] for x in cmd["inputs"]]
        given = [tensors_of(d) for d in data]  # before the call: keys a kernel adds are not inputs
        out, ms = self._run(case, data)
        if ms is None:
            return out  # the kernel's error
        inputs.extend(given)
        outs.extend(out)
        specs = [spec_of(o) for o in out]
        good = all(x["plain"] and x.get("contiguous") for spec in specs for x in spec)
        reply = {"op": "called", "id": bid, "index": cmd["index"], "specs": specs,
                 "out_digests": [digest(tensors_of(o), 0, 0) for o in out] if good else None}
        # Both roles do the same work inside the window; only the reference's figures are sent
        # (its timer is trusted, a candidate's never read).
        nbytes = bytes_of_call(data[0], out[0])
        if self.reports_times:
            reply.update(ms=ms, bytes_per_call=nbytes)
        return reply

    def _run(self, case, inputs):
        """(outputs, per-call ms) of the kernel on each input, timed; or (an error reply, None)."""
        try:
            return self.timer.run(self.fn, inputs)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - any failure inside the kernel is its runtime error
            return {"op": "error", "error": "runtime_error", "message": f"{case_str(case)}: {describe_error(e, self.device)}"}, None

    def run_block(self, cmd):
        """GPU: make the block's inputs from the seeds sent with this command, call the kernel on
        each (timed), synchronise."""
        case = cmd["case"]
        self.block = None
        inputs = [self.task.generate_input(case, s, device=self.device) for s in cmd["seeds"]]
        # The input tensors each call was given, listed before the call: "modified its inputs"
        # means their values changed; a key a kernel adds to a dict argument (a cache) is not one.
        given = [tensors_of(x) for x in inputs]
        outs, ms = self._run(case, inputs)
        if ms is None:
            return outs  # the kernel's error
        shared = shared_outputs(outs)
        if shared:  # each earlier output now holds a later call's answer: name it, not "incorrect"
            return {"op": "error", "error": "runtime_error", "message": (
                f"{case_str(case)}: calls {shared[0]} and {shared[1]} returned the same memory (an output buffer "
                "reused across calls); on a GPU the harness holds every output of a block of calls until it is "
                "checked: return a new tensor from each call")}
        self.block = (cmd["id"], case, given, outs)
        if self.role != "reference":
            return {"op": "ran", "id": cmd["id"]}  # a candidate's own times are never read
        return {"op": "ran", "id": cmd["id"], "ms": ms, "bytes_per_call": bytes_of_call(inputs[0], outs[0])}

    def commit(self, cmd):
        """Fingerprint the outputs of every call of the block, keyed by numbers the parent drew
        after the calls returned; describe every output (the parent rejects lazy, non-contiguous
        or mistyped ones). Which call will be handed over is not known yet: to pass, all of them
        must hold the right answer now."""
        bid, _, _, outs = self._block(cmd)
        if self.device == "cuda":
            import torch
            torch.cuda.synchronize()
        specs = [spec_of(o) for o in outs]
        bad = next((s for s in specs if not all(x["plain"] and x.get("contiguous") for x in s)), None)
        reply = {"op": "committed", "id": bid, "spec": specs[0], "bad_spec": bad}
        if bad is None:
            reply["out_digests"] = [digest(tensors_of(o), cmd["a"], cmd["b"]) for o in outs]
        if self.role == "reference":
            reply["peak_bytes"] = peak_memory_bytes(self.device)
        return reply

    def handover(self, cmd):
        """The raw bytes of the picked call's outputs, one tensor after the other; on a GPU (inputs
        made here from seeds) also the fingerprint of that call's inputs as they are now (the
        reference compares it with the pristine inputs)."""
        _, _, inputs, outs = self._block(cmd)
        collect_between_calls()
        j = cmd["index"]
        payload = output_bytes(outs[j])
        reply = {"op": "bytes", "id": cmd["id"], "n": len(payload)}
        if self.device == "cuda":
            reply["in_digest"] = digest(inputs[j], cmd["a"], cmd["b"])
        self.send(reply, payload)

    def check(self, cmd):
        """Reference role: the verdict on a candidate's handed-over bytes for call `index` of the
        last block. On a GPU that call ran here on the same inputs (run_block); on CPU, where the
        timing twin ran the block's reference calls, this worker runs the picked call now, untimed,
        on the input file it wrote (`input`: its path and layout)."""
        import torch
        j = cmd["index"]
        if "input" in cmd:
            if cmd["id"] not in self.prepared:
                raise RuntimeError(f"no block {cmd['id']} to check")
            bid, case = cmd["id"], cmd["case"]
            data = map_inputs(cmd["input"]["path"], cmd["input"]["layout"])[0]
            inputs = {j: tensors_of(data)}
            expected = snapshot(self.fn(data))
        else:
            bid, case, inputs, outs = self._block(cmd)
            expected = outs[j]
        exp_tensors = tensors_of(expected)
        t0 = time.process_time()
        output_bytes(expected)  # what the candidate's handover cost: the parent's allowance for it
        serialize_ms = (time.process_time() - t0) * 1e3
        reply = {"op": "checked", "id": bid, "ok": False, "serialize_ms": serialize_ms}
        # The candidate's dtype of each output (the parent let through only known ones): the
        # task's check casts, as GPU MODE's does, so another dtype is no failure in itself.
        dtypes = [getattr(torch, str(d).removeprefix("torch."), None) for d in cmd.get("dtypes") or [e.dtype for e in exp_tensors]]
        if len(dtypes) != len(exp_tensors) or not all(isinstance(d, torch.dtype) for d in dtypes):
            return {**reply, "message": "the candidate's outputs have dtypes the check cannot read"}
        data = _read_exact(cmd["path"], sum(e.numel() * d.itemsize for e, d in zip(exp_tensors, dtypes)))
        if data is None:
            return {**reply, "message": "handed-over bytes missing or of the wrong size"}
        got, pos = [], 0
        for e, d in zip(exp_tensors, dtypes):
            n = e.numel() * d.itemsize
            raw = torch.frombuffer(bytearray(data[pos:pos + n]), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
            got.append(raw.view(d).reshape(e.shape).to(e.device))
            pos += n
        if digest(got, cmd["a"], cmd["b"]) != cmd["out_digest"]:
            return {**reply, "forged": True,
                    "message": "handed-over bytes differ from what the worker committed to when its calls returned"}
        if bid in self.prepared:  # CPU: the inputs' file, read-only to the candidate, checked all the same
            pristine = self.prepared[bid][j]
            changed = len(pristine) != len(inputs[j]) or not all(
                a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw_bytes(a), raw_bytes(b))
                for a, b in zip(pristine, inputs[j]))
        else:  # GPU: the candidate's fingerprint of its inputs against ours of the pristine ones
            changed = digest(inputs[j], cmd["a"], cmd["b"]) != cmd["in_digest"]
        if changed:
            return {**reply, "message": f"{case_str(case)}: the candidate modified its input tensors"}
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


def map_inputs(path, layout):
    """Every call's inputs of a block, as tensors over a read-only shared mapping of the file: a
    write into one faults, and no copy of the inputs exists that the candidate could change."""
    import mmap
    import warnings

    import torch
    mm = None
    if layout["size"]:
        fd = os.open(path, os.O_RDONLY)
        try:
            mm = mmap.mmap(fd, layout["size"], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
    tensors = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "non-writable buffer": exactly the point
        for offset, nbytes, dtype, shape in layout["tensors"]:
            raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset) if nbytes else torch.empty(0, dtype=torch.uint8)
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


def join_fresh_keyring():
    """Leave the session keyring inherited from whoever started the measurement for a new, empty,
    anonymous one (the seccomp filter allows this keyctl call and no other)."""
    import ctypes
    import platform
    number = {"x86_64": 250, "aarch64": 219}.get(platform.machine())  # keyctl's syscall number
    if number is not None:
        ctypes.CDLL(None, use_errno=True).syscall(number, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, no name


def main():
    role, task_name, device = sys.argv[1], sys.argv[2], sys.argv[3]
    baseline = sys.argv[4] if len(sys.argv) > 4 else "eager"
    # Replies go to a private copy of stdout; print() and the candidate's writes go to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.path.insert(0, ROOT)
    if os.environ.pop(IDLE_ENV, None):
        lower_own_session_group()
    join_fresh_keyring()
    worker = Worker(role, task_name, device, out, baseline)
    ready = {"op": "ready", "role": role, "pid": os.getpid()}
    if role == "reference":  # what the parent needs of the task, so that it never imports it
        t = worker.task
        ready["cases"] = {"benchmark": t.BENCHMARK_CASES, "check": t.CHECK_CASES,
                          "cpu": t.CPU_CASES, "cpu_check": t.CPU_CHECK_CASES}
        ready["min_bytes"] = [t.min_bytes(c) for c in t.BENCHMARK_CASES]
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
    handlers = {"load": worker.load, "prepare": worker.prepare, "call": worker.call, "block": worker.run_block,
                "commit": worker.commit, "handover": worker.handover, "check": worker.check}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            reply = handlers[cmd["op"]](cmd)
        except SystemExit as e:
            reply = {"op": "error", "error": "crashed", "message": f"candidate called sys.exit({e.code})"}
        except BaseException as e:  # noqa: BLE001 - report, then let the parent decide
            traceback.print_exc()
            if "OutOfMemory" in type(e).__name__ or isinstance(e, MemoryError):
                # Outside the kernel's own call (the kernel's errors are caught in run_block): the
                # harness ran out of memory making inputs or fingerprints. Not the kernel's
                # runtime error; "crashed" results are never cached, so it is measured again.
                reply = {"op": "error", "error": "crashed",
                         "message": f"out of memory in the harness, outside the kernel's call ({cmd['op']}): {e}"}
            else:
                reply = {"op": "error", "error": "runtime_error", "message": f"{type(e).__name__}: {e}"}
        if reply is not None:
            worker.send(reply)
    out.flush()
    os._exit(0)  # skip interpreter teardown: a candidate's atexit hooks or threads must not run


if __name__ == "__main__":
    main()
