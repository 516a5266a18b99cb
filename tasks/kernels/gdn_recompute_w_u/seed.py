"""Seed kernel for gdn_recompute_w_u: the PyTorch reference, written as a candidate.

Per chunk of 64 tokens: u = A @ (v * beta) and w = A @ (k * beta * exp(g)). Eager PyTorch
permutes the token-major [B, T, H, D] tensors into [B, NT, H, 64, D] tiles, scales them in separate
passes and runs two batched matmuls; a fused kernel reads each tile of A once for both products.
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
    k, v, beta, A, g = data
    kc, vc, Ac = _tiles(k), _tiles(v), _tiles(A)
    bc, gc = _tiles(beta.unsqueeze(-1)).squeeze(-1), _tiles(g.unsqueeze(-1)).squeeze(-1)
    w = Ac @ (kc * (bc * torch.exp(gc)).unsqueeze(-1))
    u = Ac @ (vc * bc.unsqueeze(-1))
    return _untile(w), _untile(u)
