"""TriMul with two fused Triton kernels around one batched matmul.

The PyTorch seed runs ~15 kernels, each a round trip of a [bs, N, N, hidden] tensor through
memory. Here:
  1. _ln_proj_kernel: one program per (BLOCK_M rows of x) x (BLOCK_H hidden channels) computes the
     input LayerNorm on the fly and all five projections with tl.dot, applies mask and sigmoid
     gates in registers, and writes left and right already transposed to [bs, hidden, N, N] (so
     the triangle einsum is a plain batched matmul) and the output gate as [bs*N*N, hidden].
     x is read once per hidden block instead of five times plus a LayerNorm pass.
  2. the triangle einsum out[b,d,i,j] = sum_k left[b,d,i,k] * right[b,d,j,k] as torch.matmul
     (bs*hidden [N, N] @ [N, N]^T products: the N^3 part, left to the vendor GEMM).
  3. _ln_gate_out_kernel: LayerNorm over hidden, the output gate and the projection back to dim,
     fused: the [bs, N, N, hidden] intermediate is read once and only the output is written.
tl.dot on fp32 operands uses TF32 tensor cores on the GPU (well inside the 2e-2 tolerance after
the LayerNorms); the interpreter computes it in full fp32.
"""
import torch
import triton
import triton.language as tl

BLOCK_M = 64  # tune: 16, 32, 64, 128
BLOCK_H = 32  # tune: 16, 32, 64
BLOCK_K = 32  # tune: 16, 32
NUM_WARPS = 8  # tune: 2, 4, 8
OUT_BLOCK_M = 64  # tune: 16, 32, 64, 128
OUT_BLOCK_D = 64  # tune: 32, 64
OUT_NUM_WARPS = 8  # tune: 2, 4, 8


