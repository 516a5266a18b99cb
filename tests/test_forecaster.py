"""Tests of forecaster.py: the Forecaster (batches, shared prefixes, cache), the CLI and
--eval (also on the paper's discovery pairs: tests/fixtures/paper_discovery_pairs.jsonl is hand-made,
real kernels of tasks/kernels, invented speedups)."""
import json
from pathlib import Path

import pytest
from test_forecast_answer import args, call
from test_forecast_prompt import A100, CAND, REF

import forecaster
import forecaster as F
import metrics
from data.dataset import load_rows
from data.records import RecordError
from forecast_prompt import build_messages, shared_messages
from models.forecaster_backends import Completion
from tasks import TASK_NAMES

FIX = Path(__file__).resolve().parent / "fixtures"


# ---- cache -----------------------------------------------------------------------------------------------

class ScriptedBackend:
    """Answers every conversation with a fixed tool call; counts calls; can fail after n calls."""
    name, adapter, reasoning_effort = "scripted", None, "medium"

    def __init__(self, fail_after=None, answer=None):
        self.calls, self.rows, self.fail_after = 0, 0, fail_after
        self.answer = answer or call(args())

    def generate(self, conversations, *, max_new_tokens, temperature, seed, tools=None, shared=None):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("backend went away")
        self.calls += 1
        self.rows += len(conversations)
        return [Completion(self.answer, 10, 5) for _ in conversations]


def test_cache_hits_do_not_touch_the_backend(tmp_path):
    backend = ScriptedBackend()
    fc = F.Forecaster(backend, cache_dir=tmp_path, hardware=A100)
    first = fc.forecast_many("cross_entropy", REF, [CAND, REF])
    assert backend.calls == 1 and backend.rows == 2 and len(list(tmp_path.glob("*.json"))) == 2
    again = fc.forecast_many("cross_entropy", REF, [REF, CAND, CAND + "#new\n"])
    assert backend.rows == 3  # only the new candidate was generated
    assert again[0].to_dict() == first[1].to_dict() and again[1].to_dict() == first[0].to_dict()
    F.Forecaster(backend, cache_dir=tmp_path, hardware=A100, seed=7).forecast_many("cross_entropy", REF, [CAND])
    assert backend.rows == 4  # another seed is another forecast
    fc.forecast_many("cross_entropy", REF, [CAND], repeat=1)
    assert backend.rows == 5
    entry = tmp_path / f"{fc.cache_key(build_messages('cross_entropy', REF, CAND, A100), 0)}.json"
    assert entry.exists()
    entry.write_text("{half")  # a damaged entry is recomputed, not fatal
    fc.forecast_many("cross_entropy", REF, [CAND, REF])
    assert backend.rows == 6
    F.Forecaster(backend, cache_dir=None, hardware=A100).forecast_many("cross_entropy", REF, [CAND])
    assert backend.rows == 7


def test_a_local_models_dtype_is_part_of_the_cache_key():
    """bf16 and fp32 forecasts of one model differ (the embedded model runs bf16 on CPUs with AMX),
    so neither may be served from the other's cache entry."""
    import torch
    messages = build_messages("cross_entropy", REF, CAND, A100)

    import types
    backend = ScriptedBackend()
    backend.model = types.SimpleNamespace(dtype=torch.float32)  # what a transformers model reports
    fp32 = F.Forecaster(backend, cache_dir=None, hardware=A100).cache_key(messages, 0)
    backend.model = types.SimpleNamespace(dtype=torch.bfloat16)
    bf16 = F.Forecaster(backend, cache_dir=None, hardware=A100).cache_key(messages, 0)
    server = F.Forecaster(ScriptedBackend(), cache_dir=None, hardware=A100).cache_key(messages, 0)
    assert len({fp32, bf16, server}) == 3


def test_errors_are_not_cached(tmp_path):
    class Down(ScriptedBackend):
        def generate(self, conversations, **kw):
            self.rows += len(conversations)
            return [Completion("", error="server error after 4 tries") for _ in conversations]
    backend = Down()
    fc = F.Forecaster(backend, cache_dir=tmp_path, hardware=A100)
    assert fc.forecast_many("cross_entropy", REF, [CAND])[0].parse_error == "server error after 4 tries"
    fc.forecast_many("cross_entropy", REF, [CAND])
    assert backend.rows == 2 and not list(tmp_path.glob("*.json"))


