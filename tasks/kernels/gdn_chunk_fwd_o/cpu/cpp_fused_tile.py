"""gdn_chunk_fwd_o on CPU: each (batch, chunk, head) tile computed start to finish in L1, in C++.

The reference builds the whole [B, NT, H, 64, 64] decay matrix in memory (a difference, two
masked fills, an exp), then the score matrix, then multiplies them, then three matmuls' worth
of results, a sum and a scaling, each a separate op with its own temporary, and finally copies
the tiles back to token-major order. Here one loop over the tiles does, for ROWS query rows at a
time:
  1. scores P[i, :] = q_i . k_j for all 64 j, as broadcast-and-FMA over a transposed copy of the
     chunk's keys (so the 64 j's are four 16-float vectors);
  2. P[i, j] *= exp(g_i - g_j) on j <= i, zero above; the exp of a whole vector of j at once
     (VEXP = 1: a Cody-Waite range reduction and a degree-7 polynomial, about 1 ulp; VEXP = 0:
     the C library's scalar expf per element, the plain way, several times slower here since
     this is 2080 exps per tile);
  3. o_i = scale * (exp(g_i) q_i @ h + sum_{j <= i} P[i, j] v_j), both as broadcast-and-FMA along
     V, the sum stopping at the block's last row (the upper triangle is never touched).
The ROWS rows share every vector loaded from the keys, h and v, and give ROWS independent FMA
chains. exp(g_i - g_j) is taken of the masked difference (never of a positive one above the
diagonal, which could overflow). All arithmetic is fp32.
"""
import torch
from torch.utils.cpp_extension import load_inline

ROWS = 4  # tune: 1, 2, 4, 8
VEXP = 1  # tune: 0, 1

