"""Seed kernel for cross_entropy: the PyTorch reference wrapped as custom_kernel (speedup ~1).

losses = logsumexp(logits) - logits[target], grad = (softmax(logits) - onehot(target)) * grad_output,
all in fp32; only the returned gradient is rounded to bf16. PyTorch runs this as several kernels
(upcast, logsumexp, gather, softmax, scatter, scale, downcast), each a full pass over B*V values.
"""
import torch


def custom_kernel(data):
    logits, targets, grad_output = data
    x = logits.float()
    losses = torch.logsumexp(x, dim=-1) - x.gather(1, targets[:, None]).squeeze(1)
    grad = torch.softmax(x, dim=-1)
    del x
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets] -= 1.0
    grad.mul_(grad_output[:, None])  # in place, as the reference: a seed that allocated here ran 3-5% slower on CPU
    return losses, grad.to(torch.bfloat16)
