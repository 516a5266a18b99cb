"""cli.py: a command's settings are one dataclass, and that dataclass is its command line.

The cleanrl manner: a run's settings are one object, with a default and a line of help per
field, that the run passes around, saves with its checkpoints and compares on --resume; argparse
only reads it from the command line. `lora_rank: int = flag(32, "LoRA rank")` is `--lora-rank N`;
a bool field is a switch, off by default; a `list[str]` field is a flag given once per value
(`--data A --data B`), or with positional=True the command's one-or-more plain arguments;
`choices`, `required` and `metavar` are argparse's, `group` titles a section of --help; other
keywords are kept in the field's metadata for the command's own use. --help shows every flag's
default (but not None's or a switch's), and a bad flag is one line of error, not a usage dump.

A long command says where it is (Progress): on a terminal a progress bar; into a log, a pipe,
`nohup` or a CI job, where a bar would write control characters, a plain line instead, at most
once a minute and at least once a minute while the work goes on (GPU_FORECASTERS_PROGRESS_S sets
the interval), with what is done, the time so far and the time left.

Parsing also refuses a machine whose NVIDIA driver torch cannot use (check_cuda): the project
would otherwise run silently at CPU scale on a GPU machine. A command imports this module before
its others: a Ctrl-C while they load (torch takes seconds) is then one line, as a Ctrl-C in its
main() is, not a traceback of whichever import it fell in.
"""
import sys


def _interrupted_while_loading(kind, value, traceback):
    """sys.excepthook: a Ctrl-C that no main() caught (it came while the command's modules loaded)
    is one line; Python then ends the process as interrupted (SIGINT). Anything else is Python's."""
    if issubclass(kind, KeyboardInterrupt):
        print(f"{sys.argv[0].rsplit('/', 1)[-1]}: interrupted", file=sys.stderr)
    else:
        sys.__excepthook__(kind, value, traceback)


sys.excepthook = _interrupted_while_loading  # first of all: a Ctrl-C may come during the imports below

import argparse  # noqa: E402
import atexit  # noqa: E402
import dataclasses  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
import typing  # noqa: E402
from pathlib import Path  # noqa: E402

NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")  # present where the NVIDIA kernel driver is loaded
# torch 2.13's Linux wheel on PyPI is built for CUDA 13.0, which needs a 580-series driver or newer
CUDA_DRIVER_NEEDED = {"13": 580, "12": 525}



def flag(default, help, *, choices=None, required=False, metavar=None, positional=False, group=None, **meta):
    """A field of a settings dataclass: its default and the help line of its flag."""
    return dataclasses.field(default=default, metadata=dict(help=help, choices=choices, required=required,
                                                            metavar=metavar, positional=positional, group=group,
                                                            **meta))


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # "(default: None)" or a switch's "(default: False)" says nothing
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parser(settings):
    """The argparse parser of a settings dataclass (its docstring is the description)."""
    p = _Parser(description=settings.__doc__, formatter_class=_Help)
    hints, groups = typing.get_type_hints(settings), {}
    for f in dataclasses.fields(settings):
        name, meta, kind = "--" + f.name.replace("_", "-"), f.metadata, hints[f.name]
        if meta.get("group") and meta["group"] not in groups:
            groups[meta["group"]] = p.add_argument_group(meta["group"])
        where = groups.get(meta.get("group"), p)
        if kind is bool:
            where.add_argument(name, action="store_true", help=meta["help"])
            continue
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `str | None`: a str or unset
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        more = {"metavar": meta["metavar"]} if meta.get("metavar") else {}
        if typing.get_origin(kind) is list:
            kind = typing.get_args(kind)[0]
            if meta.get("positional"):
                more["nargs"] = "+"  # one or more plain arguments
            else:
                more["action"] = "append"  # the flag once per value
        if meta.get("positional"):
            where.add_argument(f.name, type=kind, default=f.default, choices=meta["choices"], help=meta["help"],
                               **more)
        else:
            where.add_argument(name, type=kind, default=f.default, choices=meta["choices"],
                               required=meta["required"], help=meta["help"], **more)
    return p


