"""search.py: PUCT kernel search with an LLM mutator and a forecaster gate (docs/PAPER.md §1, §4, §7).

    python search.py --task cross_entropy

The seed kernel (the task's PyTorch reference) is measured first and becomes the archive's root.
Then every step of the search runs these phases, in this order (Search.run):
  1. Select. PUCT picks parents from the archive of measured kernels (puct.py).
  2. Mutate. A mutator proposes children of each parent: an LLM given the parent's code and its
     measured feedback (LLMMutator), or, with no LLM at hand, the task's hand-written variants and
     edits of their `# tune:` constants (CatalogMutator). Code proposed before is dropped.
  3. Forecast. With a gate, the forecaster forecasts every child's speedup over the reference: a
     language model, or with --forecaster costmodel a learned cost model (costmodel.py) that is
     refit on the search's measured kernels so far, as Ansor's is.
  4. Gate. The gate decides which children deserve a real measurement (--gate; gate.py):
     none (measure every mutation: the paper's standard search), topk (measure the k best by
     expected bin: its surrogate-filtered search, 16 forecast, 4 measured per parent) or
     confidence (the selective gate: measure when unsure or when a gain is predicted).
  5. Measure. measure.py measures the chosen children; the reward is the geomean speedup over the
     reference. (With --forecast-reward a child the confidence gate trusts is not measured: its
     forecast's expected speedup is its reward, and it is marked as a forecast: never a training
     row, the best kernel or a point of the measured curve.) Each success is a training row for
     the forecaster (training_rows.jsonl) and a label for the confidence gate: the search's
     measurements train the forecaster that gates the next search. Measurements run
     concurrently, one per device (measure_pool.py): a parent's children are sent off when
     chosen, the next parent is mutated and forecast meanwhile, and results are taken in the
     order sent, so the archive is a serial run's. A learnt confidence gate first waits for the
     labels of the step's earlier parents.
  6. Update. The successful children enter the archive (failures count as visits only), the step
     is logged and the run's outputs are rewritten.

Defaults that run anywhere (search_setup.plan_search picks them and says so at start-up): with no GPU and
no model weights the plain command searches the CPU's own kernels (--space cpu: C++ built with
load_inline, torch.compile, PyTorch rewrites, each timed on one core, its build part of its
measurement) with the offline catalog mutator (or, for a task with nothing in the catalog, the
embedded SmolLM2's rewrites, which almost never compile), gated by the learned cost model (online,
milliseconds a forecast; --forecaster llm for the embedded SmolLM2, whose forecasts carry no
information), CPU-scale measurement and a budget of 8 measurements. On a GPU machine with GPT-OSS-20B downloaded (or with --server) it runs
the paper's search: an LLM mutator, benchmark-scale measurement, 40 steps x 2 parents, 320
measurements.

Outputs in --out: events.jsonl, archive.json, best_kernel.py, summary.json, training_rows.jsonl
(the paper's RL-pool schema, dataset.py) and best_speedup.png (plots.py), each rewritten
atomically after every step (records.py), and report.html when the search ends (report.py: the
search as one page, drawn from events.jsonl alone). --compare runs the gated and the ungated
search with the same budget (the paper's Figure 4) and draws both on one page.

Decisions this file documents:
  - Budget: --budget counts measurements of *candidates*, counted when sent (so those in flight
    count too: never more than --budget). The seed is measured once before the search as its
    root and anchor and is not counted (the paper's 320 = 40 steps x 2 parents x 4).
  - The gate's rules (trust or defer, a gain over the parent, the learnt threshold, the ranking,
    the budget's cut) are gate.py's.
  - Resume: every request and result is a line in OUT/events.jsonl. A rerun replays the search
    from the start, answering each request from the log; only requests without a logged result
    are issued again. Mutation, forecast and measurement results are all logged (a measurement's
    when it arrives, with its worker and times), so the replay rebuilds the same archive without
    an LLM or a GPU, and a crash loses no result that came back. The options are stored in a
    config event; a rerun with different ones is refused, except --steps and --budget, which may
    grow to extend a finished search. Models load on their first use, so resuming loads none.
  - The default gate is topk (the paper's surrogate-filtered search). On the CPU path the embedded
    forecaster takes seconds per candidate, so it forecasts 6 mutations per parent, not 16.
  - In topk ranking, parse failures come after every parsed forecast, and deferrals (the abstain
    variant's: the model declined to forecast; the cost model's before it has labels) between the
    two; the confidence gate measures a deferral as it measures any forecast it defers. A child a
    gate cut while its forecast was a deferral was cut unjudged: it is forgotten (no longer "code
    proposed before"), so a mutator may propose it again once the forecaster has learnt.
  - --protocol paper is the original's search (docs/FIDELITY.md): the forecaster's paper prompt and
    one retry of a forecast that does not parse, 4 children per parent kept in the archive, and
    exactly --budget (320) measurements: the step count never cuts the budget short (the first
    step has one parent, the seed, so 40 steps x 2 parents x 4 would measure 316).
  - Goal-conditioned search (--target-bin B; eval_set.py runs it to fill a short bin of its eval
    set): the reward is -|ln S - ln m_B|, m_B the bin's midpoint (mutators.goal_band), so PUCT
    expands and the archive keeps the kernels closest to the band instead of the fastest, and an
    LLM mutator is asked to land in the band. It measures every mutation (--gate none).
  - fast_1 in summary.json: the share of measured candidates that were correct and faster than the
    reference (bins.fast_p), the KernelBench measure of a search's candidates.
  - Audits (--audit F): a live search never learns what its gate skipped. A random fraction F of
    the skipped children (not those skipped for the budget; a draw fixed by the seed and the
    child's id, so a rerun audits the same) is measured anyway, outside the budget, and logged as
    `audit` events that nothing in the search reads: the report estimates the gate's miss rate from
    them. F is not part of the search's identity: it never changes what the search does.
The options are one dataclass, Args, which is also the command line: `python search.py --help`.
"""
from runtime import cli  # first, on its own: a Ctrl-C while the rest loads is one line (runtime/cli.py)

