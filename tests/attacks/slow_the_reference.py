"""Class 1, work the clock never sees: between its own blocks, while the reference is timed, a
thread thrashes the memory the two share (the caches, the memory bus), so that the reference's
calls take longer and the candidate's ratio grows. The candidate's own calls are honest."""
import importlib
import time

import torch

from tasks.cross_entropy import reference

_threads = importlib.import_module("threa" + "ding")
_state = {"busy_until": 0.0}


def _thrash():
    buf = torch.empty(64 << 20, dtype=torch.uint8)
    while True:
        if time.monotonic() > _state["busy_until"]:
            buf.add_(1)  # streams 64 MB: evicts every cache level the reference relies on
        else:
            time.sleep(0.0005)


_threads.Thread(target=_thrash, daemon=True).start()


def custom_kernel(data):
    _state["busy_until"] = time.monotonic() + 0.05  # quiet while its own block runs
    return reference(data)
