"""Round 4, shared counts exhausted from inside the sandbox (class 6 of docs/MEASUREMENT.md). The
kernel keeps some counts per host user, or for the whole machine, not per sandbox: pending signals
(charged, since Linux 5.14, to the user who created the sandbox's user namespace as well), epoll
watches, pipe buffers, descriptors in flight over unix sockets, asynchronous-I/O contexts (fs.aio-nr)
and the pseudo-terminals of non-host devpts instances. A candidate that takes all it can of each
while it sits frozen between its windows would leave other processes of that user, or of the
machine, without. Run as a script it takes what it can, says what it got (one JSON line on stdout)
and holds it until its stdin closes, so that a test can look from outside meanwhile; imported as a
candidate it takes the same at import and computes the reference honestly."""
import importlib
import json
import os
import select
import sys

_ct = importlib.import_module("ct" + "ypes")
_signal = importlib.import_module("sig" + "nal")
_libc = _ct.CDLL(None, use_errno=True)
_held = []
IO_SETUP, RT_SIGQUEUEINFO = 206, 129  # x86_64


def take():
    got = {}
    # pending real-time signals, queued to itself with the signal blocked
    sig = _signal.SIGRTMIN
    _signal.pthread_sigmask(_signal.SIG_BLOCK, [sig])
    info = (_ct.c_int * 32)(sig, 0, -1)  # siginfo: signo, errno, code SI_QUEUE
    got["pending signals"] = sum(_libc.syscall(RT_SIGQUEUEINFO, os.getpid(), sig, info) == 0 for _ in range(5000))
    # epoll watches: every descriptor it may open, watched by as many epoll instances as it may open
    fds = []
    for _ in range(400):
        try:
            fds.append(os.eventfd(0))
        except (OSError, AttributeError):
            break
    watches, epolls = 0, []
    for _ in range(400):
        try:
            e = select.epoll()
        except OSError:
            break
        epolls.append(e)
        for fd in fds:
            try:
                e.register(fd, select.EPOLLIN)
                watches += 1
            except OSError:
                break
    got["epoll watches"] = watches
    _held.extend(fds + epolls)
    # pipe buffers: as large as it may make them
    grown = 0
    for _ in range(50):
        try:
            r, w = os.pipe()
        except OSError:
            break
        _held.extend([r, w])
        try:
            importlib.import_module("fcntl").fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
            grown += 1
        except OSError:
            pass
    got["pipes grown to 1 MB"] = grown
    # descriptors in flight over a unix socket pair
    try:
        a, b = importlib.import_module("socket").socketpair()
        _held.extend([a, b])
        got["unix socket pair"] = 1
    except OSError:
        got["unix socket pair"] = 0
    # asynchronous-I/O contexts
    ctx, aio = _ct.c_ulong(0), 0
    for _ in range(100):
        ctx.value = 0
        if _libc.syscall(IO_SETUP, 65536, _ct.byref(ctx)) != 0:
            break
        aio += 1
    got["aio contexts"] = aio
    # pseudo-terminals
    ptys = 0
    for _ in range(100):
        try:
            _held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
            ptys += 1
        except OSError:
            break
    got["pseudo-terminals"] = ptys
    got["uid"] = os.getuid()
    return got


if __name__ == "__main__":
    print(json.dumps(take()), flush=True)
    sys.stdin.read()  # hold everything until the test is done looking
else:
    from tasks.cross_entropy import reference
    _GOT = take()

    def custom_kernel(data):
        return reference(data)
