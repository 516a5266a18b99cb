"""gdn_chunk_fwd_h with the recurrence carried in float64: safer numerics, slower.

The idea: the state is a running sum over the whole sequence, so rounding errors of the fp32
matmuls accumulate chunk after chunk; doing the recurrence in double precision and rounding
once at the end would keep long sequences closer to the exact result. The loop is the reference's.

It loses on speed: every input is converted (a full copy each), the matmuls run in fp64 (half the
SIMD lanes, and no MKL fast path as tuned as the fp32 one), the outputs are converted back, and
the Python loop's dispatch overhead is unchanged. At the task's tolerance (1e-3) the fp32 result
was already accurate enough, so the precision bought nothing the check can see.
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
    k, w, u, g, initial_state = (t.double() for t in data)
    kc, wc, uc = _tiles(k), _tiles(w), _tiles(u)
    gc = _tiles(g.unsqueeze(-1)).squeeze(-1)
    B, NT, H, C, K = kc.shape
    V = uc.shape[-1]
    h = torch.empty(B, NT, H, K, V, dtype=torch.float32, device=k.device)
    v_new = torch.empty_like(uc)
    state = initial_state
    for c in range(NT):
        h[:, c] = state
        v_new[:, c] = uc[:, c] - wc[:, c] @ state
        g_last = gc[:, c, :, -1]
        to_end = torch.exp(g_last.unsqueeze(-1) - gc[:, c])
        state = (state * torch.exp(g_last)[..., None, None]
                 + kc[:, c].transpose(-1, -2) @ (v_new[:, c] * to_end.unsqueeze(-1)))
    return h, _untile(v_new).float()
