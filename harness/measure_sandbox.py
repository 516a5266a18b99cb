"""measure_sandbox.py: the operating-system side of measure.py's trust boundary.

measure.py decides what to run and what to believe; measure_channel.py talks to the workers; this
file confines them. A candidate kernel is code written by an LLM that a reinforcement-learning loop
rewards for every measurement it games, so its worker runs inside layers that existing engines
provide, not rules of our own:

  bubblewrap    (`bwrap`, the unprivileged sandbox behind Flatpak) gives the worker its own user,
                PID, network, IPC, UTS and cgroup namespaces, no capabilities, and a filesystem
                built from an allowlist: the interpreter and its site-packages, the task files,
                what the linker (and on a GPU, CUDA and Triton) read, a private size-limited /tmp
                and /dev/shm, a minimal /dev. Nothing else of the host exists inside: no home, no
                /etc/shadow, no host unix sockets, no project beyond the task files.
  seccomp       a filter built with libseccomp (as Flatpak builds its own) and handed to bwrap:
                no keyring calls but joining a fresh anonymous session keyring (the worker does,
                first thing, then forbids keyring calls altogether), no ptrace, no new
                namespaces, no mounts, no bpf, perf or io_uring, no sockets, no inotify or
                message queues (quotas of the host's user); where no cgroup counts a sandbox's memory and processes
                (below), also no memfd, SysV shared memory or message queues, and on CPU no new
                processes.
  a cgroup      per sandbox, where the machine lets this process create one (cgroup v2 with a
                delegated subtree, or v1 as root): its CPU clock counts every thread and process
                the candidate ever started, reaped or not, which is the clock measure.py trusts on
                CPU; its memory limit counts what the candidate holds in memfds, tmpfs and page
                cache; its task limit counts threads.
  uid           the sandbox runs as uid 65534 (nobody) inside; when this process is root, outside
                as a host uid of its own, drawn for it from a range no user has (fresh_host_uid): the
                kernel's per-user counts (pipe buffers, epoll watches, descriptors in flight, ...)
                are then that sandbox's alone, and nothing it fills is anyone else's.
  rlimits       set from outside before the sandbox starts: file descriptors, file size, core
                dumps, and the counts the kernel charges to the user that created the sandbox's
                user namespace whatever uid runs inside (pending signals, processes, locked
                memory, message-queue bytes), so that no sandbox can fill them for the host.

A sandbox starts blocked: bwrap creates its namespaces, tells us its pids, and waits; we put both
processes in the cgroup, set their limits and write the uid map, then let it go on. So nothing
that runs in the sandbox ever ran outside its cgroup or limits.

Which layers a machine gets is decided once per process (`sandbox_plan()`) and named in every
measurement (`Measurement.sandbox`); docs/MEASUREMENT.md says what each combination leaves open.
"""
import contextlib
import ctypes
import errno
import glob
import json
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
WORKER = os.path.join(ROOT, "harness", "measure_worker.py")
SANDBOX_UID = 65534           # nobody
# As root, each sandbox's uid 65534 is a host uid of its own from this range (fresh_host_uid): far above
# the uids of users, of systemd's dynamic users (61184-65519) and of the usual subordinate ranges
# containers map (100000 and up, 65536 each).
HOST_UID_BASE, HOST_UID_SPAN = 0x7A000000, 1 << 24
MAX_TASKS = 128               # threads and processes in one sandbox (a worker runs about ten)
MAX_FILES = 1024              # open file descriptors
MAX_PENDING_SIGNALS = 64      # queued signals: charged to the namespace's creator (root) too
MAX_LOCKED_BYTES = 64 << 10   # mlock()ed memory
MAX_FILE_BYTES = 1 << 30      # the largest file a sandbox may write (its /tmp is memory)
TMP_BYTES, SHM_BYTES = 2 << 30, 1 << 30
# Files of /proc that show more than the sandbox's own processes, and that no kernel, Python,
# torch or Triton reads: the keyrings and key quotas of every process of the host user (other
# sandboxes' included), the kernel's symbols, modules, timers, locks and interrupt counters.
# Each is replaced by an empty file inside the sandbox.
HOST_VIEWS = ("keys", "key-users", "kallsyms", "modules", "timer_list", "sched_debug", "sysrq-trigger",
              "kcore", "kmsg", "vmallocinfo", "slabinfo", "iomem", "ioports", "locks", "interrupts", "softirqs")
INSTALL_HINT = ("install bubblewrap and libseccomp (Debian/Ubuntu: apt-get install bubblewrap libseccomp2; "
                "pip install pyseccomp) or pass --unsafe-no-sandbox (candidate code then runs unconfined, as you)")


ADDR_NO_RANDOMIZE = 0x0040000


