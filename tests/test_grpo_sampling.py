"""Tests of grpo_sampling.py: GRPO's samples, drawn locally or on a server, and their importance weights."""
import math

import pytest
import torch
from fake_openai_server import FakeOpenAIServer
from test_lm import adapted_policy_and_long_prompt
from test_train_grpo import tiny_policy

from models import lm
from models.forecaster_backends import OpenAIServerBackend
from runtime import grpo_sampling

# ---- sampling locally: a group's rows generate from one forward of their prompt -------------------

def test_shared_prompt_forward_gives_the_same_samples():
    """Greedy, the rows of a group generating from one forward of their prompt (longer than the
    sliding window) give the completions that each row's own whole forward gives."""
    model, tok, prompt = adapted_policy_and_long_prompt()
    policy = lm.LM(model, tok)
    kw = dict(temperature=0, max_new_tokens=5, batch_size=4)
    other = tok.encode("speedup: fused")
    plain = grpo_sampling.sample_groups(policy, [prompt, other], 2, share_prompt=False, **kw)
    reused = grpo_sampling.sample_groups(policy, [prompt, other], 2, **kw)
    assert [s["completion"] for s in plain] == [s["completion"] for s in reused]


# ---- sampling on a server: its log-probs beside the sampled ids --------------------------------------

def test_sample_groups_carries_the_servers_log_probs_per_sample_only_when_asked():
    with FakeOpenAIServer() as server:
        backend = OpenAIServerBackend(server.url, backoff_s=0.01, retries=0)
        # sample_groups carries them per sample; without asking, none are asked for
        policy = lm.LM(*tiny_policy())
        got = grpo_sampling.sample_groups(policy, [[1, 2, 3]], 2, temperature=1.0, max_new_tokens=2, batch_size=None,
                                          server=backend, sampler_logprobs=True)
        assert [s["sampler_logp"] for s in got] == [[-0.5, -1.5]] * 2  # the fake's default
        plain = grpo_sampling.sample_groups(policy, [[1, 2, 3]], 2, temperature=1.0, max_new_tokens=2, batch_size=None,
                                            server=backend)
        assert [s["sampler_logp"] for s in plain] == [None, None]
    assert [r.get("logprobs") for r in server.requests] == [1, None]


# ---- truncated importance sampling of the server's samples ---------------------------------------

def test_importance_weights_are_capped_ratios_and_one_where_unknown():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.0, -1.0, 0.0, 0.0]])
    server = torch.tensor([[-1.0, -2.5, -3.0, math.nan], [-0.5, -4.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    w = grpo_sampling.importance_weights(old, server, mask, cap=2.0)
    # exp(old - server), capped at 2; 1 where the server's log-prob is unknown (NaN) or masked out
    assert w.flatten().tolist() == pytest.approx([1.0, math.exp(0.5), 2.0, 1.0, math.exp(-0.5), 2.0, 1.0, 1.0])
    assert not w.requires_grad
    old.requires_grad_(True)
    assert not grpo_sampling.importance_weights(old, server, mask, 2.0).requires_grad  # a constant of the step
    # the samples' server log-probs in lm.collate's completion columns, NaN past a sample's end or unknown
    samples = [{"completion": [5, 6, 7], "sampler_logp": [-1.0, None, -2.0]}, {"completion": [5], "sampler_logp": [-3.0]}]
    got = grpo_sampling.sampler_logprobs_batch(samples, 3, "cpu")
    assert torch.equal(got.isnan(), torch.tensor([[False, True, False], [False, True, True]]))
    assert got[0, 0] == -1.0 and got[0, 2] == -2.0 and got[1, 0] == -3.0


def test_local_sampling_merges_the_expert_lora_and_unmerges_it_after(monkeypatch):
    """Issue 22: peft applies an unmerged expert LoRA by folding W + A B into a fresh copy of the
    whole expert stack at every forward of every expert layer, decoding steps included. With the
    policy's AdapterSwitch, sampling merges the experts once (no fold during generation), the
    greedy samples are the unmerged policy's, and afterwards the base expert weights are bit for
    bit what they were and the adapter unmerged (training needs peft's path)."""
    from peft.tuners.lora.layer import ParamWrapper
    from test_lm import expert_params, lora_policy
    from tiny_models import tiny_tokenizer
    model = lora_policy()
    policy, original = lm.LM(model, tiny_tokenizer()), expert_params(model)
    folds, fold = [0], ParamWrapper._activate_lora

    def counted(self, *a, **kw):
        folds[0] += 1
        return fold(self, *a, **kw)
    monkeypatch.setattr(ParamWrapper, "_activate_lora", counted)
    prompts, kw = [[5, 6, 7, 8, 9], [10, 11, 12]], dict(temperature=0, max_new_tokens=6, batch_size=4)
    plain = grpo_sampling.sample_groups(policy, prompts, 2, **kw)
    assert folds[0] >= 6 * len(lm.AdapterSwitch(model).experts)  # every layer, every step
    folds[0] = 0
    switch = lm.AdapterSwitch(model)
    merged = grpo_sampling.sample_groups(policy, prompts, 2, switch=switch, **kw)
    assert folds[0] == 0 and len(switch.experts) == 4  # 2 layers x (gate_up, down)
    assert [s["completion"] for s in merged] == [s["completion"] for s in plain]
    assert not switch.merged and all(not w.merged_adapters for w in switch.experts)
    assert all(torch.equal(p, original[n]) for n, p in expert_params(model).items())
