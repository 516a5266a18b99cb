"""Cross-entropy through torch.compile: inductor fuses the math into generated C++ loops.

The function below is the math of the seed written once, as plain tensor operations; torch.compile
traces it and inductor, its CPU backend, fuses the reductions (row max, sum of exponentials) and
the elementwise tail (softmax, minus the one-hot, times the upstream gradient, the cast to bf16)
into a few C++ loops over each row, vectorised with at::vec, compiled by the machine's C++
compiler when the kernel is first called. That first call costs tens of seconds (tracing, code
generation, g++), in the measurement's correctness calls; the timed calls run the compiled code.

Inductor's choices, as `# tune:` constants:
  DYNAMIC   1: one kernel for every shape (sizes are arguments; guards check less, loops know
            less); 0: a kernel specialised to each shape, compiled again for every new shape.
  SIMDLEN   the vector width inductor writes its loops for, in bits (0: its own pick, the widest
            the CPU has; 256: AVX2 on an AVX-512 machine).
  ONEHOT    how the one-hot term is formed: 1 a comparison with an index row (fused into the
            elementwise loop), 0 a scatter after the loop (a second kernel, one element a row).
"""
import torch
import torch._inductor.config as inductor_config

DYNAMIC = 1  # tune: 0, 1
SIMDLEN = 0  # tune: 0, 256, 512
ONEHOT = 1  # tune: 0, 1

inductor_config.cpp.simdlen = SIMDLEN or None


def _cross_entropy(logits, targets, grad_output):
    x = logits.float()
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    losses = (m + torch.log(s)).squeeze(1) - x.gather(1, targets[:, None]).squeeze(1)
    g = grad_output[:, None]
    if ONEHOT:
        cols = torch.arange(x.shape[1], device=x.device)
        grad = (e / s - (cols[None, :] == targets[:, None]).float()) * g
    else:
        grad = (e / s) * g
        grad = grad.scatter_add(1, targets[:, None], -g)
    return losses, grad.to(torch.bfloat16)


_compiled = torch.compile(_cross_entropy, dynamic=bool(DYNAMIC), fullgraph=True)


def custom_kernel(data):
    logits, targets, grad_output = data
    return _compiled(logits, targets, grad_output)
