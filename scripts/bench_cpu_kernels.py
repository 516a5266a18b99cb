"""Check and time the CPU kernels of tasks/kernels/<task>/cpu/ in this process, one thread.

A quick bench for writing CPU candidates, not a measurement: measure.py (its sandbox, its paired
windows, its cold inputs) gives the figures that count, and they differ from these (docs/CPU_KERNELS.md).

Correctness: every kernel against the task's reference with the task's own `check`, on each of the
task's CPU_CASES and CPU_CHECK_CASES over several seeds, plus stress inputs of this script's own
(large scales and shifts, longer rows or sequences, the other mask dtype) that the harness's cases
do not cover. Each call's inputs are checked unchanged afterwards (the harness maps them read-only).

Timing: on each CPU_CASES shape, the reference and the kernel called alternately, the median of
many calls each, after warm-up calls (which also trigger torch.compile's first-call build).

    python scripts/bench_cpu_kernels.py --task fp8_quant            # every kernel of one task
    python scripts/bench_cpu_kernels.py --task all --seeds 5
    python scripts/bench_cpu_kernels.py --task trimul --kernel tasks/kernels/trimul/cpu/torch_bmm.py
"""
import argparse
import datetime
import glob
import importlib
import importlib.util
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from forecast_prompt import cpu_model  # noqa: E402

TASKS = ("trimul", "fp8_quant", "gdn_chunk_fwd_h", "gdn_chunk_fwd_o", "gdn_recompute_w_u")


def _scaled(index, factor, shift=0.0):
    """A stress transform: input `index` times `factor` plus `shift`, the others as drawn."""
    def transform(data):
        data = list(data)
        data[index] = data[index] * factor + shift
        return tuple(data)
    return transform


def _same(data):
    return data


# Per task: (label, case, transform of the drawn inputs). Cases beyond the task's CPU ones: larger
# magnitudes, shifts that a one-pass variance would cancel on, longer rows and sequences.
STRESS = {
    "fp8_quant": [
        ("x*1e30", {"T": 16, "H": 1024}, _scaled(0, 1e30)),
        ("x*1e-30 (all groups clamped)", {"T": 16, "H": 1024}, _scaled(0, 1e-30)),
        ("x+1000 (every value near the clamp)", {"T": 16, "H": 1024}, _scaled(0, 1.0, 1000.0)),
        ("long rows", {"T": 3, "H": 16384}, _same),
        ("mixed, 1 row", {"T": 1, "H": 4096, "distribution": "mixed"}, _same),
    ],
    "trimul": [
        ("x*1e3+1e4 (layer-norm shift)", {"N": 32, "bs": 1, "dim": 128, "hidden_dim": 128, "nomask": True,
                                          "distribution": "normal"}, _scaled(0, 1e3, 1e4)),
        ("N=64 bs=2 dim=256 int64 mask", {"N": 64, "bs": 2, "dim": 256, "hidden_dim": 128, "nomask": False,
                                          "distribution": "normal"}, _same),
        ("N=48 cauchy int64 mask", {"N": 48, "bs": 1, "dim": 128, "hidden_dim": 128, "nomask": False,
                                    "distribution": "cauchy"}, _same),
    ],
    "gdn_chunk_fwd_h": [
        ("u, state *1e3", {"B": 1, "T": 128, "H": 2, "K": 32, "V": 32},
         lambda d: (d[0], d[1], d[2] * 1e3, d[3], d[4] * 1e3)),
        ("T=512 slow gate", {"B": 1, "T": 512, "H": 2, "K": 32, "V": 32, "gate": "slow"}, _same),
        ("K=64 V=128", {"B": 1, "T": 256, "H": 4, "K": 64, "V": 128}, _same),
    ],
    "gdn_chunk_fwd_o": [
        ("q*100", {"B": 1, "T": 128, "H": 2, "K": 32, "V": 32}, _scaled(0, 100.0)),
        ("T=512 slow gate", {"B": 1, "T": 512, "H": 2, "K": 32, "V": 32, "gate": "slow"}, _same),
        ("K=64 V=128", {"B": 1, "T": 256, "H": 4, "K": 64, "V": 128}, _same),
    ],
    "gdn_recompute_w_u": [
        ("v*1e3", {"B": 1, "T": 128, "H": 2, "K": 32, "V": 32}, _scaled(1, 1e3)),
        ("T=512 slow gate", {"B": 1, "T": 512, "H": 2, "K": 32, "V": 32, "gate": "slow"}, _same),
        ("K=64 V=128", {"B": 1, "T": 256, "H": 4, "K": 64, "V": 128}, _same),
    ],
}