def cuda_problem(driver_file=None):
    """None, or one line saying why torch cannot use the NVIDIA driver this machine has and what
    to do. No driver (a CPU machine) and GPUs hidden on purpose (CUDA_VISIBLE_DEVICES empty or -1)
    are not problems; torch is imported only where a driver is present."""
    driver_file = driver_file or NVIDIA_DRIVER_FILE
    if not driver_file.exists() or os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return None
    import torch
    if torch.cuda.is_available():
        return None
    first = (driver_file.read_text(errors="replace").splitlines() or [""])[0]  # /proc reports size 0: read
    driver = next((w for w in first.split() if w[:1].isdigit() and "." in w), "unknown")
    cuda = torch.version.cuda
    if cuda is None:
        why = (f"this torch ({torch.__version__}) is a CPU build; install the CUDA one "
               f"(`pip install --force-reinstall torch=={torch.__version__.split('+')[0]}` from PyPI)")
    else:
        need = CUDA_DRIVER_NEEDED.get(cuda.split(".")[0])
        why = (f"torch {torch.__version__} is built for CUDA {cuda}, which needs driver {need} or newer; "
               if need else f"torch {torch.__version__} is built for CUDA {cuda}; ") + \
            "update the driver (or install a torch built for an older CUDA)"
    return (f"an NVIDIA driver ({driver}) is present but torch sees no CUDA GPU: {why}, or set "
            "CUDA_VISIBLE_DEVICES= to run on the CPU on purpose")


def check_cuda():
    """Exit with cuda_problem's line, if there is one."""
    problem = cuda_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)


def progress_bars():
    """Whether a command draws progress bars: only on a terminal. Into a log or a pipe a bar writes
    control characters (carriage returns; the cursor-up escapes of a bar drawn under another), so
    there no bar is drawn, the libraries' neither (huggingface_hub's switch, which transformers
    follows: loading and converting a model draw bars of their own)."""
    if sys.stderr.isatty():
        return True
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported already: it read the switch then
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    return False


