"""forecaster.py: a language model as a selective surrogate for GPU kernel timing.

The paper's central object. Given a task, a reference kernel and a candidate kernel, a language
model reasons about both and forecasts the candidate's speedup S = reference_time / candidate_time
as 8 probabilities over the log-spaced bins of bins.py. A selective gate then trusts confident
forecasts and defers uncertain ones to a real GPU measurement.

    Forecaster      prompts -> backend -> Forecasts, batched per task over the prompt prefix
                    the task's candidates share (computed once), with an on-disk cache
    run_eval        --eval: prediction rows for a file of rows, resumed where a run stopped
    main            the command line: one candidate's forecast and the gate's decision, or --eval
The gate that trusts or defers a forecast is gate.py's; the command line here prints its decision.

Protocols and variants (docs/FIDELITY.md): --protocol paper shows the original's prompt, gives
16384 new tokens and generates an answer that does not parse once more (the original's retry);
--abstain offers a second tool with which the model declines to forecast, with a reason (a native
deferral: the gate defers it, metrics.py counts it against coverage). An --eval row is shown the
hardware it was measured on (its `hardware` field), never the local GPU's.

Two read-outs of the forecast distribution:
  - "verbalized" (the paper's): the probabilities the model writes in its tool call. Default for
    GPT-OSS and any served model.
  - "logits": after the model's reasoning (or none at all when reasoning_tokens = 0) the answer is
    forced to begin `{"predicted_bin": ` and the next-token probabilities of "1".."8" are read in
    one forward pass, renormalised (raw_sum keeps the mass the 8 digits had). It cannot fail to
    parse. Default for the embedded SmolLM2, with no reasoning: a 135M model writes no usable
    JSON, but its next-token distribution is always defined.

A learned cost model (costmodel.py: gradient-boosted trees on features of the code, Ansor's kind
of surrogate) forecasts the same Forecast without a language model: `--costmodel DIR` (a folder
from train_costmodel.py) replaces the backend, for one candidate or for --eval.

What it builds on lives beside it: the prompt in forecast_prompt.py (build_messages: a "GPU
execution simulator" system message with the bin table, generated from bins.py so that prompt and
labels never disagree, and a user message with the task, both kernels and a hardware table; the
answer tool's schema); the forecast and its parser in forecast_answer.py (Forecast, parse_answer:
the tool call `submit_kernel_runtime_estimate` into a Forecast, never raising: anything unusable is
a parse failure with a reason); the backends (local transformers incl. GPT-OSS in harmony format,
an OpenAI-compatible server, the embedded SmolLM2) in forecaster_backends.py behind one `generate`
interface.
"""
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import bins
from data.dataset import load_rows, prediction_row, source_exists, written_predictions
from data.records import cache_dir, write_atomic
from forecast_answer import ANSWER_PREFIX, DIGITS, Forecast, failure, from_probs, parse_completion, reasoning_of
from forecast_prompt import HARDWARE_PROFILES, answer_tools, build_messages, hardware_info, row_hardware, shared_messages
from gate import Gate
from models.costmodel import CostModel, CostModelForecaster
from models.forecaster_backends import EMBEDDED_DTYPES, Completion, choose_backend
from models.lm import DEFAULT_MODEL, REASONING_EFFORTS
from paper_protocol import PROTOCOLS
from runtime import cli
from runtime.cli import flag

DEFAULT_CACHE_DIR = cache_dir("forecasts")


# ---- the forecaster -----------------------------------------------------------------------------------

