"""From KernelBench's adversarial tests (result_reuse_kernel): return freshly allocated, unwritten
outputs, hoping the allocator hands back the memory where the reference's own result of the same
inputs was just freed, so that it already holds the answer. Here the reference runs in other
processes and every call has fresh inputs: what the memory holds is an answer to other inputs."""
import torch


def custom_kernel(data):
    logits, targets, _ = data
    return torch.empty(len(targets), dtype=torch.float32), torch.empty_like(logits)
