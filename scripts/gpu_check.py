"""GPU check: the project's measurements on a real GPU, in one short run (well under 10 minutes).

For every cross_entropy kernel (the seed and each hand-written Triton variant) at the paper's
benchmark shapes it reports
  - measure.py's result (isolated worker, CUDA events, L2 flush, median and spread),
  - the same callable timed in this process by triton.testing.do_bench(return_mode="median"),
    and the ratio of the two (a cross-check of our timer),
  - the achieved bandwidth of each kernel against the 4*B*V-byte physical floor and the
    6*B*V-byte two-pass floor,
then repeats one measurement to show run-to-run spread, and measures the seed (and any variants) of
the other tasks. With --record it appends the table, dated and with the GPU's name, to
docs/gpu_runs.md.

    python scripts/gpu_check.py [--record] [--tasks cross_entropy,trimul,...] [--quick]

It needs a CUDA GPU, and runs on older stacks too (torch 2.11 / triton 3.6).
"""
import argparse
import datetime
import importlib.util
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import measure  # noqa: E402
from tasks import TASK_NAMES, get_task, seed_path, variant_paths  # noqa: E402


def load_kernel(path):
    spec = importlib.util.spec_from_file_location(f"k_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.custom_kernel


def do_bench_ms(fn, data):
    import triton.testing
    return triton.testing.do_bench(lambda: fn(data), warmup=25, rep=100, return_mode="median")


def peak_bandwidth(name):
    return next((bw for key, bw in measure.PEAK_BANDWIDTH.items() if key in name), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="append the table to docs/gpu_runs.md")
    parser.add_argument("--tasks", default=",".join(TASK_NAMES),
                        help="comma-separated tasks to include (cross_entropy gets the full treatment)")
    parser.add_argument("--quick", action="store_true", help="fewer timed repetitions in measure.py")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible; this script checks the GPU path (run it on a GPU machine)", file=sys.stderr)
        return 2
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    gpu = torch.cuda.get_device_name(0)
    peak = peak_bandwidth(gpu)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {stamp} · {gpu} · torch {torch.__version__} · triton {__import__('triton').__version__}", ""]
    t_start = time.time()

    def emit(s=""):
        print(s, flush=True)
        lines.append(s)

    if "cross_entropy" in tasks:
        task = get_task("cross_entropy")
        kernels = [seed_path("cross_entropy")] + variant_paths("cross_entropy")
        emit("### cross_entropy: measure.py vs triton.testing.do_bench (median ms), bandwidth vs floors")
        emit("")
        emit("| kernel | status | geomean speedup | " + " | ".join(
            f"V={c['V']} ms (measure / do_bench / ratio) | V={c['V']} GB/s at 4BV" for c in task.BENCHMARK_CASES) + " |")
        emit("|" + "---|" * (3 + 2 * len(task.BENCHMARK_CASES)))
        best = None
        for path in kernels:
            m = measure.measure("cross_entropy", path.read_text(), device="cuda", use_cache=False, quick=args.quick)
            cells = [path.stem, m.status, f"{m.speedup:.3f}x" if m.speedup else "-"]
            if m.status == "ok":
                fn = load_kernel(path)
                for case, row in zip(task.BENCHMARK_CASES, m.cases):
                    data = task.generate_input(case, 0, device="cuda")
                    db = do_bench_ms(fn, data)
                    del data
                    ms = row["candidate_ms"]
                    gbs = 4 * case["B"] * case["V"] / (ms * 1e-3) / 1e9
                    cells += [f"{ms:.3f} / {db:.3f} / {ms / db:.2f} (±{row['candidate_spread']:.1%})", f"{gbs:.0f}"]
                    torch.cuda.empty_cache()
                if best is None or m.speedup > best[1].speedup:
                    best = (path, m)
            else:
                cells += [m.message[:60], ""] + ["", ""] * (len(task.BENCHMARK_CASES) - 1)
            emit("| " + " | ".join(cells) + " |")
        emit("")
        if best:
            path, m = best
            emit(f"Best kernel: {path.stem}, geomean {m.speedup:.3f}x over the PyTorch reference.")
            for case, row in zip(task.BENCHMARK_CASES, m.cases):
                b, v, ms = case["B"], case["V"], row["candidate_ms"]
                floor4 = 4 * b * v / peak * 1e3 if peak else float("nan")
                floor6 = 6 * b * v / peak * 1e3 if peak else float("nan")
                emit(f"- V={v}: {ms:.3f} ms; floors at {peak / 1e12 if peak else float('nan'):.2f} TB/s: "
                     f"4BV {floor4:.3f} ms ({floor4 / ms:.0%} of it), 6BV {floor6:.3f} ms ({floor6 / ms:.0%})")
            emit("")
            # Run-to-run spread: the same measurement three times.
            reps = [measure.measure("cross_entropy", path.read_text(), device="cuda", use_cache=False, quick=args.quick).speedup
                    for _ in range(3)]
            mean = sum(reps) / len(reps)
            sd = math.sqrt(sum((r - mean) ** 2 for r in reps) / (len(reps) - 1))
            emit(f"Repeat of {path.stem} x3: speedups {', '.join(f'{r:.3f}' for r in reps)} "
                 f"(mean {mean:.3f}, sd {sd:.3f}, {sd / mean:.1%})")
            emit("")

    others = [t for t in tasks if t != "cross_entropy"]
    if others:
        emit("### other tasks: seed and variants through measure.py at benchmark shapes")
        emit("")
        emit("| task | kernel | status | geomean speedup | per-case candidate ms (spread) | wall s |")
        emit("|---|---|---|---|---|---|")
        for name in others:
            for path in [seed_path(name)] + variant_paths(name):
                m = measure.measure(name, path.read_text(), device="cuda", use_cache=False, quick=True)
                per_case = ", ".join(f"{r['candidate_ms']:.3f} (±{r['candidate_spread']:.0%})" for r in m.cases) or m.message[:80]
                emit(f"| {name} | {path.stem} | {m.status} | {f'{m.speedup:.3f}x' if m.speedup else '-'} | "
                     f"{per_case} | {m.wall_s} |")
                torch.cuda.empty_cache()
        emit("")
    emit(f"Total time {time.time() - t_start:.0f} s.")

    if args.record:
        out = ROOT / "docs" / "gpu_runs.md"
        if not out.exists():
            out.write_text("# Runs on real GPUs\n\nEach section was written by `python scripts/gpu_check.py --record` "
                           "on the GPU it names. Nothing here is estimated.\n\n")
        with out.open("a") as f:
            f.write("\n".join(lines) + "\n\n")
        print(f"recorded in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
