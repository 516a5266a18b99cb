"""search.py: PUCT kernel search with an LLM mutator and a forecaster gate (docs/PAPER.md §1, §4, §7).

    python search.py --task cross_entropy

One step of the search:
  1. PUCT picks parents from the archive of measured kernels (puct.py; the seed is the root).
  2. A mutator proposes children of each parent: an LLM given the parent's code and its measured
     feedback (LLMMutator), or, with no LLM at hand, the task's hand-written variants and edits of
     their `# tune:` constants (CatalogMutator).
  3. The gate decides which children deserve a real measurement (--gate):
       none        measure every mutation (the paper's standard search).
       topk        forecast every mutation, measure the k best by expected bin (the paper's
                   surrogate-filtered search: 16 forecast, 4 measured per parent).
       confidence  the selective gate (forecaster.Gate): measure a child when the forecaster
                   is unsure (the gate defers) or when it confidently predicts a gain over the
                   parent; skip it when it confidently predicts no gain.
  4. measure.py measures the chosen children; the reward is the geomean speedup over the task's
     reference. Successful children enter the archive; failures count as visits only.
  5. Every measurement becomes a training row for the forecaster (training_rows.jsonl), which is
     how the loop closes: the search's measurements train the forecaster that gates the next one.

Defaults that run anywhere: with no GPU and no model weights the plain command uses the offline
catalog mutator, the embedded SmolLM2 forecaster (logits read-out; its forecasts carry no
information), CPU-scale measurement and a budget of 8 measurements, and says so at start-up. On a
GPU machine with GPT-OSS-20B downloaded (or with --server) it runs the paper's search: an LLM
mutator, benchmark-scale measurement, 40 steps x 2 parents, 320 measurements.

Outputs in --out: events.jsonl, archive.json, best_kernel.py, summary.json, training_rows.jsonl
(the paper's RL-pool schema, dataset.py) and best_speedup.png (plots.py), each rewritten
atomically after every step (records.py). --compare runs the gated and the ungated search
with the same budget (the paper's Figure 4). The archive and PUCT arithmetic live in puct.py,
the mutators in mutators.py.

Decisions this file documents:
  - Budget: --budget counts measurements of *candidates*. The seed is measured once before the
    search as its root and anchor and is not counted (the paper's 320 = 40 steps x 2 parents x 4).
  - The forecaster forecasts speedup over the task's reference (the seed code is the anchor), so
    "predicts a gain over its parent" means E[log2 S] under the forecast exceeds log2 of the
    parent's measured reward. bins.BIN_LOG2_SPEEDUP gives each bin's log-speedup.
  - The confidence gate's threshold is --threshold, or is learnt from the forecasts of candidates
    measured so far (forecast bin vs true bin) by forecaster.Gate.from_labelled. Until
    --min-labels labels exist (or no threshold meets the target risk), every candidate is deferred.
    Only successful measurements are labels (a failed kernel has no true bin). At most
    --measure-per-parent candidates per parent are measured in both gated modes.
  - Resume: every request and result is a line in OUT/events.jsonl. A rerun replays the search
    from the start, answering each request from the log; only requests without a logged result
    are issued again. Mutation, forecast and measurement results are all logged, so the replay
    rebuilds the same archive without calling an LLM or a GPU. The options are stored in a config
    event; a rerun with different ones is refused, except --steps and --budget, which may grow to
    extend a finished search. Models load on their first use, so resuming a finished run loads none.
  - The default gate is topk (the paper's surrogate-filtered search). On the CPU path the embedded
    forecaster takes seconds per candidate, so it forecasts 6 mutations per parent, not 16.
  - Code already proposed in this search (exact text) is dropped before it is forecast or
    measured; in topk ranking, parse failures come after every parsed forecast.
"""
import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import bins
from forecast_answer import Forecast
from forecaster import Forecaster, Gate
from lm import DEFAULT_MODEL, ModelNotFound
from mutators import CatalogMutator, LLMMutator
from puct import Archive
from dataset import training_row
from records import EventLog, RecordError, write_atomic

