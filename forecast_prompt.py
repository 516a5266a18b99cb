"""forecast_prompt.py: what the forecaster sees (docs/PAPER.md §3).

A "GPU execution simulator" system message with the speedup definition and the bin table, a user
message with the task name and description (from tasks/), the reference kernel fenced as python,
a table of the hardware, then the candidate kernel, plus the schema of the answer tool
`submit_kernel_runtime_estimate`. The bin table is generated from bins.py, the same edges that
label the data, so the prompt and the labels can never disagree (the original's mismatch).
The candidate comes last (the original put the hardware after it): everything before it is the
same for every candidate of a task, so a model computes it once (shared_messages).
train_grpo.py trains on the same prompt.

Two protocols (paper_protocol.PROTOCOLS, docs/FIDELITY.md). `ours` is the prompt above. `paper`
gives the model what the original gave it and nothing more: its own bin table (right-closed,
edges 0.25 ... 4.0, names that do not fit bin 4 of the labels: base-model numbers depend on that
table), no task description, its instruction not to put all mass on one bin unless the evidence
is decisive, the task name as the operation's name, "reference" and "candidate" as the kernels'
names, the hardware after the candidate, and the tool fields named after its table
(p_minor_slowdown ...).

The abstain variant (abstain=True, both protocols) offers a second tool, `defer_to_evaluator`:
the model may decline to forecast, with a reason, and the candidate goes to the real evaluator.

The hardware table comes from the row being forecast (its `hardware` field: row_hardware), a
named profile, or the local GPU for a candidate measured on this machine (hardware_info). The paper
conditions the forecast on the GPU; a kernel timed on a CPU is shown the CPU instead, with rows of
its own (CPU_ROWS): its model, how it is timed (one core), its vector instructions and caches
(cpu_profile, read from this machine), since that is what decides whether a C++ loop, inductor's
code or a PyTorch rewrite is fast there.
"""
import glob
import os
import platform

import bins
from paper_protocol import PROTOCOLS

TOOL_NAME = "submit_kernel_runtime_estimate"
DEFER_TOOL_NAME = "defer_to_evaluator"


def _fields(names):
    return tuple("p_" + name.replace(" ", "_") for name in names)


PROB_FIELDS = _fields(bins.BIN_NAMES)
# The original's table as its prompt showed it: right-closed intervals, its own edges and names.
# Only the prompt uses it; every label is bins.py's (a 1.2x kernel is bin 4 whatever this says).
PAPER_EDGES = (0.25, 0.5, 0.71, 1.0, 1.41, 2.0, 4.0)
PAPER_BIN_NAMES = ("severe slowdown", "significant slowdown", "moderate slowdown", "minor slowdown",
                   "minor speedup", "significant speedup", "high speedup", "extreme speedup")
PAPER_PROB_FIELDS = _fields(PAPER_BIN_NAMES)


def prob_fields(protocol="ours"):
    return PAPER_PROB_FIELDS if protocol == "paper" else PROB_FIELDS


def _check_protocol(protocol):
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of: {', '.join(PROTOCOLS)}")


# ---- hardware -------------------------------------------------------------------------------------

# Datasheet values. a100-80gb is the paper's (docs/PAPER.md §3); l40s the original's numbers for
# it; memory clocks as nvidia-smi reports them, in GHz. `match`: what a device name must contain
# (upper case, letters and digits only) to be that profile. cpu: rows measured on a CPU whose model
# the row does not record show the model that they were CPU times, not a GPU they never ran on; a
# search on this machine shows its own CPU (cpu_profile).
HARDWARE_PROFILES = {
    "a100-80gb": dict(name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", memory_gb=80,
                      sm_count=108, max_threads_per_sm=2048, clock_ghz=1.41, memory_clock_ghz=1.512,
                      memory_bus_width_bits=5120),
    "h100": dict(name="NVIDIA H100 80GB HBM3", compute_capability="9.0", memory_gb=80, sm_count=132,
                 max_threads_per_sm=2048, clock_ghz=1.98, memory_clock_ghz=2.619,
                 memory_bus_width_bits=5120),
    "h200": dict(name="NVIDIA H200", compute_capability="9.0", memory_gb=141, sm_count=132,
                 max_threads_per_sm=2048, clock_ghz=1.98, memory_clock_ghz=3.201,
                 memory_bus_width_bits=6144),
    "l40s": dict(name="NVIDIA L40S", compute_capability="8.9", memory_gb=44.5, sm_count=142,
                 max_threads_per_sm=1536, clock_ghz=2.52, memory_clock_ghz=9.0,
                 memory_bus_width_bits=384),
    "cpu": dict(name="CPU (model not recorded; CPU times, not GPU times)", timed_on=None, vector_isa="not recorded",
                caches="not recorded", memory_gb="not recorded"),
}
CPU_TIMED_ON = ("one core, single-threaded: the CPU time of every thread counts, so threads do not help; "
                "Triton kernels run in Triton's interpreter there, far slower than PyTorch")
