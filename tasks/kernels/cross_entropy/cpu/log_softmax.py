"""Cross-entropy from one log_softmax: PyTorch's fused row kernel does the reductions once.

The seed computes logsumexp and softmax separately, each reading the fp32 copy of the logits and
each reducing every row again, then fixes the target column with a scatter. Here one call to
log_softmax (a single ATen kernel: row max, sum of exponentials and the normalised output, in
vectorised C++) gives log p; the loss is -log p at the target, and the gradient is exp(log p)
scaled by the upstream gradient, with g subtracted at the target in place. Four full passes over
B*V values instead of about eight, and no logsumexp or softmax dispatched twice.
"""
import torch


def custom_kernel(data):
    logits, targets, grad_output = data
    logp = torch.log_softmax(logits.float(), dim=-1)
    rows = torch.arange(logits.shape[0])
    losses = -logp[rows, targets]
    grad = logp.exp_().mul_(grad_output[:, None])
    grad[rows, targets] -= grad_output
    return losses, grad.to(torch.bfloat16)
