"""The paper's six GPU MODE problems, one module each.

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

Tunable constants in kernel files are module-level integers annotated with their allowed values,
`BLOCK_V = 1024  # tune: 256, 512, 1024, 2048`, so the offline catalog mutator of search.py can
propose edits without an LLM.
"""
import importlib
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


def get_task(name):
    """Return the task module for `name`, or raise ValueError naming the valid choices."""
    if name not in TASK_NAMES:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASK_NAMES)}")
    return importlib.import_module(f"tasks.{name}")


def seed_path(name):
    return KERNELS_DIR / name / "seed.py"


def seed_source(name):
    """The seed kernel's source: the PyTorch reference wrapped as custom_kernel."""
    return seed_path(name).read_text()


def variant_paths(name):
    """Hand-written kernel variants of a task (every kernel file but the seed), sorted by name."""
    folder = KERNELS_DIR / name
    return sorted(p for p in folder.glob("*.py") if p.name != "seed.py" and not p.name.startswith("_"))


def variant_sources(name):
    return {p.stem: p.read_text() for p in variant_paths(name)}
