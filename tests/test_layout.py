"""The project's layout is its architecture: `ls` shows the paper, the folders hold the machinery.

- The top level holds the entry points and the paper's concepts, one module each, and nothing
  else (about sixteen files).
- Each folder opens with a docstring that says what its layer is and that a first read may skip it.
- The import graph, the problems' modules (tasks/) included, has no cycle, counting the imports
  made inside functions (a cycle hidden in a function is still a cycle). One kind of edge is left
  out: a package's module using a name of its own package's front (its __init__: tasks.problem_file
  reads tasks.TUNE_LINE, while tasks.get_task loads tasks.problem_file on demand). That loop is the
  package's inside; a circle through the front that leaves the package still shows.
- The layers run one way. Nothing imports an entry point but the entry side (the entry points and
  search_setup.py, search.py's own choices for this machine): a concept or a piece of machinery
  that needed a command would have the layers upside down. The problems (tasks/) import nothing of
  the project outside tasks/: every layer stands on them. The measurement's machinery (harness/)
  and where a run runs (runtime/) never import a top-level module (measure.py, the protocol, is
  above the harness: the harness never reaches back up to it, or to anything beside it). data/ and
  models/ may use the paper's concepts (the bins, a Forecast), never an entry point.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "models", "runtime", "data")
PROBLEMS = "tasks"  # a package with a front (its __init__: the task registry) and a module per problem
NEVER_UP = ("harness", "runtime")  # folders that import no top-level module
ENTRY_POINTS = {"search", "forecaster", "measure", "train_grpo", "metrics", "eval_set", "train_costmodel", "report"}
CONCEPTS = {"bins", "forecast_prompt", "forecast_answer", "gate", "selective", "puct", "mutators", "paper_protocol"}
ENTRY_SIDE = ENTRY_POINTS | {"search_setup"}


def modules():
    """{dotted name: path} of the project's modules, the problems' (tasks/, its front named `tasks`)
    included; the kernels and GPU MODE's shim under tasks/ are candidates' code, not modules."""
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for folder in FOLDERS + (PROBLEMS,):
        found |= {f"{folder}.{p.stem}": p for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"}
    found[PROBLEMS] = ROOT / PROBLEMS / "__init__.py"
    return found


def imports(path, known):
    """The project modules a file imports, anywhere in it (`from tasks import problem_file` is the
    front `tasks` and its module `tasks.problem_file`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in known:
                out.add(node.module)
            if node.module in FOLDERS + (PROBLEMS,):
                out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
    return out


def graph():
    """{module: the project modules it imports}, less its own package's front (see above)."""
    known = modules()
    return {name: {dep for dep in imports(path, known) if dep != name and not name.startswith(dep + ".")}
            for name, path in known.items()}


def layer(name):
    head = name.split(".")[0]
    return head if head in FOLDERS + (PROBLEMS,) else "top"


def test_the_top_level_is_the_entry_points_and_the_concepts():
    top = {p.stem for p in ROOT.glob("*.py")}
    assert top == ENTRY_POINTS | CONCEPTS | {"search_setup"}, top ^ (ENTRY_POINTS | CONCEPTS | {"search_setup"})
    assert len(top) <= 17


def test_each_folder_says_what_it_is_and_that_a_first_read_may_skip_it():
    for folder in FOLDERS:
        doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text()))
        assert doc and doc.startswith(f"{folder}: ") and "A first read may skip this folder" in doc, folder
        for p in (ROOT / folder).glob("*.py"):  # the docstring names every module of the folder
            assert p.name == "__init__.py" or p.name in doc, (folder, p.name)


def test_the_layers_run_one_way():
    edges = [(a, b) for a, deps in graph().items() for b in sorted(deps)]
    upside_down = sorted((a, b) for a, b in edges if b in ENTRY_POINTS and a not in ENTRY_SIDE)
    assert not upside_down, f"a concept or machinery imports an entry point: {upside_down}"
    beyond = [(a, b) for a, b in edges if layer(a) == PROBLEMS and layer(b) != PROBLEMS]
    assert not beyond, f"a problem's module imports the project beyond tasks/: {beyond}"
    up = [(a, b) for a, b in edges if layer(a) in NEVER_UP and layer(b) == "top"]
    assert not up, f"the harness or runtime/ imports a top-level module: {up}"


def test_no_import_cycle():
    graph_ = graph()
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph_[node]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"
    for name in sorted(graph_):
        if name not in state:
            visit(name, [name])
    assert not cycles, f"import cycles: {cycles}"
