"""eval_set.py: build an eval set and an RL training pool from searches' measured kernels.

    python eval_set.py runs/cross_entropy-topk-0 runs/trimul-topk-0 --out runs/evalset --per-bin 53
    python eval_set.py runs/cross_entropy-topk-0 --out runs/evalset --per-bin 8 --fill --fill-budget 8 --server URL

The paper (docs/PAPER.md §10) published, from the event logs of its searches, a held-out eval set
of 424 (anchor, candidate) pairs balanced over the 8 bins, an RL training pool, and 1,347
parent->child discovery pairs. This module rebuilds all three from this project's searches:

1. Harvest. Every search folder (search.py --out) holds training_rows.jsonl (one row per
   successfully measured kernel: its code and geomean speedup over the task's reference) and
   events.jsonl (whose measurement events name each kernel's parent). A kernel is identified as
   <search folder name>/<node id>. A kernels.jsonl written by an earlier build is read as is. Rows
   given as a JSON Lines file or a Hugging Face Hub dataset (hf:OWNER/NAME[/CONFIG][:SPLIT], e.g.
   the paper's RL pool, hf:codezakh/gpu-forecasters-rl-training-pool) are measured kernels too:
   rows in kernels.jsonl's schema as they are, training rows where their anchor is their task's
   seed (the anchor of the rows whose pair_type is seed), with the speedup over the reference
   they state; rows anchored elsewhere (the paper's parent_edit rows: a child over its parent)
   give no kernel, since their speedup is over another kernel.
2. Group by bin and sample: pair_sampler.py draws --per-bin pairs per bin, within each task,
   water-filled across tasks, in a seeded shuffle.
3. Fill short bins (--fill). Searches rarely land in the extreme bins (a 4x speedup, or a kernel
   twice as slow as the reference, is not what a speed search looks for). For a bin short of its
   quota, a goal-conditioned search (search.py --target-bin B: reward -|ln S - ln m_B|, m_B the
   bin's geometric midpoint, and a mutation prompt that asks for a speedup inside the bin's band)
   runs on the task with the least supply in that bin, then the next, until the quota is met or
   every task had one. Fill searches live in OUT/fill/<task>-bin<B>/ and are harvested like the
   inputs, so a rerun resumes them (search.py replays its log) instead of repeating them.
4. Write, into --out:
     kernels.jsonl          every harvested kernel (kernel_id, task, code, speedup, hardware,
                            scale, is_seed, parent_id, source_search)
     eval_set.jsonl         the balanced pairs, the paper's eval-set schema
     rl_pool.jsonl          training rows, the paper's RL-pool schema: every kernel against the
                            seed (pair_type seed) and every measured child against its parent
                            (parent_edit), minus every kernel the eval set uses (so a forecaster
                            is never tested on a kernel it was trained on) and minus --holdout-task
                            (the paper held gdn_chunk_fwd_o out of its pool)
     discovery_pairs.jsonl  every measured parent->child step, the paper's discovery-pair schema
                            (pair_id, problem_id, benchmark_family, parent_code, child_code,
                            g_speedup = S_child / S_parent, true_bin, hardware, parent_node_id,
                            child_node_id, source_id, source_search, internal_experiment)
     manifest.json          inputs, options, per-bin supply and quota, short bins, fill searches,
                            and each output's row count and sha256
   Every file is written whole or not at all (a temporary file renamed over the old one).
"""
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from bins import speedup_to_bin
from data.dataset import read_source
from data.hub import is_hub_name
from data.pair_sampler import check_kernel, effective_speedup, eval_row, format_report, sample_pairs, unique_kernels
from data.records import RecordError, read_jsonl, write_atomic
from runtime import cli
from runtime.cli import flag
from tasks import TASK_NAMES


def family_of(task):
    """The benchmark family a discovery pair names: gpu_mode for the six GPU MODE problems,
    kernelbench_l3 for a KernelBench level-3 problem, else kernelbench or file (a problem file)."""
    if task in TASK_NAMES:
        return "gpu_mode"
    if task.startswith(("kernelbench:3/", "kernelbench:level3/")):
        return "kernelbench_l3"
    return "kernelbench" if task.startswith("kernelbench:") else "file"


class BuildError(Exception):
    """A problem the user can fix; main() prints it as one line."""


# ---- 1. harvest ---------------------------------------------------------------------------------

