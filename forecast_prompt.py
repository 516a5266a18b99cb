"""forecast_prompt.py: what the forecaster sees (docs/PAPER.md §3).

A "GPU execution simulator" system message with the speedup definition and the bin table, a user
message with the task name and description (from tasks/), the reference kernel fenced as python,
a table of the hardware (read from the GPU when one is present, or a named profile: a100-80gb as
in the paper, h100, h200), then the candidate kernel, plus the schema of the answer tool
`submit_kernel_runtime_estimate`. The bin table is generated from bins.py, the same edges that
label the data, so the prompt and the labels can never disagree (the original's mismatch).
The candidate comes last (the original put the hardware after it): everything before it is the
same for every candidate of a task, so a model computes it once (shared_messages).
train_grpo.py trains on the same prompt.
"""
import bins

TOOL_NAME = "submit_kernel_runtime_estimate"
PROB_FIELDS = tuple("p_" + name.replace(" ", "_") for name in bins.BIN_NAMES)

# ---- hardware -------------------------------------------------------------------------------------

# Datasheet values. a100-80gb is the paper's (docs/PAPER.md §3); memory clocks are the HBM
# clock in GHz as nvidia-smi reports it.
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
}
HARDWARE_ROWS = (("name", "device"), ("compute_capability", "compute capability"),
                 ("memory_gb", "memory (GB)"), ("sm_count", "SMs"),
                 ("max_threads_per_sm", "max threads per SM"), ("clock_ghz", "clock (GHz)"),
                 ("memory_clock_ghz", "memory clock (GHz)"), ("memory_bus_width_bits", "memory bus width (bits)"))


def hardware_info(profile=None):
    """The hardware table of the prompt: a named profile, else the local GPU, else the paper's A100.

    torch reports clocks and bus width only in recent versions; missing values are taken from the
    profile whose name matches the device, or left as "unknown"."""
    if profile is not None:
        if profile not in HARDWARE_PROFILES:
            raise ValueError(f"unknown hardware profile {profile!r}; choose one of: {', '.join(HARDWARE_PROFILES)}")
        return dict(HARDWARE_PROFILES[profile])
    import torch
    if not torch.cuda.is_available():
        return dict(HARDWARE_PROFILES["a100-80gb"])
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    known = next((v for k, v in HARDWARE_PROFILES.items() if k.split("-")[0].upper() in p.name.upper()), {})

    def read(attr, scale, key):
        v = getattr(p, attr, None)
        return round(v * scale, 3) if v else known.get(key, "unknown")
    return dict(name=p.name, compute_capability=f"{p.major}.{p.minor}",
                memory_gb=round(p.total_memory / 2**30), sm_count=p.multi_processor_count,
                max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", None) or known.get("max_threads_per_sm", "unknown"),
                clock_ghz=read("clock_rate", 1e-6, "clock_ghz"),  # kHz
                memory_clock_ghz=read("memory_clock_rate", 1e-6, "memory_clock_ghz"),
                memory_bus_width_bits=getattr(p, "memory_bus_width", None) or known.get("memory_bus_width_bits", "unknown"))


# ---- the prompt -----------------------------------------------------------------------------------

def _edge(x):
    return f"{x:.4f}".rstrip("0").rstrip(".")


def bin_table():
    """Markdown table of the bins, from bins.py (the one bin definition)."""
    rows = ["| bin | name | speedup interval |", "|---|---|---|"]
    rows += [f"| {b} | {bins.BIN_NAMES[b - 1]} | {bins.bin_label(b)} |" for b in bins.BINS]
    return "\n".join(rows)


FACTORS = ("total work (FLOPs) and operator fusion", "memory access patterns and coalescing",
           "arithmetic intensity (compute- vs memory-bound)", "warp divergence",
           "occupancy: registers and shared memory per block", "grid size and parallelism",
           "synchronisation and atomics", "kernel launch overhead (number of launches)",
           "calls into vendor libraries (cuBLAS, cuDNN) versus hand-written code",
           "data types and use of tensor cores")