# ---- each task's shared prefix goes to the backend ------------------------------------------------------

def test_forecaster_hands_each_tasks_prefix_to_the_backend():
    class Recording(ScriptedBackend):
        def generate(self, conversations, *, shared=None, **kw):
            self.shared = getattr(self, "shared", []) + [(len(conversations), shared)]
            return super().generate(conversations, **kw)
    backend = Recording()
    pairs = [("cross_entropy", REF, CAND), ("fp8_quant", REF, CAND), ("cross_entropy", REF, CAND + "#2\n")]
    F.Forecaster(backend, cache_dir=None, hardware=A100).forecast_pairs(pairs)
    assert backend.shared == [(2, shared_messages("cross_entropy", REF, A100)),
                              (1, shared_messages("fp8_quant", REF, A100))]
    F.Forecaster(backend, cache_dir=None, hardware=A100, prefix_cache=False).forecast_pairs(pairs[:1])
    assert backend.shared[-1] == (1, None)


# ---- command line -----------------------------------------------------------------------------------------

def test_cli_single_forecast(tmp_path, capsys):
    cand = tmp_path / "k.py"
    cand.write_text(CAND)
    argv = ["--task", "cross_entropy", "--candidate", str(cand), "--no-cache", "--hardware", "h100"]
    assert F.main(argv, backend=ScriptedBackend()) == 0
    out = capsys.readouterr().out
    assert "5 moderate speedup" in out and "[1.41x, 2.00x)" in out and "| 0.500" in out
    assert "expected speedup" in out and "gate (>= 0.5): trust" in out
    assert F.main(argv + ["--json", "--threshold", "0.9"], backend=ScriptedBackend()) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["gate"] == "defer" and row["predicted_bin"] == 5 and row["confidence"] == pytest.approx(0.5)
    assert F.main(argv, backend=ScriptedBackend(answer="no idea")) == 1
    assert "forecast failed" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--task", "matmul", "--candidate", "k.py"], "unknown task"),
    (["--task", "cross_entropy", "--candidate", "missing.py"], "cannot read kernel file"),
    (["--task", "cross_entropy"], "give --task and --candidate"),
    (["--eval", "missing.jsonl", "--out", "p.jsonl"], "cannot read rows file"),
    (["--task", "cross_entropy", "--candidate", "k.py", "--model", "no/such-model-here"], "hf download"),
])
def test_cli_bad_input_is_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text(CAND)
    assert F.main(argv + ["--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


# ---- --eval, resumable -----------------------------------------------------------------------------------

def _rows(path, n):
    with open(path, "w") as f:
        for i in range(n):
            if i % 2:  # the paper's eval-set schema and our training-row schema, mixed
                r = dict(comparison_id=f"c{i}", pack="cross_entropy", anchor_code=REF, candidate_code=CAND + f"#{i}\n",
                         aggregated_speedup=1.7, true_bin=5, hardware="A100", source_id="s")
            else:
                r = dict(row_id=f"r{i}", pack="fp8_quant", anchor_code=REF, candidate_code=CAND + f"#{i}\n",
                         aggregated_speedup=0.6, relative_bin=2, pair_type="pair")
            f.write(json.dumps(r) + "\n")


def test_cli_eval_reports_time_and_prefix_setting(tmp_path, capsys):
    class Recording(ScriptedBackend):
        def generate(self, conversations, *, shared=None, **kw):
            self.shared = shared
            return super().generate(conversations, **kw)
    _rows(tmp_path / "rows.jsonl", 3)
    for flag, said in (([], "computed once per task"), (["--no-prefix-cache"], "recomputed for every candidate")):
        backend = Recording()
        argv = ["--eval", str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / f"p{len(flag)}.jsonl"), "--no-cache"]
        assert F.main(argv + flag, backend=backend) == 0
        err = capsys.readouterr().err
        assert "wrote 3 prediction rows" in err and said in err and "model load" in err
        assert (backend.shared is None) == bool(flag)


def test_eval_resumes_after_interruption(tmp_path):
    rows, out = tmp_path / "rows.jsonl", tmp_path / "pred.jsonl"
    _rows(rows, 7)
    # rows run task by task (c1 c3 | c5, r0 | r2 r4 ...), one backend call per task in a batch
    fc = F.Forecaster(ScriptedBackend(fail_after=3), cache_dir=None, hardware=A100)
    with pytest.raises(RuntimeError):
        F.run_eval(fc, rows, out, repeats=2, batch_size=2, progress=False)
    written = out.read_text().splitlines()
    assert len(written) == 4
    with open(out, "a") as f:
        f.write('{"id": "c5", "rep')  # killed mid-line
    backend = ScriptedBackend()
    n = F.run_eval(F.Forecaster(backend, cache_dir=None, hardware=A100), rows, out, repeats=2, batch_size=2,
                   progress=False)
    assert n == 10 and backend.rows == 10
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(p["id"], p["repeat"]) for p in preds]
    assert len(keys) == len(set(keys)) == 14
    assert set(keys) == {(i, k) for i in ["r0", "c1", "r2", "c3", "r4", "c5", "r6"] for k in (0, 1)}
    c1 = next(p for p in preds if p["id"] == "c1")
    assert (c1["task"], c1["true_bin"], c1["true_speedup"], c1["predicted_bin"]) == ("cross_entropy", 5, 1.7, 5)
    r0 = next(p for p in preds if p["id"] == "r0")
    assert (r0["task"], r0["true_bin"], r0["model"], r0["readout"]) == ("fp8_quant", 2, "scripted", "verbalized")
    assert {"probs", "parse_failed", "parse_error", "stated_bin", "raw_sum", "tokens_in", "tokens_out",
            "seconds"} <= set(r0)
    assert F.run_eval(F.Forecaster(backend, cache_dir=None, hardware=A100), rows, out, repeats=2,
                      progress=False) == 0


