"""Docs that cannot drift: every name the docs give exists, and every signature in
docs/ARCHITECTURE.md is the code's.

The convention (stated at the top of docs/ARCHITECTURE.md): a backticked span that begins with a
project module, `module.name` or `module.Class.method`, names something that must exist; followed
by a parameter list, `module.name(a, b=1, *, c=None)`, it is a contract, checked against
inspect.signature: the same parameters in the same order, the same kinds (`*` starts the
keyword-only ones, `*args`, `**kwargs`), a default where one is written and none where none is,
and a written default equal to the code's (a literal, or a name of the module such as
`BUDGETS_PCT`; `=...` says "a default, not spelled out here"). A method's `self` is left out. A
trailing `...` stands for further parameters that all have defaults, so a call written from the
doc still works. An optional ` -> result` after the list is prose. In ARCHITECTURE.md a
signature must name its module (`gate.Gate(...)`, never `Gate(...)`), so that none escapes
the check. The other docs are checked for names only: their parentheses hold calls, not
signatures. A name of a module that has moved into a package, still given where it was, fails.

Also checked: the tree at the top of ARCHITECTURE.md names the files there are, and the module
docstrings that list their module's contents (metrics.py's reading order, forecaster.py's table)
list what the module defines, in its order.
"""
import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
NAMED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "png", "sh", "txt", "toml", "ini", "cfg"}
SPAN = re.compile(r"`([^`\n]+)`")
HEAD = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def spans(path):
    """Backticked spans outside fenced code blocks, with their line numbers."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.extend((number, s.strip()) for s in SPAN.findall(line))
    return out


def is_project_module(name):
    """A top-level module or package of this project, or a module inside one of its packages (named
    without its package: the doc is then out of date, and the check says so)."""
    return ((ROOT / f"{name}.py").is_file() or (ROOT / name / "__init__.py").is_file()
            or any(p.parent.joinpath("__init__.py").is_file() for p in ROOT.glob(f"*/{name}.py")))


def split(span):
    """(dotted head, parameter text or None) of a span; None when it is neither a name nor a
    signature (prose, a command line)."""
    head = HEAD.match(span)
    if not head:
        return None
    rest = span[head.end():]
    if not rest:
        return head.group(), None
    if not rest.startswith("("):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0:
            tail = rest[i + 1:].strip()
            if tail and not tail.startswith("->"):
                return None
            return head.group(), rest[1:i]
    return None


def resolve(dotted):
    """(module, owner, object) for `module[.sub].name[.attr]`; owner is the class of a method."""
    parts = dotted.split(".")
    module, i = None, 0
    for j in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:j]))
            i = j
            break
        except ModuleNotFoundError as e:
            if e.name != ".".join(parts[:j]) and not ".".join(parts[:j]).startswith(e.name + "."):
                raise
    assert module is not None, f"{dotted}: no module to import (moved into a package? name it package.module)"
    owner, obj = None, module
    for part in parts[i:]:
        assert hasattr(obj, part), f"{dotted}: {getattr(obj, '__name__', obj)!s} has no {part!r}"
        owner, obj = obj, getattr(obj, part)
    return module, owner, obj


def code_parameters(owner, obj, name):
    """The parameters a caller passes: a method's self is left out."""
    if inspect.isclass(obj):
        return list(inspect.signature(obj).parameters.values())
    params = list(inspect.signature(obj).parameters.values())
    if inspect.isclass(owner) and inspect.isfunction(inspect.getattr_static(owner, name)):
        params = params[1:]  # a plain method: self
    return params


KINDS = {"posonly": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "vararg": inspect.Parameter.VAR_POSITIONAL, "kwonly": inspect.Parameter.KEYWORD_ONLY,
         "kwarg": inspect.Parameter.VAR_KEYWORD}


def doc_parameters(text):
    """[(name, kind, default node or None)] of a written parameter list, and whether it ends in
    `...` (more parameters, all with defaults)."""
    text = text.strip()
    more = text == "..." or text.endswith(", ...")
    if more:
        text = text[:-3].rstrip().rstrip(",")
    fn = ast.parse(f"def f({text}): pass").body[0].args
    out = []
    positional = fn.posonlyargs + fn.args
    defaults = [None] * (len(positional) - len(fn.defaults)) + list(fn.defaults)
    for a, d in zip(positional, defaults):
        out.append((a.arg, KINDS["posonly" if a in fn.posonlyargs else "args"], d))
    if fn.vararg:
        out.append((fn.vararg.arg, KINDS["vararg"], None))
    for a, d in zip(fn.kwonlyargs, fn.kw_defaults):
        out.append((a.arg, KINDS["kwonly"], d))
    if fn.kwarg:
        out.append((fn.kwarg.arg, KINDS["kwarg"], None))
    return out, more


