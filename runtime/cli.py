"""cli.py: a command's settings are one dataclass, and that dataclass is its command line.

The cleanrl manner: a run's settings are one object, with a default and a line of help per
field, that the run passes around, saves with its checkpoints and compares on --resume; argparse
only reads it from the command line. `lora_rank: int = flag(32, "LoRA rank")` is `--lora-rank N`;
a bool field is a switch, off by default; a `list[str]` field is a flag given once per value
(`--data A --data B`), or with positional=True the command's one-or-more plain arguments;
`choices`, `required` and `metavar` are argparse's, `group` titles a section of --help; other
keywords are kept in the field's metadata for the command's own use. --help shows every flag's
default (but not None's or a switch's), and a bad flag is one line of error, not a usage dump.

Parsing also refuses a machine whose NVIDIA driver torch cannot use (check_cuda): the project
would otherwise run silently at CPU scale on a GPU machine. A command imports this module before
its others: a Ctrl-C while they load (torch takes seconds) is then one line, as a Ctrl-C in its
main() is, not a traceback of whichever import it fell in.
"""
import argparse
import dataclasses
import os
import sys
import types
import typing
from pathlib import Path

NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")  # present where the NVIDIA kernel driver is loaded
# torch 2.13's Linux wheel on PyPI is built for CUDA 13.0, which needs a 580-series driver or newer
CUDA_DRIVER_NEEDED = {"13": 580, "12": 525}


def _interrupted_while_loading(kind, value, traceback):
    """sys.excepthook: a Ctrl-C that no main() caught (it came while the command's modules loaded)
    is one line; Python then ends the process as interrupted (SIGINT). Anything else is Python's."""
    if issubclass(kind, KeyboardInterrupt):
        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
    else:
        sys.__excepthook__(kind, value, traceback)


sys.excepthook = _interrupted_while_loading


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


def parse(settings, argv=None, *, gpu=True):
    """The settings dataclass `settings` read from argv (sys.argv[1:] when None); then, for a
    command that may run on a GPU (gpu=True), check_cuda; and the libraries' progress bars off
    where stderr is not a terminal (progress_bars)."""
    args = settings(**vars(parser(settings).parse_args(argv)))
    if gpu:
        check_cuda()
    progress_bars()
    return args
