"""costmodel_features.py: what a learned cost model sees of an (anchor, candidate) pair, without running it.

The LLM forecaster reads both kernels as text. A cost model (costmodel.py) reads a fixed vector of
numbers instead, computed here from the source alone: no import, no compile, no run. Four groups,
one row of floats per pair, in the order of feature_names():

1. the candidate's code (CODE_KEYS, "cand_*"), and how it differs from the anchor's ("delta_*"):
   - language: Triton (`@triton.jit`), a compiled extension (CUDA's `__global__` source, or C++
     for a CPU, handed to load_inline), or torch only; how many kernels it defines and launches
     (`kernel[grid](...)`), autotune configs;
   - CPU code: torch.compile calls, C-style loops in C++ source, `omp simd` pragmas, flags that
     let the compiler vectorise (-march=native, -fno-trapping-math, -ffast-math), and libm calls
     in C++ (std::exp, std::fmax ...), which keep a loop scalar;
   - ops: `tl.dot` and torch matmuls (`@`, matmul, einsum, linear); reductions, Triton's
     (tl.sum/max/min/argmax/reduce/cumsum) and torch's (sum, amax, logsumexp, softmax, norm ...);
     loads, stores (masked or not), atomics, elementwise math (exp, exp2, log, sqrt, sigmoid,
     where), torch calls, allocations and copies (empty, zeros, clone, contiguous, .float());
     dtypes named (bf16, fp16, fp32, fp8);
   - the `# tune:` constants (mutators.tunables: their count, where each value sits among its
     allowed values, on average and hashed by name into TUNE_SLOTS slots, so that a 0/1 switch is
     seen), and every named integer constant (module constants, keyword arguments,
     autotune dict entries, constexpr defaults) hashed by name into CONST_SLOTS slots of
     log2(value);
   - block sizes, num_warps and num_stages, found by name wherever they are set (`BLOCK_V = 1024`,
     `num_warps=NUM_WARPS`, `triton.Config({"BLOCK_M": 128}, num_stages=3)`): the log2 of the
     largest, the smallest and their product's (the tile's elements);
   - loop structure: loops inside kernels and in host code, their deepest nesting, unrolled
     (`tl.static_range`) and pipelined (`tl.range`) loops;
   - size: lines, characters, functions, syntax nodes, and whether the code parses at all;
2. the edit from anchor to candidate: identical, a `# tune:`-only edit, an edit in the same
   language, or a change of language; the share of lines kept (difflib's ratio), lines added and
   removed, how many tune constants changed and by how much (sum of |log2 new/old|, and signed);
3. the task (one-hot over tasks.TASK_NAMES, and "other");
4. the hardware profile the pair was measured on (forecast_prompt.HARDWARE_PROFILES: SMs, clock,
   memory size and bandwidth, compute capability; a CPU flag for the interpreter's rows).

What this mirrors of Ansor's features (Zheng et al., OSDI 2020, its 164 per-statement features):
its computation counts (float and int ops, math intrinsics) are our op counts; its GPU thread
binding (blockIdx/threadIdx extents, vthreads) is our num_warps and block sizes; its loop
features (number of loops, nesting, unroll/parallel/vectorize annotations and their extents) are
our loop structure and static_range/tl.range counts; its schedule's split factors, which Ansor's
search samples, are our `# tune:` constants. Ansor models one schedule of a fixed program; a pair
here is two programs, so the edit features and the deltas have no counterpart in Ansor (TLP's
schedule-primitive sequence is the nearest). What cannot exist at this level: everything Ansor
reads from the lowered loop nest with concrete shapes, i.e. buffer-access features (bytes and
unique bytes touched, cache lines, reuse type, distance and count, strides), the arithmetic-
intensity curve, allocation sizes and loop extents. A Triton or PyTorch source names neither its
input shapes (they arrive at run time) nor the loop nest the compiler will make of it
(vectorisation, unrolling, shared-memory staging and pipelining happen below the source), and
per-statement features summed over statements need a lowered IR we never build.

FEATURE_VERSION changes whenever a feature's meaning or order changes: a model trained on
another version is refused at load (costmodel.py), not fed numbers it never saw.
"""
import ast
import difflib
import functools
import math
import re
import zlib

from mutators import tunables
from tasks import TUNE_LINE