def harvest_search(folder, name):
    """Measured kernels of one search folder: its training rows, with parents from its event log."""
    folder = Path(folder)
    rows_path, events_path = folder / "training_rows.jsonl", folder / "events.jsonl"
    if not rows_path.is_file() or not events_path.is_file():
        raise BuildError(f"{folder} is not a search output folder (needs training_rows.jsonl and "
                         "events.jsonl, as search.py --out writes them)")
    try:
        events = [e for _, e in read_jsonl(events_path, fix="is the search still running? harvest it "
                                           "once it has stopped (a rerun of search.py repairs a torn log)")]
        rows = read_jsonl(rows_path)
    except RecordError as e:
        raise BuildError(str(e)) from None
    config = next((e["payload"] for e in events if e.get("kind") == "config"), {})
    parent = {e["request_id"]: e["parent_id"] for e in events if e.get("kind") == "measurement"}
    kernels = []
    for i, r in rows:
        try:
            node = r["row_id"].rsplit("/", 1)[-1]
            k = {"kernel_id": f"{name}/{node}", "task": r["pack"], "code": r["candidate_code"],
                 "speedup": r["aggregated_speedup"], "hardware": r.get("hardware") or "unknown",
                 "scale": config.get("scale", "unknown"), "is_seed": r.get("pair_type") == "seed",
                 "parent_id": f"{name}/{parent[node]}" if parent.get(node) else None,
                 "source_search": name}
        except (KeyError, AttributeError, TypeError) as e:
            raise BuildError(f"{rows_path}:{i} is not a training row ({type(e).__name__}: {e})") from None
        try:
            kernels.append(check_kernel(k, f"{rows_path}:{i}"))
        except RecordError as e:
            raise BuildError(str(e)) from None
    return kernels


def harvest_rows(source, name):
    """Measured kernels of a rows file or Hub dataset (step 1 of the module docstring)."""
    try:
        rows = read_source(source)
    except RecordError as e:
        raise BuildError(str(e)) from None
    seeds = {}  # task -> the code its seed-anchored rows are anchored at
    for _, _, r in rows:
        if r.get("pair_type") == "seed" and isinstance(r.get("anchor_code"), str):
            seeds.setdefault(r.get("pack"), set()).add(r["anchor_code"].strip())
    kernels, seeded = [], set()
    for n, where, r in rows:
        try:
            if "kernel_id" in r or "code" in r:  # kernels.jsonl's schema
                kernels.append(check_kernel(r, where))
                continue
            if not isinstance(r.get("anchor_code"), str) or not isinstance(r.get("candidate_code"), str):
                raise BuildError(f"{where}: neither a measured kernel (kernel_id, task, code, speedup, hardware, "
                                 "scale) nor a training row (pack, anchor_code, candidate_code, aggregated_speedup)")
            if r["anchor_code"].strip() not in seeds.get(r.get("pack"), ()):
                continue  # a child over its parent: its speedup is over a kernel other than the seed
            is_seed = r["candidate_code"].strip() == r["anchor_code"].strip()
            k = {"kernel_id": f"{name}/{r.get('row_id', f'row{n}')}", "task": r.get("pack"),
                 "code": r["candidate_code"], "speedup": r.get("aggregated_speedup"),
                 "hardware": r.get("hardware") or "unknown", "scale": "unknown", "is_seed": is_seed,
                 "parent_id": None, "source_search": r.get("source_search") or name}
            kernels.append(check_kernel(k, where))
            if is_seed:
                seeded.add((k["task"], k["hardware"]))
        except RecordError as e:
            raise BuildError(str(e)) from None
    if rows and not kernels:
        raise BuildError(f"{source}: none of its {len(rows)} rows is a kernel measured against its task's seed "
                         "(rows of pair_type seed name the seed as their anchor)")
    # the seed itself, where only rows against it were given (the paper's pool has no seed-vs-seed row)
    for task, hardware, code in sorted({(k["task"], k["hardware"], c) for k in kernels if not k.get("is_seed")
                                        for c in seeds.get(k["task"], ())}):
        if (task, hardware) not in seeded:
            digest = hashlib.sha256(code.encode()).hexdigest()[:8]
            kernels.append({"kernel_id": f"{name}/seed-{task}-{digest}", "task": task, "code": code, "speedup": 1.0,
                            "hardware": hardware, "scale": "unknown", "is_seed": True, "parent_id": None,
                            "source_search": name})
            seeded.add((task, hardware))
    return kernels


