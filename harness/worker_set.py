"""worker_set.py: the workers a measuring thread keeps, the core it times on, and their folders.

measure.py asks this file for its workers (`workers()`): one trusted reference worker per task,
kept from one candidate to the next (it never loads candidate code), and for each candidate a
fresh pair, the candidate's worker and (on CPU) its timing twin, born together; a spare pair boots
in the background while a candidate is measured. Every thread that measures has its own set
(runtime/measure_pool.py runs one thread per device): two threads talking to one reference worker
would mix their replies, and a worker's die-with-parent signal follows the thread that started it.

A set also holds the CPU core its pairs are timed on (claimed machine-wide, `claim_core`), the
thread that evicts that core's caches before every window (`CacheFlusher`), and the folders of
the exchange through which the parent and the workers pass inputs and outputs. Another thread
may close a set at any moment (a Ctrl-C's exit): every change to it holds its lock.
"""
import atexit
import ctypes
import fcntl
import glob
import math
import os
import secrets
import shutil
import tempfile
import threading
import time

from harness.measure_channel import WorkerFailed, WorkerProcess
from harness.measure_sandbox import fresh_host_uid, sandbox_plan, threads, wake_up

_THREAD = threading.local()  # this thread's set (workers)
_ALL_SETS, _ALL_LOCK = [], threading.Lock()  # every open set, closed at exit (_shutdown)


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
    worker_set = getattr(_THREAD, "workers", None)
    if worker_set is None or worker_set.closed or worker_set.visible != visible:  # closed: by another thread
        if worker_set is not None:
            worker_set.close()
        worker_set = _THREAD.workers = WorkerSet(visible)
        with _ALL_LOCK:
            _ALL_SETS.append(worker_set)
    return worker_set


def release_workers():
    """End the calling thread's workers (a pool thread, before it exits)."""
    worker_set = getattr(_THREAD, "workers", None)
    if worker_set is not None:
        worker_set.close()
        _THREAD.workers = None


