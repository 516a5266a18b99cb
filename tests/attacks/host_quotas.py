"""Round 3, host-wide quotas and what else the sandbox allows. The kernel keeps some quotas per
host user, not per sandbox: each session keyring a process joins is charged to its user's key
quota (200 keys by default) and each inotify instance to its user's 128; a candidate that joins
keyrings again and again, or opens inotify instances, would keep every other worker of that
user from starting. It also tries sockets a kernel never needs (vsock reaches a VM's host,
netlink the kernel's own families, packet and inet), message queues, and the host-wide /proc
views (/proc/keys lists other sandboxes' keyrings). Anything that works is raised as the
candidate's error: an `ok` verdict means every attempt was refused."""
import importlib
import socket

from tasks.cross_entropy import reference

_ct = importlib.import_module("ct" + "ypes")
_libc = _ct.CDLL(None, use_errno=True)


def _attempts():
    got = []
    joined = sum(_libc.syscall(250, 1, None) >= 0 for _ in range(300))  # keyctl(KEYCTL_JOIN_SESSION_KEYRING)
    if joined:
        got.append(f"joined {joined} session keyrings")
    inotify = [fd for fd in (_libc.inotify_init() for _ in range(200)) if fd >= 0]
    if inotify:
        got.append(f"opened {len(inotify)} inotify instances")
    for family, name in ((40, "vsock"), (16, "netlink"), (17, "packet"), (2, "inet"), (10, "inet6"), (1, "unix")):
        try:
            socket.socket(family, socket.SOCK_DGRAM if family != 17 else socket.SOCK_RAW).close()
            got.append(f"opened a {name} socket")
        except OSError:
            pass
    if _libc.mq_open(b"/pwned-mq", 0o100 | 0o2, 0o600, None) >= 0:  # O_CREAT | O_RDWR
        got.append("opened a message queue")
    for view in ("/proc/keys", "/proc/key-users", "/proc/kallsyms", "/proc/locks", "/proc/interrupts"):
        try:
            text = open(view).read()
            if text.strip():
                got.append(f"{view} shows {len(text.splitlines())} line(s)")
        except OSError:
            pass
    return got


_GOT = _attempts()


def custom_kernel(data):
    if _GOT:
        raise RuntimeError("pwned: " + "; ".join(_GOT))
    return reference(data)
