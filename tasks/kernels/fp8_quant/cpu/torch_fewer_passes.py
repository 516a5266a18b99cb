"""fp8_quant in eager PyTorch with fewer full-size passes: small ops in place, a multiply for the divide.

The reference makes five passes over the [T, H] tensor, each allocating a full-size result: abs,
amax (a read), the division and the clamp, plus two small ops on the [T, H/128] scales. Here the
scale's clamp and division by 448 happen in place on the small tensor, the quotient is a multiply
by the scale's reciprocal (a vector division costs several times a multiply on x86, and the [T, H]
divide was the costliest op of the reference), and the clamp runs in place on the product instead
of into another full-size buffer. Still four passes over memory, each a separate dispatch:
a modest gain that a fused kernel leaves behind.

x * (1 / scale) differs from x / scale by at most one or two units in the last fp32 place, far
inside the 1e-3 tolerance; the scale itself is computed exactly as the reference computes it.
"""
import torch

GROUP = 128
FP8_MAX = 448.0
EPS = 1e-10


def custom_kernel(data):
    (x,) = data
    T, H = x.shape
    groups = x.view(T, H // GROUP, GROUP)
    scale = groups.abs().amax(dim=-1)
    scale.clamp_(min=EPS).div_(FP8_MAX)
    x_q = groups * scale.reciprocal().unsqueeze(-1)
    x_q.clamp_(-FP8_MAX, FP8_MAX)
    return x_q.view(T, H), scale
