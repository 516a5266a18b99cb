"""Tests of mutators.py: the LLM mutator's prompt and reply, the offline catalog and its tune: edits."""
import json

import pytest

from mutators import CatalogMutator, LLMMutator, extract_code, feedback_text, mutation_messages, set_tunable, tunables
from puct import Node

# ---- the LLM mutator -----------------------------------------------------------------------------

class RecordingBackend:
    def __init__(self, replies):
        self.replies, self.seen = replies, []

    def generate(self, conversations, *, max_new_tokens, temperature, seed):
        self.seen.append(dict(conversations=conversations, temperature=temperature, seed=seed))

        class C:
            def __init__(self, text):
                self.text, self.tokens_in, self.tokens_out = text, 10, 20
        return [C(self.replies[i % len(self.replies)]) for i in range(len(conversations))]


OK_RESULT = {"status": "ok", "speedup": 1.234, "message": "", "cases": [
    {"case": {"V": 1}, "candidate_ms": 1.0, "reference_ms": 2.0, "speedup": 2.0},
    {"case": {"V": 2}, "candidate_ms": 9.0, "reference_ms": 3.0, "speedup": 0.33},
    {"case": {"V": 3}, "candidate_ms": 4.0, "reference_ms": 4.0, "speedup": 1.0}]}


def test_llm_prompt_contains_task_code_and_success_feedback_slowest_first():
    backend = RecordingBackend(["```python\nA = 1\n```"])
    parent = Node("p", "def custom_kernel(data):\n    return PARENT_MARKER\n", 1.234, info={"result": OK_RESULT})
    out = LLMMutator(backend, "TASK DESCRIPTION MARKER").propose(parent, 3, set(), "0/1/0")
    assert [c["code"] for c in out] == ["A = 1\n"] * 3
    chat = backend.seen[0]["conversations"][0]
    system, user = chat[0]["content"], chat[1]["content"]
    for rule in ("already on the GPU", "```python", "Triton", "docstring", "Several input shapes"):
        assert rule in system
    assert "TASK DESCRIPTION MARKER" in user and "PARENT_MARKER" in user
    assert "1.234x" in user and "Rewrite the whole kernel to be as fast as possible" in user
    rows = [l for l in user.splitlines() if l.startswith("| {")]
    assert [json.loads(r.split("|")[1])["V"] for r in rows] == [2, 3, 1]  # slowest (9 ms) first
    assert backend.seen[0]["temperature"] == 1.0


def test_feedback_for_each_failure_is_truncated():
    long = "E" * 5000
    for status, words in [("compile_error", "failed to compile"), ("runtime_error", "run time"),
                          ("incorrect", "incorrect output"), ("timeout", "run time")]:
        text = feedback_text({"status": status, "message": long})
        assert words in text and "E" * 2000 in text and "E" * 2001 not in text
    chat = mutation_messages("T", "code", OK_RESULT, last_failure={"status": "incorrect", "message": "max diff 3"})
    assert "previous rewrite of this kernel failed" in chat[1]["content"] and "max diff 3" in chat[1]["content"]


def test_code_is_the_last_python_block_and_no_block_is_a_failed_mutation():
    text = "plan\n```python\nfirst = 1\n```\nbetter:\n```cuda\nnope\n```\n```python\nsecond = 2\n```\nbye"
    assert extract_code(text) == "second = 2\n"
    assert extract_code("no code here") is None
    assert extract_code("```python\nunterminated = 1\n") is None
    backend = RecordingBackend(["just words", "```python\nok = 1\n```"])
    out = LLMMutator(backend, "T").propose(Node("p", "c", 1.0, info={"result": OK_RESULT}), 2, set(), "k")
    assert out[0]["code"] is None and "no ```python block" in out[0]["error"]
    assert out[1]["code"] == "ok = 1\n"


