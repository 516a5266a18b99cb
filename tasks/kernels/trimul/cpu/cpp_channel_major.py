"""trimul on CPU: MKL's matmuls, channel-major, with the elementwise work fused into two C++ loops.

At the CPU shapes the six matmuls (five projections and the output projection, ~200 MFLOP at
N = 32) already run near the core's fp32 peak through ATen's BLAS; what the reference adds on top
is layout changes and elementwise passes: the einsum's permute copies of left and right, five
sigmoids, the masks and products, a layer norm, the gate, each a full pass with a temporary.
Here, called from one C++ function so no Python runs between the steps:
  1. z = layer_norm(x) (ATen's, vectorised);
  2. all five projections as one matmul in the channel-major orientation, P = W5 @ z^T, a
     [5 * hidden, bs * N * N] result in which each channel's [N, N] matrix is contiguous;
  3. one fused loop makes left = p * sigmoid(gate) * mask and right the same, in place in P
     (one read of each operand, one write; the sigmoid is 1 / (1 + e^-x) with a vectorised e^x);
  4. the triangle product is one bmm over the bs * hidden channels, right transposed in the call;
  5. one fused loop does the layer norm over hidden and the output gate on the channel-major
     bmm result, COLS positions at a time: the block's mean, then its variance (two passes, so a
     large common offset cannot cancel the variance away), then (x - mean) * rstd * w + b times
     sigmoid of the out-gate projection, written back in place. COLS sets the block's footprint:
     hidden x COLS floats (32 KB at COLS = 64, the L1 data cache) are read three times;
  6. y = res^T @ W_out^T, the transposed operand handled by the BLAS call, not a copy.
All arithmetic is fp32, matmuls at full fp32 precision.
"""
import torch
from torch.utils.cpp_extension import load_inline

COLS = 64  # tune: 16, 32, 64, 128, 256

_SOURCE = r"""
#include <cmath>
#include <cstring>
#include <vector>

constexpr int VEC = 16, COLS = %(COLS)d;
typedef float vf __attribute__((vector_size(VEC * sizeof(float))));
typedef int vi __attribute__((vector_size(VEC * sizeof(int))));
static inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
static inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
static inline vf splat(float x) { return (vf){} + x; }

// e^x: x = n ln2 + r, |r| <= ln2 / 2, e^r by its Taylor series to r^7 (below 1e-8 relative), 2^n
// put in the exponent bits. Below -87: 0 (the true value is subnormal); above 88: +inf.
static inline vf vexp(vf x) {
  const vf lo = splat(-87.0f), hi = splat(88.0f);
  vf xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf n = (xc * 1.44269504088896341f + magic) - magic;
  vf r = xc - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723e-6f;
  vf p = splat(1.0f / 5040);
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
  y = x < lo ? splat(0.0f) : y;
  return x > hi ? splat(INFINITY) : y;
}
static inline vf vsigmoid(vf x) { return 1.0f / (1.0f + vexp(-x)); }
static inline float ssigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

at::Tensor trimul(at::Tensor x, at::Tensor mask, at::Tensor w5, at::Tensor norm_w, at::Tensor norm_b,
                  at::Tensor out_norm_w, at::Tensor out_norm_b, at::Tensor out_w) {
  const int64_t bs = x.size(0), N = x.size(1), dim = x.size(3), hidden = w5.size(0) / 5, M = bs * N * N;
  at::Tensor z = at::layer_norm(x, {dim}, norm_w, norm_b, 1e-5).view({M, dim});
  at::Tensor P = at::mm(w5, z.t());                                   // [5 * hidden, M], channel-major
  at::Tensor keep = mask.to(at::kFloat).contiguous();
  float* p = P.data_ptr<float>();
  const float* mk = keep.data_ptr<float>();
  for (int side = 0; side < 2; ++side)                                // left: rows 0, 1; right: rows 2, 3
    for (int64_t d = 0; d < hidden; ++d) {
      float* val = p + ((2 * side) * hidden + d) * M;
      const float* gate = p + ((2 * side + 1) * hidden + d) * M;
      int64_t m = 0;
      for (; m + VEC <= M; m += VEC) store(val + m, load(val + m) * vsigmoid(load(gate + m)) * load(mk + m));
      for (; m < M; ++m) val[m] = val[m] * ssigmoid(gate[m]) * mk[m];
    }
  at::Tensor left = P.narrow(0, 0, hidden).view({hidden * bs, N, N});
  at::Tensor right = P.narrow(0, 2 * hidden, hidden).view({hidden * bs, N, N});
  at::Tensor out = at::bmm(left, right.transpose(1, 2));              // [hidden, M], channel-major
  float* o = out.data_ptr<float>();
  const float* og = p + 4 * hidden * M;
  const float *gw = out_norm_w.data_ptr<float>(), *gb = out_norm_b.data_ptr<float>();
  alignas(64) float mean[COLS], rstd[COLS];
  for (int64_t c0 = 0; c0 < M; c0 += COLS) {
    const int64_t cols = M - c0 < COLS ? M - c0 : COLS;
    for (int64_t c = 0; c < cols; ++c) mean[c] = 0.0f;
    for (int64_t d = 0; d < hidden; ++d)
      for (int64_t c = 0; c < cols; ++c) mean[c] += o[d * M + c0 + c];
    for (int64_t c = 0; c < cols; ++c) { mean[c] /= hidden; rstd[c] = 0.0f; }
    for (int64_t d = 0; d < hidden; ++d)
      for (int64_t c = 0; c < cols; ++c) { const float t = o[d * M + c0 + c] - mean[c]; rstd[c] += t * t; }
    for (int64_t c = 0; c < cols; ++c) rstd[c] = 1.0f / std::sqrt(rstd[c] / hidden + 1e-5f);
    for (int64_t d = 0; d < hidden; ++d) {
      float* row = o + d * M + c0;
      const float* grow = og + d * M + c0;
      int64_t c = 0;
      for (; c + VEC <= cols; c += VEC)
        store(row + c, ((load(row + c) - load(mean + c)) * load(rstd + c) * gw[d] + gb[d]) * vsigmoid(load(grow + c)));
      for (; c < cols; ++c) row[c] = ((row[c] - mean[c]) * rstd[c] * gw[d] + gb[d]) * ssigmoid(grow[c]);
    }
  }
  return at::mm(out.view({hidden, M}).t(), out_w.t()).view({bs, N, N, out_w.size(0)});
}
"""

_ext = load_inline(f"trimul_cpu_channel_major_c{COLS}", _SOURCE % {"COLS": COLS}, functions=["trimul"],
                   extra_cflags=["-O3", "-march=native"])

PROJECTIONS = ("left_proj.weight", "left_gate.weight", "right_proj.weight", "right_gate.weight", "out_gate.weight")


def custom_kernel(data):
    x, mask, w, config = data
    w5 = torch.cat([w[name] for name in PROJECTIONS])
    return _ext.trimul(x, mask, w5, w["norm.weight"], w["norm.bias"],
                       w["to_out_norm.weight"], w["to_out_norm.bias"], w["to_out.weight"])
