"""fp8_quant in one pass of plain scalar C++: fused, but one element at a time.

The same single pass as cpp_vector.py (absmax of a group, then its quotients, while the group is
in L1), written the obvious way with a tensor accessor and std::max. It saves the reference's
extra passes and dispatches, but GCC cannot vectorise it: the accessor's strides are run-time
values, and a float max reduction is not reassociable without -ffast-math (max(a, NaN) depends
on the order). So each element costs a scalar load, compare and, above all, a scalar division
(several cycles each, where the vector loop divides 16 floats at once). Faster than eager PyTorch
on these shapes, several times slower than the vector version.
"""
import torch
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <algorithm>
#include <cmath>

std::vector<at::Tensor> quant(at::Tensor x) {
  const int64_t T = x.size(0), H = x.size(1), G = H / 128;
  at::Tensor q = at::empty_like(x), s = at::empty({T, G}, x.options());
  auto xa = x.accessor<float, 2>();
  auto qa = q.accessor<float, 2>();
  auto sa = s.accessor<float, 2>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      float m = 0.0f;
      for (int64_t i = g * 128; i < g * 128 + 128; ++i) m = std::max(m, std::fabs(xa[t][i]));
      const float scale = std::max(m, 1e-10f) / 448.0f;
      sa[t][g] = scale;
      for (int64_t i = g * 128; i < g * 128 + 128; ++i)
        qa[t][i] = std::min(std::max(xa[t][i] / scale, -448.0f), 448.0f);
    }
  return {q, s};
}
"""

_ext = load_inline("fp8_quant_cpu_scalar", _SOURCE, functions=["quant"], extra_cflags=["-O3", "-march=native"])


def custom_kernel(data):
    (x,) = data
    x_q, scales = _ext.quant(x)
    return x_q, scales