@triton.jit
def _ln_proj_kernel(x_ptr, mask_ptr, nw_ptr, nb_ptr, wl_ptr, wr_ptr, wlg_ptr, wrg_ptr, wog_ptr,
                    left_ptr, right_ptr, gate_ptr, M, NN, DIM, HIDDEN, eps,
                    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    # hidden blocks vary fastest in launch order, so the programs sharing a tile of x run
    # together and all but the first find it in L2
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rmask = rows < M
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hs < HIDDEN
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows[:, None] * DIM

    # LayerNorm statistics in two sweeps (mean, then centred variance): Cauchy rows hold values
    # near 1e7, where E[x^2] - mean^2 would lose the variance of the ordinary entries.
    acc = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(0, DIM, BLOCK_K):
        kk = k0 + ks
        x = tl.load(x_rows + kk[None, :], mask=rmask[:, None] & (kk[None, :] < DIM), other=0.0)
        acc += tl.sum(x, axis=1)
    mean = acc / DIM
    acc = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(0, DIM, BLOCK_K):
        kk = k0 + ks
        km = rmask[:, None] & (kk[None, :] < DIM)
        x = tl.load(x_rows + kk[None, :], mask=km, other=0.0)
        d = tl.where(km, x - mean[:, None], 0.0)
        acc += tl.sum(d * d, axis=1)
    rstd = 1.0 / tl.sqrt(acc / DIM + eps)

    p_left = tl.zeros([BLOCK_M, BLOCK_H], tl.float32)
    p_right = tl.zeros([BLOCK_M, BLOCK_H], tl.float32)
    g_left = tl.zeros([BLOCK_M, BLOCK_H], tl.float32)
    g_right = tl.zeros([BLOCK_M, BLOCK_H], tl.float32)
    g_out = tl.zeros([BLOCK_M, BLOCK_H], tl.float32)
    for k0 in range(0, DIM, BLOCK_K):
        kk = k0 + ks
        kmask = kk < DIM
        x = tl.load(x_rows + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0)
        nb = tl.load(nb_ptr + kk, mask=kmask, other=0.0)
        z = (x - mean[:, None]) * rstd[:, None] * nw[None, :] + nb[None, :]
        z = tl.where(kmask[None, :], z, 0.0)
        # nn.Linear weights are [hidden, dim]; read the [BLOCK_K, BLOCK_H] tile of W^T
        w_off = hs[None, :] * DIM + kk[:, None]
        w_mask = hmask[None, :] & kmask[:, None]
        p_left += tl.dot(z, tl.load(wl_ptr + w_off, mask=w_mask, other=0.0))
        p_right += tl.dot(z, tl.load(wr_ptr + w_off, mask=w_mask, other=0.0))
        g_left += tl.dot(z, tl.load(wlg_ptr + w_off, mask=w_mask, other=0.0))
        g_right += tl.dot(z, tl.load(wrg_ptr + w_off, mask=w_mask, other=0.0))
        g_out += tl.dot(z, tl.load(wog_ptr + w_off, mask=w_mask, other=0.0))

    keep = tl.load(mask_ptr + rows, mask=rmask, other=0.0)
    left = p_left * keep[:, None] * tl.sigmoid(g_left)
    right = p_right * keep[:, None] * tl.sigmoid(g_right)
    out_mask = rmask[:, None] & hmask[None, :]
    # row r = (b, i, k) with p = i*N + k; transposed layout [b, h, i, k]
    b = rows // NN
    p = rows - b * NN
    t_off = b[:, None] * HIDDEN * NN + hs[None, :].to(tl.int64) * NN + p[:, None]
    tl.store(left_ptr + t_off, left, mask=out_mask)
    tl.store(right_ptr + t_off, right, mask=out_mask)
    tl.store(gate_ptr + rows[:, None] * HIDDEN + hs[None, :], tl.sigmoid(g_out), mask=out_mask)


@triton.jit
def _ln_gate_out_kernel(prod_ptr, gate_ptr, onw_ptr, onb_ptr, wo_ptr, out_ptr, M, NN, DIM, eps,
                        HIDDEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rmask = rows < M
    hs = tl.arange(0, HIDDEN)
    b = rows // NN
    p = rows - b * NN
    # prod is [b, h, i, j]: consecutive rows are consecutive j, so loads coalesce along rows
    t = tl.load(prod_ptr + b[:, None] * HIDDEN * NN + hs[None, :].to(tl.int64) * NN + p[:, None],
                mask=rmask[:, None], other=0.0)
    mean = tl.sum(t, axis=1) / HIDDEN
    c = t - mean[:, None]
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / HIDDEN + eps)
    y = c * rstd[:, None] * tl.load(onw_ptr + hs)[None, :] + tl.load(onb_ptr + hs)[None, :]
    y = y * tl.load(gate_ptr + rows[:, None] * HIDDEN + hs[None, :], mask=rmask[:, None], other=0.0)
    for d0 in range(0, DIM, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        dmask = ds < DIM
        w = tl.load(wo_ptr + ds[None, :] * HIDDEN + hs[:, None], mask=dmask[None, :], other=0.0)
        o = tl.dot(y, w)
        tl.store(out_ptr + rows[:, None] * DIM + ds[None, :], o, mask=rmask[:, None] & dmask[None, :])


def custom_kernel(data):
    x, mask, w, config = data
    dim, hidden = int(config["dim"]), int(config["hidden_dim"])
    bs, N = x.shape[0], x.shape[1]
    assert hidden == triton.next_power_of_2(hidden), "hidden_dim must be a power of two"
    x = x.contiguous()
    keep = mask.to(torch.float32).contiguous()
    M, NN = bs * N * N, N * N
    dev = x.device
    left = torch.empty(bs, hidden, N, N, dtype=torch.float32, device=dev)
    right = torch.empty_like(left)
    gate = torch.empty(M, hidden, dtype=torch.float32, device=dev)
    weights = [w[k].contiguous() for k in ("left_proj.weight", "right_proj.weight",
                                           "left_gate.weight", "right_gate.weight", "out_gate.weight")]
    # Rows on axis 0: CUDA allows 2^31 - 1 programs there but only 65,535 on axes 1 and 2, and
    # M = bs * N * N reaches 2^20 (N = 1024), i.e. 65,536 blocks of 16 rows.
    _ln_proj_kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(hidden, BLOCK_H))](
        x, keep, w["norm.weight"].contiguous(), w["norm.bias"].contiguous(), *weights,
        left, right, gate, M, NN, dim, hidden, 1e-5,
        BLOCK_M=BLOCK_M, BLOCK_H=BLOCK_H, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
    )
    prod = torch.matmul(left, right.transpose(-1, -2))  # [bs, hidden, i, j]
    del left, right
    out = torch.empty(bs, N, N, dim, dtype=torch.float32, device=dev)
    _ln_gate_out_kernel[(triton.cdiv(M, OUT_BLOCK_M),)](
        prod, gate, w["to_out_norm.weight"].contiguous(), w["to_out_norm.bias"].contiguous(),
        w["to_out.weight"].contiguous(), out, M, NN, dim, 1e-5,
        HIDDEN=hidden, BLOCK_M=OUT_BLOCK_M, BLOCK_D=OUT_BLOCK_D, num_warps=OUT_NUM_WARPS,
    )
    return out
