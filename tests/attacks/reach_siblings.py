"""Round 3, from the public suites (pygpubench's ptrace and /proc/<pid>/mem exploits): reach any
process beside the candidate's own, the sandbox's init, the twin, the reference worker, the
parent, to read or write its memory, steal its descriptors, attach to it, stop it, or signal
every process it may. Anything that works is raised as the candidate's error: an `ok` verdict
means every attempt was refused."""
import importlib
import os

from tasks.cross_entropy import reference

_ct = importlib.import_module("ct" + "ypes")
_sig = importlib.import_module("sig" + "nal")
_libc = _ct.CDLL(None, use_errno=True)


def _attempts():
    got, me = [], os.getpid()
    for pid in [p for p in range(1, 4096) if p != me and os.path.exists(f"/proc/{p}")]:
        try:
            with open(f"/proc/{pid}/mem", "rb") as f:
                f.read(1)
            got.append(f"opened /proc/{pid}/mem")
        except OSError:
            pass
        if _libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
            got.append(f"attached to {pid}")
        pidfd = _libc.syscall(434, pid, 0)  # pidfd_open
        if pidfd >= 0 and _libc.syscall(438, pidfd, 0, 0) >= 0:  # pidfd_getfd: its descriptor 0
            got.append(f"took a descriptor of {pid}")
        local, remote = (_ct.c_char * 8)(), (_ct.c_char * 8)()
        iov_l = (_ct.c_void_p * 2)(_ct.cast(local, _ct.c_void_p), 8)
        iov_r = (_ct.c_void_p * 2)(_ct.cast(remote, _ct.c_void_p), 8)
        if _libc.process_vm_readv(pid, iov_l, 1, iov_r, 1, 0) >= 0:
            got.append(f"read the memory of {pid}")
    try:
        os.kill(-1, _sig.SIGCONT)  # every process it may signal: only its own sandbox's
    except OSError:
        pass
    return got


_GOT = _attempts()


def custom_kernel(data):
    if _GOT:
        raise RuntimeError("pwned: " + "; ".join(_GOT))
    return reference(data)
