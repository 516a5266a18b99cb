"""Tasks from a file: a KernelBench problem, or an op of your own in this project's task format.

The paper's discovery pairs come from two families: the six GPU MODE problems of this package and
KernelBench's level-3 problems (full networks). KernelBench's problem format is the field's common
currency, so `--task PATH` takes a file in it, and a file in the project's own format takes any
operator a user cares about. Either becomes an object with the names of the task contract
(tasks/__init__.py), so measure.py, forecaster.py and search.py treat it as they treat a built-in
task.

KernelBench format: `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`; a candidate
defines `class ModelNew` with Model's constructor arguments (or, as every task here accepts,
`custom_kernel(data)` with data the tuple get_inputs() returns). As KernelBench does: the weights
come from seeding the RNG with 42 right before constructing each model (so a ModelNew that
creates the same parameters in the same order gets the same weights), inputs from get_inputs()
under a per-call seed, models called under torch.no_grad() in their default (training) mode; the
output must have the reference's shape and lie within tol = 1e-4 (fp32) or 1e-2 (fp16, bf16) of
it, rtol = atol = tol, over five trials (the two seeds of the timed case and three check cases);
the speedup is over eager PyTorch. The shapes are the problem's own: one case, on CPU too.

The project's format (a complete example is in the README):

    DESCRIPTION = "..."                   prose for the LLM
    CASES = [{"n": 4096}, ...]            shapes timed (CPU_CASES, CHECK_CASES, CPU_CHECK_CASES
                                          optional: default CASES, [], CASES, [])
    def generate_input(case, seed, device="cpu"): ...   a tuple of tensors
    def reference(data): ...              the PyTorch reference
    def check(output, expected): ...      optional: default KernelBench's rule above
    def min_bytes(case): ...              optional: default 0 (no physical floor on a GPU)
    def custom_kernel(data): ...          optional: a kernel of your own, the search's first mutation
    NAME = 64  # tune: 16, 32, 64         optional: constants the offline mutator may edit

The search starts from the reference, as the paper's does: the seed is the file with the reference
wrapped as `custom_kernel`. A `custom_kernel` the file defines is the task's hand-written variant,
as tasks/kernels/<task>/*.py are a built-in task's: the offline catalog mutator proposes it first,
then edits of its `# tune:` constants one at a time (mutators.tunables: an integer constant with the
values it may take). Without a kernel of its own, the marked constants are the reference's, and
the edits are made to the seed. The seed of a file with a kernel drops the marks: its constants
change the kernel, not the reference, and an edit of them would measure the seed again.

A problem file is the user's own, trusted code: the reference worker imports it, and so does the
candidate's worker inside its sandbox (which sees the file read-only), to make inputs and, for a
KernelBench problem, to construct ModelNew. The candidate stays untrusted exactly as for a
built-in task (docs/MEASUREMENT.md).
"""
import hashlib
import importlib.util
import os
import re
import sys
from pathlib import Path

KERNELBENCH_ENV = "KERNELBENCH_DIR"  # a KernelBench checkout, for `kernelbench:LEVEL/NAME` tasks
KERNELBENCH_SEED = 42                # KernelBench seeds the RNG with this before building a model
TOLERANCE = {"torch.float32": 1e-4, "torch.float16": 1e-2, "torch.bfloat16": 1e-2}  # KernelBench's
KERNELBENCH_DESCRIPTION = (
    "A KernelBench problem: the reference is the PyTorch module `Model` below (with its "
    "get_inputs() and get_init_inputs()). Write a module that defines `class ModelNew(nn.Module)` "
    "with Model's constructor arguments and the same forward signature, computing the same output "
    "faster (custom Triton kernels where they pay). Correct means the same shape and within "
    "rtol = atol = 1e-4 (fp32; 1e-2 for fp16/bf16) on five random inputs; the speedup is over "
    "eager PyTorch.")


class ProblemError(ValueError):
    """A problem file or name that cannot be a task; the message names what is missing."""


def resolve(value, kernelbench_dir=None):
    """The absolute path of a problem file given as a path or as `kernelbench:LEVEL/NAME` (found
    in `kernelbench_dir`, else $KERNELBENCH_DIR: a KernelBench checkout; nothing is downloaded)."""
    if value.startswith("kernelbench:"):
        name = value.removeprefix("kernelbench:")
        root = kernelbench_dir or os.environ.get(KERNELBENCH_ENV)
        if not root:
            raise ProblemError(f"task {value!r} names a KernelBench problem: pass --kernelbench-dir "
                               f"PATH (a KernelBench checkout) or set {KERNELBENCH_ENV}")
        level, _, stem = name.rpartition("/")
        level = level.removeprefix("level")
        base = Path(root) / "KernelBench"
        base = base if base.is_dir() else Path(root)
        found = sorted(base.glob(f"level{level}/{stem}.py") if level else base.glob(f"level*/{stem}.py"))
        if not found:
            raise ProblemError(f"no KernelBench problem {name!r} in {base} (looked for "
                               f"level{level or '*'}/{stem}.py); give LEVEL/NAME as in kernelbench:3/8_ResNetBasicBlock")
        return str(found[0].resolve())
    path = Path(value)
    if not path.is_file():
        raise ProblemError(f"task {value!r}: no such task file (give a built-in task name, a problem "
                           f"file's path or kernelbench:LEVEL/NAME)")
    return str(path.resolve())


_LOADED = {}


def load(path):
    """The task object of a problem file (cached per path and content)."""
    source = Path(path).read_text()
    key = (path, hashlib.sha256(source.encode()).hexdigest())
    if key not in _LOADED:
        module = _import(path, key[1])
        if hasattr(module, "Model") or hasattr(module, "get_inputs"):
            _LOADED[key] = KernelBenchTask(path, source, module)
        else:
            _LOADED[key] = OwnTask(path, source, module)
    return _LOADED[key]


