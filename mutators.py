"""mutators.py: where the search's children come from (docs/PAPER.md §7).

Two mutators share one method, `propose(parent, n, seen, key) -> [{"code", "error", "meta"}]`,
where `parent` is a puct.Node, `seen` the code already proposed in this search (stripped), and
`key` a string that makes the proposal deterministic (search.py passes seed/step/parent index).
A proposal with `code=None` is a failed mutation: logged with its error, never measured.

- LLMMutator: the paper's mutator. Any backend with the forecaster's `generate()` interface (a
  local GPT-OSS, a vLLM/SGLang server) is prompted with the task, the rules, the parent's code and
  its measured feedback; the child is the last ```python block of the reply.
- CatalogMutator: an offline stand-in that needs no LLM, so the whole search runs anywhere. It
  proposes the task's hand-written variants (tasks/kernels/<task>/, or on a CPU
  tasks/kernels/<task>/cpu/), then edits of the parent's `# tune:` constants (block sizes,
  num_warps, num_stages; on a CPU chunk sizes, vector widths, compiler flags), one constant at a
  time. On a CPU it also proposes the parent's compiled form when the parent is plain PyTorch
  (compile_form: the kernel wrapped in torch.compile, inductor's choices as `# tune:` constants),
  so that any op written in PyTorch, a user's task file or a KernelBench problem among them, has
  real mutations without an LLM.

The LLM is told what runs where: on a GPU it is asked for Triton; where the kernels are timed on a
CPU (search.py --space cpu) it is asked for CPU code and told the CPU's model (cpu_rules).

A goal-conditioned search (search.py --target-bin B, which eval_set.py runs to fill a bin of its
eval set) asks the LLM for a kernel whose speedup lands *inside bin B's band*, not for the fastest
kernel: the prompt names the band and its midpoint (goal_band) and says that faster is not better.
The catalog mutator has no such lever and proposes as always; the search's reward steers it.

Split from search.py so the search loop reads in one sitting; nothing here knows about PUCT.
"""
import hashlib
import json
import math
import random
import re

from bins import bin_interval
from harness.measure_channel import printable
from tasks import TUNE_LINE

MUTATION_RULES = """You are an expert GPU kernel engineer. Rewrite the kernel below to make it faster.
Rules:
- The inputs are already on the GPU; do not move them.
- Define `custom_kernel(data)` in one module and put ALL code in one final ```python block.
- Several input shapes are tested, for correctness and for speed; do not specialise to one.
- Write the kernel in Triton (PyTorch for glue only).
- Start the module with a short docstring describing the algorithm."""

CPU_MUTATION_RULES = """You are an expert CPU performance engineer. Rewrite the kernel below to make it faster on a CPU.
Rules:
- The inputs are CPU tensors. The kernel is timed single-threaded on one core of {cpu}; the time
  charged is the CPU time of every thread, so threads do not help.
- Define `custom_kernel(data)` in one module and put ALL code in one final ```python block.
- Several input shapes are tested, for correctness and for speed; do not specialise to one.
- Write CPU code: PyTorch (fewer passes over memory, fused or in-place operators), torch.compile
  (inductor writes vectorised C++; its options are yours to choose), or C++ built with
  torch.utils.cpp_extension.load_inline (loops that vectorise: no calls in inner loops,
  `#pragma omp simd` with -fopenmp-simd, -O3 -march=native). Triton runs here only in its
  interpreter, far slower than PyTorch: do not use it.
- Compute in the precision the task states; round only what is stored in a lower precision.
- Building counts: a C++ build or a torch.compile takes seconds to a minute of each measurement.
- Start the module with a short docstring describing the algorithm."""

TRUNCATE = 2000  # characters of an error message shown to the mutator


def cpu_rules(hardware):
    """The mutation rules where the kernels are timed on a CPU: `hardware` is its profile
    (forecast_prompt.hardware_info("cpu")), whose name says the model."""
    name = str((hardware or {}).get("name") or "this machine's CPU").removeprefix("CPU: ")
    return CPU_MUTATION_RULES.format(cpu=name)


