"""docs/FIDELITY.md: every setting it names as "the original's behaviour" is accepted by the
command it names.

The table's fourth column holds `command.py --flag [value]` settings (or "none"). For each one
the command's own argument parser (build_parser(), which every command named there exposes) must
know the flag, accept the value when the flag takes one (a listed choice, or a value its type
converts), and take no value when the flag is a switch.
"""
import argparse
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "FIDELITY.md"
SETTING = re.compile(r"`((?:\w+/)?\w+)\.py((?:\s+[^`\s]+)*)`")  # data/pair_sampler.py: module data.pair_sampler


def table_rows():
    """(row label, fourth cell) of every row of every table in FIDELITY.md."""
    rows, header = [], None
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if header is None:
            header = cells
            assert header[3] == "the original's behaviour", f"unexpected table header {header}"
        elif not set("".join(cells)) <= set("-: "):
            rows.append((cells[0], cells[3]))
    return rows


def settings():
    out = []
    for label, cell in table_rows():
        found = SETTING.findall(cell)
        assert found or cell.lower().startswith("none"), \
            f"FIDELITY.md row {label!r}: name a `command.py --flag` setting or say none (and why)"
        out += [(label, module.replace("/", "."), flags.split()) for module, flags in found]
    return out


def test_the_table_names_settings():
    assert len(table_rows()) >= 10
    assert any(m == "metrics" and f == ["--protocol", "paper"] for _, m, f in settings())


@pytest.mark.parametrize("label, module, flags", settings(), ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_each_setting_is_accepted_by_its_command(label, module, flags):
    parser = importlib.import_module(module).build_parser()
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    i = 0
    while i < len(flags):
        flag = flags[i]
        assert flag in by_flag, f"{module}.py has no {flag} (FIDELITY.md row {label!r})"
        action = by_flag[flag]
        takes_value = action.nargs != 0 and not isinstance(
            action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction))
        if takes_value:
            assert i + 1 < len(flags) and not flags[i + 1].startswith("--"), f"{flag} needs a value"
            value = flags[i + 1]
            if action.choices is not None:
                assert value in action.choices, f"{module}.py {flag} does not accept {value!r}"
            elif action.type is not None:
                action.type(value)
            i += 2
        else:
            assert i + 1 == len(flags) or flags[i + 1].startswith("--"), f"{flag} is a switch"
            i += 1
