"""The paper's six GPU MODE problems, one module each; and any problem given as a file.

Every task module defines the same names (the contract measure.py, forecaster.py and search.py
rely on):

    NAME              the task's name, e.g. "cross_entropy"
    DESCRIPTION       prose for LLM prompts: inputs, outputs, dtypes, shapes, tolerance
    BENCHMARK_CASES   the paper's benchmark shapes (timed on a GPU)
    CHECK_CASES       extra correctness-only shapes for a GPU (odd sizes, other distributions)
    CPU_CASES         small shapes timed on CPU (an interpreted Triton kernel stays near 1 s)
    CPU_CHECK_CASES   small odd shapes checked (not timed) on CPU
    generate_input(case, seed, device="cpu") -> data     a tuple of tensors (trimul adds dicts of
                                                          weights and config), never zeros
    reference(data) -> expected                           the PyTorch reference
    check(output, expected) -> (ok, message)              dtype/shape/device/tolerance check
    min_bytes(case) -> int                                unavoidable memory traffic (the floor)

A case is a JSON-serialisable dict of the shape parameters. A candidate kernel is the source of a
Python module that defines `custom_kernel(data)`. Each task's seed kernel (the PyTorch reference
wrapped as `custom_kernel`, as in the paper) and hand-written variants live in
`tasks/kernels/<task>/`: `seed.py` plus any other `*.py` file.

A task has two spaces of hand-written variants (SPACES), one per kind of machine that times them:
  triton  `tasks/kernels/<task>/*.py`: the GPU's kernels, Triton mostly. A machine without a GPU
          runs them in Triton's interpreter, some hundred times slower than the PyTorch reference,
          so there they test the machinery but are never fast.
  cpu     `tasks/kernels/<task>/cpu/*.py`: real CPU code, timed on one core: PyTorch rewrites,
          torch.compile with inductor's choices, hand-written C++ built with
          torch.utils.cpp_extension.load_inline. Named `cpu/<stem>` beside the Triton ones.

A task is named by its built-in name, by the path of a problem file (KernelBench's format or this
project's own: tasks/problem_file.py turns either into an object with the names above), or as
`kernelbench:LEVEL/NAME`, a problem of a KernelBench checkout. `get_task` is the one place a
`--task` value becomes a task. A file task's seed is built from the file, and its one hand-written
variant is the `custom_kernel` it may define (problem_file.py).

Tunable constants in kernel files (and in task files) are module-level integers annotated with
their allowed values, `BLOCK_V = 1024  # tune: 256, 512, 1024, 2048`, so the offline catalog
mutator of search.py can propose edits without an LLM (mutators.tunables reads them).
"""
import importlib
import re
from pathlib import Path

TASK_NAMES = (
    "cross_entropy",
    "trimul",
    "fp8_quant",
    "gdn_chunk_fwd_h",
    "gdn_chunk_fwd_o",
    "gdn_recompute_w_u",
)
KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
# A tunable constant's line (see the module docstring): mutators.tunables reads it, and a task
# file's seed drops its mark (problem_file.OwnTask.seed_source).
TUNE_LINE = re.compile(r"^(?P<head>(?P<name>[A-Za-z_]\w*)\s*=\s*)(?P<value>\d+)(?P<tail>\s*#\s*tune:\s*"
                       r"(?P<choices>\d+(?:\s*,\s*\d+)*)\s*)$", re.M)


def _is_file_task(name):
    return name not in TASK_NAMES and (name.startswith("kernelbench:") or name.endswith(".py") or "/" in name)


def resolve_task(name):
    """A `--task` value as the workers take it: a built-in name, else the problem file's absolute
    path (a `kernelbench:` name found in its checkout). Raises ValueError naming what is wrong."""
    if name in TASK_NAMES:
        return name
    if not _is_file_task(name):
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASK_NAMES)}, or give a problem "
                         f"file's path (KernelBench's format or tasks/problem_file.py's) or kernelbench:LEVEL/NAME")
    from tasks import problem_file
    return problem_file.resolve(name)


def get_task(name):
    """The task for `name` (see resolve_task), or a ValueError naming the valid choices or what
    the problem file lacks."""
    path = resolve_task(name)
    if path in TASK_NAMES:
        return importlib.import_module(f"tasks.{name}")
    from tasks import problem_file
    return problem_file.load(path)


def task_label(name):
    """A short name for run folders and prompts: a built-in name as it is; a problem file, or a
    kernelbench:LEVEL/NAME, by its stem (the name a file task's NAME holds)."""
    return Path(name.removeprefix("kernelbench:")).stem if _is_file_task(name) else name


def prompt_view(name):
    """(label, description) of a task for a forecast's prompt. A KernelBench problem named as
    `kernelbench:...` (a row of the paper's kernelbench_l3 discovery pairs) needs no checkout: its
    rows carry the code, and the description says only what the format is."""
    from tasks import problem_file
    if name.startswith("kernelbench:"):
        return name, problem_file.KERNELBENCH_DESCRIPTION
    return task_label(name), get_task(name).DESCRIPTION


def seed_path(name):
    return KERNELS_DIR / name / "seed.py"


def seed_source(name):
    """The seed kernel's source: the PyTorch reference wrapped as custom_kernel (a file task's
    from its file: a KernelBench problem's Model renamed ModelNew)."""
    if name not in TASK_NAMES:
        return get_task(name).seed_source()
    return seed_path(name).read_text()


def reference_candidate(name):
    """The task's reference as a candidate's source: what measure.py's timed reference side loads,
    through the same code path as every candidate, and what an A/A check measures (its true
    speedup is exactly 1). A built-in task's reference, called from a module of its own; a problem
    file's seed (a KernelBench problem's Model renamed ModelNew, built and called as a candidate's
    ModelNew is; a task file's reference wrapped as custom_kernel)."""
    if name in TASK_NAMES:
        return f"from tasks.{name} import reference as _reference\n\n\ndef custom_kernel(data):\n    return _reference(data)\n"
    return get_task(name).seed_source()


def reference_source(name):
    """The reference a forecast compares against: the seed kernel, or a problem file's source."""
    return seed_source(name) if name in TASK_NAMES else get_task(name).source


SPACES = ("triton", "cpu")


def variant_paths(name, space="triton"):
    """Hand-written kernel variants of a task in a space (SPACES, or "all" for both), sorted by
    name: every kernel file of its folder but the seed; none for a file task."""
    if space not in (*SPACES, "all"):
        raise ValueError(f"unknown kernel space {space!r}; choose one of: {', '.join(SPACES)}, all")
    if name not in TASK_NAMES:
        return []
    folders = [KERNELS_DIR / name] if space == "triton" else [KERNELS_DIR / name / "cpu"] if space == "cpu" \
        else [KERNELS_DIR / name, KERNELS_DIR / name / "cpu"]
    return [p for folder in folders
            for p in sorted(folder.glob("*.py")) if p.name != "seed.py" and not p.name.startswith("_")]


def variant_name(path):
    """A variant's name: its file's stem, `cpu/<stem>` for a CPU kernel (the two spaces may share a stem)."""
    return f"cpu/{path.stem}" if path.parent.name == "cpu" else path.stem


def variant_sources(name, space="triton"):
    """{name: source} of a task's hand-written variants in a space (variant_paths): a built-in
    task's files, a task file's own `custom_kernel` (problem_file.py; the same in every space)."""
    if name not in TASK_NAMES:
        return get_task(name).variant_sources()
    return {variant_name(p): p.read_text() for p in variant_paths(name, space)}
