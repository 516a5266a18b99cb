"""Class 4: hold memory in a child process, where a per-process memory cap of the worker does not
look; the worker itself stays small and honest."""
import importlib
import time

from tasks.cross_entropy import reference

_os = importlib.import_module("o" + "s")
if getattr(_os, "fo" + "rk")() == 0:
    with open("/proc/self/comm", "w") as f:
        f.write("pwned-memory")
    hoard = []
    for _ in range(64):  # up to 4 GiB, touched
        hoard.append(bytearray(64 << 20))
        time.sleep(0.01)
    time.sleep(600)


def custom_kernel(data):
    time.sleep(0.5)
    return reference(data)
