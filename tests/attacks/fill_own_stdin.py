"""Round 3, a parent that blocks: the candidate speaks for its worker in its first timed window (it
writes the window's reply itself, with where its correct outputs are), then never returns to the
worker's loop: its main thread parks, and where the sandbox's user owns the worker's command pipe
(measure.py run by a normal user: the sandbox's uid maps to that user) it reopens its own stdin
through /proc/self/fd/0 for writing and fills the pipe. A parent that wrote its next command
with a plain blocking write would wait forever, and a search's measuring thread with it. Run as
root it cannot reopen the pipe, and only parks."""
import importlib
import os
import time

from tasks.cross_entropy import CPU_CASES, CPU_CHECK_CASES, reference

_calls = [0]
_CHECKED = 2 * len(CPU_CASES) + 2 * len(CPU_CHECK_CASES)  # the correctness calls come first (two seeds each)
_held = []


def _reply_fd():
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 2)}
    for name in os.listdir("/proc/self/fd"):
        target = os.readlink(f"/proc/self/fd/{name}")
        if int(name) > 2 and target.startswith("pipe:") and target not in mine:
            return int(name)


def custom_kernel(data):
    _calls[0] += 1
    out = reference(data)
    if _calls[0] <= _CHECKED:
        return out
    _held.append(out)
    os.write(_reply_fd(), b"%x:1,%x:3\n" % (out[0].data_ptr(), out[1].data_ptr()))
    try:
        fd = os.open("/proc/self/fd/0", os.O_WRONLY | os.O_NONBLOCK)
        while True:
            try:
                os.write(fd, b"x" * 65536)
            except BlockingIOError:
                break
    except OSError:
        pass
    while True:
        time.sleep(1)
