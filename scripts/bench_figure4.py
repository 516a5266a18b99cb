"""bench_figure4.py: the paper's Figure 4 on this machine's CPU, over several seeds and tasks.

For each task and seed it runs, in a fresh process as a user runs it,

    python search.py --task T --seed S --compare --forecaster costmodel --budget B

the gated search (topk: 16 mutations forecast per parent, the 4 the forecast ranks best measured)
and the ungated one (every mutation measured, 4 per parent) with the same budget, in the CPU kernel
space (search.py --space cpu: C++ built with load_inline, torch.compile, PyTorch rewrites, timed
on one core). Then it reads their summaries and writes:

  - a table per task: the best speedup after each number of measurements (the geometric mean over
    the seeds), for each arm; how many measurements each arm needed to reach the ungated arm's
    best (per seed: the paper's claim is that the gated arm needs fewer); what measuring cost,
    builds included, and what forecasting cost;
  - the figure (--plot): best speedup against measurements, each seed a thin line, their
    geometric mean a thick one, one panel per task.

Both go into --doc between the markers `<!-- figure4-cpu:start -->` and `<!-- figure4-cpu:end -->`,
with the machine, the date, its load before and after (uptime) and the command. The times are CPU
times of CPU kernels on one core, never GPU times.

With --prior-tasks, the cost model starts each search from earlier measurements, as the paper's
forecaster was trained on past measurements before it gated a search: an ungated search of each
prior task (--prior-budget measurements, the CPU space) runs first, and every compare gets
`--costmodel-rows` with the rows of the prior tasks other than its own (leave one task out: the
prior never holds a kernel of the task searched). Without it the cost model learns from nothing
but the search's own measurements, deferring every child until it has 5.

All searches share one measurement cache under --out: a kernel both arms (or two seeds) measure is
measured once and gets one figure, so the arms differ by their choices, not by the machine's
noise; what a measurement cost is its cost when it was made (measure.py's wall_s, its build
included), whichever search took it from the cache.

    python scripts/bench_figure4.py [--tasks cross_entropy] [--seeds 0,1,2,3,4] [--budget 16]
                                    [--forecaster costmodel|llm] [--prior-tasks trimul,fp8_quant]
                                    [--prior-budget 16] [--out runs/figure4]
                                    [--doc docs/BENCHMARKS.md] [--plot docs/figure4_cpu.png]

Long: a torch.compile candidate takes half a minute to a few minutes to build. Rerunning with the
same --out resumes (a finished search is answered from its event log in seconds, an interrupted
one goes on where it stopped), and it prints a progress line at least once a minute, so its output
can go to a file.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from forecast_prompt import cpu_model  # noqa: E402

START, END = "<!-- figure4-cpu:start -->", "<!-- figure4-cpu:end -->"
ARMS = ("ungated", "gated")
HEARTBEAT_S = 60


def machine():
    """The CPU's model and core count."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def measured(folder):
    """How many measurements a search folder's event log holds so far (the seed's included)."""
    log = folder / "events.jsonl"
    if not log.exists():
        return 0
    n = 0
    for line in log.read_text().splitlines():
        try:
            n += json.loads(line)["kind"] == "measurement"
        except (ValueError, KeyError):
            pass  # a line being written
    return n


def run(argv, out, what, progress, env, started):
    """search.py `argv` in a fresh process, its output in OUT.log, a progress line (what
    progress() says) every HEARTBEAT_S seconds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.log", "a") as log:
        proc = subprocess.Popen([sys.executable, "search.py", *argv], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while proc.poll() is None:
            try:
                proc.wait(timeout=HEARTBEAT_S)
            except subprocess.TimeoutExpired:
                print(f"[{(time.monotonic() - started) / 60:.0f} min] {what}: {progress()} (load {os.getloadavg()[0]:.1f})",
                      flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: search.py {' '.join(argv)} exited {proc.returncode}; its output: "
                         f"{out.parent / (out.name + '.log')}")
    print(f"[{(time.monotonic() - started) / 60:.0f} min] {what}: done in {time.monotonic() - t0:.0f} s", flush=True)


def run_prior(task, args, env, started):
    """An ungated search of a prior task (every mutation measured); its training rows' path."""
    out = Path(args.out) / "prior" / task
    argv = ["--task", task, "--gate", "none", "--budget", str(args.prior_budget), "--seed", "100", "--space", "cpu",
            "--out", str(out), "--no-progress"]
    run(argv, out, f"prior {task}", lambda: f"{max(0, measured(out) - 1)}/{args.prior_budget} measured", env, started)
    return out / "training_rows.jsonl"


