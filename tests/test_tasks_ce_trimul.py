"""The cross_entropy and trimul tasks: inputs, references, checkers, seed kernels and variants.

Without a GPU the Triton variants run in the interpreter (conftest sets TRITON_INTERPRET) on the
small CPU cases; with one, the same tests run compiled on CUDA tensors.
"""
import json
import re
from pathlib import Path

import pytest
import torch

from tasks import KERNELS_DIR, get_task, seed_source, variant_paths

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TASKS = ("cross_entropy", "trimul")
TUNE_LINE = re.compile(r"^([A-Z_][A-Z0-9_]*)\s*=\s*(\d+)\s*#\s*tune:\s*(.+)$")


def load_kernel(path):
    """Run a kernel file in a fresh namespace, as the harness would; compile with the real path
    so triton.jit can read the source back."""
    path = Path(path)
    ns = {"__name__": f"kernel_{path.parent.name}_{path.stem}"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


def cases_of(task, *lists):
    return [case for name in lists for case in getattr(task, name)]


def perturb_one(t, index, amount):
    """A copy of t with one element moved by `amount` (computed in fp32, stored in t's dtype)."""
    t = t.clone()
    flat = t.view(-1)
    flat[index] = (flat[index].float() + amount).to(t.dtype)
    return t


# ---------------------------------------------------------------- contract and inputs

@pytest.mark.parametrize("name", TASKS)
def test_module_exposes_the_contract(name):
    task = get_task(name)
    assert task.NAME == name
    assert "custom_kernel(data)" in task.DESCRIPTION and "rtol" in task.DESCRIPTION
    for lst in ("BENCHMARK_CASES", "CHECK_CASES", "CPU_CASES", "CPU_CHECK_CASES"):
        cases = getattr(task, lst)
        assert cases and all(isinstance(c, dict) for c in cases), lst
        assert json.loads(json.dumps(cases)) == cases, lst  # cases travel as JSON
    assert "seed" not in {p.stem for p in variant_paths(name)}
    assert "def custom_kernel" in seed_source(name)


def test_benchmark_cases_match_the_paper():
    ce = get_task("cross_entropy")
    assert [(c["B"], c["V"]) for c in ce.BENCHMARK_CASES] == [(4096, 32000), (4096, 50264), (4096, 128256)]
    tm = get_task("trimul")
    got = [(c["N"], c["bs"], c["dim"], c["nomask"], c["distribution"]) for c in tm.BENCHMARK_CASES]
    assert got == [(256, 2, 128, True, "normal"), (768, 1, 128, True, "cauchy"),
                   (256, 2, 384, False, "normal"), (512, 1, 128, True, "normal"),
                   (1024, 1, 128, True, "cauchy"), (768, 1, 384, False, "normal"),
                   (1024, 1, 384, True, "normal")]
    assert all(c["hidden_dim"] == 128 for c in tm.BENCHMARK_CASES)
    # correctness must see heavy-magnitude logits
    assert any(c.get("scale", 1) >= 8 for c in ce.CHECK_CASES + ce.CPU_CHECK_CASES)
    assert any(abs(c.get("shift", 0)) >= 100 for c in ce.CHECK_CASES + ce.CPU_CHECK_CASES)


def _tensors(data):
    out = []
    for item in data:
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, dict):
            out.extend(v for v in item.values() if isinstance(v, torch.Tensor))
    return out


@pytest.mark.parametrize("name", TASKS)
def test_generate_input_is_deterministic_seeded_and_nonzero(name):
    task = get_task(name)
    case = task.CPU_CASES[-1]
    a, b, c = (_tensors(task.generate_input(case, s, DEVICE)) for s in (7, 7, 8))
    assert len(a) == len(b) == len(c) >= 3
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert any(not torch.equal(x, z) for x, z in zip(a, c))
    # every floating tensor, weights included, carries signal (a mask of ones is fine)
    for x in a:
        assert x.device.type == DEVICE
        if x.is_floating_point():
            assert torch.isfinite(x).all() and x.float().abs().sum() > 0


