"""Benchmark: what measure.py says about every hand-written kernel, and what it costs per candidate.

For each task (default: all) it measures the seed and every variant in tasks/kernels/<task>/, in one
process the way a search does (the first measurement pays the workers' start-up, later ones find a
booted spare), and prints one row per kernel: status, geomean speedup, the clock flags, and the wall
time of the measurement split into import, correctness (JIT compile included) and timing, and the
share of it spent handing outputs over and checking them in full (verify). The
machine it ran on heads the table. On CPU the speedups are CPU-time ratios of interpreted kernels:
they exercise the harness, not a GPU.

    python scripts/bench_measure.py [--tasks cross_entropy,trimul] [--quick] [--repeat 2] [--json]

With --workers 1,2,... it measures instead how many candidates a minute a pool of that many
workers gets through (measure_pool.py: one worker per GPU; on CPU, workers that share the cores),
the same --candidates kernels of the first task each time (its seed and variants, over again as
needed, never from the cache), and splits a candidate's wall time into the fixed cost (waiting
for a booted sandbox, importing, the correctness calls that JIT-compile) and the timing itself:

    python scripts/bench_measure.py --tasks cross_entropy --workers 1,2 --candidates 8 --quick

With --aa N it measures the reference as its own candidate N times on every path a candidate comes
by (an A/A test: the true speedup is exactly 1): each built-in task, a KernelBench problem file
(torch.relu and torch.softmax, ModelNew identical to Model), a GPU MODE submission (trimul, the
template's `from task import ...`) and a task file (the README's my_op.py). Per path it prints the
mean, the range, the worst distance from 1 and the noise figure measure.py reported, and the
coverage: the share of figures whose two-standard-error interval holds 1.0. With --spread N it
measures honest kernels that are not the reference (--kernels, default each task's seed and
variants that run natively) N times each, and prints the same coverage around each kernel's mean
(leaving the figure out): how far a rerun lands against the noise each figure states.

With --attacks N it measures each hostile candidate of tests/attacks/ that computes the honest
answer (the reference itself, its attack aimed at the harness) against its honest twin, the same
reference without the attack, the two alternating N times, and prints the ratio of their mean
figures with its standard error: where the harness holds, each ratio is within the noise of 1.

    python scripts/bench_measure.py --attacks 6

With --against DIR (another checkout of this project, e.g. `git worktree add /tmp/old <commit>`)
it times what a candidate costs as a user pays it, `python measure.py --candidate K --no-cache`
as a fresh process, for a fixed workload (each task's seed and first variant), the two checkouts
alternating --repeat times, and prints the median wall seconds of each and their ratio:

    python scripts/bench_measure.py --aa 5 --tasks cross_entropy,trimul
    python scripts/bench_measure.py --spread 6 --kernels tasks/kernels/cross_entropy/torch_inplace.py
    python scripts/bench_measure.py --against /tmp/old --tasks cross_entropy --repeat 3
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import measure  # noqa: E402
from harness.measure_sandbox import jemalloc  # noqa: E402
from harness.sides import HarnessError  # noqa: E402
from runtime.measure_pool import MeasurePool, pool_devices  # noqa: E402
from tasks import TASK_NAMES, reference_candidate, seed_path, variant_paths  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASK_NAMES), help="comma-separated tasks (default: all)")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is visible")
    parser.add_argument("--quick", action="store_true", help="measure.py's --quick (fewer timed calls)")
    parser.add_argument("--repeat", type=int, default=1, help="measure each kernel this many times (default 1)")
    parser.add_argument("--unsafe-no-sandbox", action="store_true", help="as in measure.py")
    parser.add_argument("--json", action="store_true", help="one JSON object per measurement instead of a table")
    parser.add_argument("--workers", help="comma-separated pool sizes, e.g. 1,2 (CPU) or 1,2,4,8 (a GPU node): "
                        "candidates per minute against the number of workers, instead of the per-kernel table")
    parser.add_argument("--candidates", type=int, default=8, help="candidates measured per pool size with --workers")
    parser.add_argument("--aa", type=int, metavar="N", help="an A/A test instead: the reference measured as the "
                        "candidate N times on every path (each task, a KernelBench file, a GPU MODE submission, a task "
                        "file; true speedup 1), with the noise's coverage")
    parser.add_argument("--paths", default="builtin,kernelbench,gpumode,taskfile",
                        help="with --aa: which paths (comma-separated: builtin, kernelbench, gpumode, taskfile)")
    parser.add_argument("--spread", type=int, metavar="N", help="each honest kernel of --kernels measured N times: "
                        "the spread of its figures against their stated noise")
    parser.add_argument("--kernels", help="with --spread: comma-separated TASK:PATH (default: the seeds and torch variants)")
    parser.add_argument("--attacks", type=int, metavar="N", help="each honest-computing attack of tests/attacks/ "
                        "against its honest twin, alternating N times (cross_entropy)")
    parser.add_argument("--against", metavar="DIR", help="another checkout of this project: the per-candidate "
                        "cost of its measure.py and of this one on a fixed workload, alternating (--repeat rounds)")
    args = parser.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASK_NAMES]
    if unknown or args.repeat < 1:
        print(f"error: unknown task {unknown[0]!r}; choose from {', '.join(TASK_NAMES)}" if unknown
              else "error: --repeat must be at least 1", file=sys.stderr)
        return 2
    print(f"# measure.py on {platform.node()} ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}")
    if args.device != "cuda":  # what a CPU figure's scatter depends on (docs/MEASUREMENT.md, The clock)
        print("# CPU workers allocate with " + ("jemalloc" if jemalloc() else
              "glibc: libjemalloc2 not found (or GPU_FORECASTERS_NO_JEMALLOC=1), CPU figures scatter more"))
    if args.workers:
        return scaling(tasks[0], args)
    if args.aa:
        return a_over_a(tasks, args)
    if args.spread:
        return spread(args)
    if args.attacks:
        return attacks_against_twins(args)
    if args.against:
        return against(tasks, args)
    if not args.json:
        print(f"{'task':<18} {'kernel':<18} {'status':<10} {'speedup':>8} {'wall s':>7} {'import':>7} "
              f"{'check':>7} {'time':>7} {'verify':>7}  flags")
    verify_shares = []
    for task in tasks:
        for path in [seed_path(task), *variant_paths(task)]:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                try:
                    m = measure.measure(task, path.read_text(), device=args.device, use_cache=False,
                                        quick=args.quick, unsafe_no_sandbox=args.unsafe_no_sandbox)
                except (ValueError, HarnessError) as e:
                    print(f"error: {e}", file=sys.stderr)
                    return 2
                wall = time.perf_counter() - t0
                if args.json:
                    print(json.dumps({"task": task, "kernel": path.stem, "wall_s": wall, **m.to_dict()}))
                    continue
                speed = f"{m.speedup:.3f}x" if m.speedup else "-"
                cost = " ".join(f"{v:>7.2f}" if v is not None else f"{'-':>7}" for v in (m.import_s, m.check_s, m.time_s))
                share = f"{m.verify_s / wall:>6.0%}" if m.verify_s is not None else f"{'-':>7}"
                cost += f" {share:>7}"
                if m.verify_s is not None:
                    verify_shares.append(m.verify_s / wall)
                print(f"{task:<18} {path.stem:<18} {m.status:<10} {speed:>8} {wall:>7.2f} {cost}  "
                      f"{len(m.flags)}" + ("" if m.status == "ok" else f"  {m.message[:60]}"), flush=True)
    if verify_shares:
        # At benchmark shapes on a GPU the full checks move up to gigabytes: the target is at most
        # 20% of a measurement's wall time (each is counted inside the timing budget).
        print(f"# full output checks: {statistics.mean(verify_shares):.0%} of a measurement's wall time on average, "
              f"at most {max(verify_shares):.0%} (target on a GPU at benchmark shapes: at most 20%)")
    return 0


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def scaling(task, args):
    """Candidates per minute against the number of pool workers (see the module docstring)."""
    try:
        sizes = [int(n) for n in args.workers.split(",")]
        pools = {n: pool_devices("all", n) for n in sizes}
    except ValueError as e:
        print(f"error: --workers {args.workers}: {e}", file=sys.stderr)
        return 2
    kernels = [p.read_text() for p in [seed_path(task), *variant_paths(task)]]
    sources = [kernels[i % len(kernels)] for i in range(args.candidates)]
    device = "GPU" if pools[sizes[0]][0].startswith("cuda") else "CPU (workers share the cores)"
    print(f"# {task}: {len(sources)} candidates per pool size, {device}; seconds per candidate, mean")
    print(f"{'workers':>7} {'wall s':>7} {'cand/min':>9} {'x one':>6} {'fixed s':>8} {'(boot':>6} {'import':>7} "
          f"{'check)':>7} {'timing s':>9}  statuses")
    one = None
    for n in sizes:
        t0 = time.perf_counter()
        kwargs = dict(use_cache=False, quick=args.quick, unsafe_no_sandbox=args.unsafe_no_sandbox)
        with MeasurePool(pools[n]) as pool:
            try:
                results = [f.result() for f in [pool.submit(task, s, **kwargs) for s in sources]]
            except (ValueError, HarnessError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        wall = time.perf_counter() - t0
        ms = [r["measurement"] for r in results]
        rate = 60 * len(ms) / wall
        one = one or rate
        if args.json:
            print(json.dumps({"task": task, "workers": n, "wall_s": wall, "per_minute": rate, "measurements": ms}))
            continue
        timed = [m for m in ms if m["time_s"] is not None]
        timing = mean([m["time_s"] for m in timed])
        fixed = mean([r["seconds"] - r["measurement"]["time_s"] for r in results if r["measurement"]["time_s"] is not None])
        parts = [mean([m[k] for m in timed]) for k in ("import_s", "check_s")]
        boot = fixed - sum(parts)
        statuses = ",".join(sorted({m["status"] for m in ms}))
        print(f"{n:>7} {wall:>7.1f} {rate:>9.2f} {rate / one:>6.2f} {fixed:>8.2f} {boot:>6.2f} {parts[0]:>7.2f} "
              f"{parts[1]:>7.2f} {timing:>9.2f}  {statuses}", flush=True)
    return 0


def aa_paths(tasks, paths, folder):
    """[(path label, task, the reference as its own candidate)] on each path a candidate comes by:
    the twin loads tasks.reference_candidate(task), and the candidate is the same code the way a
    user of that path would write it."""
    from tasks import reference_candidate
    out = []
    if "builtin" in paths:
        out += [(task, task, reference_candidate(task)) for task in tasks]
    if "kernelbench" in paths:
        for name, op in (("relu", "torch.relu(x)"), ("softmax", "torch.softmax(x, dim=1)")):
            problem = folder / f"kb_{name}.py"
            problem.write_text(KERNELBENCH_PROBLEM.format(op=op))
            out.append((f"kernelbench {name}", str(problem), reference_candidate(str(problem))))
    if "gpumode" in paths:
        out.append(("gpumode trimul", "trimul", GPUMODE_AA))
    if "taskfile" in paths:
        readme = (ROOT / "README.md").read_text()
        source = readme.split("say `my_op.py`:\n\n```python\n", 1)[1].split("```", 1)[0]
        task_file = folder / "my_op.py"
        task_file.write_text(source)
        out.append(("task file my_op", str(task_file), reference_candidate(str(task_file))))
    return out


KERNELBENCH_PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {op}


def get_inputs():
    return [torch.randn(16, 16384)]


def get_init_inputs():
    return []
"""
# trimul's reference in GPU MODE's submission template (the shim of its `task` module, its typing)
GPUMODE_AA = """#!POPCORN leaderboard trimul
from task import input_t, output_t
from tasks.trimul import reference as _reference


def custom_kernel(data: input_t) -> output_t:
    return _reference(data)
"""


