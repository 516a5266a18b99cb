"""Chunked cross-entropy: split each row's vocabulary over several programs (split-K softmax).

One program per row leaves most of the GPU idle when B is small (B = 7 rows is 7 programs), and a
single program streaming a 128k-wide row has little memory-level parallelism. Here a row of V
logits is cut into chunks of CHUNK = BLOCK_V * TILES_PER_CHUNK values, and a 2D grid
(rows x chunks) does the work in three launches:
  1. stats:   each (row, chunk) program writes the chunk's max m_c and sum_exp s_c = sum exp(x - m_c)
  2. combine: one program per row merges the partials, lse = M + log(sum_c s_c * exp(m_c - M)),
              and writes lse and the loss lse - x[target]
  3. grad:    each (row, chunk) program re-reads its chunk and writes (exp(x - lse) - onehot) * g
The partial buffers are tiny (B x chunks fp32), so traffic stays ~6*B*V bytes like a two-pass
row kernel, with B * chunks programs in flight instead of B.
"""
import torch
import triton
import triton.language as tl

BLOCK_V = 1024  # tune: 256, 512, 1024, 2048, 4096
TILES_PER_CHUNK = 4  # tune: 1, 2, 4, 8, 16
NUM_WARPS = 4  # tune: 2, 4, 8, 16


@triton.jit
def _chunk_stats_kernel(logits_ptr, m_ptr, s_ptr, V, stride_x, n_chunks,
                        BLOCK: tl.constexpr, TILES: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    x_row = logits_ptr + row * stride_x
    cols = tl.arange(0, BLOCK)
    chunk_start = chunk * (BLOCK * TILES)
    m = tl.full([BLOCK], -1e30, tl.float32)  # finite, so exp(m_old - m_new) never sees inf - inf
    s = tl.zeros([BLOCK], tl.float32)
    for i in range(TILES):
        idx = chunk_start + i * BLOCK + cols
        x = tl.load(x_row + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp2((m - m_new) * LOG2E) + tl.exp2((x - m_new) * LOG2E)
        m = m_new
    m_c = tl.max(m, axis=0)
    s_c = tl.sum(s * tl.exp2((m - m_c) * LOG2E), axis=0)
    tl.store(m_ptr + row * n_chunks + chunk, m_c)
    tl.store(s_ptr + row * n_chunks + chunk, s_c)


@triton.jit
def _combine_kernel(logits_ptr, targets_ptr, m_ptr, s_ptr, lse_ptr, losses_ptr,
                    stride_x, n_chunks, N_CHUNKS_P2: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, N_CHUNKS_P2)
    valid = c < n_chunks
    m_c = tl.load(m_ptr + row * n_chunks + c, mask=valid, other=-1e30)
    s_c = tl.load(s_ptr + row * n_chunks + c, mask=valid, other=0.0)
    m_row = tl.max(m_c, axis=0)
    lse = m_row + tl.log(tl.sum(s_c * tl.exp(m_c - m_row), axis=0))
    tl.store(lse_ptr + row, lse)
    t = tl.load(targets_ptr + row)
    x_t = tl.load(logits_ptr + row * stride_x + t).to(tl.float32)
    tl.store(losses_ptr + row, lse - x_t)


@triton.jit
def _chunk_grad_kernel(logits_ptr, targets_ptr, grad_out_ptr, lse_ptr, grad_ptr,
                       V, stride_x, stride_g, BLOCK: tl.constexpr, TILES: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    x_row = logits_ptr + row * stride_x
    g_row = grad_ptr + row * stride_g
    cols = tl.arange(0, BLOCK)
    chunk_start = chunk * (BLOCK * TILES)
    lse = tl.load(lse_ptr + row)
    t = tl.load(targets_ptr + row)
    g = tl.load(grad_out_ptr + row)
    for i in range(TILES):
        idx = chunk_start + i * BLOCK + cols
        mask = idx < V
        x = tl.load(x_row + idx, mask=mask, other=float("-inf")).to(tl.float32)
        p = tl.exp2((x - lse) * LOG2E)
        grad = (p - tl.where(idx == t, 1.0, 0.0)) * g
        tl.store(g_row + idx, grad.to(tl.bfloat16), mask=mask)


def custom_kernel(data):
    logits, targets, grad_output = data
    logits, targets, grad_output = logits.contiguous(), targets.contiguous(), grad_output.contiguous()
    B, V = logits.shape
    dev = logits.device
    n_chunks = triton.cdiv(V, BLOCK_V * TILES_PER_CHUNK)
    m_part = torch.empty(B, n_chunks, dtype=torch.float32, device=dev)
    s_part = torch.empty(B, n_chunks, dtype=torch.float32, device=dev)
    lse = torch.empty(B, dtype=torch.float32, device=dev)
    losses = torch.empty(B, dtype=torch.float32, device=dev)
    grad = torch.empty_like(logits)

    _chunk_stats_kernel[(B, n_chunks)](
        logits, m_part, s_part, V, logits.stride(0), n_chunks,
        BLOCK=BLOCK_V, TILES=TILES_PER_CHUNK, num_warps=NUM_WARPS,
    )
    _combine_kernel[(B,)](
        logits, targets, m_part, s_part, lse, losses, logits.stride(0), n_chunks,
        N_CHUNKS_P2=max(triton.next_power_of_2(n_chunks), 2), num_warps=1,
    )
    _chunk_grad_kernel[(B, n_chunks)](
        logits, targets, grad_output, lse, grad, V, logits.stride(0), grad.stride(0),
        BLOCK=BLOCK_V, TILES=TILES_PER_CHUNK, num_warps=NUM_WARPS,
    )
    return losses, grad
