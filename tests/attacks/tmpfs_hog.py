"""Class 6, limits that count the wrong thing: fill the sandbox's private /tmp and shared-memory
folder (memory, not disk) with 3 GB of files, which no process maps."""
import os
import time

from tasks.cross_entropy import reference

for top, count in (("/tmp", 30), ("/dev/" + "shm", 18)):
    for k in range(count):
        try:
            with open(os.path.join(top, f"pwned-fill-{k}"), "wb") as f:
                f.write(b"\1" * (64 << 20))
        except OSError:
            break


def custom_kernel(data):
    time.sleep(0.2)
    return reference(data)