HARDWARE_PROFILES["cpu"]["timed_on"] = CPU_TIMED_ON
_MATCH = {"a100-80gb": "A100", "h100": "H100", "h200": "H200", "l40s": "L40S", "cpu": "CPU"}
HARDWARE_ROWS = (("name", "device"), ("compute_capability", "compute capability"),
                 ("memory_gb", "memory (GB)"), ("sm_count", "SMs"),
                 ("max_threads_per_sm", "max threads per SM"), ("clock_ghz", "clock (GHz)"),
                 ("memory_clock_ghz", "memory clock (GHz)"), ("memory_bus_width_bits", "memory bus width (bits)"))
CPU_ROWS = (("name", "device"), ("timed_on", "timed on"), ("vector_isa", "vector instructions"),
            ("caches", "caches"), ("memory_gb", "memory (GB)"))
# The vector extensions that decide how wide a CPU loop runs, as /proc/cpuinfo's flags name them.
CPU_ISA = (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_tile", "AMX"), ("avx2", "AVX2"),
           ("fma", "FMA"), ("avx", "AVX"), ("sse4_2", "SSE4.2"), ("asimd", "NEON"), ("sve", "SVE"))


def is_cpu(hardware):
    """Whether a hardware profile is a CPU's (its name starts with CPU)."""
    return str((hardware or {}).get("name", "")).upper().startswith("CPU")


def _cpuinfo(keys):
    """The first value of any of `keys` in /proc/cpuinfo ("" where there is none or no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return ""


def cpu_model():
    """This machine's CPU model, as /proc/cpuinfo names it (the platform's name elsewhere); the
    benchmarks name their machine with it too."""
    return _cpuinfo(("model name", "Model", "cpu model")) or platform.processor() or platform.machine() or "unknown"


def cpu_profile():
    """This machine's CPU as a hardware profile: its model and vector extensions (/proc/cpuinfo;
    the platform's name elsewhere), its caches per level (sysfs), its memory."""
    model, flags = cpu_model(), set(_cpuinfo(("flags", "Features")).split())
    caches = []
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            level = open(f"{index}/level").read().strip()
            kind = open(f"{index}/type").read().strip()
            size = open(f"{index}/size").read().strip()
        except OSError:
            continue
        if kind != "Instruction":
            kb = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[:-1].isdigit() else None
            size = size if kb is None else f"{kb // 1024} MB" if kb >= 1024 and kb % 1024 == 0 else f"{kb} KB"
            caches.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError, AttributeError):
        memory = "unknown"
    return dict(name=f"CPU: {model} ({platform.machine()})", timed_on=CPU_TIMED_ON,
                vector_isa=", ".join(name for flag, name in CPU_ISA if flag in flags) or "none found",
                caches=", ".join(caches) or "unknown", memory_gb=memory)



