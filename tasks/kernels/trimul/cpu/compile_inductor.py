"""trimul through torch.compile: Inductor fuses the elementwise chain around the matmuls.

Inductor generates C++ for the layer norms, the sigmoids, the mask products and the gate (fused
into the loops that produce or consume each matmul's operands), lowers the einsum to a bmm whose
operand permutes it writes in one fused copy, and calls the matmuls as external BLAS kernels.
So the elementwise passes and most temporaries of the eager reference go, while the matmuls,
which are most of the time on CPU, stay as fast as they were. Choices:
  CPP_WRAPPER  1: the wrapper is compiled C++; 0: Inductor's Python wrapper (a call is dozens of
               ops, so its Python overhead is small beside ~200 MFLOP of matmuls);
  SIMDLEN      vector width of the generated loops (0: the machine's; 1: scalar; 256; 512).
The first call of each shape compiles (about a minute).
"""
import torch
import torch.nn.functional as F

CPP_WRAPPER = 0  # tune: 0, 1
SIMDLEN = 0  # tune: 0, 1, 256, 512


def _trimul(x, mask, w, dim, hidden):
    z = F.layer_norm(x, (dim,), w["norm.weight"], w["norm.bias"])
    m = mask.unsqueeze(-1)
    left = F.linear(z, w["left_proj.weight"]) * m * torch.sigmoid(F.linear(z, w["left_gate.weight"]))
    right = F.linear(z, w["right_proj.weight"]) * m * torch.sigmoid(F.linear(z, w["right_gate.weight"]))
    out = torch.einsum("...ikd,...jkd->...ijd", left, right)
    out = F.layer_norm(out, (hidden,), w["to_out_norm.weight"], w["to_out_norm.bias"])
    out = out * torch.sigmoid(F.linear(z, w["out_gate.weight"]))
    return F.linear(out, w["to_out.weight"]).contiguous()


_compiled = torch.compile(_trimul, dynamic=False, fullgraph=True, options={
    "cpp_wrapper": bool(CPP_WRAPPER),
    "cpp.simdlen": SIMDLEN or None,
})


def custom_kernel(data):
    x, mask, w, config = data
    return _compiled(x, mask, w, config["dim"], config["hidden_dim"])
