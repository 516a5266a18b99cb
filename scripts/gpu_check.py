"""GPU check: the project's measurements on a real GPU, in one run of at most 8 minutes (--quick: 3).

The sections, in the order they run (the cheap and telling first):
  timer          the timer's fixed cost: CUDA events around an empty callable and around one tiny
                 kernel, next to do_bench's on the same;
  cross_entropy  every kernel (the seed and each hand-written Triton variant; --quick: the seed and
                 one) at the paper's benchmark shapes: measure.py's result beside the same callable
                 timed here by triton.testing.do_bench(return_mode="median") and their ratio (a
                 cross-check of our timer), the achieved bandwidth against the 4*B*V-byte physical
                 floor and the 6*B*V-byte two-pass floor, the reference worker's peak GPU memory (the
                 figure a plan of a GPU shared with the language model needs), and (not --quick) one
                 measurement repeated to show run-to-run spread;
  gpu tests      the suite's GPU-only tests (`pytest -m gpu`; --quick: the measurement's);
  other tasks    the seed and variants of the other tasks through measure.py;
  engine         the transformers engine at GPT-OSS-20B's full shape (random bf16 weights, no
                 download): prefill and decoding tokens/s and peak memory with flex attention at
                 batch 1 and at the batch sized from free memory (beside lm_memory's estimate), eager
                 attention's peak at batch 1, and a LoRA adapter merged, switched off and unmerged
                 (peft's path), see engine_sections;
  surrogate      candidates measured per GPU-minute (fresh `# tune:` edits, no cache); the cost of a
                 forecast against a measurement's (eight candidates forecast by a GPT-OSS of
                 GPT-OSS-20B's width with --forecast-layers layers, logits and verbalized read-outs,
                 with and without the shared prompt prefix's KV cache); a GRPO step (votes, 2 prompts
                 x G = 8) without prompt sharing, with it, and with it and checkpointing off.
Each section runs in a child process under a time limit and is appended to docs/gpu_runs.md
(dated, with the GPU's name) as soon as it ends, so a section that fails or runs out of time leaves
the ones before it recorded, and its own output up to then. --quick (the timer, cross_entropy, the
measurement's GPU tests) is the first command on a new GPU machine.

Where bubblewrap cannot run, the sandbox is skipped for the project's own kernels measured here
(and for the GPU tests' measurements), and the first line of the output and of the record says so.

    python scripts/gpu_check.py [--quick] [--no-record] [--tasks cross_entropy,trimul,...] [--no-surrogate]
                                [--no-tests] [--no-engine] [--engine-layers N] [--unsafe-no-sandbox]

It needs a CUDA GPU, and runs on older stacks too (torch 2.11 / triton 3.6).
"""
import argparse
import contextlib
import datetime
import importlib.util
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import measure  # noqa: E402
from harness.estimate import peak_bandwidth  # noqa: E402
from tasks import TASK_NAMES, get_task, seed_path, variant_paths  # noqa: E402


def load_kernel(path):
    spec = importlib.util.spec_from_file_location(f"k_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.custom_kernel


def do_bench_ms(fn, data):
    import triton.testing
    return triton.testing.do_bench(lambda: fn(data), warmup=25, rep=100, return_mode="median")


def estimate_gib(task):
    """search.py's start-up estimate of a measure worker's GPU memory, printed beside the measured peak."""
    import search_setup
    return search_setup.worker_gpu_bytes(task) / 2**30


# ---- the suite's GPU tests and the timer's own cost ----------------------------------------------

def gpu_tests(emit, timeout_s=360, unsafe=False, files=()):
    """`pytest -m gpu` in a child process: the tests only a GPU can settle (those of `files`, or
    all); --unsafe-no-sandbox passes on to their measurements (tests/conftest.py)."""
    emit(f"### the suite's GPU-only tests (`pytest -m gpu{' ' + ' '.join(files) if files else ''}"
         f"{' --unsafe-no-sandbox' if unsafe else ''}`)")
    emit("")
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rfE",
                            *files, *(["--unsafe-no-sandbox"] if unsafe else [])],
                           cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        lines = r.stdout.strip().splitlines()
        failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        emit(f"exit {r.returncode}: {lines[-1] if lines else r.stderr.strip()[-300:]}")
        for ln in failed:
            emit(f"- {ln[:300]}")
    except subprocess.TimeoutExpired:
        emit(f"did not finish in {timeout_s} s")
    emit("")


