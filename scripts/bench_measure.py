"""Benchmark: what measure.py says about every hand-written kernel, and what it costs per candidate.

For each task (default: all) it measures the seed and every variant in tasks/kernels/<task>/, in one
process the way a search does (the first measurement pays the workers' start-up, later ones find a
booted spare), and prints one row per kernel: status, geomean speedup, the clock flags, and the wall
time of the measurement split into import, correctness (JIT compile included) and timing. The
machine it ran on heads the table. On CPU the speedups are CPU-time ratios of interpreted kernels:
they exercise the harness, not a GPU.

    python scripts/bench_measure.py [--tasks cross_entropy,trimul] [--quick] [--repeat 2] [--json]
"""
import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import measure  # noqa: E402
from tasks import TASK_NAMES, seed_path, variant_paths  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASK_NAMES), help="comma-separated tasks (default: all)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is visible")
    parser.add_argument("--quick", action="store_true", help="measure.py's --quick (fewer timed calls)")
    parser.add_argument("--repeat", type=int, default=1, help="measure each kernel this many times (default 1)")
    parser.add_argument("--unsafe-no-sandbox", action="store_true", help="as in measure.py")
    parser.add_argument("--json", action="store_true", help="one JSON object per measurement instead of a table")
    args = parser.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASK_NAMES]
    if unknown or args.repeat < 1:
        print(f"error: unknown task {unknown[0]!r}; choose from {', '.join(TASK_NAMES)}" if unknown
              else "error: --repeat must be at least 1", file=sys.stderr)
        return 2
    print(f"# measure.py on {platform.node()} ({platform.processor() or platform.machine()}, "
          f"{__import__('os').cpu_count()} cores), {time.strftime('%Y-%m-%d')}")
    if not args.json:
        print(f"{'task':<18} {'kernel':<18} {'status':<10} {'speedup':>8} {'wall s':>7} {'import':>7} "
              f"{'check':>7} {'time':>7}  flags")
    for task in tasks:
        for path in [seed_path(task), *variant_paths(task)]:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                try:
                    m = measure.measure(task, path.read_text(), device=args.device, use_cache=False,
                                        quick=args.quick, unsafe_no_sandbox=args.unsafe_no_sandbox)
                except (ValueError, measure.HarnessError) as e:
                    print(f"error: {e}", file=sys.stderr)
                    return 2
                wall = time.perf_counter() - t0
                if args.json:
                    print(json.dumps({"task": task, "kernel": path.stem, "wall_s": wall, **m.to_dict()}))
                    continue
                speed = f"{m.speedup:.3f}x" if m.speedup else "-"
                cost = " ".join(f"{v:>7.2f}" if v is not None else f"{'-':>7}" for v in (m.import_s, m.check_s, m.time_s))
                print(f"{task:<18} {path.stem:<18} {m.status:<10} {speed:>8} {wall:>7.2f} {cost}  "
                      f"{len(m.flags)}" + ("" if m.status == "ok" else f"  {m.message[:60]}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
