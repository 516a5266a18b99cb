"""Cross-entropy as a plain C++ loop over each row, the way one first writes it: three passes, libm.

For each row: the max, then the sum of std::exp(x - max), then each gradient element with
std::exp again, all in fp32, built with load_inline at -O2 without any vectorisation flags. It
reads the row three times from L1 and never allocates a temporary, but every element costs two
calls to libm's scalar expf: a loop with a function call in it does not vectorise. Compare
cpp_fused.py, the same algorithm written so that the compiler vectorises every loop. OPT is the
optimisation level passed to the compiler.
"""
import hashlib

import torch
from torch.utils.cpp_extension import load_inline

OPT = 2  # tune: 1, 2, 3

SOURCE = r"""
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <cmath>
#include <cstdint>

using torch::stable::Tensor;

static float bf16_to_float(uint16_t h) { return __builtin_bit_cast(float, uint32_t(h) << 16); }

static uint16_t float_to_bf16(float f) {  // round to nearest even, as torch's .to(torch.bfloat16)
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void cross_entropy(Tensor logits, Tensor targets, Tensor grad_output, Tensor losses, Tensor grad) {
  const int64_t B = logits.size(0), V = logits.size(1);
  const uint16_t* X = static_cast<const uint16_t*>(logits.const_data_ptr());
  const int64_t* T = static_cast<const int64_t*>(targets.const_data_ptr());
  const float* G = static_cast<const float*>(grad_output.const_data_ptr());
  float* L = static_cast<float*>(losses.mutable_data_ptr());
  uint16_t* D = static_cast<uint16_t*>(grad.mutable_data_ptr());
  for (int64_t b = 0; b < B; ++b) {
    const uint16_t* x = X + b * V;
    float m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::fmax(m, bf16_to_float(x[v]));
    float s = 0.0f;
    for (int64_t v = 0; v < V; ++v) s += std::exp(bf16_to_float(x[v]) - m);
    const float lse = m + std::log(s), g = G[b];
    L[b] = lse - bf16_to_float(x[T[b]]);
    for (int64_t v = 0; v < V; ++v)
      D[b * V + v] = float_to_bf16((std::exp(bf16_to_float(x[v]) - lse) - (v == T[b] ? 1.0f : 0.0f)) * g);
  }
}

STABLE_TORCH_LIBRARY(NAMESPACE, m) {
  m.def("cross_entropy(Tensor logits, Tensor targets, Tensor grad_output, Tensor(a!) losses, Tensor(b!) grad) -> ()");
}
STABLE_TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("cross_entropy", TORCH_BOX(&cross_entropy)); }
"""


def _build():
    name = "ce_" + hashlib.sha256(f"{SOURCE}{OPT}".encode()).hexdigest()[:12]  # one op name per variant
    load_inline(name, cpp_sources=SOURCE.replace("NAMESPACE", name), no_implicit_headers=True,
                is_python_module=False, extra_cflags=[f"-O{OPT}"])
    return getattr(torch.ops, name).cross_entropy


_op = _build()


def custom_kernel(data):
    logits, targets, grad_output = data
    losses = torch.empty(logits.shape[0], dtype=torch.float32)
    grad = torch.empty_like(logits)
    _op(logits.contiguous(), targets.contiguous(), grad_output.contiguous(), losses, grad)
    return losses, grad