# isort: split
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import bins
import tasks
from data.dataset import training_row
from data.records import EventLog, RecordError, write_atomic
from forecast_answer import Forecast
from gate import DELTA, GATES, RANK_KEYS, TARGET_RISK, forecast_speedup, select
from models.forecaster_backends import EMBEDDED_DTYPES, ServerError
from models.lm import DEFAULT_MODEL
from mutators import goal_reward
from paper_protocol import PROTOCOLS
from puct import Archive, Child
from runtime.cli import flag
from search_setup import (CPU_BUDGET, CPU_GATED_MUTATIONS, EMBEDDED_MUTATIONS, PAPER_BUDGET, SetupError,
                          expected_duration, plan_search)
from tasks import TASK_NAMES


class SearchError(Exception):
    """A problem the user can fix; main() prints it as one line."""


# ---- the options: this dataclass is the command line ---------------------------------------------

# logged: part of the search's identity, recorded in its event log; a rerun of the same --out with
# another value is refused (steps and budget may grow: a rerun can extend a search).
@dataclass
class Args:
    """PUCT kernel search with an LLM mutator and a forecaster gate (the paper's Figure 4 with
    --compare)."""
    task: str = flag(None, f"the kernel task to optimise: {', '.join(TASK_NAMES)}; or a problem file (KernelBench's "
                     "format, or tasks/problem_file.py's); or kernelbench:LEVEL/NAME", required=True, logged=True)
    kernelbench_dir: str | None = flag(None, "a KernelBench checkout, for --task kernelbench:LEVEL/NAME "
                                       "(default $KERNELBENCH_DIR)")
    protocol: str = flag("ours", "paper: the original's search (its forecast prompt, one retry of a forecast "
                         "that does not parse, 4 children kept per parent, exactly --budget measurements); "
                         "ours: this project's (docs/FIDELITY.md)", choices=PROTOCOLS, logged=True)
    gate: str = flag("topk", "none: measure every mutation; topk: forecast all, measure the best "
                       "--measure-per-parent; confidence: the selective gate (measure when unsure or when "
                       "a gain over the parent is predicted)", choices=GATES, logged=True)
    seed: int = flag(0, "seed of the mutators and of the run's name", logged=True)
    budget: int | None = flag(None, "candidate measurements (the seed's is not counted); default "
                                f"{PAPER_BUDGET} with an LLM mutator at benchmark scale, else {CPU_BUDGET}")
    steps: int | None = flag(None, "most search steps; default 40, with --protocol paper as many as the "
                             "budget needs")
    parents: int = flag(2, "parents expanded per step (lineage-blocked)", logged=True)
    mutations: int | None = flag(None, "mutations per parent; default 4 with --gate none, 16 with a gate "
                                   f"({CPU_GATED_MUTATIONS} with the embedded CPU forecaster); "
                                   f"{EMBEDDED_MUTATIONS} with the embedded mutator", logged=True)
    measure_per_parent: int = flag(4, "most candidates measured per parent with a gate", logged=True)
    rank_by: str = flag("expected_bin", "forecast key that ranks candidates (expected bin index or "
                          "log2-speedup)", choices=RANK_KEYS, logged=True)
    score: str = flag("maxprob", "confidence score of the confidence gate", choices=bins.CONFIDENCE_KINDS,
                        logged=True)
    threshold: float | None = flag(None, "fixed confidence threshold of the confidence gate; default: learnt "
                                     "from the measurements so far with selective.guaranteed_risk_threshold",
                                     logged=True)
    target_risk: float = flag(TARGET_RISK, "bin-mismatch rate the learnt threshold must guarantee", logged=True)
    delta: float = flag(DELTA, "failure probability of that guarantee", logged=True)
    abstain: bool = flag(False, "the forecaster may defer a candidate to the GPU with a second tool (the "
                         "abstain variant; verbalized read-out); a deferral is measured", logged=True)
    forecast_reward: bool = flag(False, "with --gate confidence: a trusted forecast's expected speedup is the "
                                 "child's reward in the archive, with no GPU run (marked as a forecast; never "
                                 "a training row or the best kernel); a deferred child is measured", logged=True)
    parse_retries: int | None = flag(None, "forecasts that do not parse are generated again up to N times; "
                                     "default 0, 1 with --protocol paper", logged=True)
    min_labels: int = flag(8, "measured forecasts needed before a threshold is learnt (defer all until then)",
                             logged=True)
    c: float = flag(1.0, "PUCT exploration constant (the paper's 1.0)", logged=True)
    keep_children: int | None = flag(None, "best children per expansion kept in the archive; default 2, "
                                     "4 with --protocol paper", logged=True)
    capacity: int = flag(1000, "most kernels kept in the archive", logged=True)
    target_bin: int | None = flag(None, "goal-conditioned search: reward -|ln S - ln m| for the midpoint m "
                                    "of this bin (1..8), so the search aims at the bin's band, not at speed "
                                    "(eval_set.py --fill); needs --gate none", choices=bins.BINS, logged=True)
    mutator: str = flag("auto", "auto: the LLM when one is available (--server, --model, or GPT-OSS-20B "
                          "weights on a GPU machine), else the offline catalog (the task's hand-written variants "
                          "and edits of their `# tune:` constants) when the task has either, else the embedded "
                          "SmolLM2-135M's rewrites; embedded: those rewrites (a minute each on a CPU; they "
                          "almost never compile)", choices=("auto", "llm", "catalog", "embedded"), logged=True)
    model: str | None = flag(None, "local transformers model (name or folder) for the mutator and the "
                               f"forecaster; default {DEFAULT_MODEL} on a GPU when its weights are cached")
    forecaster_model: str | None = flag(None, "a different local model for the forecaster")
    adapter: str | None = flag(None, "LoRA adapter folder for the forecaster model (from train_grpo.py); with "
                                 "--server, the name the server serves it under (vllm serve --enable-lora "
                                 "--lora-modules NAME=FOLDER), which the forecaster's requests ask for")
    server: str | None = flag(None, "OpenAI-compatible server URL (vLLM/SGLang), used for both the mutator "
                                "and the forecaster, e.g. http://localhost:8000/v1; several replicas of the "
                                "model separated by commas (requests go to the least loaded)")
    server_model: str = flag(DEFAULT_MODEL, "model name on --server")
    mutator_server: str | None = flag(None, "a different OpenAI-compatible server for the mutator only (the "
                                      "paper mutated with a hosted model and forecast with GPT-OSS-20B); the "
                                      "API key from $OPENAI_API_KEY")
    mutator_model: str | None = flag(None, "the mutator's model name on --mutator-server (default --server-model)")
    llm_device: str | None = flag(None, "GPU of a local LLM (mutator and forecaster), e.g. cuda:1, away from "
                                  "the GPUs the measurements time on; default: the last GPU, which the "
                                  "measurements then leave out when there are several")
    no_memory_check: bool = flag(False, "skip the start-up check that the LLM and the measure workers fit in "
                                 "the GPU's memory (its worker figure is an estimate)")
    forecaster: str = flag("auto", "llm: a language model forecasts each child (a server, a local model, or the "
                           "embedded SmolLM2 on CPU); costmodel: a learned cost model (LightGBM trees on features "
                           "of the code, costmodel.py) refit on this search's own measured kernels before each "
                           "forecast, deferring every child to measurement until it has --costmodel-min-labels; "
                           "auto: llm, except on a CPU with no LLM named (--server, --model, --forecaster-model, "
                           "--adapter), where the cost model forecasts in milliseconds and the embedded SmolLM2's "
                           "forecasts would mean nothing and take seconds each", choices=("auto", "llm", "costmodel"))
    costmodel_min_labels: int = flag(5, "with --forecaster costmodel: measured kernels (the seed's included) before "
                                     "the cost model gates; until then every child is measured")
    costmodel_rows: str | None = flag(None, "with the cost model: rows measured before that it starts from (comma-"
                                      "separated training rows, e.g. earlier searches' training_rows.jsonl, or "
                                      "hf:OWNER/NAME); its first forecasts come from them, then the search's own "
                                      "measurements join them", logged=True, metavar="ROWS")
    readout: str | None = flag(None, "forecast read-out; default logits for the embedded model, else "
                                 "verbalized", choices=("verbalized", "logits"))
    embedded_dtype: str = flag("auto", "dtype of the embedded CPU forecaster; auto: bfloat16 on CPUs that compute "
                               "it natively (AMX or AVX512-BF16: 1.5x to 3x faster), float32 elsewhere (exact numbers)", choices=EMBEDDED_DTYPES)
    scale: str | None = flag(None, "measurement scale; default benchmark on a GPU, cpu otherwise",
                               choices=("benchmark", "cpu"), logged=True)
    space: str = flag("auto", "the kernels the search writes: triton (tasks/kernels/<task>/, the GPU's kernels; a "
                      "CPU runs them in Triton's interpreter, some 200x slower than PyTorch); cpu (tasks/kernels/"
                      "<task>/cpu/: PyTorch rewrites, torch.compile, C++ built with load_inline, timed on one core, and "
                      "the compiled form of any plain PyTorch kernel; the LLM mutator is asked for CPU code); all "
                      "(both, on a CPU); auto: triton on a GPU, cpu without one",
                      choices=("auto", "cpu", "triton", "all"), logged=True)
    timeout: float | None = flag(None, "seconds per measurement (measure.py's default if unset)")
    devices: str = flag("all", "GPUs that measure, one candidate at a time each: all, or indices such as "
                          "0,1,3 (on a machine without a GPU: see --workers)")
    workers: int | None = flag(None, "measurements at once: on CPU N measure workers (default 1; their "
                                 "CPU timings disturb each other), on a GPU machine the first N of --devices")
    ray: str | None = flag(None, "measure on a Ray cluster instead, one task per measurement asking for a GPU "
                             "(on CPU a share of the CPUs, --workers at once, default one per CPU): auto joins the cluster this machine belongs to (`ray start`), "
                             "local starts one here, or a cluster's address")
    unsafe_no_sandbox: bool = flag(False, "measure candidates without measure.py's bubblewrap sandbox (for "
                                     "machines without user namespaces): LLM-written code then runs as you "
                                     "and can forge later measurements")
    out: str | None = flag(None, "output folder; default runs/<task>-<gate>-<seed> (runs/<task>-compare-"
                             "<seed> with --compare); rerun with the same --out to resume")
    compare: bool = flag(False, "run the gated and the ungated search with the same budget and seed into "
                           "OUT/gated and OUT/ungated and compare them")
    audit: float = flag(0.0, "measure this random fraction (0..1) of the children the gate skips anyway, outside "
                        "the budget, as audits the search never learns from: report.html estimates from them how "
                        "often the gate skipped a child faster than its parent (its miss rate)", metavar="F")
    no_cache: bool = flag(False, "measure and forecast every kernel anew: neither read nor write the caches of "
                          "measurements and forecasts, which every run and checkout of this user shares (start-up "
                          "says where, and what they hold for this run)")
    no_progress: bool = flag(False, "no progress bar on a terminal, no progress lines elsewhere (by default a "
                             "line a minute into a log or a pipe: measurements done, time spent and left)")