def system_prompt():
    edges = ", ".join(_edge(e) for e in bins.BIN_EDGES)
    fields = ", ".join(PROB_FIELDS)
    factors = "\n".join(f"- {f}" for f in FACTORS)
    return f"""You are a GPU execution simulator. You are shown a reference GPU kernel and a candidate kernel that computes the same task, and you forecast how fast the candidate runs compared with the reference, without running either.

Speedup S = reference runtime / candidate runtime. S > 1 means the candidate is faster. S falls into one of {bins.N_BINS} bins, half an octave wide, each lower edge inclusive (edges at S = {edges}):

{bin_table()}

Consider, for both kernels on the given hardware:
{factors}

Answer by calling the tool {TOOL_NAME} exactly once with: predicted_bin (the most likely bin, 1 to {bins.N_BINS}); the {bins.N_BINS} probabilities {fields}, each between 0 and 1 and summing to 1 (usually concentrated on one or two adjacent bins); and reasoning, 1 to 3 sentences. If you cannot call tools, reply with the same JSON object in a ```json block."""


def _fence(code):
    """A ```python fence that the code itself cannot close."""
    ticks = "```"
    while ticks in code:
        ticks += "`"
    return f"{ticks}python\n{code.rstrip()}\n{ticks}"


def hardware_table(hardware):
    rows = ["| property | value |", "|---|---|"]
    rows += [f"| {label} | {hardware.get(key, 'unknown')} |" for key, label in HARDWARE_ROWS]
    return "\n".join(rows)


def _user_parts(task, reference_code, candidate_code, hardware):
    """The user message in two parts: what every candidate of (task, reference, hardware) shares,
    then the candidate. The shared part comes first so that its computation (a model's KV cache,
    a server's prefix cache) is done once per task and reused for every candidate."""
    from tasks import get_task
    description = get_task(task).DESCRIPTION.strip()
    shared = (f"Task: {task}\n\n{description}\n\n"
              f"Reference kernel (task {task}):\n{_fence(reference_code)}\n\n"
              f"Hardware:\n{hardware_table(hardware)}\n\n")
    candidate = (f"Candidate kernel (task {task}):\n{_fence(candidate_code)}\n\n"
                 f"Forecast the candidate's speedup over the reference with {TOOL_NAME}.")
    return shared, candidate


def build_messages(task, reference_code, candidate_code, hardware=None):
    """System and user messages of one forecast (docs/PAPER.md §3). `hardware` is a dict
    from hardware_info() (default: hardware_info())."""
    hardware = hardware_info() if hardware is None else hardware
    shared, candidate = _user_parts(task, reference_code, candidate_code, hardware)
    return [{"role": "system", "content": system_prompt()}, {"role": "user", "content": shared + candidate}]


def shared_messages(task, reference_code, hardware=None):
    """The messages of build_messages cut just before the candidate: the part every candidate of
    (task, reference, hardware) shares. A backend renders it to find the prompt prefix it may
    compute once (rendering closes the cut message, so only the common tokens are reused)."""
    hardware = hardware_info() if hardware is None else hardware
    shared, _ = _user_parts(task, reference_code, "", hardware)
    return [{"role": "system", "content": system_prompt()}, {"role": "user", "content": shared}]


# The answer tool, in the OpenAI `tools` format; the harmony developer message renders the same.
FORECAST_TOOL = {"type": "function", "function": {
    "name": TOOL_NAME,
    "description": "Submit the forecast of the candidate kernel's speedup over the reference as "
                   "probabilities over the 8 speedup bins.",
    "parameters": {
        "type": "object",
        "properties": {
            "predicted_bin": {"type": "integer", "minimum": 1, "maximum": bins.N_BINS,
                              "description": "the most likely bin"},
            **{f: {"type": "number", "minimum": 0, "maximum": 1,
                   "description": f"probability of bin {b}, {bins.BIN_NAMES[b - 1]} ({bins.bin_label(b)})"}
               for b, f in zip(bins.BINS, PROB_FIELDS)},
            "reasoning": {"type": "string", "description": "1-3 sentences"},
        },
        "required": ["predicted_bin", *PROB_FIELDS, "reasoning"],
        "additionalProperties": False,
    }}}
