"""Tests for the fp8_quant and Gated DeltaNet task modules, their seeds and the Triton variant.

The GDN references are validated against an independent token-by-token recurrence of the gated
delta rule, so a wrong chunked formula cannot pass just by agreeing with its own seed.
"""
import importlib.util
import re

import pytest
import torch

from tasks import _gdn, get_task, seed_path, variant_paths

TASKS = ("fp8_quant", "gdn_chunk_fwd_h", "gdn_chunk_fwd_o", "gdn_recompute_w_u")
GDN = ("gdn_chunk_fwd_h", "gdn_chunk_fwd_o", "gdn_recompute_w_u")
CONTRACT = ("NAME", "DESCRIPTION", "BENCHMARK_CASES", "CHECK_CASES", "CPU_CASES", "CPU_CHECK_CASES",
            "generate_input", "reference", "check", "min_bytes")


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected_shapes(name, case):
    if name == "fp8_quant":
        return [((case["T"], case["H"]), torch.float32), ((case["T"], case["H"] // 128), torch.float32)]
    B, T, H, K, V = (case[key] for key in ("B", "T", "H", "K", "V"))
    return {
        "gdn_chunk_fwd_h": [((B, T // 64, H, K, V), torch.float32), ((B, T, H, V), torch.float32)],
        "gdn_chunk_fwd_o": [((B, T, H, V), torch.float32)],
        "gdn_recompute_w_u": [((B, T, H, K), torch.float32), ((B, T, H, V), torch.float32)],
    }[name]


@pytest.mark.parametrize("name", TASKS)
def test_contract_names_and_cases(name):
    task = get_task(name)
    for attr in CONTRACT:
        assert hasattr(task, attr), f"{name} lacks {attr}"
    assert task.NAME == name
    for cases in (task.BENCHMARK_CASES, task.CHECK_CASES, task.CPU_CASES, task.CPU_CHECK_CASES):
        assert cases and all(isinstance(case, dict) for case in cases)


def test_benchmark_shapes_are_the_papers():
    assert [(c["T"], c["H"]) for c in get_task("fp8_quant").BENCHMARK_CASES] == [
        (256, 4096), (256, 8192), (4096, 7168)]
    for name in GDN:
        shapes = [tuple(c[k] for k in "BTHKV") for c in get_task(name).BENCHMARK_CASES]
        assert shapes == [(1, 64, 1, 64, 64), (2, 512, 3, 64, 64), (2, 1024, 3, 64, 64)]


@pytest.mark.parametrize("name", TASKS)
def test_reference_dtypes_and_shapes(name):
    task = get_task(name)
    for case in task.CPU_CASES + task.CPU_CHECK_CASES:
        out = _as_tuple(task.reference(task.generate_input(case, seed=0)))
        assert [(tuple(t.shape), t.dtype) for t in out] == _expected_shapes(name, case)
        assert all(bool(torch.isfinite(t).all()) for t in out)


@pytest.mark.parametrize("name", TASKS)
def test_inputs_deterministic_seed_dependent_and_nonzero(name):
    task = get_task(name)
    case = task.CPU_CHECK_CASES[0]
    a, b, c = (task.generate_input(case, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(not torch.equal(x, y) for x, y in zip(a, c))
    for t in a:
        assert t.dtype == torch.float32 and t.is_contiguous()
        assert bool(torch.isfinite(t).all()) and int((t != 0).sum()) > t.numel() // 2


@pytest.mark.parametrize("name", TASKS)
def test_min_bytes_is_inputs_plus_outputs(name):
    task = get_task(name)
    for case in task.CPU_CASES + task.CPU_CHECK_CASES:
        data = task.generate_input(case, seed=0)
        out = _as_tuple(task.reference(data))
        assert task.min_bytes(case) == sum(t.numel() * t.element_size() for t in (*data, *out))


@pytest.mark.parametrize("name", TASKS)
def test_check_accepts_reference_and_rejects_wrong_outputs(name):
    task = get_task(name)
    expected = task.reference(task.generate_input(task.CPU_CHECK_CASES[0], seed=1))
    exp = _as_tuple(expected)
    ok, message = task.check(tuple(t.clone() for t in exp) if len(exp) > 1 else exp[0].clone(), expected)
    assert ok, message

    def with_last(t):  # replace the last output tensor
        out = [x.clone() for x in exp]
        out[-1] = t
        return tuple(out) if len(out) > 1 else out[0]

    last = exp[-1]
    # Exact dtypes: these tasks' contracts name float32, and none names another (only trimul does)
    ok, message = task.check(with_last(last.double()), expected)
    assert not ok and "dtype" in message
    assert not task.check(with_last(last[:-1].clone()), expected)[0]
    poisoned = last.clone()
    poisoned.view(-1)[poisoned.numel() // 2] = float("nan")
    assert not task.check(with_last(poisoned), expected)[0]
    perturbed = last.clone()
    flat = perturbed.view(-1)
    flat[7] += 0.01 * flat[7].abs() + 1e-2  # 1% off: beyond rtol 1e-3 for every output here
    ok, message = task.check(with_last(perturbed), expected)
    assert not ok and "1 of" in message
    if len(exp) > 1:  # the first output is checked too
        first = exp[0].clone()
        first.view(-1)[3] += 1.0
        assert not task.check((first, *exp[1:]), expected)[0]
        assert not task.check(exp[:1], expected)[0]


@pytest.mark.parametrize("name", TASKS)
def test_seed_passes_cpu_cases(name):
    task = get_task(name)
    seed = _load(seed_path(name), f"seed_{name}")
    assert "from tasks" not in seed_path(name).read_text() and "import tasks" not in seed_path(name).read_text()
    for case in task.CPU_CASES + task.CPU_CHECK_CASES:
        data = task.generate_input(case, seed=5)
        ok, message = task.check(seed.custom_kernel(tuple(t.clone() for t in data)), task.reference(data))
        assert ok, f"{case}: {message}"


def _naive_gated_delta_rule(q, k, v, beta, log_decay, state):
    """Token by token: S = a (I - b k k^T) S + b k v^T, o = scale S^T q; states before each chunk."""
    B, T, H, K = q.shape
    out, starts = torch.empty(B, T, H, v.shape[-1], dtype=q.dtype), []
    for t in range(T):
        if t % 64 == 0:
            starts.append(state.clone())
        kt = k[:, t]
        state = state * torch.exp(log_decay[:, t])[..., None, None]
        error = v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, state)
        state = state + beta[:, t][..., None, None] * kt[..., :, None] * error[..., None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], state) * K ** -0.5
    return out, torch.stack(starts, dim=1)


@pytest.mark.parametrize("gate", ["logsigmoid", "slow"])
def test_chunked_references_match_token_recurrence(gate):
    case = {"B": 2, "T": 192, "H": 2, "K": 16, "V": 8, "gate": gate}
    t = {n: x.double() for n, x in _gdn.make_inputs(case, seed=11).items()}
    # the per-token log-decays, recovered from the chunk-local cumulative sum
    g = t["g"].reshape(2, 3, 64, 2)
    log_decay = torch.cat([g[:, :, :1], g[:, :, 1:] - g[:, :, :-1]], dim=2).reshape(2, 192, 2)
    o_naive, h_naive = _naive_gated_delta_rule(t["q"], t["k"], t["v"], t["beta"], log_decay,
                                               t["initial_state"])
    w, u = get_task("gdn_recompute_w_u").reference((t["k"], t["v"], t["beta"], t["A"], t["g"]))
    h, v_new = get_task("gdn_chunk_fwd_h").reference((t["k"], w, u, t["g"], t["initial_state"]))
    o = get_task("gdn_chunk_fwd_o").reference((t["q"], t["k"], v_new, h, t["g"]))
    # A was rounded to fp32 in make_inputs, hence 1e-5 and not fp64 agreement
    torch.testing.assert_close(h, h_naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o, o_naive, rtol=1e-5, atol=1e-5)
    assert float(o_naive.abs().max()) > 0.5


def test_gdn_task_inputs_are_one_consistent_pipeline():
    case = get_task("gdn_chunk_fwd_h").CPU_CHECK_CASES[0]
    k, v, beta, A, g = get_task("gdn_recompute_w_u").generate_input(case, seed=2)
    _, w, u, _, h0 = get_task("gdn_chunk_fwd_h").generate_input(case, seed=2)
    _, _, v_new, h, _ = get_task("gdn_chunk_fwd_o").generate_input(case, seed=2)
    w32, u32 = get_task("gdn_recompute_w_u").reference((k, v, beta, A, g))
    torch.testing.assert_close((w32, u32), (w, u), rtol=1e-4, atol=1e-5)
    h32, v_new32 = get_task("gdn_chunk_fwd_h").reference((k, w, u, g, h0))
    torch.testing.assert_close((h32, v_new32), (h, v_new), rtol=1e-4, atol=1e-5)


def test_check_cases_catch_a_kernel_that_drops_the_state():
    fwd_o, fwd_h = get_task("gdn_chunk_fwd_o"), get_task("gdn_chunk_fwd_h")
    for case in fwd_o.BENCHMARK_CASES[:1] + fwd_o.CPU_CHECK_CASES:
        q, k, v_new, h, g = fwd_o.generate_input(case, seed=0)
        ok, _ = fwd_o.check(fwd_o.reference((q, k, v_new, torch.zeros_like(h), g)),
                            fwd_o.reference((q, k, v_new, h, g)))
        assert not ok, case
    for case in fwd_h.CPU_CHECK_CASES:
        k, w, u, g, h0 = fwd_h.generate_input(case, seed=0)
        no_decay = torch.zeros_like(g)  # forgets the gate: the state never decays
        ok, _ = fwd_h.check(fwd_h.reference((k, w, u, no_decay, h0)), fwd_h.reference((k, w, u, g, h0)))
        assert not ok, case


def test_gdn_rejects_t_not_a_multiple_of_the_chunk():
    with pytest.raises(ValueError, match="multiple"):
        get_task("gdn_chunk_fwd_h").generate_input({"B": 1, "T": 100, "H": 1, "K": 8, "V": 8}, seed=0)


def test_fp8_reference_semantics_and_clamp():
    task = get_task("fp8_quant")
    x = torch.zeros(2, 256)
    x[0, :128] = torch.linspace(-3.0, 1.5, 128)
    x[0, 128:] = 1e-12      # under the 1e-10 floor on the absmax
    x[1] = 2.0
    x_q, scales = task.reference((x,))
    assert torch.allclose(scales, torch.tensor([[3 / 448, 1e-10 / 448], [2 / 448, 2 / 448]]))
    assert float(x_q[0, 0]) == pytest.approx(-448.0) and float(x_q[0, 127]) == pytest.approx(224.0)
    assert torch.allclose(x_q[0, 128:], torch.full((128,), 4.48))
    assert torch.allclose(x_q[1], torch.full((256,), 448.0))
    # a kernel without the floor blows tiny groups up to +-448, and the mixed case has such groups
    case = task.CPU_CHECK_CASES[0]
    (x,) = task.generate_input(case, seed=0)
    groups = x.reshape(x.shape[0], -1, 128)
    scale = groups.abs().amax(-1) / 448
    unclamped = ((groups / scale[..., None]).reshape(x.shape), scale)
    assert not task.check(unclamped, task.reference((x,)))[0]


def test_fp8_scales_checked_relatively():
    task = get_task("fp8_quant")
    x_q, scales = task.reference(task.generate_input(task.CPU_CASES[0], seed=0))
    assert task.check((x_q, scales * (1 + 3e-4)), (x_q, scales))[0]
    assert not task.check((x_q, scales * 1.05), (x_q, scales))[0]  # well inside atol 1e-3


def test_fp8_rejects_bad_case():
    with pytest.raises(ValueError, match="multiple of 128"):
        get_task("fp8_quant").generate_input({"T": 4, "H": 100}, seed=0)


def test_tunable_constants_are_annotated():
    pattern = re.compile(r"^([A-Z_][A-Z0-9_]*) = (\d+)  # tune: ([\d, ]+)$", re.M)
    for path in variant_paths("fp8_quant"):
        found = pattern.findall(path.read_text())
        assert found, path
        for _, value, allowed in found:
            assert int(value) in [int(a) for a in allowed.split(",")]


def test_triton_fp8_variant_passes_in_interpreter():
    task = get_task("fp8_quant")
    paths = {p.stem: p for p in variant_paths("fp8_quant")}
    assert "triton_rowgroup" in paths
    source = paths["triton_rowgroup"].read_text()
    kernel = _load(paths["triton_rowgroup"], "fp8_triton_rowgroup")
    for case in task.CPU_CASES + task.CPU_CHECK_CASES:
        data = task.generate_input(case, seed=9)
        ok, message = task.check(kernel.custom_kernel(data), task.reference(data))
        assert ok, f"{case}: {message}"
    # another tuning value: BLOCK_G = 64 leaves a ragged last block on 185 groups
    assert "BLOCK_G = 16  # tune:" in source
    kernel.BLOCK_G = 64  # custom_kernel reads the module constant at call time
    data = task.generate_input(task.CPU_CHECK_CASES[0], seed=10)
    ok, message = task.check(kernel.custom_kernel(data), task.reference(data))
    assert ok, message
