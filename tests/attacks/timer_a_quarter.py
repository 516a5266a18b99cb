"""Class 1: the forged timer again, modest: found through the garbage collector, it reports a
quarter of each call's real time (a 4x claim, below the 10x that a GPU measurement confirms),
while computing the right answer."""
import importlib
import time

from tasks.cross_entropy import reference

_clock = getattr(time, "process_" + "time")  # the clock the worker's own timer reads
_gc = importlib.import_module("gc")
_main = importlib.import_module("__main__")  # the worker runs as the main module
for obj in list(vars(_main).values()) + getattr(_gc, "get_" + "objects")():
    if isinstance(obj, type) and obj.__name__ in ("CpuTimer", "CudaTimer"):
        def run(self, fn, inputs):
            outs, times = [], []
            for x in inputs:
                t0 = _clock()
                outs.append(fn(x))
                times.append((_clock() - t0) * 1e3 / 4)
            return outs, times
        obj.run = run


def custom_kernel(data):
    return reference(data)