def feedback_text(m, ask="Rewrite the whole kernel to be as fast as possible."):
    """The mutator's view of a measurement dict (measure.Measurement.to_dict()); `ask` closes the
    feedback on a correct kernel (None: nothing)."""
    # printable: measure.py escapes what a candidate wrote already; a record from elsewhere (an
    # older event log) gets the same treatment before it reaches a prompt
    status, msg = m.get("status"), printable(m.get("message") or "", TRUNCATE)
    if status == "compile_error":
        return f"The kernel failed to compile:\n{msg}"
    if status in ("runtime_error", "crashed", "timeout"):
        return f"The kernel failed at run time ({status}):\n{msg}"
    if status == "incorrect":
        return f"The kernel produced incorrect output:\n{msg}"
    if status == "forecast":  # admitted on a trusted forecast (search.py --forecast-reward)
        return (f"The kernel was not measured; the forecaster expects a speedup of about "
                f"{m['speedup']:.3f}x over the reference. Rewrite the whole kernel to be as fast as possible.")
    if status != "ok":
        return f"The kernel was rejected by the harness ({status}):\n{msg}"
    lines = [f"The kernel is correct. Geometric-mean speedup over the reference: {m['speedup']:.3f}x.",
             "Per-case results, slowest first:", "| case | kernel ms | reference ms | speedup |",
             "|---|---|---|---|"]
    timed = [c for c in m.get("cases", []) if c.get("candidate_ms") is not None]
    for c in sorted(timed, key=lambda c: -c["candidate_ms"]):
        lines.append(f"| {json.dumps(c.get('case'))} | {c['candidate_ms']:.4g} | "
                     f"{c.get('reference_ms', float('nan')):.4g} | {c.get('speedup', float('nan')):.3f}x |")
    if ask:
        lines.append(ask)
    return "\n".join(lines)


def goal_band(target_bin):
    """(low, high, midpoint) speedups of a goal-conditioned search's target bin. The midpoint is
    the band's geometric centre; the open bins take the octave beyond their edge, [0.25x, 0.5x)
    and [4x, 8x), as the original's goal did (midpoints 0.354x and 5.66x)."""
    low, high = bin_interval(target_bin)
    window = (high / 2, high) if low == 0 else (low, 2 * low) if math.isinf(high) else (low, high)
    return low, high, math.sqrt(window[0] * window[1])


def goal_reward(speedup, target_bin):
    """The goal-conditioned reward: minus the log-distance of a speedup from the bin's midpoint."""
    return -abs(math.log(speedup) - math.log(goal_band(target_bin)[2]))


def _band_text(target_bin):
    low, high, mid = goal_band(target_bin)
    band = f"below {high:.2f}x" if low == 0 else f"at least {low:.2f}x" if math.isinf(high) \
        else f"between {low:.2f}x and {high:.2f}x"
    return f"a speedup over the reference {band} (ideally about {mid:.2f}x)"


def mutation_messages(description, parent_code, parent_result, last_failure=None, target_bin=None, rules=MUTATION_RULES):
    """The chat of docs/PAPER.md §7: rules, the task, the parent's code and its feedback. With a
    target bin, the goal-conditioned variant: land the speedup in the bin's band, not beyond it.
    `rules`: the GPU's (MUTATION_RULES) or, where the kernels are timed on a CPU, cpu_rules()."""
    ask = {} if target_bin is None else {"ask": None}  # the goal's own request closes the chat
    user = [f"Task:\n{description}", f"Current kernel:\n```python\n{parent_code}\n```",
            f"Feedback on the current kernel:\n{feedback_text(parent_result, **ask)}"]
    if last_failure:  # the last child of this parent failed: show why, so it is not repeated
        user.append(f"Your previous rewrite of this kernel failed. {feedback_text(last_failure, **ask)}")
    system = rules
    if target_bin is not None:
        goal = _band_text(target_bin)
        who = "CPU performance engineer" if rules is not MUTATION_RULES else "GPU kernel engineer"
        system = (f"You are an expert {who}. This time the goal is not the fastest kernel: "
                  f"rewrite the kernel below so that it is correct and measures {goal}. A kernel outside "
                  "that band, even a much faster one, is of no use here: if the current kernel is too "
                  "fast, slow it down (less parallelism, worse memory access, parts in plain PyTorch); if "
                  "it is too slow, remove bottlenecks until it is inside the band, then stop."
                  + rules[rules.index("\nRules:"):])
        user.append(f"Rewrite the whole kernel so that it measures {goal}. Faster is not better.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(user)}]


PYTHON_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.S)


