"""GPU MODE task `gated_deltanet_chunk_fwd_h`: the inter-chunk state recurrence of Gated DeltaNet.

One of the paper's three Gated DeltaNet tasks (docs/PAPER.md §8), and the sequential bottleneck of
the chunked forward pass: the [K, V] state must walk the chunks in order, so a candidate can only
parallelise over (batch, head) and over tiles of V, and wins by keeping the state on chip across
chunks. The math and the input pipeline live in tasks/_gdn.py; the seed kernel is
tasks/kernels/gdn_chunk_fwd_h/seed.py.
"""
from tasks import _gdn
from tasks._check import compare_outputs

NAME = "gdn_chunk_fwd_h"

DESCRIPTION = """\
Gated DeltaNet chunk_fwd_h, the inter-chunk state recurrence (chunk size 64, all tensors float32).

Contract: write a Python module that defines `custom_kernel(data)` (Triton preferred; torch,
triton, triton.language and math may be imported). Every output element must be written
(fresh output buffers are not pre-zeroed).
`data = (k, w, u, g, initial_state)`, already on the GPU and contiguous:
  k             [B, T, H, K]     L2-normalised keys
  w             [B, T, H, K]     WY-transformed keys (output of recompute_w_u)
  u             [B, T, H, V]     WY-transformed values (output of recompute_w_u)
  g             [B, T, H]        chunk-local cumulative sum of negative log-decays
                                 (restarts every 64 tokens)
  initial_state [B, H, K, V]     the state before the first chunk (random, not zeros)
T is a multiple of 64, NT = T // 64; chunk c covers tokens 64c .. 64c+63. For each (b, h), with
state = initial_state[b, h] and, for c = 0 .. NT-1, k_c, w_c, u_c, g_c the chunk's 64 rows:
  1. h[b, c, h] = state                                  (the state *before* chunk c)
  2. v_new_c = u_c - w_c @ state                         (rows of v_new for this chunk)
  3. v_gated = v_new_c * exp(g_c[63] - g_c)[:, None]     (decay each token to the chunk end)
  4. state = state * exp(g_c[63]) + k_c^T @ v_gated
Output: a tuple (h [B, NT, H, K, V], v_new [B, T, H, V]), float32. The final state is not returned.
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
CPU_CHECK_CASES = [{"B": 2, "T": 192, "H": 1, "K": 48, "V": 40, "gate": "slow", "cpu_only": True}]


def generate_input(case, seed, device="cpu"):
    t = _gdn.make_inputs(case, seed, device)
    return t["k"], t["w"], t["u"], t["g"], t["initial_state"]


def reference(data):
    k, w, u, g, initial_state = data
    return _gdn.chunk_fwd_h(k, w, u, g, initial_state)


def check(output, expected):
    return compare_outputs(output, expected, rtol=_gdn.RTOL, atol=_gdn.ATOL, names=["h", "v_new"])


def min_bytes(case):
    """fp32 reads of k, w, u, g, initial_state and writes of h, v_new."""
    B, T, H, K, V = (case[key] for key in ("B", "T", "H", "K", "V"))
    tokens, n_chunks = B * T * H, T // _gdn.CHUNK
    reads = tokens * (2 * K + V + 1) + B * H * K * V
    writes = B * n_chunks * H * K * V + tokens * V
    return 4 * (reads + writes)