def default_value(node, module):
    """The value a written default stands for; Ellipsis for `...` (unchecked)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    name = ast.unparse(node)
    obj = module
    for part in name.split("."):
        if obj is module and not hasattr(module, part) and hasattr(builtins, part):
            obj = getattr(builtins, part)
            continue
        assert hasattr(obj, part), f"default {name!r} is neither a literal nor a name of {module.__name__}"
        obj = getattr(obj, part)
    return obj


def check_signature(dotted, text):
    module, owner, obj = resolve(dotted)
    assert callable(obj), f"{dotted} is not callable"
    written, more = doc_parameters(text)
    code = code_parameters(owner, obj, dotted.rsplit(".", 1)[-1])
    actual = f"{dotted}{inspect.signature(obj) if inspect.isclass(obj) else '(' + ', '.join(map(str, code)) + ')'}"
    assert len(code) >= len(written), f"the doc lists more parameters than {actual} has"
    for (name, kind, default), p in zip(written, code):
        assert name == p.name, f"parameter {name!r} where the code has {p.name!r}: {actual}"
        assert kind == p.kind, f"parameter {name!r} is {p.kind.description} in the code: {actual}"
        has = p.default is not inspect.Parameter.empty
        assert (default is not None) == has, f"parameter {name!r} {'has' if has else 'has no'} default: {actual}"
        if default is not None:
            value = default_value(default, module)
            if value is not Ellipsis:
                assert value is p.default or value == p.default, \
                    f"parameter {name!r} defaults to {p.default!r}, the doc says {ast.unparse(default)}: {actual}"
    extra = code[len(written):]
    if more:
        required = [p.name for p in extra if p.default is inspect.Parameter.empty
                    and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        assert not required, f"the doc's `...` hides required parameters {required}: {actual}"
    else:
        assert not extra, f"the doc leaves out {[p.name for p in extra]} (end the list with `...` " \
                          f"if they are options): {actual}"


def contracts():
    """(line, head, parameter text) of every signature in ARCHITECTURE.md."""
    out = []
    for number, span in spans(ARCHITECTURE):
        parts = split(span)
        if parts and parts[1] is not None:
            root = parts[0].split(".")[0]
            if "." not in parts[0] or is_project_module(root):  # not a library's call, e.g. `os.replace(...)`
                out.append((number, *parts))
    return out


def names():
    """(file:line, dotted name) of every project name without parameters in the docs."""
    out = []
    for path in NAMED:
        for number, span in spans(path):
            parts = split(span)
            if not parts or parts[1] is not None or "." not in parts[0]:
                continue
            dotted = parts[0]
            if is_project_module(dotted.split(".")[0]) and dotted.rsplit(".", 1)[-1] not in FILE_SUFFIXES:
                out.append((f"{path.relative_to(ROOT)}:{number}", dotted))
    return out


def test_architecture_states_many_contracts():
    # the convention holds: a broken parser would find none and check nothing
    assert len(contracts()) >= 60


@pytest.mark.parametrize("line, dotted, text", [pytest.param(*c, id=f"{c[0]}-{c[1]}") for c in contracts()])
def test_signature_in_architecture_is_the_codes(line, dotted, text):
    if "." not in dotted:
        pytest.fail(f"docs/ARCHITECTURE.md:{line}: `{dotted}(...)` names no module; write `module.{dotted}(...)`")
    try:
        check_signature(dotted, text)
    except SyntaxError:
        pytest.fail(f"docs/ARCHITECTURE.md:{line}: `{dotted}({text})` is not a parameter list")
    except AssertionError as e:
        pytest.fail(f"docs/ARCHITECTURE.md:{line}: {e}")


@pytest.mark.parametrize("where, dotted", [pytest.param(*n, id=f"{n[0]}-{n[1]}") for n in names()])
def test_name_in_docs_exists(where, dotted):
    try:
        resolve(dotted)
    except AssertionError as e:
        pytest.fail(f"{where}: {e}")


# ---- the checker itself: it must fail where the doc is wrong -----------------------------------

def test_checker_catches_drift():
    check_signature("bins.confidence", "p, kind='maxprob'")
    check_signature("forecaster.Forecaster.forecast_many", "task, reference_code, candidate_codes, *, repeat=0")
    check_signature("metrics.speedup_recovered", "keys, speedups, budgets=BUDGETS_PCT")
    check_signature("measure.measure", "task, source, *, device=None, ...")
    for wrong in ("p", "p, kind='entropy'", "p, kind", "q, kind='maxprob'", "p, *, kind='maxprob'",
                  "p, kind='maxprob', extra=1"):
        with pytest.raises(AssertionError):
            check_signature("bins.confidence", wrong)
    with pytest.raises(AssertionError):  # `...` must not hide a required parameter
        check_signature("bins.brier", "p, ...")
    with pytest.raises(AssertionError):
        resolve("bins.no_such_name")
    with pytest.raises(AssertionError):  # a module that moved away, named where it was
        resolve("no_such_module.name")
    assert is_project_module("cross_entropy") and not is_project_module("torch")  # tasks/cross_entropy.py
    assert split("bins.brier") == ("bins.brier", None)
    assert split("measure.measure(task, source) -> Measurement") == ("measure.measure", "task, source")
    assert split("python search.py --task x") is None


# ---- module docstrings that list a module's contents -----------------------------------------

def definitions(path):
    """{name: line} of a module's top-level functions and classes (imports are not definitions)."""
    tree = ast.parse(path.read_text())
    return {n.name: n.lineno for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_metrics_reading_order_is_its_order():
    # metrics.py's docstring numbers its sections "reading top to bottom": each section's names must
    # come after the previous section's in the file
    defs = definitions(ROOT / "metrics.py")
    doc = ast.get_docstring(ast.parse((ROOT / "metrics.py").read_text()))
    block = doc.split("Reading top to bottom:\n", 1)[1].split("\n\n", 1)[0]
    items = re.split(r"^\d+\. ", block, flags=re.M)[1:]
    assert len(items) >= 5
    lines = []
    for item in items:
        named = [defs[w] for w in re.findall(r"\w+", item) if w in defs]
        assert named, f"the reading order's item {item[:40]!r}... names no function of metrics.py"
        lines.append((min(named), max(named), item[:40]))
    for (_, last, a), (first, _, b) in zip(lines, lines[1:]):
        assert last < first, f"metrics.py's reading order: {b!r}... comes before {a!r}... in the file"


def test_forecaster_docstring_lists_only_its_own_names():
    # the indented table of forecaster.py's docstring: names defined in forecaster.py, in its order
    defs = definitions(ROOT / "forecaster.py")
    doc = ast.get_docstring(ast.parse((ROOT / "forecaster.py").read_text()))
    listed = re.findall(r"^    ([A-Za-z_]\w*)\s{2,}", doc, flags=re.M)
    assert len(listed) >= 3
    for name in listed:
        assert name in defs, f"forecaster.py's docstring lists {name}, which forecaster.py does not define"
    assert [defs[n] for n in listed] == sorted(defs[n] for n in listed), "listed out of the file's order"


def test_architecture_tree_is_the_folder():
    # the tree at the top of ARCHITECTURE.md: the file each line begins with is where it says, and
    # every top-level module has its line
    text = ARCHITECTURE.read_text()
    tree = text.split("```\n", 2)[1]
    files = [m.group(1) for line in tree.splitlines()
             if (m := re.match(r"^[\s│├└]*([\w/]+\.py)\s", line))]
    assert len(files) >= 20
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert not missing, f"docs/ARCHITECTURE.md's tree names files that are not there: {missing}"
    unlisted = sorted(p.name for p in ROOT.glob("*.py") if p.name not in files)
    assert not unlisted, f"docs/ARCHITECTURE.md's tree leaves out top-level modules: {unlisted}"


def test_the_install_block_is_what_ci_runs_and_needs_no_sudo_as_root():
    # .ci/run runs the README's install block as it stands (its own awk, run here), so the two
    # cannot drift; the block must work as root without sudo (a container) and as a user with it,
    # update apt's lists before installing, and put torch's CPU build in before requirements.txt
    # would bring the CUDA build
    import subprocess
    ci = (ROOT / ".ci" / "run").read_text()
    awk = re.search(r"install=\$\(awk '([^']+)' README\.md\)", ci)
    assert awk, ".ci/run no longer takes its install commands from the README's block"
    block = subprocess.run(["awk", awk.group(1), "README.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert block and not any("pytest" in line for line in block), block
    apt = [line for line in block if "apt-get" in line]
    assert apt and all(line.count("$(command -v sudo) apt-get ") == line.count("apt-get") for line in apt), \
        f"every apt-get needs the `$(command -v sudo)` prefix: {apt}"
    assert "apt-get update &&" in apt[0], "apt's lists are updated before the install"
    cpu = next(i for i, line in enumerate(block) if "download.pytorch.org/whl/cpu" in line)
    assert cpu < next(i for i, line in enumerate(block) if "requirements.txt" in line)
