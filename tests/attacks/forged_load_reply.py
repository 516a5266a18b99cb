"""Round 3, a figure of the verdict taken from the candidate: as it is imported, the candidate
writes the reply to its own load command on the result channel, claiming an import time of
999999999999999.9 s (which the previous round copied into the measurement unchecked), and
then, in case only the well-formed reply is read, one with no figure at all. The worker's own
reply follows them."""
import importlib
import json

_os = importlib.import_module("o" + "s")


def _reply_fds():
    mine = {_os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 2)}
    for name in _os.listdir("/proc/self/fd"):
        try:
            target = _os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if int(name) > 2 and target.startswith("pipe:") and target not in mine:
            yield int(name)


for _fd in list(_reply_fds()):
    _os.write(_fd, (json.dumps({"op": "loaded", "import_s": 999999999999999.9}) + "\n").encode())


def custom_kernel(data):
    from tasks.cross_entropy import reference
    return reference(data)
