"""Seed kernel for trimul: the PyTorch reference wrapped as custom_kernel (speedup ~1).

AlphaFold3's outgoing triangle multiplicative update in plain PyTorch: LayerNorm, five bias-free
projections (left/right values, their sigmoid gates, the output gate), the triangle einsum
out[b,i,j,d] = sum_k left[b,i,k,d] * right[b,j,k,d], LayerNorm over hidden, output gate and the
projection back to dim. Every step is a separate kernel that round-trips [bs, N, N, *] through
memory; the einsum runs as a batched fp32 matmul over the hidden channels.
"""
import torch
import torch.nn.functional as F


def custom_kernel(data):
    x, mask, w, config = data
    dim, hidden = config["dim"], config["hidden_dim"]
    z = F.layer_norm(x, (dim,), w["norm.weight"], w["norm.bias"])
    keep = mask[..., None]
    left = z @ w["left_proj.weight"].t() * keep * torch.sigmoid(z @ w["left_gate.weight"].t())
    right = z @ w["right_proj.weight"].t() * keep * torch.sigmoid(z @ w["right_gate.weight"].t())
    # [b, i, k, d] x [b, j, k, d] -> [b, i, j, d] as bs*hidden matmuls of [N, N] @ [N, N]^T
    prod = torch.matmul(left.permute(0, 3, 1, 2), right.permute(0, 3, 2, 1)).permute(0, 2, 3, 1)
    out = F.layer_norm(prod, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    out = out * torch.sigmoid(z @ w["out_gate.weight"].t())
    return (out @ w["to_out.weight"].t()).contiguous()
