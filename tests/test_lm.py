"""Tests of lm.py's GPU-facing choices, on CPU: how GPT-OSS is loaded (attention, dequantisation),
how many rows a batch takes on a GPU (the arithmetic is lm_memory.py's, in test_lm_memory.py),
completion log-probs projected a chunk at a time, one forward of a prompt serving its group's
samples, and one copy of the weights serving the base model and an adapter. What only a GPU can settle (flex attention against eager on CUDA, the memory
it saves) is in the gpu-marked tests at the end, which scripts/gpu_check.py runs first."""
import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_models  # noqa: E402
from test_lm_memory import GIB, gpt_oss_20b_config  # noqa: E402
from test_train_grpo import tiny_policy  # noqa: E402

from models import (
    lm,  # noqa: E402
    lm_memory,  # noqa: E402
    prefix_attention,  # noqa: E402
)

# ---- loading ----------------------------------------------------------------------------------

def test_gpt_oss_loads_with_flex_attention_on_a_gpu_and_dequantised_for_an_adapter():
    from transformers import GptOssForCausalLM, LlamaConfig, Mxfp4Config
    cfg = gpt_oss_20b_config(quantization_config={"quant_method": "mxfp4"})
    assert GptOssForCausalLM._supports_flex_attn and not GptOssForCausalLM._supports_sdpa
    gpu = lm.load_kwargs(cfg, on_gpu=True)
    assert gpu == {"dtype": "auto", "device_map": "auto", "attn_implementation": prefix_attention.FLEX_SINKS}
    # an adapter: the MXFP4 experts become bf16 tensors its expert matrices can attach to
    adapted = lm.load_kwargs(cfg, on_gpu=True, dequantize=True)
    assert isinstance(adapted["quantization_config"], Mxfp4Config) and adapted["quantization_config"].dequantize
    train = lm.load_kwargs(cfg, on_gpu=True, training=True, device=torch.device("cuda", 1))
    assert train["dtype"] == torch.bfloat16 and train["device_map"] == {"": torch.device("cuda", 1)}
    assert train["quantization_config"].dequantize and train["attn_implementation"] == prefix_attention.FLEX_SINKS
    assert lm.load_kwargs(cfg, on_gpu=True, device=torch.device("cuda", 1))["device_map"] == {"": torch.device("cuda", 1)}
    # CPU: transformers' default (eager: flex attention has no fused CPU kernel); a flag overrides
    assert lm.load_kwargs(cfg, on_gpu=False) == {"dtype": torch.float32}
    assert lm.load_kwargs(cfg, on_gpu=True, attention="eager")["attn_implementation"] == "eager"
    # other models keep their default (SDPA); a checkpoint without MXFP4 is never given a quantizer
    assert "attn_implementation" not in lm.load_kwargs(LlamaConfig(), on_gpu=True)
    assert "quantization_config" not in lm.load_kwargs(gpt_oss_20b_config(), on_gpu=True, dequantize=True)


