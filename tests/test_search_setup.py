"""Tests of search_setup.py (plan_search): the models and servers a search uses, the LLM's GPU and memory beside the workers."""
import copy

import pytest
import tiny_models
import torch
from test_lm import lora_policy

import search
from models import lm
from runtime import cli
from search import parse_args

# ---- a local LLM beside the measure workers ------------------------------------------------------

def test_setup_makes_a_local_llm_wait_only_where_it_shares_a_measuring_gpu(tmp_path, monkeypatch):
    import torch

    import measure  # noqa: F401  (imported before the patch below: it binds require_sandbox when first imported)
    import search_setup
    from harness import measure_sandbox
    from models import forecaster_backends
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(measure_sandbox, "require_sandbox", lambda: None)
    monkeypatch.setattr(forecaster_backends, "pick_local_model", lambda name: "a-local-model")
    monkeypatch.setattr(search_setup, "hardware_info", lambda *a: {"name": "a GPU"})
    base = ["--task", "cross_entropy", "--gate", "topk", "--no-memory-check"]
    for gpus, flags, devices, waits in [
            (3, [], ["cuda:0", "cuda:1"], False),  # the LLM on the last GPU, alone
            (3, ["--llm-device", "cuda:1", "--devices", "1,2"], ["cuda:1", "cuda:2"], True),
            (3, ["--server", "http://localhost:8000/v1"], ["cuda:0", "cuda:1", "cuda:2"], False),
            (1, [], ["cuda:0"], True),  # one GPU for both
            # a server on this machine with one GPU can only be on it (issue 22); one elsewhere cannot
            (1, ["--server", "http://127.0.0.1:8000/v1"], ["cuda:0"], True),
            (1, ["--mutator-server", "http://localhost:8000/v1", "--mutator-model", "m", "--forecaster", "costmodel"],
             ["cuda:0"], True),
            (1, ["--server", "http://gpu-box.example:8000/v1"], ["cuda:0"], False)]:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        plan = search_setup.plan_search(search.parse_args(base + flags), say=lambda *a: None)
        plan.pool.close()
        assert (plan.pool.names, plan.llm_waits) == (devices, waits), flags


# ---- the GPU's memory: one GPU, two tenants (checked with made-up memory figures) ----------------

def test_memory_check_names_the_fix_when_llm_and_workers_do_not_fit(tmp_path):
    import search_setup
    gib = 2 ** 30
    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model-00001.safetensors", "wb") as f:  # a sparse 13 GiB checkpoint (GPT-OSS-20B's MXFP4 size)
        f.truncate(13 * gib)
    assert search_setup.weights_bytes(str(model)) == 13 * gib
    workers = 2 * search_setup.worker_gpu_bytes("cross_entropy")
    assert 10 * gib < workers < 60 * gib  # a reference and a candidate, each a block of B x V logits
    busy = lambda device: (60 * gib, 80 * gib)  # noqa: E731 - an 80 GB card with 20 GiB taken
    assert search_setup.gpu_memory_problem("cross_entropy", [str(model)], None, False, mem_get_info=busy) is None
    # With an adapter the experts are dequantised to bf16 (~3x): no longer fits beside the workers.
    msg = search_setup.gpu_memory_problem("cross_entropy", [str(model)], None, True, mem_get_info=busy)
    assert msg and "--llm-device cuda:N" in msg and "--server" in msg and len(msg.splitlines()) == 1
    # The LLM on another GPU: the measurement GPU holds only the workers.
    assert search_setup.gpu_memory_problem("cross_entropy", [str(model)], "cuda:1", True, mem_get_info=busy) is None
    # Measuring on cuda:0 and cuda:1 while the LLM sits on cuda:1: cuda:1 is the one that is short.
    msg = search_setup.gpu_memory_problem("cross_entropy", [str(model)], "cuda:1", True,
                                          devices=["cuda:0", "cuda:1"], mem_get_info=busy)
    assert msg and msg.startswith("cuda:1 has")
    # A vLLM server holding 90% of an H200: the workers no longer fit, and the fix is named.
    h200_served = lambda device: (14 * gib, 141 * gib)  # noqa: E731
    msg = search_setup.gpu_memory_problem("cross_entropy", [], None, False, mem_get_info=h200_served)
    assert msg and "--gpu-memory-utilization" in msg
    util = float(msg.split("--gpu-memory-utilization ")[1].split()[0])
    assert 141 * gib * (1 - util) >= workers  # what the message suggests leaves the workers room
    # The small GDN tasks fit beside the same server.
    assert search_setup.gpu_memory_problem("gdn_chunk_fwd_h", [], None, False, mem_get_info=h200_served) is None