def coverage(figures, noises, truth):
    """The share of figures whose two-standard-error interval (their stated noise, of the log)
    holds `truth` (a number, or one per figure)."""
    truths = truth if isinstance(truth, list) else [truth] * len(figures)
    return sum(abs(math.log(f / t)) <= 2 * n for f, n, t in zip(figures, noises, truths)) / len(figures)


def a_over_a(tasks, args):
    """The A/A test (module docstring): on each path, the spread of measure.py's figure where the
    truth is 1, and how often its stated noise covers 1."""
    import tempfile
    print(f"# A/A: the reference measured as its own candidate {args.aa} times per path"
          f"{' (--quick)' if args.quick else ''}; targets: every figure within 3% of 1 and within its noise, "
          "coverage of the 2-standard-error intervals at least 90%")
    print(f"{'path':<22} {'mean':>7} {'min':>7} {'max':>7} {'worst':>7} {'noise':>7} {'cover':>6} {'wall s':>7}  figures")
    all_f, all_n = [], []
    with tempfile.TemporaryDirectory() as folder:
        for label, task, source in aa_paths(tasks, args.paths.split(","), Path(folder)):
            figures, noises, walls = [], [], []
            for _ in range(args.aa):
                t0 = time.perf_counter()
                m = measure.measure(task, source, device=args.device, use_cache=False, quick=args.quick,
                                    unsafe_no_sandbox=args.unsafe_no_sandbox)
                walls.append(time.perf_counter() - t0)
                if m.status != "ok":
                    print(f"error: {label}: the reference as a candidate came back {m.status}: {m.message}", file=sys.stderr)
                    return 1
                figures.append(m.speedup)
                noises.append(m.noise)
            all_f += figures
            all_n += noises
            if args.json:
                print(json.dumps({"path": label, "figures": figures, "noise": noises, "wall_s": walls}), flush=True)
                continue
            worst = max(abs(f - 1) for f in figures)
            print(f"{label:<22} {mean(figures):>7.3f} {min(figures):>7.3f} {max(figures):>7.3f} {worst:>7.1%} "
                  f"{mean(noises):>7.1%} {coverage(figures, noises, 1.0):>6.0%} {mean(walls):>7.1f}  "
                  + " ".join(f"{f:.3f}" for f in figures), flush=True)
    print(f"# {len(all_f)} figures: worst distance from 1 {max(abs(f - 1) for f in all_f):.1%}; "
          f"within 3% of 1: {sum(abs(f - 1) <= 0.03 for f in all_f)}; coverage of 1.0 by the stated noise: "
          f"{coverage(all_f, all_n, 1.0):.0%} (target at least 90%)")
    return 0


