"""Class 2, forgeries below the confirmation threshold: the worker's timer shaves a third off every
call's real time (a 1.5x claim) and adds zero-mean noise to each, so that a standard error
computed from the claimed times is wide enough to hide the shaving from a test of the two clocks."""
import importlib
import random

from tasks.cross_entropy import reference

_gc = importlib.import_module("gc")
_main = importlib.import_module("__main__")  # the worker runs as the main module
for obj in list(vars(_main).values()) + getattr(_gc, "get_" + "objects")():
    if isinstance(obj, type) and obj.__name__ in ("CpuTimer", "CudaTimer"):
        _real = obj.run

        def run(self, fn, inputs, _real=_real):
            outs, ms = _real(self, fn, inputs)
            return outs, [max(1e-6, t / 1.5 + random.gauss(0, 0.5 * t)) for t in ms]
        obj.run = run


def custom_kernel(data):
    return reference(data)