@contextlib.contextmanager
def fixed_address_layout(on=True):
    """Processes started inside this block (from this thread) get no address-space randomisation.
    On CPU the same code runs a few percent faster or slower from one process to the next with
    where its libraries, heap and mappings land; the two sides of a timed pair (the candidate and
    the reference's timing twin, measure.py) start with the same layout this way, so only what
    the candidate itself allocates moves it. It weakens nothing the sandbox relies on: the
    candidate runs its own code in that process anyway. The flag is per thread and inherited
    through bubblewrap's exec; a setuid bubblewrap would drop it (then layouts stay random)."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = libc.personality(0xFFFFFFFF) if on else -1
    if old == -1:
        yield
        return
    libc.personality(old | ADDR_NO_RANDOMIZE)
    try:
        yield
    finally:
        libc.personality(old)


@contextlib.contextmanager
def idle_priority(on=True):
    """Processes started inside this block (from this thread) run at idle priority (SCHED_IDLE):
    they take a core only when nothing else wants it. A spare worker boots this way (importing
    torch takes seconds of CPU) so that it does not slow the measurement in progress, whose
    reference worker makes the next inputs on the same core. Where the kernel groups processes by
    session (autogroup), a policy counts only within the group: the worker lowers its own group
    as it starts (measure_worker.IDLE_ENV). wake_up undoes both when the spare is taken, so ask
    for it only where this process may (can_undo_idle): elsewhere an idle worker could starve on
    a busy machine."""
    if not on:
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)  # pid 0: this thread
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


_UNDO_IDLE = []


def can_undo_idle():
    """Whether this process may take a thread out of idle priority (root, or CAP_SYS_NICE), tried
    once in a thread of its own."""
    if not _UNDO_IDLE:
        def attempt():
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                _UNDO_IDLE.append(True)
            except (OSError, AttributeError):
                _UNDO_IDLE.append(False)
        probe = threading.Thread(target=attempt)
        probe.start()
        probe.join()
    return _UNDO_IDLE[0]


def threads(pids):
    """The thread ids of these processes, as they are now (one that ended is left out)."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        yield from map(int, tids)


def wake_up(pids):
    """These processes back to normal priority (idle_priority): each one's session group, and
    every thread, again until none is left idle (a thread started by one not yet woken inherits
    idle priority)."""
    for pid in pids:
        try:
            _write(f"/proc/{pid}/autogroup", "0")
        except OSError:
            pass  # it ended, or the kernel has no autogroups
    for _ in range(5):
        left = 0
        for tid in threads(pids):
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    left += 1
            except OSError:
                pass  # it ended
        if not left:
            return


class SandboxUnavailable(ValueError):
    """bubblewrap or libseccomp is missing, or cannot create its namespaces on this machine."""


# ---------------------------------------------------------------------------------------------
# The filesystem inside: an allowlist.
# ---------------------------------------------------------------------------------------------

def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def python_paths():
    """What the interpreter needs, as (source, where the sandbox sees it): its prefixes (stdlib,
    libpython, the virtualenv) and every site-packages directory on sys.path. Each is bound where
    it really is and, where a symbolic link leads to it (a virtualenv folder that is a link, a
    shim), also under the name the interpreter uses: the worker is started as sys.executable,
    which must exist inside too. Not the project (only its task files are bound)."""
    named = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
             os.path.dirname(os.path.realpath(sys.executable))}
    named |= {p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p)}
    pairs = {}
    for p in named:
        real, name = os.path.realpath(p), os.path.abspath(p)
        pairs[real] = real
        pairs.setdefault(name, real)
    keep = []
    for dest in sorted(d for d in pairs if not _under(d, "/usr")):  # /usr is bound whole
        src = pairs[dest]
        # a folder inside one already bound is there, unless a link moved it elsewhere
        if not any(_under(dest, d) and src == os.path.join(s, os.path.relpath(dest, d))
                   for s, d in keep):
            keep.append((src, dest))
    return keep