class WorkerSet:
    """The workers of one thread on one device. `visible` is the CUDA_VISIBLE_DEVICES its workers
    get (one GPU, so that it is their cuda:0); None leaves the variable out. Three folders link it
    to its workers: `inputs` (the reference worker writes each block's inputs there), `shown`
    (the arenas: the parent copies a call's inputs into one just before that call's window; the
    candidate and its twin see only this folder, read-only) and `handover` (a candidate's output
    bytes, read by the parent from its frozen process, for the reference worker to check).

    Its thread measures; any other thread may close it (a Ctrl-C's exit, release_workers): every
    change to its workers and folders, and every look at them, holds `lock`, and a worker started
    after the set closed is killed at once."""

    def __init__(self, visible):
        self.visible = visible
        self.lock = threading.RLock()
        self.references, self.spares, self.last_key = {}, {}, None
        self.started = []  # every worker this set started and has not seen end: close() ends them
        self.dirs, self.closed = None, False
        self.reference_uid = fresh_host_uid()  # as root: its reference workers' host uid (_dirs)
        # One core runs this set's reference and candidate while a candidate is measured (they
        # never run at once): the two sides of every comparison on the same hardware, and a
        # booting spare elsewhere, so that importing torch does not run beside a timed call.
        # They boot unpinned, side by side (measure._measure_once pins them).
        # The core is claimed machine-wide (claim_core): two processes that measure at once
        # (two CLIs, the test suite's processes) time their pairs on cores of their own.
        global _SETS_MADE
        cores = sorted(os.sched_getaffinity(0))
        core, self.core_lock = claim_core(cores, _SETS_MADE)
        self.core = {core}
        self.spare_cores = set(cores) - self.core or self.core
        self.flusher = None  # CPU: the CacheFlusher of the timed core, started with the first measurement
        _SETS_MADE += 1

    def _dirs(self, plan):
        # As root, the reference worker's sandbox runs as a host uid of its own, which owns the
        # folder it writes the inputs into (and nothing else does).
        owner = self.reference_uid if plan is not None and plan.drop_uid else None
        with self.lock:
            if self.closed:
                raise WorkerFailed("crashed", "the measurement's workers were closed (interrupted)")
            if self.dirs is None:
                self.dirs = {"inputs": _private_dir("inputs-", owner), "shown": _private_dir("shown-"),
                             "handover": _private_dir("handover-")}
            elif owner is not None and os.stat(self.dirs["inputs"]).st_uid != owner:
                # made by an unsandboxed measurement (--unsafe-no-sandbox) of this thread
                os.chown(self.dirs["inputs"], owner, owner)
            return dict(self.dirs)

    def _start(self, role, *args, plan, **kw):
        """A new WorkerProcess, known to the set (close ends it). Started under the set's lock:
        a close() from another thread (a Ctrl-C's exit) waits for a sandbox being started and ends
        it, so none outlives the set (a bwrap started while the process exited was left behind
        once in 94 Ctrl-Cs, before it had tied its life to its parent's). Unsandboxed, its /tmp is
        a folder of the exchange (a sandbox has its own)."""
        with self.lock:
            if self.closed:
                raise WorkerFailed("crashed", "the measurement's workers were closed (interrupted)")
            scratch = None if plan is not None else tempfile.mkdtemp(dir=exchange(), prefix=f"{role}-tmp-")
            w = WorkerProcess(role, *args, plan=plan, scratch=scratch, **kw)
            self.started = [x for x in self.started if x.alive()] + [w]
        return w

    def reference_worker(self, task, device, sandboxed, baseline="eager"):
        """(worker, its ready message) for the task; raises WorkerFailed when it cannot start. It
        runs sandboxed exactly when the candidates do, so that both sides of a comparison pay the same.
        baseline "compile": its reference is torch.compile'd (measure.py --baseline compile)."""
        key = (task, device, sandboxed, baseline)
        with self.lock:
            found = self.references.get(key)
        if found is not None and found[0].alive():
            return found
        self.drop_reference()
        plan = sandbox_plan() if sandboxed else None
        d = self._dirs(plan)
        w = self._start("reference", task, device, plan=plan, memory_bytes=math.inf, visible=self.visible,
                        binds_rw=[(d["inputs"], d["inputs"])], binds_ro=[d["handover"]], baseline=baseline,
                        host_uid=self.reference_uid)
        try:
            found = (w, w.recv(time.monotonic() + 600, "ready"))
        except WorkerFailed as e:
            w.kill()
            raise WorkerFailed(e.status, f"{e.message}; last output: {w.log_tail()}") from None
        with self.lock:
            self.references[key] = found
        return found

    def cache_flusher(self):
        """The set's CacheFlusher (CPU), started on first use."""
        with self.lock:
            if self.flusher is None:
                self.flusher = CacheFlusher(self.core)
            return self.flusher

    def drop_reference(self):
        with self.lock:
            gone = [w for w, _ in self.references.values()]
            self.references.clear()
        for w in gone:
            w.kill()

    def candidate_pair(self, task, device, sandboxed, memory_bytes):
        """(a fresh candidate worker, its timing twin): a booted spare pair when there is one. On a
        GPU the twin is None (the reference worker times itself there). A thread that asks twice in
        a row for the same kind (task, device, sandbox, memory), or that just took a spare of it,
        will likely go on measuring that kind: then a spare pair boots while the candidate is
        measured (booting Python, torch and the task takes seconds), on another core and at idle
        priority (measure_sandbox.idle_priority: the reference worker makes the next inputs on
        that core, and a boot beside it once cost a measurement three quarters of its windows),
        and the spares of other kinds end. A one-off of another kind starts no spare (it would end unused)
        and leaves the waiting spare of the kind before it alone.

        The twin (CPU, measure.py) is the reference's side of every timed pair. It is a candidate
        worker in all but one thing: it is trusted (it loads the reference, never a candidate). A
        process runs the same code a few percent faster or slower depending on its history and
        its start (measured: the reference worker, which writes every block's inputs and checks
        outputs, ran the reference's own calls 5 to 10% faster than a candidate worker; a twin kept
        from one measurement to the next drifted from fresh candidates; two fresh processes differ
        by 2 to 12% for the same calls, mostly by their hash seed), so each measurement gets a
        fresh pair, born together: the same way, on the same core, with one address layout and
        one hash seed, seeing the same arenas at the same path (common random numbers: what would
        make one side slower makes the other as slow)."""
        kind = (task, device, sandboxed, memory_bytes)
        with self.lock:
            spares = self.spares.get(kind, [])
            pair = spares.pop(0) if spares else None
        took_spare = pair is not None
        if took_spare:
            for w in _members(pair):
                wake_up(w.tree())
        if pair is None or not all(w.alive() for w in _members(pair)):
            for w in _members(pair or ()):
                w.kill()
            pair = self._new_pair(task, device, sandboxed, memory_bytes)
        if took_spare or kind == self.last_key:
            with self.lock:
                ended = [w for k in [k for k in self.spares if k != kind]  # spares of one kind at a time
                         for old in self.spares.pop(k) for w in _members(old)]
                spares = [p for p in self.spares.get(kind, []) if all(w.alive() for w in _members(p))]
            for w in ended:
                w.kill()
            while len(spares) < 1:
                spares.append(self._new_pair(task, device, sandboxed, memory_bytes, idle=True))
                for w in _members(spares[-1]):
                    pin(w, self.spare_cores)
            with self.lock:
                self.spares[kind] = spares
        self.last_key = kind
        return pair

    def _new_pair(self, task, device, sandboxed, memory_bytes, idle=False):
        plan = sandbox_plan() if sandboxed else None
        d = self._dirs(plan)
        seed = str(secrets.randbelow(2**32))  # PYTHONHASHSEED's range
        cand = self._start("candidate", task, device, plan=plan, memory_bytes=memory_bytes, visible=self.visible,
                           binds_ro=[d["shown"]], hash_seed=seed, idle=idle)
        if device != "cpu":
            return cand, None
        twin = self._start("candidate", task, device, plan=plan, memory_bytes=memory_bytes, visible=self.visible,
                           binds_ro=[d["shown"]], trusted=True, hash_seed=seed, idle=idle)
        return cand, twin

    def close(self):
        """End every worker of the set and remove its folders; safe from any thread, and twice."""
        with self.lock:
            self.closed = True
            gone = self.started + [w for w, _ in self.references.values()] + \
                [w for spares in self.spares.values() for pair in spares for w in _members(pair)]
            self.started, self.references, self.spares = [], {}, {}
            dirs, self.dirs = self.dirs, None
            core_lock, self.core_lock = self.core_lock, None
            flusher, self.flusher = self.flusher, None
        for w in gone:
            w.kill()
        if flusher is not None:
            flusher.close()
        if core_lock is not None:
            os.close(core_lock)  # the core is free for another set
        for path in (dirs or {}).values():
            shutil.rmtree(path, ignore_errors=True)
        with _ALL_LOCK:
            if self in _ALL_SETS:
                _ALL_SETS.remove(self)