def extract_code(text):
    """The last complete ```python block of a reply, or None."""
    blocks = PYTHON_BLOCK.findall(text or "")
    return blocks[-1].strip() + "\n" if blocks else None


def _int_seed(key):
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


class LLMMutator:
    """Mutations from any forecaster backend's generate() (the same interface the forecaster uses)."""

    name = "llm"

    def __init__(self, backend, description, temperature=1.0, max_new_tokens=8192, target_bin=None,
                 rules=MUTATION_RULES):
        self.backend, self.description = backend, description
        self.temperature, self.max_new_tokens, self.target_bin = temperature, max_new_tokens, target_bin
        self.rules = rules  # the GPU's, or cpu_rules(...) where the kernels are timed on a CPU

    def messages(self, parent):
        """The chat this mutator sends for `parent` (search.py logs it beside the replies)."""
        return mutation_messages(self.description, parent.code, parent.info.get("result", {}),
                                 parent.info.get("last_failure"), self.target_bin, self.rules)

    def propose(self, parent, n, seen, key):
        replies = self.backend.generate([self.messages(parent)] * n, max_new_tokens=self.max_new_tokens,
                                        temperature=self.temperature, seed=_int_seed(key))
        out = []
        for r in replies:
            code = extract_code(r.text)
            meta = {"tokens_in": r.tokens_in, "tokens_out": r.tokens_out, "reply": r.text or ""}
            if getattr(r, "error", None):  # the backend could not answer (server down, too long)
                out.append({"code": None, "error": f"generation failed: {r.error}", "meta": meta})
            elif code is None:  # a failed mutation: recorded, never measured
                out.append({"code": None, "error": "no ```python block in the reply", "meta": meta})
            else:
                out.append({"code": code, "error": None, "meta": meta})
        return out


def tunables(code):
    """{name: (current value, allowed values)} of the `NAME = 8  # tune: 4, 8, 16` lines."""
    return {m["name"]: (int(m["value"]), [int(v) for v in m["choices"].split(",")])
            for m in TUNE_LINE.finditer(code)}


def set_tunable(code, name, value):
    def repl(m):
        return f"{m['head']}{value}{m['tail']}" if m["name"] == name else m.group(0)
    return TUNE_LINE.sub(repl, code)


# ---- the compiled form of a plain PyTorch kernel (the CPU's mutation without an LLM) ---------------

# What makes a kernel "plain PyTorch": none of these. Triton is the GPU's (its interpreter on a
# CPU), a C++ extension is compiled already, and torch.compile of a compiled kernel is no new choice.
NOT_PLAIN = re.compile(r"\btriton\b|load_inline|cpp_extension|torch\.compile|\b_?compile\s*\(")
MATMUL = re.compile(r"nn\.(?:Linear|Conv\w*|Bilinear|LSTM|GRU|RNN|MultiheadAttention)\b|@|\b(?:matmul|mm|bmm|addmm|einsum|linear|conv\dd)\s*\(")