def hardware_profile(hardware):
    """The profile of a hardware string: a profile name ("h100") or a device name as a row or
    measure.py records it ("NVIDIA A100-SXM4-80GB", "cpu (x86_64, 2 cores)"). ValueError naming
    the known ones otherwise (an A100 with 40 GB is not the paper's A100-80GB)."""
    text = str(hardware).strip()
    if text.lower() in HARDWARE_PROFILES:
        return dict(HARDWARE_PROFILES[text.lower()])
    key = "".join(c for c in text.upper() if c.isalnum())
    for name, needle in _MATCH.items():
        found = key.startswith(needle) if name == "cpu" else needle in key
        if found and not (name == "a100-80gb" and "40GB" in key):
            return dict(HARDWARE_PROFILES[name])
    known = "; ".join(f"{k} ({v['name']})" for k, v in HARDWARE_PROFILES.items())
    raise ValueError(f"unknown hardware {text!r}: no profile for it; known: {known}. Add its "
                     "datasheet values to forecast_prompt.HARDWARE_PROFILES")


def row_hardware(row, default):
    """The hardware a row was measured on, as a profile (its `hardware` field); `default` for a row
    that names none. Never the local GPU: a row's speedup is a fact about the machine it ran on."""
    name = row.get("hardware")
    return hardware_profile(name) if isinstance(name, str) and name.strip() else default


def hardware_info(profile=None):
    """The hardware of a candidate measured here: a named profile ("cpu": this machine's CPU,
    cpu_profile), else the local GPU, else the paper's A100.

    torch reports clocks and bus width only in recent versions; missing values are taken from the
    profile whose name matches the device, or left as "unknown"."""
    if profile == "cpu":
        return cpu_profile()
    if profile is not None:
        if profile not in HARDWARE_PROFILES:
            raise ValueError(f"unknown hardware profile {profile!r}; choose one of: {', '.join(HARDWARE_PROFILES)}")
        return dict(HARDWARE_PROFILES[profile])
    import torch
    if not torch.cuda.is_available():
        return dict(HARDWARE_PROFILES["a100-80gb"])
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        known = hardware_profile(p.name)
    except ValueError:
        known = {}

    def read(attr, scale, key):
        v = getattr(p, attr, None)
        return round(v * scale, 3) if v else known.get(key, "unknown")
    return dict(name=p.name, compute_capability=f"{p.major}.{p.minor}",
                memory_gb=round(p.total_memory / 2**30), sm_count=p.multi_processor_count,
                max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", None) or known.get("max_threads_per_sm", "unknown"),
                clock_ghz=read("clock_rate", 1e-6, "clock_ghz"),  # kHz
                memory_clock_ghz=read("memory_clock_rate", 1e-6, "memory_clock_ghz"),
                memory_bus_width_bits=getattr(p, "memory_bus_width", None) or known.get("memory_bus_width_bits", "unknown"))


def hardware_table(hardware):
    rows = ["| property | value |", "|---|---|"]
    rows += [f"| {label} | {hardware.get(key, 'unknown')} |" for key, label in (CPU_ROWS if is_cpu(hardware) else HARDWARE_ROWS)]
    return "\n".join(rows)


# ---- the system message ---------------------------------------------------------------------------

def _edge(x):
    return f"{x:.4f}".rstrip("0").rstrip(".")


def bin_table():
    """Markdown table of the bins, from bins.py (the one bin definition)."""
    rows = ["| bin | name | speedup interval |", "|---|---|---|"]
    rows += [f"| {b} | {bins.BIN_NAMES[b - 1]} | {bins.bin_label(b)} |" for b in bins.BINS]
    return "\n".join(rows)


def paper_bin_table():
    """The original prompt's table: right-closed intervals on PAPER_EDGES, its names."""
    e = PAPER_EDGES
    spans = [f"S <= {e[0]}"] + [f"{lo} < S <= {hi}" for lo, hi in zip(e, e[1:])] + [f"S > {e[-1]}"]
    rows = ["| bin | name | speedup |", "|---|---|---|"]
    rows += [f"| {b} | {PAPER_BIN_NAMES[b - 1]} | {span} |" for b, span in zip(bins.BINS, spans)]
    return "\n".join(rows)


FACTORS = ("total work (FLOPs) and operator fusion", "memory access patterns and coalescing",
           "arithmetic intensity (compute- vs memory-bound)", "warp divergence",
           "occupancy: registers and shared memory per block", "grid size and parallelism",
           "synchronisation and atomics", "kernel launch overhead (number of launches)",
           "calls into vendor libraries (cuBLAS, cuDNN) versus hand-written code",
           "data types and use of tensor cores")