def source_names(paths):
    """A short name per search folder: its own name, or parent/name where two share a name
    (the gated and ungated halves of two --compare runs); a Hub dataset's name without hf:."""
    names = [p[len("hf:"):] if is_hub_name(p) else Path(p).resolve().name for p in paths]
    return [n if names.count(n) == 1 or is_hub_name(p) else "/".join(Path(p).resolve().parts[-2:])
            for p, n in zip(paths, names)]


def harvest(sources):
    """(kernels, [{source, name, kernels}]) of search folders, rows files and Hub datasets."""
    kernels, inputs = [], []
    for path, name in zip(sources, source_names(sources)):
        p = Path(path)
        if not is_hub_name(path) and p.is_dir():
            ks = harvest_search(p, name)
        elif is_hub_name(path) or p.is_file():
            ks = harvest_rows(path, name)
        else:
            raise BuildError(f"{path} does not exist; pass search.py output folders, kernels.jsonl or training "
                             "rows files, or Hub datasets (hf:OWNER/NAME)")
        kernels += ks
        inputs.append({"source": name, "kernels": len(ks)})
    return kernels, inputs


# ---- 4. the records written ---------------------------------------------------------------------

def parent_child(kernels):
    """(parent, child) of every measured step whose parent was harvested too, once per distinct
    pair of codes: a kernel measured in several searches stands for all its copies (the seed
    of every search of a task is one kernel)."""
    uniq, alias = unique_kernels(kernels)
    by_id = {k["kernel_id"]: k for k in uniq}
    edges = {}
    for k in kernels:
        if k.get("parent_id") in alias:
            edge = (alias[k["parent_id"]], alias[k["kernel_id"]])
            if edge[0] != edge[1]:
                edges.setdefault(edge, (by_id[edge[0]], by_id[edge[1]]))
    return [edges[e] for e in sorted(edges)]


def discovery_pairs(kernels, experiment=""):
    """Every measured parent->child step, in the paper's discovery-pair schema."""
    out = []
    for p, c in parent_child(kernels):
        g = effective_speedup(c) / effective_speedup(p)
        out.append({"pair_id": f"{p['kernel_id']}->{c['kernel_id']}", "problem_id": c["task"],
                    "benchmark_family": family_of(c["task"]), "parent_code": p["code"], "child_code": c["code"],
                    "g_speedup": g, "true_bin": speedup_to_bin(g), "hardware": c["hardware"],
                    "parent_node_id": p["kernel_id"], "child_node_id": c["kernel_id"],
                    "source_id": c["kernel_id"], "source_search": c["source_search"],
                    "internal_experiment": experiment})
    return out


def _pool_row(anchor, cand, speedup, pair_type, experiment):
    return {"row_id": f"{pair_type}:{anchor['kernel_id']}->{cand['kernel_id']}", "pack": cand["task"],
            "anchor_code": anchor["code"], "candidate_code": cand["code"],
            "aggregated_speedup": speedup, "relative_bin": speedup_to_bin(speedup),
            "hardware": cand["hardware"], "pair_type": pair_type,
            "source_id": f"{anchor['kernel_id']}->{cand['kernel_id']}",
            "source_search": cand["source_search"], "internal_experiment": experiment}


def rl_pool(kernels, eval_pairs, holdout_task=None, experiment=""):
    """Training rows of every kernel against its task's seed and every child against its parent,
    without the eval set's kernels (the seed excepted: it is the reference) or the held-out task."""
    uniq, _ = unique_kernels(kernels)
    in_eval = {(p[r]["task"], p[r]["hardware"], p[r]["scale"], p[r]["code"].strip())
               for p in eval_pairs for r in ("anchor", "candidate") if not p[r].get("is_seed")}

    def usable(k):
        return k["task"] != holdout_task and (
            k.get("is_seed") or (k["task"], k["hardware"], k["scale"], k["code"].strip()) not in in_eval)

    seeds = {(k["task"], k["hardware"], k["scale"]): k for k in uniq if k.get("is_seed")}
    rows = []
    for k in uniq:
        seed = seeds.get((k["task"], k["hardware"], k["scale"]))
        if seed is not None and not k.get("is_seed") and usable(k):
            rows.append(_pool_row(seed, k, effective_speedup(k), "seed", experiment))
    for p, c in parent_child(kernels):
        if not p.get("is_seed") and usable(p) and usable(c):
            rows.append(_pool_row(p, c, effective_speedup(c) / effective_speedup(p), "parent_edit", experiment))
    return rows


