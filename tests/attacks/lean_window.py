"""Round 3, the harness's share of a window: an adversary who has read harness/measure_worker.py
swaps the worker's timed window (`Worker.go`, found through the garbage collector) and its
reply formatting (`where`) for the leanest code that still gives the parent the same reply:
no error handling, the reply's bytes built once per output layout, the call's input objects
taken from the worker's stock without its bookkeeping, the previous window's outputs and inputs
kept instead of freed inside the window. The kernel is the reference itself. If any
harness work were left in the candidate's window that the twin pays and the candidate need not,
this would measure faster than its honest twin."""
import importlib

from tasks.cross_entropy import reference

_gc = importlib.import_module("gc")
_os = importlib.import_module("o" + "s")
_main = importlib.import_module("__main__")  # the worker runs as the main module
_kept = []


def _lean_go(self, line):
    comma = line.index(b",")
    data = self.views[int(line[1:comma])]["slots"][int(line[comma + 1:])].pop()
    out = reference(data)
    _kept.append((data, out))  # freed later, in bulk, never in this window
    if len(_kept) > 64:
        del _kept[:32]
    _os.write(self.reply_fd, b"%x:1,%x:3\n" % (out[0].data_ptr(), out[1].data_ptr()))  # float32, bfloat16


for obj in list(vars(_main).values()) + getattr(_gc, "get_" + "objects")():
    if isinstance(obj, type) and obj.__name__ == "Worker" and hasattr(obj, "go"):
        obj.go = _lean_go


def custom_kernel(data):
    return reference(data)