def test_an_mxfp4_checkpoint_loads_on_cpu_dequantised_and_says_so_in_one_line(tmp_path, capsys):
    """GPT-OSS-20B ships its experts in MXFP4 (issue 39). A tiny checkpoint in that layout, encoded
    from known bf16 weights, loads here (no GPU: dequantised, in fp32 as everything on a CPU), and
    the loader says so in one line. Its experts are exactly what the blocks and scales encode, each
    weight the nearest value its group of 32 can hold (MXFP4's rounding); its logits are those of
    the bf16 model with its experts so rounded, and differ from the bf16 model's by about as much
    as the experts' weights do."""
    import safetensors.torch
    from transformers import AutoModelForCausalLM
    folder = tmp_path / "mxfp4"
    bf16 = tiny_models.save_mxfp4_gpt_oss(folder)
    model, _ = lm.load_model(str(folder))
    said = [line for line in capsys.readouterr().err.splitlines() if "MXFP4" in line or "dequantiz" in line]
    assert said == [f"{folder}: GPT-OSS's experts dequantised from MXFP4 to fp32 (no CUDA GPU): "
                    f"{lm._size(lm_memory.weights_bytes(model.config, mxfp4=False, dtype_bytes=4))} of weights "
                    f"instead of {lm._size(lm_memory.weights_bytes(model.config, mxfp4=True))}"]
    checkpoint = safetensors.torch.load_file(folder / "model.safetensors")
    rounded = {}
    for i, layer in enumerate(model.model.layers):
        for name in tiny_models.MXFP4_EXPERTS:
            key = f"model.layers.{i}.mlp.experts.{name}"
            got = getattr(layer.mlp.experts, name).detach()
            assert got.dtype == torch.float32 and f"{key}_blocks" in checkpoint and key not in checkpoint
            decoded = tiny_models.mxfp4_decode(checkpoint[f"{key}_blocks"], checkpoint[f"{key}_scales"])
            assert torch.equal(got, decoded.transpose(1, 2))  # the blocks' low nibble first, the scales' bias 127
            known = bf16.state_dict()[key].float()
            error = (got - known).abs()
            assert (error <= tiny_models.mxfp4_rounding(known.transpose(1, 2)).transpose(1, 2) + 1e-9).all()
            assert error.max() > 0  # the rounding was exercised
            rounded[key] = got
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    reference = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval()
    reference.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})
    with torch.no_grad():
        logits, exact = model(ids).logits, reference(ids).logits
        reference.load_state_dict(rounded, strict=False)
        rounded_logits = reference(ids).logits
    torch.testing.assert_close(logits, rounded_logits, rtol=0, atol=1e-5)
    weight_error = max(((rounded[k] - bf16.state_dict()[k].float()).norm() / bf16.state_dict()[k].float().norm()).item()
                       for k in rounded)
    assert 0 < ((logits - exact).norm() / exact.norm()).item() < 2 * weight_error


def test_mxfp4_stays_mxfp4_only_where_it_can_run_and_every_fallback_is_named(monkeypatch):
    cfg = gpt_oss_20b_config(quantization_config={"quant_method": "mxfp4"})
    monkeypatch.setattr(lm, "mxfp4_problem", lambda: None)  # a GPU with transformers' MXFP4 kernels
    assert lm.mxfp4_fallback(cfg) is None and "quantization_config" not in lm.load_kwargs(cfg, on_gpu=True)
    assert lm.weights_format(cfg) == "GPT-OSS's experts in MXFP4: 13.8 GB of weights"
    assert lm.weights_format(cfg, dequantize=True) == ("GPT-OSS's experts dequantised from MXFP4 to bf16 (the "
                                                       "adapter's expert matrices attach to dense expert tensors): "
                                                       "41.8 GB of weights instead of 13.8 GB")
    assert lm.mxfp4_fallback(cfg, training=True) == "LoRA training needs the experts as dense tensors"
    assert lm.mxfp4_fallback(cfg, on_gpu=False) == "no CUDA GPU"
    monkeypatch.setattr(lm, "mxfp4_problem", lambda: "an old GPU")
    assert lm.weights_format(cfg).startswith("GPT-OSS's experts dequantised from MXFP4 to bf16 (an old GPU): 41.8 GB")
    assert lm.mxfp4_fallback(gpt_oss_20b_config()) is None  # a bf16 checkpoint: nothing to dequantise
    assert lm.weights_format(gpt_oss_20b_config()) == "weights in bf16: 41.8 GB"


def test_use_attention_switches_a_model_in_memory():
    model = tiny_models.tiny_gpt_oss()
    assert lm.use_attention(model, "auto").config._attn_implementation == "eager"  # CPU: eager stays
    assert lm.use_attention(model, "flex_attention").config._attn_implementation == "flex_attention"


# ---- how many rows fit ------------------------------------------------------------------------

def test_rows_at_once_on_a_cpu_is_all_rows():
    policy = lm.LM(tiny_models.tiny_gpt_oss(), tiny_models.tiny_tokenizer())
    assert policy.rows_at_once([[1, 2, 3]] * 5, 10) == 5 and policy.rows_at_once([], 10) == 1