def duration(seconds):
    """Seconds in words a reader takes in at a glance: 45 s, 3.2 min, 1.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def progress_every_s():
    """Seconds between two progress lines off a terminal: GPU_FORECASTERS_PROGRESS_S, default 60."""
    try:
        return max(0.05, float(os.environ.get("GPU_FORECASTERS_PROGRESS_S", "60")))
    except ValueError:
        return 60.0


class Progress:
    """Where a long command is, in `total` units of work. On a terminal a tqdm bar; elsewhere a
    line on stderr every progress_every_s() seconds while the work goes on (a thread writes it, so
    a unit that takes longer than that is reported too), none more often:

        GRPO: 3 of 20 steps, 2.1 min in, about 11 min left; reward 0.812, 2/2 groups kept

    The time left is reckoned at the pace of the units done since the first of this run (the first
    carries the start-up: loading, warming up; pace_from_start where it does not), before that from
    the start-up estimate (`expected_s`) less the time spent. `words` (set_words) are the latest figures
    worth a glance; `count` a function that gives the units done, where other processes do the work
    (refresh reads it; the lines do before each). A run that printed a line prints a last one when
    it closes. enabled=False: neither bar nor lines (a worker process, --no-progress)."""

    def __init__(self, what, total, unit, *, initial=0, expected_s=None, enabled=True, count=None,
                 pace_from_start=False):
        self.what, self.total, self.unit, self.expected_s = what, total, unit, expected_s
        self.count = count  # a function giving the units done, for work counted elsewhere (refresh)
        self.done = self._first = initial
        self._t0, self._lock, self._stop = time.monotonic(), threading.Lock(), threading.Event()
        # (time, units done) the pace runs from: the first unit's end, or the start where no loading
        # or warming up falls in the first unit (pace_from_start)
        self._since = (self._t0, initial) if pace_from_start else None
        self._last = self._t0  # when the latest unit was done
        self.words, self.lines = "", 0
        self.bar = self._thread = None
        if enabled and progress_bars():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=what, unit=unit.rstrip("s") or unit, file=sys.stderr)
        elif enabled:
            self._thread = threading.Thread(target=self._tick, name="progress-lines", daemon=True)
            self._thread.start()

    def update(self, n=1, instant=False):
        """n more units done; instant: taken from a log or a cache in no time, so not part of the
        rate that the time left is reckoned at."""
        with self._lock:  # measurements are counted from the threads that bring them
            self.done += n
            self._first += n if instant else 0
            if not instant:
                self._last = time.monotonic()
            if self._since is None and self.done > self._first:  # the start-up is behind: the pace from here
                self._since = (self._last, self.done)
            if self.bar is not None:
                self.bar.update(n)

    def refresh(self):
        """Read the units done from `count` (work that other processes do, say, in their logs)."""
        if self.count is not None:
            done = self.count()
            self.update(done - self.done)

    def set_words(self, words):
        self.words = words
        if self.bar is not None:
            self.bar.set_postfix_str(words)

    def line(self):
        """The progress line as it stands now."""
        now = time.monotonic()
        spent = now - self._t0
        since, at = self._since or (now, self.done)
        if self.done >= self.total:
            left = "finishing"
        elif self.done > at:  # the units done since the first, at their own pace, less the current one's time so far
            pace = (self._last - since) / (self.done - at)
            left = pace * (self.total - self.done) - (now - self._last)
            left = (f"about {duration(left)} left" if left > 0 else
                    f"slower than the {duration(pace)} a {self.unit.rstrip('s')} so far")
        elif self.done > self._first and self.expected_s is None:  # one unit so far, with the start-up in it
            left = f"about {duration(spent / (self.done - self._first) * (self.total - self.done))} left"
        elif self.expected_s is not None and spent < self.expected_s:
            left = f"about {duration(self.expected_s - spent)} left (the start-up estimate)"
        elif self.expected_s is not None:
            left = f"past the start-up estimate of {duration(self.expected_s)}"
        else:
            left = f"no {self.unit.rstrip('s')} done yet"
        return (f"{self.what}: {self.done} of {self.total} {self.unit}, {duration(spent)} in, {left}"
                + (f"; {self.words}" if self.words else ""))

    def _tick(self):
        while not self._stop.wait(progress_every_s()):
            self.refresh()
            print(self.line(), file=sys.stderr, flush=True)
            self.lines += 1

    def close(self):
        self.refresh()
        if self.bar is not None:
            self.bar.close()
        if self._thread is not None and not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            if self.lines:  # a log that had progress lines gets the end too
                print(f"{self.what}: {self.done} of {self.total} {self.unit} in {duration(time.monotonic() - self._t0)}",
                      file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def exit_interrupted(code=130):
    """End an interrupted command now, with `code`, the way a C program ends: the exit handlers
    run (atexit: the measure workers and their sandboxes are ended), the output is flushed, and
    the interpreter's own teardown is skipped. That teardown ends every daemon thread still inside
    a library's native code (a measurement in flight, a forward pass) by unwinding its stack, and
    where a C++ frame on it may not throw, the C++ runtime aborts the process: "terminate called
    without an active exception", exit 134 instead of 130."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe: nothing more to say there
    os._exit(code)


def parse(settings, argv=None, *, gpu=True):
    """The settings dataclass `settings` read from argv (sys.argv[1:] when None); then, for a
    command that may run on a GPU (gpu=True), check_cuda; and the libraries' progress bars off
    where stderr is not a terminal (progress_bars)."""
    args = settings(**vars(parser(settings).parse_args(argv)))
    if gpu:
        check_cuda()
    progress_bars()
    return args
