"""Tests of the learned cost model (costmodel.py, costmodel_features.py, train_costmodel.py) and of its
places in forecaster.py --costmodel, metrics.py and search.py --forecaster costmodel.

The accuracy test uses synthetic rows whose speedup is a function of the code (block size,
num_warps, an extra fused op): the trees must learn it from the source alone, on rows they never
saw, and beat the uniform forecast by a wide margin. The search runs the real command line with the
real catalog mutator and cost model; only the measurement is scripted (test_search.py's
FakeMeasurement), except in the one slow test, which measures for real.
"""
import json
import math
import random

import pytest
from test_search import FakeMeasurement

import bins
import forecaster
import metrics
import search
import train_costmodel
from data.dataset import load_predictions, load_rows
from models.costmodel import CostModel, CostModelForecaster, labelled
from models.costmodel_features import CODE_KEYS, EDIT_KEYS, code_features, edit_features, feature_names, pair_features
from tasks import seed_source

SYNTHETIC = '''"""A synthetic elementwise kernel."""
import torch
import triton
import triton.language as tl

BLOCK = {block}  # tune: 64, 128, 256, 512, 1024, 2048
NUM_WARPS = {warps}  # tune: 1, 2, 4, 8, 16


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
{body}    tl.store(y_ptr + offs, x, mask=offs < n)


def custom_kernel(data):
    x = data[0]
    y = torch.empty_like(x)
    _kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK, num_warps=NUM_WARPS)
    return y
# variant {i}
'''


def synthetic_log2_speedup(block, warps, fused):
    """The truth the trees must find: best at BLOCK 512 and 4 warps, an extra fused op worth 1.5x."""
    return -1.0 + 0.9 * (1 - abs(math.log2(block) - 9) / 3) - 0.35 * abs(math.log2(warps) - 2) + 0.6 * fused