def test_rows_at_once_on_a_gpu_sizes_for_the_longest_row_and_what_follows_the_prefixes(monkeypatch):
    """The GPU branch, on CPU: the device and its free memory stood in for; a peft-wrapped model
    (an adapter) answers the same questions (config, dtype) as a plain one."""
    model = lora_policy(torch.bfloat16)
    policy = lm.LM(model, tiny_models.tiny_tokenizer())
    monkeypatch.setattr(lm.LM, "device", property(lambda self: torch.device("cuda")))
    monkeypatch.setattr(lm, "free_gpu_bytes", lambda device: 20_000_000)
    rows, prefixes = [list(range(300)), list(range(120))] * 3, [list(range(250)), list(range(100))] * 3
    cfg = model.config
    fit = lambda **kw: lm_memory.rows_that_fit(cfg, 20_000_000, prompt_tokens=300, eager_attention=True,  # noqa: E731
                                               dtype_bytes=2, most=6, **kw)
    after_prefix, whole = fit(new_tokens=64, computed_tokens=50, sliding_capped=False), fit(new_tokens=64)
    assert policy.rows_at_once(rows, 64, prefixes) == after_prefix == 6
    assert policy.rows_at_once(rows, 64) == whole == 3
    # the context (8192 tokens here) caps the new tokens
    assert policy.rows_at_once(rows, 10 ** 6) == fit(new_tokens=8192 - 300) < whole


# ---- completion log-probs, a chunk at a time --------------------------------------------------

def lora_policy(dtype=torch.float32, scale=0.05, seed=0):
    """A tiny GPT-OSS with a LoRA adapter on attention and experts whose B matrices are random
    (a fresh adapter's B is zero: the adapter would change nothing)."""
    model = tiny_models.tiny_gpt_oss(seed=seed).to(dtype)
    torch.manual_seed(seed)
    model = lm.add_lora(model, rank=4, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj"],
                        device=torch.device("cpu"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, scale)
    return model


def reference_logprobs(model, batch, temperature=1.0, allowed=None):
    """log-softmax of the whole sequence's logits, gathered: the unchunked definition."""
    ids, attn, pos, cmask, P = batch
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:-1].float() / temperature
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    return logp.masked_fill(cmask == 0, 0.0)


@pytest.mark.parametrize("votes", [False, True])
def test_chunked_logprobs_and_gradients_equal_the_whole_sequence(votes):
    model = lora_policy()
    prompt = list(range(3, 40))
    samples = [{"prompt": prompt[:30], "completion": [7, 9, 11, 4, 5, 6, 8]},
               {"prompt": prompt, "completion": [12, 5]},
               {"prompt": prompt[:34], "completion": [1, 2, 3, 4, 5]}]
    allowed = None
    if votes:  # the votes format samples from a few tokens only
        allowed = torch.zeros(512, dtype=torch.bool)
        allowed[[1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12]] = True
    batch = lm.collate(samples, 0, "cpu")
    weights = torch.tensor([[0.3], [-1.0], [2.0]])
    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for f in (lambda: reference_logprobs(model, batch, 0.7, allowed),
              lambda: lm.completion_logprobs(model, batch, 0.7, allowed, chunk=10 ** 6),
              lambda: lm.completion_logprobs(model, batch, 0.7, allowed, chunk=2)):
        logp = f()
        (logp * weights).sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in params]))
        model.zero_grad(set_to_none=True)
    (ref, ref_grads), *others = results
    assert ref.abs().sum() > 0 and any(g.abs().sum() > 0 for g in ref_grads)
    for logp, grads in others:
        assert torch.allclose(logp, ref, atol=1e-5)
        for a, b in zip(grads, ref_grads):
            assert torch.allclose(a, b, atol=1e-4 * b.abs().max(), rtol=1e-4), (a - b).abs().max()
    # and the same under no_grad (the old/reference policy passes), with a shared prompt's cache
    group = [dict(s, prompt=prompt) for s in samples]
    with torch.no_grad():
        whole = reference_logprobs(model, lm.collate(group, 0, "cpu"), 0.7, allowed)
        kv = lm.prompt_kv(model, prompt)
        for i, s in enumerate(group):
            logp = lm.completion_logprobs(model, lm.collate([s], 0, "cpu"), 0.7, allowed, prefix=kv, chunk=3)
            assert torch.allclose(logp[0], whole[i, :len(s["completion"])], atol=1e-5)