def load_kernel(path):
    spec = importlib.util.spec_from_file_location(f"cpu_kernel_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.custom_kernel


def tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in tensors(item)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    return []


def check_one(task, fn, data):
    """(ok, message) for one call: outputs against the reference, inputs unchanged."""
    before = [t.clone() for t in tensors(data)]
    expected = task.reference(data)
    out = fn(data)
    if not all(torch.equal(a, b) for a, b in zip(before, tensors(data))):
        return False, "the kernel changed its inputs"
    bad = [t for t in tensors(out) if not t.is_contiguous()]
    if bad:
        return False, "an output is not contiguous"
    return task.check(out, expected)


def check_kernel(task, fn, seeds):
    """Failures as strings; an empty list is a pass."""
    failures = []
    for case in list(task.CPU_CASES) + list(task.CPU_CHECK_CASES):
        for seed in range(seeds):
            ok, msg = check_one(task, fn, task.generate_input(case, seed))
            if not ok:
                failures.append(f"{case} seed {seed}: {msg}")
    for label, case, transform in STRESS[task.NAME]:
        for seed in range(max(1, seeds // 2)):
            ok, msg = check_one(task, fn, transform(task.generate_input(case, 100 + seed)))
            if not ok:
                failures.append(f"stress {label} seed {seed}: {msg}")
    return failures


def time_pair(task, fn, data, calls, warmup):
    """Median seconds per call of the reference and of fn, called alternately."""
    for _ in range(warmup):
        task.reference(data)
        fn(data)
    ref, cand = [], []
    clock = time.perf_counter
    for _ in range(calls):
        t0 = clock()
        task.reference(data)
        t1 = clock()
        fn(data)
        t2 = clock()
        ref.append(t1 - t0)
        cand.append(t2 - t1)
    return statistics.median(ref), statistics.median(cand)


def machine():
    return f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="all", help=f"one of {', '.join(TASKS)}, or all")
    parser.add_argument("--kernel", action="append", help="a kernel file (default: seed.py and cpu/*.py)")
    parser.add_argument("--seeds", type=int, default=4, help="seeds per CPU case (stress inputs: half as many)")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per side")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)

    names = TASKS if args.task == "all" else (args.task,)
    print(f"# {machine()}; {datetime.datetime.now():%Y-%m-%d %H:%M}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; one thread, in-process, median of {args.calls} calls")
    print(f"{'task':<18} {'kernel':<24} {'check':<6} {'ref us':>9} {'kernel us':>10} {'speedup':>8} {'import s':>9}")
    for name in names:
        task = importlib.import_module(f"tasks.{name}")
        paths = args.kernel or ([os.path.join(ROOT, "tasks", "kernels", name, "seed.py")]
                                + sorted(glob.glob(os.path.join(ROOT, "tasks", "kernels", name, "cpu", "*.py"))))
        for path in paths:
            label = os.path.relpath(path, os.path.join(ROOT, "tasks", "kernels", name))
            t0 = time.perf_counter()
            try:
                fn = load_kernel(path)
            except Exception as e:  # noqa: BLE001 - a kernel that fails to build is reported, not fatal
                print(f"{name:<18} {label:<24} BUILD FAILED: {type(e).__name__}: {str(e)[:200]}")
                continue
            import_s = time.perf_counter() - t0
            verdict = "-"
            if not args.no_check:
                failures = check_kernel(task, fn, args.seeds)
                verdict = "ok" if not failures else "FAIL"
                for failure in failures[:5]:
                    print(f"    {label}: {failure}")
            for case in task.CPU_CASES:
                data = task.generate_input(case, 0)
                ref_s, cand_s = time_pair(task, fn, data, args.calls, args.warmup)
                print(f"{name:<18} {label:<24} {verdict:<6} {ref_s * 1e6:9.1f} {cand_s * 1e6:10.1f} "
                      f"{ref_s / cand_s:8.2f} {import_s:9.1f}", flush=True)


if __name__ == "__main__":
    main()
