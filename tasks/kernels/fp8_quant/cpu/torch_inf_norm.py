"""fp8_quant in eager PyTorch with the absmax as an infinity norm: one pass fewer, and slower.

The idea: the reference materialises |x| (a full-size temporary, written then read again) only to
reduce it with amax, while torch.linalg.vector_norm(ord=inf) takes the maximum of |x| in a single
read with no temporary, and exactly (a maximum of magnitudes involves no rounding). The scale is
then clamped and divided in place and the quotient clamped in place: three passes over [T, H]
instead of five.

It loses because of the op it leans on: on CPU the inf-norm reduction does not take the vectorised
path that abs and amax have. On a 64 x 1024 input on the 2-core Xeon VM (one thread), the norm
alone took about 310 us where abs + amax took 20 us. A shorter program is not a faster one when
one of its ops falls off the fast path.
"""
import math

import torch

GROUP = 128
FP8_MAX = 448.0
EPS = 1e-10


def custom_kernel(data):
    (x,) = data
    T, H = x.shape
    groups = x.view(T, H // GROUP, GROUP)
    scale = torch.linalg.vector_norm(groups, ord=math.inf, dim=-1)
    scale.clamp_(min=EPS).div_(FP8_MAX)
    x_q = torch.div(groups, scale.unsqueeze(-1))
    x_q.clamp_(-FP8_MAX, FP8_MAX)
    return x_q.view(T, H), scale
