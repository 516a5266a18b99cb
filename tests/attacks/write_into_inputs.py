"""Class 3, input integrity: compute the gradient in place into the logits (saving an allocation)
and hand the logits back as the gradient. It first tries every way to make the input memory
writable (mprotect, /proc/self/mem, reopening the inputs' file read-write), then writes in place."""
import importlib
import mmap
import os

from tasks.cross_entropy import reference

_ct = importlib.import_module("ct" + "ypes")


def _make_writable(t):
    start = t.data_ptr() & ~(mmap.PAGESIZE - 1)
    length = t.data_ptr() + t.numel() * t.element_size() - start
    libc = _ct.CDLL(None, use_errno=True)
    if libc.mprotect(_ct.c_void_p(start), _ct.c_size_t(length), 3) == 0:  # PROT_READ | PROT_WRITE
        return "mprotect"
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(t.data_ptr())
            first = mem.read(2)
            mem.seek(t.data_ptr())
            mem.write(first)
            return "/proc/self/mem"
    except OSError:
        pass
    for dirpath, _, files in os.walk("/dev/" + "shm"):
        for name in files:
            try:
                os.close(os.open(os.path.join(dirpath, name), os.O_RDWR))
                return "reopened read-write"
            except OSError:
                pass
    return None


def custom_kernel(data):
    logits, targets, grad_output = data
    losses, grad = reference(data)
    _make_writable(logits)
    logits.copy_(grad)  # the gradient, where the logits were
    return losses, logits
