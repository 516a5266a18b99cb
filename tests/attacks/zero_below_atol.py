"""Round 3, correctness the checker cannot see: every gradient element whose true value is below
the task's absolute tolerance (1e-3) is written as 0 (a kernel that skips the exponentials of the
logits far below each row's maximum ends up there). Each such element is within atol of its true
value, so an elementwise allclose passes it, though it is wrong by 100% in most elements."""
import torch

from tasks.cross_entropy import ATOL, reference


def custom_kernel(data):
    losses, grad = reference(data)
    return losses, torch.where(grad.float().abs() < ATOL, torch.zeros_like(grad), grad)
