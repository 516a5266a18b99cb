"""trimul with the triangle product as a broadcast multiply and a sum: no matmul, and much slower.

The idea: einsum('bikd,bjkd->bijd') is "multiply every left row i with every right row j and sum
over k", so write it literally as (left[:, :, None] * right[:, None, :]).sum(3): one broadcast
elementwise multiply and one reduction, no permutes, no batched matmul with its layout changes.
The rest is the reference.

It loses badly, because the broadcast product is materialised: a [bs, N, N, N, hidden] tensor,
N times larger than either operand (16 MB at N = 32, 2^30 elements at N = 1024), written and
read back once, where a matmul keeps its partial sums in registers. The multiply-adds are the
same N^3 * hidden; the memory traffic is N times the matmul's, and it never fits in cache.
"""
import torch
import torch.nn.functional as F


def custom_kernel(data):
    x, mask, w, config = data
    dim, hidden = config["dim"], config["hidden_dim"]
    z = F.layer_norm(x, (dim,), w["norm.weight"], w["norm.bias"])
    keep = mask[..., None]
    left = F.linear(z, w["left_proj.weight"]) * keep * torch.sigmoid(F.linear(z, w["left_gate.weight"]))
    right = F.linear(z, w["right_proj.weight"]) * keep * torch.sigmoid(F.linear(z, w["right_gate.weight"]))
    out = (left.unsqueeze(2) * right.unsqueeze(1)).sum(3)                 # [bs, N, N, hidden]
    out = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    out = out * torch.sigmoid(F.linear(z, w["out_gate.weight"]))
    return F.linear(out, w["to_out.weight"]).contiguous()