GATES = ("none", "topk", "confidence")
RANK_KEYS = ("expected_bin", "expected_log_speedup")
CPU_BUDGET, PAPER_BUDGET = 8, 320
CPU_GATED_MUTATIONS = 6  # the embedded forecaster takes seconds per candidate on a CPU




class SearchError(Exception):
    """A problem the user can fix; main() prints it as one line."""


# ---- the gate ---------------------------------------------------------------------------------

def as_forecast(view):
    """The Forecast of a logged forecast view (live and replayed runs read the same log)."""
    probs = view["probs"]
    return Forecast(probs=probs, parse_failed=view["parse_failed"],
                    predicted_bin=None if probs is None else bins.predicted_bin(probs))


def rank_key(f, rank_by):
    """Ranking key of a forecast; parse failures rank after every parsed forecast."""
    if f.parse_failed:
        return -math.inf
    return f.expected_bin if rank_by == "expected_bin" else f.expected_log2_speedup


def predicts_gain(f, parent_reward):
    """A forecast of speedup over the reference 'predicts a gain over the parent' when its expected
    log2-speedup exceeds log2 of the parent's measured reward."""
    return f.expected_log2_speedup > math.log2(parent_reward)


# ---- the search -------------------------------------------------------------------------------

@dataclass
class Config:
    task: str
    gate: str = "none"
    seed: int = 0
    steps: int = 40
    budget: int = CPU_BUDGET
    parents: int = 2
    mutations: int = 4
    measure_per_parent: int = 4
    rank_by: str = "expected_bin"
    score: str = "maxprob"
    threshold: float | None = None
    target_risk: float = 0.3
    delta: float = 0.1
    min_labels: int = 8
    c: float = 1.0
    keep_children: int = 2
    capacity: int = 1000
    mutator: str = "catalog"
    forecaster: str = ""
    scale: str = "cpu"

    # steps and budget may change between runs of the same --out: a rerun can extend a search.
    def identity(self):
        return {k: v for k, v in asdict(self).items() if k not in ("steps", "budget")}