def bwrap_argv(device, binds_rw=(), binds_ro=(), open_parents=False):
    """bwrap's arguments for a worker's sandbox (see the module docstring), up to the command.
    open_parents: create the folders above each bind world-readable (bwrap makes them 0700, owned
    by whoever builds the sandbox: as root, the unprivileged user inside could not pass them)."""
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user",
            "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    made = {"/", "/usr"}

    def bind(kind, src, dest):
        if open_parents:
            for parent in _ancestors(os.path.dirname(dest.rstrip("/"))):
                if parent not in made:
                    argv.extend(["--perms", "0755", "--dir", parent])
                    made.add(parent)
        argv.extend([kind, src, dest])
        made.add(dest)

    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):  # merged /usr: links into it
        if os.path.islink(top):
            argv.extend(["--symlink", os.readlink(top), top])
        elif os.path.isdir(top):
            bind("--ro-bind", top, top)
    # A minimal /dev, less the pseudo-terminal multiplexer: each terminal opened there is taken
    # from a machine-wide count (kernel.pty.max less what the host's own instance keeps)
    argv.extend(["--proc", "/proc", "--dev", "/dev", "--ro-bind", "/dev/null", "/dev/pts/ptmx"])
    for view in HOST_VIEWS:  # the sandbox's own /proc, less what it shows of the host and its users
        if os.path.exists(f"/proc/{view}"):
            argv.extend(["--ro-bind", "/dev/null", f"/proc/{view}"])
    for size, path in ((TMP_BYTES, "/tmp"), (SHM_BYTES, "/dev/shm")):
        argv.extend((["--perms", "1777"] if open_parents else []) + ["--size", str(size), "--tmpfs", path])
    made |= {"/proc", "/dev", "/tmp", "/dev/shm"}
    for etc in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives"):  # the linker; cc -> gcc
        bind("--ro-bind-try", f"/etc/{etc}", f"/etc/{etc}")
    for src, dest in python_paths():
        bind("--ro-bind", src, dest)
    # The harness's own files, alone: the worker, the digest it computes on a GPU, and the task definitions.
    bind("--ro-bind", WORKER, WORKER)
    for name in ("__init__.py", "fingerprint.py"):  # the GPU workers' digests (measure_worker.Worker.run)
        bind("--ro-bind", os.path.join(ROOT, "harness", name), os.path.join(ROOT, "harness", name))
    bind("--ro-bind", os.path.join(ROOT, "tasks"), os.path.join(ROOT, "tasks"))
    if device == "cuda":
        bind("--ro-bind", "/sys", "/sys")  # the driver reads PCI topology and module parameters
        for dev in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")):
            bind("--dev-bind", dev, dev)
        extra = [os.environ.get(k, "") for k in ("CUDA_HOME", "CUDA_PATH")]
        extra += os.environ.get("LD_LIBRARY_PATH", "").split(":")
    else:
        bind("--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu")  # torch's cpuinfo
        extra = []
    extra += os.environ.get("GPU_FORECASTERS_SANDBOX_BIND", "").split(":")  # a site's own CUDA or compiler
    for path in sorted({os.path.realpath(p) for p in extra if p and os.path.isdir(p)}):
        if not _under(path, "/usr"):
            bind("--ro-bind", path, path)
    for path in binds_ro:  # a path, or (source, where the sandbox sees it)
        src, dest = path if isinstance(path, tuple) else (path, path)
        bind("--ro-bind", src, dest)
    for src, dest in binds_rw:
        bind("--bind", src, dest)
    return argv + ["--chdir", "/tmp"]


def _ancestors(path):
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def worker_env(device, tmp):
    """A clean environment: no secrets or settings of the caller's shell reach a worker."""
    keep = ("LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CC", "CXX",
            "PYTHONPATH")  # where the parent's interpreter finds its packages (the sandbox binds them: python_paths)
    env = {k: v for k, v in os.environ.items()
           if k in keep or k.startswith("NVIDIA_") or (k.startswith("TRITON_") and k != "TRITON_CACHE_DIR")}
    env.update(HOME=tmp, TMPDIR=tmp, USER="nobody", LOGNAME="nobody",
               PATH=os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
               PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1",
               TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               # glibc keeps freed memory instead of returning it to the system, so that what a
               # kernel frees does not turn into page faults in the harness's next allocation
               MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(1 << 40))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # before any @triton.jit runs: the worker has no GPU
        preload = jemalloc()
        if preload:
            env.update(LD_PRELOAD=preload, MALLOC_CONF=JEMALLOC_CONF)
    return env


# On CPU every worker allocates with jemalloc where the machine has it (Debian/Ubuntu:
# libjemalloc2). Under glibc, where a freed 256 KB tensor comes back from depends on everything the
# process allocated before, so two processes running the same code on the same inputs could differ
# by up to 25% for their whole lives: the candidate's and its twin's windows then disagreed in an
# A/A test (docs/MEASUREMENT.md, The clock and the A/A check). jemalloc's thread cache hands back the
# block freed last, whatever came before, as a GPU's caching allocator does. Its cache takes blocks
# up to 4 MB, and freed memory is kept (no decay), so that no page fault lands in a window.
JEMALLOC_CONF = "tcache_max:4194304,dirty_decay_ms:-1,muzzy_decay_ms:-1"
JEMALLOC_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def jemalloc():
    """jemalloc's path under /usr (which every sandbox binds), or None: then glibc, and an A/A
    spread that bench_measure.py --aa shows. GPU_FORECASTERS_NO_JEMALLOC=1 keeps glibc."""
    if os.environ.get("GPU_FORECASTERS_NO_JEMALLOC") == "1":
        return None
    return next((p for d in JEMALLOC_DIRS if os.path.isfile(p := os.path.join(d, "libjemalloc.so.2"))), None)


# ---------------------------------------------------------------------------------------------
# The seccomp filter: built with libseccomp, exported as BPF, handed to bwrap (--seccomp FD).
# ---------------------------------------------------------------------------------------------