def run_compare(task, seed, args, env, started, prior=()):
    """One --compare search in a fresh process (the cost model starting from `prior`'s rows)."""
    out = Path(args.out) / (f"{task}-seed{seed}" + ("-prior" if prior else ""))
    argv = ["--task", task, "--seed", str(seed), "--compare", "--forecaster", args.forecaster, "--budget",
            str(args.budget), "--space", "cpu", "--out", str(out), "--no-progress"]
    if prior:
        argv += ["--costmodel-rows", ",".join(str(p) for p in prior)]
    run(argv, out, f"{task} seed {seed}",
        lambda: ", ".join(f"{arm} {max(0, measured(out / arm) - 1)}/{args.budget}" for arm in ARMS) + " measured",
        env, started)
    return {arm: json.loads((out / arm / "summary.json").read_text()) for arm in ARMS}


def best_at(curve, x):
    """The best speedup after x measurements, from a search's best_vs_measurements curve."""
    return max((b for n, b in curve if n <= x), default=None)


def reached(curve, target, noise):
    """The first number of measurements after which the curve is within the noise of `target`
    (two standard errors of its log), or None."""
    floor = target * math.exp(-2 * (noise or 0.0))
    return next((n for n, b in sorted(curve) if b >= floor), None)


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(statistics.mean(math.log(x) for x in xs)) if xs else None