class Forecaster:
    """Forecasts for many candidates at once, with an on-disk cache.

    readout: "verbalized" (default for GPT-OSS and servers) or "logits" (default for the embedded
    SmolLM2); reasoning_tokens: for the logits read-out, how many tokens the model may reason
    before its answer is read (0 = none, the default). cache_dir=None disables the cache.
    prefix_cache: hand the backend the prompt prefix that the candidates of a task share (system
    text, bins, task, reference, hardware: ~3,000 tokens), which it computes once per task and
    reuses (a local model's KV cache, a server's prefix cache); False recomputes it per candidate,
    the same forecasts within numerical noise, for comparison.
    hardware: the profile shown for a pair that brings none (forecast_pairs' `hardware`).
    protocol: "ours" or "paper" (forecast_prompt.py: the prompt and the tool's field names).
    abstain: offer the deferral tool (verbalized read-out only). parse_retries: generate a row
    again, with another seed, when its answer does not parse (the original's search retried once);
    a machinery error (server down, prompt too long) is not retried here."""

    def __init__(self, backend, readout=None, cache_dir=DEFAULT_CACHE_DIR, *, max_new_tokens=4096,
                 temperature=1.0, seed=0, reasoning_tokens=0, hardware=None, prefix_cache=True,
                 protocol="ours", abstain=False, parse_retries=0):
        self.backend = backend
        self.readout = readout or ("logits" if getattr(backend, "embedded", False) else "verbalized")
        if self.readout not in ("verbalized", "logits"):
            raise ValueError(f"read-out must be 'verbalized' or 'logits', got {self.readout!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; choose one of: {', '.join(PROTOCOLS)}")
        if abstain and self.readout != "verbalized":
            raise ValueError("the abstain variant needs the verbalized read-out: a deferral is a tool "
                             "call, which the logits read-out never reads; drop --abstain or use "
                             "--readout verbalized")
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.reasoning_tokens = reasoning_tokens
        self.prefix_cache = prefix_cache
        self.hardware = hardware_info() if hardware is None else hardware
        self.protocol, self.abstain, self.parse_retries = protocol, abstain, parse_retries
        self.tools = answer_tools(protocol, abstain)
        self.model = getattr(backend, "name", type(backend).__name__)

    def cache_key(self, messages, repeat):
        """sha256 of everything that can change the forecast: model, adapter, a local model's dtype,
        read-out, prompt and tools, sampling settings, seed, repeat and retries. The logits read-out without reasoning
        samples nothing, so its key leaves the sampling settings out."""
        prompt = hashlib.sha256(json.dumps([messages, self.tools], sort_keys=True).encode()).hexdigest()
        settings = dict(model=self.model, adapter=getattr(self.backend, "adapter", None),
                        readout=self.readout, prompt=prompt)
        dtype = getattr(getattr(self.backend, "model", None), "dtype", None)  # a local model's numbers
        if dtype is not None:
            settings["dtype"] = str(dtype)
        if self.readout == "verbalized" or self.reasoning_tokens:
            settings.update(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed,
                            repeat=repeat, reasoning_effort=getattr(self.backend, "reasoning_effort", None),
                            reasoning_tokens=self.reasoning_tokens)
        if self.parse_retries:
            settings["parse_retries"] = self.parse_retries
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()

    def _cached(self, key):
        path = self.cache_dir / f"{key}.json" if self.cache_dir else None
        if path is None or not path.exists():
            return None
        try:
            return Forecast.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError):
            return None  # a damaged entry is recomputed

    def _store(self, key, forecast):
        if self.cache_dir is None:
            return
        write_atomic(self.cache_dir / f"{key}.json", json.dumps(forecast.to_dict()))

    def forecast_many(self, task, reference_code, candidate_codes, *, repeat=0):
        """One Forecast per candidate against the same reference."""
        return self.forecast_pairs([(task, reference_code, c) for c in candidate_codes], repeat=repeat)

    def forecast_pairs(self, pairs, *, repeat=0, hardware=None):
        """One Forecast per (task, reference_code, candidate_code); `hardware`: one profile per pair
        (an eval row's own, forecast_prompt.row_hardware), else self.hardware for all. The cache
        misses of each (task, reference, hardware) run as one batch over their shared prompt prefix."""
        hardware = hardware or [self.hardware] * len(pairs)
        view = dict(protocol=self.protocol, abstain=self.abstain)
        convs = [build_messages(t, r, c, hw, **view) for (t, r, c), hw in zip(pairs, hardware)]
        keys = [self.cache_key(m, repeat) for m in convs]
        out = [self._cached(k) for k in keys]
        todo = [i for i, f in enumerate(out) if f is None]
        if todo:
            run = self._verbalized if self.readout == "verbalized" else self._logits
            seed = None if self.seed is None else self.seed + repeat
            groups = {}
            for i in todo:
                groups.setdefault(json.dumps([*pairs[i][:2], hardware[i]], sort_keys=True), []).append(i)
            for idx in groups.values():
                (task, reference, _), hw = pairs[idx[0]], hardware[idx[0]]
                shared = shared_messages(task, reference, hw, **view) if self.prefix_cache else None
                for i, (f, keep) in zip(idx, run([convs[i] for i in idx], seed, shared)):
                    f.readout, f.model = self.readout, self.model
                    out[i] = f
                    if keep:  # machinery errors (server down, prompt too long) are not cached
                        self._store(keys[i], f)
        return out

    def _verbalized(self, convs, seed, shared):
        def generate(rows, attempt):
            s = None if seed is None else seed + 1_000_003 * attempt  # a retry samples afresh
            return self.backend.generate(rows, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                         seed=s, tools=self.tools, shared=shared)
        comps = generate(convs, 0)
        out = [(parse_completion(c), not c.error) for c in comps]
        for attempt in range(1, self.parse_retries + 1):
            again = [i for i, (f, keep) in enumerate(out) if keep and f.parse_failed]
            if not again:
                break
            for i, c in zip(again, generate([convs[i] for i in again], attempt)):
                old, f = out[i][0], parse_completion(c)
                f.attempts = attempt + 1  # the cost of every attempt is the forecast's cost
                f.tokens_in, f.tokens_out = f.tokens_in + old.tokens_in, f.tokens_out + old.tokens_out
                f.seconds += old.seconds
                out[i] = (f, not c.error)
        return out

    def _logits(self, convs, seed, shared):
        t0 = time.perf_counter()
        reasoning = [""] * len(convs)
        comps = [Completion("") for _ in convs]
        if self.reasoning_tokens:
            comps = self.backend.generate(convs, max_new_tokens=self.reasoning_tokens, temperature=self.temperature,
                                          seed=seed, tools=self.tools, shared=shared)
            reasoning = [reasoning_of(c) for c in comps]
        prompts = [self.backend.answer_prompt(m, r, ANSWER_PREFIX, self.tools) for m, r in zip(convs, reasoning)]
        if shared:  # the same prefix in the backend's prompt form (it ends where the user's text is cut)
            shared = self.backend.answer_prompt(shared, None, "", self.tools)
        rows = self.backend.next_token_probs(prompts, DIGITS, shared=shared)
        seconds = (time.perf_counter() - t0) / max(1, len(convs))
        out = []
        for c, r, p, prompt in zip(comps, reasoning, rows, prompts):
            # the read-out's prompt: token ids here, or a chat prompt that a server counted (its Probs row)
            n_in = len(prompt) if isinstance(prompt[0], int) else getattr(p, "tokens_in", 0) or c.tokens_in
            if c.error or isinstance(p, str):
                out.append((failure(c.error or p, tokens_in=n_in, seconds=seconds), False))
                continue
            f = from_probs(p, reasoning=r, tokens_in=n_in, tokens_out=c.tokens_out, seconds=seconds)
            out.append((f or failure("logits read-out: no probability on the digits 1..8"), True))
        return out