def test_goal_prompt_asks_for_the_band_not_for_speed():
    chat = mutation_messages("Task text", "def custom_kernel(data): ...", {"status": "ok", "speedup": 1.2},
                             target_bin=2)
    system, user = chat[0]["content"], chat[1]["content"]
    assert "between 0.50x and 0.71x" in system and "about 0.59x" in system and "too fast, slow it down" in system
    assert "as fast as possible" not in user and "Faster is not better" in user
    plain = mutation_messages("Task text", "def custom_kernel(data): ...", {"status": "ok", "speedup": 1.2})
    assert "as fast as possible" in plain[1]["content"] and "band" not in plain[0]["content"]


# ---- the offline catalog -------------------------------------------------------------------------

KERNEL = "import triton\nBLOCK = 64  # tune: 32, 64, 128\nNUM_WARPS = 4  # tune: 2, 4\ndef custom_kernel(d): pass\n"


def test_tunables_are_parsed_and_edited_in_place():
    assert tunables(KERNEL) == {"BLOCK": (64, [32, 64, 128]), "NUM_WARPS": (4, [2, 4])}
    edited = set_tunable(KERNEL, "BLOCK", 128)
    assert "BLOCK = 128  # tune: 32, 64, 128\n" in edited and "NUM_WARPS = 4  # tune: 2, 4" in edited
    assert tunables(edited)["BLOCK"] == (128, [32, 64, 128])


def test_catalog_mutator_is_deterministic_and_never_repeats_seen_code():
    variants = {"v1": "V1 = 1  # tune: 1, 2\n", "v2": KERNEL}
    mut = CatalogMutator(variants)
    parent = Node("p", KERNEL.replace("BLOCK = 64", "BLOCK = 32"), 1.0)
    a = mut.propose(parent, 10, set(), "0/1/0")
    assert a == mut.propose(parent, 10, set(), "0/1/0")
    codes = [c["code"] for c in a]
    # v2 happens to be one edit of the parent; it is proposed once, as a variant, first.
    assert codes[:2] in ([variants["v1"], KERNEL], [KERNEL, variants["v1"]])
    assert len(codes) == 2 + 2 == len(set(codes))  # + BLOCK 32->128 and NUM_WARPS 4->2 (32->64 is v2)
    seen = {c.strip() for c in codes[:3]}
    b = mut.propose(parent, 10, seen, "0/1/0")
    assert [c["code"] for c in b] == [codes[3]]
    assert mut.propose(parent, 10, seen | {codes[3].strip()}, "0/1/0") == []


def test_catalog_reads_the_real_task_variants():
    import tasks
    variants = tasks.variant_sources("cross_entropy")
    if not variants:
        pytest.skip("no cross_entropy variants yet")
    assert any(tunables(src) for src in variants.values())
    parent = Node("seed", tasks.seed_source("cross_entropy"), 1.0)
    out = CatalogMutator(variants).propose(parent, 16, {parent.code.strip()}, "0/0/0")
    assert {c["code"] for c in out} >= set(variants.values())


def test_on_a_cpu_the_llm_is_asked_for_cpu_code_and_told_the_cpus_model():
    from mutators import MUTATION_RULES, cpu_rules
    rules = cpu_rules({"name": "CPU: Acme Vector 9000 (x86_64)"})
    backend = RecordingBackend(["```python\nA = 1\n```"])
    parent = Node("p", "def custom_kernel(data):\n    return data\n", 1.0, info={"result": OK_RESULT})
    LLMMutator(backend, "T", rules=rules).propose(parent, 1, set(), "k")
    system = backend.seen[0]["conversations"][0][0]["content"]
    assert "one core of Acme Vector 9000 (x86_64)" in system and "load_inline" in system and "torch.compile" in system
    assert "do not use it" in system and "already on the GPU" not in system  # Triton: the interpreter's
    goal = mutation_messages("T", "code", OK_RESULT, target_bin=3, rules=rules)[0]["content"]
    assert goal.startswith("You are an expert CPU performance engineer") and "one core of Acme" in goal
    assert mutation_messages("T", "code", OK_RESULT)[0]["content"] == MUTATION_RULES  # the GPU's, as before