def spread(args):
    """Honest kernels that are not the reference, each measured args.spread times with fresh
    workers: the spread of their figures against the noise each states (module docstring)."""
    kernels = [k.split(":", 1) for k in args.kernels.split(",")] if args.kernels else [
        (task, str(p)) for task in ("cross_entropy", "fp8_quant", "trimul")
        for p in [seed_path(task), *variant_paths(task)] if "triton" not in p.read_text()]
    print(f"# honest kernels, each measured {args.spread} times with fresh workers: the coverage of each figure's "
          "2-standard-error interval around the mean of the others (target about 95%)")
    print(f"{'task':<16} {'kernel':<22} {'mean':>7} {'sd':>6} {'noise':>7} {'cover':>6}  figures")
    all_f, all_n, all_t = [], [], []
    for task, path in kernels:
        source = Path(path).read_text()
        figures, noises = [], []
        for _ in range(args.spread):
            m = measure.measure(task, source, device=args.device, use_cache=False, quick=args.quick)
            if m.status == "ok":
                figures.append(m.speedup)
                noises.append(m.noise)
        if len(figures) < 3:
            print(f"{task:<16} {Path(path).stem:<22} fewer than 3 figures", flush=True)
            continue
        logs = [math.log(f) for f in figures]
        others = [math.exp((sum(logs) - x) / (len(logs) - 1)) for x in logs]  # each left out of its own truth
        all_f += figures
        all_n += noises
        all_t += others
        sd = statistics.stdev(logs)
        if args.json:
            print(json.dumps({"task": task, "kernel": path, "figures": figures, "noise": noises}), flush=True)
            continue
        print(f"{task:<16} {Path(path).stem:<22} {math.exp(mean(logs)):>7.3f} {sd:>6.1%} {mean(noises):>7.1%} "
              f"{coverage(figures, noises, others):>6.0%}  " + " ".join(f"{f:.3f}" for f in figures), flush=True)
    if all_f:
        print(f"# {len(all_f)} figures: coverage {coverage(all_f, all_n, all_t):.0%}")
    return 0