def table(task, results, budget):
    """Markdown lines for one task: best speedup after each number of measurements, the
    measurements each arm needed to reach the ungated arm's best, and the costs."""
    marks = sorted({0, 1, 2, 4, budget // 2, 3 * budget // 4, budget})
    lines = [f"**{task}** ({len(results)} seeds, budget {budget}): best speedup after n measurements, the geometric "
             "mean over the seeds", "", "| n | " + " | ".join(map(str, marks)) + " |",
             "|---|" + "---|" * len(marks)]
    for arm in ARMS:
        row = [geomean([best_at(r[arm]["best_vs_measurements"], m) for r in results.values()]) for m in marks]
        lines.append(f"| {arm} | " + " | ".join(f"{v:.2f}x" if v else "-" for v in row) + " |")
    lines += ["", "| seed | ungated's best | measurements to reach it: ungated | gated | gated's best | "
              "measuring (builds), ungated | gated | forecasting, gated |", "|---|---|---|---|---|---|---|---|"]
    fewer = same = 0
    for seed, r in sorted(results.items()):
        u, g = r["ungated"], r["gated"]
        target, noise = u["best_speedup"], u.get("best_noise")
        nu, ng = reached(u["best_vs_measurements"], target, noise), reached(g["best_vs_measurements"], target, noise)
        fewer += ng is not None and nu is not None and ng < nu
        same += ng is not None and nu is not None and ng == nu
        cost = lambda s: f"{s['time_s'].get('measuring_cost', 0):.0f} s ({s['time_s'].get('build', 0):.0f} s)"  # noqa: E731
        lines.append(f"| {seed} | {target:.2f}x | {nu} | {ng if ng is not None else 'not reached'} | "
                     f"{g['best_speedup']:.2f}x | {cost(u)} | {cost(g)} | {g['time_s']['forecast']:.1f} s "
                     f"({g['forecasts']} forecasts) |")
    lines += ["", f"The gated arm reached the ungated arm's best with fewer measurements in {fewer} of "
              f"{len(results)} seeds, with as many in {same}."]
    return lines, fewer


def plot(all_results, budget, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(all_results)
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    colours = {"ungated": "tab:gray", "gated": "tab:blue"}
    for ax, task in zip(axes[0], tasks):
        xs = list(range(budget + 1))
        for arm in ARMS:
            curves = [r[arm]["best_vs_measurements"] for r in all_results[task].values()]
            for c in curves:
                ax.step(xs, [best_at(c, x) for x in xs], where="post", color=colours[arm], alpha=0.25, lw=0.8)
            mean = [geomean([best_at(c, x) for c in curves]) for x in xs]
            ax.step(xs, mean, where="post", color=colours[arm], lw=2.2,
                    label=f"{arm} ({'topk, cost model' if arm == 'gated' else 'every mutation measured'})")
        ax.set_title(f"{task}: {len(all_results[task])} seeds, CPU kernels on one core")
        ax.set_xlabel("measurements (seed excluded)")
        ax.set_ylabel("best speedup over the PyTorch reference (x)")
        ax.set_yscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_doc(doc, section):
    text = Path(doc).read_text() if Path(doc).exists() else ""
    block = f"{START}\n{section.rstrip()}\n{END}"
    if START in text and END in text:
        text = text[:text.index(START)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    Path(doc).write_text(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tasks", default="cross_entropy", help="comma-separated tasks (default cross_entropy)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated search seeds (default 0,1,2,3,4)")
    parser.add_argument("--budget", type=int, default=16, help="measurements per arm (default 16)")
    parser.add_argument("--forecaster", default="costmodel", choices=("costmodel", "llm"),
                        help="the gated arm's forecaster: the online cost model, or llm (the embedded SmolLM2 on a CPU)")
    parser.add_argument("--prior-tasks", default="", help="comma-separated tasks whose ungated searches the cost model "
                        "starts from (leave one task out: never the task searched); default none")
    parser.add_argument("--prior-budget", type=int, default=16, help="measurements of each prior task's search (default 16)")
    parser.add_argument("--out", default="runs/figure4", help="the searches' folders and their shared cache")
    parser.add_argument("--doc", default="docs/BENCHMARKS.md", help="where the table goes (between its markers)")
    parser.add_argument("--plot", default="docs/figure4_cpu.png", help="where the figure goes")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GPU_FORECASTERS_CACHE=str((out / "cache").resolve()), PYTHONUNBUFFERED="1")
    started, before = time.monotonic(), os.getloadavg()
    date = datetime.date.today().isoformat()
    print(f"{machine()}; load {before[0]:.1f} {before[1]:.1f} {before[2]:.1f}; {len(tasks)} task(s) x {len(seeds)} "
          f"seed(s), budget {args.budget} an arm -> {out}", flush=True)
    if args.forecaster != "costmodel" and args.prior_tasks:
        raise SystemExit("error: --prior-tasks are rows for the cost model; drop them with --forecaster llm")
    priors = {t: run_prior(t, args, env, started) for t in args.prior_tasks.split(",") if t}
    results = {task: {seed: run_compare(task, seed, args, env, started, [p for t, p in priors.items() if t != task])
                      for seed in seeds} for task in tasks}
    after = os.getloadavg()
    minutes = (time.monotonic() - started) / 60
    plot(results, args.budget, args.plot)
    command = (f"python scripts/bench_figure4.py --tasks {','.join(tasks)} --seeds {','.join(map(str, seeds))} "
               f"--budget {args.budget} --forecaster {args.forecaster}"
               + (f" --prior-tasks {args.prior_tasks} --prior-budget {args.prior_budget}" if priors else ""))
    prior_rows = {t: sum(1 for _ in open(p)) for t, p in priors.items()}
    lines = [f"Measured on {date}: {machine()}, load average {before[0]:.1f} before and {after[0]:.1f} after "
             f"(1-minute; the machine was shared), {minutes:.0f} minutes for this run (a rerun that resumed "
             "counts only its own time). CPU times of CPU kernels on one core, not GPU times.", "",
             f"    {command}", "", (f"The cost model started from the rows of ungated searches of "
             + ", ".join(f"{t} ({n} rows)" for t, n in prior_rows.items()) + ", the task searched left out."
             if priors else "The cost model started from nothing: it deferred every child until it had 5 measured."),
             "", f"![Figure 4 on a CPU]({os.path.relpath(args.plot, Path(args.doc).parent)})", ""]
    for task in tasks:
        rows, _ = table(task, results[task], args.budget)
        lines += rows + [""]
    write_doc(args.doc, "\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {args.plot} and the section of {args.doc}", flush=True)


if __name__ == "__main__":
    main()