# Never needed by a kernel, Python, torch, Triton or CUDA; each is a way out of the sandbox or
# into another process.
DENIED = ["ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
          "add_key", "request_key",
          "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
          "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
          "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "fanotify_init", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
          "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
          "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "vhangup",
          "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "uselib",
          "migrate_pages", "move_pages",
          # the parent pins both sides of a comparison to one core (worker_set.pin): a
          # candidate that moved itself to a quieter core would be timed on other hardware
          "sched_setaffinity",
          # quotas the kernel keeps per host user, not per sandbox: a candidate holding many
          # instances would keep every other worker of that user from starting (inotify's 128
          # instances, the message-queue bytes)
          "inotify_init", "inotify_init1", "mq_open",
          # pages handed to a pipe by reference stay the writer's to change after they were sent
          "vmsplice",
          # work the kernel would do on the sandbox's behalf later, while it is frozen and the
          # other side of a pair is timed on the same core: a timer's expiry (and every waiter it
          # wakes: thousands of epoll instances watching one timerfd) runs in interrupt context,
          # charged to whichever task is running then. A kernel needs no timer: its waits are
          # sleeps and timeouts, which the freeze interrupts (measure_channel.WorkerProcess.freeze)
          "timer_create", "timerfd_create", "setitimer", "alarm",
          # asynchronous I/O completes later, outside the windows too, and its contexts are a
          # machine-wide count (fs.aio-max-nr): one sandbox could take every slot
          "io_setup", "io_submit", "io_cancel", "io_destroy", "io_getevents", "io_pgetevents",
          # the one unix socket a sandbox could make (socket() is refused below): descriptors in
          # flight over it are a per-user count of the host's
          "socketpair"]
# Where no cgroup counts memory: memory a process can hold without mapping it.
DENIED_WITHOUT_CGROUP = ["memfd_create", "shmget"]
# Refused by the worker's second filter, which it installs itself once it has joined its fresh
# session keyring and before it reads a command (measure_worker.isolate): every keyring call
# charges the host user's key quota, which a candidate joining keyrings again and again would
# exhaust for every other worker of that user.
DENIED_AFTER_JOIN = ["keyctl", "add_key", "request_key"]
CLONE_THREAD = 0x00010000
CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
KEYCTL_JOIN_SESSION_KEYRING = 1
F_SETPIPE_SZ = 1031
_FILTERS = {}


def seccomp_filter(no_processes, no_hidden_memory):
    """The BPF program (bytes) for a sandbox. no_processes: only threads may be created (a CPU
    sandbox whose CPU time no cgroup counts); no_hidden_memory: no memfd or SysV shm. Once the
    worker has joined its fresh keyring it adds a second filter of its own that forbids every
    keyring call (measure_worker.isolate)."""
    key = (no_processes, no_hidden_memory)
    if key not in _FILTERS:
        try:
            import pyseccomp as sc
        except (ImportError, RuntimeError) as e:  # RuntimeError: the module found no libseccomp
            raise SandboxUnavailable(f"libseccomp is not usable here ({e}): {INSTALL_HINT}") from None
        eperm = sc.ERRNO(errno.EPERM)
        f = sc.SyscallFilter(sc.ALLOW)  # calls of other architectures (i386, x32) are killed
        for name in DENIED + (DENIED_WITHOUT_CGROUP if no_hidden_memory else []):
            f.add_rule(eperm, name)
        # keyctl only to join a fresh anonymous session keyring (arg0 = JOIN, arg1 = NULL name)
        f.add_rule(eperm, "keyctl", sc.Arg(0, sc.NE, KEYCTL_JOIN_SESSION_KEYRING))
        f.add_rule(eperm, "keyctl", sc.Arg(1, sc.NE, 0))
        # no socket of any family: a kernel needs none, the network namespace is empty, and
        # unix, netlink and vsock sockets reach past it (a host socket bound by mistake, the
        # kernel's netlink families, the hypervisor); socketpair stays
        f.add_rule(sc.ERRNO(errno.EACCES), "socket")
        # a pipe's buffer is charged to the user (fs.pipe-user-pages-soft): the default 64 KB, never
        # more (F_SETPIPE_SZ)
        f.add_rule(eperm, "fcntl", sc.Arg(1, sc.EQ, F_SETPIPE_SZ))
        # clone3 passes its flags in memory, which seccomp cannot read: ENOSYS makes glibc use
        # clone, whose flags it can (threads and processes both start through it)
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for bit in CLONE_NAMESPACES:
            f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
        if no_processes:
            f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
            for name in ("fork", "vfork"):
                f.add_rule(eperm, name)
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            _FILTERS[key] = tmp.read()
    return _FILTERS[key]


def after_join_filter():
    """The worker's second filter (DENIED_AFTER_JOIN), built here with libseccomp and exported as
    BPF, as the sandbox's own filter is: the worker only loads it (measure_worker.isolate), so it
    needs neither libseccomp's Python binding nor the subprocesses its import would start to
    find the library, which a sandbox without a cgroup refuses."""
    if "after_join" not in _FILTERS:
        import pyseccomp as sc
        f = sc.SyscallFilter(sc.ALLOW)
        for name in DENIED_AFTER_JOIN:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            _FILTERS["after_join"] = tmp.read()
    return _FILTERS["after_join"]


# ---------------------------------------------------------------------------------------------
# The cgroup of a sandbox: the trusted CPU clock and the limits.
# ---------------------------------------------------------------------------------------------

