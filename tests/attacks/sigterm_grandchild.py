"""Class 4: leave a grandchild that ignores SIGTERM and lives on after the worker."""
import importlib
import time

from tasks.cross_entropy import reference

_os = importlib.import_module("o" + "s")
_signal = importlib.import_module("sig" + "nal")
_fork = getattr(_os, "fo" + "rk")
if _fork() == 0:
    if _fork() == 0:
        getattr(_signal, "sig" + "nal")(_signal.SIGTERM, _signal.SIG_IGN)
        with open("/proc/self/comm", "w") as f:
            f.write("pwned-grandkid")
        time.sleep(600)
    getattr(_os, "_ex" + "it")(0)


def custom_kernel(data):
    return reference(data)
