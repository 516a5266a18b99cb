"""Tests of scripts/gpu_check.py, the parts that run on CPU."""
import pytest

from test_forecast_prompt import CAND, REF
from tiny_models import HARMONY_VOCAB


def test_gpu_check_forecast_cost_table_runs_on_cpu(o200k):
    """scripts/gpu_check.py's forecast-cost section, here on CPU with a one-layer tiny-width model
    (on a GPU it runs GPT-OSS-20B's width): every read-out and setting is timed, the logits read-out
    agrees with and without prefix reuse, and a row's ratio is its cost over the measurement's."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import gpu_check
    lines = []
    model = gpu_check.config_model(1, width="tiny", device="cpu")
    assert model.config.vocab_size == HARMONY_VOCAB and model.config.num_hidden_layers == 1
    rows = gpu_check.forecast_costs(lines.append, model, [CAND, CAND + "# b\n"], REF, measurement_s=2.0,
                                    device="cpu", verbalized_tokens=2)
    assert [(r["readout"], r["reuse"]) for r in rows] == [("logits", False), ("logits", True),
                                                          ("verbalized", False), ("verbalized", True)]
    for r in rows:
        assert r["total_s"] > 0 and r["ratio"] == pytest.approx(r["per_s"] / 2.0)
        assert r["tokens_out"] == (2 if r["readout"] == "verbalized" else 0) and r["tokens_in"] > 500
    diff = next(line for line in lines if line.startswith("| logits | yes"))
    assert float(diff.split("|")[-2]) < 1e-4
