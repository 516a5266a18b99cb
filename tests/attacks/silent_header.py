"""Class 3: start a reply on the result channel (a length header, then half a JSON line) and go
silent, hoping the parent blocks reading it past its timeout."""
import importlib
import time

_os = importlib.import_module("o" + "s")


def custom_kernel(data):
    mine = {_os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 2)}
    for name in _os.listdir("/proc/self/fd"):
        try:
            target = _os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if int(name) > 2 and target.startswith("pipe:") and target not in mine:
            _os.write(int(name), (10**6).to_bytes(4, "little") + b'{"op": "ran", "id": 1, "ms": [')
    while True:
        time.sleep(1)
