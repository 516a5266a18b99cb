"""search_setup.py: how a search is set up on the machine it runs on.

search.py's algorithm takes a mutator, a forecaster and measurement settings; this module picks
them for this machine from the command line's options, and says at start-up what it picked and
why, so a plain `python search.py --task cross_entropy` runs anywhere:
- the measurement scale: the paper's benchmark shapes timed with CUDA events on a GPU, small
  shapes in the Triton interpreter otherwise (CPU times, not GPU times);
- the mutator: an LLM (--server, --model, or GPT-OSS-20B weights cached on a GPU machine), else
  the offline catalog of the task's hand-written variants and `# tune:` edits;
- the forecaster (with a gate): a server, a local model with or without a LoRA adapter, or the
  embedded SmolLM2, which cannot judge kernels but exercises the pipeline;
- the budget and the mutations per parent, smaller without an LLM or a GPU;
- the sandbox: checked at start-up, not at the first measurement minutes later.
Models are named and checked here but built on first use (Lazy): a resumed run whose requests
are all answered from its event log builds none.
"""
from dataclasses import dataclass

from forecaster import Forecaster
from lm import DEFAULT_MODEL, ModelNotFound
from mutators import CatalogMutator, LLMMutator

CPU_BUDGET, PAPER_BUDGET = 8, 320
CPU_GATED_MUTATIONS = 6  # the embedded forecaster takes seconds per candidate on a CPU


class SetupError(Exception):
    """This machine cannot run the search as asked; the message says what to pass instead."""


@dataclass
class Setup:
    """What setup() chose for this machine. The models are named here and built on first use."""
    scale: str               # "benchmark" or "cpu"
    budget: int              # candidate measurements
    mutator: object          # LLMMutator or CatalogMutator
    mutator_name: str        # "llm:<model>" or "catalog", as the event log records it
    forecaster: object       # a Lazy Forecaster, or None without a gate
    forecaster_name: str     # "" without a gate
    gated_mutations: int     # mutations per parent with a gate (--mutations unless set)
    measure_kwargs: dict     # scale, sandbox and timeout for measure.measure


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
                raise SetupError(str(e)) from None
        return getattr(self._built, name)


def setup(args, say=print):
    """Pick the scale, the mutator and the forecaster for this machine, and say what was chosen."""
    import torch

    import tasks
    has_gpu = torch.cuda.is_available()
    scale = args.scale or ("benchmark" if has_gpu else "cpu")
    if scale == "benchmark" and not has_gpu:
        raise SetupError("--scale benchmark needs a CUDA GPU; drop it to measure at CPU scale")
    say(f"measurement: {scale} scale" + ("" if scale == "benchmark" else
        " (Triton interpreter on small shapes, CPU times, NOT GPU times; on a GPU machine "
        "the paper's benchmark shapes are timed with CUDA events)"))

    # Models are named and checked here but loaded on first use (Lazy): a resumed run may need none.
    import forecaster_backends as b

    def local_model(name):  # a named model must be here: fail at start-up, not at the first use
        try:
            return b.pick_local_model(name)
        except ModelNotFound as e:
            raise SetupError(str(e)) from None
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
        raise SetupError("--mutator llm needs a model: pass --server URL or --model NAME")
    if llm is not None and args.mutator != "catalog":
        mutator, mutator_name = LLMMutator(llm, description, target_bin=args.target_bin), f"llm:{llm_name}"
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
            raise SetupError(str(e)) from None
    measure_kwargs = {"scale": scale, "unsafe_no_sandbox": args.unsafe_no_sandbox} | (
        {"timeout_s": args.timeout} if args.timeout else {})
    return Setup(scale=scale, budget=budget, mutator=mutator, mutator_name=mutator_name,
                 forecaster=forecaster, forecaster_name=forecaster_name,
                 gated_mutations=gated_mutations, measure_kwargs=measure_kwargs)