# What decides a kernel's speed on one CPU core, in place of FACTORS, where the hardware is a CPU.
CPU_FACTORS = ("passes over memory, and whether a row's working set stays in the L1/L2 cache",
               "vectorisation: whether the inner loops use the CPU's vector instructions (a call such as libm's "
               "exp in a loop, or strict floating-point reductions, keep a loop scalar)",
               "operator fusion (torch.compile, one hand-written loop) versus one PyTorch operator per step",
               "the fixed cost of each operator call (dispatch, allocation), large beside small shapes",
               "arithmetic intensity (compute- vs memory-bound) and the cost of transcendental functions",
               "Triton kernels, which run in Triton's interpreter on a CPU, far slower than PyTorch")


def _abstain_section():
    return (f"\n\nIf the code does not let you forecast the speedup with reasonable confidence, call "
            f"{DEFER_TOOL_NAME} instead, with a 1-2 sentence reason: the candidate is then measured on "
            "the real GPU. Call exactly one of the two tools.")


def system_prompt(protocol="ours", abstain=False, hardware=None):
    """The system message. Under `ours`, a CPU's hardware profile (is_cpu) makes it a CPU's: the
    model is told the kernels run on a CPU and given CPU_FACTORS; `paper` is the original's always."""
    _check_protocol(protocol)
    fields = ", ".join(prob_fields(protocol))
    cpu = protocol != "paper" and is_cpu(hardware)
    factors = "\n".join(f"- {f}" for f in (CPU_FACTORS if cpu else FACTORS))
    if protocol == "paper":
        text = f"""You are a GPU execution simulator. Given a reference kernel and a candidate kernel for the same operation, forecast how fast the candidate runs compared with the reference on the given hardware, without running either.

Speedup S = reference runtime / candidate runtime. S > 1 means the candidate is faster. Classify S into one of {bins.N_BINS} categories:

{paper_bin_table()}

Give a probability between 0 and 1 for each category; the probabilities must sum to 1. They are usually concentrated on one or two adjacent categories, but do not put all the probability on one category unless the evidence is decisive.

Analyse, for both kernels:
{factors}

Call the tool {TOOL_NAME} exactly once with: predicted_bin (1 to {bins.N_BINS}); the {bins.N_BINS} probabilities {fields}; and reasoning, 1 to 3 sentences."""
    else:
        edges = ", ".join(_edge(e) for e in bins.BIN_EDGES)
        device = "CPU" if cpu else "GPU"
        text = f"""You are a {device} execution simulator. You are shown a reference {device} kernel and a candidate kernel that computes the same task, and you forecast how fast the candidate runs compared with the reference, without running either.

Speedup S = reference runtime / candidate runtime. S > 1 means the candidate is faster. S falls into one of {bins.N_BINS} bins, half an octave wide, each lower edge inclusive (edges at S = {edges}):

{bin_table()}

Consider, for both kernels on the given hardware:
{factors}

Answer by calling the tool {TOOL_NAME} exactly once with: predicted_bin (the most likely bin, 1 to {bins.N_BINS}); the {bins.N_BINS} probabilities {fields}, each between 0 and 1 and summing to 1 (usually concentrated on one or two adjacent bins); and reasoning, 1 to 3 sentences. If you cannot call tools, reply with the same JSON object in a ```json block."""
    return text + (_abstain_section() if abstain else "")


# ---- the user message -----------------------------------------------------------------------------

def _fence(code):
    """A ```python fence that the code itself cannot close."""
    ticks = "```"
    while ticks in code:
        ticks += "`"
    return f"{ticks}python\n{code.rstrip()}\n{ticks}"