# ---- evaluation over rows (the paper's eval set or our training rows) ------------------------------------

def run_eval(forecaster, rows_path, out_path, *, repeats=1, batch_size=8, progress=True):
    """Forecast every row `repeats` times into a Prediction-row JSONL file, appending one line per
    row (flushed), skipping (id, repeat) pairs already written: an interrupted run resumes. Each row
    is shown the hardware it was measured on (its `hardware` field; forecaster.hardware for a row
    that names none). Discovery pairs are rows too: the child is forecast against its parent. The
    progress: a bar on a terminal, a line a minute elsewhere (cli.Progress)."""
    from tasks import TASK_NAMES
    rows = load_rows(rows_path, tasks=TASK_NAMES)
    done = written_predictions(out_path)
    todo = [(r, k) for k in range(repeats) for r in rows if (r["row_id"], k) not in done]
    # a task's rows together: a batch then shares one prompt prefix (forecast_pairs groups by it)
    todo.sort(key=lambda rk: (rk[1], rk[0]["pack"], rk[0]["anchor_code"]))
    with open(out_path, "a") as out, cli.Progress("forecast", len(todo), "rows", enabled=progress) as bar:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            for k in sorted({k for _, k in chunk}):
                part = [r for r, kk in chunk if kk == k]
                pairs = [(r["pack"], r["anchor_code"], r["candidate_code"]) for r in part]
                hardware = [row_hardware(r, forecaster.hardware) for r in part]
                for r, f in zip(part, forecaster.forecast_pairs(pairs, repeat=k, hardware=hardware)):
                    out.write(json.dumps(prediction_row(r, f, k)) + "\n")
                    out.flush()
                    bar.update(1)
    return len(todo)


# ---- command line ---------------------------------------------------------------------------------------

def bar_chart(forecast, width=30):
    lines = []
    for b, p in zip(bins.BINS, forecast.probs):
        bar = "#" * round(p * width)
        lines.append(f"{b} {bins.BIN_NAMES[b - 1]:<24} {bins.bin_label(b):<15} |{bar:<{width}}| {p:5.3f}")
    return "\n".join(lines)


