"""Round 3, a parent that blocks: where the sandbox's user owns the worker's command pipe (measure.py
run by a normal user: the sandbox's uid maps to that user), the candidate reopens its own stdin
through /proc/self/fd/0 for writing, fills the pipe, and parks its main thread, so that a parent
writing its next command with a plain blocking write would wait forever, and a search's
measuring thread with it. Where it cannot reopen the pipe (run as root), it only parks."""
import importlib
import os
import time

_fcntl = importlib.import_module("fc" + "ntl")


def custom_kernel(data):
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
