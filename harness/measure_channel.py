"""measure_channel.py: the process boundary, and everything that crosses it from a worker.

A worker (measure_worker.py) runs in its sandbox (measure_sandbox.py). The only ways out are two
pipes, its replies and its stderr, and what the parent reads of its memory while it is frozen.
Everything that comes through them is a claim from a process that may be hostile, so this file
reads it as one would read network input:

  - one JSON object per line, at most 1 MB, read against a deadline;
  - one typed parser (`parse_reply`): every reply has a schema of fields, types, ranges, sizes and
    nesting; anything else (a missing field, 100k-deep JSON, a 400-digit integer, a string where a
    number belongs, NaN, an unexpected op) is a protocol violation, which measure.py turns into a
    `rejected` verdict with a one-line reason, never an exception in the parent;
  - every string is escaped (`printable`) before anyone sees it: a candidate's error message
    reaches the terminal, the JSON records and the mutator's prompt with its control characters
    (ANSI, OSC 52, bidi overrides) written as visible escapes (mutators.py and report.py show
    the words of records and models through it too).

A WorkerProcess is one worker as the parent sees it: its pipes (every write and every read
non-blocking, against a deadline), its sandbox's limits watched while the parent waits, its freeze
and thaw, its memory read while it is frozen, its CPU clock, its end. What becomes of a worker is
a WorkerFailed: the status it earns, and whether that verdict may be cached. Which workers a
measuring thread keeps, and where: worker_set.py.
"""
import glob
import json
import math
import os
import re
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import unicodedata

from harness.measure_sandbox import MAX_TASKS, WORKER, Sandbox, after_join_filter, can_undo_idle, wait_until, worker_env
from harness.measure_worker import IDLE_ENV, ISOLATE_ENV

MAX_LINE = 1 << 20            # a reply line longer than 1 MB is not a reply
MAX_LOG = 64 << 20            # more than 64 MB on stdout/stderr is a flood
MAX_TEXT = 2000               # characters kept of any string a worker sends
MAX_ITEMS = 4096              # entries in any list a worker sends
WATCH_EVERY = 0.05            # seconds between two looks at a sandbox's limits


class WorkerFailed(Exception):
    """A worker's fate, with the status it earns when the worker is the candidate's, and whether
    that verdict may be cached: yes where it is the candidate's own doing as the parent saw it (its
    reported error, a broken protocol, its process's exit), no where a limit or a deadline, which
    the machine's load or settings move, decided it."""

    def __init__(self, status, message, cacheable=False):
        super().__init__(message)
        self.status, self.message, self.cacheable = status, message, cacheable


def printable(text, limit=MAX_TEXT):
    """`text` on one line with every control, format or separator character escaped (\\x1b,
    \\u202e, \\n), cut to `limit` characters: safe for a terminal, a log and an LLM prompt."""
    out = []
    for ch in str(text)[:limit]:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The typed parser. A schema is a dict {field: type}; a type is int, float, str, bool, a list
# [type], a nested schema, Opt(type) (the field may be absent or null) or Raw (trusted replies
# only: any JSON, e.g. the reference's input layout).
# ---------------------------------------------------------------------------------------------

class Opt:
    def __init__(self, kind):
        self.kind = kind


class Raw:
    pass


TENSOR_SPEC = {"type": str, "plain": bool, "dtype": Opt(str), "shape": Opt([int]), "device": Opt(str),
               "nbytes": Opt(int), "contiguous": Opt(bool)}
# What each op's reply may hold; "error" is every op's alternative. The candidate's replies carry
# no times, memory figures or verdicts: nothing the parent would read from them.
CANDIDATE_REPLIES = {
    "ready": {"role": str, "pid": int},
    "loaded": {},
    "set": {},
    "freshened": {},
    "ran": {"id": int, "index": int, "spec": [TENSOR_SPEC], "out_digests": Opt([str]), "in_digests": [str]},
    "called": {"specs": [TENSOR_SPEC], "where": Opt(str), "container": Opt(str)},
    "bytes": {"id": int, "n": int},
    "error": {"error": str, "message": str},
}
REFERENCE_REPLIES = {
    **CANDIDATE_REPLIES,
    "ready": {"role": str, "pid": int, "cases": Opt(Raw), "min_bytes": Opt([int]), "copy_bandwidth": Opt(float),
              "allowed_dtypes": Opt([str])},
    "loaded": {"clock_at": Opt(int)},
    "prepared": {"id": int, "layouts": Raw, "peak_bytes": Opt(int)},
    "called": {**CANDIDATE_REPLIES["called"], "bytes_per_call": int},
    "ran": {**CANDIDATE_REPLIES["ran"], "ms": float, "bytes_per_call": int, "peak_bytes": int},
    "checked": {"id": int, "ok": bool, "forged": Opt(bool), "message": str, "peak_bytes": Opt(int)},
}
# A timed window's reply (measure_worker.Worker.go): where each output is, "<address>:<dtype
# code>" in hex and decimal, comma-separated; the same from the twin and the candidate.
WHERE = re.compile(rb"[0-9a-f]{1,16}:[0-9]{1,2}(?:,[0-9a-f]{1,16}:[0-9]{1,2}){0,63}")


