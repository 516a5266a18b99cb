"""Round 3, correctness the checker cannot see, for fp8_quant (run with task fp8_quant): the
quantised values x_q, float32 in the task's contract, returned as float16. A checker that casts
both sides to fp32 before comparing lets it through; on a GPU half the bytes written is most of
a 1.33x "speedup" of a memory-bound kernel."""
from tasks.fp8_quant import reference


def custom_kernel(data):
    x_q, scales = reference(data)
    return x_q.half(), scales
