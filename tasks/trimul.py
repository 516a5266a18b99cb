"""trimul: AlphaFold3's outgoing triangle multiplicative update (GPU MODE's "trimul" problem).

One of the paper's six GPU MODE problems, and one of the two its PUCT search ran on. For a pair
representation x [bs, N, N, dim], the update is
    z = LayerNorm(x)
    left  = (z @ W_left)  * mask * sigmoid(z @ W_left_gate)       [bs, N, N, hidden]
    right = (z @ W_right) * mask * sigmoid(z @ W_right_gate)
    out[b, i, j, d] = sum_k left[b, i, k, d] * right[b, j, k, d]  (the triangle einsum)
    y = (LayerNorm(out) * sigmoid(z @ W_out_gate)) @ W_out         [bs, N, N, dim]
a mix of five projections (compute bound), one N^3 * hidden contraction per batch, and two
layer norms: unlike cross_entropy, fusing and tensor-core use matter more than bandwidth.

The weights are part of the input, drawn from the seed like x, so a kernel cannot specialise on
them. `data = (x, mask, weights, config)` with `weights` a dict of fp32 tensors named as in the
GPU MODE reference and `config = {"dim", "hidden_dim"}`. Heavy-tailed (Cauchy) inputs and random
0/1 masks (int64, as in GPU MODE) are among the benchmark cases; the reference runs with TF32 off.
"""
import contextlib
import math

import torch
import torch.nn.functional as F

from tasks._check import compare_outputs

NAME = "trimul"

RTOL, ATOL = 2e-2, 2e-2
# Output dtypes accepted besides float32: GPU MODE's trimul checker casts the output to fp32
# before comparing (`verbose_allclose` in gpu-mode/reference-kernels), and its leaderboard's
# accepted submissions return fp16 (areseni_ivanov's, docs/MEASUREMENT.md's table of public
# submissions). Every other task's output dtype is exact.
ALLOWED_OUTPUT_DTYPES = ("float16", "bfloat16")

WEIGHT_NAMES = (
    "norm.weight", "norm.bias",
    "left_proj.weight", "right_proj.weight",
    "left_gate.weight", "right_gate.weight", "out_gate.weight",
    "to_out_norm.weight", "to_out_norm.bias", "to_out.weight",
)

DESCRIPTION = """\
AlphaFold3 outgoing triangle multiplicative update ("TriMul"), forward pass only, fp32.

Contract: write a Python module that defines `custom_kernel(data)` (Triton preferred; torch,
triton, triton.language and math may be imported). `data = (x, mask, weights, config)`, already
on the GPU:
  - x:      [bs, N, N, dim] torch.float32 (standard normal, or heavy-tailed Cauchy 2*tan(pi*(u-0.5)))
  - mask:   [bs, N, N] of 0/1 values: torch.float32 ones in the "nomask" cases, torch.int64
            otherwise (as GPU MODE generates it)
  - weights: dict of torch.float32 tensors (torch.nn.Linear layout, out_features x in_features, no biases):
      "norm.weight" [dim], "norm.bias" [dim]                      input LayerNorm (eps 1e-5)
      "left_proj.weight", "right_proj.weight" [hidden, dim]
      "left_gate.weight", "right_gate.weight", "out_gate.weight" [hidden, dim]
      "to_out_norm.weight" [hidden], "to_out_norm.bias" [hidden]  LayerNorm over hidden (eps 1e-5)
      "to_out.weight" [dim, hidden]
  - config: {"dim": dim, "hidden_dim": hidden}   (hidden = 128 in every test)
Computation (torch notation):
    z = layer_norm(x, [dim], norm.weight, norm.bias)
    left  = (z @ left_proj.weight.T)  * mask[..., None] * sigmoid(z @ left_gate.weight.T)
    right = (z @ right_proj.weight.T) * mask[..., None] * sigmoid(z @ right_gate.weight.T)
    out = einsum('bikd,bjkd->bijd', left, right)           # [bs, N, N, hidden]
    out = layer_norm(out, [hidden], to_out_norm.weight, to_out_norm.bias)
    out = out * sigmoid(z @ out_gate.weight.T)
    return out @ to_out.weight.T                           # [bs, N, N, dim] torch.float32
Return one plain, contiguous torch.float32 tensor [bs, N, N, dim] (torch.float16 or torch.bfloat16
are accepted too, as GPU MODE's checker accepts them). Checked with rtol=2e-2, atol=2e-2 against
an fp32 reference with TF32 disabled; lower-precision internals (bf16/fp16 tensor cores for the
projections or the einsum) are allowed if the result stays within tolerance.

Benchmark shapes (N, bs, dim, nomask, distribution): (256,2,128,T,normal), (768,1,128,T,cauchy),
(256,2,384,F,normal), (512,1,128,T,normal), (1024,1,128,T,cauchy), (768,1,384,F,normal),
(1024,1,384,T,normal). The einsum is a batched matmul over the hidden channels
(bs*hidden independent [N, N] @ [N, N]^T products); the projections read x once if fused."""


def _case(N, bs, dim, nomask, distribution, hidden_dim=128):
    return {"N": N, "bs": bs, "dim": dim, "hidden_dim": hidden_dim, "nomask": nomask,
            "distribution": distribution}