def parse_where(text):
    """A timed reply (bytes, without its newline) as [(address, dtype code)], or a ProtocolError."""
    if WHERE.fullmatch(text) is None:
        raise ProtocolError(f"a malformed timed reply: {printable(text[:80].decode('utf-8', 'replace'))}")
    return [(int(a, 16), int(c)) for a, c in (x.split(b":") for x in text.split(b","))]


class ProtocolError(ValueError):
    pass


def parse_reply(line, op, trusted=False):
    """The reply `line` (bytes) to an `op` command as a dict of checked, escaped values, or a
    ProtocolError that says in one line what is wrong. Unknown fields are errors too."""
    try:
        msg = json.loads(line, parse_constant=_no_constant)
    except RecursionError:
        raise ProtocolError("a reply nested too deeply") from None
    except ValueError as e:
        raise ProtocolError(f"not JSON ({printable(e, 80)}): {printable(line[:80].decode('utf-8', 'replace'))}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"a reply that is not an object: {printable(repr(msg), 80)}")
    got = msg.get("op")
    replies = REFERENCE_REPLIES if trusted else CANDIDATE_REPLIES
    if got not in (op, "error") or got not in replies:
        raise ProtocolError(f"expected {op!r}, got {printable(repr(got), 40)}")
    schema = dict(replies[got], op=str)
    return _check(msg, schema, got, trusted, depth=0)


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def _check(value, kind, where, trusted, depth):
    if depth > 8:
        raise ProtocolError(f"{where}: nested too deeply")
    if isinstance(kind, Opt):
        return None if value is None else _check(value, kind.kind, where, trusted, depth)
    if kind is Raw:
        if not trusted:
            raise ProtocolError(f"{where}: a field only the trusted side sends")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected true or false")
        return value
    if kind is int:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise ProtocolError(f"{where}: expected an integer in [0, 2^64), got {printable(repr(value), 40)}")
        return value
    if kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1e15:
            raise ProtocolError(f"{where}: expected a number in [0, 1e15), got {printable(repr(value), 40)}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string, got {printable(repr(value), 40)}")
        return printable(value)
    if isinstance(kind, list):
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise ProtocolError(f"{where}: expected a list of at most {MAX_ITEMS} items")
        return [_check(v, kind[0], where, trusted, depth + 1) for v in value]
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object")
        extra = set(value) - set(kind)
        if extra:
            raise ProtocolError(f"{where}: unexpected field {printable(sorted(extra)[0], 40)!r}")
        out = {}
        for field, sub in kind.items():
            if field not in value:
                if isinstance(sub, Opt):
                    out[field] = None
                    continue
                raise ProtocolError(f"{where}: missing field {field!r}")
            out[field] = _check(value[field], sub, f"{where}.{field}", trusted, depth + 1)
        return out
    raise TypeError(kind)


# ---------------------------------------------------------------------------------------------
# One worker process: JSON lines in and out with deadlines, limits watched, killed at the end.
# ---------------------------------------------------------------------------------------------

class WorkerProcess:
    """A worker in its sandbox (plan=None: unsandboxed, its /tmp the folder `scratch`, or one of
    its own removed when it ends). `trusted`: a worker that never loads candidate code (the
    reference worker, the timing twin), whose replies may carry times and whose protocol
    violations are the harness's failures, not a candidate's."""

    def __init__(self, role, task, device, *, plan, memory_bytes, visible=None, binds_rw=(), binds_ro=(),
                 baseline="eager", trusted=None, hash_seed=None, idle=False, host_uid=None, scratch=None):
        self.role, self.memory_bytes = role, memory_bytes
        self.trusted = role == "reference" if trusted is None else trusted
        argv = [sys.executable, "-B", WORKER, role, task, device] + (["compile"] if baseline == "compile" else [])
        if os.path.isabs(task):  # a problem file (the user's, trusted): both workers import it, read-only
            binds_ro = [*binds_ro, task]
        self.own_tmp = None if plan is not None or scratch else tempfile.mkdtemp(prefix=f"{role}-tmp-")
        env = worker_env(device, "/tmp" if plan is not None else scratch or self.own_tmp)
        if hash_seed is not None:  # a candidate and its twin share one (WorkerSet.candidate_pair)
            env["PYTHONHASHSEED"] = hash_seed
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        idle = idle and can_undo_idle()
        if idle:  # a spare: it boots at idle priority until taken (WorkerSet.candidate_pair)
            env[IDLE_ENV] = "1"
        if plan is not None:  # its own keyring, then no keyring calls at all (measure_worker.isolate)
            env[ISOLATE_ENV] = after_join_filter().hex()
        # CPU: the candidate's and the twin's processes start with one address layout (no
        # randomisation; the reference worker, which reads a candidate's bytes, keeps it).
        self.sandbox = Sandbox.start(argv, device, plan, memory_bytes=memory_bytes, env=env,
                                     fixed_layout=role == "candidate" and device == "cpu",
                                     binds_rw=binds_rw, binds_ro=binds_ro, idle=idle, host_uid=host_uid)
        self.proc = self.sandbox.popen
        self.out, self.err, self.cmd = self.proc.stdout.fileno(), self.proc.stderr.fileno(), self.proc.stdin.fileno()
        for fd in (self.out, self.err, self.cmd):
            os.set_blocking(fd, False)
        self.buf, self.log, self.log_bytes = bytearray(), bytearray(), 0
        self.open = {self.out, self.err}
        self.next_watch = 0.0
        self.main_pid = None
        self.mem = None  # /proc/<worker>/mem, opened once (read_memory)
        self.frozen = False
        # kill() may come from two threads at once (the measuring thread's clean-up and a Ctrl-C's
        # exit closing the set): the first kills, the others wait for it; nothing reads the worker's
        # memory through a descriptor that is being closed (its number could be another file's next).
        self.end_lock, self.ended = threading.Lock(), False

    # -- talking -----------------------------------------------------------------------------------

    def send(self, obj, deadline=None):
        """A command, one JSON line (see send_raw)."""
        self.send_raw(json.dumps(obj).encode() + b"\n", deadline)

    def send_raw(self, data, deadline=None):
        """Write `data` to the worker's command pipe without ever blocking past `deadline`
        (default: 60 s from now). The pipe is non-blocking: a worker that stops reading, or that
        fills its own command pipe (it can reopen it through /proc/self/fd/0 where it runs as the
        user that owns the pipe), costs the parent its deadline, then the worker its life
        (timeout), never a parent blocked for good."""
        deadline = time.monotonic() + 60 if deadline is None else deadline
        view = memoryview(data)
        try:
            while view:
                try:
                    view = view[os.write(self.cmd, view):]
                    continue
                except BlockingIOError:
                    pass
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise WorkerFailed("timeout", "the worker stopped taking commands (its command pipe stayed full "
                                                  "past the deadline; killed)")
                self._pump(min(deadline, time.monotonic() + WATCH_EVERY), lambda: False, expire=False)
                select.select([], [self.cmd], [], min(WATCH_EVERY, max(0.0, left)))
        except (BrokenPipeError, OSError, ValueError):
            self._pump(time.monotonic() + 2, lambda: False)  # collect why it died, then raise

    def recv(self, deadline, op):
        """The next reply, checked against the schema of `op` (see parse_reply)."""
        self._pump(deadline, lambda: b"\n" in self.buf or len(self.buf) > MAX_LINE)
        self.watch()  # a limit crossed during the command ends it, whatever the reply says
        if b"\n" not in self.buf[:MAX_LINE + 1]:
            raise WorkerFailed("rejected", "the worker broke the measurement protocol: a reply line over 1 MB", True)
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            msg = parse_reply(line, op, trusted=self.trusted)
        except ProtocolError as e:
            raise WorkerFailed("rejected", f"the worker broke the measurement protocol: {e}", True) from None
        if msg["op"] == "ready":
            self._main_pid()
        if msg["op"] == "error":
            if self.trusted:  # the harness's own side: a HarnessError (harness/sides.py)
                raise WorkerFailed("crashed", msg["message"])
            # A candidate's account of its own failure: its words, said to be its worker's, and
            # the status of a kernel that failed to load or to run. Never `crashed` (or any word of
            # the harness's): that the parent decides from what it sees (the process's end, the
            # cgroup's limits, its own deadlines), and a candidate that could claim it would be
            # measured again every time it is proposed.
            raise WorkerFailed("compile_error" if op == "loaded" else "runtime_error",
                               f"the candidate's worker reported: {msg['message']}", cacheable=True)
        return msg

    def recv_where(self, deadline):
        """A timed window's reply (parse_where): where the call's outputs are; a JSON line there
        is the kernel's error, raised as WorkerFailed."""
        self._pump(deadline, lambda: b"\n" in self.buf or len(self.buf) > MAX_LINE)
        if b"\n" not in self.buf[:MAX_LINE + 1]:
            raise WorkerFailed("rejected", "the worker broke the measurement protocol: a reply line over 1 MB", True)
        line, _, rest = bytes(self.buf).partition(b"\n")
        if line[:1] == b"{":
            self.recv(deadline, "error")  # raises: the kernel's error, or a reply out of place
        self.buf = bytearray(rest)
        try:
            return parse_where(line)
        except ProtocolError as e:
            raise WorkerFailed("rejected", f"the worker broke the measurement protocol: {e}", True) from None

    def recv_bytes(self, n, deadline):
        self._pump(deadline, lambda: len(self.buf) >= n)
        data, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return data

    def _pump(self, deadline, done, expire=True):
        """Read both pipes until `done()`; watch the limits meanwhile. Raises WorkerFailed on a
        deadline (unless not `expire`: then it returns), a limit, or a worker that died or closed
        its channel first."""
        while not done():
            now = time.monotonic()
            if now >= self.next_watch:
                self.watch()
                self.next_watch = now + WATCH_EVERY
            if now > deadline:
                if not expire:
                    return
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
                        raise WorkerFailed("crashed", "output flood: more than 64 MB written to stdout/stderr (killed)", True)

    def _died(self):
        try:
            code = self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - still running, or gone: either way it ends here
            code = None
        limit = self._limit_hit()
        self.kill()
        if limit:
            raise WorkerFailed("crashed", limit)
        if code is None:
            raise WorkerFailed("crashed", "the worker closed its result channel (killed)")
        if code < 0 or code > 128:  # bwrap reports a child killed by signal N as 128 + N
            sig = -code if code < 0 else code - 128
            how = f"killed by {signal.Signals(sig).name}" if sig in signal.Signals._value2member_map_ else f"exited with code {code}"
            if sig in (signal.SIGSEGV, signal.SIGBUS):
                how += " (a write into a read-only input tensor ends this way: candidates must not modify their inputs)"
        else:
            how = f"exited with code {code}"
        # the process ended by its own doing (an exit, a fatal signal): the candidate's verdict
        raise WorkerFailed("crashed", f"worker {how} before reporting; last output: {self.log_tail()[-300:]}", True)

    def log_tail(self):
        lines = bytes(self.log).decode("utf-8", "replace").strip().splitlines()
        return printable(lines[-1]) if lines else ""

    # -- the limits, the clock, the end --------------------------------------------------------------

    def _main_pid(self):
        """The host pid of the worker's Python process (under bwrap, below its init), found when
        it reports ready, before any candidate code runs: the process whose memory the parent
        reads (read_memory). Its command line is the one this class started; bubblewrap's own
        holds it too, after bwrap's options."""
        if self.main_pid is None:
            self.main_pid = 0
            for pid in self.tree():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read().split(b"\0")[:3] == [os.fsencode(sys.executable), b"-B", os.fsencode(WORKER)]:
                            self.main_pid = pid
                            break
                except OSError:
                    pass
        return self.main_pid

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

    def _limit_hit(self):
        """A one-line reason if the sandbox crossed a limit, else ''. With a cgroup the kernel
        enforces the limits and counts the events; without one, the parent looks."""
        cgroup = self.sandbox.cgroup
        if cgroup is not None:
            try:
                oom, refused = cgroup.events()
            except OSError:
                return ""
            if oom:
                return f"out of memory: the sandbox's memory (memfd, tmpfs and page cache included) went above {self.memory_bytes / 2**30:g} GB (killed)"
            if refused:
                return f"more than {MAX_TASKS} tasks (threads and processes) in the sandbox (killed)"
            return ""
        pids = self.tree()
        if sum(_threads(p) for p in pids) > MAX_TASKS + 3:  # + bwrap's own processes
            return f"more than {MAX_TASKS} tasks (threads and processes) in the sandbox (killed)"
        if self.memory_bytes != math.inf and \
                sum(_resident_bytes(p) for p in pids) + _tmpfs_bytes(pids[-1]) > self.memory_bytes and \
                sum(_memory_bytes(p) for p in pids) + _tmpfs_bytes(pids[-1]) > self.memory_bytes:
            return (f"out of memory: the sandbox's processes and its /tmp and /dev/shm held more than "
                    f"{self.memory_bytes / 2**30:g} GB (killed)")
        return ""

    def watch(self):
        reason = self._limit_hit()
        if reason:
            self.kill()
            raise WorkerFailed("crashed", reason)

    # -- frozen between its windows ---------------------------------------------------------------

    def freeze(self, deadline):
        """Stop every task of the worker's sandbox and wait until all are stopped (WorkerFailed
        on the deadline): with its cgroup's freezer, or else SIGSTOP to each of its processes (on
        CPU without a cgroup seccomp lets a sandbox start no process, so its processes are the
        worker and bubblewrap's). A frozen worker uses no CPU, changes no byte of its memory, and
        runs nothing while the other side of a pair is timed."""
        cgroup = self.sandbox.cgroup
        if cgroup is not None and cgroup.can_freeze():
            ok = cgroup.freeze(deadline)
        else:
            pids = self.tree()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
            ok = _wait_stopped(pids, deadline)
        self.frozen = True
        if not ok:
            self.kill()
            raise WorkerFailed("timeout", "the worker could not be frozen before the deadline (killed)")

    def thaw(self):
        if not self.frozen:
            return
        self.frozen = False
        cgroup = self.sandbox.cgroup
        if cgroup is not None and cgroup.can_freeze():
            cgroup.thaw()
            return
        for pid in self.tree():
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass

    def read_memory(self, address, n):
        """n bytes of the worker's memory at `address`, read by the parent (/proc/<pid>/mem) while
        the worker is frozen; None where they are not all mapped and readable. Only the parent's
        read counts: nothing the worker says about its outputs but where they are."""
        if not 0 <= address < 2**63 - n:
            return None
        with self.end_lock:
            if self.ended:
                raise WorkerFailed("crashed", "the worker was ended while its outputs were read")
            if self.mem is None:
                pid = self._main_pid()
                try:
                    self.mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
                except OSError as e:
                    raise WorkerFailed("crashed", f"the parent cannot read the worker's memory ({e.strerror}): "
                                                  "measure.py needs to read /proc/<pid>/mem of its own child processes "
                                                  "(Yama's kernel.yama.ptrace_scope at 0 or 1)") from None
            try:
                data = os.pread(self.mem, n, address) if n else b""
            except OSError:
                return None
        return data if len(data) == n else None

    def cpu_ms(self):
        """The parent's CPU clock of this sandbox (measure_sandbox.Sandbox.cpu_ms)."""
        return self.sandbox.cpu_ms(self.tree() if self.sandbox.cgroup is None else ())

    def peak_bytes(self):
        return self.sandbox.cgroup.peak_bytes() if self.sandbox.cgroup is not None else 0

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL the whole tree and remove the sandbox's cgroup. Under bwrap the sandbox's init
        dies with it and the kernel kills everything left in its PID namespace. Once, whoever
        calls it first (end_lock)."""
        with self.end_lock:
            if self.ended:
                return
            self.ended = True
            self._end()

    def _end(self):
        for pid in reversed(self.tree()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.sandbox.close()
        if self.mem is not None:
            os.close(self.mem)
            self.mem = None
        if self.own_tmp:
            shutil.rmtree(self.own_tmp, ignore_errors=True)


def _wait_stopped(pids, deadline):
    """Wait until every thread of these processes is stopped by a signal (state T or t)."""
    def stopped():
        for tid_stat in (f"/proc/{pid}/task/{tid}/stat" for pid in pids for tid in _task_ids(pid)):
            try:
                with open(tid_stat, "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # it ended
            if state not in (b"T", b"t", b"Z", b"X"):
                return False
        return True
    return wait_until(stopped, deadline)


def _task_ids(pid):
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _threads(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


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


def _tmpfs_bytes(pid):
    """What the sandbox holds in its private /tmp and /dev/shm (memory, not disk), seen through
    one of its processes."""
    total = 0
    for mount in ("tmp", "dev/shm"):
        try:
            st = os.statvfs(f"/proc/{pid}/root/{mount}")
            total += (st.f_blocks - st.f_bfree) * st.f_frsize
        except OSError:
            pass
    return total
