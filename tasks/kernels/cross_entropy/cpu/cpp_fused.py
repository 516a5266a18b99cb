"""Cross-entropy as one hand-written C++ loop nest, built with torch.utils.cpp_extension.load_inline.

The seed makes ~8 passes over B*V values (upcast, logsumexp, gather, softmax, scatter, scale,
downcast), each a separate operator call with its own dispatch and its own trip through memory.
Here each row is read from memory once and worked on while it sits in the L1 cache:
  1. row max m (a vectorised max-reduction over the bf16 row, widened to fp32 in registers);
  2. e_v = exp(x_v - m), summed into s; with SCRATCH = 1 the e_v are kept in a per-row fp32
     buffer, with SCRATCH = 0 they are recomputed in step 3 (less memory, twice the exponentials);
  3. grad_v = (e_v / s - [v == target]) * g, rounded to bf16 (round to nearest even, as torch's
     .to(torch.bfloat16)), and loss = m + log(s) - x_target.
Everything is fp32; only the stored gradient is bf16.

What makes it fast on a CPU is that every inner loop vectorises, which takes three things:
  - no function call in the loop: exp is an inline polynomial, not libm's expf, and the max is a
    compare, not std::fmax (whose NaN rules make it a libm call);
  - `#pragma omp simd` with -fopenmp-simd (the pragma only, no threads), which lets the compiler
    reorder the max and sum reductions that strict IEEE order keeps scalar (SIMD = 0 leaves the
    pragmas out);
  - -fno-trapping-math, a promise that nothing reads the floating-point exception flags, without
    which GCC keeps the float-to-int conversion of exp's exponent scalar, and with it the whole
    loop; it changes no result (TRAPPING_MATH = 1 drops the promise).

The build is the tuning (`# tune:` constants, which the search edits; the file holds a
conservative start, what one writes before knowing the machine): OPT is the optimisation level
(-O1 does not vectorise; -O2 does, with GCC's cheap cost model; -O3 also unrolls and versions
loops); NATIVE = 1 compiles for this CPU (-march=native: AVX-512 where it has it), NATIVE = 0 for
any x86-64 (SSE2, without the rounding instruction exp's floor needs in a vector: its loop stays
scalar); VEC_BITS is the vector width the compiler prefers (128 is SSE's, safe everywhere; 512
bits is 16 floats an instruction on an AVX-512 machine; 256 avoids the lower clock some CPUs run
512-bit code at).

The op is registered through PyTorch's stable C++ ABI (torch/csrc/stable), whose headers build in
about two seconds, where `#include <torch/extension.h>` takes about thirty: the build is part of a
measurement's cost.
"""
import hashlib

import torch
from torch.utils.cpp_extension import load_inline

SCRATCH = 0  # tune: 0, 1
OPT = 2  # tune: 1, 2, 3
NATIVE = 1  # tune: 0, 1
VEC_BITS = 128  # tune: 128, 256, 512
SIMD = 1  # tune: 0, 1
TRAPPING_MATH = 0  # tune: 0, 1

SOURCE = r"""
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <cmath>
#include <cstdint>
#include <vector>

using torch::stable::Tensor;

static inline float bf16_to_float(uint16_t h) { return __builtin_bit_cast(float, uint32_t(h) << 16); }

static inline uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (f != f) ? uint16_t(0x7FC0) : uint16_t(rounded);
}

// exp(x) for x <= 0: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n by
// building the float's exponent bits. Below -87 the result is clamped to ~1e-38 (torch gives a
// denormal or 0 there; both are far inside the tolerance). Branch-free, so loops vectorise.
static inline float exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  float n = std::floor(x * 1.44269504f + 0.5f);
  float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * __builtin_bit_cast(float, (int32_t(n) + 127) << 23);
}

void cross_entropy(Tensor logits, Tensor targets, Tensor grad_output, Tensor losses, Tensor grad) {
  const int64_t B = logits.size(0), V = logits.size(1);
  const uint16_t* X = static_cast<const uint16_t*>(logits.const_data_ptr());
  const int64_t* T = static_cast<const int64_t*>(targets.const_data_ptr());
  const float* G = static_cast<const float*>(grad_output.const_data_ptr());
  float* L = static_cast<float*>(losses.mutable_data_ptr());
  uint16_t* D = static_cast<uint16_t*>(grad.mutable_data_ptr());
  std::vector<float> scratch(SCRATCH ? V : 0);
  float* e = scratch.data();
  for (int64_t b = 0; b < B; ++b) {
    const uint16_t* x = X + b * V;
    uint16_t* d = D + b * V;
    float m = -INFINITY;
#pragma SIMD_MAX
    for (int64_t v = 0; v < V; ++v) { float y = bf16_to_float(x[v]); m = y > m ? y : m; }
    float s = 0.0f;
    if (SCRATCH) {
#pragma SIMD_SUM
      for (int64_t v = 0; v < V; ++v) { e[v] = exp_nonpos(bf16_to_float(x[v]) - m); s += e[v]; }
    } else {
#pragma SIMD_SUM
      for (int64_t v = 0; v < V; ++v) s += exp_nonpos(bf16_to_float(x[v]) - m);
    }
    const float g = G[b], scale = g / s;
    const int64_t t = T[b];
    L[b] = m + std::log(s) - bf16_to_float(x[t]);
    if (SCRATCH) {
#pragma SIMD_FOR
      for (int64_t v = 0; v < V; ++v) d[v] = float_to_bf16(e[v] * scale - (v == t ? g : 0.0f));
    } else {
#pragma SIMD_FOR
      for (int64_t v = 0; v < V; ++v)
        d[v] = float_to_bf16(exp_nonpos(bf16_to_float(x[v]) - m) * scale - (v == t ? g : 0.0f));
    }
  }
}

STABLE_TORCH_LIBRARY(NAMESPACE, m) {
  m.def("cross_entropy(Tensor logits, Tensor targets, Tensor grad_output, Tensor(a!) losses, Tensor(b!) grad) -> ()");
}
STABLE_TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("cross_entropy", TORCH_BOX(&cross_entropy)); }
"""


def _build():
    # The tune constants are written into the C++ source and its flags; the op's namespace is
    # named after both, so two tunings never share a name.
    simd = {"SIMD_MAX": "omp simd reduction(max: m)", "SIMD_SUM": "omp simd reduction(+: s)", "SIMD_FOR": "omp simd"}
    source = SOURCE.replace("SCRATCH", str(SCRATCH))
    for mark, pragma in simd.items():
        source = source.replace(f"#pragma {mark}", f"#pragma {pragma}" if SIMD else "")
    flags = ([f"-O{OPT}", f"-mprefer-vector-width={VEC_BITS}"] + ["-march=native"] * NATIVE
             + ["-fopenmp-simd"] * SIMD + ["-fno-trapping-math"] * (1 - TRAPPING_MATH))
    name = "ce_" + hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:12]
    load_inline(name, cpp_sources=source.replace("NAMESPACE", name), no_implicit_headers=True,
                is_python_module=False, extra_cflags=flags)
    return getattr(torch.ops, name).cross_entropy


_op = _build()


def custom_kernel(data):
    logits, targets, grad_output = data
    losses = torch.empty(logits.shape[0], dtype=torch.float32)
    grad = torch.empty_like(logits)
    _op(logits.contiguous(), targets.contiguous(), grad_output.contiguous(), losses, grad)
    return losses, grad
