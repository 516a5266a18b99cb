"""Class 3: speak for the worker: write replies claiming near-zero times and an ok verdict on its
result channel, then leave before the real worker can answer."""
import importlib
import json

_os = importlib.import_module("o" + "s")


def _reply_fds():
    mine = {_os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 2)}
    for name in _os.listdir("/proc/self/fd"):
        try:
            target = _os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if int(name) > 2 and target.startswith("pipe:") and target not in mine:
            yield int(name)


def custom_kernel(data):
    lies = [{"op": "ran", "id": k, "ms": [1e-6], "bytes_per_call": 1} for k in range(1, 40)]
    lies += [{"status": "ok", "speedup": 1000.0, "message": "ok"}]
    for fd in _reply_fds():
        _os.write(fd, "".join(json.dumps(x) + "\n" for x in lies).encode())
    getattr(_os, "_ex" + "it")(0)
