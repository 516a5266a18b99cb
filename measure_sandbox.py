"""measure_sandbox.py: the operating-system side of measure.py's trust boundary.

measure.py decides what to run and what to believe; this file starts the worker processes, talks
to them, watches them and ends them. A candidate kernel is code written by an LLM that a
reinforcement-learning loop rewards for every measurement it games, so its worker runs under
bubblewrap (`bwrap`, the unprivileged sandbox behind Flatpak), not under rules of our own:

  - its own user namespace, uid and gid 65534 (nobody) inside, no capabilities;
  - its own PID namespace: it sees only its own processes, and when the sandbox's init dies the
    kernel kills every process in it, daemons and grandchildren that ignore SIGTERM included;
  - its own network, IPC and UTS namespaces: no network at all;
  - the whole filesystem read-only (the project, the measurement cache, the Python environment),
    the user's home hidden (tokens, caches), a private size-limited tmpfs for /tmp (Triton's cache
    lives there) and /dev/shm, a minimal /dev (plus the NVIDIA device files on a GPU machine);
  - `--die-with-parent`: the sandbox dies with the process that started it, also when that
    process is killed with SIGKILL; `--new-session`: no way to the controlling terminal.

The parent watches the whole process tree (host memory, number of processes, bytes written to
stdout/stderr) and kills it when a limit is crossed or the measurement ends. The only ways out are
two pipes to the parent, which reads them as JSON lines of bounded size, with a deadline.

The reference worker is trusted code (it never loads a candidate) but runs in an identical
sandbox all the same, so that whatever the sandbox costs, it costs both sides of a comparison.
The end of this file keeps the workers of each thread that measures (a WorkerSet): one reference
worker per task, kept, and a fresh candidate worker per measurement, with spares booting in the
background.
"""
import atexit
import ctypes
import glob
import json
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(ROOT, "measure_worker.py")
MAX_LINE = 1 << 20            # a reply line longer than 1 MB is not a reply
MAX_LOG = 64 << 20            # more than 64 MB on stdout/stderr is a flood
MAX_PROCS = 64                # processes in one sandbox (the worker, Triton's compiler, ...)
WATCH_EVERY = 0.05            # seconds between two looks at the process tree
_LIBC = ctypes.CDLL(None, use_errno=True)
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or pass "
                "--unsafe-no-sandbox (candidate code then runs unconfined, as you)")


class WorkerFailed(Exception):
    """A worker's fate, with the status it earns when the worker is the candidate's."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class SandboxUnavailable(ValueError):
    """bubblewrap is missing or cannot create its namespaces on this machine."""


# ---------------------------------------------------------------------------------------------
# The sandbox's command line.
# ---------------------------------------------------------------------------------------------

def _under(path, top):
    return bool(top) and top != "/" and (path == top or path.startswith(top.rstrip("/") + "/"))


def bwrap_prefix(device):
    """The bwrap arguments that put a worker in its sandbox (see the module docstring)."""
    home = os.path.realpath(os.path.expanduser("~"))
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all",
            "--uid", "65534", "--gid", "65534",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--size", str(2 << 30), "--tmpfs", "/tmp", "--size", str(1 << 30), "--tmpfs", "/dev/shm"]
    if os.path.isdir(home) and home != "/":
        argv += ["--tmpfs", home]
    # What the worker needs from under the hidden home or /tmp is bound back, read-only.
    needed = {ROOT, sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              *(p for p in sys.path if os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p))}
    bound = []
    for path in sorted(os.path.realpath(p) for p in needed if p):
        hidden = any(_under(path, top) and path != top for top in (home, "/tmp"))
        if hidden and not any(_under(path, b) for b in bound):
            bound.append(path)
            argv += ["--ro-bind", path, path]
    if device == "cuda":
        for dev in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")):
            argv += ["--dev-bind", dev, dev]
    return argv + ["--chdir", "/tmp"]


def worker_env(device, tmp):
    """A clean environment: no secrets or settings of the caller's shell reach a worker."""
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME")
           or k.startswith("NVIDIA_")}
    env.update(HOME=tmp, TMPDIR=tmp, PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1",
               TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               # glibc keeps freed memory instead of returning it to the system, so that what a
               # kernel frees does not turn into page faults in the harness's next allocation
               MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(1 << 40))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # before any @triton.jit runs: the worker has no GPU
    return env


