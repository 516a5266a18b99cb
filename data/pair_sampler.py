"""pair_sampler.py: a bin-balanced set of (anchor, candidate) pairs from measured kernels.

    python -m data.pair_sampler kernels.jsonl --per-bin 53 --seed 0 --out pairs.jsonl

The paper's eval set (docs/PAPER.md §10) is 424 (anchor, candidate) pairs = 8 bins x 53. A set
drawn at random from a search's kernels would be mostly "parity" and "slight slowdown" (most
mutations barely change the runtime), and a forecaster that always answers bin 3 or 4 would look
good on it. So the pairs are balanced over the 8 bins, and within a bin over the problems.

Input: measured kernels, one JSON object per line (eval_set.py harvests them from searches):
    kernel_id, task, code, speedup (geomean speedup over the task's reference), hardware, scale,
    is_seed, source_search, parent_id (optional).

1. Pairs within a problem. Two different kernels a, b of one task, measured on the same hardware
   at the same scale, make the pair (anchor a, candidate b) with speedup S_b / S_a: each speedup is
   reference time / kernel time, so the ratio is a's time over b's time (up to the reference's
   own noise between the two measurements). The task's seed is the reference wrapped as a
   kernel: its speedup is 1 by definition (its measured value is noise), so a pair anchored at the
   seed has speedup S_b, exactly the measurement's own interleaved comparison. Kernels with the
   same code (stripped) are one kernel: the first by kernel_id is kept.
2. One quota per bin: --per-bin pairs (the paper: 53).
3. Water-filling across problems: a bin's quota is shared by the tasks as evenly as their supply
   allows. Every task gets the same level L, a task with fewer than L pairs in that bin gives all
   it has, and the others share its shortfall (L is raised until the quota is met or every task
   is exhausted); the remainder of an uneven split goes to tasks in a seeded order.
4. Drawing. Within (task, bin), pairs are drawn uniformly at random without replacement. A pair
   and its mirror (b, a) carry the same information (the speedup inverted, the bin mirrored), so
   each unordered pair is used at most once (--mirrors allows both, as the original's sampler
   did); the scarcest bins draw first so that a mirror never takes the last pair of a scarce bin.
5. A seeded shuffle of the result; comparison ids are a hash of (task, anchor, candidate) ids, so
   the same kernels and seed give the same file whatever order the kernels were read in.

A bin whose supply is below its quota stays short and is reported; eval_set.py --fill runs
goal-conditioned searches that aim at it. Output rows are in the paper's eval-set schema:
comparison_id, pack, anchor_code, candidate_code, hardware, aggregated_speedup, true_bin,
source_id (anchor_id->candidate_id), source_search, internal_experiment.
"""
import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

from bins import BIN_EDGES, BINS, speedup_to_bin
from data.records import RecordError, read_jsonl, write_atomic

KERNEL_FIELDS = ("kernel_id", "task", "code", "speedup", "hardware", "scale")


# ---- measured kernels ------------------------------------------------------------------------

def check_kernel(k, where):
    """A kernel record as read, or RecordError naming `where` and the problem."""
    missing = [f for f in KERNEL_FIELDS if f not in k]
    if missing:
        raise RecordError(f"{where}: missing field(s) {', '.join(missing)} of a measured kernel "
                          f"({', '.join(KERNEL_FIELDS)})")
    s = k["speedup"]
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
        raise RecordError(f"{where}: speedup must be a finite number > 0, got {s!r}")
    if not isinstance(k["code"], str) or not k["code"].strip():
        raise RecordError(f"{where}: code must be the kernel's source text")
    return k


def read_kernels(path):
    """Measured kernels from a JSON Lines file (as eval_set.py writes kernels.jsonl)."""
    return [check_kernel(k, f"{path}:{n}") for n, k in read_jsonl(path)]


def unique_kernels(kernels):
    """Kernels sorted by (task, hardware, scale, kernel_id), one per code within a group; and
    {kernel_id: the kept kernel's id} for every kernel read (a duplicate maps to its kept copy)."""
    out, kept, alias = [], {}, {}
    for k in sorted(kernels, key=lambda k: (k["task"], k["hardware"], k["scale"], k["kernel_id"])):
        key = (k["task"], k["hardware"], k["scale"], k["code"].strip())
        if key not in kept:
            kept[key] = k["kernel_id"]
            out.append(k)
        alias[k["kernel_id"]] = kept[key]
    return out, alias