def timer_overhead(emit):
    """What the worker's timer adds by itself: CUDA events around nothing, and around one tiny
    kernel; do_bench's figure for the tiny kernel beside it."""
    import statistics

    import triton.testing

    from harness.measure_worker import CudaTimer
    timer = CudaTimer()
    x = torch.zeros(1, device="cuda")
    emit("### the timer's fixed cost (200 calls, L2 flush before each, as in measure.py)")
    emit("")
    emit("| timed callable | median us | p10 us | p90 us | do_bench median us |")
    emit("|---|---|---|---|---|")
    for name, fn in (("empty callable", lambda d: None), ("one tiny kernel, x.add_(1)", lambda d: x.add_(1))):
        timer.run(fn, [None] * 20)
        ms = sorted(timer.run(fn, [None] * 200)[1])
        db = "-" if name.startswith("empty") else f"{triton.testing.do_bench(lambda: x.add_(1), return_mode='median') * 1e3:.1f}"
        emit(f"| {name} | {statistics.median(ms) * 1e3:.1f} | {ms[20] * 1e3:.1f} | {ms[180] * 1e3:.1f} | {db} |")
    emit("")
    del timer
    torch.cuda.empty_cache()


# ---- the surrogate's economics -----------------------------------------------------------------

GPT_OSS_20B_WIDTH = dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                         num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                         sliding_window=128)


def config_model(layers, width="20b", device="cuda"):
    """A GPT-OSS with random weights from a config, no download: GPT-OSS-20B's width (or the tests'
    tiny one) with `layers` layers alternating sliding and full attention, the harmony vocabulary;
    bf16 on a GPU. Its forecasts mean nothing; its costs are those of `layers` of GPT-OSS-20B's 24."""
    sys.path.insert(0, str(ROOT / "tests"))
    import tiny_models
    from transformers import GptOssForCausalLM
    overrides = GPT_OSS_20B_WIDTH if width == "20b" else {}
    cfg = tiny_models.tiny_gpt_oss_config(
        vocab_size=tiny_models.HARMONY_VOCAB, max_position_embeddings=16384, num_hidden_layers=layers,
        layer_types=(["sliding_attention", "full_attention"] * layers)[:layers], **overrides)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in bf16: 24 layers in fp32 would take 84 GB first
    try:
        with torch.device(device):
            model = GptOssForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    from models import lm
    return lm.use_attention(model.eval())


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measurement_throughput(emit, n, unsafe=False):
    """n fresh candidates through measure.py at benchmark shapes: seconds per measurement."""
    from bench_forecast import candidates
    codes = candidates(5 + n)[5:]  # `# tune:` edits, after the hand-written variants (compiled above)
    emit(f"### measurements per GPU-minute: {len(codes)} fresh cross_entropy `# tune:` edits "
         "(compile + check + time, measure.py, no cache)")
    emit("")
    emit("| candidate | status | speedup | wall s |")
    emit("|---|---|---|---|")
    walls = []
    for i, code in enumerate(codes):
        t0 = time.perf_counter()
        m = measure.measure("cross_entropy", code, device="cuda", use_cache=False, unsafe_no_sandbox=unsafe)
        walls.append(time.perf_counter() - t0)
        emit(f"| tune edit {i + 1} | {m.status} | {f'{m.speedup:.3f}x' if m.speedup else '-'} | {walls[-1]:.1f} |")
    mean = sum(walls) / len(walls)
    emit("")
    emit(f"Mean {mean:.1f} s per measurement: {60 / mean:.1f} candidates measured per GPU-minute.")
    emit("")
    return mean


