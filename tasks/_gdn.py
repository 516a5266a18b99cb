"""Gated DeltaNet chunked forward pass: the math shared by the three GDN tasks.

Gated DeltaNet (Yang et al., ICLR 2025) keeps a [K, V] state S per (batch, head) and updates it
token by token with a decay alpha_t = exp(log_decay_t) and a delta-rule write of strength beta_t:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,      o_t = scale * S_t^T q_t

The chunked form (chunk C = 64 tokens) is what GPU kernels compute, in three kernels that the paper
uses as three separate GPU MODE tasks:

    recompute_w_u   per chunk, u = A @ (v * beta) and w = A @ (k * beta * exp(g)), where A is
                    the inverse of (I + strictly-lower(beta_i k_i.k_j exp(g_i - g_j))): the WY form
    chunk_fwd_h     the sequential part: walk the chunks, store the state at each chunk start,
                    v_new = u - w @ h, then decay the state and add k^T @ (v_new * exp(g_last - g))
    chunk_fwd_o     o = scale * (exp(g) * (q @ h) + (causal(q k^T * exp(g_i - g_j))) @ v_new)

Here g is the *chunk-local* cumulative sum of the per-token log-decays (it restarts at every chunk),
so exp(g_i - g_j) is the decay between tokens j <= i of one chunk.

Layouts follow flash-linear-attention and GPU MODE: tokens-major [B, T, H, D] for q, k, v, w, u,
v_new, o; [B, T, H] for beta and g; A is [B, T, H, 64] (row t holds chunk row t % 64); the chunk
states h are [B, NT, H, K, V] with NT = T / 64 and h[:, c] the state *before* chunk c.

`make_inputs` runs the whole pipeline from random base tensors, so every task's inputs are the
real intermediate tensors of a Gated DeltaNet forward pass (consistent with each other, for one
seed, across the three tasks). The functions are dtype-generic: the pipeline runs them in float64
and hands fp32 tensors to the tasks, whose references run them in fp32.
"""
import torch
import torch.nn.functional as F

CHUNK = 64
RTOL = ATOL = 1e-3  # the paper's tolerance for the GDN tasks

# Per-token log-decays. "logsigmoid" is GPU MODE's choice: mean about -0.8 per token, so a state
# decays by about e^-50 over a chunk and only the last few tokens of a chunk reach the next one.
# "slow" divides it by 32 (about 0.2 of the state survives a chunk), so bugs in how the state is
# carried between chunks, and in early-token terms, show up in the outputs.
GATES = ("logsigmoid", "slow")