# ---- one prompt forward serving a group (lm.prompt_kv) ----------------------------------------

def adapted_policy_and_long_prompt():
    """The tiny policy with a LoRA adapter on attention whose B matrices are random, and a prompt
    longer than the tiny GPT-OSS's sliding window (32)."""
    model, tok = tiny_policy()
    torch.manual_seed(0)
    model = lm.add_lora(model, rank=4, alpha=32, targets=["q_proj", "k_proj", "v_proj", "o_proj"],
                        device=torch.device("cpu"))
    with torch.no_grad():  # a fresh adapter's B is zero, which would hide half the gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    prompt = tok.encode("speedup: " + " ".join(f"tile{i} warp{i % 7}" for i in range(12)))
    assert len(prompt) > 40
    return model, tok, prompt


def test_shared_prompt_forward_gives_the_same_logprobs_and_gradient():
    """One prompt forward serving a group (lm.prompt_kv) changes nothing but the cost: the
    same log-probs and adapter gradient as running each sample's whole sequence, with the prompt
    longer than the tiny GPT-OSS's sliding window (32) and samples one micro-batch each."""
    model, tok, prompt = adapted_policy_and_long_prompt()
    group = [{"prompt": prompt, "completion": c} for c in ([5, 9], [7, 7, 3, 300], [12, 0, 44, 8, 2])]
    weights = torch.tensor([0.5, -1.0, 2.0])
    params = [p for p in model.parameters() if p.requires_grad]

    def grads():
        out = [p.grad.clone() for p in params]
        model.zero_grad(set_to_none=True)
        return out
    whole = lm.completion_logprobs(model, lm.collate(group, 0, "cpu"))
    (whole.sum(-1) * weights).sum().backward()
    expected = grads()
    kv = lm.prompt_kv(model, prompt)
    leaves = lm.detached(kv)
    for i, s in enumerate(group):
        logp = lm.completion_logprobs(model, lm.collate([s], 0, "cpu"), prefix=leaves)
        n = len(s["completion"])
        assert torch.allclose(logp[0], whole[i, :n], atol=1e-5)
        (logp.sum() * weights[i]).backward()
    lm.backward_prompt(kv, leaves)
    shared = grads()
    assert any(g.abs().sum() > 0 for g in expected)
    for a, b in zip(expected, shared):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    # without the prompt's part of the gradient the result is wrong: the check has teeth
    assert not all(torch.allclose(a, torch.zeros_like(a), atol=1e-6) for a in expected[:4])


# ---- one copy of the weights, adapter on and off ----------------------------------------------

def expert_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "experts" in n and "lora" not in n}


def test_adapter_switch_merges_experts_and_restores_the_base_bit_for_bit(monkeypatch):
    """bf16, as on a GPU, with an adapter large enough that W + delta - delta misses W somewhere:
    the switch puts those elements back, so hundreds of switches do not drift the base model."""
    from peft.tuners.lora.layer import ParamWrapper
    base = tiny_models.tiny_gpt_oss(seed=1).to(torch.bfloat16)
    x = torch.tensor([list(range(5, 45))])
    with torch.no_grad():
        base_logits = base(input_ids=x).logits
    model = lora_policy(torch.bfloat16, scale=0.2, seed=1).eval()
    with torch.no_grad():
        unmerged_logits = model(input_ids=x).logits  # peft's own path: experts rebuilt each forward
    original = expert_params(model)
    switch = lm.AdapterSwitch(model)
    assert len(switch.experts) == 4  # gate_up and down of 2 layers
    missed = 0
    for _ in range(5):
        with switch.state(True), torch.no_grad():
            missed += sum(len(m) for m, _ in switch._missed.values())

            def rebuilt(*a, **k):
                raise AssertionError("a merged expert stack must not be rebuilt on a forward")
            with monkeypatch.context() as m:
                m.setattr(ParamWrapper, "_activate_lora", rebuilt)
                on = model(input_ids=x).logits
        with switch.state(False), torch.no_grad():
            off = model(input_ids=x).logits
        assert torch.equal(off, base_logits)  # the base model, exactly
        assert torch.allclose(on.float(), unmerged_logits.float(), atol=0.05)  # bf16 rounding of the merge
        assert (on.float() - off.float()).abs().max() > 0.1  # the adapter does change the forecast
    restored = expert_params(model)
    assert all(torch.equal(restored[n], original[n]) for n in original)
    assert missed > 0  # plain subtraction would have drifted: the fix-up had work to do