@dataclass
class Args:
    """Forecast a candidate GPU kernel's speedup over a reference as probabilities over 8 bins, and
    gate the forecast."""
    task: str | None = flag(None, "task name (one candidate mode), e.g. cross_entropy; or a problem file "
                            "(KernelBench's format, or tasks/problem_file.py's); or kernelbench:LEVEL/NAME")
    kernelbench_dir: str | None = flag(None, "a KernelBench checkout, for --task kernelbench:LEVEL/NAME "
                                       "(default $KERNELBENCH_DIR)")
    candidate: str | None = flag(None, "candidate kernel file (Python module defining custom_kernel, or "
                                 "class ModelNew for a KernelBench problem)")
    reference: str | None = flag(None, "reference kernel file (default: the task's seed kernel; a problem "
                                 "file's own source)")
    eval: str | None = flag(None, "forecast every row of eval, training or discovery rows: a JSON Lines file or a Hub "
                            "dataset hf:OWNER/NAME[/CONFIG][:SPLIT] (hf:codezakh/gpu-forecasters-eval-set)",
                            metavar="ROWS")
    out: str | None = flag(None, "prediction rows for --eval (appended; reruns resume)", metavar="PRED.jsonl")
    repeats: int = flag(1, "forecasts per row for --eval (paper: 3)")
    model: str | None = flag(None, f"local model name or path (default {DEFAULT_MODEL}; with --server the served "
                             "name)")
    adapter: str | None = flag(None, "LoRA adapter folder (peft) for a local model; with --server, serve it as a "
                               "model (vllm --lora-modules NAME=PATH) and pass --model NAME")
    server: str | None = flag(None, "OpenAI-compatible server URL, e.g. http://localhost:8000/v1 (vllm serve); "
                              "several replicas of the model separated by commas (requests go to the least loaded)")
    api_key: str | None = flag(None, "API key for --server (default: $OPENAI_API_KEY or 'EMPTY')")
    reasoning_effort: str = flag("medium", "GPT-OSS reasoning effort (paper: medium)", choices=REASONING_EFFORTS)
    readout: str | None = flag(None, "verbalized: the probabilities the model writes (default); logits: next-token "
                               "probabilities of the bin digits (default for the embedded model)",
                               choices=("verbalized", "logits"))
    reasoning_tokens: int = flag(0, "logits read-out: tokens of reasoning before the answer is read")
    protocol: str = flag("ours", "ours: this project's prompt; paper: the original's (its bin table and tool field "
                         "names, no task description, the hardware after the candidate), 16384 new tokens "
                         "and one retry of an answer that does not parse (docs/FIDELITY.md)", choices=PROTOCOLS)
    abstain: bool = flag(False, "the abstain variant: offer a second tool, defer_to_evaluator, with which the model "
                         "declines to forecast (with a reason); a deferral is deferred by the gate and counts "
                         "against coverage in metrics.py (verbalized read-out only)")
    parse_retries: int | None = flag(None, "generate an answer that does not parse again, up to N times (default 0; "
                                     "1 with --protocol paper, as the original's search did)")
    max_new_tokens: int | None = flag(None, "generation budget (default 4096; 16384 with --protocol paper, the "
                                      "paper's at evaluation)")
    temperature: float = flag(1.0, "sampling temperature (paper: 1.0; 0 = greedy)")
    seed: int = flag(0, "sampling seed (repeat k uses seed + k)")
    hardware: str | None = flag(None, "hardware profile shown to the model: for --task, default this machine's GPU, "
                                "else a100-80gb; for --eval, only for rows without a `hardware` field (default "
                                "a100-80gb, the paper's), every other row is shown the hardware it was measured on",
                                choices=sorted(HARDWARE_PROFILES))
    gate_score: str = flag("maxprob", "confidence score the gate uses", choices=bins.CONFIDENCE_KINDS)
    threshold: float = flag(0.5, "gate threshold: trust when the score is at least this")
    cache_dir: str = flag(str(DEFAULT_CACHE_DIR), "forecast cache folder")
    no_cache: bool = flag(False, "neither read nor write the forecast cache")
    no_prefix_cache: bool = flag(False, "recompute the prompt prefix that a task's candidates share (system text, "
                                 "bins, task, reference, hardware) for every candidate instead of once per task; "
                                 "the same forecasts within numerical noise, slower (for comparison)")
    batch_size: int | None = flag(None, "candidates run through the model together (default: as many as the GPU's "
                                  "free memory holds at the prompts' length, 8 on a CPU; 1 for the embedded model, "
                                  "for which a padded batch on a CPU costs more than it saves)")
    attention: str = flag("auto", "attention implementation of a local model; auto: flex attention for GPT-OSS on a "
                          "GPU (eager attention's score tensors do not fit at forecast prompt lengths), the model's "
                          "default otherwise")
    embedded: bool = flag(False, "use the embedded SmolLM2-135M (runs anywhere; forecasts NOT meaningful)")
    embedded_dtype: str = flag("auto", "the embedded model's dtype; auto: bfloat16 on CPUs that compute it natively "
                               "(AMX or AVX512-BF16: 1.5x to 3x faster), float32 elsewhere; float32 gives exact "
                               "numbers (bf16 moves probabilities by up to ~0.02)", choices=EMBEDDED_DTYPES)
    costmodel: str | None = flag(None, "forecast with a learned cost model (gradient-boosted trees on features of the "
                                 "code, trained by train_costmodel.py into DIR) instead of a language model; with "
                                 "--eval its prediction rows score beside an LLM's in metrics.py (pass both files)",
                                 metavar="DIR")
    json: bool = flag(False, "print the forecast as JSON")