def _cgroup_mounts():
    """{controller or 'unified': mount point}, from /proc/self/mountinfo."""
    mounts = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, _, options = right.split()[:3]
                point = left.split()[4]
                if fstype == "cgroup2":
                    mounts.setdefault("unified", point)
                elif fstype == "cgroup":
                    for opt in options.split(","):
                        mounts.setdefault(opt, point)
    except OSError:
        pass
    return mounts


def _own_cgroups():
    """{controller or 'unified': this process's path in that hierarchy}."""
    own = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in (controllers.split(",") if controllers else ["unified"]):
                    own[c] = path
    except OSError:
        pass
    return own


def _read(path):
    with open(path) as f:
        return f.read()


def wait_until(done, deadline):
    """Poll `done()` until it holds (True) or `deadline` (time.monotonic) passes (False): a tight
    loop for the first millisecond (a freeze usually completes in tens of microseconds, and the
    kernel's change notification on cgroup.events is rate-limited to one per 10 ms), then every
    0.2 ms."""
    spin_until = time.monotonic() + 0.001
    while not done():
        now = time.monotonic()
        if now > deadline:
            return False
        if now > spin_until:
            time.sleep(0.0002)
    return True


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


class Cgroup:
    """One sandbox's cgroup: on cgroup v2 one directory, on v1 one per controller (cpuacct,
    memory, pids). Created by this process under its own cgroup; removed when the sandbox ends."""

    # Which hierarchy gives each resource here: decided once by cgroup_layout().
    def __init__(self, layout, memory_bytes):
        self.layout, self.dirs = layout, {}
        self._freeze_fd, self._read_fds = None, {}
        name = f"gpu-forecasters-{os.getpid()}-{secrets.token_hex(4)}"
        for resource, (version, parent) in layout.items():
            path = os.path.join(parent, name)
            if path not in self.dirs.values():
                os.mkdir(path)
            self.dirs[resource] = path
        if "memory" in self.dirs and memory_bytes != float("inf"):
            limit = str(int(memory_bytes))
            if self.layout["memory"][0] == 2:
                _write(self._file("memory", "memory.max"), limit)
                if os.path.exists(self._file("memory", "memory.swap.max")):
                    _write(self._file("memory", "memory.swap.max"), "0")
            else:
                _write(self._file("memory", "memory.limit_in_bytes"), limit)
                if os.path.exists(self._file("memory", "memory.memsw.limit_in_bytes")):
                    _write(self._file("memory", "memory.memsw.limit_in_bytes"), limit)
        if "pids" in self.dirs:
            _write(self._file("pids", "pids.max"), str(MAX_TASKS))

    def _file(self, resource, name):
        return os.path.join(self.dirs[resource], name)

    def add(self, pid):
        for path in set(self.dirs.values()):
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def cpu_ns(self):
        """CPU time of every task that was ever in the cgroup (the kernel's own account)."""
        if self.layout["cpu"][0] == 2:
            for line in self._stat("cpu", "cpu.stat").splitlines():
                if line.startswith(b"usage_usec "):
                    return int(line.split()[1]) * 1000
            return 0
        return int(self._stat("cpu", "cpuacct.usage"))

    def _stat(self, resource, name):
        """A cgroup file read through a descriptor kept open (the clock is read twice a window)."""
        fd = self._read_fds.get(name)
        if fd is None:
            fd = self._read_fds[name] = os.open(self._file(resource, name), os.O_RDONLY)
        return os.pread(fd, 4096, 0)

    def events(self):
        """(times the memory limit killed a task, times the task limit refused one)."""
        oom = refused = 0
        if "memory" in self.dirs:
            name = "memory.events" if self.layout["memory"][0] == 2 else "memory.oom_control"
            for line in _read(self._file("memory", name)).splitlines():
                if line.startswith("oom_kill "):
                    oom = int(line.split()[1])
        if "pids" in self.dirs:
            for line in _read(self._file("pids", "pids.events")).splitlines():
                if line.startswith("max "):
                    refused = int(line.split()[1])
        return oom, refused

    # -- the freezer: measure.py stops every task of a sandbox between its windows ----------------

    def can_freeze(self):
        return "freezer" in self.dirs

    def freeze(self, deadline):
        """Stop every task of the cgroup (threads, processes, whatever they were doing) and wait
        until the kernel says they all are; False if that did not happen before `deadline` (a task
        stuck in the kernel). A frozen task uses no CPU and changes no memory: the parent reads the
        worker's clock and its outputs while it is frozen."""
        if self.layout["freezer"][0] == 2:
            self._freezer_write(b"1")
            return wait_until(lambda: b"frozen 1" in self._freezer_read("cgroup.events"), deadline)
        self._freezer_write(b"FROZEN")
        return wait_until(lambda: self._freezer_read("freezer.state").strip() == b"FROZEN", deadline)

    def thaw(self):
        self._freezer_write(b"0" if self.layout["freezer"][0] == 2 else b"THAWED")

    def _freezer_write(self, value):
        if self._freeze_fd is None:
            name = "cgroup.freeze" if self.layout["freezer"][0] == 2 else "freezer.state"
            self._freeze_fd = os.open(self._file("freezer", name), os.O_WRONLY)
        os.write(self._freeze_fd, value)

    def _freezer_read(self, name):
        return self._stat("freezer", name)

    def peak_bytes(self):
        if "memory" not in self.dirs:
            return 0
        name = "memory.peak" if self.layout["memory"][0] == 2 else "memory.max_usage_in_bytes"
        try:
            return int(_read(self._file("memory", name)))
        except (OSError, ValueError):
            return 0

    def pids(self):
        found = set()
        for path in set(self.dirs.values()):
            try:
                found |= {int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()}
            except OSError:
                pass
        return found

    def remove(self):
        """SIGKILL whatever is left, then remove the directories (once the tasks are gone)."""
        if "freezer" in self.dirs:
            try:
                self.thaw()  # a task frozen by cgroup v1's freezer does not die until it is thawed
            except OSError:
                pass
        for fd in [self._freeze_fd, *self._read_fds.values()]:
            if fd is not None:
                os.close(fd)
        self._freeze_fd, self._read_fds = None, {}
        for _ in range(50):
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not left:
                break
            time.sleep(0.02)
        for path in sorted(set(self.dirs.values()), reverse=True):
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def cgroup_layout():
    """{resource: (cgroup version, parent directory)} for 'cpu', 'memory', 'pids', 'freezer': where this
    process may create a child cgroup that has the resource. Empty where it may not (no write
    access, or v2 without a delegated subtree). A clock is only used once checked (sandbox_plan)."""
    mounts, own = _cgroup_mounts(), _own_cgroups()
    layout = {}
    if "unified" in mounts and "unified" in own:
        parent = os.path.join(mounts["unified"], own["unified"].lstrip("/"))
        if os.access(parent, os.W_OK):
            layout["cpu"] = (2, parent)  # cpu.stat exists in every v2 cgroup
            try:
                enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
                for c in ("memory", "pids"):
                    if c not in enabled and c in _read(os.path.join(parent, "cgroup.controllers")).split():
                        _write(os.path.join(parent, "cgroup.subtree_control"), f"+{c}")  # EBUSY if we hold processes there
                        enabled.append(c)
                    if c in enabled:
                        layout[c] = (2, parent)
            except OSError:
                pass
    for resource, controller in (("cpu", "cpuacct"), ("memory", "memory"), ("pids", "pids"), ("freezer", "freezer")):
        if resource not in layout and controller in mounts and controller in own:
            parent = os.path.join(mounts[controller], own[controller].lstrip("/"))
            if os.access(parent, os.W_OK):
                layout[resource] = (1, parent)
    if layout.get("cpu", (0,))[0] == 2:
        layout["freezer"] = layout["cpu"]  # cgroup.freeze is in every v2 cgroup but the root
    return layout