class Search:
    """One PUCT search writing into out_dir. All collaborators are injected so tests can script them:
    mutator.propose(parent, n, seen, key), measure_fn(task, source, **measure_kwargs) -> object
    with to_dict(), forecaster.forecast_many(task, anchor_code, codes) -> objects with probs,
    parse_failed and to_dict()."""

    def __init__(self, cfg, out_dir, *, seed_code, description="", mutator, measure_fn,
                 forecaster=None, measure_kwargs=None, progress=True, say=print):
        self.cfg, self.out = cfg, Path(out_dir)
        self.seed_code, self.description = seed_code, description
        self.mutator, self.measure_fn, self.forecaster = mutator, measure_fn, forecaster
        self.measure_kwargs, self.progress, self.say = dict(measure_kwargs or {}), progress, say
        if cfg.gate != "none" and forecaster is None:
            raise SearchError(f"--gate {cfg.gate} needs a forecaster")

    # Every expensive call goes through _call: answered from the log if its result is there,
    # otherwise logged as a request, issued, and its result logged.
    def _call(self, kind, rid, step, parent_id, fn):
        if (kind, rid) in self.logged:
            return self.logged[(kind, rid)]
        self.log.append("request", step, rid, parent_id, {"what": kind})
        payload = json.loads(json.dumps(fn(), default=str))  # live and replayed runs see the same types
        self.log.append(kind, step, rid, parent_id, payload)
        self.logged[(kind, rid)] = payload
        return payload

    def _note(self, kind, rid, step, parent_id, payload):
        """Derived events (selection, step): written once; a replay re-derives them silently."""
        if self.logged.get((kind, rid)) != json.loads(json.dumps(payload, default=str)):
            self.log.append(kind, step, rid, parent_id, payload)
            self.logged[(kind, rid)] = payload

    def _open_log(self):
        """Open the event log and claim it for this search's options: one log holds one search, so
        a rerun with other options is refused. True when the log already held this search."""
        self.log = EventLog(self.out / "events.jsonl")
        mine = json.loads(json.dumps(self.cfg.identity()))
        old = next((e["payload"] for e in self.log.events if e["kind"] == "config"), None)
        if old is None:
            self.log.append("config", None, "config", None, mine)
        else:
            for k in list(mine) + [k for k in old if k not in mine]:  # task, gate, seed first
                if old.get(k) != mine.get(k):
                    raise SearchError(f"{self.out} holds a run with {k}={old.get(k)!r}, but this "
                                      f"command asks for {k}={mine.get(k)!r}; rerun with the same "
                                      "options or pass a new --out")
        # what a replay answers from: every logged result
        self.logged = {(e["kind"], e["request_id"]): e["payload"] for e in self.log.events if e["kind"] != "request"}
        return old is not None

    def _measure(self, code):
        t = time.perf_counter()
        m = self.measure_fn(self.cfg.task, code, **self.measure_kwargs)
        return {"measurement": m.to_dict(), "seconds": time.perf_counter() - t}

    def _forecast(self, codes):
        t = time.perf_counter()
        fs = self.forecaster.forecast_many(self.cfg.task, self.seed_code, codes)
        views = [{"parse_failed": bool(f.parse_failed),
                  "probs": None if f.parse_failed else [float(p) for p in f.probs],
                  "record": f.to_dict()} for f in fs]
        return {"forecasts": views, "seconds": time.perf_counter() - t}

    def _gate(self):
        """The confidence gate of this step: --threshold, or learnt from the labels so far by
        forecaster.Gate.from_labelled (threshold inf when none meets the target risk); None (defer
        everything) until --min-labels labels exist."""
        cfg = self.cfg
        if cfg.threshold is not None:
            return Gate(cfg.score, cfg.threshold)
        if len(self.labels) < cfg.min_labels:
            return None
        forecasts, true_bins = zip(*self.labels)
        return Gate.from_labelled(forecasts, true_bins, cfg.target_risk, cfg.delta, score=cfg.score)

    def _choose(self, parent, n_cands, forecasts):
        """Indices to measure (in order), {index: reason} of those skipped, and the gate's
        threshold (None while it defers everything)."""
        cfg = self.cfg
        if cfg.gate == "none":
            return list(range(n_cands)), {}, None
        order = sorted(range(n_cands), key=lambda j: -rank_key(forecasts[j], cfg.rank_by))
        if cfg.gate == "topk":
            keep = order[: cfg.measure_per_parent]
            return keep, {j: "below top-k" for j in order[len(keep):]}, None
        gate, wanted, skipped = self._gate(), [], {}
        for j in order:
            if gate is None or gate.decide(forecasts[j]) == "defer":
                wanted.append(j)
            elif predicts_gain(forecasts[j], parent.reward):
                wanted.append(j)
            else:
                skipped[j] = "confident: no gain over parent"
        for j in wanted[cfg.measure_per_parent:]:
            skipped[j] = "over the per-parent cap"
        tau = None if gate is None or math.isinf(gate.threshold) else gate.threshold
        return wanted[: cfg.measure_per_parent], skipped, tau

    def run(self):
        cfg, t_start = self.cfg, time.time()
        resumed = self._open_log()
        if resumed:
            self.say(f"resuming from {self.out / 'events.jsonl'} ({len(self.log.events)} events)")
        archive = self.archive = Archive(c=cfg.c, capacity=cfg.capacity, keep_children=cfg.keep_children)
        st = self.stats = dict(steps=0, measurements=0, forecasts=0, considered=0, proposed=0,
                               failed_mutations=0, duplicates=0, skipped=0, failed_measurements=0,
                               skipped_by_reason={}, mutation_s=0.0, forecast_s=0.0, measurement_s=0.0)
        self.labels, self.rows, self.curve = [], [], []

        seed = self._call("measurement", "seed", -1, None, lambda: self._measure(self.seed_code))
        st["measurement_s"] += seed["seconds"]
        m = seed["measurement"]
        if m["status"] != "ok" or not m.get("speedup"):
            raise SearchError(f"the seed kernel did not measure ok ({m['status']}: {m.get('message', '')}); "
                              f"check tasks/kernels/{cfg.task}/seed.py with measure.py")
        archive.add_seed("seed", self.seed_code, m["speedup"], info={"result": _brief(m)})
        self._row("seed", self.seed_code, m, "seed")
        seen = {self.seed_code.strip()}
        best = m["speedup"]
        self.curve.append((0, best))
        bar = _progress(cfg.budget, self.progress)

        for step in range(cfg.steps):
            if st["measurements"] >= cfg.budget:
                break
            parents, children = archive.select(cfg.parents), {}
            for k, pid in enumerate(parents):
                if st["measurements"] >= cfg.budget:
                    break  # nothing left to measure: do not mutate or forecast for nothing
                parent, tag = archive.nodes[pid], f"s{step}p{k}"
                n_mut = cfg.mutations
                muts = self._call("mutation", f"{tag}/mutate", step, pid, lambda: self._mutate(parent, n_mut, seen, step, k))
                st["mutation_s"] += muts["seconds"]
                cands = []
                for i, c in enumerate(muts["candidates"]):
                    st["proposed"] += 1
                    if c["code"] is None:
                        st["failed_mutations"] += 1
                    elif c["code"].strip() in seen:
                        st["duplicates"] += 1
                    else:
                        seen.add(c["code"].strip())
                        cands.append((f"{tag}c{i}", c["code"]))
                st["considered"] += len(cands)
                forecasts = []
                if cfg.gate != "none" and cands:
                    fc = self._call("forecast", f"{tag}/forecast", step, pid,
                                    lambda: self._forecast([code for _, code in cands]))
                    forecasts = [as_forecast(v) for v in fc["forecasts"]]
                    st["forecasts"] += len(forecasts)
                    st["forecast_s"] += fc["seconds"]
                chosen, skipped, tau = self._choose(parent, len(cands), forecasts)
                room = max(0, cfg.budget - st["measurements"])
                for j in chosen[room:]:
                    skipped[j] = "budget spent"
                chosen = chosen[:room]
                for reason in skipped.values():
                    st["skipped_by_reason"][reason] = st["skipped_by_reason"].get(reason, 0) + 1
                st["skipped"] += len(skipped)
                self._note("selection", f"{tag}/select", step, pid, {
                    "measure": [cands[j][0] for j in chosen], "threshold": tau,
                    "skip": {cands[j][0]: why for j, why in sorted(skipped.items())}})
                kids = children[pid] = []
                for j in chosen:
                    cid, code = cands[j]
                    res = self._call("measurement", cid, step, pid, lambda: self._measure(code))
                    st["measurements"] += 1
                    st["measurement_s"] += res["seconds"]
                    bar.update(1)
                    m = res["measurement"]
                    ok = m["status"] == "ok" and bool(m.get("speedup"))
                    if forecasts and ok and not forecasts[j].parse_failed:  # a label for the gate
                        self.labels.append((forecasts[j], bins.speedup_to_bin(m["speedup"])))
                    if ok:
                        kids.append((cid, code, m["speedup"], {"result": _brief(m)}))
                        self._row(cid, code, m, "parent_edit")
                        best = max(best, m["speedup"])
                    else:
                        st["failed_measurements"] += 1
                        parent.info["last_failure"] = _brief(m)
                    self.curve.append((st["measurements"], best))
            kept = {pid: archive.expand(pid, kids, step=step) for pid, kids in children.items()}
            st["steps"] += 1
            self._note("step", f"step{step}", step, None, {
                "parents": parents, "kept": kept, "best_speedup": best,
                "measurements": st["measurements"], "archive_size": len(archive.nodes)})
            self._write_outputs(t_start)
        bar.close()
        self._write_outputs(t_start, plot=True)
        self.log.close()
        return self.summary(t_start)

    def _mutate(self, parent, n, seen, step, k):
        t = time.perf_counter()
        cands = self.mutator.propose(parent, n, set(seen), f"{self.cfg.seed}/{step}/{k}")
        return {"candidates": cands, "mutator": self.mutator.name, "seconds": time.perf_counter() - t}

    def _row(self, node_id, code, m, pair_type):
        run = f"{self.cfg.task}-{self.cfg.gate}-{self.cfg.seed}"
        self.rows.append(training_row(self.cfg.task, run, node_id, self.seed_code, code, m, pair_type))

    # ---- outputs -------------------------------------------------------------------------------

    def summary(self, t_start):
        st, best = self.stats, self.archive.best()
        return {
            "task": self.cfg.task, "gate": self.cfg.gate, "seed": self.cfg.seed,
            "mutator": self.cfg.mutator, "forecaster": self.cfg.forecaster or None,
            "budget": self.cfg.budget, "steps": st["steps"], "measurements": st["measurements"],
            "seed_measurements": 1, "candidates_proposed": st["proposed"],
            "candidates_considered": st["considered"], "failed_mutations": st["failed_mutations"],
            "duplicates": st["duplicates"], "forecasts": st["forecasts"], "skipped": st["skipped"],
            "skipped_by_reason": st["skipped_by_reason"], "failed_measurements": st["failed_measurements"],
            "training_rows": len(self.rows), "best_speedup": best.reward, "best_node": best.id,
            "seed_speedup": self.archive.nodes["seed"].reward, "archive_size": len(self.archive.nodes),
            "best_vs_measurements": self.curve,
            "time_s": {"mutation": round(st["mutation_s"], 3), "forecast": round(st["forecast_s"], 3),
                       "measurement": round(st["measurement_s"], 3),
                       "this_run_wall": round(time.time() - t_start, 3)},
        }

    def _write_outputs(self, t_start, plot=False):
        write_outputs(self.out, self.archive, self.summary(t_start), self.rows,
                      self.curve if plot else None, f"{self.cfg.task}: best speedup vs measurements")


