"""cli.py: a command's settings are one dataclass, and that dataclass is its command line.

The cleanrl manner: a run's settings are one object, with a default and a line of help per
field, that the run passes around, saves with its checkpoints and compares on --resume; argparse
only reads it from the command line. `lora_rank: int = flag(32, "LoRA rank")` is `--lora-rank N`;
a bool field is a switch, off by default; `choices` and `required` are argparse's; other keywords
are kept in the field's metadata for the command's own use. --help shows every flag's default,
and a bad flag is one line of error, not a usage dump.
"""
import argparse
import dataclasses
import sys
import types
import typing


def flag(default, help, *, choices=None, required=False, **meta):
    """A field of a settings dataclass: its default and the help line of its flag."""
    return dataclasses.field(default=default, metadata=dict(help=help, choices=choices, required=required,
                                                            **meta))


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def parser(settings):
    """The argparse parser of a settings dataclass (its docstring is the description)."""
    p = _Parser(description=settings.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(settings)
    for f in dataclasses.fields(settings):
        name, meta, kind = "--" + f.name.replace("_", "-"), f.metadata, hints[f.name]
        if kind is bool:
            p.add_argument(name, action="store_true", help=meta["help"])
            continue
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `str | None`: a str or unset
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        p.add_argument(name, type=kind, default=f.default, choices=meta["choices"], required=meta["required"],
                       help=meta["help"])
    return p


def parse(settings, argv=None):
    """The settings dataclass `settings` read from argv (sys.argv[1:] when None)."""
    return settings(**vars(parser(settings).parse_args(argv)))
