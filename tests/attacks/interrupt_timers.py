"""Round 4, work billed to the twin (class 5 of docs/MEASUREMENT.md): the kernel computes exactly the
reference, and at the end of each call arms timers that fire while its sandbox is frozen and the
twin's window runs on the same core. A timer's expiry runs in interrupt context and is charged to
whichever task is running: the twin. Amplified: one timerfd watched by hundreds of epoll
instances, each of which the expiry wakes in turn; a POSIX timer and an interval timer firing every
20 microseconds; and a hundred threads asleep with short timeouts, whose wake-ups would land in
the twin's windows too if the freeze left their timers armed. Every arming call is refused by the
sandbox's filter, so this measures as the honest reference does; were any to work, the twin's
windows right after the candidate's would cost more than after the gap between pairs (the disturbance
check, measure.time_case) and show it."""
import importlib
import time

from tasks.cross_entropy import reference

_ct = importlib.import_module("ct" + "ypes")
_select = importlib.import_module("select")
_signal = importlib.import_module("sig" + "nal")
_threads = importlib.import_module("threa" + "ding")
_libc = _ct.CDLL(None, use_errno=True)
TIMERFD_CREATE, TIMERFD_SETTIME, TIMER_CREATE, TIMER_SETTIME = 283, 286, 222, 223  # x86_64
CLOCK_MONOTONIC = 1


class _Spec(_ct.Structure):  # struct itimerspec: interval, then first expiry
    _fields_ = [("i_s", _ct.c_long), ("i_ns", _ct.c_long), ("v_s", _ct.c_long), ("v_ns", _ct.c_long)]


_armed = {}
_tfd = _libc.syscall(TIMERFD_CREATE, CLOCK_MONOTONIC, 0)
if _tfd >= 0:
    _armed["timerfd"] = _tfd
    _epolls = []
    for _ in range(600):  # every one of them is woken by each expiry, in interrupt context
        try:
            e = _select.epoll()
            e.register(_tfd, _select.EPOLLIN)
            _epolls.append(e)
        except OSError:
            break
_timer_id = _ct.c_long(0)
if _libc.syscall(TIMER_CREATE, CLOCK_MONOTONIC, None, _ct.byref(_timer_id)) == 0:  # SIGALRM to the process
    _signal.signal(_signal.SIGALRM, _signal.SIG_IGN)
    _armed["posix timer"] = _timer_id.value
try:
    _signal.setitimer(_signal.ITIMER_REAL, 0)
    _armed["itimer"] = True
except OSError:
    pass


def _sleeper():
    while True:
        time.sleep(0.0003)  # a timeout that expires a third of a millisecond after each wake-up


for _ in range(100):
    _threads.Thread(target=_sleeper, daemon=True).start()


def _arm():
    every = _Spec(0, 20_000, 0, 150_000)  # first expiry in 150 us, then every 20 us
    if "timerfd" in _armed:
        _libc.syscall(TIMERFD_SETTIME, _armed["timerfd"], 0, _ct.byref(every), None)
    if "posix timer" in _armed:
        _libc.syscall(TIMER_SETTIME, _armed["posix timer"], 0, _ct.byref(every), None)
    if "itimer" in _armed:
        _signal.signal(_signal.SIGALRM, _signal.SIG_IGN)
        _signal.setitimer(_signal.ITIMER_REAL, 0.00015, 0.00002)


def custom_kernel(data):
    out = reference(data)
    _arm()  # the last thing the window does: the expiries land after it
    return out
