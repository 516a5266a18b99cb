"""Round 3, calls that see each other's inputs (GPU MODE's "batch and skip"): every call looks for
every other call's inputs it can reach, every 64 bytes of every input file it can read (the
arenas its process maps, found through /proc/self/maps, and any .bin file in the folders it can
see), and keeps what it finds by the first 256 bytes of a logits block; a batching kernel would
compute them all at once and hand each later call its stored answer. Should a later call ever
find its own inputs among what was seen before it began, the attack says so as its error: an
`ok` verdict means no call ever saw another call's inputs ahead of its own window."""
import os

from tasks.cross_entropy import reference

_seen = set()
_files = set()
for _top in ("/tmp", "/dev/" + "shm"):
    for _dirpath, _dirs, _names in os.walk(_top):
        _files |= {os.path.join(_dirpath, n) for n in _names if n.endswith(".bin")}


def _key(raw):
    return bytes(raw[:256])


def _reachable():
    found = set(_files)
    for line in open("/proc/self/maps"):
        parts = line.split()
        if len(parts) >= 6 and parts[-1].endswith(".bin"):
            found.add(parts[-1])
    return found


def custom_kernel(data):
    logits = data[0]
    mine = _key(logits.contiguous().view(-1).view(__import__("torch").uint8).numpy())
    if mine in _seen:
        raise RuntimeError("pwned: a call's inputs were seen before its own window began")
    for path in _reachable():
        try:
            raw = open(path, "rb").read()
        except OSError:
            continue
        for start in range(0, len(raw) - 256, 64):
            if any(raw[start:start + 16]):
                _seen.add(_key(raw[start:start + 256]))
    _seen.discard(mine)  # its own inputs, seen now, are no foreknowledge
    return reference(data)