def write_outputs(out, archive, summary, rows, curve=None, title=""):
    """Rewrite the run's outputs in `out`, each atomically; draw best_speedup.png when a curve is
    given."""
    out = Path(out)
    write_atomic(out / "archive.json", json.dumps(archive.to_dict(), indent=1))
    write_atomic(out / "best_kernel.py", archive.best().code)
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    write_atomic(out / "training_rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    if curve is not None:
        _plot_curves({f"{summary['gate']} gate": curve}, out / "best_speedup.png", title)


def write_compare(out, results, task):
    """compare.json and compare.png of a --compare run: {arm: summary} of the gated and the
    ungated search with the same budget."""
    out = Path(out)
    _plot_curves({f"{arm} ({s['gate']})": s["best_vs_measurements"] for arm, s in results.items()},
                 out / "compare.png", f"{task}: gated vs ungated search, same budget")
    write_atomic(out / "compare.json", json.dumps(results, indent=1))


def _plot_curves(curves, path, title):
    try:
        import plots
    except ImportError:  # a bare GPU machine may lack matplotlib; the curve is also in summary.json
        print(f"matplotlib is not installed: {path} not drawn (pip install matplotlib)", file=sys.stderr)
        return
    plots.plot_curves(curves, path, title)


def _brief(m):
    return {k: m.get(k) for k in ("status", "speedup", "cases", "message")}


def _progress(total, enabled):
    from tqdm import tqdm
    return tqdm(total=total, desc="measurements", unit="kernel", disable=not enabled, file=sys.stderr)


# ---- the command line -------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        print(f"search.py: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def build_parser():
    from tasks import TASK_NAMES
    p = _Parser(description="PUCT kernel search with an LLM mutator and a forecaster gate "
                "(the paper's Figure 4 with --compare).",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", required=True, choices=TASK_NAMES, help="the kernel task to optimise")
    p.add_argument("--gate", choices=GATES, default="topk",
                   help="none: measure every mutation; topk: forecast all, measure the best "
                   "--measure-per-parent; confidence: the selective gate (measure when unsure or "
                   "when a gain over the parent is predicted)")
    p.add_argument("--seed", type=int, default=0, help="seed of the mutators and of the run's name")
    p.add_argument("--budget", type=int, default=None, help="candidate measurements (the seed's is "
                   f"not counted); default {PAPER_BUDGET} with an LLM mutator at benchmark scale, "
                   f"else {CPU_BUDGET}")
    p.add_argument("--steps", type=int, default=40, help="most search steps")
    p.add_argument("--parents", type=int, default=2, help="parents expanded per step (lineage-blocked)")
    p.add_argument("--mutations", type=int, default=None,
                   help="mutations per parent; default 4 with --gate none, 16 with a gate "
                   f"({CPU_GATED_MUTATIONS} with the embedded CPU forecaster)")
    p.add_argument("--measure-per-parent", type=int, default=4,
                   help="most candidates measured per parent with a gate")
    p.add_argument("--rank-by", choices=RANK_KEYS, default="expected_bin",
                   help="forecast key that ranks candidates (expected bin index or log2-speedup)")
    p.add_argument("--score", choices=bins.CONFIDENCE_KINDS, default="maxprob",
                   help="confidence score of the confidence gate")
    p.add_argument("--threshold", type=float, default=None,
                   help="fixed confidence threshold of the confidence gate; default: learnt from "
                   "the measurements so far with selective.guaranteed_risk_threshold")
    p.add_argument("--target-risk", type=float, default=0.3,
                   help="bin-mismatch rate the learnt threshold must guarantee")
    p.add_argument("--delta", type=float, default=0.1, help="failure probability of that guarantee")
    p.add_argument("--min-labels", type=int, default=8,
                   help="measured forecasts needed before a threshold is learnt (defer all until then)")
    p.add_argument("--keep-children", type=int, default=2, help="best children per expansion kept in the archive")
    p.add_argument("--mutator", choices=("auto", "llm", "catalog"), default="auto",
                   help="auto: the LLM when one is available (--server, --model, or GPT-OSS-20B "
                   "weights on a GPU machine), else the offline catalog of variants and tune edits")
    p.add_argument("--model", default=None, help="local transformers model (name or folder) for the "
                   f"mutator and the forecaster; default {DEFAULT_MODEL} on a GPU when its weights are cached")
    p.add_argument("--forecaster-model", default=None, help="a different local model for the forecaster")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder for the forecaster model (from train_grpo.py)")
    p.add_argument("--server", default=None, help="OpenAI-compatible server URL (vLLM/SGLang), used "
                   "for both the mutator and the forecaster, e.g. http://localhost:8000/v1")
    p.add_argument("--server-model", default=DEFAULT_MODEL, help="model name on --server")
    p.add_argument("--readout", choices=("verbalized", "logits"), default=None,
                   help="forecast read-out; default logits for the embedded model, else verbalized")
    p.add_argument("--scale", choices=("benchmark", "cpu"), default=None,
                   help="measurement scale; default benchmark on a GPU, cpu otherwise")
    p.add_argument("--timeout", type=float, default=None, help="seconds per measurement (measure.py's default if unset)")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="measure candidates without measure.py's bubblewrap sandbox (for machines without "
                   "user namespaces): LLM-written code then runs as you and can forge later measurements")
    p.add_argument("--out", default=None, help="output folder; default runs/<task>-<gate>-<seed> "
                   "(runs/<task>-compare-<seed> with --compare); rerun with the same --out to resume")
    p.add_argument("--compare", action="store_true", help="run the gated and the ungated search with "
                   "the same budget and seed into OUT/gated and OUT/ungated and compare them")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _check_args(args):
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise SearchError(f"--out {args.out} is an existing file; pass a folder (a new one, or a run's to resume it)")
    for name in ("budget", "steps", "parents", "mutations", "measure_per_parent", "keep_children"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise SearchError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    if args.threshold is not None and not 0 <= args.threshold <= 1:
        raise SearchError(f"--threshold must be in [0, 1], got {args.threshold}")
    for name in ("target_risk", "delta"):
        if not 0 < getattr(args, name) < 1:
            raise SearchError(f"--{name.replace('_', '-')} must be in (0, 1), got {getattr(args, name)}")


class Lazy:
    """A model built on its first use, not at start-up. Loading one takes ~40 s (the embedded
    SmolLM2 on a CPU) to minutes (GPT-OSS-20B); a resumed run whose requests are all answered from
    its event log never uses it, so never pays that."""

    def __init__(self, build):
        self._build, self._built = build, None

    def __getattr__(self, name):  # only called for attributes Lazy itself lacks
        if name.startswith("_"):
            raise AttributeError(name)
        if self._built is None:
            try:
                self._built = self._build()
            except ModelNotFound as e:
                raise SearchError(str(e)) from None
        return getattr(self._built, name)


def setup(args, say=print):
    """Pick the scale, the mutator and the forecaster for this machine, and say what was chosen."""
    import torch

    import tasks
    has_gpu = torch.cuda.is_available()
    scale = args.scale or ("benchmark" if has_gpu else "cpu")
    if scale == "benchmark" and not has_gpu:
        raise SearchError("--scale benchmark needs a CUDA GPU; drop it to measure at CPU scale")
    say(f"measurement: {scale} scale" + ("" if scale == "benchmark" else
        " (Triton interpreter on small shapes, CPU times, NOT GPU times; on a GPU machine "
        "the paper's benchmark shapes are timed with CUDA events)"))

    # Models are named and checked here but loaded on first use (Lazy): a resumed run may need none.
    import forecaster_backends as b

    def local_model(name):  # a named model must be here: fail at start-up, not at the first use
        try:
            return b.pick_local_model(name)
        except ModelNotFound as e:
            raise SearchError(str(e)) from None
    llm, llm_name = None, None
    want_llm = args.mutator != "catalog" or (args.gate != "none" or args.compare)
    if args.server:
        llm = Lazy(lambda: b.OpenAIServerBackend(args.server, model=args.server_model))
        llm_name = f"{args.server_model} at {args.server}"
    elif args.model or want_llm:
        llm_name = local_model(args.model)
        if llm_name:
            llm = Lazy(lambda: b.TransformersBackend(llm_name))

    description = tasks.get_task(args.task).DESCRIPTION
    if args.mutator == "llm" and llm is None:
        raise SearchError("--mutator llm needs a model: pass --server URL or --model NAME")
    if llm is not None and args.mutator != "catalog":
        mutator, mutator_name = LLMMutator(llm, description), f"llm:{llm_name}"
        say(f"mutator: LLM {llm_name}")
    else:
        mutator, mutator_name = CatalogMutator(tasks.variant_sources(args.task)), "catalog"
        why = "asked for with --mutator catalog" if args.mutator == "catalog" else (
            "no mutator LLM here; pass --server URL (vLLM/SGLang) or --model NAME, or run on a GPU "
            f"machine with {DEFAULT_MODEL} downloaded, for the paper's LLM mutations")
        say(f"mutator: offline catalog (the task's hand-written variants and `# tune:` edits): {why}")

    forecaster, forecaster_name = None, ""
    if args.gate != "none" or args.compare:
        if args.forecaster_model:
            local_model(args.forecaster_model)
            fname, build = args.forecaster_model, lambda: b.TransformersBackend(args.forecaster_model, adapter=args.adapter)
        elif args.server and args.adapter:  # the server serves the adapter under its own name
            fname, build = llm_name, lambda: b.OpenAIServerBackend(args.server, model=args.server_model, adapter=args.adapter)
        elif llm is not None and args.adapter:  # a second copy of the model, with the adapter
            fname, build = llm_name, lambda: b.TransformersBackend(llm_name, adapter=args.adapter)
        elif llm is not None:  # the mutator's model forecasts too
            fname, build = llm_name, lambda: llm
        else:
            fname, build = "embedded SmolLM2-135M", b.embedded_backend
        embedded = fname.startswith("embedded")
        readout = args.readout or ("logits" if embedded else "verbalized")
        forecaster = Lazy(lambda: Forecaster(build(), readout=readout))
        forecaster_name = f"{fname} ({readout} read-out)" + (f" + {args.adapter}" if args.adapter else "")
        say(f"forecaster: {forecaster_name}" + (
            ": a 135M model cannot judge kernels, its forecasts only exercise the pipeline; pass "
            "--server URL or --forecaster-model NAME (GPT-OSS-20B) for real forecasts" if embedded else ""))

    gated_mutations = 16
    if forecaster_name.startswith("embedded") and args.mutations is None:
        gated_mutations = CPU_GATED_MUTATIONS
        say(f"mutations: {gated_mutations} per parent with a gate (the paper forecasts 16; pass "
            "--mutations 16 once a real forecaster is at hand)")
    real = mutator_name.startswith("llm") and scale == "benchmark"
    budget = args.budget or (PAPER_BUDGET if real else CPU_BUDGET)
    if args.budget is None and not real:
        say(f"budget: {budget} measurements (the small default of a run without an LLM mutator or "
            f"GPU); the paper's search is --budget {PAPER_BUDGET} --steps 40")
    import measure_sandbox
    if args.unsafe_no_sandbox:
        say("measurement sandbox: none (--unsafe-no-sandbox): candidate code runs unconfined, as you")
    else:
        try:  # at start-up, not at the first measurement minutes later
            measure_sandbox.require_sandbox()
        except measure_sandbox.SandboxUnavailable as e:
            raise SearchError(str(e)) from None
    measure_kwargs = {"scale": scale, "unsafe_no_sandbox": args.unsafe_no_sandbox} | (
        {"timeout_s": args.timeout} if args.timeout else {})
    return dict(scale=scale, mutator=mutator, mutator_name=mutator_name, forecaster=forecaster,
                forecaster_name=forecaster_name, budget=budget, description=description,
                gated_mutations=gated_mutations,
                measure_kwargs=measure_kwargs)


def make_config(args, gate, env):
    return Config(task=args.task, gate=gate, seed=args.seed, steps=args.steps, budget=env["budget"],
                  parents=args.parents, mutations=args.mutations or (4 if gate == "none" else env["gated_mutations"]),
                  measure_per_parent=args.measure_per_parent, rank_by=args.rank_by, score=args.score,
                  threshold=args.threshold, target_risk=args.target_risk, delta=args.delta,
                  min_labels=args.min_labels, keep_children=args.keep_children,
                  mutator=env["mutator_name"], forecaster=env["forecaster_name"] if gate != "none" else "",
                  scale=env["scale"])


def run_one(args, gate, out, env, say=print):
    import measure
    import tasks
    cfg = make_config(args, gate, env)
    say(f"search: {cfg.task}, gate {gate}, {cfg.mutations} mutations per parent, budget "
        f"{cfg.budget} measurements, {cfg.steps} steps x {cfg.parents} parents -> {out}")
    search = Search(cfg, out, seed_code=tasks.seed_source(args.task), description=env["description"],
                    mutator=env["mutator"], measure_fn=measure.measure, forecaster=env["forecaster"],
                    measure_kwargs=env["measure_kwargs"], progress=not args.no_progress, say=say)
    return search.run()


def _report(s):
    return (f"best speedup {s['best_speedup']:.3f}x ({s['best_node']}) after {s['measurements']} "
            f"measurements, {s['candidates_considered']} candidates considered, {s['forecasts']} "
            f"forecasts, {s['skipped']} skipped")


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        _check_args(args)
        if args.compare:
            gate = args.gate if args.gate != "none" else "topk"
            out = Path(args.out or f"runs/{args.task}-compare-{args.seed}")
            env = setup(args)
            results = {arm: run_one(args, g, out / arm, env) for arm, g in (("ungated", "none"), ("gated", gate))}
            print(f"{'':10}{'considered':>12}{'measured':>10}{'skipped':>9}{'best':>9}")
            for arm, s in results.items():
                print(f"{arm:10}{s['candidates_considered']:>12}{s['measurements']:>10}{s['skipped']:>9}"
                      f"{s['best_speedup']:>8.3f}x")
            write_compare(out, results, args.task)
            print(f"wrote {out / 'compare.png'} and {out / 'compare.json'}")
        else:
            out = Path(args.out or f"runs/{args.task}-{args.gate}-{args.seed}")
            summary = run_one(args, args.gate, out, setup(args))
            print(_report(summary))
            print(f"wrote {out}/: events.jsonl archive.json best_kernel.py summary.json "
                  "training_rows.jsonl best_speedup.png")
    except (SearchError, RecordError) as e:
        print(f"search.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("search.py: interrupted; rerun the same command to resume from its events.jsonl", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
