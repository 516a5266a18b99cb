"""The project's layout is its architecture: `ls` shows the paper, the folders hold the machinery.

- The top level holds the entry points and the paper's concepts, one module each, and nothing
  else (about sixteen files).
- Each folder opens with a docstring that says what its layer is and that a first read may skip it.
- The import graph has no cycle, counting the imports made inside functions (a cycle hidden in a
  function is still a cycle), and nothing imports an entry point but the entry side (the entry
  points and search_setup.py, search.py's own choices for this machine): a concept or a piece of
  machinery that needed a command would have the layers upside down.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "models", "runtime", "data")
ENTRY_POINTS = {"search", "forecaster", "measure", "train_grpo", "metrics", "eval_set", "train_costmodel", "report"}
CONCEPTS = {"bins", "forecast_prompt", "forecast_answer", "gate", "selective", "puct", "mutators", "paper_protocol"}
ENTRY_SIDE = ENTRY_POINTS | {"search_setup"}


def modules():
    """{dotted name: path} of the project's modules (tasks/ are the problems, not the project)."""
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for folder in FOLDERS:
        found |= {f"{folder}.{p.stem}": p for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"}
    return found


def imports(path, known):
    """The project modules a file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in known:
                out.add(node.module)
            elif node.module in FOLDERS:
                out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
    return out


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


def test_no_import_cycle_and_nothing_imports_an_entry_point():
    known = modules()
    graph = {name: imports(path, known) for name, path in known.items()}
    upside_down = sorted((a, b) for a, deps in graph.items() for b in deps
                         if b in ENTRY_POINTS and a not in ENTRY_SIDE)
    assert not upside_down, f"a concept or machinery imports an entry point: {upside_down}"
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"
    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, f"import cycles: {cycles}"
