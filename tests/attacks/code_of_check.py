"""Class 1: replace the checker's and the reference's code objects (no attribute changes, so an
attribute fingerprint cannot see it), then return garbage instantly."""
import importlib

import torch

_check = importlib.import_module("tasks._check")
_task = importlib.import_module("tasks.cross_entropy")


def _always_ok(output, expected, rtol, atol, names=None):
    return True, "ok"


def _instant(data):
    logits, targets, _ = data
    return torch.zeros(len(targets)), torch.zeros_like(logits)


_check.compare_outputs.__code__ = _always_ok.__code__
_task.reference.__code__ = _instant.__code__


def custom_kernel(data):
    logits, targets, _ = data
    return torch.zeros(len(targets)), torch.zeros_like(logits)
