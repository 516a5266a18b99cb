"""gdn_chunk_fwd_o through torch.compile: the decay mask, scaling and layout fused by Inductor.

Inductor folds the reference's elementwise chain (the masked difference, the exp, the second
mask, the multiply with the scores, exp(g) times the inter-chunk term, the sum and the scale)
into a few generated C++ loops, and the permutes into the operand and result copies, around the
three matmuls, which it calls as external kernels. The remaining cost is the compiled call's own
overhead (guards and a wrapper, tens of microseconds). Choices:
  CPP_WRAPPER  1: the wrapper is compiled C++; 0: Inductor's Python wrapper;
  SIMDLEN      vector width of the generated loops (0: the machine's; 1: scalar; 256; 512).
The first call of each shape compiles (tens of seconds).
"""
import torch

CHUNK = 64
CPP_WRAPPER = 0  # tune: 0, 1
SIMDLEN = 0  # tune: 0, 1, 256, 512


def _tiles(x):
    B, T, H, D = x.shape
    return x.reshape(B, T // CHUNK, CHUNK, H, D).permute(0, 1, 3, 2, 4)


def _chunk_fwd_o(q, k, v_new, h, g):
    scale = q.shape[-1] ** -0.5
    qc, kc, vc = _tiles(q), _tiles(k), _tiles(v_new)
    gc = _tiles(g.unsqueeze(-1)).squeeze(-1)
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    diff = gc.unsqueeze(-1) - gc.unsqueeze(-2)
    decay = torch.exp(diff.masked_fill(~causal, 0.0)).masked_fill(~causal, 0.0)
    inter = (qc @ h) * torch.exp(gc).unsqueeze(-1)
    intra = ((qc @ kc.transpose(-1, -2)) * decay) @ vc
    o = scale * (inter + intra)
    B, NT, H, C, V = o.shape
    return o.permute(0, 1, 3, 2, 4).reshape(B, NT * C, H, V).contiguous()


_compiled = torch.compile(_chunk_fwd_o, dynamic=False, fullgraph=True, options={
    "cpp_wrapper": bool(CPP_WRAPPER),
    "cpp.simdlen": SIMDLEN or None,
})


def custom_kernel(data):
    return _compiled(*data)