def forecast_costs(emit, model, codes, reference, measurement_s, device="cuda", verbalized_tokens=64,
                   task="cross_entropy", batch_size=8):
    """Wall time of forecasting `codes` against `reference`, per read-out, with and without the
    shared prefix's KV cache; returns the rows of the table."""
    import forecaster as F
    from forecast_prompt import hardware_info
    from models.forecaster_backends import TransformersBackend
    backend = TransformersBackend(model=model, tokenizer=None, name="config GPT-OSS", batch_size=batch_size)
    hardware = hardware_info() if device == "cuda" else hardware_info("h200")
    F.Forecaster(backend, readout="logits", cache_dir=None, hardware=hardware).forecast_many(
        task, reference, codes[:1])  # warm-up: kernels, allocator
    emit(f"| read-out | prefix reuse | {len(codes)} forecasts s | per forecast s | / measurement | "
         "mean tokens in | mean tokens out | max abs prob diff vs no reuse |")
    emit("|---|---|---|---|---|---|---|---|")
    rows, plain = [], {}
    for readout in ("logits", "verbalized"):
        for reuse in (False, True):
            backend.forget_prefixes()
            fc = F.Forecaster(backend, readout=readout, cache_dir=None, max_new_tokens=verbalized_tokens,
                              temperature=1.0, seed=0, hardware=hardware, prefix_cache=reuse)
            _sync(device)
            t0 = time.perf_counter()
            try:
                fs = fc.forecast_many(task, reference, codes)
            except torch.cuda.OutOfMemoryError:
                emit(f"| {readout} | {'yes' if reuse else 'no'} | out of memory at batch {batch_size} | | | | | |")
                torch.cuda.empty_cache()
                continue
            _sync(device)
            total = time.perf_counter() - t0
            diff = "-"
            if readout == "logits":
                if not reuse:
                    plain = {i: f.probs for i, f in enumerate(fs)}
                elif plain:
                    diff = f"{max(abs(a - b) for i, f in enumerate(fs) for a, b in zip(f.probs, plain[i])):.1e}"
            per = total / len(codes)
            row = dict(readout=readout, reuse=reuse, total_s=total, per_s=per, ratio=per / measurement_s,
                       tokens_in=sum(f.tokens_in for f in fs) / len(fs),
                       tokens_out=sum(f.tokens_out for f in fs) / len(fs))
            rows.append(row)
            emit(f"| {readout} | {'yes' if reuse else 'no'} | {total:.2f} | {per:.3f} | {row['ratio']:.3f} | "
                 f"{row['tokens_in']:.0f} | {row['tokens_out']:.0f} | {diff} |")
    emit("")
    return rows


def grpo_costs(emit, build_model, rows_path, folder, steps=3, extra=()):
    """Median GRPO step time (after the first) without and with prompt sharing; a fresh model each."""
    import statistics

    import train_grpo
    from runtime import cli
    runs = (("no sharing", ["--no-prefix-cache"]), ("shared prompt (checkpointing on)", []),
            ("shared prompt, no checkpointing", ["--no-gradient-checkpointing"]))
    emit("| GRPO, votes, 2 prompts x G = 8 | step s (median after the first) | peak GiB | groups kept |")
    emit("|---|---|---|---|")
    out = {}
    for name, flags in runs:
        args = cli.parse(train_grpo.Args, 
            ["--data", str(rows_path), "--out", str(Path(folder) / f"grpo{len(out)}"), "--answer-format", "votes",
             "--steps", str(steps), "--prompts-per-step", "2", "--group-size", "8", "--save-every", "1000",
             "--lora-rank", "8", *extra, *flags])
        try:
            log = train_grpo.train(args, model=build_model(), tokenizer=None)["log"]
        except torch.cuda.OutOfMemoryError:
            emit(f"| {name} | out of memory | | |")
            torch.cuda.empty_cache()
            continue
        step = statistics.median(r["step_time_s"] for r in log[1:])
        out[name] = step
        emit(f"| {name} | {step:.2f} | {max(r['peak_memory_bytes'] for r in log) / 2**30:.1f} | "
             f"{[r['groups_kept'] for r in log]} |")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    emit("")
    return out


# ---- the transformers engine at GPT-OSS-20B's full shape -------------------------------------------