def _user_parts(task, reference_code, candidate_code, hardware, protocol):
    """The user message in two parts: what every candidate of (task, reference, hardware) shares,
    then the candidate. The shared part comes first so that its computation (a model's KV cache,
    a server's prefix cache) is done once per task and reused for every candidate."""
    from tasks import prompt_view
    label, description = prompt_view(task)  # an unknown task fails here, under both protocols
    task = label  # a problem file's stem, not its path
    if protocol == "paper":  # the original's content and order: the hardware after the candidate
        shared = (f"Operation: {task}\n\nKernel `reference`:\n{_fence(reference_code)}\n\n")
        candidate = (f"Kernel `candidate`:\n{_fence(candidate_code)}\n\n"
                     f"Hardware:\n{hardware_table(hardware)}")
        return shared, candidate
    description = description.strip()
    shared = (f"Task: {task}\n\n{description}\n\n"
              f"Reference kernel (task {task}):\n{_fence(reference_code)}\n\n"
              f"Hardware:\n{hardware_table(hardware)}\n\n")
    candidate = (f"Candidate kernel (task {task}):\n{_fence(candidate_code)}\n\n"
                 f"Forecast the candidate's speedup over the reference with {TOOL_NAME}.")
    return shared, candidate


def build_messages(task, reference_code, candidate_code, hardware=None, *, protocol="ours", abstain=False):
    """System and user messages of one forecast (docs/PAPER.md §3). `hardware` is a profile dict
    (row_hardware, hardware_info; default: hardware_info())."""
    hardware = hardware_info() if hardware is None else hardware
    shared, candidate = _user_parts(task, reference_code, candidate_code, hardware, protocol)
    return [{"role": "system", "content": system_prompt(protocol, abstain, hardware)},
            {"role": "user", "content": shared + candidate}]


def shared_messages(task, reference_code, hardware=None, *, protocol="ours", abstain=False):
    """The messages of build_messages cut just before the candidate: the part every candidate of
    (task, reference, hardware) shares. A backend renders it to find the prompt prefix it may
    compute once (rendering closes the cut message, so only the common tokens are reused)."""
    hardware = hardware_info() if hardware is None else hardware
    shared, _ = _user_parts(task, reference_code, "", hardware, protocol)
    return [{"role": "system", "content": system_prompt(protocol, abstain, hardware)}, {"role": "user", "content": shared}]


# ---- the answer tools (OpenAI `tools` format; the harmony developer message renders the same) ----

def forecast_tool(protocol="ours"):
    """The forecast tool; its probability fields are named after the protocol's table."""
    _check_protocol(protocol)
    names = PAPER_BIN_NAMES if protocol == "paper" else bins.BIN_NAMES
    fields = prob_fields(protocol)

    def describe(b):
        return f"probability of bin {b}, {names[b - 1]}" + ("" if protocol == "paper" else f" ({bins.bin_label(b)})")
    return {"type": "function", "function": {
        "name": TOOL_NAME,
        "description": "Submit the forecast of the candidate kernel's speedup over the reference as "
                       "probabilities over the 8 speedup bins.",
        "parameters": {
            "type": "object",
            "properties": {
                "predicted_bin": {"type": "integer", "minimum": 1, "maximum": bins.N_BINS,
                                  "description": "the most likely bin"},
                **{f: {"type": "number", "minimum": 0, "maximum": 1, "description": describe(b)}
                   for b, f in zip(bins.BINS, fields)},
                "reasoning": {"type": "string", "description": "1-3 sentences"},
            },
            "required": ["predicted_bin", *fields, "reasoning"],
            "additionalProperties": False,
        }}}


FORECAST_TOOL = forecast_tool("ours")
DEFER_TOOL = {"type": "function", "function": {
    "name": DEFER_TOOL_NAME,
    "description": "Decline to forecast this candidate: it is measured on the real GPU instead.",
    "parameters": {
        "type": "object",
        "properties": {"reason": {"type": "string",
                                  "description": "1-2 sentences: why a forecast would be unreliable"}},
        "required": ["reason"],
        "additionalProperties": False,
    }}}


def answer_tools(protocol="ours", abstain=False):
    """The tools a forecast may call: the forecast tool first (a forced answer opens it), then the
    deferral tool in the abstain variant."""
    return [forecast_tool(protocol)] + ([DEFER_TOOL] if abstain else [])