def to_chunks(x):
    """[B, T, H, D] -> [B, NT, H, C, D]: one [C, D] tile per (batch, chunk, head)."""
    B, T, H, D = x.shape
    return x.reshape(B, T // CHUNK, CHUNK, H, D).permute(0, 1, 3, 2, 4)


def from_chunks(x):
    """[B, NT, H, C, D] -> [B, T, H, D], contiguous."""
    B, NT, H, C, D = x.shape
    return x.permute(0, 1, 3, 2, 4).reshape(B, NT * C, H, D).contiguous()


def scalar_chunks(x):
    """[B, T, H] -> [B, NT, H, C] for per-token scalars (beta, g)."""
    return to_chunks(x.unsqueeze(-1)).squeeze(-1)


def causal_decay(g_chunks, strict):
    """exp(g_i - g_j) on the (strictly) lower triangle of each chunk, 0 above it.

    The difference is masked *before* exp: above the diagonal g_i - g_j is positive and can reach
    hundreds, where exp overflows to inf and inf * 0 would be NaN.
    """
    C = g_chunks.shape[-1]
    keep = torch.ones(C, C, dtype=torch.bool, device=g_chunks.device).tril(-1 if strict else 0)
    diff = g_chunks.unsqueeze(-1) - g_chunks.unsqueeze(-2)
    return torch.exp(diff.masked_fill(~keep, 0.0)).masked_fill(~keep, 0.0)


def wy_matrix(k, beta, g):
    """A = (I + strictly-lower(beta_i k_i.k_j exp(g_i - g_j)))^-1 per chunk, as [B, T, H, C]."""
    kc, bc, gc = to_chunks(k), scalar_chunks(beta), scalar_chunks(g)
    lower = (kc @ kc.transpose(-1, -2)) * bc.unsqueeze(-1) * causal_decay(gc, strict=True)
    eye = torch.eye(CHUNK, dtype=k.dtype, device=k.device).expand_as(lower)
    return from_chunks(torch.linalg.solve_triangular(eye + lower, eye, upper=False))


def recompute_w_u(k, v, beta, A, g):
    """w = A @ (k * beta * exp(g)), u = A @ (v * beta), chunk by chunk."""
    kc, vc, Ac = to_chunks(k), to_chunks(v), to_chunks(A)
    bc, gc = scalar_chunks(beta), scalar_chunks(g)
    w = Ac @ (kc * (bc * torch.exp(gc)).unsqueeze(-1))
    u = Ac @ (vc * bc.unsqueeze(-1))
    return from_chunks(w), from_chunks(u)


def chunk_fwd_h(k, w, u, g, initial_state):
    """The sequential recurrence over chunks: (h [B, NT, H, K, V], v_new [B, T, H, V])."""
    kc, wc, uc, gc = to_chunks(k), to_chunks(w), to_chunks(u), scalar_chunks(g)
    B, NT, H, C, K = kc.shape
    V = uc.shape[-1]
    h = torch.empty(B, NT, H, K, V, dtype=k.dtype, device=k.device)
    v_new = torch.empty_like(uc)
    state = initial_state
    for c in range(NT):
        h[:, c] = state
        v_new[:, c] = uc[:, c] - wc[:, c] @ state
        g_last = gc[:, c, :, -1]                                   # [B, H]
        to_end = torch.exp(g_last.unsqueeze(-1) - gc[:, c])        # decay from token t to chunk end
        state = (state * torch.exp(g_last)[..., None, None]
                 + kc[:, c].transpose(-1, -2) @ (v_new[:, c] * to_end.unsqueeze(-1)))
    return h, from_chunks(v_new)


def chunk_fwd_o(q, k, v_new, h, g, scale):
    """o = scale * (exp(g) * (q @ h) + causal(q k^T * exp(g_i - g_j)) @ v_new), per chunk."""
    qc, kc, vc, gc = to_chunks(q), to_chunks(k), to_chunks(v_new), scalar_chunks(g)
    inter = (qc @ h) * torch.exp(gc).unsqueeze(-1)                 # what earlier chunks left in h
    intra = ((qc @ kc.transpose(-1, -2)) * causal_decay(gc, strict=False)) @ vc
    return from_chunks(scale * (inter + intra))


def check_case(case):
    """Raise ValueError for a case this formulation cannot take (T must be a multiple of 64)."""
    missing = [key for key in ("B", "T", "H", "K", "V") if key not in case]
    if missing:
        raise ValueError(f"GDN case {case} lacks {missing}; give B, T, H, K, V")
    if case["T"] % CHUNK or case["T"] <= 0:
        raise ValueError(f"GDN case T={case['T']} must be a positive multiple of the chunk size {CHUNK}")
    if case.get("gate", "logsigmoid") not in GATES:
        raise ValueError(f"GDN case gate={case['gate']!r}; choose one of {GATES}")


def make_inputs(case, seed, device="cpu"):
    """Every tensor of the forward pipeline for one case and seed, fp32 on `device`.

    Drawn on the CPU with a seeded generator (so a seed gives the same inputs on every device),
    then computed in float64 so the handed-over intermediates are accurate to fp32 rounding.
    Well-conditioned by construction: k is L2-normalised, beta in (0, 1), log-decays negative.
    """
    check_case(case)
    B, T, H, K, V = (case[key] for key in ("B", "T", "H", "K", "V"))
    gen = torch.Generator().manual_seed(int(seed))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = randn(B, T, H, K)
    k = F.normalize(randn(B, T, H, K), p=2, dim=-1)
    v = randn(B, T, H, V)
    beta = torch.sigmoid(randn(B, T, H))
    log_decay = F.logsigmoid(randn(B, T, H))
    if case.get("gate", "logsigmoid") == "slow":
        log_decay = log_decay / 32
    # A random initial state (GPU MODE allows zeros or random): with zeros, a T = 64 case would
    # give chunk_fwd_o an all-zero h, and a kernel ignoring the state would pass.
    initial_state = randn(B, H, K, V)

    g = scalar_chunks(log_decay).cumsum(-1)
    g = from_chunks(g.unsqueeze(-1)).squeeze(-1)                   # chunk-local cumsum, [B, T, H]
    A = wy_matrix(k, beta, g)
    w, u = recompute_w_u(k, v, beta, A, g)
    h, v_new = chunk_fwd_h(k, w, u, g, initial_state)
    tensors = dict(q=q, k=k, v=v, beta=beta, g=g, A=A, w=w, u=u, initial_state=initial_state,
                   h=h, v_new=v_new)
    return {name: t.to(device=device, dtype=torch.float32).contiguous() for name, t in tensors.items()}