def engine_sections(emit, layers=24, prompt_tokens=4600, new_tokens=256):
    """What the transformers path achieves at GPT-OSS-20B's shape (`layers` of its 24 layers, random
    bf16 weights, no download): prefill and decoding tokens/s and peak memory at batch 1 and at the
    batch lm sizes from the free memory (beside lm_memory's estimate of it), eager attention's peak
    at batch 1 (flex attention is the default on a GPU), and a LoRA adapter on attention and
    experts: switching it on and off (lm.AdapterSwitch) and decoding with it merged against peft's
    unmerged path, which rebuilds every layer's expert stack at each step. The real checkpoint's
    MXFP4 experts (with the `kernels` package) change the weights' memory and the expert matmuls;
    the rest is this shape's."""
    sys.path.insert(0, str(ROOT / "tests"))
    import tiny_models
    from transformers import AutoConfig

    from models import lm, lm_memory, prefix_attention
    try:
        real = AutoConfig.for_model("gpt_oss", num_hidden_layers=24, vocab_size=tiny_models.HARMONY_VOCAB,
                                    quantization_config={"quant_method": "mxfp4"}, **GPT_OSS_20B_WIDTH)
        emit(f"MXFP4: {lm.mxfp4_problem() or 'available'}; a GPT-OSS-20B-shaped checkpoint as it will load "
             f"here: {lm.weights_format(real)}")
    except Exception as e:  # noqa: BLE001 - a report line, not the section's purpose
        emit(f"MXFP4: could not be checked ({type(e).__name__}: {e})")
    flex = prefix_attention.FLEX_SINKS  # our flex attention with sinks (lm.attention_for's GPU choice)
    model = config_model(layers)
    policy = lm.LM(model, tiny_models.tiny_tokenizer(), chat_format="template")
    cfg, gib = model.config, 2 ** 30
    g = torch.Generator().manual_seed(0)
    row = lambda: torch.randint(1000, 200000, (prompt_tokens,), generator=g).tolist()  # noqa: E731
    weights = torch.cuda.memory_allocated()
    emit(f"### transformers engine, GPT-OSS-20B shape ({layers} layers, random bf16 weights "
         f"{weights / gib:.1f} GiB), prompt {prompt_tokens} tokens, {new_tokens} new tokens (sampled, T=1)")
    emit("")
    emit("| attention | batch | prefill s | prefill tok/s | decode tok/s | peak GiB above weights | "
         "estimate GiB (lm_memory) |")
    emit("|---|---|---|---|---|---|---|")
    auto = policy.rows_at_once([row()] * 256, new_tokens)
    for attention, batch in ((flex, 1), (flex, min(auto, 64)), ("eager", 1)):
        lm.register_attention(attention)
        model.set_attn_implementation(attention)
        rows = [row() for _ in range(batch)]
        try:
            policy.next_token_probs(rows[:1], [1], batch_size=1)  # compile / warm up
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            policy.next_token_probs(rows, [1], batch_size=batch)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - t0
            decode = "-"
            if attention == flex:
                t0 = time.perf_counter()
                policy.generate(rows, max_new_tokens=new_tokens, temperature=1.0, batch_size=batch)
                torch.cuda.synchronize()
                decode = f"{batch * new_tokens / max(time.perf_counter() - t0 - prefill, 1e-9):.0f}"
            peak = (torch.cuda.max_memory_allocated() - weights) / gib
        except torch.cuda.OutOfMemoryError:
            emit(f"| {attention} | {batch} | out of memory | | | | |")
            torch.cuda.empty_cache()
            continue
        est = batch * lm_memory.row_bytes(cfg, prompt_tokens=prompt_tokens, new_tokens=new_tokens if decode != "-" else 0,
                                          computed_tokens=prompt_tokens, eager_attention=attention == "eager") / gib
        emit(f"| {attention} | {batch} | {prefill:.2f} | {batch * prompt_tokens / prefill:.0f} | {decode} | "
             f"{peak:.1f} | {est:.1f} |")
    emit("")
    emit(f"flex attention compiles so far: {prefix_attention.flex_compiles()} (limit "
         f"{prefix_attention.FLEX_RECOMPILE_LIMIT} per function; reaching it raises instead of falling back)")
    emit("")
    model.set_attn_implementation(flex)
    torch.manual_seed(0)
    model = lm.add_lora(model, rank=32, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj"],
                        gradient_checkpointing=False).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1e-3)
    policy, switch = lm.LM(model, tiny_models.tiny_tokenizer(), chat_format="template"), lm.AdapterSwitch(model)
    rows = [row()[:512]]
    emit("| LoRA adapter (rank 32, attention + experts), batch 1, 512-token prompt | switch s | "
         "tok/s over 64 new tokens |")
    emit("|---|---|---|")
    for name, state in (("peft unmerged (expert stacks rebuilt per forward)", None), ("merged (AdapterSwitch on)", True),
                        ("base model (AdapterSwitch off)", False)):
        t0 = time.perf_counter()
        with switch.state(state) if state is not None else contextlib.nullcontext():
            torch.cuda.synchronize()
            switched = time.perf_counter() - t0
            t0 = time.perf_counter()
            policy.generate(rows, max_new_tokens=64, temperature=1.0, batch_size=1)
            torch.cuda.synchronize()
        emit(f"| {name} | {switched:.2f} | {64 / (time.perf_counter() - t0):.1f} |")
    emit("")
    del model, policy, switch
    torch.cuda.empty_cache()


