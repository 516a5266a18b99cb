"""Class 4: hang forever in the kernel, under a recognisable name: the worker must not outlive
a parent that is killed with SIGKILL."""
import time


def custom_kernel(data):
    with open("/proc/self/comm", "w") as f:
        f.write("pwned-hang")
    while True:
        time.sleep(1)
