"""gdn_recompute_w_u through torch.compile: Inductor fuses the scaling and the layout copies.

Inductor turns the reference's permutes, exp, and the two scalings into generated C++ loops that
write the matmuls' operands directly in tile order (one fused kernel instead of several eager
ops), calls the two batched matmuls as external kernels (mkl/oneDNN), and writes the results back
token-major. The rest is overhead: a compiled call still pays guard checks and a wrapper
(tens of microseconds), which at the CPU shapes is as large as the work. Choices:
  CPP_WRAPPER  1: the wrapper is compiled C++; 0: Inductor's Python wrapper;
  SIMDLEN      vector width of the generated loops (0: the machine's; 1: scalar; 256; 512).
The first call compiles (tens of seconds).
"""
import torch

CHUNK = 64
CPP_WRAPPER = 0  # tune: 0, 1
SIMDLEN = 0  # tune: 0, 1, 256, 512


def _tiles(x):
    B, T, H, D = x.shape
    return x.reshape(B, T // CHUNK, CHUNK, H, D).permute(0, 1, 3, 2, 4)


def _untile(x):
    B, NT, H, C, D = x.shape
    return x.permute(0, 1, 3, 2, 4).reshape(B, NT * C, H, D).contiguous()


def _recompute(k, v, beta, A, g):
    kc, vc, Ac = _tiles(k), _tiles(v), _tiles(A)
    bc, gc = _tiles(beta.unsqueeze(-1)).squeeze(-1), _tiles(g.unsqueeze(-1)).squeeze(-1)
    w = Ac @ (kc * (bc * torch.exp(gc)).unsqueeze(-1))
    u = Ac @ (vc * bc.unsqueeze(-1))
    return _untile(w), _untile(u)


_compiled = torch.compile(_recompute, dynamic=False, fullgraph=True, options={
    "cpp_wrapper": bool(CPP_WRAPPER),
    "cpp.simdlen": SIMDLEN or None,
})


def custom_kernel(data):
    w, u = _compiled(*data)
    return w, u