# The attacks that compute the reference's answer themselves and aim at the harness (its clock,
# its share of a window, its sizing, its charging), each a cross_entropy candidate: measured
# against their honest twin, any gain is the harness's.
HONEST_ATTACKS = ("lean_window", "idle_housekeeping", "pad_correctness", "slow_the_reference", "early_inputs",
                  "timer_via_gc", "timer_fraction", "work_in_exiting_threads", "batch_calls", "interrupt_timers")


def attacks_against_twins(args):
    """Each of HONEST_ATTACKS against its honest twin (the reference as the candidate), the two
    measured in turn args.attacks times: the ratio of the attack's mean figure to the twin's,
    and that ratio's standard error from the two sets' spreads."""
    attacks = ROOT / "tests" / "attacks"
    twin = reference_candidate("cross_entropy")
    print(f"# cross_entropy: each attack against its honest twin, alternating, {args.attacks} each"
          f"{' (--quick)' if args.quick else ''}; where the harness holds, every ratio is within its noise of 1")
    print(f"{'attack':<26} {'attack':>8} {'twin':>8} {'ratio':>7} {'+- se':>7}  statuses")
    for name in HONEST_ATTACKS:
        source = (attacks / f"{name}.py").read_text()
        got = {"attack": [], "twin": []}
        statuses = set()
        for _ in range(args.attacks):
            for who, src in (("attack", source), ("twin", twin)):
                m = measure.measure("cross_entropy", src, device=args.device, use_cache=False, quick=args.quick,
                                    unsafe_no_sandbox=args.unsafe_no_sandbox)
                statuses.add(m.status)
                if m.status == "ok":
                    got[who].append(m.speedup)
        a, t = got["attack"], got["twin"]
        if len(a) < 2 or len(t) < 2:
            print(f"{name:<26} {'-':>8} {'-':>8} {'-':>7} {'-':>7}  {','.join(sorted(statuses))}", flush=True)
            continue
        ratio = mean(a) / mean(t)
        se = ratio * ((statistics.stdev(a) / mean(a)) ** 2 / len(a) + (statistics.stdev(t) / mean(t)) ** 2 / len(t)) ** 0.5
        if args.json:
            print(json.dumps({"attack": name, "attack_figures": a, "twin_figures": t, "ratio": ratio, "se": se}))
            continue
        print(f"{name:<26} {mean(a):>8.3f} {mean(t):>8.3f} {ratio:>7.3f} {se:>7.3f}  {','.join(sorted(statuses))}", flush=True)
    return 0