_SANDBOX_PROBLEM = None


def require_sandbox():
    """Raise SandboxUnavailable, in one line that says what to do, unless bwrap works here."""
    global _SANDBOX_PROBLEM
    if _SANDBOX_PROBLEM is None:
        if shutil.which("bwrap") is None:
            _SANDBOX_PROBLEM = f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}"
        else:
            r = subprocess.run(bwrap_prefix("cpu") + [sys.executable, "-c", "pass"],
                               capture_output=True, text=True, timeout=60)
            _SANDBOX_PROBLEM = "" if r.returncode == 0 else (
                "bubblewrap cannot create its namespaces here ("
                + (r.stderr.strip().splitlines() or ["no message"])[-1][:120]
                + "): enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                  "or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), or pass --unsafe-no-sandbox")
    if _SANDBOX_PROBLEM:
        raise SandboxUnavailable(_SANDBOX_PROBLEM)


def _die_with_parent():
    """In the child before exec: SIGKILL when the parent dies (the unsandboxed workers; bwrap's
    --die-with-parent does it for the others, without code between fork and exec in a process that
    may run threads). The signal follows the thread that started the child, so start workers
    from a long-lived thread."""
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# ---------------------------------------------------------------------------------------------
# One worker process: start, JSON lines in and out with deadlines, watch the tree, kill.
# ---------------------------------------------------------------------------------------------