BENCHMARK_CASES = [
    _case(256, 2, 128, True, "normal"),
    _case(768, 1, 128, True, "cauchy"),
    _case(256, 2, 384, False, "normal"),
    _case(512, 1, 128, True, "normal"),
    _case(1024, 1, 128, True, "cauchy"),
    _case(768, 1, 384, False, "normal"),
    _case(1024, 1, 384, True, "normal"),
]

# GPU MODE's 18 test cases (its task.yml `tests`), checked on a GPU; the benchmark cases above
# are its `benchmarks`. No shape outside the problem's own set: a kernel whose blocks follow N
# is judged only on the shapes it was promised.
CHECK_CASES = [
    _case(32, 1, 128, True, "normal"), _case(32, 1, 128, False, "normal"),
    _case(64, 2, 256, True, "normal"), _case(64, 2, 256, False, "normal"),
    _case(128, 1, 768, True, "normal"),
    _case(256, 1, 128, True, "normal"), _case(256, 1, 128, False, "normal"),
    _case(768, 2, 128, True, "normal"),
    _case(1024, 1, 384, False, "normal"),
    _case(1024, 1, 768, True, "normal"), _case(1024, 1, 768, False, "normal"),
    _case(32, 1, 128, True, "cauchy"),
    _case(64, 2, 256, True, "cauchy"),
    _case(128, 1, 768, True, "cauchy"),
    _case(256, 1, 128, True, "cauchy"),
    _case(768, 2, 128, True, "cauchy"),
    _case(1024, 1, 384, False, "cauchy"),
    _case(1024, 1, 768, False, "cauchy"),
]

# On CPU, the smallest of those test cases (N=32, bs=1, dim=128): an interpreted Triton kernel
# takes a few seconds a call there, so one is timed and the other two are checked.
CPU_CASES = [_case(32, 1, 128, True, "normal")]
CPU_CHECK_CASES = [_case(32, 1, 128, False, "normal"), _case(32, 1, 128, True, "cauchy")]


def generate_input(case, seed, device="cpu"):
    """(x, mask, weights, config), every tensor drawn from one generator seeded with `seed`."""
    N, bs, dim = int(case["N"]), int(case["bs"]), int(case["dim"])
    hidden = int(case.get("hidden_dim", 128))
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen, dtype=torch.float32)

    if case["distribution"] == "cauchy":
        # Cauchy(0, 2) by inverse CDF. u in [0, 1) and fp32 pi/2 is not exactly pi/2, so tan
        # stays finite (|x| up to ~1e7): heavy tails, never inf.
        u = torch.rand(bs, N, N, dim, device=device, generator=gen, dtype=torch.float32)
        x = 2.0 * torch.tan(math.pi * (u - 0.5))
    elif case["distribution"] == "normal":
        x = randn(bs, N, N, dim)
    else:
        raise ValueError(f"unknown distribution {case['distribution']!r}; use 'normal' or 'cauchy'")
    # The mask's dtype as GPU MODE generates it: float32 ones, or int64 draws of 0 and 1.
    if case["nomask"]:
        mask = torch.ones(bs, N, N, device=device, dtype=torch.float32)
    else:
        mask = torch.randint(0, 2, (bs, N, N), device=device, generator=gen)

    # Scales as in the GPU MODE problem: projections by 1/sqrt(fan_out), LayerNorm affine ~ randn.
    weights = {
        "norm.weight": randn(dim),
        "norm.bias": randn(dim),
        "left_proj.weight": randn(hidden, dim) / math.sqrt(hidden),
        "right_proj.weight": randn(hidden, dim) / math.sqrt(hidden),
        "left_gate.weight": randn(hidden, dim) / math.sqrt(hidden),
        "right_gate.weight": randn(hidden, dim) / math.sqrt(hidden),
        "out_gate.weight": randn(hidden, dim) / math.sqrt(hidden),
        "to_out_norm.weight": randn(hidden),
        "to_out_norm.bias": randn(hidden),
        "to_out.weight": randn(dim, hidden) / math.sqrt(dim),
    }
    config = {"dim": dim, "hidden_dim": hidden}
    return x, mask, weights, config


@contextlib.contextmanager
def _full_fp32_matmuls():
    """TF32 off for the reference (a silent precision downgrade must not become the yardstick)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def reference(data):
    """The update in fp32, [bs, N, N, dim]."""
    x, mask, w, config = data
    dim, hidden = config["dim"], config["hidden_dim"]
    with _full_fp32_matmuls():
        z = F.layer_norm(x, (dim,), w["norm.weight"], w["norm.bias"])
        m = mask.unsqueeze(-1)
        left = F.linear(z, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(z, w["left_gate.weight"]))
        right = F.linear(z, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(z, w["right_gate.weight"]))
        out = torch.einsum("...ikd,...jkd->...ijd", left, right)
        del left, right
        out = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"])
        out = out * torch.sigmoid(F.linear(z, w["out_gate.weight"]))
        return F.linear(out, w["to_out.weight"]).contiguous()


def check(output, expected):
    return compare_outputs(output, expected, RTOL, ATOL, names=["output"], allowed_dtypes=ALLOWED_OUTPUT_DTYPES)


def min_bytes(case):
    """Read x and the mask once and write the output once (fp32), plus the weights."""
    N, bs, dim = int(case["N"]), int(case["bs"]), int(case["dim"])
    hidden = int(case.get("hidden_dim", 128))
    weight_elems = 2 * dim + 5 * hidden * dim + 2 * hidden + dim * hidden
    return 4 * (bs * N * N * (2 * dim + 1) + weight_elems)