def test_cross_entropy_inputs():
    task = get_task("cross_entropy")
    logits, targets, g = task.generate_input({"B": 16, "V": 1500, "scale": 30.0, "shift": 5.0}, 0, DEVICE)
    assert logits.dtype == torch.bfloat16 and tuple(logits.shape) == (16, 1500)
    assert targets.dtype == torch.int64 and int(targets.min()) >= 0 and int(targets.max()) < 1500
    assert g.dtype == torch.float32 and tuple(g.shape) == (16,)
    x = logits.float()
    assert 25 < float(x.std()) < 35 and 3 < float(x.mean()) < 7


def test_trimul_inputs():
    task = get_task("trimul")
    case = dict(task.CPU_CHECK_CASES[0], distribution="cauchy")  # masked, heavy-tailed
    assert not case["nomask"]
    x, mask, w, config = task.generate_input(case, 0, DEVICE)
    bs, N, dim = case["bs"], case["N"], case["dim"]
    assert x.dtype == torch.float32 and tuple(x.shape) == (bs, N, N, dim)
    # GPU MODE's masks: int64 draws of 0 and 1 in masked cases, float32 ones otherwise
    assert mask.dtype == torch.int64 and tuple(mask.shape) == (bs, N, N)
    assert set(mask.unique().tolist()) == {0, 1}
    assert float(x.abs().max()) > 100  # heavy tails
    assert config == {"dim": dim, "hidden_dim": 128}
    assert set(w) == set(task.WEIGHT_NAMES)
    assert tuple(w["left_proj.weight"].shape) == (128, dim) and tuple(w["to_out.weight"].shape) == (dim, 128)
    _, mask1, _, _ = task.generate_input(task.CPU_CASES[0], 0, DEVICE)  # nomask
    assert mask1.dtype == torch.float32 and bool((mask1 == 1).all())
    assert float(task.generate_input(task.CPU_CASES[0], 0, DEVICE)[0].abs().max()) < 10  # normal


def test_trimul_cases_are_gpu_modes():
    """Checked on a GPU: exactly GPU MODE's 18 test cases; on CPU: its smallest ones only."""
    task = get_task("trimul")
    shapes = {(c["N"], c["bs"], c["dim"]) for c in task.CHECK_CASES}
    assert len(task.CHECK_CASES) == 18 and shapes == {(32, 1, 128), (64, 2, 256), (128, 1, 768), (256, 1, 128),
                                                      (768, 2, 128), (1024, 1, 384), (1024, 1, 768)}
    for c in task.CPU_CASES + task.CPU_CHECK_CASES:
        assert (c["N"], c["bs"], c["dim"]) == (32, 1, 128)


# ---------------------------------------------------------------- reference and check

def test_reference_outputs_cross_entropy():
    task = get_task("cross_entropy")
    data = task.generate_input({"B": 5, "V": 777}, 3, DEVICE)
    losses, grad = task.reference(data)
    assert losses.dtype == torch.float32 and tuple(losses.shape) == (5,)
    assert grad.dtype == torch.bfloat16 and tuple(grad.shape) == (5, 777)
    logits, targets, g = data
    # independent oracle: autograd through torch's own cross entropy
    x = logits.float().requires_grad_()
    loss = torch.nn.functional.cross_entropy(x, targets, reduction="none")
    (loss * g).sum().backward()
    assert torch.allclose(losses, loss.detach(), rtol=1e-5, atol=1e-5)
    assert torch.allclose(grad.float(), x.grad, rtol=1e-2, atol=1e-3)


