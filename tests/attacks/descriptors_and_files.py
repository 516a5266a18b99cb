"""Class 6, limits: open file descriptors without end and write a file larger than any kernel needs
(5 GB into /tmp), to exhaust the host's descriptor table and disk. Honest if both are refused."""
import os

from tasks.cross_entropy import reference

_fds = []
try:
    while len(_fds) < 200000:
        _fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
_OPENED = len(_fds)
for fd in _fds:
    os.close(fd)
try:
    with open("/tmp/pwned-big", "wb") as f:
        f.seek(5 << 30)
        f.write(b"1")
    _WROTE = os.path.getsize("/tmp/pwned-big")
except OSError:
    _WROTE = 0


def custom_kernel(data):
    if _OPENED > 5000 or _WROTE > (2 << 30):
        raise RuntimeError(f"LOOT opened {_OPENED} descriptors, wrote a {_WROTE}-byte file")
    return reference(data)