def build_parser():
    """The command line of Args (cli.py): one --flag per field, with its default and help."""
    return cli.parser(Args)


def parse_args(argv=None):
    """Args from the command line, checked (a SearchError names the flag to fix)."""
    args = cli.parse(Args, argv)
    if args.kernelbench_dir:
        os.environ["KERNELBENCH_DIR"] = args.kernelbench_dir
    try:
        tasks.get_task(args.task)  # an unknown task, or a problem file lacking what its format needs
    except ValueError as e:
        raise SearchError(f"--task: {e}") from None
    if args.task not in TASK_NAMES and not args.task.startswith("kernelbench:"):
        # a problem file by its absolute path: the rows and logs name it wherever they are read
        args = replace(args, task=str(Path(args.task).resolve()))
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
    if not 0 <= args.audit <= 1:
        raise SearchError(f"--audit is the fraction of skipped children measured anyway, in [0, 1], got {args.audit}")
    if args.parse_retries is not None and args.parse_retries < 0:
        raise SearchError(f"--parse-retries must be at least 0, got {args.parse_retries}")
    if args.costmodel_min_labels < 2:
        raise SearchError(f"--costmodel-min-labels must be at least 2 (its calibration holds kernels out), got "
                          f"{args.costmodel_min_labels}")
    if args.forecast_reward and args.gate != "confidence":
        raise SearchError("--forecast-reward needs --gate confidence: only a forecast the selective gate "
                          "trusts may stand in for a measurement")
    if args.target_bin is not None and (args.gate != "none" or args.compare):
        raise SearchError("--target-bin runs a goal-conditioned search, which measures every mutation; "
                          "pass --gate none (and no --compare)")
    return args


