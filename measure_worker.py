"""measure_worker.py: the program on each side of measure.py's trust boundary.

measure.py (the trusted parent) starts this file twice per task, in two roles:

  reference  trusted. Never loads candidate code. Generates a case's inputs from a seed, runs and
             times the task's PyTorch reference, keeps its outputs, and gives the verdict on the
             output bytes a candidate handed over (the task's own check, run here).
  candidate  untrusted, inside the sandbox (bubblewrap). Loads the candidate once, generates the
             same inputs from the same seeds, runs and times `custom_kernel`, commits to the
             outputs of one call the parent picks after the calls ran, and hands those bytes over.

Both roles run the very same block of calls (`run_block`), so whatever the harness itself costs
inside a block (making inputs, the L2 flush, the commitment) costs both sides alike, and the parent
can subtract it. Nothing the candidate worker says is believed: its timer is bounded by the
parent's clock, its bytes are compared with the reference's by the reference worker, and its
commitment (an integer fingerprint of the bytes, keyed by numbers it learns only after its calls
returned) proves that the bytes existed before the parent's clock stopped, so work cannot be
deferred to after the timed window.

Protocol: one JSON object per line. Commands arrive on stdin; replies leave on a private copy of
the original stdout; the candidate's own prints go to stderr (the parent keeps a bounded tail).
Raw output bytes follow a {"op": "bytes", "n": N} line on the same channel.
"""
import json
import math
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.abspath(__file__))
MAX_SOURCE = 1 << 20          # a kernel source larger than 1 MB is not a kernel
FLUSH_BYTES = 256 * 2**20     # >= the L2 of any GPU we know: evicts it between calls
DIGEST_CHUNK = 1 << 24        # bytes per step of the fingerprint (bounded temporaries on the GPU)


