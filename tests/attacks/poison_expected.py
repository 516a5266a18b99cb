"""From pygpubench's exploits (gc_nan, combined): find the expected outputs in the candidate's own
process through the garbage collector (any float tensor shaped like an output) and fill them
with NaN, which that harness's checker took as "anything goes"; then return zeros. Here the
expected outputs never exist in the candidate's process, and a NaN must match a NaN exactly."""
import importlib

import torch

_gc = importlib.import_module("gc")


def custom_kernel(data):
    logits, targets, _ = data
    for obj in getattr(_gc, "get_" + "objects")():
        if isinstance(obj, torch.Tensor) and obj.is_floating_point() and obj is not logits:
            try:
                obj.fill_(float("nan"))
            except RuntimeError:
                pass
    return torch.zeros(len(targets)), torch.zeros_like(logits)