def test_reference_outputs_trimul():
    task = get_task("trimul")
    data = task.generate_input(task.CPU_CHECK_CASES[0], 1, DEVICE)
    out = task.reference(data)
    x, mask, w, _ = data
    assert type(out) is torch.Tensor and out.dtype == torch.float32
    assert tuple(out.shape) == tuple(x.shape) and out.is_contiguous() and torch.isfinite(out).all()
    # independent oracle: the einsum written as an explicit sum over k
    z = torch.nn.functional.layer_norm(x, (x.shape[-1],), w["norm.weight"], w["norm.bias"])
    m = mask[..., None]
    left = (z @ w["left_proj.weight"].T) * m * torch.sigmoid(z @ w["left_gate.weight"].T)
    right = (z @ w["right_proj.weight"].T) * m * torch.sigmoid(z @ w["right_gate.weight"].T)
    prod = (left[:, :, None, :, :] * right[:, None, :, :, :]).sum(dim=3)
    o = torch.nn.functional.layer_norm(prod, (128,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    o = (o * torch.sigmoid(z @ w["out_gate.weight"].T)) @ w["to_out.weight"].T
    assert torch.allclose(out, o, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", TASKS)
def test_check_accepts_reference_and_rejects_wrong_outputs(name):
    task = get_task(name)
    data = task.generate_input(task.CPU_CHECK_CASES[0], 0, DEVICE)
    expected = task.reference(data)
    exp = expected if isinstance(expected, tuple) else (expected,)
    wrap = (lambda ts: tuple(ts)) if isinstance(expected, tuple) else (lambda ts: ts[0])
    assert task.check(expected, expected) == (True, "ok")
    assert task.check(wrap([t.clone() for t in exp]), expected)[0]
    for i, t in enumerate(exp):
        def swap(new):
            return wrap([new if j == i else u.clone() for j, u in enumerate(exp)])
        # The reference's dtype, or one the task names because its original's checker accepts it
        # (trimul: fp16 and bf16, cast to fp32 and compared as GPU MODE does)
        ok, msg = task.check(swap(t.to(torch.float64)), expected)
        assert not ok and "dtype" in msg
        for other in getattr(task, "ALLOWED_OUTPUT_DTYPES", ()):
            assert task.check(swap(t.to(getattr(torch, other))), expected) == (True, "ok"), other
        if t.dtype == torch.float32:
            wide = swap(perturb_one(t, t.numel() // 2, 1e4))
            ok, msg = task.check(wide, expected)
            assert not ok and "outside" in msg
        ok, msg = task.check(swap(t.reshape(-1)[:-1].clone()), expected)
        assert not ok and "shape" in msg
        ok, _ = task.check(swap(perturb_one(t, t.numel() // 2, float("nan"))), expected)
        assert not ok
        # one element just outside the tolerance fails; well inside it passes
        k = int(t.float().abs().reshape(-1).argmax())
        tol = task.ATOL + task.RTOL * float(t.reshape(-1)[k].float().abs())
        assert not task.check(swap(perturb_one(t, k, 3 * tol)), expected)[0]
        assert task.check(swap(perturb_one(t, k, 0.3 * tol)), expected)[0]
    assert not task.check(wrap(exp[:-1]) if len(exp) > 1 else (exp[0], exp[0]), expected)[0]


def test_min_bytes():
    ce = get_task("cross_entropy")
    assert ce.min_bytes({"B": 4096, "V": 32000}) == 4 * 4096 * 32000 + 16 * 4096
    tm = get_task("trimul")
    case = tm.CPU_CHECK_CASES[1]
    x, mask, w, _ = tm.generate_input(case, 0)
    io = x.nbytes + mask.nbytes + x.nbytes + sum(t.nbytes for t in w.values())
    assert tm.min_bytes(case) == io
    for task in (ce, tm):
        sizes = [task.min_bytes(c) for c in task.BENCHMARK_CASES]
        assert all(isinstance(s, int) and s > 0 for s in sizes)


# ---------------------------------------------------------------- kernels

@pytest.mark.parametrize("name", TASKS)
def test_seed_kernel_passes(name):
    task = get_task(name)
    kernel = load_kernel(KERNELS_DIR / name / "seed.py")["custom_kernel"]
    for i, case in enumerate(cases_of(task, "CPU_CASES", "CPU_CHECK_CASES")):
        data = task.generate_input(case, 100 + i, DEVICE)
        expected = task.reference(data)
        ok, msg = task.check(kernel(data), expected)
        assert ok, f"{case}: {msg}"


# The interpreter's slowest runs (fused_projections: 16 s on 2 cores) are the e2e tier's: the suite's budget
E2E_VARIANTS = {"fused_projections", "chunked", "multipass"}


def _tiered(stems):
    return [pytest.param(s, marks=pytest.mark.e2e) if s in E2E_VARIANTS else s for s in stems]


def _ce_variants():
    return [p.stem for p in variant_paths("cross_entropy")]


def test_cross_entropy_has_three_triton_variants():
    names = set(_ce_variants())
    assert {"fused_online", "chunked", "multipass"} <= names
    for stem in ("fused_online", "chunked", "multipass"):
        src = (KERNELS_DIR / "cross_entropy" / f"{stem}.py").read_text()
        assert "@triton.jit" in src and "def custom_kernel" in src
    for stem in names:  # every variant (Triton or plain PyTorch) is a candidate module
        assert "def custom_kernel" in (KERNELS_DIR / "cross_entropy" / f"{stem}.py").read_text()


def _check_kernel(task, kernel, cases, seed0):
    for i, case in enumerate(cases):
        data = task.generate_input(case, seed0 + i, DEVICE)
        expected = task.reference(data)
        ok, msg = task.check(kernel(data), expected)
        assert ok, f"{case}: {msg}"


@pytest.mark.slow
@pytest.mark.parametrize("stem", _tiered(_ce_variants()))
def test_cross_entropy_variant_passes(stem):
    task = get_task("cross_entropy")
    ns = load_kernel(KERNELS_DIR / "cross_entropy" / f"{stem}.py")
    _check_kernel(task, ns["custom_kernel"], cases_of(task, "CPU_CASES", "CPU_CHECK_CASES"), 200)


def _tunables(path):
    found = {}
    for line in Path(path).read_text().splitlines():
        m = TUNE_LINE.match(line.strip())
        if m:
            found[m.group(1)] = (int(m.group(2)), [int(v) for v in m.group(3).split(",")])
    return found


@pytest.mark.parametrize("stem", [s for s in _ce_variants()
                                  if "# tune:" in (KERNELS_DIR / "cross_entropy" / f"{s}.py").read_text()])
def test_cross_entropy_variant_passes_at_smallest_tunables(stem):
    """The catalog mutator may pick any allowed value; the smallest ones stress block tails and
    (for chunked) a many-chunk combine."""
    task = get_task("cross_entropy")
    path = KERNELS_DIR / "cross_entropy" / f"{stem}.py"
    ns = load_kernel(path)
    tunables = _tunables(path)
    assert tunables, f"{stem} exposes no '# tune:' constants"
    for const, (_, allowed) in tunables.items():
        ns[const] = min(allowed)
    _check_kernel(task, ns["custom_kernel"], [task.CPU_CHECK_CASES[0], task.CPU_CHECK_CASES[2]], 300)


def test_row_in_registers_fallback_path():
    task = get_task("cross_entropy")
    path = KERNELS_DIR / "cross_entropy" / "row_in_registers.py"
    if not path.exists():
        pytest.skip("variant not present")
    ns = load_kernel(path)
    ns["SINGLE_PASS_MAX_V"] = 512  # force the two-pass branch used for 128k vocabularies
    _check_kernel(task, ns["custom_kernel"], task.CPU_CHECK_CASES, 400)


def _kernel_files():
    return sorted(str(p.relative_to(KERNELS_DIR)) for t in TASKS for p in (KERNELS_DIR / t).glob("*.py"))


@pytest.mark.parametrize("rel", _kernel_files())
def test_tune_constants_hold_allowed_values(rel):
    path = KERNELS_DIR / rel
    src = path.read_text()
    assert "import tasks" not in src and "from tasks" not in src  # kernels are standalone
    for const, (value, allowed) in _tunables(path).items():
        assert value in allowed, f"{rel}: {const} = {value} not in {allowed}"
        assert len(allowed) >= 2 and sorted(allowed) == allowed, f"{rel}: {const} allowed values"


@pytest.mark.slow
@pytest.mark.parametrize("stem", _tiered(p.stem for p in variant_paths("trimul")))
def test_trimul_variant_passes(stem):
    task = get_task("trimul")
    ns = load_kernel(KERNELS_DIR / "trimul" / f"{stem}.py")
    cases = cases_of(task, "CPU_CASES", "CPU_CHECK_CASES")
    inputs = [task.generate_input(case, 500 + i, DEVICE) for i, case in enumerate(cases)]
    # All references first: the interpreter's tl.dot runs on numpy's BLAS threads, and switching
    # back and forth with torch's threads on a small CPU stalls for seconds each time.
    expected = [task.reference(data) for data in inputs]
    outputs = [ns["custom_kernel"](data) for data in inputs]
    for case, out, exp in zip(cases, outputs, expected):
        ok, msg = task.check(out, exp)
        assert ok, f"{case}: {msg}"


def test_trimul_variant_grids_fit_cuda_at_every_benchmark_shape_and_tuning(monkeypatch):
    """The interpreter runs any grid, a GPU does not: record the first launch's grid of the fused
    variant at every benchmark shape and every BLOCK_M/BLOCK_H it may be tuned to (inputs allocated,
    never computed) and check it against CUDA's limits."""
    from triton.runtime import interpreter

    from harness import measure_worker

    class Launched(Exception):
        pass

    grids = []

    def record(self, nx, ny, nz):
        grids.append((nx, ny, nz))
        raise Launched

    monkeypatch.setattr(interpreter.InterpreterBuilder, "set_grid_dim", record)
    task = get_task("trimul")
    path = KERNELS_DIR / "trimul" / "fused_projections.py"
    ns = load_kernel(path)
    tunables = _tunables(path)
    for case in task.BENCHMARK_CASES:
        _, _, weights, config = task.generate_input({**case, "N": 1}, 0)
        bs, N, dim = case["bs"], case["N"], case["dim"]
        data = (torch.empty(bs, N, N, dim), torch.ones(bs, N, N), weights, config)
        for block_m in tunables["BLOCK_M"][1]:
            for block_h in tunables["BLOCK_H"][1]:
                ns["BLOCK_M"], ns["BLOCK_H"] = block_m, block_h
                with pytest.raises(Launched):
                    ns["custom_kernel"](data)
    assert len(grids) == len(task.BENCHMARK_CASES) * len(tunables["BLOCK_M"][1]) * len(tunables["BLOCK_H"][1])
    too_big = [g for g in grids if any(n > limit for n, limit in zip(g, measure_worker.CUDA_GRID_LIMITS))]
    assert not too_big, f"grids a GPU refuses: {too_big[:3]}"


@pytest.mark.gpu
def test_trimul_fused_variant_launches_on_a_gpu_at_every_benchmark_shape_and_tuning():
    """What the interpreter's grid check stands in for: the real launch, every BLOCK_M/BLOCK_H,
    one call each, with every other `# tune:` constant at its largest (the most shared memory;
    tests/test_aot_compile.py checks every combination against the limit without a GPU)."""
    task = get_task("trimul")
    path = KERNELS_DIR / "trimul" / "fused_projections.py"
    ns = load_kernel(path)
    tunables = _tunables(path)
    ns.update({name: max(allowed) for name, (_, allowed) in tunables.items()})
    for case in task.BENCHMARK_CASES:
        data = task.generate_input(case, 0, device="cuda")
        expected = task.reference(data)
        for block_m in tunables["BLOCK_M"][1]:
            for block_h in tunables["BLOCK_H"][1]:
                ns["BLOCK_M"], ns["BLOCK_H"] = block_m, block_h
                ok, msg = task.check(ns["custom_kernel"](data), expected)
                assert ok, f"{case} BLOCK_M={block_m} BLOCK_H={block_h}: {msg}"
        del data, expected
        torch.cuda.empty_cache()
