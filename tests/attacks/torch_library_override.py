"""Class 1: re-register an aten kernel the reference uses (logsumexp) so that it sleeps, while
the candidate computes the loss without it."""
import time

import torch

_lib = torch.library.Library("aten", "IMPL")
_original = torch.ops.aten.logsumexp.default


def _slow_logsumexp(x, dim, keepdim=False):
    time.sleep(0.02)
    m = x.amax(dim=dim, keepdim=True)
    out = (x - m).exp().sum(dim=dim, keepdim=True).log() + m
    return out if keepdim else out.squeeze(dim[0] if isinstance(dim, (list, tuple)) else dim)


_lib.impl("logsumexp", _slow_logsumexp, "CPU")


def custom_kernel(data):
    logits, targets, grad_output = data
    x = logits.float()
    m = x.amax(dim=-1, keepdim=True)
    e = (x - m).exp()
    s = e.sum(dim=-1, keepdim=True)
    losses = (s.log() + m).squeeze(1) - x.gather(1, targets[:, None]).squeeze(1)
    p = e / s
    p[torch.arange(len(targets)), targets] -= 1.0
    return losses, (p * grad_output[:, None]).to(torch.bfloat16)