FEATURE_VERSION = 2  # 2: CPU code (torch.compile, C++ loops, omp simd, compiler flags, libm calls) and tune slots
CONST_SLOTS = 8
TUNE_SLOTS = 8

# ---- 1. the code ----------------------------------------------------------------------------------

_COMMENT = re.compile(r"(?m)(?<!['\"])#(?! *tune:).*$")  # comments, but not `# tune:` annotations
_COUNTS = {  # op counts by regex, so that code which does not parse still gets them
    "tl_dot": r"\btl\.dot\s*\(",
    "torch_matmul": r"(?:\btorch\.(?:matmul|mm|bmm|addmm|baddbmm|einsum)|\bF\.linear|\.matmul)\s*\(|[\w\)\]][ \t]*@[ \t]*[\w\(]",
    "tl_reduce": r"\btl\.(?:sum|max|min|argmax|argmin|reduce|cumsum|cumprod|xor_sum)\s*\(",
    "torch_reduce": r"(?<!tl)\.(?:sum|mean|amax|amin|logsumexp|softmax|log_softmax|cumsum|norm|prod|var|std)\s*\(",
    "tl_load": r"\btl\.load\s*\(",
    "tl_store": r"\btl\.store\s*\(",
    "tl_atomic": r"\btl\.atomic_\w+\s*\(",
    "tl_math": r"\btl\.(?:exp|exp2|log|log2|sqrt|rsqrt|sigmoid|math\.\w+|fma|where|maximum|minimum|abs)\s*\(",
    "torch_call": r"\b(?:torch|F)\.\w+(?:\.\w+)*\s*\(",
    "alloc": r"\btorch\.(?:empty|zeros|ones|full|empty_like|zeros_like|ones_like|full_like)\s*\(|\.(?:clone|contiguous)\s*\(",
    "upcast": r"\.float\s*\(\)|\.to\s*\(\s*(?:torch\.float32|tl\.float32)",
    "bf16": r"bfloat16|\bbf16\b",
    "fp16": r"float16|\bhalf\b|\bfp16\b",
    "fp32": r"float32|\bfp32\b",
    "fp8": r"float8|\bfp8\b",
    "launch": r"\]\s*\(",  # kernel[grid](...)
    "autotune_config": r"\btriton\.Config\s*\(",
    "cuda_kernel": r"__global__",
    "cuda_shared": r"__shared__",
    "cuda_sync": r"__syncthreads",
    "cuda_mma": r"\b(?:wmma|mma_sync|mma\.sync)\b",
    "torch_compile": r"\btorch\.compile\s*\(",
    "cpp_loop": r"\bfor\s*\(\s*(?:const\s+)?(?:int|int64_t|size_t|long|auto|unsigned)\b",
    "omp_simd": r"\bomp\s+simd\b",
    "vector_flag": r"-march=native|-fno-trapping-math|-ffast-math|-fopenmp-simd|-mprefer-vector-width",
    "libm_call": r"\bstd::(?:exp|log|fmax|fmin|pow|tanh|erf)\s*\(|\b(?:expf|logf|fmaxf|powf)\s*\(",
}
_BLOCK = re.compile(r"BLOCK|TILE|CHUNK|GROUP|SPLIT", re.I)
_WARPS = re.compile(r"WARPS", re.I)
_STAGES = re.compile(r"STAGES", re.I)

CODE_KEYS = (
    "lang_triton", "lang_cuda", "lang_torch", "n_kernels", "masked_load",
    *_COUNTS,
    "n_tunables", "tune_pos_mean", *(f"tune_slot{k}" for k in range(TUNE_SLOTS)),
    "block_max", "block_min", "block_prod", "warps_max", "warps_min", "stages_max",
    *(f"const_slot{k}" for k in range(CONST_SLOTS)),
    "kernel_loops", "kernel_loop_depth", "host_loops", "host_loop_depth", "static_range", "tl_range",
    "lines", "chars_log2", "functions", "nodes_log2", "parses",
)