def build_parser():
    """The command line of Args (cli.py): one --flag per field, with its default and help."""
    return cli.parser(Args)


def parse_args(argv=None):
    """Args from the command line, checked (a ValueError names the flag to fix), with the
    protocol's defaults (paper_protocol.PROTOCOLS) filled in where a flag was left unset."""
    args = cli.parse(Args, argv, gpu=False)
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.eval and not args.out:
        raise ValueError("--eval needs --out PRED.jsonl")
    if not args.eval and not (args.task and args.candidate):
        raise ValueError("give --task and --candidate (or --eval ROWS.jsonl --out PRED.jsonl)")
    if args.parse_retries is not None and args.parse_retries < 0:
        raise ValueError(f"--parse-retries must be at least 0, got {args.parse_retries}")
    if args.abstain and args.readout == "logits":
        raise ValueError("--abstain needs the verbalized read-out (a deferral is a tool call); drop --readout logits")
    protocol = PROTOCOLS[args.protocol]
    return replace(args, max_new_tokens=args.max_new_tokens or protocol.max_new_tokens,
                   parse_retries=protocol.parse_retries if args.parse_retries is None else args.parse_retries)


def _cannot_run(source, path):
    """Why a candidate's source could not be measured as it stands (it does not compile, or defines
    neither entry point), in a few words; None when it could."""
    import ast
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as e:
        return f"{path}, line {e.lineno}: {e.msg}: the candidate does not compile"
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if not defined & {"custom_kernel", "ModelNew"}:
        return f"{path} defines neither custom_kernel(data) nor class ModelNew"
    return None