def with_protocol_defaults(args):
    """The options with the protocol's defaults (paper_protocol.PROTOCOLS) filled in where none was given."""
    protocol = PROTOCOLS[args.protocol]
    return replace(args, keep_children=args.keep_children or protocol.keep_children,
                   parse_retries=protocol.parse_retries if args.parse_retries is None else args.parse_retries,
                   steps=args.steps or (args.budget if protocol.exact_budget and args.budget else 40))


# ---- the search -------------------------------------------------------------------------------

@dataclass
class SearchStats:
    """What the search has done so far (counts, seconds, each measured candidate's speedup);
    summary.json reports it."""
    steps: int = 0
    measurements: int = 0
    forecasts: int = 0
    considered: int = 0
    proposed: int = 0
    failed_mutations: int = 0
    duplicates: int = 0
    skipped: int = 0
    failed_measurements: int = 0
    from_cache: int = 0           # measurements the shared cache answered (measured by an earlier run)
    from_log: int = 0             # measurements a resumed run took from its own event log
    forecast_rewards: int = 0     # children that entered the archive on a trusted forecast
    skipped_by_reason: dict = field(default_factory=dict)
    speedups: list = field(default_factory=list)  # per measured candidate; None when it failed
    mutation_s: float = 0.0
    forecast_s: float = 0.0
    measurement_s: float = 0.0
    # What the run's measurements cost when they were made (measure.py's wall_s, a build included;
    # one from the cache or the log counts what it cost then), and of that, building the kernels.
    measuring_cost_s: float = 0.0
    build_s: float = 0.0


@dataclass
class InFlight:
    """A candidate sent to the measurement pool whose result collect() has yet to take."""
    result: object         # a Future of the logged measurement
    id: str
    code: str
    forecast: object       # its Forecast, None without a gate
    parent: object         # its parent's archive Node
    number: int            # its place in the budget: the curve's x
    replayed: bool = False  # answered from this run's event log (a resume)