# ---------------------------------------------------------------------------------------------
# The plan for this machine, decided once: which layers it gets.
# ---------------------------------------------------------------------------------------------

class Plan:
    def __init__(self, cgroups, drop_uid, problem=""):
        self.cgroups, self.drop_uid, self.problem = cgroups, drop_uid, problem

    def describe(self):
        if self.problem:
            return "none"
        parts = ["bubblewrap", "seccomp",
                 f"uid {SANDBOX_UID} " + ("(a host uid of its own)" if self.drop_uid else "(your uid outside)")]
        if self.cgroups:
            versions = sorted({v for v, _ in self.cgroups.values()})
            parts.append(f"cgroup v{'+v'.join(map(str, versions))} ({', '.join(sorted(self.cgroups))})")
        else:
            parts.append("no cgroup (process clocks; no new processes on CPU)")
        return ", ".join(parts)


_PLAN = None


def sandbox_plan():
    """This machine's Plan: bwrap and libseccomp work (else `problem` says why), whether a cgroup
    can be created whose CPU clock really counts (a probe sandbox burns CPU in one), and whether
    the sandbox can run as an unprivileged host uid (this process is root)."""
    global _PLAN
    if _PLAN is not None:
        return _PLAN
    if shutil.which("bwrap") is None:
        _PLAN = Plan({}, False, f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}")
        return _PLAN
    try:
        seccomp_filter(False, False)
    except SandboxUnavailable as e:
        _PLAN = Plan({}, False, str(e))
        return _PLAN
    _remove_stale_cgroups()
    layout = cgroup_layout()
    drop_uid = os.geteuid() == 0 and shutil.which("setpriv") is not None
    if os.environ.get("GPU_FORECASTERS_NO_CGROUP"):  # the fallback on demand (tests, comparisons)
        layout = {}
    plan = Plan(layout if "cpu" in layout else {}, drop_uid)
    burn = "s = 0\nfor i in range(200000): s += i"
    try:
        proc = Sandbox.start([sys.executable, "-S", "-c", burn], "cpu", plan, memory_bytes=float("inf"))
    except (OSError, SandboxUnavailable) as e:
        if plan.cgroups or plan.drop_uid:  # try the plainest sandbox before giving up
            plan = Plan({}, False)
            try:
                proc = Sandbox.start([sys.executable, "-S", "-c", burn], "cpu", plan, memory_bytes=float("inf"))
            except (OSError, SandboxUnavailable) as e2:
                e = e2
                proc = None
        else:
            proc = None
        if proc is None:
            _PLAN = Plan({}, False, _namespace_problem(str(e)))
            return _PLAN
    _, err = proc.popen.communicate(timeout=60)
    if proc.popen.returncode != 0:
        proc.close()
        _PLAN = Plan({}, False, _namespace_problem(err.decode(errors="replace")))
        return _PLAN
    if plan.cgroups and proc.cgroup.cpu_ns() <= 0:  # e.g. cgroup v2 beside v1 controllers: no stats
        plan = Plan({}, plan.drop_uid)
    proc.close()
    _PLAN = plan
    return _PLAN