def main(argv=None, backend=None):
    try:
        args = parse_args(argv)
        if args.eval:
            if not source_exists(args.eval):
                raise ValueError(f"cannot read rows file {args.eval}")
            from tasks import TASK_NAMES
            for row in load_rows(args.eval, tasks=TASK_NAMES):  # bad rows fail before any model loads
                row_hardware(row, None)
        else:
            from tasks import get_task, reference_source
            if args.kernelbench_dir:
                os.environ["KERNELBENCH_DIR"] = args.kernelbench_dir
            get_task(args.task)
            try:
                candidate = Path(args.candidate).read_text()
                reference = Path(args.reference).read_text() if args.reference else reference_source(args.task)
            except OSError as e:
                raise ValueError(f"cannot read kernel file {e.filename}: {e.strerror}")
            problem = _cannot_run(candidate, args.candidate)
            if problem:  # still forecast: a forecast of broken code is the user's to ask for, but said so
                print(f"warning: {problem}, so measure.py would fail it before timing anything; the forecast "
                      "below is of a kernel that cannot run", file=sys.stderr)
        gate = Gate(args.gate_score, args.threshold)
        t0 = time.perf_counter()
        if args.costmodel:  # the trees replace the language model: no backend, no prompt
            llm_only = [f"--{k.replace('_', '-')}" for k in ("server", "model", "adapter", "embedded", "abstain", "readout")
                        if getattr(args, k)]
            if llm_only:
                raise ValueError(f"{', '.join(llm_only)} configure a language model, which --costmodel replaces; drop them")
            hardware = hardware_info(args.hardware or "a100-80gb") if args.eval else hardware_info(args.hardware)
            model = CostModel.load(args.costmodel)
            fc = CostModelForecaster(model, hardware=hardware, name=f"costmodel {args.costmodel}")
            cpu = model.info.get("cpu_rows", 0)
            print(f"forecaster: cost model {args.costmodel} (LightGBM trees on features of the code; "
                  "train_costmodel.py)" + (f"; {cpu} of its {model.info.get('rows')} training rows are CPU times of "
                                          "interpreted kernels, not GPU times" if cpu else ""), file=sys.stderr)
            if args.eval:
                n = run_eval(fc, args.eval, args.out, repeats=args.repeats, batch_size=args.batch_size or 256)
                print(f"wrote {n} prediction rows to {args.out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                return 0
            f = fc.forecast_many(args.task, reference, [candidate])[0]
            return _show(f, args, gate)
        backend = backend or choose_backend(server=args.server, model=args.model, embedded=args.embedded,
                                            adapter=args.adapter, api_key=args.api_key,
                                            reasoning_effort=args.reasoning_effort, batch_size=args.batch_size,
                                            attention=args.attention, embedded_dtype=args.embedded_dtype)
        t_loaded = time.perf_counter()
        # an --eval row names its hardware; one that does not gets --hardware, else the paper's A100
        hardware = hardware_info(args.hardware or "a100-80gb") if args.eval else hardware_info(args.hardware)
        fc = Forecaster(backend, readout=args.readout or ("verbalized" if args.abstain else None),
                        cache_dir=None if args.no_cache else args.cache_dir, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, seed=args.seed, reasoning_tokens=args.reasoning_tokens,
                        hardware=hardware, prefix_cache=not args.no_prefix_cache, protocol=args.protocol,
                        abstain=args.abstain, parse_retries=args.parse_retries)
        retries, paper = args.parse_retries, args.protocol == "paper"
        generation = (f"{args.max_new_tokens} new tokens, {retries} retr{'y' if retries == 1 else 'ies'} of an "
                      "answer that does not parse" if fc.readout == "verbalized"
                      else f"logits read-out, {args.reasoning_tokens} reasoning tokens")
        print(f"protocol: {args.protocol} ({'the original prompt; ' if paper else ''}{generation}"
              f"{', abstain tool offered' if args.abstain else ''}; docs/FIDELITY.md)", file=sys.stderr)
        if args.eval:
            n = run_eval(fc, args.eval, args.out, repeats=args.repeats, batch_size=args.batch_size or 64)
            t_end = time.perf_counter()
            prefix = "recomputed for every candidate" if args.no_prefix_cache else "computed once per task"
            print(f"wrote {n} prediction rows to {args.out} in {t_end - t0:.1f} s (model load "
                  f"{t_loaded - t0:.1f} s, forecasts {t_end - t_loaded:.1f} s; shared prompt prefix "
                  f"{prefix})", file=sys.stderr)
            return 0
        f = fc.forecast_many(args.task, reference, [candidate])[0]
    except (ValueError, RuntimeError, OSError) as e:  # ModelNotFound is a RuntimeError; CostModelError a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _show(f, args, gate)


def _show(f, args, gate):
    """Print one forecast and the gate's decision; the exit status."""
    decision = gate.decide(f)
    if args.json:
        print(json.dumps({**f.to_dict(), "gate": decision, "gate_score": args.gate_score,
                          "confidence": f.confidence(args.gate_score)}))
    elif f.parse_failed:
        print(f"forecast failed ({f.model}): {f.parse_error}; gate: defer (measure on the GPU)")
    elif f.deferred:
        print(f"the model deferred ({f.model}): {f.reasoning}; gate: defer (measure on the GPU)")
    else:
        how = f"{f.model}, {f.readout} read-out" if f.readout else f.model
        print(f"{args.task}: {args.candidate} vs {args.reference or 'the seed kernel'} ({how})")
        print(bar_chart(f))
        print(f"expected speedup ~{2 ** f.expected_log2_speedup:.2f}x (expected bin {f.expected_bin:.2f}); "
              f"predicted bin {f.predicted_bin}" + (f", the model said {f.stated_bin}" if f.bin_disagrees else ""))
        print(f"confidence ({args.gate_score}) {f.confidence(args.gate_score):.3f}; gate (>= {args.threshold}): {decision}")
    return 1 if f.parse_failed else 0


if __name__ == "__main__":
    sys.exit(main())