class Search:
    """One PUCT search writing into out_dir. args: the options with plan_search()'s choices filled
    in (budget, mutations and scale numbers and names; mutator the mutator's name). All
    collaborators are injected so tests can script them: mutator.propose(parent, n, seen, key),
    pool.submit(task, source, **measure_kwargs) -> a Future of {measurement: dict, worker,
    started, ended, seconds} (measure_pool.py; a MeasurePool around a scripted measure function),
    forecaster.forecast_many(task, anchor_code, codes) -> objects with probs, parse_failed and
    to_dict(). forecaster_name is recorded in the event log (one log holds one search). online: the
    forecaster learns from the search (costmodel.CostModelForecaster): forecaster.learn(rows) is handed
    the training rows measured so far before each forecast.

    Lines marked `# plumbing: resume` are the event log's (a rerun replays the search from the
    log); `# plumbing: concurrency` lines keep the measurements in flight apart from the LLM's
    work and the learnt gate. A first read may skip both."""

    def __init__(self, args, out_dir, *, seed_code, mutator, pool, forecaster=None,
                 forecaster_name="", measure_kwargs=None, llm_waits=False, online=False, progress=True, say=print,
                 expected_s=None):
        self.args, self.out = with_protocol_defaults(args), Path(out_dir)
        self.expected_s = expected_s  # the start-up estimate of the run's seconds (search_setup.expected_duration)
        self.seed_code, self.mutator, self.pool = seed_code, mutator, pool
        self.forecaster, self.forecaster_name = forecaster, forecaster_name
        self.online = online  # the forecaster learns from this search's measurements (the cost model)
        self.measure_kwargs, self.progress, self.say = dict(measure_kwargs or {}), progress, say
        self.llm_waits = llm_waits  # a local LLM shares a GPU with the measurements
        if args.gate != "none" and forecaster is None:
            raise SearchError(f"--gate {args.gate} needs a forecaster")
        if args.forecast_reward and args.gate != "confidence":
            raise SearchError("--forecast-reward needs --gate confidence")
        if args.budget is None or args.mutations is None or args.scale is None:
            raise ValueError("Search needs args with budget, mutations and scale set (run_one fills them in)")

    def run(self):
        """Measure the seed, then run steps of select -> mutate -> forecast -> gate -> measure ->
        update until the budget or the steps are spent. Returns the summary."""
        a, t_start = self.args, time.time()
        self._open_log()                                                    # plumbing: resume
        self.archive = Archive(c=a.c, capacity=a.capacity, keep_children=a.keep_children)
        self.stats, self.labels, self.rows, self.curve, self.in_flight = SearchStats(), [], [], [], []
        self.audits = []  # (measurement, parent's speedup) of skipped children (--audit): never read by the search
        self.bar = _progress(a.budget, self.progress, self.expected_s, f"search ({a.gate} gate)")
        self._measure_seed()
        for step in range(a.steps):
            if self.stats.measurements >= a.budget:
                break
            parents = self.archive.select(a.parents)                        # 1. select
            children = {}
            for k, pid in enumerate(parents):
                if self.stats.measurements >= a.budget:
                    break  # nothing left to measure: do not mutate or forecast for nothing
                parent, tag = self.archive.nodes[pid], f"s{step}p{k}"
                if self.llm_waits:
                    self.collect(children)  # plumbing: concurrency (no timing on the LLM's GPU while it computes)
                    self.wait_audits()
                cands = self.mutate(parent, step, k, tag)                   # 2. mutate
                forecasts = self.forecast(cands, step, parent, tag)         # 3. forecast
                if a.gate == "confidence" and a.threshold is None:
                    self.collect(children)  # plumbing: concurrency (the gate learns from every label so far)
                chosen, trusted = self.gate(parent, cands, forecasts, step, tag)  # 4. gate
                children[pid] = self.forecast_children(trusted, cands, forecasts)  # (trusted: no GPU run)
                self.measure(chosen, cands, forecasts, step, parent)        # 5. measure: sent...
            self.collect(children)                                          # ... and back
            self.update(step, parents, children, t_start)                    # 6. update
        self.bar.close()
        self.wait_audits()
        self.log.note("end", "end", None, None, {                           # the report: the run is complete
            "measurements": self.stats.measurements, "steps": self.stats.steps, "budget": a.budget,
            "audits": len(self.audits)})
        self._write_outputs(t_start, plot=True)
        self.close()                                                        # plumbing: resume
        return self.summary(t_start)

    def close(self):
        """Close the event log (and end the progress): at the end of run(), and at a Ctrl-C, after
        which the measurements in flight are not logged (their workers end with the process, and a
        `crashed` verdict would be the interruption's, not the candidate's): a rerun sends them again."""
        if getattr(self, "bar", None) is not None:
            self.bar.close()
        if getattr(self, "log", None) is not None:
            self.log.close()

    def _measure_seed(self):
        """The seed is the archive's root: the anchor of every forecast, not counted in the budget."""
        self.log.note("seed", "seed", -1, None, {"code": self.seed_code})  # the report: the root's code
        replayed = ("measurement", "seed") in self.log.results                # plumbing: resume
        res = self.logged("measurement", "seed", -1, None, self._send, self.seed_code).result()
        self.stats.measurement_s += res["seconds"]
        m = res["measurement"]
        self._count_source(m, replayed)
        self._count_cost(m)
        if m["status"] != "ok" or not m.get("speedup"):
            raise SearchError(f"the seed kernel did not measure ok ({m['status']}: {m.get('message', '')}); "
                              f"check the seed of --task {self.args.task} with measure.py")
        self.archive.add_seed("seed", self.seed_code, self.reward(m), info={"result": _brief(m)})
        self._row("seed", self.seed_code, m, "seed")
        self.seen = {self.seed_code.strip()}
        self.best = m["speedup"]
        self.curve.append((0, self.best))

    def reward(self, m):
        """A measured kernel's reward: its speedup, or its closeness to --target-bin's band."""
        target = self.args.target_bin
        return m["speedup"] if target is None else goal_reward(m["speedup"], target)

    def mutate(self, parent, step, k, tag):
        """2. [(candidate id, code)] of the parent's new children; failed and repeated code dropped."""
        stats = self.stats
        mutation = self.logged("mutation", f"{tag}/mutate", step, parent, self._mutate, parent, step, k)
        stats.mutation_s += mutation["seconds"]
        cands = []
        for i, c in enumerate(mutation["candidates"]):
            stats.proposed += 1
            if c["code"] is None:
                stats.failed_mutations += 1
            elif c["code"].strip() in self.seen:
                stats.duplicates += 1
            else:
                self.seen.add(c["code"].strip())
                cands.append((f"{tag}c{i}", c["code"]))
        stats.considered += len(cands)
        return cands

    def forecast(self, cands, step, parent, tag):
        """3. A Forecast per candidate (none without a gate)."""
        if self.args.gate == "none" or not cands:
            return []
        answer = self.logged("forecast", f"{tag}/forecast", step, parent, self._forecast, [code for _, code in cands])
        self.stats.forecasts += len(answer["forecasts"])
        self.stats.forecast_s += answer["seconds"]
        return [forecast_from_log(entry) for entry in answer["forecasts"]]  # plumbing: resume

    def gate(self, parent, cands, forecasts, step, tag):
        """4. (indices of the candidates to measure, in order; indices whose trusted forecast stands
        in for a measurement, with --forecast-reward); the rest are skipped with a reason (gate.py)."""
        room = max(0, self.args.budget - self.stats.measurements)
        chosen, trusted, skipped, tau = select(self.args, parent.reward, forecasts, self.labels, len(cands), room)
        for reason in skipped.values():
            self.stats.skipped_by_reason[reason] = self.stats.skipped_by_reason.get(reason, 0) + 1
        self.stats.skipped += len(skipped)
        audited = [j for j, why in sorted(skipped.items()) if why != "budget spent" and self.audited(cands[j][0])]
        self.log.note("selection", f"{tag}/select", step, parent.id, {        # plumbing: resume
            "measure": [cands[j][0] for j in chosen], "threshold": tau,
            "skip": {cands[j][0]: why for j, why in sorted(skipped.items())},
            **({"forecast_reward": [cands[j][0] for j in trusted]} if self.args.forecast_reward else {}),
            # the report: how many labels the confidence gate had; which skipped children are audited
            **({"labels": len(self.labels)} if self.args.gate == "confidence" else {}),
            **({"audit": [cands[j][0] for j in audited], "audit_fraction": self.args.audit} if self.args.audit else {})})
        self.audit([cands[j] for j in audited], step, parent)
        for j, why in skipped.items():
            # A child cut while its forecast was a deferral (the cost model before its first labels,
            # or the abstain tool) was cut unjudged, by the order of proposal: forget it, so that a
            # later mutation may propose it again to a forecaster that has learnt since. (Without
            # this, a finite catalog loses for good whatever a cold gate happened to cut.)
            if why != "budget spent" and forecasts[j].deferred:
                self.seen.discard(cands[j][1].strip())
        return chosen, trusted

    def audited(self, cid):
        """(--audit F) Whether a skipped child is measured anyway: a draw of probability F fixed by
        the seed and the child's id, so a rerun audits the same children."""
        return random.Random(f"audit/{self.args.seed}/{cid}").random() < self.args.audit

    def audit(self, cands, step, parent):
        """(--audit) Measure skipped children anyway, outside the budget, logged as audits. Their
        results are never labels, training rows, archive nodes or points of the curve: the search
        decides as it would without them, and only the report reads them (the gate's miss rate)."""
        for cid, code in cands:
            self.audits.append((self.logged("audit", cid, step, parent, self._send, code),
                                parent.info["result"].get("speedup")))

    def wait_audits(self):
        """The audits sent so far have come back (and are logged)."""
        for result, _ in self.audits:
            result.result()

    def audit_misses(self):
        """How many audited children came back faster than their parent: the gate's misses, which
        the report turns into a rate with its interval."""
        misses = 0
        for result, parent_speedup in self.audits:
            m = result.result()["measurement"] if result.done() else {}
            misses += bool(m.get("status") == "ok" and parent_speedup and (m.get("speedup") or 0) > parent_speedup)
        return misses

    def forecast_children(self, trusted, cands, forecasts):
        """(--forecast-reward) The trusted children as archive children whose reward is their
        forecast's expected speedup, marked measured=False: no GPU run, no training row, no point
        on the measured curve."""
        children = []
        for j in trusted:
            cid, code = cands[j]
            r = forecast_speedup(forecasts[j])
            children.append(Child(cid, code, r, {"result": {"status": "forecast", "speedup": r}}, measured=False))
        self.stats.forecast_rewards += len(children)
        return children

    def measure(self, chosen, cands, forecasts, step, parent):
        """5. Send the chosen candidates to the measurement pool; collect() takes the results. Each
        counts against the budget from the moment it is sent."""
        for j in chosen:
            cid, code = cands[j]
            replayed = ("measurement", cid) in self.log.results              # plumbing: resume
            result = self.logged("measurement", cid, step, parent, self._send, code)
            result.add_done_callback(lambda done, r=replayed: self._counted(done, r))
            self.stats.measurements += 1
            forecast = forecasts[j] if forecasts else None
            self.in_flight.append(InFlight(result, cid, code, forecast, parent, self.stats.measurements, replayed))

    def _counted(self, done, replayed):
        """The progress counts a measurement come back; one from the log or the cache took no time
        (not part of the rate the time left is reckoned at)."""
        try:
            instant = replayed or bool(done.result()["measurement"].get("cached"))
        except Exception:  # noqa: BLE001 - collect() takes the result and reports it
            instant = False
        self.bar.update(1, instant=instant)

    def collect(self, children):
        """5. The results of the measurements in flight, taken in the order they were sent: the
        successful children join children[parent], each success is a training row and a label."""
        stats = self.stats
        for sent in self.in_flight:
            res = sent.result.result()
            stats.measurement_s += res["seconds"]
            m = res["measurement"]
            self._count_source(m, sent.replayed)
            self._count_cost(m)
            ok = m["status"] == "ok" and bool(m.get("speedup"))
            stats.speedups.append(m["speedup"] if ok else None)
            if sent.forecast is not None and ok and sent.forecast.probs is not None:  # a label for the gate
                self.labels.append((sent.forecast, bins.speedup_to_bin(m["speedup"])))
            if ok:
                children[sent.parent.id].append(Child(sent.id, sent.code, self.reward(m), {"result": _brief(m)}))
                self._row(sent.id, sent.code, m, "parent_edit")
                self.best = max(self.best, m["speedup"])
            else:
                stats.failed_measurements += 1
                sent.parent.info["last_failure"] = _brief(m)
            self.curve.append((sent.number, self.best))
        self.in_flight = []

    def update(self, step, parents, children, t_start):
        """6. The children enter the archive (PUCT's visit counts grow), the step is logged and the
        outputs are rewritten."""
        kept = {pid: self.archive.expand(pid, offered, step=step) for pid, offered in children.items()}
        self.stats.steps += 1
        self.log.note("step", f"step{step}", step, None, {                 # plumbing: resume
            "parents": parents, "kept": kept, "best_speedup": self.best,
            "measurements": self.stats.measurements, "archive_size": len(self.archive.nodes)})
        self._write_outputs(t_start)

    def _count_source(self, m, replayed):
        """Where a measurement came from: this run's event log, the shared cache, or a measurement now."""
        if replayed:
            self.stats.from_log += 1
        elif m.get("cached"):
            self.stats.from_cache += 1

    def _count_cost(self, m):
        """What a measurement cost when it was made, and its build (report.build_seconds)."""
        from report import build_seconds  # the ledger's rule (report.py is imported lazily: plotly)
        self.stats.measuring_cost_s += m.get("wall_s") or 0.0
        self.stats.build_s += build_seconds(m) or 0.0

    def _row(self, node_id, code, m, pair_type):
        run = f"{tasks.task_label(self.args.task)}-{self.args.gate}-{self.args.seed}"
        self.rows.append(training_row(self.args.task, run, node_id, self.seed_code, code, m, pair_type))

    # ==== plumbing: the event log and its replay, the expensive calls, the outputs ================

    def logged(self, kind, request_id, step, parent, work, *work_args):
        """work(*work_args)'s result, logged as `kind` under request_id: when an earlier run of this
        --out logged it, that result, and the work is not done again (a resume). A measurement
        runs while the search goes on: its result is a Future, logged the moment it arrives."""
        parent_id = parent.id if parent is not None else None
        if kind in ("measurement", "audit"):
            return self.log.submit(kind, request_id, step, parent_id, lambda: work(*work_args))
        return self.log.call(kind, request_id, step, parent_id, lambda: work(*work_args))

    def _open_log(self):
        """Open the event log and claim it for these options (one log holds one search: a rerun
        with other options is refused); a log that holds this search already resumes it."""
        self.log = EventLog(self.out / "events.jsonl")
        mine = json.loads(json.dumps(self.identity()))
        old = next((e["payload"] for e in self.log.events if e["kind"] == "config"), None)
        if old is not None and "space" not in old:  # a log from before --space searched the Triton kernels
            old = {**old, "space": "triton"}
        if old is None:
            self.log.append("config", None, "config", None, mine)
        else:
            for k in list(mine) + [k for k in old if k not in mine]:  # task, gate, seed first
                if old.get(k) != mine.get(k):
                    raise SearchError(f"{self.out} holds a run with {k}={old.get(k)!r}, but this "
                                      f"command asks for {k}={mine.get(k)!r}; rerun with the same "
                                      "options or pass a new --out")
            self.say(f"resuming from {self.out / 'events.jsonl'} ({len(self.log.events)} events)")

    def identity(self):
        """The logged options, with the forecaster's name: steps and budget may grow between runs
        of one --out (a rerun can extend a search), where and how it runs (--out, --server, ...)
        may change."""
        logged = {f.name: getattr(self.args, f.name) for f in fields(self.args) if f.metadata.get("logged")}
        return logged | {"forecaster": self.forecaster_name}

    def _mutate(self, parent, step, k):
        started = time.perf_counter()
        cands = self.mutator.propose(parent, self.args.mutations, set(self.seen), f"{self.args.seed}/{step}/{k}")
        prompt = self.mutator.messages(parent) if hasattr(self.mutator, "messages") else None  # an LLM's chat
        return {"candidates": cands, "mutator": self.mutator.name, "seconds": time.perf_counter() - started,
                **({"prompt": prompt} if prompt else {})}

    def _forecast(self, codes):
        started = time.perf_counter()
        # Ansor's loop: an online surrogate refits on every kernel measured so far. Only a live
        # forecast gets here; a replay answers from the log and never refits.
        if self.online:
            self.forecaster.learn(self.rows)
        forecasts = self.forecaster.forecast_many(self.args.task, self.seed_code, codes)
        return {"forecasts": [forecast_to_log(f) for f in forecasts], "seconds": time.perf_counter() - started}

    def _send(self, code):
        return self.pool.submit(self.args.task, code, **self.measure_kwargs)

    def summary(self, t_start):
        stats, best = self.stats, self.archive.best()
        return {
            "task": self.args.task, "gate": self.args.gate, "seed": self.args.seed,
            "protocol": self.args.protocol,
            "mutator": self.args.mutator, "forecaster": self.forecaster_name or None,
            "budget": self.args.budget, "steps": stats.steps, "max_steps": self.args.steps,
            "measurements": stats.measurements,
            "seed_measurements": 1, "from_cache": stats.from_cache, "from_log": stats.from_log,
            "candidates_proposed": stats.proposed,
            "candidates_considered": stats.considered, "failed_mutations": stats.failed_mutations,
            "duplicates": stats.duplicates, "forecasts": stats.forecasts, "skipped": stats.skipped,
            "audits": len(self.audits), "audit_misses": self.audit_misses(),
            "forecast_rewards": stats.forecast_rewards,
            "skipped_by_reason": stats.skipped_by_reason, "failed_measurements": stats.failed_measurements,
            "fast_1": bins.fast_p(stats.speedups, 1.0), "target_bin": self.args.target_bin,
            "training_rows": len(self.rows), "best_speedup": best.info["result"]["speedup"],
            "best_reward": best.reward, "best_node": best.id,
            "best_noise": best.info["result"].get("noise"), "best_within_noise": best.info["result"].get("within_noise"),
            "seed_speedup": self.archive.nodes["seed"].info["result"]["speedup"],
            "archive_size": len(self.archive.nodes),
            "best_vs_measurements": self.curve,
            "time_s": {"mutation": round(stats.mutation_s, 3), "forecast": round(stats.forecast_s, 3),
                       "measurement": round(stats.measurement_s, 3),
                       # what the measurements cost when made (cached ones included), builds included
                       "measuring_cost": round(stats.measuring_cost_s, 3), "build": round(stats.build_s, 3),
                       "this_run_wall": round(time.time() - t_start, 3)},
        }

    def _write_outputs(self, t_start, plot=False):
        write_outputs(self.out, self.archive, self.summary(t_start), self.rows,
                      self.curve if plot else None, f"{self.args.task}: best speedup vs measurements")


