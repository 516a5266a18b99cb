"""GPU MODE task `gated_deltanet_chunk_fwd_o`: the output of the chunked Gated DeltaNet.

One of the paper's three Gated DeltaNet tasks (docs/PAPER.md §8). Every chunk is independent here:
the output is the inter-chunk term (the query read against the state h left by earlier chunks)
plus a causal, decay-weighted attention inside the chunk, so a candidate wins by fusing the three
matmuls, the decay and the causal mask into one pass over each chunk. The math and the input
pipeline live in tasks/_gdn.py; the seed kernel is tasks/kernels/gdn_chunk_fwd_o/seed.py.
"""
from tasks import _gdn
from tasks._check import compare_outputs

NAME = "gdn_chunk_fwd_o"

DESCRIPTION = """\
Gated DeltaNet chunk_fwd_o, the output computation (chunk size 64, all tensors float32).

Contract: write a Python module that defines `custom_kernel(data)` (Triton preferred; torch,
triton, triton.language and math may be imported). Every output element must be written
(fresh output buffers are not pre-zeroed).
`data = (q, k, v_new, h, g)`, already on the GPU and contiguous:
  q     [B, T, H, K]      queries
  k     [B, T, H, K]      L2-normalised keys
  v_new [B, T, H, V]      corrected values (output of chunk_fwd_h)
  h     [B, NT, H, K, V]  state before each chunk (output of chunk_fwd_h; h[:, 0] is nonzero)
  g     [B, T, H]         chunk-local cumulative sum of negative log-decays (restarts every 64)
T is a multiple of 64, NT = T // 64; chunk c covers tokens 64c .. 64c+63. scale = K ** -0.5.
For every (b, chunk c, h), with q_c, k_c, v_c, g_c the chunk's 64 rows and i, j in 0..63:
  inter = (q_c @ h[b, c, h]) * exp(g_c)[:, None]
  P[i, j] = (q_c[i] . k_c[j]) * exp(g_c[i] - g_c[j])  for j <= i (diagonal included), else 0
  o_c = scale * (inter + P @ v_c)
Output: o [B, T, H, V], float32 (a single tensor).
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
    return t["q"], t["k"], t["v_new"], t["h"], t["g"]


def reference(data):
    q, k, v_new, h, g = data
    return _gdn.chunk_fwd_o(q, k, v_new, h, g, scale=q.shape[-1] ** -0.5)


def check(output, expected):
    return compare_outputs(output, expected, rtol=_gdn.RTOL, atol=_gdn.ATOL, names=["o"])


def min_bytes(case):
    """fp32 reads of q, k, v_new, h, g and the write of o."""
    B, T, H, K, V = (case[key] for key in ("B", "T", "H", "K", "V"))
    tokens, n_chunks = B * T * H, T // _gdn.CHUNK
    reads = tokens * (2 * K + V + 1) + B * n_chunks * H * K * V
    return 4 * (reads + tokens * V)