def _jsonl_text(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


# ---- the build ----------------------------------------------------------------------------------

def build(sources, out, *, per_bin=53, seed=0, mirrors=False, holdout_task=None, fill=None, say=print):
    """Harvest, sample (filling short bins when `fill` is a function (task, bin, folder) that runs
    a goal-conditioned search into folder), and write the outputs. Returns the manifest."""
    out = Path(out)
    fill_root = out / "fill"
    fill_dirs = sorted(d for d in fill_root.glob("*-bin*") if (d / "training_rows.jsonl").is_file()) \
        if fill_root.is_dir() else []
    kernels, inputs = harvest(list(sources) + fill_dirs)
    if not kernels:
        raise BuildError("no measured kernels in the inputs; run search.py first")
    say(f"harvested {len(kernels)} measured kernels from {len(inputs)} source(s)")
    pairs, report = sample_pairs(kernels, per_bin, seed, mirrors)
    if fill is not None and report["short_bins"]:
        tasks = sorted({k["task"] for k in kernels})
        for b in list(report["short_bins"]):
            for task in sorted(tasks, key=lambda t: (report["bins"][b]["by_task"].get(t, 0), t)):
                if report["bins"][b]["taken"] >= per_bin:
                    break
                folder = fill_root / f"{task}-bin{b}"
                say(f"bin {b} is short ({report['bins'][b]['taken']} of {per_bin}): goal-conditioned "
                    f"search on {task} -> {folder}")
                fill(task, b, folder)
                if folder not in fill_dirs:
                    fill_dirs.append(folder)
                kernels, inputs = harvest(list(sources) + fill_dirs)
                pairs, report = sample_pairs(kernels, per_bin, seed, mirrors)
    say(format_report(report))
    experiment = f"eval_set.py per-bin {per_bin} seed {seed}" + (" mirrors" if mirrors else "")
    files = {
        "kernels.jsonl": _jsonl_text(sorted(kernels, key=lambda k: k["kernel_id"])),
        "eval_set.jsonl": _jsonl_text(eval_row(p, experiment) for p in pairs),
        "rl_pool.jsonl": _jsonl_text(rl_pool(kernels, pairs, holdout_task, experiment)),
        "discovery_pairs.jsonl": _jsonl_text(discovery_pairs(kernels, experiment)),
    }
    manifest = {
        "built_by": "eval_set.py", "per_bin": per_bin, "seed": seed, "mirrors": mirrors,
        "holdout_task": holdout_task,
        "inputs": inputs, "kernels": report["kernels"], "duplicate_codes_dropped": report["duplicates"],
        "bins": report["bins"], "short_bins": report["short_bins"],
        "fill_searches": [{"folder": f"fill/{d.name}", "task": d.name.rsplit("-bin", 1)[0],
                           "bin": int(d.name.rsplit("-bin", 1)[1])} for d in fill_dirs],
        "outputs": {name: {"rows": text.count("\n"),
                           "sha256": hashlib.sha256(text.encode()).hexdigest()}
                    for name, text in files.items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_atomic(out / name, text)
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest


FILLING = "filling short bins (passed on to search.py)"  # the --help section of the fill searches' flags


@dataclass
class Args:
    """Build a bin-balanced eval set, an RL training pool and discovery pairs from searches'
    measured kernels (the paper's published data sets, rebuilt)."""
    sources: list[str] = flag(None, "search.py output folders (training_rows.jsonl + events.jsonl), kernels.jsonl "
                              "files of an earlier build, or training rows as a JSON Lines file or a Hub dataset "
                              "hf:OWNER/NAME[/CONFIG][:SPLIT] (the paper's RL pool: "
                              "hf:codezakh/gpu-forecasters-rl-training-pool)", positional=True)
    out: str = flag(None, "output folder (kernels, eval_set, rl_pool, discovery_pairs, manifest; fill searches "
                    "in OUT/fill/)", required=True)
    per_bin: int = flag(53, "eval pairs per bin (the paper: 53, 424 in all)")
    seed: int = flag(0, "seed of the pair sampler and the fill searches")
    mirrors: bool = flag(False, "allow a pair and its mirror (b, a) both in the eval set (the original's sampler); "
                         "by default each unordered pair once")
    holdout_task: str | None = flag(None, "leave this task out of the RL pool (the paper: gdn_chunk_fwd_o); one of "
                                    f"{', '.join(TASK_NAMES)}, or a problem file or kernelbench:LEVEL/NAME as its "
                                    "searches named it")
    fill: bool = flag(False, "run a goal-conditioned search (search.py --target-bin) for each bin short of "
                      "--per-bin, task by task, until it is full", group=FILLING)
    fill_budget: int | None = flag(None, "measurements per fill search (search.py's default if unset)", group=FILLING)
    mutator: str = flag("auto", "the fill searches' mutator (an LLM is told the target band)",
                        choices=("auto", "llm", "catalog"), group=FILLING)
    server: str | None = flag(None, "OpenAI-compatible server URL for the mutator", group=FILLING)
    model: str | None = flag(None, "local transformers model for the mutator", group=FILLING)
    scale: str | None = flag(None, "measurement scale of the fill searches (search.py's default if unset)",
                             choices=("benchmark", "cpu"), group=FILLING)
    space: str | None = flag(None, "the kernels the fill searches write (search.py's --space: triton, cpu or all; "
                             "its default if unset: the CPU's own kernels on a CPU)", choices=("cpu", "triton", "all"),
                             group=FILLING)
    timeout: float | None = flag(None, "seconds per measurement", group=FILLING)
    kernelbench_dir: str | None = flag(None, "a KernelBench checkout, for searches whose --task was "
                                       "kernelbench:LEVEL/NAME (search.py's flag of the same name)", group=FILLING)
    unsafe_no_sandbox: bool = flag(False, "measure without the sandbox (search.py's flag of the same name)",
                                   group=FILLING)


def build_parser():
    """The command line of Args (cli.py): one --flag per field, with its default and help."""
    return cli.parser(Args)


def parse_args(argv=None):
    """Args from the command line, checked (a BuildError names the flag to fix)."""
    args = cli.parse(Args, argv, gpu=False)
    if args.per_bin < 1:
        raise BuildError(f"--per-bin must be at least 1, got {args.per_bin}")
    if args.fill_budget is not None and args.fill_budget < 1:
        raise BuildError(f"--fill-budget must be at least 1, got {args.fill_budget}")
    return args


def search_fill(args):
    """fill(task, bin, folder) for build(): one goal-conditioned search through search.py's own
    command line, so a fill search is an ordinary search folder (resumable, harvested like the
    others)."""
    import search  # the search, its models and measurement load only when a bin is filled

    def fill(task, target_bin, folder):
        argv = ["--task", task, "--gate", "none", "--target-bin", str(target_bin), "--seed", str(args.seed),
                "--mutator", args.mutator, "--out", str(folder), "--no-progress"]
        for name in ("server", "model", "scale", "space", "timeout", "kernelbench_dir"):
            if getattr(args, name) is not None:
                argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        if args.fill_budget is not None:
            argv += ["--budget", str(args.fill_budget)]
        if args.unsafe_no_sandbox:
            argv.append("--unsafe-no-sandbox")
        rc = search.main(argv)
        if rc != 0:
            raise BuildError(f"the fill search into {folder} failed (search.py exited {rc}; its message "
                             "is above); fix it and rerun: finished searches are not repeated")
    return fill


def main(argv=None):
    try:
        args = parse_args(argv)
        m = build(args.sources, args.out, per_bin=args.per_bin, seed=args.seed, mirrors=args.mirrors,
                  holdout_task=args.holdout_task, fill=search_fill(args) if args.fill else None)
    except BuildError as e:
        print(f"eval_set.py: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"eval_set.py: error: cannot write {args.out} ({e}); pass a writable folder", file=sys.stderr)
        return 2
    o = m["outputs"]
    print(f"wrote {args.out}/: eval_set.jsonl ({o['eval_set.jsonl']['rows']} pairs), rl_pool.jsonl "
          f"({o['rl_pool.jsonl']['rows']} rows), discovery_pairs.jsonl "
          f"({o['discovery_pairs.jsonl']['rows']} pairs), kernels.jsonl, manifest.json; short bins: "
          f"{m['short_bins'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
