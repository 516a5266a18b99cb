"""Tests of forecast_prompt.py: the prompt, its bin table and tool, the hardware profiles and their names."""
import pytest

import bins
from forecast_prompt import (
    FORECAST_TOOL,
    HARDWARE_PROFILES,
    PROB_FIELDS,
    TOOL_NAME,
    build_messages,
    hardware_info,
    hardware_profile,
    row_hardware,
    shared_messages,
)

A100 = hardware_info("a100-80gb")
REF = "import torch\n\ndef custom_kernel(data):\n    logits, targets, g = data\n    return reference(logits, targets, g)\n"
CAND = "import triton\n\ndef custom_kernel(data):\n    return fused_cross_entropy(*data)\n"


# ---- prompt --------------------------------------------------------------------------------------

def test_prompt_has_task_code_bins_and_hardware():
    from tasks import get_task
    system, user = build_messages("cross_entropy", REF, CAND, A100)
    assert (system["role"], user["role"]) == ("system", "user")
    for b in bins.BINS:  # the table is bins.py's bins, names and intervals
        assert f"| {b} | {bins.BIN_NAMES[b - 1]} | {bins.bin_label(b)} |" in system["content"]
    for edge in bins.BIN_EDGES:
        assert f"{edge:.4f}".rstrip("0").rstrip(".") in system["content"]
    assert "GPU execution simulator" in system["content"] and TOOL_NAME in system["content"]
    assert all(f in system["content"] for f in PROB_FIELDS)
    u = user["content"]
    assert get_task("cross_entropy").DESCRIPTION.strip() in u
    assert f"```python\n{REF.rstrip()}\n```" in u and f"```python\n{CAND.rstrip()}\n```" in u
    assert "```cuda" not in u
    assert u.count("cross_entropy") >= 3 and "Reference kernel (task cross_entropy)" in u
    for key in ("NVIDIA A100-SXM4-80GB", "| compute capability | 8.0 |", "| SMs | 108 |",
                "| memory bus width (bits) | 5120 |", "| memory clock (GHz) | 1.512 |"):
        assert key in u


def test_candidate_comes_last_after_the_shared_prefix():
    shared = shared_messages("cross_entropy", REF, A100)
    a = build_messages("cross_entropy", REF, CAND, A100)
    b = build_messages("cross_entropy", REF, CAND + "# other\n", A100)
    assert a[0] == b[0] == shared[0]
    for msgs in (a, b):  # everything but the candidate is one prefix, the same for every candidate
        user = msgs[1]["content"]
        assert user.startswith(shared[1]["content"])
        rest = user[len(shared[1]["content"]):]
        assert rest.startswith("Candidate kernel (task cross_entropy)") and "| SMs |" not in rest
    assert "Reference kernel" in shared[1]["content"] and "| SMs | 108 |" in shared[1]["content"]
    assert CAND not in shared[1]["content"]
    assert shared_messages("cross_entropy", CAND, A100) != shared  # the reference is part of it


def test_fence_survives_backticks_in_code():
    _, user = build_messages("cross_entropy", REF, 'DOC = """```python\nx```"""\n', A100)
    assert "````python\n" in user["content"]


def test_tool_schema_matches_bins():
    params = FORECAST_TOOL["function"]["parameters"]
    assert FORECAST_TOOL["function"]["name"] == TOOL_NAME
    assert params["required"] == ["predicted_bin", *PROB_FIELDS, "reasoning"]
    assert PROB_FIELDS[0] == "p_severe_slowdown" and PROB_FIELDS[-1] == "p_extreme_speedup"
    assert params["properties"]["predicted_bin"]["maximum"] == bins.N_BINS


def test_unknown_task_is_clear():
    with pytest.raises(ValueError, match="unknown task"):
        build_messages("matmul", REF, CAND, A100)


# ---- hardware profiles ----------------------------------------------------------------------------

def test_hardware_profiles_and_bad_profile():
    assert A100["sm_count"] == 108 and A100["compute_capability"] == "8.0" and A100["clock_ghz"] == 1.41
    assert set(HARDWARE_PROFILES) >= {"a100-80gb", "h100", "h200"}
    with pytest.raises(ValueError, match="unknown hardware profile"):
        hardware_info("tpu")
    import torch
    if not torch.cuda.is_available():
        assert hardware_info() == A100


def test_hardware_profiles_and_names():
    assert set(HARDWARE_PROFILES) >= {"a100-80gb", "h100", "h200", "l40s"}
    l40s = HARDWARE_PROFILES["l40s"]
    assert (l40s["compute_capability"], l40s["memory_gb"], l40s["sm_count"], l40s["max_threads_per_sm"],
            l40s["clock_ghz"], l40s["memory_clock_ghz"], l40s["memory_bus_width_bits"]) == \
        ("8.9", 44.5, 142, 1536, 2.52, 9.0, 384)
    for name, key in (("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("A100-80GB", "a100-80gb"), ("a100-80gb", "a100-80gb"),
                      ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA L40S", "l40s"),
                      ("cpu (x86_64, 2 cores)", "cpu")):
        assert hardware_profile(name) == HARDWARE_PROFILES[key], name
    for bad in ("NVIDIA A100-SXM4-40GB", "FakeGPU", "TPU v5"):
        with pytest.raises(ValueError, match=r"unknown hardware .*known: a100-80gb .*h100.*h200.*l40s"):
            hardware_profile(bad)
    h100 = HARDWARE_PROFILES["h100"]
    assert row_hardware({"hardware": "NVIDIA H100 80GB HBM3"}, A100) == h100
    assert row_hardware({"hardware": ""}, A100) == A100 and row_hardware({}, A100) == A100


def test_a_kernel_timed_on_a_cpu_is_shown_the_cpu():
    # issue 43: the paper conditions the forecast on the GPU; a CPU kernel's prompt names the CPU
    from forecast_prompt import CPU_ROWS, cpu_profile, hardware_info, hardware_profile, is_cpu
    here = hardware_info("cpu")
    assert here == cpu_profile() and is_cpu(here) and here["name"].startswith("CPU: ")
    system, user = [m["content"] for m in build_messages("cross_entropy", "ref", "cand", here)]
    assert system.startswith("You are a CPU execution simulator") and "vectorisation" in system
    table = user[user.index("Hardware:"):user.index("Candidate kernel")]
    assert [line.split("|")[1].strip() for line in table.splitlines()[3:] if line.startswith("|")] == \
        [label for _, label in CPU_ROWS]
    assert here["name"] in table and "one core" in table and "SMs" not in table
    paper = build_messages("cross_entropy", "ref", "cand", here, protocol="paper")[0]["content"]
    assert paper.startswith("You are a GPU execution simulator")  # the original's text, whatever the hardware
    gpu = build_messages("cross_entropy", "ref", "cand", hardware_profile("h100"))[0]["content"]
    assert gpu.startswith("You are a GPU execution simulator") and "warp divergence" in gpu
    row = hardware_profile("cpu (x86_64, 2 cores)")  # a row's CPU whose model was not recorded
    assert is_cpu(row) and row["vector_isa"] == "not recorded"
