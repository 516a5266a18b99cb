"""gdn_chunk_fwd_o in plain scalar C++, element by element from the formula.

The formula transcribed: for each output element o[i, d] of a tile, the inter-chunk dot product
q_i . h[:, d] times exp(g_i), plus the causal sum over j <= i of (q_i . k_j) exp(g_i - g_j) v[j, d],
times the scale. It fuses everything the reference materialises (no decay matrix, no score matrix
in memory, no permute copies), and it is still tens of times slower than eager PyTorch: it
recomputes each score q_i . k_j and its exp once for every d (V times over, so O(64^2 K V) work
per tile where the matmul form does O(64^2 (K + V))), walks h down a column, and is scalar
throughout: tensor accessors with run-time strides leave GCC nothing to vectorise. A fused loop
nest is not a fast one unless each value is computed once and the inner loop is contiguous.
"""
import torch
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <cmath>

at::Tensor chunk_fwd_o(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor h, at::Tensor g, double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3), C = 64;
  at::Tensor o = at::empty_like(v);
  auto qa = q.accessor<float, 4>(), ka = k.accessor<float, 4>(), va = v.accessor<float, 4>();
  auto ha = h.accessor<float, 5>();
  auto ga = g.accessor<float, 3>();
  auto oa = o.accessor<float, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t t0 = 0; t0 < T; t0 += C)
        for (int64_t i = t0; i < t0 + C; ++i)
          for (int64_t d = 0; d < V; ++d) {
            float inter = 0.0f;
            for (int64_t e = 0; e < K; ++e) inter += qa[b][i][hh][e] * ha[b][t0 / C][hh][e][d];
            float intra = 0.0f;
            for (int64_t j = t0; j <= i; ++j) {
              float s = 0.0f;
              for (int64_t e = 0; e < K; ++e) s += qa[b][i][hh][e] * ka[b][j][hh][e];
              intra += s * std::exp(ga[b][i][hh] - ga[b][j][hh]) * va[b][j][hh][d];
            }
            oa[b][i][hh][d] = (float)scale * (inter * std::exp(ga[b][i][hh]) + intra);
          }
  return o;
}
"""

_ext = load_inline("gdn_chunk_fwd_o_cpu_scalar", _SOURCE, functions=["chunk_fwd_o"],
                   extra_cflags=["-O3", "-march=native"])


def custom_kernel(data):
    q, k, v_new, h, g = data
    return _ext.chunk_fwd_o(q, k, v_new, h, g, q.shape[-1] ** -0.5)