def _namespace_problem(message):
    last = (message.strip().splitlines() or ["no message"])[-1][:160]
    if "failed to execute" in message or "execvp" in message:
        # the sandbox stood up, and what it was to run is not inside it: not a namespace problem
        return (f"the sandbox started but could not run this Python inside it ({last}): {sys.executable} or "
                "what it links to is outside the folders the sandbox binds; name that folder in "
                "GPU_FORECASTERS_SANDBOX_BIND (colon-separated), or run from a virtualenv that is not a link")
    return ("bubblewrap cannot create its sandbox here (" + last + "): enable unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), "
            "or pass --unsafe-no-sandbox")


def require_sandbox():
    """Raise SandboxUnavailable, in one line that says what to do, unless the sandbox works here."""
    plan = sandbox_plan()
    if plan.problem:
        raise SandboxUnavailable(plan.problem)
    return plan


def _remove_stale_cgroups():
    """Cgroups left by a measuring process that was killed before it could remove them."""
    for resource, (_, parent) in cgroup_layout().items():
        for path in glob.glob(os.path.join(parent, "gpu-forecasters-*")):
            pid = os.path.basename(path).split("-")[2]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(path)
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------
# Starting a sandboxed process.
# ---------------------------------------------------------------------------------------------

class Sandbox:
    """A process in its sandbox: `popen` (bwrap, or the worker itself without a sandbox),
    `cgroup` (or None) and the CPU clock measure.py trusts."""

    def __init__(self, popen, cgroup, plan):
        self.popen, self.cgroup, self.plan = popen, cgroup, plan

    @classmethod
    def start(cls, command, device, plan, *, memory_bytes, env=None, binds_rw=(), binds_ro=(), stderr=subprocess.PIPE,
              fixed_layout=False, idle=False, host_uid=None):
        """Start `command` in a new sandbox, blocked until it is in its cgroup, under its limits
        and (as root) mapped to an unprivileged host uid of its own (`host_uid`: default a fresh
        one). plan=None: no sandbox (--unsafe-no-sandbox).
        fixed_layout: without address-space randomisation (see fixed_address_layout); idle: at
        idle priority until woken (idle_priority)."""
        if plan is None:
            with fixed_address_layout(fixed_layout), idle_priority(idle):
                popen = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                         env=env, cwd=ROOT, start_new_session=True, preexec_fn=_die_with_parent)
            cgroup = None
            layout = cgroup_layout() if not os.environ.get("GPU_FORECASTERS_NO_CGROUP") else {}
            if "cpu" in layout:  # the worker runs no candidate code before its first command
                cgroup = Cgroup(layout, memory_bytes)
                cgroup.add(popen.pid)
            return cls(popen, cgroup, None)
        program = seccomp_filter(no_processes=device == "cpu" and not plan.cgroups, no_hidden_memory=not plan.cgroups)
        bpf = os.memfd_create("seccomp", 0)
        os.write(bpf, program)
        os.lseek(bpf, 0, os.SEEK_SET)
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        argv = bwrap_argv(device, binds_rw, binds_ro, open_parents=plan.drop_uid) + [
            "--seccomp", str(bpf), "--info-fd", str(info_w), "--userns-block-fd", str(block_r)]
        if plan.drop_uid:
            # bwrap stays uid 0 inside (mapped to root) to build the mounts, then setpriv drops to
            # nobody, inside and out, with every capability gone, before the command starts.
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                     "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--"]
        else:
            argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        cgroup = Cgroup(plan.cgroups, memory_bytes) if plan.cgroups else None
        try:
            with fixed_address_layout(fixed_layout), idle_priority(idle):
                popen = subprocess.Popen(argv + list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, env=env, pass_fds=(bpf, info_w, block_r), start_new_session=True)
        except OSError:
            if cgroup:
                cgroup.remove()
            raise
        finally:
            for fd in (bpf, info_w, block_r):
                os.close(fd)
        try:
            child = _read_info(info_r, popen)
            for pid in (popen.pid, child):
                if cgroup:
                    cgroup.add(pid)
                for limit, value in SANDBOX_LIMITS:
                    _prlimit(pid, limit, value)
            _map_ids(child, plan.drop_uid, host_uid)
            os.write(block_w, b"1")
        except BaseException as e:
            popen.kill()
            popen.wait()
            if cgroup:
                cgroup.remove()
            if isinstance(e, OSError):
                raise SandboxUnavailable(f"{e}; bwrap said: {_drain(popen)}") from None
            raise
        finally:
            os.close(info_r)
            os.close(block_w)
        return cls(popen, cgroup, plan)

    def cpu_ms(self, pids=()):
        """The CPU time the sandbox's tasks used: the cgroup's clock, or else the sum of the
        given processes' CPU clocks (every thread, exited ones included)."""
        if self.cgroup is not None:
            return self.cgroup.cpu_ns() / 1e6
        return sum(_process_cpu_ns(p) for p in pids) / 1e6

    def close(self):
        try:
            self.popen.kill()
        except OSError:
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.cgroup is not None:
            self.cgroup.remove()
        for f in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            try:
                if f:
                    f.close()
            except OSError:
                pass


