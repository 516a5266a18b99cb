"""Class 6, limits that count the wrong thing: start 2,000 threads, where a limit counts processes."""
import importlib
import time

from tasks.cross_entropy import reference

_threads = importlib.import_module("threa" + "ding")
_started = []
for _ in range(2000):
    t = _threads.Thread(target=time.sleep, args=(600,), daemon=True)
    try:
        t.start()
    except RuntimeError:
        break
    _started.append(t)


def custom_kernel(data):
    return reference(data)