# ---- what only a GPU can settle ---------------------------------------------------------------

def tiny_pair_on_cuda(dtype=torch.float32):
    """The same tiny GPT-OSS twice on the GPU, eager and flex attention."""
    eager = tiny_models.tiny_gpt_oss(seed=3).to("cuda", dtype)
    flex = lm.use_attention(copy.deepcopy(eager), "auto")
    assert flex.config._attn_implementation == prefix_attention.FLEX_SINKS
    return eager, flex


def left_padded_rows():
    """Rows of different lengths sharing a 40-token prefix longer than the sliding window (32)."""
    prefix = list(range(5, 45))
    return [prefix + list(range(50, 50 + n)) for n in (30, 3, 17)], [prefix] * 3


@pytest.mark.gpu
def test_flex_attention_matches_eager_on_cuda_with_padding_and_prefix_reuse():
    eager, flex = tiny_pair_on_cuda()
    tok = tiny_models.tiny_tokenizer()
    rows, prefixes = left_padded_rows()
    a, b = lm.LM(eager, tok), lm.LM(flex, tok)
    for pre in (None, prefixes):
        pa = torch.tensor(a.next_token_probs(rows, [1, 2, 3, 4, 5], batch_size=3, prefixes=pre))
        pb = torch.tensor(b.next_token_probs(rows, [1, 2, 3, 4, 5], batch_size=3, prefixes=pre))
        assert (pa - pb).abs().max() < 1e-4, pre is not None
        ga = a.generate(rows, max_new_tokens=24, temperature=0, batch_size=3, prefixes=pre)
        gb = b.generate(rows, max_new_tokens=24, temperature=0, batch_size=3, prefixes=pre)
        assert [c for c, _ in ga] == [c for c, _ in gb], pre is not None
    samples = [{"prompt": r, "completion": list(range(100, 110 + i))} for i, r in enumerate(rows)]
    batch = lm.collate(samples, 0, "cuda")
    with torch.no_grad():
        assert (lm.completion_logprobs(eager, batch) - lm.completion_logprobs(flex, batch)).abs().max() < 1e-4


@pytest.mark.gpu
def test_flex_sinks_compiles_a_bounded_number_of_times_on_cuda():
    """The mix of shapes a search and a GRPO step bring (generation with left padding, with and
    without cached prefixes, a one-row forecast over a prefix, the training pass with gradients),
    three rounds of growing lengths: the first two compile what the mix needs, without reaching
    the recompile limit (which would raise), the third compiles nothing. gpu_check reports the count."""
    _, flex = tiny_pair_on_cuda(torch.bfloat16)
    policy = lm.LM(flex, tiny_models.tiny_tokenizer())
    rows, prefixes = left_padded_rows()

    def mix(k):
        longer = [r + [7] * k for r in rows]
        for pre in (None, prefixes):
            policy.generate(longer, max_new_tokens=12, temperature=1.0, batch_size=3, prefixes=pre)
        policy.next_token_probs(longer[:1], [1, 2], batch_size=1, prefixes=prefixes[:1])
        batch = lm.collate([{"prompt": r, "completion": list(range(100, 104 + k))} for r in longer], 0, "cuda")
        lm.completion_logprobs(flex.train(), batch).float().sum().backward()
        flex.eval()
    mix(0)
    mix(3)
    first = prefix_attention.flex_compiles()
    mix(5)
    assert prefix_attention.flex_compiles() == first > 0


