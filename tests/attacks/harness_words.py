"""Round 4, a candidate impersonates the harness (class 7 of docs/MEASUREMENT.md): a wrong kernel
writes, on its worker's reply channel, the very line the worker writes when the harness itself runs
out of memory outside the kernel's call, and exits. Under 4.0 that was `crashed`, in the harness's
words, never cached: the search measured it again every time it was proposed. The parent now
takes a candidate worker's error for the kernel's own, in its worker's words, and caches it."""
import importlib
import json

_os = importlib.import_module("o" + "s")
_gc = importlib.import_module("g" + "c")
_line = {"op": "error", "error": "crashed",
         "message": "out of memory in the harness, outside the kernel's call (call): CUDA out of memory"}


def custom_kernel(data):
    worker = next(o for o in getattr(_gc, "get_" + "objects")() if type(o).__name__ == "Worker")  # replies: `out`
    worker.out.write(json.dumps(_line).encode() + b"\n")
    worker.out.flush()
    _os._exit(70)