def _dotted(node):
    """'triton.jit' for an Attribute chain, 'jit' for a Name, '' otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _is_kernel(fn):
    """A function decorated with triton.jit (or autotune/heuristics wrapping it)."""
    for d in fn.decorator_list:
        name = _dotted(d.func if isinstance(d, ast.Call) else d)
        if name.endswith(("jit", "autotune", "heuristics")):
            return True
    return False


def _int(node):
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def named_ints(tree):
    """[(name, value)] of every integer given a name: `X = 8`, `X: tl.constexpr = 8`, `f(X=8)`,
    `{"X": 8}` and `def k(..., X=8)`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _int(node.value) is not None:
            out += [(t.id, node.value.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                and _int(node.value) is not None:
            out.append((node.target.id, node.value.value))
        elif isinstance(node, ast.keyword) and node.arg and _int(node.value) is not None:
            out.append((node.arg, node.value.value))
        elif isinstance(node, ast.Dict):
            out += [(k.value, _int(v)) for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str) and _int(v) is not None]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            out += [(a.arg, _int(d)) for a, d in zip(args, node.args.defaults) if _int(d) is not None]
    # a name bound to another name (`num_warps=NUM_WARPS`) takes that name's value
    values = dict(out)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg and isinstance(node.value, ast.Name) \
                and node.value.id in values:
            out.append((node.arg, values[node.value.id]))
    return out


def _loops(tree):
    """(loops in kernels, their deepest nesting, loops in host code, theirs, static_range, tl.range)."""
    counts = {"kernel": [0, 0], "host": [0, 0]}

    def walk(node, where, depth):
        for child in ast.iter_child_nodes(node):
            here = "kernel" if isinstance(child, ast.FunctionDef) and _is_kernel(child) else where
            d = depth
            if isinstance(child, (ast.For, ast.While, ast.comprehension)):
                d = depth + 1
                counts[here][0] += 1
                counts[here][1] = max(counts[here][1], d)
            walk(child, here, 0 if here != where else d)
    walk(tree, "host", 0)
    calls = [_dotted(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    static = sum(c.endswith("static_range") for c in calls)
    pipelined = sum(c in ("tl.range", "triton.language.range") for c in calls)
    return (*counts["kernel"], *counts["host"], static, pipelined)


def _log2(v):
    return math.log2(max(1, abs(v)))


@functools.lru_cache(maxsize=4096)
def code_features(code):
    """The CODE_KEYS features of one source (a tuple, cached: a search's anchor repeats)."""
    text = _COMMENT.sub("", code)
    f = {k: len(re.findall(p, text)) for k, p in _COUNTS.items()}
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = None
    triton = bool(re.search(r"^\s*(?:import|from)\s+triton\b", code, re.M)) or "triton.jit" in code
    cuda = f["cuda_kernel"] > 0 or "load_inline" in code or "cpp_extension" in code
    f.update(lang_triton=float(triton), lang_cuda=float(cuda), lang_torch=float(not triton and not cuda),
             masked_load=len(re.findall(r"\btl\.load\s*\([^)]*\bmask\s*=", text)))
    tune = tunables(code)
    f["n_tunables"] = len(tune)
    position = {n: ch.index(v) / max(1, len(ch) - 1) if v in ch else 0.5 for n, (v, ch) in tune.items()}
    f["tune_pos_mean"] = sum(position.values()) / len(tune) if tune else 0.0
    for k in range(TUNE_SLOTS):  # 0: no tunable hashed here; 1 + position otherwise
        f[f"tune_slot{k}"] = 0.0
    for name, pos in position.items():
        slot = f"tune_slot{zlib.crc32(name.encode()) % TUNE_SLOTS}"
        f[slot] = max(f[slot], 1.0 + pos)
    ints = named_ints(tree) if tree else [(m["name"], int(m["value"])) for m in TUNE_LINE.finditer(code)]
    blocks = [v for n, v in ints if _BLOCK.search(n) and not _WARPS.search(n) and not _STAGES.search(n) and v > 0]
    warps = [v for n, v in ints if _WARPS.search(n) and v > 0]
    stages = [v for n, v in ints if _STAGES.search(n) and v > 0]
    f.update(block_max=_log2(max(blocks, default=1)), block_min=_log2(min(blocks, default=1)),
             block_prod=sum(map(_log2, set(blocks))), warps_max=_log2(max(warps, default=1)),
             warps_min=_log2(min(warps, default=1)), stages_max=_log2(max(stages, default=1)))
    for k in range(CONST_SLOTS):
        f[f"const_slot{k}"] = 0.0
    for name, v in ints:
        slot = f"const_slot{zlib.crc32(name.encode()) % CONST_SLOTS}"
        f[slot] = max(f[slot], _log2(v))
    loops = _loops(tree) if tree else (0,) * 6
    f.update(zip(("kernel_loops", "kernel_loop_depth", "host_loops", "host_loop_depth", "static_range", "tl_range"),
                 loops))
    f["n_kernels"] = sum(isinstance(n, ast.FunctionDef) and _is_kernel(n) for n in ast.walk(tree)) if tree else \
        len(re.findall(r"@triton\.jit", code))
    f.update(lines=sum(1 for line in code.splitlines() if line.strip()), chars_log2=_log2(len(code)),
             functions=sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree)) if tree else 0,
             nodes_log2=_log2(sum(1 for _ in ast.walk(tree))) if tree else 0.0, parses=float(tree is not None))
    return tuple(float(f[k]) for k in CODE_KEYS)


# ---- 2. the edit from anchor to candidate -------------------------------------------------------------

EDIT_KEYS = ("edit_identical", "edit_tune_only", "edit_same_language", "edit_language_change", "edit_ratio",
             "edit_added", "edit_removed", "tune_changed", "tune_change_abs", "tune_change_signed")


def _untuned(code):
    return TUNE_LINE.sub(lambda m: f"{m['name']}=?", code).strip()


def edit_features(anchor, candidate):
    a, c = anchor.strip(), candidate.strip()
    lang = lambda code: code_features(code)[:3]  # noqa: E731  (triton, cuda, torch)
    identical = a == c
    tune_only = not identical and _untuned(a) == _untuned(c)
    same_lang = lang(anchor) == lang(candidate)
    al, cl = a.splitlines(), c.splitlines()
    sm = difflib.SequenceMatcher(None, al, cl, autojunk=False)
    added = removed = 0
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op != "equal":
            removed += i2 - i1
            added += j2 - j1
    ta, tc = tunables(anchor), tunables(candidate)
    changed = [(ta[n][0], tc[n][0]) for n in ta.keys() & tc.keys() if ta[n][0] != tc[n][0] and ta[n][0] > 0 < tc[n][0]]
    steps = [math.log2(new / old) for old, new in changed]
    return (float(identical), float(tune_only), float(same_lang and not identical and not tune_only),
            float(not same_lang), sm.ratio(), math.log2(1 + added), math.log2(1 + removed), float(len(changed)),
            sum(map(abs, steps)), sum(steps))


# ---- 3. the task, 4. the hardware -----------------------------------------------------------------------

def _task_names():
    from tasks import TASK_NAMES
    return TASK_NAMES


TASK_KEYS = tuple(f"task_{t}" for t in _task_names()) + ("task_other",)
HARDWARE_KEYS = ("hw_cpu", "hw_sm_count", "hw_clock_ghz", "hw_memory_gb", "hw_bandwidth_tbs", "hw_compute_capability")


def task_features(task):
    return tuple(float(k == f"task_{task}" or (k == "task_other" and task not in _task_names())) for k in TASK_KEYS)


def _number(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def hardware_features(profile):
    """A forecast_prompt hardware profile as numbers; the interpreter's CPU profile has none but its flag."""
    p = profile or {}
    bandwidth = _number(p.get("memory_clock_ghz")) * 2 * _number(p.get("memory_bus_width_bits")) / 8 / 1000
    return (float(str(p.get("name", "")).upper().startswith("CPU")), _number(p.get("sm_count")),
            _number(p.get("clock_ghz")), _number(p.get("memory_gb")), bandwidth,
            _number(p.get("compute_capability")))


# ---- the row --------------------------------------------------------------------------------------------

def feature_names():
    return (tuple(f"cand_{k}" for k in CODE_KEYS) + tuple(f"delta_{k}" for k in CODE_KEYS) + EDIT_KEYS
            + TASK_KEYS + HARDWARE_KEYS)


def pair_features(task, anchor_code, candidate_code, hardware):
    """One row of floats, in feature_names() order, for a candidate against its anchor."""
    cand, anchor = code_features(candidate_code), code_features(anchor_code)
    return [*cand, *(c - a for c, a in zip(cand, anchor)), *edit_features(anchor_code, candidate_code),
            *task_features(task), *hardware_features(hardware)]
