"""Every Triton kernel of the catalog, compiled ahead of time for the GPUs the project targets.

The interpreter that runs the kernels on CPU accepts any tile size; a GPU does not. A tuning whose
shared memory exceeds the per-block limit compiles, then fails at launch ("out of resource: shared
memory"), and the search would record every such candidate as a failure that only a GPU shows.
Triton compiles without a GPU when it is told the target, so here each kernel file's
`custom_kernel` runs at the task's benchmark shapes on meta tensors (shapes, no memory) with every
launch compiled, not run, for sm_80 (A100) and sm_90 (H100/H200), and the shared memory each
compiled kernel asks for is checked against that GPU's limit. The catalog's `# tune:` lists are
what the search's mutator may combine freely, so every combination of them must fit.

The default suite compiles trimul's projection kernels, the catalog's only tl.dot tiles, at their
largest tuning (every `# tune:` constant at its largest value: their shared memory grows with the
tiles) for both targets, and the tuning the catalog used to allow, which must be caught. The sweep
over every combination of every file compiles hundreds of kernels, tens of minutes on two cores,
and runs with GPU_FORECASTERS_AOT_SWEEP=1 (the other files' kernels are reductions: 64 to 256 B of
shared memory at their largest tunings with Triton 3.7.1).
"""
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

from mutators import tunables  # noqa: E402
from tasks import KERNELS_DIR, get_task  # noqa: E402

# The most dynamic shared memory one block may use (cudaDevAttrMaxSharedMemoryPerBlockOptin):
# A100 (sm_80) 163 KiB, H100 and H200 (sm_90) 227 KiB.
SMEM_LIMIT = {80: 166_912, 90: 232_448}
TRITON_FILES = sorted(p for p in KERNELS_DIR.glob("*/*.py") if "@triton.jit" in p.read_text())


# ---- in a child process: Triton as on a GPU machine, launches compiled instead of run -----------

class _Target:
    """What Triton's launcher asks the driver, answered for a GPU that is not here."""

    def __init__(self, arch):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    if isinstance(x, dict):
        return {k: _meta(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_meta(v) for v in x)
    return x


def meta_inputs(task_name, cases):
    """The task's inputs at `cases` as meta tensors: the shapes and dtypes a GPU run gets (which
    pick the kernels' constexprs), drawn under FakeTensorMode so nothing is allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = [get_task(task_name).generate_input(case, 0) for case in cases]
    return [_meta(d) for d in fake]


def compile_tunings(path, arch, tunings, inputs):
    """Run the kernel file's custom_kernel on `inputs` at each tuning ({constant: value}) with
    every Triton launch compiled for sm_`arch` instead of run. Returns one row per distinct
    compiled kernel: (kernel name, tuning, case index, shared memory bytes, num_warps)."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
    rows, current = [], {}
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        before = len(self.device_caches[0][0])
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)  # compiled, cached, not launched
        if len(self.device_caches[0][0]) > before:  # a new specialisation, not the cache's
            rows.append((self.__name__, dict(current["tuning"]), current["case"], kernel.metadata.shared,
                         kernel.metadata.num_warps))
        return kernel

    driver.set_active(_Target(arch))
    JITFunction.run = compile_only
    try:
        ns = {"__name__": f"aot_{path.parent.name}_{path.stem}"}
        exec(compile(path.read_text(), str(path), "exec"), ns)  # a fresh load: kernel caches of this target
        for tuning in tunings:
            ns.update(tuning)
            current["tuning"] = tuning
            for i, data in enumerate(inputs):
                current["case"] = i
                ns["custom_kernel"](data)
    finally:
        JITFunction.run = launch
    return rows


def compile_in_child(jobs, timeout=900):
    """compile_tunings for each job (path, arch, tunings, inputs) in one fresh interpreter:
    TRITON_INTERPRET (set for the suite on CPU) turns every @triton.jit, Triton's own library
    included, into the interpreter's, which cannot be compiled. inputs: "benchmark" (the task's
    benchmark shapes) or one case dict. One child for all jobs: importing torch and Triton and
    the first compile cost seconds."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    jobs = [dict(path=str(path), arch=arch, tunings=tunings, inputs=inputs) for path, arch, tunings, inputs in jobs]
    r = subprocess.run([sys.executable, __file__], input=json.dumps(jobs), env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return [[tuple(row) for row in rows] for rows in json.loads(r.stdout.strip().splitlines()[-1])]


def _too_big(rows, arch):
    return [f"{name} {tuning} case {case}: {shared:,} B with {warps} warps > {SMEM_LIMIT[arch]:,} B"
            for name, tuning, case, shared, warps in rows if shared > SMEM_LIMIT[arch]]


@pytest.fixture(autouse=True)
def _own_triton_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))  # the child's; never the user's


@pytest.mark.e2e
def test_largest_trimul_tuning_fits_and_a_larger_one_is_caught():
    """Trimul's fused projections stage tl.dot tiles in shared memory: the largest tuning fits
    sm_80 and sm_90, and the check flags the tuning the catalog used to allow, BLOCK_H=128 and
    BLOCK_K=64 with 8 warps, which needs more than an H100 has."""
    path = KERNELS_DIR / "trimul" / "fused_projections.py"
    tune = tunables(path.read_text())
    largest = {name: max(allowed) for name, (_, allowed) in tune.items()}
    old = {"BLOCK_M": 64, "BLOCK_H": 128, "BLOCK_K": 64, "NUM_WARPS": 8}
    case = get_task("trimul").BENCHMARK_CASES[-1]
    at80, at90 = compile_in_child([(path, 80, [largest], case), (path, 90, [largest, old], case)])
    at90, beyond = at90[:2], at90[2:]  # the old tuning recompiles only the projection
    for rows, arch in ((at80, 80), (at90, 90)):
        assert [r[0] for r in rows] == ["_ln_proj_kernel", "_ln_gate_out_kernel"]
        assert not _too_big(rows, arch)
    assert [r[0] for r in beyond] == ["_ln_proj_kernel"]
    assert re.match(r"_ln_proj_kernel .* > 232,448 B", "\n".join(_too_big(beyond, 90)))


@pytest.mark.skipif(not os.environ.get("GPU_FORECASTERS_AOT_SWEEP"),
                    reason="every tuning of every kernel takes many minutes on two cores: GPU_FORECASTERS_AOT_SWEEP=1 runs it")
@pytest.mark.parametrize("path", TRITON_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_tuning_combination_fits_shared_memory(path):
    tune = tunables(path.read_text())
    names = sorted(tune)
    combos = [dict(zip(names, values)) for values in itertools.product(*(tune[n][1] for n in names))]
    results = compile_in_child([(path, arch, combos, "benchmark") for arch in sorted(SMEM_LIMIT)], timeout=7200)
    for arch, rows in zip(sorted(SMEM_LIMIT), results):
        print(f"{path.parent.name}/{path.stem} sm_{arch}: {len(combos)} tunings, {len(rows)} kernels compiled, "
              f"largest shared memory {max(r[3] for r in rows):,} B")
        assert not _too_big(rows, arch)


if __name__ == "__main__":
    out = []
    for job in json.loads(sys.stdin.read()):
        path = Path(job["path"])
        task = path.parent.name
        inputs = meta_inputs(task, get_task(task).BENCHMARK_CASES if job["inputs"] == "benchmark" else [job["inputs"]])
        out.append(compile_tunings(path, job["arch"], job["tunings"], inputs))
    print(json.dumps(out))
