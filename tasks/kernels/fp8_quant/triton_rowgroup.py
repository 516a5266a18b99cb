"""fp8_quant in one Triton pass: each program quantises BLOCK_G whole groups.

Because x is row-major [T, H] and H is a multiple of 128, the groups are contiguous runs of 128
floats, so x is viewed as a [T * H / 128, 128] matrix of groups. A program loads BLOCK_G rows of
it, reduces |x| along each row to the group's absmax, and writes the quotient and the scale:
one read of x and one write of the outputs, the memory-traffic floor of the task.
"""
import torch
import triton
import triton.language as tl

GROUP = 128
BLOCK_G = 16  # tune: 4, 8, 16, 32, 64
NUM_WARPS = 4  # tune: 1, 2, 4, 8


@triton.jit
def _quant_groups(x_ptr, q_ptr, s_ptr, n_groups, GROUP: tl.constexpr, BLOCK_G: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    cols = tl.arange(0, GROUP)
    live = rows < n_groups
    offsets = rows[:, None].to(tl.int64) * GROUP + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=live[:, None], other=0.0)
    absmax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10)
    scale = absmax / 448.0
    q = tl.minimum(tl.maximum(x / scale[:, None], -448.0), 448.0)
    tl.store(q_ptr + offsets, q, mask=live[:, None])
    tl.store(s_ptr + rows, scale, mask=live)


def custom_kernel(data):
    (x,) = data
    x = x.contiguous()
    T, H = x.shape
    n_groups = T * (H // GROUP)
    x_q = torch.empty_like(x)
    scales = torch.empty(T, H // GROUP, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n_groups, BLOCK_G),)
    _quant_groups[grid](x, x_q, scales, n_groups, GROUP=GROUP, BLOCK_G=BLOCK_G, num_warps=NUM_WARPS)
    return x_q, scales