def test_memory_check_plans_gpt_oss_as_it_will_load(tmp_path, monkeypatch):
    """Issue 22: GPT-OSS-20B's checkpoint is 13.8 GB of MXFP4 experts, but where transformers cannot
    run MXFP4 (the pinned stack: no `kernels` package in the window it wants) it loads 41.8 GB of
    bf16. The check plans what will load: beside cross_entropy's workers on a card with 60 GiB
    free, the MXFP4 model fits and the bf16 one does not."""
    from test_lm_memory import gpt_oss_20b_config

    import search_setup
    from models import lm
    gib = 2 ** 30
    model = tmp_path / "gpt-oss-20b"
    gpt_oss_20b_config(quantization_config={"quant_method": "mxfp4"}).save_pretrained(model)
    with open(model / "model-00001.safetensors", "wb") as f:
        f.truncate(13 * gib)  # the checkpoint's size on disk, sparse
    busy = lambda device: (60 * gib, 80 * gib)  # noqa: E731
    monkeypatch.setattr(lm, "mxfp4_problem", lambda: None)
    assert round(search_setup.llm_weights(str(model), False)[0] / 1e9, 1) == 13.8
    assert search_setup.llm_weights(str(model), False)[1] == "GPT-OSS's experts in MXFP4: 13.8 GB of weights"
    assert search_setup.gpu_memory_problem("cross_entropy", [str(model)], None, False, mem_get_info=busy) is None
    monkeypatch.setattr(lm, "mxfp4_problem", lambda: "no `kernels` package")
    assert round(search_setup.llm_weights(str(model), False)[0] / 1e9, 1) == 41.8
    msg = search_setup.gpu_memory_problem("cross_entropy", [str(model)], None, False, mem_get_info=busy)
    assert msg and "the local LLM needs about 47 GiB (GPT-OSS's experts dequantised from MXFP4 to bf16 (no " \
        "`kernels` package): 41.8 GB of weights instead of 13.8 GB, and a fifth more)" in msg


def test_a_local_llm_gets_a_gpu_of_its_own_when_there_are_several(monkeypatch):
    import types

    import torch

    import search_setup
    said = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    args = types.SimpleNamespace(llm_device=None, devices="all")
    devices = search_setup.place_local_llm(args, ["cuda:0", "cuda:1", "cuda:2"], said.append)
    assert args.llm_device == "cuda:2" and devices == ["cuda:0", "cuda:1"]
    # Devices named by the user are kept, and the sharing is said.
    args = types.SimpleNamespace(llm_device="cuda:0", devices="0,1")
    assert search_setup.place_local_llm(args, ["cuda:0", "cuda:1"], said.append) == ["cuda:0", "cuda:1"]
    assert "shares cuda:0" in said[-1] and "--llm-device" in said[-1]
    # One GPU: shared, and said.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = types.SimpleNamespace(llm_device=None, devices="all")
    assert search_setup.place_local_llm(args, ["cuda:0"], said.append) == ["cuda:0"]
    assert args.llm_device == "cuda:0" and "shares cuda:0" in said[-1]


# ---- one copy of the weights for the mutator and the adapted forecaster --------------------------

@pytest.fixture(scope="module")
def tiny_gpt_oss_dirs(tmp_path_factory):
    """A tiny GPT-OSS on disk (with the tests' small tokenizer) and a LoRA adapter for it,
    attention and experts, as train_grpo.py saves one."""
    folder = tmp_path_factory.mktemp("tiny_gpt_oss")
    tiny_models.tiny_gpt_oss(seed=2).save_pretrained(folder / "model")
    tiny_models.tiny_tokenizer().save_pretrained(folder / "model")
    model = lora_policy(seed=2, scale=0.2)
    model.save_pretrained(folder / "adapter", save_embedding_layers=False)
    return folder / "model", folder / "adapter"


