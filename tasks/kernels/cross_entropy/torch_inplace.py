"""Cross-entropy in plain PyTorch with fewer full passes than the seed.

The seed runs logsumexp and softmax separately (each re-reads the fp32 logits) and builds the
one-hot term with a scatter. Here the fp32 copy is made once, logsumexp is computed once, and the
softmax is formed *in place* from it (x - lse, exp), then the target column is corrected and the
row scaled, all on the same buffer; only the final cast to bf16 allocates. No Triton: it runs at
full speed on CPU and on GPU alike.
"""
import torch


def custom_kernel(data):
    logits, targets, grad_output = data
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    rows = torch.arange(x.shape[0], device=x.device)
    losses = lse - x[rows, targets]
    x.sub_(lse[:, None]).exp_()          # softmax, in place
    x[rows, targets] -= 1.0              # minus the one-hot
    x.mul_(grad_output[:, None])
    return losses, x.to(torch.bfloat16)
