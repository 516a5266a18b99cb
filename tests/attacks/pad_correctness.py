"""Round 3, window sizing from the candidate's own calls (and pygpubench's warm-up exploit): the
correctness calls come first and their number is known from the task's case lists (two seeds
of every timed case and of every check case). Each of them is padded with 160 ms of busy CPU, so that a
harness sizing its windows or its warm-up from the least time it has seen would give this
candidate one call per window, no warm-up, and every window a block's first. The timed calls
are the honest reference."""
import time

from tasks.cross_entropy import CPU_CASES, CPU_CHECK_CASES, reference

_calls = [0]
_CHECKED = 2 * len(CPU_CASES) + 2 * len(CPU_CHECK_CASES)


def custom_kernel(data):
    _calls[0] += 1
    if _calls[0] <= _CHECKED:
        end = time.process_time() + 0.16
        while time.process_time() < end:
            pass
    return reference(data)
