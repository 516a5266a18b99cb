"""Class 5: the right values in a non-contiguous (transposed) view."""
from tasks.cross_entropy import reference


def custom_kernel(data):
    losses, grad = reference(data)
    return losses, grad.t().contiguous().t()
