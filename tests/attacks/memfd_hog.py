"""Class 6, limits that count the wrong thing: hold 3.5 GB in memfds, neither mapped nor resident
in any process, where a limit that adds up the processes' memory does not look."""
import importlib
import time

from tasks.cross_entropy import reference

_os = importlib.import_module("o" + "s")
_held = []
for _ in range(56):
    fd = getattr(_os, "memfd_" + "create")("pwned-memfd")
    _os.write(fd, b"\1" * (64 << 20))
    _held.append(fd)


def custom_kernel(data):
    time.sleep(0.2)
    return reference(data)
