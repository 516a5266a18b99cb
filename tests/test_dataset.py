"""Tests for dataset.py: reading prediction files, ours and the paper's published format, and
training rows, turning bad input into one error that names the file, the line and the fix."""
import json
from pathlib import Path

import pytest
from test_bins import onehot

import metrics
from data.dataset import load_predictions, load_rows
from data.records import RecordError
from metrics import forecaster_name

FIX = Path(__file__).resolve().parent / "fixtures"

# ---- reading files, bad input ---------------------------------------------------------------

def test_load_both_formats():
    ours = load_predictions(FIX / "our_predictions.jsonl")
    assert len(ours) == 7 and ours[3]["parse_failed"] and ours[3]["probs"] is None
    assert ours[1]["true_bin"] == 4 and ours[1]["stated_bin"] == 5 and ours[1]["predicted_bin"] == 4
    paper = load_predictions(FIX / "paper_predictions.jsonl", FIX / "paper_eval_rows.jsonl")
    assert {forecaster_name(r) for r in paper} == {"base", "brier"}
    e3 = paper[2]
    assert (e3["task"], e3["true_bin"], e3["true_speedup"], e3["raw_sum"]) == ("trimul", 4, 1.1, 0.8)
    assert e3["predicted_bin"] == 4 and e3["stated_bin"] == 3
    stated = load_predictions(FIX / "paper_predictions.jsonl", FIX / "paper_eval_rows.jsonl",
                                      bin_rule="stated")
    assert stated[2]["predicted_bin"] == 3 and stated[7]["predicted_bin"] == 8


GOOD = {"id": "a", "task": "fp8_quant", "model": "m", "probs": onehot(4), "parse_failed": False,
        "true_speedup": 1.2}
PAPER_GOOD = {"comparison_id": "e1", "pack": "trimul", "surrogate_label": "base", "repeat": 0,
              "predicted_bin": 6, "bin_probabilities": [{"bin": b, "p": 1.0 if b == 6 else 0.0}
                                                        for b in range(1, 9)],
              "parse_failed": False}


def write_lines(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


BAD_CASES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "one JSON object"),
    ({**GOOD, "probs": None}, "no forecast: give 'probs' .* or 'bin_probabilities'"),
    ({k: v for k, v in GOOD.items() if k != "true_speedup"}, "missing field 'true_speedup'"),
    ({k: v for k, v in GOOD.items() if k != "task"}, "missing field 'task'"),
    ({**GOOD, "probs": [0.5, -0.1, 0.6, 0, 0, 0, 0, 0]}, "negative"),
    ({**GOOD, "probs": [0] * 8}, "all zeros"),
    ({**GOOD, "probs": [0.5, 0.5]}, "list of 8"),
    ({**GOOD, "probs": [0.5, "x", 0.5, 0, 0, 0, 0, 0]}, "list of 8"),
    ({**GOOD, "true_bin": 9}, "true_bin must be an integer bin"),
    ({**GOOD, "stated_bin": 0}, "stated_bin must be an integer bin"),
    ({**GOOD, "true_speedup": -2.0}, "true_speedup must be a finite number > 0"),
    ({**GOOD, "true_bin": 7}, "disagrees"),
    ({**GOOD, "parse_failed": "no"}, "parse_failed must be"),
    ({**PAPER_GOOD, "bin_probabilities": [{"bin": 9, "p": 1.0}]}, "bin_probabilities bin"),
    ({**PAPER_GOOD, "bin_probabilities": [{"bin": 6, "p": 1.0}]}, "each of bins"),
    ({**PAPER_GOOD, "predicted_bin": 12}, "predicted_bin must be an integer bin"),
    ({**PAPER_GOOD, "comparison_id": "nope"}, "not in"),
    ({k: v for k, v in PAPER_GOOD.items() if k != "comparison_id"}, "missing field 'comparison_id'"),
]


@pytest.mark.parametrize("line, message", BAD_CASES)
def test_bad_input_names_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path, [GOOD, line])
    rows = write_lines(tmp_path, [{"comparison_id": "e1", "pack": "trimul", "true_bin": 6}],
                       "rows.jsonl")
    with pytest.raises(RecordError, match=message) as err:
        load_predictions(path, rows)
    assert str(err.value).startswith(f"{path}:2: ")


def test_bad_input_other_cases(tmp_path):
    with pytest.raises(RecordError, match="with --rows"):
        load_predictions(write_lines(tmp_path, [PAPER_GOOD]))
    with pytest.raises(RecordError, match="cannot read"):
        load_predictions(tmp_path / "missing.jsonl")
    with pytest.raises(RecordError, match="no prediction rows"):
        load_predictions(write_lines(tmp_path, ["", "  "]))
    bad_rows = write_lines(tmp_path, [{"comparison_id": "e1", "pack": "trimul",
                                       "aggregated_speedup": 0}], "rows.jsonl")
    with pytest.raises(RecordError, match=rf"{bad_rows}:1: aggregated_speedup"):
        load_predictions(write_lines(tmp_path, [PAPER_GOOD]), bad_rows)


def test_paper_parse_failed_rows_count_as_failures(tmp_path):
    # garbage probabilities on a row the paper marked parse_failed: a parse failure, not an error
    failed = {**PAPER_GOOD, "parse_failed": True, "predicted_bin": 11, "parse_error": "bad",
              "bin_probabilities": [{"bin": 1, "p": -3}], "true_bin": 6}
    rows = load_predictions(write_lines(tmp_path, [failed, {**PAPER_GOOD, "true_bin": 6}]))
    assert rows[0]["parse_failed"] and rows[0]["probs"] is None and rows[0]["parse_error"] == "bad"
    rep = metrics.report(rows)
    assert rep["parse_rate"] == 0.5 and rep["accuracy"] == 1.0


# ---- training rows (dataset.load_rows) --------------------------------------------------------

def test_load_rows_recomputes_bins(tmp_path):
    rows = [dict(row_id=f"r{i}", pack=["cross_entropy", "trimul"][i % 2], anchor_code="a",
                 candidate_code="c", aggregated_speedup=s, relative_bin=b)
            for i, (s, b) in enumerate([(0.4, 1), (1.2, 5), (3.0, 7), (5.0, 8), (1.0, 4)])]
    with pytest.warns(UserWarning, match="1 row"):  # 1.2x is bin 4, not 5
        loaded = load_rows(write_lines(tmp_path, rows, "rows.jsonl"))
    assert [r["true_bin"] for r in loaded] == [1, 4, 7, 8, 4]
    bad = write_lines(tmp_path, [dict(pack="x", anchor_code="a", candidate_code="c")], "bad.jsonl")
    with pytest.raises(ValueError, match="bad.jsonl:1: missing field.*aggregated_speedup"):
        load_rows(bad)