def surrogate_sections(emit, args):
    import tempfile

    from bench_forecast import candidates, write_rows

    from tasks import seed_source
    measurement_s = measurement_throughput(emit, args.throughput_candidates, unsafe=args.unsafe_no_sandbox)
    emit(f"### forecast cost vs a measurement ({measurement_s:.1f} s): a GPT-OSS of GPT-OSS-20B's width "
         f"with {args.forecast_layers} of its 24 layers, random bf16 weights, 8 cross_entropy candidates, "
         f"batch 8, verbalized capped at {args.verbalized_tokens} new tokens")
    emit("")
    model = config_model(args.forecast_layers)
    codes = candidates(8)
    forecast_costs(emit, model, codes, seed_source("cross_entropy"), measurement_s,
                   verbalized_tokens=args.verbalized_tokens)
    del model
    torch.cuda.empty_cache()
    emit(f"### GRPO step on the same model ({args.forecast_layers} layers)")
    emit("")
    with tempfile.TemporaryDirectory() as tmp:
        rows = write_rows(Path(tmp) / "rows.jsonl", codes)
        grpo_costs(emit, lambda: config_model(args.forecast_layers), rows, tmp)


# ---- the measurements of the tasks' kernels ---------------------------------------------------

QUICK_VARIANT = "fused_online"  # --quick measures the cross_entropy seed and this variant


def cross_entropy_section(emit, args):
    """measure.py beside do_bench on the seed and the variants (--quick: the seed and one), the
    bandwidth against the floors, and (not --quick) one measurement repeated three times."""
    task = get_task("cross_entropy")
    kernels = [seed_path("cross_entropy")] + [p for p in variant_paths("cross_entropy")
                                               if not args.quick or p.stem == QUICK_VARIANT]
    peak = peak_bandwidth(torch.cuda.get_device_name(0))
    emit("### cross_entropy: measure.py vs triton.testing.do_bench (median ms), bandwidth vs floors")
    emit("")
    emit("| kernel | status | geomean speedup | reference worker peak GiB (search's estimate) | wall s (full "
         "output checks' share, target <= 20%) | " + " | ".join(
        f"V={c['V']} ms (measure / do_bench / ratio) | V={c['V']} GB/s at 4BV" for c in task.BENCHMARK_CASES) + " |")
    emit("|" + "---|" * (5 + 2 * len(task.BENCHMARK_CASES)))
    best = None
    for path in kernels:
        t0 = time.time()
        m = measure.measure("cross_entropy", path.read_text(), device="cuda", use_cache=False, quick=args.quick,
                            unsafe_no_sandbox=args.unsafe_no_sandbox)
        cells = [path.stem, m.status, f"{m.speedup:.3f}x" if m.speedup else "-",
                 (f"{m.reference_peak_gb:.1f}" if m.reference_peak_gb else "-") + f" ({estimate_gib('cross_entropy'):.1f})",
                 f"{time.time() - t0:.0f}" + (f" ({m.verify_s / (time.time() - t0):.0%})" if m.verify_s is not None else "")]
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
    if not best:
        return
    path, m = best
    emit(f"Best kernel: {path.stem}, geomean {m.speedup:.3f}x over the PyTorch reference.")
    for case, row in zip(task.BENCHMARK_CASES, m.cases):
        b, v, ms = case["B"], case["V"], row["candidate_ms"]
        floor4 = 4 * b * v / peak * 1e3 if peak else float("nan")
        floor6 = 6 * b * v / peak * 1e3 if peak else float("nan")
        emit(f"- V={v}: {ms:.3f} ms; floors at {peak / 1e12 if peak else float('nan'):.2f} TB/s: "
             f"4BV {floor4:.3f} ms ({floor4 / ms:.0%} of it), 6BV {floor6:.3f} ms ({floor6 / ms:.0%})")
    emit("")
    if args.quick:
        return
    # Run-to-run spread: the same measurement three times.
    reps = [measure.measure("cross_entropy", path.read_text(), device="cuda", use_cache=False, quick=True,
                            unsafe_no_sandbox=args.unsafe_no_sandbox).speedup
            for _ in range(3)]
    mean = sum(reps) / len(reps)
    sd = math.sqrt(sum((r - mean) ** 2 for r in reps) / (len(reps) - 1))
    emit(f"Repeat of {path.stem} x3 (--quick measurements): speedups {', '.join(f'{r:.3f}' for r in reps)} "
         f"(mean {mean:.3f}, sd {sd:.3f}, {sd / mean:.1%})")
    emit("")