def effective_speedup(k):
    """1 for the task's seed (the reference itself), else the measured speedup."""
    return 1.0 if k.get("is_seed") else float(k["speedup"])


# ---- pairs within a problem -------------------------------------------------------------------

class Group:
    """The kernels of one (task, hardware, scale) and the bin of each ordered pair of them:
    bins[i, j] is the bin of candidate j over anchor i (0 on the diagonal)."""

    def __init__(self, kernels, mirrors=False):
        self.kernels, self.mirrors = kernels, mirrors
        s = np.array([effective_speedup(k) for k in kernels])
        self.ratio = s[None, :] / s[:, None]
        # searchsorted over the edges is speedup_to_bin on the same floats: lower edge inclusive
        self.bins = np.searchsorted(np.array(BIN_EDGES), self.ratio, side="right") + 1
        np.fill_diagonal(self.bins, 0)
        self.n = len(kernels)
        self.used = set()  # pairs taken, as i * n + j (with i < j unless mirrors are allowed)

    def _key(self, i, j):
        return i * self.n + j if self.mirrors else np.minimum(i, j) * self.n + np.maximum(i, j)

    def free(self, b):
        """(anchors, candidates) of the ordered pairs in bin b not taken yet; without mirrors, an
        unordered pair taken either way round is taken, and counts once if both fall in bin b."""
        i, j = np.nonzero(self.bins == b)
        key = self._key(i, j)
        if self.used:
            keep = ~np.isin(key, np.fromiter(self.used, dtype=np.int64))
            i, j, key = i[keep], j[keep], key[keep]
        _, first = np.unique(key, return_index=True)
        first.sort()
        return i[first], j[first]

    def take(self, i, j):
        self.used.add(int(self._key(i, j)))


def group_kernels(kernels, mirrors=False):
    """{task: [Group, ...]} of unique kernels, groups in sorted (hardware, scale) order."""
    groups = {}
    for k in kernels:
        groups.setdefault(k["task"], {}).setdefault((k["hardware"], k["scale"]), []).append(k)
    return {t: [Group(ks, mirrors) for _, ks in sorted(g.items())] for t, g in sorted(groups.items())}


def water_fill(supply, quota, order):
    """{task: n} with sum(n) = min(quota, sum(supply)), as level as the supplies allow.

    order: the tasks in the order that receives the remainder of an uneven split."""
    given = {t: 0 for t in supply}
    left = quota
    while left > 0:
        open_ = [t for t in order if given[t] < supply[t]]
        if not open_:
            break
        share = left // len(open_)
        if share == 0:  # fewer pairs left than open tasks: one each, in the seeded order
            for t in open_[:left]:
                given[t] += 1
            break
        for t in open_:
            add = min(share, supply[t] - given[t])
            given[t] += add
            left -= add
    return given


def sample_pairs(kernels, per_bin, seed=0, mirrors=False):
    """Draw up to `per_bin` pairs per bin (module docstring). Returns (pairs, report).

    pairs: dicts with anchor, candidate (kernel records), speedup and bin, in seeded shuffled
    order. report: {"kernels", "duplicates", "bins": {b: {"quota", "supply", "taken",
    "by_task"}}, "short_bins"}, supply counted before any pair was taken."""
    if per_bin < 1:
        raise ValueError(f"per_bin must be at least 1, got {per_bin}")
    uniq, _ = unique_kernels(kernels)
    dropped = len(kernels) - len(uniq)
    rng = np.random.default_rng(seed)
    tasks = group_kernels(uniq, mirrors)
    supply = {b: {t: sum(len(g.free(b)[0]) for g in gs) for t, gs in tasks.items()} for b in BINS}
    report = {"kernels": len(uniq), "duplicates": dropped, "bins": {}, "short_bins": []}
    pairs = []
    for b in sorted(BINS, key=lambda b: (sum(supply[b].values()), b)):  # scarcest first
        now = {t: sum(len(g.free(b)[0]) for g in gs) for t, gs in tasks.items()}
        order = rng.permutation(sorted(tasks)).tolist() if tasks else []
        share = water_fill(now, per_bin, order)
        by_task = {}
        for t in sorted(tasks):
            if not share[t]:
                continue
            free = [(g, *g.free(b)) for g in tasks[t]]
            sizes = np.cumsum([len(i) for _, i, _ in free])
            for k in rng.choice(sizes[-1], size=share[t], replace=False):
                gi = int(np.searchsorted(sizes, k, side="right"))  # which group holds pair k
                g, i, j = free[gi]
                k -= sizes[gi - 1] if gi else 0
                g.take(i[k], j[k])
                pairs.append(_pair(g, int(i[k]), int(j[k]), b))
            by_task[t] = share[t]
        taken = sum(by_task.values())
        report["bins"][b] = {"quota": per_bin, "supply": sum(supply[b].values()), "taken": taken,
                             "by_task": by_task}
        if taken < per_bin:
            report["short_bins"].append(b)
    report["bins"] = dict(sorted(report["bins"].items()))
    report["short_bins"].sort()
    order = rng.permutation(len(pairs))
    return [pairs[k] for k in order], report