def test_eval_cli_and_bad_rows(tmp_path, capsys):
    rows, out = tmp_path / "rows.jsonl", tmp_path / "pred.jsonl"
    _rows(rows, 3)
    assert F.main(["--eval", str(rows), "--out", str(out), "--no-cache"], backend=ScriptedBackend()) == 0
    assert len(out.read_text().splitlines()) == 3
    rows.write_text('{"row_id": "x", "pack": "nope", "anchor_code": "", "candidate_code": ""}\n')
    assert F.main(["--eval", str(rows), "--out", str(tmp_path / "p2.jsonl"), "--no-cache"]) == 2
    assert "rows.jsonl:1:" in capsys.readouterr().err and not (tmp_path / "p2.jsonl").exists()


# ---- --eval on the paper's discovery pairs: read, forecast child against parent, score -----------

class ChildRecorder:
    """A backend that records each prompt and answers with the forecast tool's own fields: most of
    the mass on bin 6 when the child is one of the fused or chunked kernels, else on bin 3."""
    name, adapter, reasoning_effort = "scripted", None, "medium"

    def __init__(self):
        self.prompts = []

    def generate(self, conversations, *, max_new_tokens, temperature, seed, tools=None, shared=None):
        fields = [f for f in tools[0]["function"]["parameters"]["properties"] if f.startswith("p_")]
        out = []
        for conv in conversations:
            text = "\n".join(m["content"] for m in conv)
            self.prompts.append(text)
            child = text[text.rindex("Candidate kernel"):]
            top = 6 if ("fused" in child.lower() or "chunk" in child.lower()) else 3
            probs = [0.8 if b == top else 0.2 / 7 for b in range(1, 9)]
            answer = {"predicted_bin": top, **dict(zip(fields, probs)), "reasoning": "scripted"}
            out.append(Completion(json.dumps(answer), 10, 5))
        return out