@pytest.mark.gpu
def test_flex_attention_gradients_match_eager_on_cuda():
    eager, flex = tiny_pair_on_cuda()
    rows, _ = left_padded_rows()
    batch = lm.collate([{"prompt": r, "completion": [7, 8, 9, 10]} for r in rows], 0, "cuda")
    grads = []
    for m in (eager, flex):
        lm.completion_logprobs(m.train(), batch).sum().backward()
        grads.append(m.model.layers[0].self_attn.q_proj.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
def test_flex_attention_never_holds_the_scores_of_a_long_prompt():
    """Two layers of GPT-OSS-20B's width, 4 rows of 4,096 tokens: one eager score tensor would be
    4 x 64 x 4096^2 bf16 = 8.6 GB. Shapes vary first (as in generation), so that a recompile-limit
    fall-back to uncompiled flex attention (which materialises the scores) would show here too."""
    from transformers import GptOssForCausalLM
    cfg = tiny_models.tiny_gpt_oss_config(vocab_size=1024, max_position_embeddings=8192, num_hidden_layers=2,
                                          hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                                          num_key_value_heads=8, head_dim=64, num_local_experts=4,
                                          num_experts_per_tok=2, sliding_window=128)
    with torch.device("cuda"):
        model = lm.use_attention(GptOssForCausalLM(cfg).to(torch.bfloat16).eval())
    with torch.no_grad():
        for b, n in ((1, 300), (2, 700), (3, 1500), (1, 2100)):
            mask = torch.ones(b, n, dtype=torch.long, device="cuda")
            mask[0, :n // 3] = 0  # left padding
            model(input_ids=torch.randint(0, 1024, (b, n), device="cuda"), attention_mask=mask, logits_to_keep=1)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        mask = torch.ones(4, 4096, dtype=torch.long, device="cuda")
        mask[1, :1000] = 0
        model(input_ids=torch.randint(0, 1024, (4, 4096), device="cuda"), attention_mask=mask, logits_to_keep=1)
        peak = torch.cuda.max_memory_allocated() - before
    assert peak < 6 * GIB, f"{peak / GIB:.1f} GiB"  # activations of 16k tokens, not 8.6 GB of scores


@pytest.mark.gpu
def test_adapter_switch_is_exact_on_cuda():
    model = lora_policy(torch.bfloat16, scale=0.2, seed=4).to("cuda").eval()
    original = expert_params(model)
    switch = lm.AdapterSwitch(model)
    for _ in range(3):
        with switch.state(True):
            pass
        with switch.state(False):
            pass
    assert all(torch.equal(p, original[n]) for n, p in expert_params(model).items())


# ---- a training pass's memory on a CPU: recomputed, not kept ----------------------------------------

def test_recomputed_mlps_and_cached_attention_give_the_same_gradient_keeping_less():
    """add_lora on a CPU recomputes each MLP in the backward pass (lm.checkpoint_mlps), and a
    training forward over a shared prompt's cache recomputes its attention (prefix_attention.py)
    instead of keeping SDPA's copies of the grouped-query keys: the gradient is the same, and the
    tensors kept for the backward pass are fewer (SmolLM2's shape in small: SDPA, grouped queries,
    an MLP wider than the model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from models import prefix_attention
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    prompt = list(range(3, 203))
    group = [{"prompt": prompt, "completion": c} for c in ([5, 9, 11], [7, 7, 3])]

    def run(checkpointed):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        prefix_attention.use_prefix_attention(model)
        model = lm.add_lora(model, rank=4, alpha=8, targets=["q_proj", "k_proj", "v_proj", "o_proj"], device="cpu",
                            gradient_checkpointing=checkpointed)
        with torch.no_grad():  # a fresh adapter's B is zero, which would hide half the gradient
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
        model.train()
        kept = []

        def keep(t):
            kept.append(t.numel() * t.element_size())
            return t
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            kv = lm.prompt_kv(model, prompt)
            leaves = lm.detached(kv)
            for w, s in zip((1.0, -0.5), group):
                logp = lm.completion_logprobs(model, lm.collate([s], 0, "cpu"), prefix=leaves)
                (logp.sum() * w).backward()
        lm.backward_prompt(kv, leaves)
        return [p.grad.clone() for p in model.parameters() if p.requires_grad], sum(kept)
    plain, plain_bytes = run(False)
    recomputed, recomputed_bytes = run(True)
    assert any(g.abs().sum() > 0 for g in plain)
    for a, b in zip(plain, recomputed):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    assert recomputed_bytes < 0.7 * plain_bytes, (recomputed_bytes, plain_bytes)
