"""Fused cross-entropy, one program per row, online softmax (two passes over the logits).

Pass 1 streams the row in BLOCK_V-wide blocks and keeps, per lane, a running max m and a running
sum of exp(x - m) that is rescaled by exp(m_old - m_new) whenever the max grows (the online-softmax
trick), so the row is read once to get logsumexp. The lanes are merged with one reduction at the
end of the row instead of one per block. The loss is lse - x[target], in fp32.
Pass 2 re-reads the row (mostly from L2) and writes grad = (exp(x - lse) - [col == target]) * g
in bf16. Traffic: ~6*B*V bytes (two bf16 reads, one bf16 write). exp is done as exp2 with a
log2(e) factor, which maps to the hardware's fast exponential.
"""
import torch
import triton
import triton.language as tl

BLOCK_V = 2048  # tune: 256, 512, 1024, 2048, 4096, 8192
NUM_WARPS = 8  # tune: 2, 4, 8, 16


@triton.jit
def _ce_row_kernel(logits_ptr, targets_ptr, grad_out_ptr, losses_ptr, grad_ptr,
                   V, stride_x, stride_g, BLOCK: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    row = tl.program_id(0).to(tl.int64)  # row * stride exceeds int32 at B*V > 2**31
    x_row = logits_ptr + row * stride_x
    g_row = grad_ptr + row * stride_g
    cols = tl.arange(0, BLOCK)

    # Pass 1: per-lane online max / sum-exp. A finite "minus infinity" start keeps
    # exp(m_old - m_new) from becoming exp(-inf + inf) = NaN on lanes that only see padding.
    m = tl.full([BLOCK], -1e30, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        idx = start + cols
        x = tl.load(x_row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp2((m - m_new) * LOG2E) + tl.exp2((x - m_new) * LOG2E)
        m = m_new
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(s * tl.exp2((m - m_row) * LOG2E), axis=0)
    lse = m_row + tl.log(s_row)

    t = tl.load(targets_ptr + row)
    x_t = tl.load(x_row + t).to(tl.float32)
    tl.store(losses_ptr + row, lse - x_t)

    # Pass 2: gradient of the loss times the upstream gradient.
    g = tl.load(grad_out_ptr + row)
    for start in range(0, V, BLOCK):
        idx = start + cols
        mask = idx < V
        x = tl.load(x_row + idx, mask=mask, other=float("-inf")).to(tl.float32)
        p = tl.exp2((x - lse) * LOG2E)
        grad = (p - tl.where(idx == t, 1.0, 0.0)) * g
        tl.store(g_row + idx, grad.to(tl.bfloat16), mask=mask)


def custom_kernel(data):
    logits, targets, grad_output = data
    logits = logits.contiguous()
    B, V = logits.shape
    losses = torch.empty(B, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits)
    _ce_row_kernel[(B,)](
        logits, targets.contiguous(), grad_output.contiguous(), losses, grad,
        V, logits.stride(0), grad.stride(0),
        BLOCK=BLOCK_V, num_warps=NUM_WARPS,
    )
    return losses, grad