def other_tasks_section(emit, args):
    """The seed and variants of every other task through measure.py (--quick measurements)."""
    emit("### other tasks: seed and variants through measure.py at benchmark shapes")
    emit("")
    emit("| task | kernel | status | geomean speedup | per-case candidate ms (spread) | reference worker peak GiB (search's estimate) | wall s |")
    emit("|---|---|---|---|---|---|---|")
    for name in [t for t in args.task_list if t != "cross_entropy"]:
        for path in [seed_path(name)] + variant_paths(name):
            m = measure.measure(name, path.read_text(), device="cuda", use_cache=False, quick=True,
                                unsafe_no_sandbox=args.unsafe_no_sandbox)
            per_case = ", ".join(f"{r['candidate_ms']:.3f} (±{r['candidate_spread']:.0%})" for r in m.cases) or m.message[:80]
            emit(f"| {name} | {path.stem} | {m.status} | {f'{m.speedup:.3f}x' if m.speedup else '-'} | "
                 f"{per_case} | {f'{m.reference_peak_gb:.1f}' if m.reference_peak_gb else '-'} ({estimate_gib(name):.1f}) | "
                 f"{m.wall_s} |")
            torch.cuda.empty_cache()
    emit("")


# ---- the run: each section a child process with a time limit, recorded as it ends -----------------

# The measurement's own GPU tests: what --quick runs of `pytest -m gpu`.
QUICK_TEST_FILES = ("tests/test_measure.py", "tests/test_measure_worker.py", "tests/test_tasks_ce_trimul.py")
QUICK_BUDGET_S, FULL_BUDGET_S = 180, 480
CHILD_START_S = 10  # a child's import of torch and the CUDA context, on top of its section's work


def sections(args):
    """(name, time limit in seconds, function) of the run, in order: the cheap and telling first,
    so that a run cut short has recorded them."""
    out = [("timer", 20, lambda emit: timer_overhead(emit))]
    if "cross_entropy" in args.task_list:
        out.append(("cross_entropy", 75 if args.quick else 110, lambda emit: cross_entropy_section(emit, args)))
    if not args.no_tests:
        files = QUICK_TEST_FILES if args.quick else ()
        limit = 55 if args.quick else 100
        out.append(("gpu tests", limit, lambda emit: gpu_tests(emit, timeout_s=limit - 5, unsafe=args.unsafe_no_sandbox,
                                                                files=files)))
    if args.quick:
        return out
    if any(t != "cross_entropy" for t in args.task_list):
        out.append(("other tasks", 55, lambda emit: other_tasks_section(emit, args)))
    if not args.no_engine:
        out.append(("engine", 85, lambda emit: engine_sections(emit, layers=args.engine_layers)))
    if not args.no_surrogate:
        out.append(("surrogate", 50, lambda emit: surrogate_sections(emit, args)))
    return out


def sandbox_choice(args):
    """Whether the kernels measured here run in measure.py's sandbox, and the line that says so.
    Where bubblewrap cannot run they run without it: they are the project's own."""
    from harness import measure_sandbox
    if args.unsafe_no_sandbox:
        return True, "sandbox: none (--unsafe-no-sandbox given)"
    try:
        measure_sandbox.require_sandbox()
    except measure_sandbox.SandboxUnavailable as e:
        return True, (f"sandbox: none, measuring the project's own kernels with --unsafe-no-sandbox, because "
                      f"{str(e)[:300]}")
    return False, "sandbox: bubblewrap"


def section_command(name, argv):
    return [sys.executable, str(Path(__file__).resolve()), *argv, "--section", name]