def _import(path, sha):
    name = f"problem_{Path(path).stem}_{sha[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: say which and why, in one line
        raise ProblemError(f"problem file {path} failed to import: {type(e).__name__}: {e}") from None
    sys.modules[name] = module
    return module


def _missing(path, module, names, what):
    gone = [n for n in names if not hasattr(module, n)]
    if gone:
        raise ProblemError(f"problem file {path} lacks {', '.join(gone)}: {what}")


def _dense(out):
    """A module's output as contiguous tensors: KernelBench accepts any layout, and the harness
    fingerprints raw bytes, so both sides pay for the copy a view needs (none for most outputs)."""
    if isinstance(out, (tuple, list)):
        return type(out)(_dense(x) for x in out)
    return out.contiguous() if hasattr(out, "contiguous") else out


def kernelbench_check(output, expected):
    """KernelBench's rule: same shape, then rtol = atol = tol of the reference's precision, with
    the value comparison of tasks/_check.py (cast to fp32; non-finite values kind for kind)."""
    from tasks._check import _as_tuple, compare_outputs
    tol = TOLERANCE.get(str(_as_tuple(expected)[0].dtype), 1e-4)
    return compare_outputs(output, expected, tol, tol)


class KernelBenchTask:
    """A KernelBench problem file as a task (see the module docstring)."""

    def __init__(self, path, source, module):
        _missing(path, module, ("Model", "get_inputs", "get_init_inputs"),
                 "a KernelBench problem defines class Model(nn.Module), get_inputs() and get_init_inputs()")
        self.path, self.source, self.module = path, source, module
        self.NAME = Path(path).stem
        self.DESCRIPTION = KERNELBENCH_DESCRIPTION
        # One shape, the problem's; five correctness trials in all (two seeds of the timed case).
        self.BENCHMARK_CASES = self.CPU_CASES = [{"problem": self.NAME}]
        self.CHECK_CASES = self.CPU_CHECK_CASES = [{"problem": self.NAME, "trial": k} for k in (3, 4, 5)]
        self._models = {}

    def variant_sources(self):
        return {}  # no hand-written variant: the search starts from the problem alone

    def seed_source(self):
        """The search's seed: the problem itself, Model renamed ModelNew (speedup about 1)."""
        return re.sub(r"\bModel\b", "ModelNew", self.source)

    def generate_input(self, case, seed, device="cpu"):
        import torch
        torch.manual_seed(int(seed))
        inputs = self.module.get_inputs()
        return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)

    def _build(self, cls, device):
        import torch
        torch.manual_seed(KERNELBENCH_SEED)
        return cls(*self.module.get_init_inputs()).to(device)

    def reference(self, data):
        import torch
        device = next((x.device.type for x in data if isinstance(x, torch.Tensor)), "cpu")
        if device not in self._models:
            self._models[device] = self._build(self.module.Model, device)
        with torch.no_grad():
            return _dense(self._models[device](*data))

    def entry_point(self, candidate, device):
        """The candidate's callable: ModelNew built as KernelBench builds it, called on data."""
        import torch
        if hasattr(candidate, "ModelNew"):
            model = self._build(candidate.ModelNew, device)

            def run(data):
                with torch.no_grad():
                    return _dense(model(*data))
            return run
        if hasattr(candidate, "custom_kernel"):
            return candidate.custom_kernel
        raise ProblemError("the candidate defines neither class ModelNew (a KernelBench candidate) nor custom_kernel(data)")

    check = staticmethod(kernelbench_check)

    def min_bytes(self, case):
        return 0  # unknown: no physical floor


class OwnTask:
    """A task file in this project's format (see the module docstring)."""

    def __init__(self, path, source, module):
        _missing(path, module, ("DESCRIPTION", "CASES", "generate_input", "reference"),
                 "a task file defines DESCRIPTION, CASES, generate_input(case, seed, device) and reference(data) "
                 "(or, in KernelBench's format, Model, get_inputs and get_init_inputs)")
        self.path, self.source, self.module = path, source, module
        self.NAME = Path(path).stem
        self.DESCRIPTION = module.DESCRIPTION
        self.BENCHMARK_CASES = list(module.CASES)
        self.CHECK_CASES = list(getattr(module, "CHECK_CASES", []))
        self.CPU_CASES = list(getattr(module, "CPU_CASES", self.BENCHMARK_CASES))
        self.CPU_CHECK_CASES = list(getattr(module, "CPU_CHECK_CASES", self.CHECK_CASES))
        if not self.BENCHMARK_CASES or not self.CPU_CASES:
            raise ProblemError(f"problem file {path}: CASES is empty; give at least one case (a dict of shape parameters)")
        self.generate_input = module.generate_input
        self.reference = module.reference
        self.check = getattr(module, "check", kernelbench_check)
        self.min_bytes = getattr(module, "min_bytes", lambda case: 0)

    def variant_sources(self):
        """{name: source} of the file's own kernel (its `custom_kernel`), the task's one hand-written
        variant; {} when it defines none."""
        return {self.NAME: self.source} if hasattr(self.module, "custom_kernel") else {}

    def seed_source(self):
        """The search's seed: the task file itself, its reference wrapped as custom_kernel (the
        file's own kernel, if any, is overridden, and its `# tune:` marks dropped: see above)."""
        source = self.source
        if hasattr(self.module, "custom_kernel"):
            from tasks import TUNE_LINE
            source = TUNE_LINE.sub(lambda m: m["head"] + m["value"], source)
        return source.rstrip() + "\n\n\ndef custom_kernel(data):\n    return reference(data)\n"
