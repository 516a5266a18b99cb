"""gdn_chunk_fwd_h through torch.compile: the chunk loop unrolled into one graph.

With the shapes static, Dynamo traces the reference's Python loop into a straight-line graph of
NT chunks, and Inductor fuses each chunk's elementwise work (the subtraction, the exps, the
scaling of v_new, the decay-and-add of the state, the stores into h and v_new) into generated C++
loops around the matmuls, which it calls as external kernels. One compiled call replaces the
reference's few dozen eager dispatches; what remains is the compiled call's own overhead
(guards and a wrapper, tens of microseconds). Choices:
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


def _untile(x):
    B, NT, H, C, D = x.shape
    return x.permute(0, 1, 3, 2, 4).reshape(B, NT * C, H, D).contiguous()


def _chunk_fwd_h(k, w, u, g, initial_state):
    kc, wc, uc = _tiles(k), _tiles(w), _tiles(u)
    gc = _tiles(g.unsqueeze(-1)).squeeze(-1)
    NT = kc.shape[1]
    states, v_news = [], []
    state = initial_state
    for c in range(NT):
        states.append(state)
        v_new = uc[:, c] - wc[:, c] @ state
        v_news.append(v_new)
        g_last = gc[:, c, :, -1]
        to_end = torch.exp(g_last.unsqueeze(-1) - gc[:, c])
        state = (state * torch.exp(g_last)[..., None, None]
                 + kc[:, c].transpose(-1, -2) @ (v_new * to_end.unsqueeze(-1)))
    return torch.stack(states, dim=1), _untile(torch.stack(v_news, dim=1))


_compiled = torch.compile(_chunk_fwd_h, dynamic=False, fullgraph=True, options={
    "cpp_wrapper": bool(CPP_WRAPPER),
    "cpp.simdlen": SIMDLEN or None,
})


def custom_kernel(data):
    h, v_new = _compiled(*data)
    return h, v_new