def _pair(group, i, j, b):
    anchor, cand = group.kernels[i], group.kernels[j]
    s = float(group.ratio[i, j])
    assert speedup_to_bin(s) == b, (s, b)  # the vectorised bins agree with the one definition
    return {"anchor": anchor, "candidate": cand, "speedup": s, "bin": b}


def eval_row(pair, experiment=""):
    """A pair as a row of the paper's eval-set schema."""
    a, c = pair["anchor"], pair["candidate"]
    digest = hashlib.sha256(f"{c['task']}\n{a['kernel_id']}\n{c['kernel_id']}".encode()).hexdigest()
    return {"comparison_id": f"{c['task']}-{digest[:12]}", "pack": c["task"],
            "anchor_code": a["code"], "candidate_code": c["code"], "hardware": c["hardware"],
            "aggregated_speedup": pair["speedup"], "true_bin": pair["bin"],
            "source_id": f"{a['kernel_id']}->{c['kernel_id']}",
            "source_search": c.get("source_search", ""), "internal_experiment": experiment}


def format_report(report):
    """A table: per bin, quota, supply and pairs taken per task."""
    tasks = sorted({t for r in report["bins"].values() for t in r["by_task"]})
    head = f"{'bin':<5}{'quota':>7}{'supply':>9}{'taken':>7}  " + "".join(f"{t[:16]:>17}" for t in tasks)
    lines = [head]
    for b, r in report["bins"].items():
        short = "  short" if b in report["short_bins"] else ""
        lines.append(f"{b:<5}{r['quota']:>7}{r['supply']:>9}{r['taken']:>7}  "
                     + "".join(f"{r['by_task'].get(t, 0):>17}" for t in tasks) + short)
    return "\n".join(lines)


def build_parser():
    ap = argparse.ArgumentParser(
        description="Draw a bin-balanced set of (anchor, candidate) pairs, within each task, from "
                    "measured kernels; write them in the paper's eval-set schema.")
    ap.add_argument("kernels", nargs="+", help="measured kernels, JSON Lines (eval_set.py writes "
                    "kernels.jsonl): kernel_id, task, code, speedup, hardware, scale, is_seed")
    ap.add_argument("--per-bin", type=int, default=53, help="pairs per bin (the paper: 53, 424 in all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draw and of the shuffle")
    ap.add_argument("--mirrors", action="store_true", help="allow a pair and its mirror (b, a) both "
                    "(the original's sampler); by default each unordered pair is used once")
    ap.add_argument("--out", required=True, help="output JSON Lines file of eval rows")
    ap.add_argument("--json", action="store_true", help="print the report as JSON, not a table")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.per_bin < 1:
        print(f"error: --per-bin must be at least 1, got {args.per_bin}", file=sys.stderr)
        return 2
    try:
        kernels = [k for path in args.kernels for k in read_kernels(path)]
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pairs, report = sample_pairs(kernels, args.per_bin, args.seed, args.mirrors)
    experiment = f"pair_sampler.py per-bin {args.per_bin} seed {args.seed}" + (" mirrors" if args.mirrors else "")
    text = "".join(json.dumps(eval_row(p, experiment)) + "\n" for p in pairs)
    out = Path(args.out)
    try:
        write_atomic(out, text)
    except OSError as e:
        print(f"error: cannot write {out} ({e}); pass a writable path", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report))
        print(f"{len(pairs)} pairs from {report['kernels']} kernels ({report['duplicates']} "
              f"duplicate codes dropped); short bins: {report['short_bins'] or 'none'}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