def run_section(name, limit_s, command, record):
    """One section in a child process (section_command), its output shown as it comes and
    recorded when the child ends, with how it ended. True when it finished."""
    import threading
    t0 = time.time()
    # its own process group, so that a cut ends what it started too (pytest, measure's workers)
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                             start_new_session=True)
    lines, rc = [], None

    def pump():
        for line in child.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = child.wait(timeout=limit_s)
        how = "" if rc == 0 else f"**failed** (exit {rc}; the last lines above say why)"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        how = f"**cut at its time limit of {limit_s:.0f} s** (what it printed until then is above)"
    reader.join(timeout=5)
    took = f"(section {name}: {time.time() - t0:.0f} s{'; ' + how if how else ''})"
    print(took, flush=True)
    if rc not in (0, None):
        lines = lines[-40:]  # a traceback's end
    record(lines + [took, ""])
    return not how


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a 3-minute subset: the timer, the cross_entropy seed and one variant, the measurement's GPU tests")
    parser.add_argument("--no-record", action="store_true", help="do not append the sections to docs/gpu_runs.md")
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old notes
    parser.add_argument("--tasks", default=",".join(TASK_NAMES),
                        help="comma-separated tasks to include (cross_entropy gets the full treatment)")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="measure without bubblewrap (chosen by itself where bubblewrap cannot run: the kernels "
                        "measured here are the project's own)")
    parser.add_argument("--no-tests", action="store_true", help="skip the suite's GPU-only tests (`pytest -m gpu`)")
    parser.add_argument("--no-surrogate", action="store_true",
                        help="skip the surrogate's sections (measurements per GPU-minute, forecast cost, GRPO step)")
    parser.add_argument("--throughput-candidates", type=int, default=2,
                        help="fresh candidates measured for the measurements-per-minute figure (default 2)")
    parser.add_argument("--forecast-layers", type=int, default=2,
                        help="layers of the config-built GPT-OSS used for forecast and GRPO costs (default 2)")
    parser.add_argument("--no-engine", action="store_true",
                        help="skip the transformers engine at GPT-OSS-20B's shape (tokens/s, memory, adapter switch)")
    parser.add_argument("--engine-layers", type=int, default=24,
                        help="layers of the engine section's GPT-OSS (24 = GPT-OSS-20B, 42 GB in bf16; default 24)")
    parser.add_argument("--verbalized-tokens", type=int, default=64,
                        help="new tokens per verbalized forecast (a random model never stops; default 64)")
    parser.add_argument("--section", help=argparse.SUPPRESS)  # a child: run this one section
    args = parser.parse_args()
    args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
    from runtime import cli
    cli.check_cuda()  # a driver torch cannot use: say so, not "no GPU"
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible; this script checks the GPU path (run it on a GPU machine)", file=sys.stderr)
        return 2
    if args.section:  # in a child: the section's output goes to the parent, which records it
        dict((name, fn) for name, _, fn in sections(args))[args.section](lambda s="": print(s, flush=True))
        return 0

    args.unsafe_no_sandbox, sandbox_line = sandbox_choice(args)
    budget = QUICK_BUDGET_S if args.quick else FULL_BUDGET_S
    out = ROOT / "docs" / "gpu_runs.md"

    def record(lines):
        if args.no_record:
            return
        if not out.exists():
            out.write_text("# Runs on real GPUs\n\nEach section was written by `python scripts/gpu_check.py` "
                           "on the GPU it names. Nothing here is estimated.\n\n")
        with out.open("a") as f:
            f.write("\n".join(lines) + "\n")

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [f"## {stamp} · {torch.cuda.get_device_name(0)} · torch {torch.__version__} (CUDA {torch.version.cuda}) · "
            f"triton {__import__('triton').__version__}{' · --quick' if args.quick else ''}", "", sandbox_line, ""]
    print("\n".join(head), flush=True)
    record(head)
    argv = [a for a in sys.argv[1:] if a != "--record"] + ["--unsafe-no-sandbox"] * (
        args.unsafe_no_sandbox and "--unsafe-no-sandbox" not in sys.argv)
    t_start, failed = time.time(), []
    for name, limit, _ in sections(args):
        left = budget - (time.time() - t_start)
        if left < CHILD_START_S + 10:
            record([f"(section {name}: skipped, the run's {budget} s are spent)", ""])
            failed.append(name)
            continue
        if not run_section(name, min(limit + CHILD_START_S, left), section_command(name, argv), record):
            failed.append(name)
    total = f"Total time {time.time() - t_start:.0f} s" + (f"; sections that did not finish: {', '.join(failed)}" if failed else "") + "."
    print(total)
    record([total, ""])
    if not args.no_record:
        print(f"recorded in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
