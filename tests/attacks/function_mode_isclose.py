"""Class 1: a torch function mode, left active, that makes every comparison the checker makes
come out true; the kernel returns garbage."""
import torch
from torch.overrides import TorchFunctionMode


class _Agree(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.isclose, torch.Tensor.isclose):
            return torch.ones_like(args[0], dtype=torch.bool)
        if func in (torch.equal, torch.allclose):
            return True
        return func(*args, **kwargs)


_mode = _Agree()
_mode.__enter__()


def custom_kernel(data):
    logits, targets, _ = data
    return torch.zeros(len(targets)), torch.zeros_like(logits)
