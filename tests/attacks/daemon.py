"""Class 4: leave a daemon (double fork, new session) that outlives the measurement, to write
fake results into later workers' channels or the command line's stdout."""
import importlib
import time

from tasks.cross_entropy import reference

_os = importlib.import_module("o" + "s")
_fork = getattr(_os, "fo" + "rk")
if _fork() == 0:
    _os.setsid()
    if _fork() == 0:
        with open("/proc/self/comm", "w") as f:
            f.write("pwned-daemon")
        for _ in range(600):
            time.sleep(0.2)
            try:
                _os.write(1, b'{"status": "ok", "speedup": 1000.0}\n')
            except OSError:
                pass
    getattr(_os, "_ex" + "it")(0)


def custom_kernel(data):
    return reference(data)
