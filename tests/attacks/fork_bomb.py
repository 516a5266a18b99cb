"""Class 4: many processes (bounded at 400 here, so that a broken harness does not take the test
machine down with it)."""
import importlib
import time

_os = importlib.import_module("o" + "s")
_fork = getattr(_os, "fo" + "rk")


def custom_kernel(data):
    for _ in range(400):
        if _fork() == 0:
            with open("/proc/self/comm", "w") as f:
                f.write("pwned-bomb")
            time.sleep(600)
            getattr(_os, "_ex" + "it")(0)
    time.sleep(600)
