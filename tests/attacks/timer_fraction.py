"""Class 2, forgeries below the confirmation threshold: every call reports 1/1.8 of its real time,
a modest 1.8x claim that a rule which only bounds a claim within a factor of 2 lets through."""
import importlib

from tasks.cross_entropy import reference

_gc = importlib.import_module("gc")
_main = importlib.import_module("__main__")  # the worker runs as the main module
for obj in list(vars(_main).values()) + getattr(_gc, "get_" + "objects")():
    if isinstance(obj, type) and obj.__name__ in ("CpuTimer", "CudaTimer"):
        _real = obj.run

        def run(self, fn, inputs, _real=_real):
            outs, ms = _real(self, fn, inputs)
            return outs, [t / 1.8 for t in ms]
        obj.run = run


def custom_kernel(data):
    return reference(data)
