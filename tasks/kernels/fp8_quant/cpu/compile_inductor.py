"""fp8_quant through torch.compile: Inductor fuses the reference into one generated C++ loop nest.

Inductor sees abs -> amax -> clamp -> divide -> clamp on a [T, H/128, 128] view and emits a single
kernel per group row: a vectorised reduction over the 128 elements, then the pointwise tail, so x
is read once from memory and x_q written once, as in a hand-fused kernel. What is left to choose
is how the generated code is built and called:
  SIMDLEN      the vector width Inductor generates for (0: detect the machine's, 256: AVX2,
               512: AVX-512, 1: no vectorisation, scalar C++ loops);
  CPP_WRAPPER  1: the graph's wrapper is compiled C++ as well, so a call skips the Python wrapper
               (its allocations and kernel call cost microseconds, which matter at 256 KB);
               0: the default Python wrapper.
The first call compiles (tens of seconds); later calls run the cached kernel.
"""
import torch

GROUP = 128
FP8_MAX = 448.0
EPS = 1e-10
SIMDLEN = 0  # tune: 0, 1, 256, 512
CPP_WRAPPER = 1  # tune: 0, 1


def _quant(x):
    T, H = x.shape
    groups = x.reshape(T, H // GROUP, GROUP)
    absmax = groups.abs().amax(dim=-1).clamp(min=EPS)
    scale = absmax / FP8_MAX
    x_q = (groups / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    return x_q.reshape(T, H), scale


_compiled = torch.compile(_quant, dynamic=False, fullgraph=True, options={
    "cpp.simdlen": SIMDLEN or None,
    "cpp_wrapper": bool(CPP_WRAPPER),
})


def custom_kernel(data):
    (x,) = data
    x_q, scale = _compiled(x)
    return x_q, scale