def _read_info(fd, popen, timeout=30):
    """bwrap's --info-fd JSON: the pid of the sandbox's first process."""
    data, deadline = b"", time.monotonic() + timeout
    while not data.rstrip().endswith(b"}"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            raise OSError(errno.EIO, "bwrap did not start its sandbox")
        data += chunk
    return int(json.loads(data)["child-pid"])


def fresh_host_uid():
    """A host uid for one sandbox (as root): drawn from a range no user has (HOST_UID_BASE), so
    that the kernel's per-user counts of what it holds are its own."""
    return HOST_UID_BASE + secrets.randbelow(HOST_UID_SPAN)


def _map_ids(pid, drop_uid, outside=None):
    """The sandbox's uid/gid maps, written from outside. As root: 0 to itself (bwrap, building
    mounts, until setpriv drops it) and nobody to the sandbox's own host uid (`outside`, default
    a fresh one). Otherwise: nobody inside is this user outside (all an unprivileged process may
    map)."""
    if drop_uid:
        outside = fresh_host_uid() if outside is None else outside
        _write(f"/proc/{pid}/uid_map", f"0 0 1\n{SANDBOX_UID} {outside} 1\n")
        _write(f"/proc/{pid}/gid_map", f"0 0 1\n{SANDBOX_UID} {outside} 1\n")
    else:
        _write(f"/proc/{pid}/uid_map", f"{SANDBOX_UID} {os.geteuid()} 1\n")
        _write(f"/proc/{pid}/setgroups", "deny")
        _write(f"/proc/{pid}/gid_map", f"{SANDBOX_UID} {os.getegid()} 1\n")


def _drain(popen):
    try:
        _, err = popen.communicate(timeout=5)
        return (err or b"").decode(errors="replace").strip()[-200:]
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return ""


_LIBC = ctypes.CDLL(None, use_errno=True)
_RLIMIT_FSIZE, _RLIMIT_CORE, _RLIMIT_NPROC, _RLIMIT_NOFILE, _RLIMIT_MEMLOCK = 1, 4, 6, 7, 8
_RLIMIT_SIGPENDING, _RLIMIT_MSGQUEUE = 11, 12
# Every sandbox's limits (the module docstring): its tasks (bubblewrap's own two besides the
# cgroup's MAX_TASKS), pending signals, locked memory and message-queue bytes are counted, since
# Linux 5.14, per user namespace and charged up to the user who created it (root, or you): these
# caps keep each sandbox's share of the creator's counts small.
SANDBOX_LIMITS = ((_RLIMIT_NOFILE, MAX_FILES), (_RLIMIT_FSIZE, MAX_FILE_BYTES), (_RLIMIT_CORE, 0),
                  (_RLIMIT_NPROC, MAX_TASKS + 8), (_RLIMIT_SIGPENDING, MAX_PENDING_SIGNALS),
                  (_RLIMIT_MEMLOCK, MAX_LOCKED_BYTES), (_RLIMIT_MSGQUEUE, 0))


class _Rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]


def _prlimit(pid, resource, value):
    limit = _Rlimit(value, value)
    if _LIBC.prlimit(pid, resource, ctypes.byref(limit), None) != 0:
        raise OSError(ctypes.get_errno(), "prlimit")


def _die_with_parent():
    """In the child before exec, unsandboxed workers only: SIGKILL when the parent dies (bwrap's
    --die-with-parent does it for the others). The signal follows the thread that started the
    child, so start workers from a long-lived thread."""
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _process_cpu_ns(pid):
    """The CPU clock of another process (clock_getcpuclockid: all its threads, exited ones
    included), in ns; 0 once it is gone."""
    clock, ts = ctypes.c_int(), _Timespec()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) or _LIBC.clock_gettime(clock, ctypes.byref(ts)):
        return 0
    return ts.tv_sec * 10**9 + ts.tv_nsec