def test_discovery_pairs_are_forecast_child_against_parent_and_scored(tmp_path, capsys):
    pairs = [json.loads(line) for line in (FIX / "paper_discovery_pairs.jsonl").read_text().splitlines()]
    rows = load_rows(FIX / "paper_discovery_pairs.jsonl", tasks=TASK_NAMES)
    for r, pair in zip(rows, pairs):
        assert (r["row_id"], r["pack"], r["anchor_code"], r["candidate_code"], r["aggregated_speedup"]) == \
            (pair["pair_id"], pair["problem_id"], pair["parent_code"], pair["child_code"], pair["g_speedup"])
    out = tmp_path / "preds.jsonl"
    backend = ChildRecorder()
    argv = ["--eval", str(FIX / "paper_discovery_pairs.jsonl"), "--out", str(out), "--no-cache"]
    assert forecaster.main(argv, backend=backend) == 0
    capsys.readouterr()
    assert len(backend.prompts) == len(pairs)
    for pair in pairs:  # the parent is the prompt's reference, the child its candidate
        parent, child = pair["parent_code"].splitlines()[0], pair["child_code"].splitlines()[0]
        prompt = next(p for p in backend.prompts if child in p[p.rindex("Candidate kernel"):])
        assert parent in prompt[:prompt.rindex("Candidate kernel")]
    preds = {p["id"]: p for p in map(json.loads, out.read_text().splitlines())}
    assert {k: (p["true_speedup"], p["true_bin"]) for k, p in preds.items()} == \
        {pair["pair_id"]: (pair["g_speedup"], pair["true_bin"]) for pair in pairs}
    assert metrics.main([str(out), "--discovery", "0.5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["discovery"]
    # flagged (P(>= 1.414x) = .8 + 3 * .2/7 >= .5): d1 chunked (1.9x, a discovery), d2 fused_online
    # (1.25x, not), d4 fused_projections (3.1x, a discovery); not flagged: d3 (0.8x), d5 (1.0x)
    assert (d["flagged"], d["precision"], d["recall"], d["base_rate"]) == (3, pytest.approx(2 / 3), 1.0, 0.4)


def test_kernelbench_l3_discovery_pairs_load_forecast_and_score(tmp_path, capsys):
    # the paper's other family: a KernelBench problem's pairs carry their code; the pack becomes
    # kernelbench:<problem_id>, whose prompt needs no KernelBench checkout
    pairs = [json.loads(line) for line in (FIX / "paper_discovery_pairs.jsonl").read_text().splitlines()]
    kb = [{**p, "pair_id": f"kb-{p['pair_id']}", "problem_id": "L3/T11/vgg19", "benchmark_family": "kernelbench_l3"}
          for p in pairs]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in kb + pairs[:1]))
    rows = load_rows(path, tasks=TASK_NAMES)
    assert [r["pack"] for r in rows] == ["kernelbench:L3/T11/vgg19"] * len(kb) + [pairs[0]["problem_id"]]
    out, backend = tmp_path / "p.jsonl", ChildRecorder()
    assert forecaster.main(["--eval", str(path), "--out", str(out), "--no-cache"], backend=backend) == 0
    kb_prompts = [p for p in backend.prompts if "kernelbench:L3/T11/vgg19" in p]
    assert len(kb_prompts) == len(kb) and all("KernelBench problem" in p for p in kb_prompts)
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(p["id"] for p in preds) == sorted(p["pair_id"] for p in kb + pairs[:1])
    capsys.readouterr()
    assert metrics.main([str(out), "--discovery", "0.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "kernelbench:L3/T11/vgg19" in report["tasks"] and report["discovery"]["flagged"] >= 1
    # a pack that is neither a task nor a problem is still refused, naming the choices
    path.write_text(json.dumps({**pairs[0], "problem_id": "vgg19", "benchmark_family": "other"}) + "\n")
    with pytest.raises(RecordError, match="gpu_mode"):
        load_rows(path, tasks=TASK_NAMES)


def test_a_candidate_that_cannot_run_is_forecast_with_a_warning(tmp_path, capsys):
    # a forecast of code measure.py would fail before timing it is allowed, but said so, once
    broken = tmp_path / "broken.py"
    broken.write_text("def custom_kernel(data):\n    return data[0] +\n")
    nameless = tmp_path / "nameless.py"
    nameless.write_text("def kernel(data):\n    return data[0]\n")
    good = FIX.parent.parent / "tasks" / "kernels" / "cross_entropy" / "chunked.py"
    for path, warning in ((broken, f"warning: {broken}, line 2: invalid syntax: the candidate does not compile"),
                          (nameless, f"warning: {nameless} defines neither custom_kernel(data) nor class ModelNew"),
                          (good, None)):
        argv = ["--task", "cross_entropy", "--candidate", str(path), "--no-cache", "--json"]
        assert forecaster.main(argv, backend=ChildRecorder()) == 0
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
        assert err == ([] if warning is None else [err[0]]) and (warning is None or err[0].startswith(warning)), err