def against(tasks, args):
    """Per-candidate cost of two checkouts' measure.py, as fresh processes (module docstring)."""
    other = Path(args.against).resolve()
    if not (other / "measure.py").is_file():
        print(f"error: --against {args.against}: no measure.py there; give another checkout of this project",
              file=sys.stderr)
        return 2
    workload = [(task, path) for task in tasks for path in [seed_path(task), *variant_paths(task)[:1]]]
    print(f"# per-candidate cost, `python measure.py --no-cache{' --quick' if args.quick else ''}` as a fresh "
          f"process, {args.repeat} round(s) alternating; median wall seconds")
    print(f"{'task':<18} {'kernel':<18} {'other s':>8} {'this s':>8} {'ratio':>6}  statuses (other / this)")
    ratios = []
    for task, path in workload:
        walls = {other: [], ROOT: []}
        statuses = {other: set(), ROOT: set()}
        for _ in range(args.repeat):
            for where in (other, ROOT):
                cmd = [sys.executable, "measure.py", "--task", task, "--candidate", str(path), "--no-cache", "--json"]
                cmd += ["--quick"] * args.quick + ["--unsafe-no-sandbox"] * args.unsafe_no_sandbox
                t0 = time.perf_counter()
                out = subprocess.run(cmd, cwd=where, capture_output=True, text=True)
                walls[where].append(time.perf_counter() - t0)
                try:
                    statuses[where].add(json.loads(out.stdout.strip().splitlines()[-1])["status"])
                except (ValueError, IndexError, KeyError):
                    statuses[where].add(f"exit {out.returncode}")
        a, b = statistics.median(walls[other]), statistics.median(walls[ROOT])
        ratios.append(b / a)
        print(f"{task:<18} {path.stem:<18} {a:>8.2f} {b:>8.2f} {b / a:>6.2f}  "
              f"{','.join(sorted(statuses[other]))} / {','.join(sorted(statuses[ROOT]))}", flush=True)
    geo = statistics.geometric_mean(ratios)
    print(f"# geometric mean cost ratio, this / other: {geo:.2f}x (target at most 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