class WorkerProcess:
    def __init__(self, role, task, device, *, sandboxed, memory_bytes, tmp, readable=(), visible=None):
        self.memory_bytes = memory_bytes
        argv = [sys.executable, "-B", WORKER, role, task, device]
        if sandboxed:
            binds = [a for path in readable for a in ("--ro-bind", path, path)]
            argv = bwrap_prefix(device) + binds + ["--setenv", "TMPDIR", "/tmp"] + argv
            env = worker_env(device, "/tmp")
        else:
            os.makedirs(tmp, exist_ok=True)
            env = worker_env(device, tmp)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=ROOT if not sandboxed else None,
                                     start_new_session=True, preexec_fn=None if sandboxed else _die_with_parent)
        self.out, self.err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        for fd in (self.out, self.err):
            os.set_blocking(fd, False)
        self.buf, self.log, self.log_bytes = bytearray(), bytearray(), 0
        self.open = {self.out, self.err}
        self.next_watch = 0.0

    # -- talking -----------------------------------------------------------------------------------

    def send(self, obj):
        try:
            self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._pump(time.monotonic() + 2, lambda: False)  # collect why it died, then raise

    def recv(self, deadline, op):
        """The next reply line as a dict; it must be JSON, an object, and answer `op`."""
        self._pump(deadline, lambda: b"\n" in self.buf or len(self.buf) > MAX_LINE)
        if b"\n" not in self.buf[:MAX_LINE + 1]:
            raise WorkerFailed("rejected", "the worker broke the measurement protocol: a reply line over 1 MB")
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            msg = json.loads(line)
        except ValueError:
            raise WorkerFailed("rejected", f"the worker broke the measurement protocol: not JSON: {line[:80]!r}") from None
        if not isinstance(msg, dict) or msg.get("op") not in (op, "error"):
            raise WorkerFailed("rejected", f"the worker broke the measurement protocol: expected {op!r}, got {str(msg)[:80]}")
        if msg["op"] == "error" or "error" in msg:
            status = msg.get("error") if msg.get("error") in ("runtime_error", "crashed", "compile_error") else "crashed"
            raise WorkerFailed(status, str(msg.get("message", ""))[:2000])
        return msg

    def recv_bytes(self, n, deadline):
        self._pump(deadline, lambda: len(self.buf) >= n)
        data, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return data

    def _pump(self, deadline, done):
        """Read both pipes until `done()`; watch the tree meanwhile. Raises WorkerFailed on a
        deadline, a limit, or a worker that died or closed its channel first."""
        while not done():
            now = time.monotonic()
            if now >= self.next_watch:
                self._watch()
                self.next_watch = now + WATCH_EVERY
            if now > deadline:
                self.kill()
                raise WorkerFailed("timeout", "no answer from the worker before the deadline (killed)")
            if self.out not in self.open:
                self._died()
            ready, _, _ = select.select(list(self.open), [], [], min(WATCH_EVERY, max(0.0, deadline - now)))
            for fd in ready:
                try:
                    chunk = os.read(fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    self.open.discard(fd)
                elif fd == self.out:
                    self.buf += chunk
                else:
                    self.log_bytes += len(chunk)
                    self.log = (self.log + chunk)[-8192:]
                    if self.log_bytes > MAX_LOG:
                        self.kill()
                        raise WorkerFailed("crashed", "output flood: more than 64 MB written to stdout/stderr (killed)")

    def _died(self):
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            raise WorkerFailed("crashed", "the worker closed its result channel (killed)") from None
        self.kill()
        if code < 0 or code > 128:  # bwrap reports a child killed by signal N as 128 + N
            sig = -code if code < 0 else code - 128
            how = f"killed by {signal.Signals(sig).name}" if sig in signal.Signals._value2member_map_ else f"exited with code {code}"
        else:
            how = f"exited with code {code}"
        raise WorkerFailed("crashed", f"worker {how} before reporting; last output: {self.log_tail()[-300:]}")

    def log_tail(self):
        lines = bytes(self.log).decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    # -- watching and ending ----------------------------------------------------------------------

    def tree(self):
        """Pids of the worker and all its descendants (in a PID namespace nothing can leave it)."""
        pids, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            for task in glob.glob(f"/proc/{pid}/task/*/children"):
                try:
                    with open(task) as f:
                        todo += [int(c) for c in f.read().split()]
                except OSError:
                    pass
        return pids

    def cpu_ms(self):
        """CPU time the worker's process tree has used, from the kernel's accounting, which no
        process can forge: each process's CPU clock (all its threads, exited ones included) plus
        what its reaped children used."""
        total_ns = 0
        for pid in self.tree():
            total_ns += _process_cpu_ns(pid)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total_ns += (int(fields[13]) + int(fields[14])) * 10**9 // os.sysconf("SC_CLK_TCK")  # cutime, cstime
            except (OSError, ValueError, IndexError):
                pass
        return total_ns / 1e6

    def _watch(self):
        pids = self.tree()
        if len(pids) > MAX_PROCS + 3:  # + bwrap's own two processes and the worker
            self.kill()
            raise WorkerFailed("crashed", f"more than {MAX_PROCS} processes in the sandbox (killed)")
        # Resident sizes first (cheap; a page shared after a fork counts in every process), the
        # exact proportional sizes only when those add up to more than the limit.
        if sum(_resident_bytes(p) for p in pids) > self.memory_bytes and \
                sum(_memory_bytes(p) for p in pids) > self.memory_bytes:
            self.kill()
            raise WorkerFailed("crashed", f"out of memory: host memory of the worker's processes above "
                                          f"{self.memory_bytes / 2**30:g} GB (killed)")

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL the whole tree. Under bwrap, the sandbox's init dies with it and the kernel
        kills everything left in its PID namespace."""
        for pid in reversed(self.tree()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# The workers of a measuring thread: one trusted reference worker per task, kept (it never loads
# candidate code); a fresh sandbox per candidate, with spares booting in the background. Every
# thread that measures has its own set (measure_pool.py runs one thread per device): two threads
# talking to one reference worker would mix their replies, and a worker's die-with-parent signal
# follows the thread that started it, so a worker stays with its thread.
# ---------------------------------------------------------------------------------------------

# Where the parent puts handed-over bytes for the reference worker (read-only in its sandbox).
EXCHANGE = tempfile.mkdtemp(prefix="gpu-forecasters-measure-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
_THREAD = threading.local()
_ALL_SETS, _ALL_LOCK = [], threading.Lock()


class WorkerSet:
    """The workers of one thread on one device. `visible` is the CUDA_VISIBLE_DEVICES its workers
    get (one GPU, so that it is their cuda:0); None leaves the variable out."""

    def __init__(self, visible):
        self.visible = visible
        self.references, self.spares, self.started = {}, {}, 0

    def reference_worker(self, task, device, sandboxed):
        """(worker, its ready message) for the task; raises WorkerFailed when it cannot start. It
        runs sandboxed exactly when the candidates do, so that both sides of a comparison pay the same."""
        key = (task, device, sandboxed)
        if key not in self.references or not self.references[key][0].alive():
            self.drop_reference()
            w = WorkerProcess("reference", task, device, sandboxed=sandboxed, memory_bytes=math.inf,
                              tmp=os.path.join(EXCHANGE, f"reference-{secrets.token_hex(4)}"),
                              readable=[EXCHANGE], visible=self.visible)
            try:
                self.references[key] = (w, w.recv(time.monotonic() + 600, "ready"))
            except WorkerFailed as e:
                w.kill()
                raise WorkerFailed(e.status, f"{e.message}; last output: {w.log_tail()}") from None
        return self.references[key]

    def drop_reference(self):
        for w, _ in self.references.values():
            w.kill()
        self.references.clear()

    def candidate_worker(self, task, device, sandboxed, memory_bytes):
        """A fresh candidate worker (a booted spare when there is one). A thread that asks a second
        time will likely go on measuring: from then on spares boot while each candidate is measured
        (booting Python, torch and the task takes seconds); two on CPU, one on a GPU machine."""
        key = (task, device, sandboxed)
        spares = self.spares.get(key, [])
        w = spares.pop(0) if spares else None
        if w is None or not w.alive():
            w = self._new_candidate(task, device, sandboxed)
        w.memory_bytes = memory_bytes
        if self.started:
            for other in [k for k in self.spares if k != key]:  # spares of one kind at a time
                for old in self.spares.pop(other):
                    old.kill()
            spares = [s for s in self.spares.get(key, []) if s.alive()]
            while len(spares) < (2 if device == "cpu" else 1):
                spares.append(self._new_candidate(task, device, sandboxed))
            self.spares[key] = spares
        self.started += 1
        return w

    def _new_candidate(self, task, device, sandboxed):
        return WorkerProcess("candidate", task, device, sandboxed=sandboxed, memory_bytes=math.inf,
                             tmp=os.path.join(EXCHANGE, f"candidate-{secrets.token_hex(4)}"), visible=self.visible)

    def close(self):
        self.drop_reference()
        for w in [w for ws in self.spares.values() for w in ws]:
            w.kill()
        self.spares.clear()
        with _ALL_LOCK:
            if self in _ALL_SETS:
                _ALL_SETS.remove(self)


def workers(gpu=None):
    """The calling thread's WorkerSet for a GPU, given by its index among the GPUs this process
    sees (None: the process's CUDA_VISIBLE_DEVICES as it is now, which a Ray task sets to its
    GPU). A thread measures on one device at a time: asking for another closes the previous set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu is not None:
        ids = visible.split(",") if visible else None
        if ids is not None and not 0 <= gpu < len(ids):
            raise ValueError(f"GPU {gpu} is not among the {len(ids)} that CUDA_VISIBLE_DEVICES={visible} shows")
        visible = ids[gpu] if ids else str(gpu)
    ws = getattr(_THREAD, "workers", None)
    if ws is None or ws.visible != visible:
        if ws is not None:
            ws.close()
        ws = _THREAD.workers = WorkerSet(visible)
        with _ALL_LOCK:
            _ALL_SETS.append(ws)
    return ws


def release_workers():
    """End the calling thread's workers (a pool thread, before it exits)."""
    ws = getattr(_THREAD, "workers", None)
    if ws is not None:
        ws.close()
        _THREAD.workers = None


@atexit.register
def _shutdown():
    with _ALL_LOCK:
        sets = list(_ALL_SETS)
    for ws in sets:
        ws.close()
    shutil.rmtree(EXCHANGE, ignore_errors=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _process_cpu_ns(pid):
    """The CPU clock of another process (clock_getcpuclockid), in ns; 0 once it is gone."""
    clock, ts = ctypes.c_int(), _Timespec()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) or _LIBC.clock_gettime(clock, ctypes.byref(ts)):
        return 0
    return ts.tv_sec * 10**9 + ts.tv_nsec


def _memory_bytes(pid):
    """Proportional set size: a page shared by n processes (after a fork) counts 1/n in each, so
    the sum over a tree is the memory the tree really holds. Resident size where PSS is missing."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _resident_bytes(pid)


def _resident_bytes(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