def synthetic_rows(path, n, seed, noise=0.15, hardware="NVIDIA H100 80GB HBM3"):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            block, warps = rng.choice([64, 128, 256, 512, 1024, 2048]), rng.choice([1, 2, 4, 8, 16])
            fused = rng.random() < 0.5
            code = SYNTHETIC.format(block=block, warps=warps, i=f"{seed}-{i}",
                                    body="    x = tl.exp(x) * 2.0\n" if fused else "")
            s = 2 ** (synthetic_log2_speedup(block, warps, fused) + rng.gauss(0, noise))
            f.write(json.dumps(dict(row_id=f"s{seed}-{i}", pack="cross_entropy", anchor_code=seed_source("cross_entropy"),
                                    candidate_code=code, aggregated_speedup=s, hardware=hardware,
                                    pair_type="synthetic", source_id="test")) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model trained by the command line on 120 synthetic rows."""
    folder = tmp_path_factory.mktemp("cm")
    rows = synthetic_rows(folder / "train.jsonl", 120, seed=0)
    assert train_costmodel.main(["--data", str(rows), "--out", str(folder / "model")]) == 0
    return folder


@pytest.fixture(scope="module")
def hidden_preds(trained):
    """forecaster.py --eval --costmodel on 60 synthetic rows the model never saw (another seed)."""
    hidden = synthetic_rows(trained / "hidden.jsonl", 60, seed=1)
    preds = trained / "preds.jsonl"
    assert forecaster.main(["--eval", str(hidden), "--costmodel", str(trained / "model"), "--out", str(preds)]) == 0
    return preds


# ---- the features -------------------------------------------------------------------------------------

def test_features_read_the_code():
    f = dict(zip(CODE_KEYS, code_features(SYNTHETIC.format(block=256, warps=8, i=0, body="    x = tl.exp(x)\n"))))
    assert f["lang_triton"] == 1 and f["lang_torch"] == 0 and f["n_kernels"] == 1 and f["launch"] == 1
    assert f["tl_load"] == f["tl_store"] == f["masked_load"] == 1 and f["tl_math"] == 1 and f["tl_dot"] == 0
    assert f["n_tunables"] == 2 and f["block_max"] == 8 and f["warps_max"] == 3 and f["parses"] == 1
    gemm = '''
import triton
import triton.language as tl
@triton.autotune(configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3)], key=["M"])
@triton.jit
def k(a, b, c, M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for i in tl.range(0, M, 32, num_stages=2):
        for j in tl.static_range(4):
            acc += tl.dot(tl.load(a), tl.load(b))
    tl.store(c, tl.sum(acc, axis=0))
'''
    g = dict(zip(CODE_KEYS, code_features(gemm)))
    assert g["tl_dot"] == 1 and g["tl_reduce"] == 1 and g["autotune_config"] == 1
    assert (g["block_max"], g["block_min"], g["warps_max"], g["stages_max"]) == (7, 6, 3, math.log2(3))
    assert g["kernel_loops"] == 2 and g["kernel_loop_depth"] == 2 and g["host_loops"] == 0
    assert g["static_range"] == 1 and g["tl_range"] == 1
    torch_only = dict(zip(CODE_KEYS, code_features(seed_source("cross_entropy"))))
    assert torch_only["lang_torch"] == 1 and torch_only["torch_reduce"] >= 2 and torch_only["n_kernels"] == 0
    broken = dict(zip(CODE_KEYS, code_features("def custom_kernel(data:\n    tl.dot(a, b)\n")))
    assert broken["parses"] == 0 and broken["tl_dot"] == 1  # unparseable code still has its op counts


def test_edit_features_tell_a_tune_edit_from_a_rewrite():
    a = SYNTHETIC.format(block=256, warps=4, i=0, body="")
    edit = dict(zip(EDIT_KEYS, edit_features(a, a.replace("BLOCK = 256", "BLOCK = 1024"))))
    assert edit["edit_tune_only"] == 1 and edit["tune_changed"] == 1 and edit["tune_change_signed"] == 2
    rewrite = dict(zip(EDIT_KEYS, edit_features(seed_source("cross_entropy"), a)))
    assert rewrite["edit_language_change"] == 1 and rewrite["edit_ratio"] < 0.5 and rewrite["edit_added"] > 3
    assert edit_features(a, a)[0] == 1  # identical
    row = pair_features("trimul", a, a, {"name": "CPU (Triton interpreter)"})
    assert len(row) == len(feature_names()) and dict(zip(feature_names(), row))["task_trimul"] == 1


# ---- offline: train, forecast, score ------------------------------------------------------------------------

def test_on_hidden_rows_it_beats_the_uniform_forecast_clearly(trained, hidden_preds):
    rows = load_predictions(hidden_preds)
    assert len(rows) == 60 and all(r["probs"] is not None and r["model"].startswith("costmodel") for r in rows)
    s = metrics.scores(rows)
    uniform = metrics.scores([{**r, "probs": list(bins.UNIFORM), "predicted_bin": 1} for r in rows])
    assert s["crps"] < 0.5 * uniform["crps"] and s["brier"] < 0.7 * uniform["brier"], (s, uniform)
    assert s["accuracy"] > 0.45 and s["ece"] is not None and s["ece"] < 0.2
    # the calibration the command reported, held out: calibrated beats uncalibrated and uniform
    rep = json.loads((trained / "model" / "costmodel.json").read_text())["report"]["held_out"]
    assert rep["calibrated"]["nll"] < min(rep["uncalibrated"]["nll"], rep["uniform"]["nll"])
    assert rep["calibrated"]["crps"] < 0.5 * rep["uniform"]["crps"] and rep["calibrated"]["ece"] is not None


def test_training_prints_the_held_out_calibration_and_saves_a_model_that_loads(trained, tmp_path, capsys):
    rows = synthetic_rows(tmp_path / "rows.jsonl", 20, seed=3, hardware="cpu (x86_64, 2 cores)")
    assert train_costmodel.main(["--data", str(rows), "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "held-out calibration" in out and "calibrated" in out and "uniform" in out
    assert "their labels are CPU times on one core" in out  # these rows were measured on a CPU
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "rows.jsonl"]  # no temporary folder left
    model = CostModel.load(trained / "model")
    X, *_ = labelled(load_rows(rows), None)
    again = CostModel.load(trained / "model")
    assert (model.predict(X)[0] == again.predict(X)[0]).all()


def test_metrics_scores_an_llm_and_the_cost_model_side_by_side(trained, hidden_preds, tmp_path, capsys):
    llm = tmp_path / "llm.jsonl"
    cm = [json.loads(line) for line in hidden_preds.read_text().splitlines()]
    llm.write_text("".join(json.dumps({**r, "model": "some-llm", "readout": "logits", "probs": list(bins.UNIFORM),
                                       "predicted_bin": 1}) + "\n" for r in cm))
    assert metrics.main([str(llm), str(hidden_preds)]) == 0
    out = capsys.readouterr().out
    assert "== some-llm [logits]" in out and f"== costmodel {trained / 'model'}" in out
    table = out.split("== side by side, overall")[1].splitlines()  # and one table with a row each
    assert table[2].startswith("1. costmodel") and table[3].startswith("2. some-llm")


# ---- bad input: one line, nothing half-written ------------------------------------------------------------

def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    err = [line for line in err if not line.startswith("forecaster: ")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    for n in needles:
        assert n in err[0], err[0]


def test_rows_missing_fields_too_few_rows_and_bad_code_are_refused(tmp_path, capsys):
    out = tmp_path / "out"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"pack": "cross_entropy", "anchor_code": "x = 1"}) + "\n")
    assert train_costmodel.main(["--data", str(bad), "--out", str(out)]) == 2
    _one_line_error(capsys, "missing field", "candidate_code")
    few = synthetic_rows(tmp_path / "few.jsonl", 5, seed=0)
    assert train_costmodel.main(["--data", str(few), "--out", str(out)]) == 2
    _one_line_error(capsys, "5 row(s)", "at least 8")
    rows = [json.loads(line) for line in synthetic_rows(tmp_path / "r.jsonl", 10, seed=0).read_text().splitlines()]
    rows[3]["candidate_code"] = None  # null is missing (a Parquet row of a Hub dataset has null where a line has nothing)
    (tmp_path / "null.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train_costmodel.main(["--data", str(tmp_path / "null.jsonl"), "--out", str(out)]) == 2
    _one_line_error(capsys, "null.jsonl:4: missing field(s) candidate_code")
    rows[3]["candidate_code"] = 7
    (tmp_path / "null.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train_costmodel.main(["--data", str(tmp_path / "null.jsonl"), "--out", str(out)]) == 2
    _one_line_error(capsys, "candidate_code must be the kernel's source")
    rows[3]["candidate_code"], rows[5]["hardware"] = "x = 1", "TPU v5"
    (tmp_path / "hw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train_costmodel.main(["--data", str(tmp_path / "hw.jsonl"), "--out", str(out)]) == 2
    _one_line_error(capsys, "unknown hardware 'TPU v5'")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == \
        ["bad.jsonl", "few.jsonl", "hw.jsonl", "null.jsonl", "r.jsonl"]
    (tmp_path / "a_file").write_text("keep me")
    assert train_costmodel.main(["--data", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "a_file")]) == 2
    _one_line_error(capsys, "not a cost model folder")
    assert (tmp_path / "a_file").read_text() == "keep me"


def test_a_model_folder_from_another_feature_version_is_refused(trained, tmp_path, capsys):
    import shutil
    old = tmp_path / "old"
    shutil.copytree(trained / "model", old)
    meta = json.loads((old / "costmodel.json").read_text())
    (old / "costmodel.json").write_text(json.dumps({**meta, "feature_version": 0}))
    preds = tmp_path / "p.jsonl"
    hidden = synthetic_rows(tmp_path / "h.jsonl", 3, seed=2)
    assert forecaster.main(["--eval", str(hidden), "--costmodel", str(old), "--out", str(preds)]) == 2
    _one_line_error(capsys, "feature version 0", "retrain it: python train_costmodel.py")
    assert not preds.exists()
    assert forecaster.main(["--eval", str(hidden), "--costmodel", str(tmp_path), "--out", str(preds)]) == 2
    _one_line_error(capsys, "is not a cost model folder")
    assert forecaster.main(["--eval", str(hidden), "--costmodel", str(trained / "model"), "--server",
                            "http://x/v1", "--out", str(preds)]) == 2
    _one_line_error(capsys, "--server", "--costmodel replaces")
    assert not preds.exists()


# ---- online: the search's own measurements ---------------------------------------------------------------

def test_the_online_model_defers_until_it_has_enough_labels_then_refits_only_on_new_ones(tmp_path):
    rows = load_rows(synthetic_rows(tmp_path / "r.jsonl", 12, seed=0, hardware="FakeGPU"))  # any device name
    fc = CostModelForecaster(hardware={"name": "CPU"}, online=True, min_labels=4)
    fc.learn(rows[:3])
    first = fc.forecast_many("cross_entropy", rows[0]["anchor_code"], [rows[-1]["candidate_code"]])[0]
    assert first.deferred and first.probs is None and "3 measured kernel(s), it gates from 4" in first.reasoning
    fc.learn(rows[:8])
    f = fc.forecast_many("cross_entropy", rows[0]["anchor_code"], [rows[-1]["candidate_code"]])[0]
    assert not f.deferred and len(f.probs) == 8 and abs(sum(f.probs) - 1) < 1e-9 and fc.refits == 1
    assert "fit on 8 measured kernels" in f.reasoning
    fc.forecast_many("cross_entropy", rows[0]["anchor_code"], [rows[-2]["candidate_code"]])
    assert fc.refits == 1  # no new labels: no refit
    fc.learn(rows[:9])
    fc.forecast_many("cross_entropy", rows[0]["anchor_code"], [rows[-2]["candidate_code"]])
    assert fc.refits == 2


def test_the_online_model_with_earlier_rows_forecasts_from_the_first_child_and_adds_the_searchs(tmp_path):
    """--costmodel-rows: the rows measured before are fit on before the first forecast (nothing is
    deferred), and the search's own rows join them at each refit."""
    rows = load_rows(synthetic_rows(tmp_path / "r.jsonl", 12, seed=0, hardware="cpu (x86_64, 2 cores)"))
    fc = CostModelForecaster(hardware={"name": "CPU"}, online=True, min_labels=4, prior=rows[:8])
    f = fc.forecast_many("cross_entropy", rows[0]["anchor_code"], [rows[-1]["candidate_code"]])[0]
    assert not f.deferred and len(f.probs) == 8 and fc.refits == 1
    assert "fit on 0 measured kernels and 8 earlier rows" in f.reasoning
    fc.learn(rows[8:10])
    f = fc.forecast_many("cross_entropy", rows[0]["anchor_code"], [rows[-1]["candidate_code"]])[0]
    assert fc.refits == 2 and "fit on 2 measured kernels and 8 earlier rows" in f.reasoning
    cold = CostModelForecaster(hardware={"name": "CPU"}, online=True, min_labels=4, prior=rows[:2])
    assert cold.forecast_many("cross_entropy", rows[0]["anchor_code"], [rows[-1]["candidate_code"]])[0].deferred


def test_search_refuses_costmodel_rows_without_the_cost_model(tmp_path, capsys):
    rows = synthetic_rows(tmp_path / "r.jsonl", 4, seed=0, hardware="cpu (x86_64, 2 cores)")
    for flags in (["--forecaster", "llm"], ["--gate", "none"]):
        assert search.main(["--task", "cross_entropy", "--costmodel-rows", str(rows), "--out", str(tmp_path / "x"),
                            "--no-progress", *flags]) == 2
        _one_line_error(capsys, "--costmodel-rows")
    assert search.main(["--task", "cross_entropy", "--costmodel-rows", str(tmp_path / "missing.jsonl"),
                        "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    _one_line_error(capsys, "--costmodel-rows", "missing.jsonl")
    odd = synthetic_rows(tmp_path / "odd.jsonl", 4, seed=0, hardware="FakeGPU")  # no profile: refused at start-up
    assert search.main(["--task", "cross_entropy", "--costmodel-rows", str(odd), "--out", str(tmp_path / "x"),
                        "--no-progress"]) == 2
    _one_line_error(capsys, "--costmodel-rows", "unknown hardware 'FakeGPU'")
    assert not (tmp_path / "x").exists()


def _scripted_measure(task, src, **kw):
    """Speedup from the code: Triton kernels 1.5x, larger BLOCK_V faster (0.4 octave per doubling)."""
    from mutators import tunables
    s = 1.5 if "@triton.jit" in src else 1.0
    for name, (v, _) in tunables(src).items():
        if name == "BLOCK_V":
            s *= 2 ** (0.4 * (math.log2(v) - 10))
    return FakeMeasurement("ok", s)


def test_search_with_the_cost_model_refits_online_and_resumes_without_refitting(tmp_path, capsys, monkeypatch):
    from models import costmodel
    monkeypatch.setattr("measure.measure", _scripted_measure)
    out = tmp_path / "cm"
    argv = ["--task", "cross_entropy", "--forecaster", "costmodel", "--costmodel-min-labels", "3", "--budget", "16",
            "--scale", "cpu", "--out", str(out), "--no-progress"]
    assert search.main(argv) == 0
    printed = capsys.readouterr().out
    assert "forecaster: learned cost model" in printed and "until it has 3 of them" in printed
    assert "CPU times on one core, not GPU times" in printed and "mutations: 16 per parent" in printed
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    forecasts = [e for e in events if e["kind"] == "forecast"]
    assert all(v["deferred"] and v["probs"] is None for v in forecasts[0]["payload"]["forecasts"])
    fitted = [v["record"]["reasoning"] for e in forecasts[1:] for v in e["payload"]["forecasts"]]
    assert fitted and all("cost model (fit on" in r for r in fitted)
    sizes = {int(r.split("fit on ")[1].split()[0]) for r in fitted}
    assert len(sizes) >= 2  # refit as labels arrived
    summary = json.loads((out / "summary.json").read_text())
    assert summary["measurements"] == 16 and summary["forecaster"].startswith("costmodel (online")
    assert summary["forecasts"] == summary["candidates_considered"] > 16

    log = (out / "events.jsonl").read_text()
    monkeypatch.setattr("measure.measure", lambda *a, **kw: pytest.fail("measured on a resume"))
    monkeypatch.setattr(costmodel.CostModel, "train", lambda *a, **kw: pytest.fail("refit on a resume"))
    assert search.main(argv) == 0
    assert "resuming from" in capsys.readouterr().out
    assert (out / "events.jsonl").read_text() == log


def test_search_refuses_llm_options_with_the_cost_model(tmp_path, capsys):
    rc = search.main(["--task", "cross_entropy", "--forecaster", "costmodel", "--abstain", "--out",
                      str(tmp_path / "x"), "--no-progress"])
    assert rc == 2
    _one_line_error(capsys, "--abstain", "--forecaster costmodel")
    assert search.main(["--task", "cross_entropy", "--costmodel-min-labels", "1"]) == 2
    _one_line_error(capsys, "--costmodel-min-labels")


TORCH_CHUNKED = '''"""Cross-entropy in plain PyTorch, CHUNK rows at a time."""
import torch

CHUNK = 4  # tune: 1, 2, 4, 8


def custom_kernel(data):
    logits, targets, grad_output = data
    losses, grads = [], []
    for rows in range(0, logits.shape[0], CHUNK):
        x = logits[rows:rows + CHUNK].float()
        t = targets[rows:rows + CHUNK]
        lse = torch.logsumexp(x, dim=-1)
        losses.append(lse - x.gather(1, t[:, None]).squeeze(1))
        p = torch.softmax(x, dim=-1)
        p.scatter_add_(1, t[:, None], torch.full_like(t[:, None], -1, dtype=p.dtype))
        grads.append((p * grad_output[rows:rows + CHUNK, None]).to(torch.bfloat16))
    return torch.cat(losses), torch.cat(grads)
'''


@pytest.mark.e2e
def test_search_with_the_cost_model_end_to_end_with_real_measurements(tmp_path, capsys, monkeypatch):
    pytest.importorskip("measure")
    import tasks
    catalog = tasks.variant_sources
    # plain-PyTorch kernels only (interpreted Triton would add ~10 s a kernel and test nothing more)
    monkeypatch.setattr(tasks, "variant_sources", lambda name, space="triton": {"torch_inplace": catalog(name)["torch_inplace"],
                                                                "torch_chunked": TORCH_CHUNKED})
    import measure
    # Real measurements, timed as briefly as --quick times them: nothing here reads how precise a
    # speedup is (a full CPU timing costs ~3 s of CPU a measurement, both sides)
    monkeypatch.setitem(measure.REPS, ("cpu", False), measure.REPS[("cpu", True)])
    out = tmp_path / "cm"
    argv = ["--task", "cross_entropy", "--forecaster", "costmodel", "--costmodel-min-labels", "2", "--budget", "2", "--space", "triton",
            "--measure-per-parent", "1", "--scale", "cpu", "--out", str(out), "--no-progress"]
    assert search.main(argv) == 0, capsys.readouterr().err
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    forecasts = [v for e in events if e["kind"] == "forecast" for v in e["payload"]["forecasts"]]
    # the first child's forecast defers (one label: the seed's), the second's comes from trees fit on two
    assert forecasts[0]["deferred"] and forecasts[-1]["probs"] is not None
    assert "fit on 2 measured kernels" in forecasts[-1]["record"]["reasoning"]
    rows = [json.loads(line) for line in (out / "training_rows.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["measurements"] == 2 and len(rows) == 1 + 2 - summary["failed_measurements"]
    assert all(r["aggregated_speedup"] > 0 for r in rows)