def _members(pair):
    """The workers of a (candidate, twin) pair: a GPU pair has no twin."""
    return [w for w in pair if w is not None]


# ---------------------------------------------------------------------------------------------
# The timed core: claimed machine-wide, the pair's threads pinned to it, its caches evicted
# before every window.
# ---------------------------------------------------------------------------------------------

_SETS_MADE = 0
CORE_LOCKS = None  # the folder of the per-core lock files; None: in_memory()


def claim_core(cores, first):
    """(core, the file descriptor that holds it, or None): the first of `cores`, from the last one
    down, starting `first` places in, that no other worker set on this machine holds. A set holds
    its core with an flock on a file named after it, which the kernel releases when the set closes
    it or its process ends, however it ends. Every core held: `first`'s, shared."""
    place = CORE_LOCKS or in_memory()
    for k in range(len(cores)):
        core = cores[-1 - (first + k) % len(cores)]
        try:  # read-only is enough for flock, so any user may take a core another user's file names
            fd = os.open(os.path.join(place, f"gpu-forecasters-core-{core}.lock"), os.O_RDONLY | os.O_CREAT, 0o444)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return core, fd
        except OSError:
            os.close(fd)
    return cores[-1 - first % len(cores)], None


def pin(worker, cores):
    """Every thread of the worker's tree onto `cores` (threads it starts later inherit it)."""
    for tid in threads(worker.tree()):
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:
            pass


