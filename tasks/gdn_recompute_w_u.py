"""GPU MODE task `gated_deltanet_recompute_w_u`: the WY-form projection of Gated DeltaNet.

One of the paper's three Gated DeltaNet tasks (docs/PAPER.md §8). Per chunk of 64 tokens it applies
the chunk's precomputed matrix A (the inverse of the delta rule's unit-lower-triangular system) to
the beta-scaled values and to the beta- and decay-scaled keys: two small batched matmuls, so a
candidate's speedup comes from fusing the scaling into the matmul and reading A once. The math and
the input pipeline live in tasks/_gdn.py; the seed kernel is tasks/kernels/gdn_recompute_w_u/seed.py.
"""
from tasks import _gdn
from tasks._check import compare_outputs

NAME = "gdn_recompute_w_u"

DESCRIPTION = """\
Gated DeltaNet recompute_w_u (chunk size 64, all tensors float32).

Contract: write a Python module that defines `custom_kernel(data)` (Triton preferred; torch,
triton, triton.language and math may be imported). Every output element must be written
(fresh output buffers are not pre-zeroed).
`data = (k, v, beta, A, g)`, already on the GPU and contiguous:
  k    [B, T, H, K]  L2-normalised keys
  v    [B, T, H, V]  values
  beta [B, T, H]     write strengths in (0, 1)
  A    [B, T, H, 64] per-chunk 64x64 matrix: row t of A holds row (t % 64) of chunk t // 64's matrix
  g    [B, T, H]     chunk-local cumulative sum of negative log-decays (restarts every 64 tokens)
T is a multiple of 64; chunk c covers tokens 64c .. 64c+63. For every (b, chunk, h), with A_c the
64x64 matrix and k_c, v_c, beta_c, g_c the chunk's 64 rows:
  u_c = A_c @ (v_c * beta_c[:, None])
  w_c = A_c @ (k_c * (beta_c * exp(g_c))[:, None])
Output: a tuple (w [B, T, H, K], u [B, T, H, V]), float32, same token-major layout.
Checked with rtol = atol = 1e-3 against an fp32 reference computed without TF32.
Benchmark shapes (B, T, H, K, V): (1, 64, 1, 64, 64), (2, 512, 3, 64, 64), (2, 1024, 3, 64, 64)."""

BENCHMARK_CASES = [
    {"B": 1, "T": 64, "H": 1, "K": 64, "V": 64},
    {"B": 2, "T": 512, "H": 3, "K": 64, "V": 64},
    {"B": 2, "T": 1024, "H": 3, "K": 64, "V": 64},
]
# GPU MODE's test shapes, exactly; on CPU, smaller shapes of our own (labelled CPU-only in every
# verdict), one with the slow-decay gate, under which the state carried between chunks is large.
CHECK_CASES = [
    {"B": 1, "T": 64, "H": 2, "K": 64, "V": 64},
    {"B": 2, "T": 128, "H": 4, "K": 64, "V": 64},
    {"B": 1, "T": 256, "H": 4, "K": 64, "V": 128},
]
CPU_CASES = [{"B": 1, "T": 128, "H": 2, "K": 32, "V": 32, "cpu_only": True}]
CPU_CHECK_CASES = [{"B": 2, "T": 128, "H": 1, "K": 48, "V": 40, "gate": "slow", "cpu_only": True}]


def generate_input(case, seed, device="cpu"):
    t = _gdn.make_inputs(case, seed, device)
    return t["k"], t["v"], t["beta"], t["A"], t["g"]


def reference(data):
    k, v, beta, A, g = data
    return _gdn.recompute_w_u(k, v, beta, A, g)


def check(output, expected):
    return compare_outputs(output, expected, rtol=_gdn.RTOL, atol=_gdn.ATOL, names=["w", "u"])


def min_bytes(case):
    """fp32 reads of k, v, beta, A, g and writes of w, u."""
    B, T, H, K, V = (case[key] for key in ("B", "T", "H", "K", "V"))
    tokens = B * T * H
    return 4 * tokens * (K + V + 1 + _gdn.CHUNK + 1) + 4 * tokens * (K + V)