def test_search_loads_one_model_for_the_mutator_and_the_adapted_forecaster(tiny_gpt_oss_dirs, monkeypatch):
    import search
    import search_setup
    model_dir, adapter_dir = tiny_gpt_oss_dirs
    loads = []
    real_load = lm.load_model
    monkeypatch.setattr(lm, "load_model", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    args = cli.parse(search.Args, ["--task", "cross_entropy", "--model", str(model_dir), "--adapter",
                                   str(adapter_dir), "--unsafe-no-sandbox"])
    plan = search_setup.plan_search(args, say=lambda s: None)
    mutator, forecaster = plan.mutator.backend.get(), plan.forecaster.get().backend
    assert mutator.model is forecaster.model and len(loads) == 1 and loads[0]["dequantize"]
    assert forecaster.adapter == str(adapter_dir) and mutator.adapter is None  # forecast cache keys differ
    rows = [list(range(3, 40)), list(range(10, 30))]
    digits = ["1", "2", "3", "4"]
    adapted = forecaster.next_token_probs(rows, digits)
    plain = mutator.next_token_probs(rows, digits)
    again = forecaster.next_token_probs(rows, digits)
    assert adapted == again  # switching back and forth changes nothing
    assert max(abs(a / b - 1) for ra, rb in zip(adapted, plain) for a, b in zip(ra, rb)) > 0.05
    # the mutator sees the released model; the forecaster the model with the adapter (peft's own path)
    from peft import PeftModel
    fresh, tok = real_load(str(model_dir))
    base = lm.LM(copy.deepcopy(fresh), tok).next_token_probs(rows, [tok.convert_tokens_to_ids(d) for d in digits],
                                                              batch_size=2)
    assert torch.allclose(torch.tensor(plain), torch.tensor(base), rtol=1e-5, atol=0)
    peft = lm.LM(PeftModel.from_pretrained(fresh, str(adapter_dir)), tok)
    unmerged = peft.next_token_probs(rows, peft.candidate_ids(digits), batch_size=2)
    assert torch.allclose(torch.tensor(adapted), torch.tensor(unmerged), rtol=1e-4, atol=0)


def test_the_start_up_lines_name_the_format_a_local_gpt_oss_loads_in(tmp_path, capsys):
    """Issue 39: the mutator's and the forecaster's start-up lines say which format the local
    model's experts will load in and what it costs, before anything loads; the load says it again."""
    import search
    import search_setup
    folder = tmp_path / "mxfp4"
    tiny_models.save_mxfp4_gpt_oss(folder)
    said = []
    args = cli.parse(search.Args, ["--task", "cross_entropy", "--model", str(folder), "--unsafe-no-sandbox"])
    plan = search_setup.plan_search(args, say=said.append)
    weights = "GPT-OSS's experts dequantised from MXFP4 to fp32 (no CUDA GPU): 0.8 MB of weights instead of 0.2 MB"
    assert f"mutator: LLM {folder} (local; {weights})" in said
    assert f"forecaster: {folder} (verbalized read-out) (local; {weights})" in said
    assert "MXFP4" not in capsys.readouterr().err  # nothing loaded yet
    plan.mutator.backend.get()
    assert capsys.readouterr().err.count(f"{folder}: {weights}") == 1


def test_search_with_a_server_asks_for_the_served_adapter_by_its_name():
    """vllm serve ... --lora-modules grpo-brier=FOLDER: the forecaster's requests name the adapter,
    the mutator's the base model."""
    import search
    import search_setup
    args = cli.parse(search.Args, ["--task", "cross_entropy", "--server", "http://127.0.0.1:9/v1",
                                   "--adapter", "grpo-brier", "--unsafe-no-sandbox"])
    plan = search_setup.plan_search(args, say=lambda s: None)
    assert plan.forecaster.get().backend.model == "grpo-brier"
    assert plan.mutator.backend.get().model == lm.DEFAULT_MODEL


# ---- the mutator on another server than the forecaster -------------------------------------------

def test_the_mutator_can_be_another_model_on_another_server():
    from search_setup import SetupError, plan_search
    said = []
    common = ["--task", "cross_entropy", "--gate", "topk", "--scale", "cpu", "--unsafe-no-sandbox"]
    plan = plan_search(parse_args(common + ["--server", "http://forecaster:8000/v1", "--mutator-server",
                                     "http://hosted.example/v1", "--mutator-model", "gemini-3-flash",
                                     "--protocol", "paper"]), say=said.append)
    assert plan.mutator_name == "llm:gemini-3-flash at http://hosted.example/v1"
    assert plan.forecaster_name.startswith("openai/gpt-oss-20b at http://forecaster:8000/v1")
    # built on first use (no request is sent): each backend points at its own server
    mutator_backend, forecaster = plan.mutator.backend.get(), plan.forecaster.get()
    assert mutator_backend.server == "http://hosted.example/v1" and mutator_backend.model == "gemini-3-flash"
    assert forecaster.backend.server == "http://forecaster:8000/v1"
    assert (forecaster.protocol, forecaster.parse_retries) == ("paper", 1)
    assert forecaster.hardware["name"].startswith("CPU")  # measured here, at CPU scale
    assert plan.budget == 320 and any(line.startswith("protocol: paper") for line in said)
    with pytest.raises(SetupError, match="--mutator-server"):
        plan_search(parse_args(common + ["--mutator-model", "gemini-3-flash"]), say=said.append)


# ---- the mutator of a task without an LLM: the catalog, the embedded model, or a refusal -----------

OWN_TASK = '''import torch
import torch.nn.functional as F

DESCRIPTION = "y = gelu(x @ w)"
CASES = [{"n": 8}]


def generate_input(case, seed, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(case["n"], 4, generator=g), torch.randn(4, 4, generator=g)


def reference(data):
    x, w = data
    return F.gelu(x @ w)
'''
OWN_KERNEL = '''
ROWS = 4  # tune: 2, 4, 8


def custom_kernel(data):
    x, w = data
    return torch.cat([F.gelu(x[i:i + ROWS] @ w) for i in range(0, len(x), ROWS)])
'''


def choose(path, *flags, say=None, space="triton"):
    from search_setup import LLMChoice, LazyBackend, choose_mutator
    args = parse_args(["--task", str(path), "--unsafe-no-sandbox", *flags])
    llm = LLMChoice(embedded=LazyBackend(lambda: pytest.fail("the embedded model is built on first use only")))
    return choose_mutator(args, llm, say or (lambda line: None), space)


def test_a_task_file_with_its_own_kernel_is_mutated_by_the_catalog(tmp_path):
    # the file's custom_kernel is its one hand-written variant; its `# tune:` constant is edited from
    # there; the seed (the reference) carries no mark, so no edit of it measures the seed again
    import tasks
    from mutators import tunables
    from puct import Node
    path = tmp_path / "my_op.py"
    path.write_text(OWN_TASK + OWN_KERNEL)
    said = []
    mutator, name = choose(path, say=said.append)
    assert name == "catalog" and "1 hand-written variant" in said[0] and "(ROWS)" in said[0]
    seed = tasks.seed_source(str(path))
    assert not tunables(seed) and "ROWS = 4\n" in seed and seed.rstrip().endswith("return reference(data)")
    first = mutator.propose(Node("seed", seed, 1.0), 6, {seed.strip()}, "0/0/0")
    assert [c["meta"]["edit"] for c in first] == ["variant my_op"] and first[0]["code"] == path.read_text()
    edits = mutator.propose(Node("v", first[0]["code"], 1.0), 6, {seed.strip(), first[0]["code"].strip()}, "0/1/0")
    assert sorted(c["meta"]["edit"] for c in edits) == ["ROWS 4 -> 2", "ROWS 4 -> 8"]


def test_marked_constants_of_a_task_without_a_kernel_are_edited_in_the_seed(tmp_path):
    import tasks
    path = tmp_path / "chunked.py"
    path.write_text(OWN_TASK.replace('CASES = [{"n": 8}]', 'CASES = [{"n": 8}]\nROWS = 4  # tune: 2, 4'))
    mutator, name = choose(path)
    from puct import Node
    seed = tasks.seed_source(str(path))
    assert name == "catalog" and [c["meta"]["edit"] for c in mutator.propose(Node("seed", seed, 1.0), 4, {seed.strip()},
                                                                            "k")] == ["ROWS 4 -> 2"]


def test_a_task_with_nothing_to_mutate_gets_the_embedded_model_or_one_line(tmp_path, monkeypatch, capsys):
    import search_setup
    from mutators import LLMMutator
    path = tmp_path / "plain.py"
    path.write_text(OWN_TASK)
    said = []
    mutator, name = choose(path, say=said.append)  # auto: the embedded model, and the start-up line says its worth
    assert name == "embedded" and isinstance(mutator, LLMMutator)
    assert (mutator.temperature, mutator.max_new_tokens) == (search_setup.EMBEDDED_MUTATION_TEMPERATURE,
                                                             search_setup.EMBEDDED_MUTATION_TOKENS)
    assert "almost never writes a kernel that compiles" in said[0] and "no `# tune:` constant" in said[0]
    with pytest.raises(search_setup.SetupError, match="--mutator catalog has nothing to propose for plain"):
        choose(path, "--mutator", "catalog")
    monkeypatch.setattr(search_setup, "embedded_available", lambda: False)
    with pytest.raises(search_setup.SetupError, match="nothing can mutate plain here"):
        choose(path)
    # the command: one line, exit 2, before any measurement (in the Triton space: on a CPU's own
    # space the plain kernel has its compiled form to propose, below)
    assert search.main(["--task", str(path), "--out", str(tmp_path / "run"), "--unsafe-no-sandbox",
                        "--space", "triton"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("search.py: error: nothing can mutate plain here")
    assert not (tmp_path / "run").exists()


def test_on_a_cpu_a_plain_pytorch_task_file_is_mutated_by_its_compiled_form_then_inductors_choices(tmp_path):
    # issue 43: a user's op with no kernel of its own and no `# tune:` constant gets real mutations
    # on a CPU without an LLM: its torch.compile form, then edits of inductor's choices in it
    import tasks
    from mutators import tunables
    from puct import Node
    path = tmp_path / "plain.py"
    path.write_text(OWN_TASK)
    said = []
    mutator, name = choose(path, say=said.append, space="cpu")
    assert name == "catalog" and "torch.compile form of each plain PyTorch kernel" in said[0]
    seed = tasks.seed_source(str(path))
    first = mutator.propose(Node("seed", seed, 1.0), 6, {seed.strip()}, "0/0/0")
    assert [c["meta"]["edit"] for c in first] == ["torch.compile of the parent"]
    compiled = first[0]["code"]
    assert compiled.startswith(seed.rstrip()) and "custom_kernel = _torch.compile(custom_kernel" in compiled
    assert set(tunables(compiled)) == {"COMPILE_DYNAMIC", "COMPILE_SIMDLEN", "COMPILE_MODE"}  # x @ w: a matmul
    edits = mutator.propose(Node("c", compiled, 1.0), 10, {seed.strip(), compiled.strip()}, "0/1/0")
    assert sorted(c["meta"]["edit"] for c in edits) == ["COMPILE_DYNAMIC 0 -> 1", "COMPILE_MODE 0 -> 1",
                                                         "COMPILE_SIMDLEN 0 -> 1", "COMPILE_SIMDLEN 0 -> 256",
                                                         "COMPILE_SIMDLEN 0 -> 512"]
    # the Triton space keeps the old answer: the embedded model's rewrites
    assert choose(path, space="triton")[1] == "embedded"


def test_the_start_up_says_what_the_shared_cache_holds_for_this_run(tmp_path, monkeypatch):
    # the measurement cache is shared by every checkout: the start-up line says where, how many of
    # this task's kernels at this scale it holds and whether the seed's is one (so a run that takes
    # seconds in one checkout and minutes in another is explained); the closing line how many came from it
    import hashlib
    import json

    import measure
    import search_setup
    import tasks
    folder = tmp_path / "cache" / "measurements"
    folder.mkdir(parents=True)
    monkeypatch.setattr(measure, "DEFAULT_CACHE_DIR", folder)
    seed = hashlib.sha256(tasks.seed_source("cross_entropy").encode()).hexdigest()
    for i, (task, scale, sha) in enumerate([("cross_entropy", "cpu", seed), ("cross_entropy", "cpu", "a" * 64),
                                            ("cross_entropy", "cpu", "a" * 64), ("trimul", "cpu", "b" * 64),
                                            ("cross_entropy", "benchmark", "c" * 64)]):
        (folder / f"{i}.json").write_text(json.dumps({"task": task, "scale": scale, "source_sha256": sha}))
    (folder / "torn.json").write_text("{")  # being written by another run
    said = []
    args = parse_args(["--task", "cross_entropy", "--unsafe-no-sandbox"])
    search_setup.describe_cache(args, "cpu", False, said.append)
    assert said[0].startswith(f"cache: {tmp_path / 'cache'}, shared by every checkout")
    assert "it holds 2 measured kernels of cross_entropy at cpu scale, the seed's among them" in said[0]
    search_setup.describe_cache(parse_args(["--task", "trimul", "--unsafe-no-sandbox"]), "cpu", False, said.append)
    assert "1 measured kernel of trimul at cpu scale:" in said[1] and "seed" not in said[1]
    search_setup.describe_cache(parse_args(["--task", "fp8_quant", "--no-cache"]), "cpu", False, said.append)
    assert "--no-cache: every kernel is measured and forecast anew" in said[2]
    summary = {"fast_1": None, "best_speedup": 1.02, "best_node": "seed", "best_within_noise": True,
               "best_noise": 0.07, "measurements": 10, "seed_measurements": 1, "candidates_considered": 12,
               "forecasts": 12, "skipped": 2, "forecast_rewards": 0, "from_cache": 8, "from_log": 0,
               "budget": 10, "steps": 3, "max_steps": 40}
    report = search._report(summary).splitlines()
    assert report[0].startswith("best speedup 1.020x (seed: the seed is the reference itself, and no candidate "
                                "measured faster; within the measurement's noise of 1.0, +-14.0% at two standard errors)")
    assert report[1] == "11 measurements (the seed's included): 8 from the cache (--no-cache measures them again), " \
                        "3 measured now"
    summary.update(audits=5, audit_misses=2)
    assert report[1] in search._report(summary) and "5 skipped children audited (measured outside the budget, " \
        "never learnt from): 2 faster than their parent, the gate's misses" in search._report(summary)


def test_a_search_the_embedded_model_mutates_says_one_number_of_mutations(tmp_path):
    # the embedded mutator writes 2 rewrites a parent whatever the gate: no start-up line may say 6
    import search_setup
    path = tmp_path / "plain.py"
    path.write_text(OWN_TASK)
    said = []
    args = parse_args(["--task", str(path), "--unsafe-no-sandbox"])
    budget, gated = search_setup.choose_budget(args, "embedded", "embedded SmolLM2-135M (logits read-out)", False,
                                               "cpu", said.append)
    assert gated == search_setup.EMBEDDED_MUTATIONS and not any("mutations:" in line for line in said)
    said.clear()
    search_setup.choose_budget(parse_args(["--task", "cross_entropy"]), "catalog",
                               "embedded SmolLM2-135M (logits read-out)", False, "cpu", said.append)
    assert said[0].startswith(f"mutations: {search_setup.CPU_GATED_MUTATIONS} per parent with a gate")


def test_the_expected_duration_follows_what_the_search_will_do_and_what_it_cost_here(monkeypatch):
    # the start-up's estimate: the measurements the budget buys and the parents they need, each at
    # what this machine took before (the cache's figures), else the idle VM's stretched by the load
    import search_setup
    from search_setup import Plan
    monkeypatch.setattr(search_setup, "cpu_load_factor", lambda: 1.0)
    args = search.with_protocol_defaults(parse_args(["--task", "cross_entropy", "--budget", "8"]))
    args.scale, args.mutations = "cpu", 6

    def plan(**kw):
        base = dict(scale="cpu", budget=8, mutator=None, mutator_name="catalog", forecaster=None,
                    forecaster_name="embedded SmolLM2-135M (logits read-out)", gated_mutations=6, measure_kwargs={},
                    pool=None, costs={"measure_s": [], "forecast_s": [], "converted": True})
        return Plan(**{**base, **kw})
    idle, words = search_setup.expected_duration(args, plan())
    # 8 measurements of 4 a parent: 2 parents, 12 forecasts; 9 measurements (the seed's too)
    assert idle == pytest.approx(9 * 7 + 12 * 3 + 10)
    assert "2 parents: 9 measurements at ~7 s (the idle VM's), 12 forecasts at ~3 s (the idle VM's)" in words
    here, words = search_setup.expected_duration(args, plan(costs={"measure_s": [20, 30, 40], "forecast_s": [1.0],
                                                                   "converted": False}))
    assert here == pytest.approx(9 * 30 + 12 * 1 + 10 + 60) and "the median of 3 measurements of this task" in words
    monkeypatch.setattr(search_setup, "cpu_load_factor", lambda: 2.0)
    assert search_setup.expected_duration(args, plan())[0] == pytest.approx(2 * idle)
    ungated = copy.copy(args)
    ungated.gate, ungated.mutations = "none", 4
    assert search_setup.expected_duration(ungated, plan(forecaster_name=""))[0] == pytest.approx(2 * 9 * 7)
    llm = search_setup.expected_duration(args, plan(mutator_name="llm:some-model"))
    assert llm[0] is None and "plus the LLM's mutations" in llm[1]
    on_gpu = copy.copy(args)
    on_gpu.scale = "benchmark"
    assert search_setup.expected_duration(on_gpu, plan(scale="benchmark"))[0] is None  # nothing of this GPU known


def test_the_kernel_space_is_the_cpus_own_without_a_gpu_and_the_start_up_line_says_how_to_choose():
    # issue 43: a CPU search does not spend its budget on Triton's interpreter by default; a GPU's
    # search is as it was; CPU kernels are refused where the measurements run on a GPU
    from search_setup import SetupError, choose_space
    said = []
    assert choose_space(parse_args(["--task", "cross_entropy"]), False, said.append) == "cpu"
    assert said[-1].startswith("kernel space: cpu (tasks/kernels/cross_entropy/cpu/") and "--space triton" in said[-1]
    assert choose_space(parse_args(["--task", "cross_entropy"]), True, said.append) == "triton"
    assert said[-1] == "kernel space: triton (tasks/kernels/cross_entropy/: the GPU's kernels)"
    assert choose_space(parse_args(["--task", "cross_entropy", "--space", "triton"]), False, said.append) == "triton"
    assert "Triton's interpreter runs them" in said[-1] and "--space cpu" in said[-1]
    assert choose_space(parse_args(["--task", "cross_entropy", "--space", "all"]), False, said.append) == "all"
    for space in ("cpu", "all"):
        with pytest.raises(SetupError, match=f"--space {space} searches CPU kernels"):
            choose_space(parse_args(["--task", "cross_entropy", "--space", space]), True, said.append)


def test_the_cost_model_forecasts_on_a_cpu_unless_an_llm_is_named():
    from search_setup import forecasts_with_costmodel
    cpu = lambda *flags: forecasts_with_costmodel(parse_args(["--task", "cross_entropy", *flags]), "cpu")  # noqa: E731
    assert cpu() and cpu("--forecaster", "costmodel")
    assert not cpu("--forecaster", "llm")  # the embedded SmolLM2, asked for
    for named in (["--server", "http://localhost:8000/v1"], ["--model", "m"], ["--forecaster-model", "m"],
                  ["--readout", "verbalized"], ["--abstain"]):
        assert not cpu(*named), named
    assert not forecasts_with_costmodel(parse_args(["--task", "cross_entropy"]), "benchmark")  # a GPU: as it was