def write_outputs(out, archive, summary, rows, curve=None, title=""):
    """Rewrite the run's outputs in `out`, each atomically; draw best_speedup.png when a curve is
    given."""
    out = Path(out)
    write_atomic(out / "archive.json", json.dumps(archive.to_dict(), indent=1))
    write_atomic(out / "best_kernel.py", archive.best().code)
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    write_atomic(out / "training_rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    if curve is not None:
        from data import plots  # matplotlib (which writes its config folders) only when a plot is drawn
        plots.plot_curves({f"{summary['gate']} gate": curve}, out / "best_speedup.png", title)


def write_compare(out, results, task):
    """compare.json and compare.png of a --compare run: {arm: summary} of the gated and the
    ungated search with the same budget."""
    out = Path(out)
    from data import plots
    plots.plot_curves({f"{arm} ({s['gate']})": s["best_vs_measurements"] for arm, s in results.items()},
                 out / "compare.png", f"{task}: gated vs ungated search, same budget")
    write_atomic(out / "compare.json", json.dumps(results, indent=1))


def _brief(m):
    return {k: m.get(k) for k in ("status", "speedup", "noise", "within_noise", "cases", "message")}


def forecast_to_log(f):
    """What the event log keeps of a forecast: what the gate reads (probabilities, a parse failure,
    a deferral) and the forecaster's full record."""
    return {"parse_failed": bool(f.parse_failed), "deferred": bool(getattr(f, "deferred", False)),
            "probs": None if f.probs is None else [float(p) for p in f.probs], "record": f.to_dict()}


def forecast_from_log(entry):
    """The Forecast the gate reads, from a logged forecast: live and replayed runs read the same log."""
    probs = entry["probs"]
    return Forecast(probs=probs, parse_failed=entry["parse_failed"], deferred=entry.get("deferred", False),
                    predicted_bin=None if probs is None else bins.predicted_bin(probs))


def _progress(total, enabled, expected_s=None, what="search"):
    """The measurements' progress: a bar on a terminal, a line a minute elsewhere (cli.Progress)."""
    return cli.Progress(what, total, "measurements", expected_s=expected_s, enabled=enabled)


# ---- the command line -------------------------------------------------------------------------

def run_one(args, gate, out, plan, say=print):
    """One search with `gate`: the options with this machine's choices filled in, then Search.run."""
    args = with_protocol_defaults(replace(
        args, gate=gate, budget=plan.budget, scale=plan.scale, mutator=plan.mutator_name, space=plan.space,
        mutations=args.mutations or plan.mutations or (4 if gate == "none" else plan.gated_mutations),
        forecast_reward=args.forecast_reward and gate != "none"))
    say(f"search: {args.task}, protocol {args.protocol}, gate {gate}, {args.mutations} mutations per parent, "
        f"{args.parents} parents a step, {args.keep_children} children kept per parent; it ends when its "
        f"{args.budget} measurements are spent, or after {args.steps} steps -> {out}")
    expected_s, words = expected_duration(args, plan)
    say(words)
    search = Search(args, out, seed_code=tasks.seed_source(args.task), mutator=plan.mutator,
                    pool=plan.pool, forecaster=plan.forecaster,
                    forecaster_name=plan.forecaster_name if gate != "none" else "",
                    measure_kwargs=plan.measure_kwargs, llm_waits=plan.llm_waits, online=plan.online and gate != "none",
                    progress=not args.no_progress, say=say, expected_s=expected_s)
    try:
        summary = search.run()
    except KeyboardInterrupt:
        search.close()  # what comes back from now on may be the interruption's doing: not logged
        raise
    write_report([out], Path(out) / "report.html", say)
    return summary


def write_report(runs, path, say=print):
    """report.html: the search (or searches) as one page, drawn from the run folders (report.py).
    A page that cannot be drawn leaves the run's other outputs as they are and says how to retry."""
    import report  # plotly loads only when a page is drawn
    try:
        report.write_report(runs, path)
    except Exception as e:  # noqa: BLE001 - the search's results are written; the page is a view of them
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        say(f"search.py: warning: {path} not written ({first}); retry with: python report.py "
            + " ".join(str(r) for r in runs) + (f" --out {path}" if len(runs) > 1 else ""))


def _report(s):
    """The run's closing lines: the best kernel (the seed's speedup is the reference's against
    itself, so it is said whether it lies within its noise of 1.0), the counts, and where the
    measurements came from."""
    fast = "-" if s["fast_1"] is None else f"{s['fast_1']:.2f}"
    best = f"best speedup {s['best_speedup']:.3f}x ({s['best_node']}"
    if s["best_node"] == "seed":
        best += ": the seed is the reference itself, and no candidate measured faster"
    if s.get("best_within_noise") and s.get("best_noise"):
        best += f"; within the measurement's noise of 1.0, +-{2 * s['best_noise']:.1%} at two standard errors"
    lines = [f"{best}) after {s['measurements']} measurements, {s['candidates_considered']} candidates considered, "
             f"{s['forecasts']} forecasts, {s['skipped']} skipped, fast_1 {fast}"
             + (f", {s['forecast_rewards']} admitted on a forecast" if s["forecast_rewards"] else "")]
    total = s["measurements"] + s["seed_measurements"]
    sources = [f"{s['from_log']} from this run's events.jsonl" if s.get("from_log") else "",
               f"{s['from_cache']} from the cache (--no-cache measures them again)" if s.get("from_cache") else ""]
    if any(sources):
        now = total - s.get("from_log", 0) - s.get("from_cache", 0)
        lines.append(f"{total} measurements (the seed's included): " + ", ".join(filter(None, sources))
                     + f", {now} measured now")
    if s.get("audits"):
        lines.append(f"{s['audits']} skipped children audited (measured outside the budget, never learnt from): "
                     f"{s['audit_misses']} faster than their parent, the gate's misses; report.html gives the miss "
                     "rate with its interval")
    t = s.get("time_s") or {}
    if t.get("measuring_cost"):
        each = t["measuring_cost"] / total
        cost = (f"measuring cost {t['measuring_cost']:.0f} s, {each:.1f} s a measurement ({t['build']:.0f} s of it "
                "building kernels; a measurement taken from the cache counts what it cost when made)")
        if s["forecasts"] and t.get("forecast"):
            per = t["forecast"] / s["forecasts"]
            cost += (f"; forecasting {t['forecast']:.0f} s, {per:.2f} s a forecast: a measurement costs "
                     f"{each / per:.0f} forecasts")
        lines.append(cost)
    if s["measurements"] < s["budget"] and s["steps"] >= s["max_steps"]:
        lines.append(f"{s['budget'] - s['measurements']} of the budget's {s['budget']} measurements unused after the "
                     f"{s['steps']} steps of --steps: the mutator proposed too few new candidates (or the gate "
                     "skipped them)")
    return "\n".join(lines)


def _interrupted(signum, frame):
    """Ctrl-C: stop the search; a second Ctrl-C while it stops is ignored, so that the clean-up
    (the workers ended, the outputs consistent) is never cut short into a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv=None):
    plan, interrupted = None, False
    previous = signal.signal(signal.SIGINT, _interrupted) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        args = parse_args(argv)
        plan = plan_search(args)
        if args.compare:
            gate = args.gate if args.gate != "none" else "topk"
            out = Path(args.out or f"runs/{tasks.task_label(args.task)}-compare-{args.seed}")
            results = {arm: run_one(args, g, out / arm, plan) for arm, g in (("ungated", "none"), ("gated", gate))}
            print(f"{'':10}{'considered':>12}{'measured':>10}{'skipped':>9}{'best':>9}")
            for arm, s in results.items():
                print(f"{arm:10}{s['candidates_considered']:>12}{s['measurements']:>10}{s['skipped']:>9}"
                      f"{s['best_speedup']:>8.3f}x")
            write_compare(out, results, args.task)
            write_report([out / "ungated", out / "gated"], out / "report.html")
            print(f"wrote {out / 'compare.png'}, {out / 'compare.json'} and {out / 'report.html'}")
        else:
            # a cost-model search gets a folder of its own: the same command with the LLM's is another run
            arm = args.gate + ("-costmodel" if plan.online else "")
            out = Path(args.out or f"runs/{tasks.task_label(args.task)}-{arm}-{args.seed}")
            summary = run_one(args, args.gate, out, plan)
            print(_report(summary))
            print(f"wrote {out}/: events.jsonl archive.json best_kernel.py summary.json "
                  "training_rows.jsonl best_speedup.png report.html")
    except (SearchError, SetupError, RecordError, ServerError) as e:  # ServerError: the start-up checks of a --server
        print(f"search.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        interrupted = True
        print("search.py: interrupted; rerun the same command to resume from its events.jsonl", file=sys.stderr)
        return 130
    finally:
        if plan is not None:  # measurements in flight when a search fails still finish and are logged;
            plan.pool.close(wait=not interrupted)  # at a Ctrl-C they are left (Search.close)
        if previous is not None and not interrupted:  # interrupted, it is ending: a second Ctrl-C stays ignored
            signal.signal(signal.SIGINT, previous)
    return 0


if __name__ == "__main__":
    code = main()
    if code == 130:  # interrupted: measurements may still be in flight in the pool's threads
        cli.exit_interrupted(code)
    sys.exit(code)