COMPILED_KERNEL = """

# ---- compiled: the kernel above through torch.compile (mutators.compile_form) ----
# Inductor traces the function, fuses its operators into C++ loops vectorised for this CPU and
# compiles them with the machine's C++ compiler on the first call (tens of seconds, part of the
# measurement). Its choices, as `# tune:` constants:
#   COMPILE_DYNAMIC  0: torch's default (specialise to the first shape, generalise at the first
#                    new one); 1: one kernel for every shape from the start
#   COMPILE_SIMDLEN  the vector width of inductor's loops in bits (0: its own pick, the widest
#                    this CPU has; 1: no vectorisation){extra_doc}
import torch as _torch  # noqa: E402
import torch._inductor.config as _inductor_config  # noqa: E402

COMPILE_DYNAMIC = 0  # tune: 0, 1
COMPILE_SIMDLEN = 0  # tune: 0, 1, 256, 512{extra_tunes}

_inductor_config.cpp.simdlen = COMPILE_SIMDLEN or None{extra_config}
"""
MODE_DOC = """
#   COMPILE_MODE     1: max-autotune (inductor times its own C++ GEMM templates against the
#                    library's matmuls and keeps the fastest: a longer compile)"""
FREEZING_DOC = """
#   COMPILE_FREEZING 1: the weights are constants of the compiled graph (folded, pre-packed
#                    for the CPU's matmul library); the model runs under torch.no_grad"""
COMPILED_FUNCTION = """custom_kernel = _torch.compile(custom_kernel, dynamic=True if COMPILE_DYNAMIC else None{mode})
"""
# ModelNew's own class, its forward compiled in place: KernelBench's code names its class in
# `super(ModelNew, self).__init__()`, which a subclass of the same name would turn into a call of
# itself (every such problem failed to load).
COMPILED_MODEL = """_eager_init, _eager_forward = ModelNew.__init__, ModelNew.forward


def _compiled_init(self, *args, **kwargs):
    _eager_init(self, *args, **kwargs)  # the same parameters, created in the same order
    self._compiled_forward = _torch.compile(_eager_forward.__get__(self), dynamic=True if COMPILE_DYNAMIC else None{mode})


def _compiled_call(self, *args, **kwargs):
    return self._compiled_forward(*args, **kwargs)


ModelNew.__init__, ModelNew.forward = _compiled_init, _compiled_call
"""


def compile_form(code):
    """The kernel of `code` through torch.compile, or None when it is not plain PyTorch (Triton, a
    C++ extension, compiled already) or defines neither `custom_kernel` nor KernelBench's
    `class ModelNew`. A block appended to the module: the kernel as it was, then compiled, with
    inductor's choices as `# tune:` constants that the catalog mutator edits afterwards; matmul
    choices (max-autotune) only where the code has a matmul, freezing only for a model's weights."""
    model = re.search(r"^class ModelNew\b", code, re.M) is not None
    function = re.search(r"^def custom_kernel\s*\(", code, re.M) is not None
    if NOT_PLAIN.search(code) or not (model or function):
        return None
    matmul = MATMUL.search(code) is not None
    doc = (MODE_DOC if matmul else "") + (FREEZING_DOC if model else "")
    tunes = ("\nCOMPILE_MODE = 0  # tune: 0, 1" if matmul else "") + ("\nCOMPILE_FREEZING = 0  # tune: 0, 1" if model else "")
    config = "\n_inductor_config.freezing = bool(COMPILE_FREEZING)" if model else ""
    mode = ', mode="max-autotune-no-cudagraphs" if COMPILE_MODE else None' if matmul else ""
    block = COMPILED_KERNEL.format(extra_doc=doc, extra_tunes=tunes, extra_config=config)
    return code.rstrip() + "\n" + block + "\n" + (COMPILED_MODEL if model else COMPILED_FUNCTION).format(mode=mode)


class CatalogMutator:
    """Offline mutations, no LLM: the task's hand-written variants, then one-constant edits of the
    parent's `# tune:` values (block sizes, num_warps, num_stages). With compile=True (a search on
    a CPU) a plain PyTorch parent's compiled form (compile_form) is proposed with the variants.
    Deterministic for a key (the search passes seed/step/parent) and never proposes code in `seen`."""

    name = "catalog"

    def __init__(self, variants, compile=False):
        self.variants = variants  # {name: source}
        self.compile = compile

    def propose(self, parent, n, seen, key):
        rng = random.Random(key)
        fresh = [(f"variant {name}", src) for name, src in sorted(self.variants.items())]
        compiled = compile_form(parent.code) if self.compile else None
        if compiled is not None:
            fresh.append(("torch.compile of the parent", compiled))
        rng.shuffle(fresh)
        edits = [(f"{name} {old} -> {v}", set_tunable(parent.code, name, v))
                 for name, (old, choices) in sorted(tunables(parent.code).items())
                 for v in choices if v != old]
        rng.shuffle(edits)
        out, taken = [], set(s.strip() for s in seen)
        for what, code in fresh + edits:
            if code.strip() in taken:
                continue
            taken.add(code.strip())
            out.append({"code": code, "error": None, "meta": {"edit": what}})
            if len(out) == n:
                break
        return out
