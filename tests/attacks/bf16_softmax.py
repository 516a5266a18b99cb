"""Round 4, correctness with too little power (class A3 of docs/MEASUREMENT.md): an honest-looking
kernel that computes its log-sum-exp and softmax in bf16, where the contract says fp32. On plain
random logits it stays within the 1e-2 tolerance; on logits shifted far from zero (the contract
announces shifts up to +-1000) a bf16 log-sum-exp keeps two or three significant digits, and its
losses miss by up to a whole unit. Under 4.0 it got `ok` (1.14-1.21x) in 3 of 22 measurements:
each case was checked on one or two seeds. Now every check case, the shifted ones among them, is
checked on several seeds, and every timed call against the twin's outputs."""
import torch


def custom_kernel(data):
    logits, targets, grad_output = data
    x = logits  # bf16 throughout: the contract says fp32
    lse = torch.logsumexp(x, dim=-1)
    losses = (lse - x.gather(1, targets[:, None]).squeeze(1)).float()
    grad = torch.softmax(x, dim=-1)
    rows = torch.arange(grad.shape[0])
    grad[rows, targets] -= 1.0
    grad = grad * grad_output[:, None].to(torch.bfloat16)
    return losses, grad.to(torch.bfloat16)