def case_str(case):
    return ",".join(f"{k}={v}" for k, v in case.items())


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
    """A fingerprint of each tensor's raw bytes, keyed by numbers (a, b) the parent draws after the
    calls ran. On a CPU: keyed BLAKE2b. On a GPU (no copy to the host inside the timed window): the
    weighted byte sum below. Either way the trusted side recomputes it from the bytes handed over,
    on the same kind of device."""
    import hashlib

    import torch
    out = []
    for t in tensors:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if raw.device.type == "cpu":
            key = a.to_bytes(8, "little") + b.to_bytes(8, "little")
            out.append(int.from_bytes(hashlib.blake2b(raw.numpy(), key=key, digest_size=8).digest(), "little"))
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
            outs.append(fn(data))
            ms.append((time.process_time() - t0) * 1e3)
        return outs, ms


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
    def __init__(self, role, task_name, device, out):
        import torch

        from tasks import get_task
        self.device, self.out = device, out
        self.task = get_task(task_name)
        self.fn = self.task.reference if role == "reference" else None
        torch.backends.cuda.matmul.allow_tf32 = False  # one precision for both sides
        torch.backends.cudnn.allow_tf32 = False
        if device == "cpu":
            torch.set_num_threads(1)  # steadier times on a shared machine
            enforce_cuda_grid_limits()
        # No mode differs between a checked call and a timed one (a kernel could tell them apart),
        # so no NaN-filled allocations for checks only: every call has fresh inputs, and output
        # elements a kernel leaves unwritten hold values of other inputs, which the check rejects.
        self.timer = CudaTimer() if device == "cuda" else CpuTimer()
        self.block = None  # (id, case, inputs, outputs) of the last block

    def send(self, obj, payload=b""):
        self.out.write(json.dumps(obj).encode() + b"\n")
        self.out.write(payload)  # apart: a gigabyte of output is not copied into the header
        self.out.flush()

    # -- commands ------------------------------------------------------------------------------

    def load(self, cmd):
        """Import the candidate from a real file in the sandbox's private /tmp (@triton.jit reads
        its function's source from the file)."""
        import importlib.util
        source = cmd["source"]
        if len(source) > MAX_SOURCE:
            return {"op": "loaded", "error": "compile_error", "message": "candidate source over 1 MB"}
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "candidate_kernel.py")
        with open(path, "w") as f:
            f.write(source)
        t0 = time.perf_counter()
        try:
            spec = importlib.util.spec_from_file_location("candidate_kernel", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            fn = module.custom_kernel
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - any failure to import is the candidate's compile error
            return {"op": "loaded", "error": "compile_error", "message": f"{type(e).__name__}: {e}"}
        if not callable(fn):
            return {"op": "loaded", "error": "compile_error", "message": "custom_kernel is not callable"}
        self.fn = fn
        return {"op": "loaded", "import_s": time.perf_counter() - t0}

    def run_block(self, cmd):
        """Make the inputs of every seed, call the kernel on each (timed), synchronise."""
        case, seeds = cmd["case"], cmd["seeds"]
        self.block = None
        inputs = [self.task.generate_input(case, s, device=self.device) for s in seeds]
        try:
            outs, ms = self.timer.run(self.fn, inputs)
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001
            return {"op": "ran", "id": cmd["id"], "error": "runtime_error",
                    "message": f"{case_str(case)}: {type(e).__name__}: {e}"}
        self.block = (cmd["id"], case, inputs, outs)
        nbytes = sum(t.numel() * t.element_size() for t in tensors_of(inputs[0]) + tensors_of(outs[0]))
        return {"op": "ran", "id": cmd["id"], "ms": ms, "bytes_per_call": nbytes}

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
        reply["peak_bytes"] = peak_memory_bytes(self.device)
        return reply

    def handover(self, cmd):
        """The raw bytes of the picked call's outputs, one tensor after the other, and the
        fingerprint of that call's inputs as they are now (the reference compares it with the
        pristine inputs)."""
        import torch
        _, _, inputs, outs = self._block(cmd)
        j = cmd["index"]
        payload = b"".join(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
                           for t in tensors_of(outs[j]))
        in_digest = digest(tensors_of(inputs[j]), cmd["a"], cmd["b"])
        self.send({"op": "bytes", "id": cmd["id"], "n": len(payload), "in_digest": in_digest}, payload)

    def check(self, cmd):
        """Reference role: the verdict on a candidate's handed-over bytes for call `index` of the
        last block, which ran on the same seeds here."""
        import torch
        bid, case, inputs, outs = self._block(cmd)
        j = cmd["index"]
        expected = outs[j]
        exp_tensors = tensors_of(expected)
        data = _read_exact(cmd["path"], sum(t.numel() * t.element_size() for t in exp_tensors))
        if data is None:
            return {"op": "checked", "id": bid, "ok": False, "message": "handed-over bytes missing or of the wrong size"}
        got, pos = [], 0
        for e in exp_tensors:
            n = e.numel() * e.element_size()
            raw = torch.frombuffer(bytearray(data[pos:pos + n]), dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
            got.append(raw.view(e.dtype).reshape(e.shape).to(e.device))
            pos += n
        if digest(got, cmd["a"], cmd["b"]) != cmd["out_digest"]:
            return {"op": "checked", "id": bid, "ok": False, "forged": True,
                    "message": "handed-over bytes differ from what the worker committed to when its calls returned"}
        if digest(tensors_of(inputs[j]), cmd["a"], cmd["b"]) != cmd["in_digest"]:  # the reference leaves its inputs alone
            return {"op": "checked", "id": bid, "ok": False,
                    "message": f"{case_str(case)}: the candidate modified its input tensors"}
        candidate = type(expected)(got) if isinstance(expected, (tuple, list)) else got[0]
        ok, msg = self.task.check(candidate, expected)
        return {"op": "checked", "id": bid, "ok": bool(ok), "message": f"{case_str(case)}: {msg}"}

    def _block(self, cmd):
        if self.block is None or self.block[0] != cmd["id"]:
            raise RuntimeError(f"no block {cmd['id']} to {cmd['op']}")
        return self.block


def peak_memory_bytes(device):
    """This worker's peak memory so far: GPU memory its allocator reserved (what another tenant
    of the GPU cannot have), or its resident memory on CPU. Only the reference worker's number is
    trusted; it is what a plan of the GPU's memory needs (each measurement also holds a candidate
    worker of about the same size)."""
    if device == "cuda":
        import torch
        return torch.cuda.max_memory_reserved()
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


def main():
    role, task_name, device = sys.argv[1], sys.argv[2], sys.argv[3]
    # Replies go to a private copy of stdout; print() and the candidate's writes go to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.path.insert(0, ROOT)
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    worker = Worker(role, task_name, device, out)
    ready = {"op": "ready", "role": role, "pid": os.getpid()}
    if role == "reference":  # what the parent needs of the task, so that it never imports it
        t = worker.task
        ready["cases"] = {"benchmark": t.BENCHMARK_CASES, "check": t.CHECK_CASES,
                          "cpu": t.CPU_CASES, "cpu_check": t.CPU_CHECK_CASES}
        ready["min_bytes"] = [t.min_bytes(c) for c in t.BENCHMARK_CASES]
        if device == "cuda":
            ready["copy_bandwidth"] = copy_bandwidth()
    worker.send(ready)
    handlers = {"load": worker.load, "block": worker.run_block, "commit": worker.commit,
                "handover": worker.handover, "check": worker.check}
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