class CacheFlusher:
    """A thread of the parent's, pinned to the core where a pair of windows is timed, that evicts
    that core's own caches (L1 and L2) when asked: measure.py asks right before every window, so
    that each window starts from the same cache state whatever ran before it. Without it a side's
    speed followed what the other side had left in the core's caches: the reference's small CPU
    case of cross_entropy ran 0.51 ms a call after its own windows and 0.72 ms after a candidate's
    whose threads had swept the L2, so a candidate's footprint moved its verdict (a GPU's harness
    flushes the GPU's L2 before every call for the same reason; TVM's CPU measurements flush too).
    The eviction writes a buffer the size of the core's L2 (glibc's memset of that size writes
    through the caches). Its cost, a few hundred microseconds a window on the 2-core VM, is
    outside the windows."""

    def __init__(self, core):
        self.size = l2_bytes(core)
        self.buf = ctypes.create_string_buffer(self.size)
        self.ask_r, self.ask_w = os.pipe()
        self.done_r, self.done_w = os.pipe()
        self.thread = threading.Thread(target=self._serve, args=(core,), daemon=True, name="cache-flusher")
        self.thread.start()

    def _serve(self, core):
        os.sched_setaffinity(0, core)  # this thread only
        while os.read(self.ask_r, 1) == b"f":
            ctypes.memset(self.buf, 1, self.size)  # the GIL is released meanwhile
            os.write(self.done_w, b"d")
        for fd in (self.ask_r, self.done_w):
            os.close(fd)

    def flush(self):
        os.write(self.ask_w, b"f")
        if os.read(self.done_r, 1) != b"d":
            raise OSError("the cache flusher ended")

    def close(self):
        os.write(self.ask_w, b"q")
        self.thread.join(timeout=5)
        for fd in (self.ask_w, self.done_r):
            os.close(fd)


def l2_bytes(core, default=2 << 20):
    """The size of the given core's (set's first core's) private L2 cache, from sysfs."""
    for index in glob.glob(f"/sys/devices/system/cpu/cpu{min(core)}/cache/index*"):
        try:
            if _read_text(f"{index}/level") == "2":
                size = _read_text(f"{index}/size")
                return int(size[:-1]) << {"K": 10, "M": 20}[size[-1]] if size[-1] in "KM" else int(size)
        except (OSError, ValueError):
            continue
    return default


def _read_text(path):
    with open(path) as f:
        return f.read().strip()


# ---------------------------------------------------------------------------------------------
# The exchange: a folder in memory (/dev/shm) through which the parent and the workers pass
# inputs and outputs, one folder of it per set and purpose; removed at exit.
# ---------------------------------------------------------------------------------------------

_EXCHANGE = None


def exchange():
    """The folder (in memory where /dev/shm is writable) through which the parent and the
    workers pass inputs and handed-over outputs; made on first use, removed at exit."""
    global _EXCHANGE
    with _ALL_LOCK:
        if _EXCHANGE is None:
            place = os.environ.get("GPU_FORECASTERS_EXCHANGE") or in_memory()
            _remove_stale_exchanges(place)
            _EXCHANGE = tempfile.mkdtemp(prefix=f"{EXCHANGE_PREFIX}{os.getpid()}-", dir=place)
            os.chmod(_EXCHANGE, 0o711)  # the sandbox's user passes through to its own folders
            atexit.register(_shutdown)
    return _EXCHANGE


EXCHANGE_PREFIX = "gpu-forecasters-measure-"


def _remove_stale_exchanges(place):
    """A process killed outside Python (SIGKILL, os._exit) leaves its exchange folder behind, in
    memory under /dev/shm; each new one removes those whose process (named in the folder) is gone."""
    for path in glob.glob(os.path.join(place, f"{EXCHANGE_PREFIX}*-*")):
        pid = os.path.basename(path)[len(EXCHANGE_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or os.stat(path).st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # alive (another user's process: not ours to remove)


def in_memory():
    """A folder every process of this machine sees: /dev/shm where it is writable (in memory),
    else the temporary folder."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _private_dir(prefix, owner=None):
    path = tempfile.mkdtemp(dir=exchange(), prefix=prefix)
    os.chmod(path, 0o755)
    if owner is not None:  # the host uid of the sandboxed worker that writes there
        os.chown(path, owner, owner)
    return path


def new_token():
    return secrets.token_hex(8)


def _shutdown():
    with _ALL_LOCK:
        sets = list(_ALL_SETS)
    for worker_set in sets:
        worker_set.close()
    if _EXCHANGE:
        shutil.rmtree(_EXCHANGE, ignore_errors=True)
