"""Single-read cross-entropy: hold a whole row on chip, read each logit once (the 4*B*V floor).

A two-pass kernel reads the logits twice because the softmax normaliser is known only after the
whole row has been seen. If a row fits in the registers of one program (V = 32000 bf16 logits are
64 KB; as fp32 spread over 16 warps that is 64 values per thread), the program can load it once,
reduce max and sum-exp over the values it holds, and write the gradient from the same registers:
one bf16 read and one bf16 write per logit. Larger rows would spill registers to local memory, so
above SINGLE_PASS_MAX_V the kernel falls back to an online-softmax two-pass row kernel.
"""
import torch
import triton
import triton.language as tl

SINGLE_PASS_MAX_V = 32768  # tune: 8192, 16384, 32768, 65536
NUM_WARPS = 16  # tune: 4, 8, 16, 32
BLOCK_V = 4096  # tune: 1024, 2048, 4096, 8192
FALLBACK_NUM_WARPS = 8  # tune: 4, 8, 16


@triton.jit
def _ce_single_read_kernel(logits_ptr, targets_ptr, grad_out_ptr, losses_ptr, grad_ptr,
                           V, stride_x, stride_g, ROW: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    row = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, ROW)
    mask = idx < V
    x = tl.load(logits_ptr + row * stride_x + idx, mask=mask, other=float("-inf")).to(tl.float32)
    t = tl.load(targets_ptr + row)
    # The target logit is already in registers; pick it with a masked sum instead of a reload,
    # before exp overwrites x (x and e need not be live together: ~64 fp32 registers per thread
    # at V = 32768 with 16 warps, inside the 128 a 512-thread program may use).
    x_t = tl.sum(tl.where(idx == t, x, 0.0), axis=0)
    m = tl.max(x, axis=0)
    e = tl.exp2((x - m) * LOG2E)  # padding lanes give exp(-inf) = 0
    s = tl.sum(e, axis=0)
    lse = m + tl.log(s)
    tl.store(losses_ptr + row, lse - x_t)
    g = tl.load(grad_out_ptr + row)
    grad = (e / s - tl.where(idx == t, 1.0, 0.0)) * g
    tl.store(grad_ptr + row * stride_g + idx, grad.to(tl.bfloat16), mask=mask)


@triton.jit
def _ce_two_pass_kernel(logits_ptr, targets_ptr, grad_out_ptr, losses_ptr, grad_ptr,
                        V, stride_x, stride_g, BLOCK: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * stride_x
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -1e30, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        idx = start + cols
        x = tl.load(x_row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp2((m - m_new) * LOG2E) + tl.exp2((x - m_new) * LOG2E)
        m = m_new
    m_row = tl.max(m, axis=0)
    lse = m_row + tl.log(tl.sum(s * tl.exp2((m - m_row) * LOG2E), axis=0))
    t = tl.load(targets_ptr + row)
    tl.store(losses_ptr + row, lse - tl.load(x_row + t).to(tl.float32))
    g = tl.load(grad_out_ptr + row)
    for start in range(0, V, BLOCK):
        idx = start + cols
        mask = idx < V
        x = tl.load(x_row + idx, mask=mask, other=float("-inf")).to(tl.float32)
        grad = (tl.exp2((x - lse) * LOG2E) - tl.where(idx == t, 1.0, 0.0)) * g
        tl.store(grad_ptr + row * stride_g + idx, grad.to(tl.bfloat16), mask=mask)


def custom_kernel(data):
    logits, targets, grad_output = data
    logits, targets, grad_output = logits.contiguous(), targets.contiguous(), grad_output.contiguous()
    B, V = logits.shape
    losses = torch.empty(B, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits)
    args = (logits, targets, grad_output, losses, grad, V, logits.stride(0), grad.stride(0))
    if V <= SINGLE_PASS_MAX_V:
        _ce_single_read_kernel[(B,)](*args, ROW=triton.next_power_of_2(V), num_warps=NUM_WARPS)
    else:
        _ce_two_pass_kernel[(B,)](*args, BLOCK=BLOCK_V, num_warps=FALLBACK_NUM_WARPS)
    return losses, grad