_SOURCE = r"""
#include <cmath>
#include <cstring>
#include <vector>

constexpr int C = 64, VEC = 16, NJ = C / VEC, ROWS = %(ROWS)d;
typedef float vf __attribute__((vector_size(VEC * sizeof(float))));
typedef int vi __attribute__((vector_size(VEC * sizeof(int))));
static inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
static inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// e^x for a vector: x = n ln2 + r with n an integer and |r| <= ln2 / 2, e^r by its Taylor series
// to r^7 (truncation error below 1e-8 relative), times 2^n built in the exponent bits. Inputs
// below -87 give 0 (the true value is under 1.7e-38, a subnormal), above 88 give +inf.
static inline vf vexp(vf x) {
  const vf lo = (vf){} - 87.0f, hi = (vf){} + 88.0f;
  vf xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const vf magic = (vf){} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  vf n = (xc * 1.44269504088896341f + magic) - magic;
  vf r = xc - n * 0.693145751953125f;     // ln2 split in two: the high part is exact in n * hi
  r = r - n * 1.42860682030941723e-6f;
  vf p = (vf){} + 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf two_n;
  std::memcpy(&two_n, &e, sizeof e);
  vf y = p * two_n;
  const vf zero = (vf){}, inf = (vf){} + INFINITY;
  y = x < lo ? zero : y;
  return x > hi ? inf : y;
}

template <int R>
static void rows(int i0, const float* q, int64_t qstride, const float* kT, const float* Hl, const float* Vl,
                 const float* gl, int64_t K, int64_t VP, float scale, float* out, int64_t ostride, int64_t V) {
  const int64_t NV = VP / VEC;
  alignas(64) float P[R][C];
  // 1. scores against all 64 keys
  vf s[R][NJ];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NJ; ++n) s[r][n] = (vf){};
  for (int64_t d = 0; d < K; ++d)
    for (int n = 0; n < NJ; ++n) {
      const vf kv = load(kT + d * C + n * VEC);
      for (int r = 0; r < R; ++r) s[r][n] += q[(i0 + r) * qstride + d] * kv;
    }
  // 2. the causal decay, masked before the exp
  for (int r = 0; r < R; ++r) {
    const int i = i0 + r;
    for (int n = 0; n < NJ; ++n) {
      vf diff, keep;
      for (int l = 0; l < VEC; ++l) {
        const bool below = n * VEC + l <= i;
        diff[l] = below ? gl[i] - gl[n * VEC + l] : 0.0f;
        keep[l] = below ? 1.0f : 0.0f;
      }
#if %(VEXP)d
      const vf dec = vexp(diff);
#else
      vf dec;
      for (int l = 0; l < VEC; ++l) dec[l] = std::exp(diff[l]);
#endif
      store(P[r] + n * VEC, s[r][n] * dec * keep);
    }
  }
  // 3. o = scale * (exp(g_i) q_i @ h + P @ v), j only up to the block's last row
  const int jend = i0 + R;
  for (int64_t n = 0; n < NV; ++n) {
    vf acc[R];
    for (int r = 0; r < R; ++r) acc[r] = (vf){};
    for (int64_t d = 0; d < K; ++d) {
      const vf hv = load(Hl + d * VP + n * VEC);
      for (int r = 0; r < R; ++r) acc[r] += q[(i0 + r) * qstride + d] * hv;
    }
    for (int r = 0; r < R; ++r) acc[r] *= std::exp(gl[i0 + r]);
    for (int j = 0; j < jend; ++j) {
      const vf vv = load(Vl + j * VP + n * VEC);
      for (int r = 0; r < R; ++r) acc[r] += P[r][j] * vv;
    }
    for (int r = 0; r < R; ++r) {
      vf o = acc[r] * scale;
      const int64_t m = V - n * VEC < VEC ? V - n * VEC : VEC;
      std::memcpy(out + (i0 + r) * ostride + n * VEC, &o, m * sizeof(float));
    }
  }
}

at::Tensor chunk_fwd_o(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor h, at::Tensor g, double scale_) {
  for (auto* t : {&q, &k, &v, &h, &g})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), "fp32 contiguous inputs");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3), NT = T / C;
  const int64_t VP = (V + VEC - 1) / VEC * VEC;
  const float scale = (float)scale_;  // K ** -0.5, rounded to fp32 as the reference's multiply does
  at::Tensor o = at::empty_like(v);
  const float *pq = q.data_ptr<float>(), *pk = k.data_ptr<float>(), *pv = v.data_ptr<float>();
  const float *ph = h.data_ptr<float>(), *pg = g.data_ptr<float>();
  float* po = o.data_ptr<float>();
  std::vector<float> kT(K * C), Hl(K * VP, 0.0f), Vl(C * VP, 0.0f), gl(C);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < NT; ++c)
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t row0 = (b * T + c * C) * H + hh;  // token c*64 of (b, hh), in units of [H] rows
        for (int j = 0; j < C; ++j) {
          const int64_t r = row0 + j * H;
          gl[j] = pg[r];
          for (int64_t d = 0; d < K; ++d) kT[d * C + j] = pk[r * K + d];
          std::memcpy(&Vl[j * VP], pv + r * V, V * sizeof(float));
        }
        const float* hs = ph + ((b * NT + c) * H + hh) * K * V;
        for (int64_t d = 0; d < K; ++d) std::memcpy(&Hl[d * VP], hs + d * V, V * sizeof(float));
        for (int i0 = 0; i0 < C; i0 += ROWS)
          rows<ROWS>(i0, pq + row0 * K, H * K, kT.data(), Hl.data(), Vl.data(), gl.data(), K, VP, scale,
                     po + row0 * V, H * V, V);
      }
  return o;
}
"""

_ext = load_inline(f"gdn_chunk_fwd_o_cpu_fused_r{ROWS}_e{VEXP}", _SOURCE % {"ROWS": ROWS, "VEXP": VEXP},
                   functions=["chunk_fwd_o"], extra_cflags=["-O3", "-march=native"])


def custom_kernel(data):
    q, k, v_new, h, g = data
    return _ext.chunk_fwd_o(q, k, v_new, h, g, q.shape[-1] ** -0.5)
