"""Class 2: at import, compute the answers for the seeds a harness with constant seeds would use,
then answer from that table (and with garbage for anything else)."""
import torch

from tasks.cross_entropy import CPU_CASES, CPU_CHECK_CASES, generate_input, reference

_table = {}
for _case in CPU_CASES + CPU_CHECK_CASES:
    for _seed in list(range(0, 16)) + list(range(100, 110)) + list(range(200, 220)) + [1000, 1001, 1002, 2000, 2001, 2002]:
        _data = generate_input(_case, _seed)
        _table[float(_data[0].float().sum())] = reference(_data)


def custom_kernel(data):
    logits, targets, _ = data
    hit = _table.get(float(logits.float().sum()))
    return hit if hit is not None else (torch.zeros(len(targets)), torch.zeros_like(logits))
