"""Seed kernel for gdn_chunk_fwd_o: the PyTorch reference, written as a candidate.

Per chunk of 64 tokens: o = scale * (exp(g) * (q @ h) + P @ v_new) with P the causal (diagonal
included) q k^T weighted by exp(g_i - g_j). The decay difference is masked before exp, since above
the diagonal it is positive and can overflow. Eager PyTorch materialises P and the masks in memory;
a fused kernel keeps each chunk's 64 x 64 tile on chip.
"""
import torch

CHUNK = 64


def _tiles(x):
    B, T, H, D = x.shape
    return x.reshape(B, T // CHUNK, CHUNK, H, D).permute(0, 1, 3, 2, 4)


def _untile(x):
    B, NT, H, C, D = x.shape
    return x.permute(0, 1, 3, 2, 4).reshape(B, NT * C, H, D).contiguous()


def custom_kernel(data):
    q, k, v_new, h, g = data
    scale = q.shape[-1] ** -0.5
    qc, kc, vc = _tiles(q), _tiles(k), _tiles(v_new)
    gc = _tiles(g.unsqueeze(-1)).squeeze(-1)
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    diff = gc.unsqueeze(-1) - gc.unsqueeze(-2)
    decay = torch.exp(diff.masked_fill(~causal, 0.0)).masked_fill(~causal, 0.0)
    inter = (qc @ h) * torch.exp(gc).unsqueeze(-1)
    intra = ((qc @ kc.transpose(-1, -2)) * decay) @ vc
    return _untile(scale * (inter + intra))
