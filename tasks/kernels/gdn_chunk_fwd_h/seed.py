"""Seed kernel for gdn_chunk_fwd_h: the PyTorch reference, written as a candidate.

The state [K, V] of every (batch, head) walks the chunks of 64 tokens in order: store it, correct
the chunk's values (v_new = u - w @ state), decay each token's contribution to the chunk end, then
decay the state and add k^T @ v_gated. Eager PyTorch launches several small kernels per chunk from
a Python loop; a fused kernel keeps the state in registers for the whole sequence.
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
    k, w, u, g, initial_state = data
    kc, wc, uc = _tiles(k), _tiles(w), _tiles(u)
    gc = _tiles(g.unsqueeze(-1)).squeeze(-1)
    B, NT, H, C, K = kc.shape
    V = uc.shape[-1]
    h = torch.empty(B, NT, H, K, V, dtype=k.dtype, device=k.device)
    v_new = torch.empty_like(uc)
    state = initial_state
    for c in range(NT):
        h[:, c] = state
        v_new[:, c] = uc[:, c] - wc[:, c] @ state
        g_last = gc[:, c, :, -1]
        to_end = torch.exp(g_last.unsqueeze(-1) - gc[:, c])
        state = (state * torch.exp(g_last)[..., None, None]
                 + kc[:, c].transpose(-1, -2) @ (v_new[:, c] * to_end.unsqueeze(-1)))
    return h, _untile(v_new)
