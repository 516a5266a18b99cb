"""dataset.py: the rows a forecaster reads and writes, as they lie on disk (docs/PAPER.md §10).

A forecast is written as one prediction row: which candidate (id, task), which forecaster (model,
readout), which repeat, the 8 probabilities (or a parse failure and its error), the bin the model
stated, and the truth (true_bin, and true_speedup when the speedup was measured). forecaster.py's
--eval and train_grpo.py's evaluation write such rows; metrics.py scores them. The paper publishes
its predictions in another format (`bin_probabilities` as a list of {bin, p}, `parse_failed`,
joined with the eval-set rows on `comparison_id`); load_predictions reads both, detecting the
format per line, into one normalised row, and turns bad input into a RowError that names the
file, the line and the fix.

Which bin is scored: the argmax of the probabilities (lowest bin on ties), as in the forecaster's
contract. The paper's data also carries the model's *stated* bin, which can differ;
`load_predictions(..., bin_rule="stated")` scores the stated bin instead (the paper's tables use
it; ECE and max-prob confidence then use p[stated bin]). Either way metrics.py reports the
disagreement rate between stated bin and argmax.
"""
import json
import math
from pathlib import Path

from bins import BINS, N_BINS, predicted_bin, speedup_to_bin

# ---- reading prediction files ----------------------------------------------------------------
# One normalised row per forecast, whichever format it came from:
#   id, task, model, readout, repeat, probs (8 floats summing to 1, or None on a parse failure),
#   parse_failed, parse_error, stated_bin, predicted_bin (the bin scored), raw_sum, true_bin,
#   true_speedup (None when only the bin is known), where ("file:line").

class RowError(ValueError):
    """A row file cannot be used; the message names the file, the line and the fix."""


def _fail(where, problem):
    raise RowError(f"{where}: {problem}")


def _read_jsonl(path):
    """[(line_number, object)] for every non-blank line of a JSON Lines file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RowError(f"{path}: cannot read the file ({e}); check the path") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            _fail(f"{path}:{i}", f"not valid JSON ({e.msg}); fix or delete this line")
        if not isinstance(obj, dict):
            _fail(f"{path}:{i}", "expected one JSON object per line")
        out.append((i, obj))
    return out


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bin_field(value, where, field):
    if not _is_number(value) or value != int(value) or not 1 <= value <= N_BINS:
        _fail(where, f"{field} must be an integer bin in 1..{N_BINS}, got {value!r}")
    return int(value)


def _probs_field(values, where, field):
    """(probs summing to 1, raw sum) from a list of 8 numbers; RowError if unusable."""
    if not isinstance(values, list) or len(values) != N_BINS or not all(map(_is_number, values)):
        _fail(where, f"{field} must be a list of {N_BINS} finite numbers, got {values!r}")
    if any(v < 0 for v in values):
        _fail(where, f"{field} has a negative probability: {values}")
    raw = float(sum(values))
    if not math.isfinite(raw):
        _fail(where, f"{field} sums to infinity: {values}")
    if raw <= 0:
        _fail(where, f"{field} is all zeros; a parser must mark such an answer parse_failed")
    return [v / raw for v in values], raw


def _paper_probs(items, where):
    """The paper's bin_probabilities, a list of {bin, p}, as 8 numbers in bin order."""
    if not isinstance(items, list) or not all(isinstance(d, dict) and "bin" in d and "p" in d
                                              for d in items):
        _fail(where, "bin_probabilities must be a list of {\"bin\": 1..8, \"p\": number}")
    by_bin = {}
    for d in items:
        b = _bin_field(d["bin"], where, "bin_probabilities bin")
        if b in by_bin:
            _fail(where, f"bin_probabilities lists bin {b} twice")
        by_bin[b] = d["p"]
    if sorted(by_bin) != list(BINS):
        _fail(where, f"bin_probabilities must give each of bins 1..{N_BINS}, got {sorted(by_bin)}")
    return _probs_field([by_bin[b] for b in BINS], where, "bin_probabilities")


def _truth(obj, where, speedup_key, bin_key, fix):
    """(true_bin, true_speedup) from a row holding either or both."""
    s, b = obj.get(speedup_key), obj.get(bin_key)
    if s is None and b is None:
        _fail(where, f"missing field {speedup_key!r} or {bin_key!r}; {fix}")
    if s is not None:
        if not _is_number(s) or s <= 0:
            _fail(where, f"{speedup_key} must be a finite number > 0, got {s!r}")
        s = float(s)
    if b is not None:
        b = _bin_field(b, where, bin_key)
        if s is not None and speedup_to_bin(s) != b:
            _fail(where, f"{bin_key} {b} disagrees with {speedup_key} {s} (bin {speedup_to_bin(s)})")
    return (b if b is not None else speedup_to_bin(s)), s


def _row(where, *, rid, task, model, readout, repeat, probs, raw_sum, failed, error, stated,
         truth, bin_rule):
    if not isinstance(task, str) or not task:
        _fail(where, "missing field 'task' (or 'pack'): the task this forecast is for")
    if repeat is not None and (not _is_number(repeat) or repeat != int(repeat)):
        _fail(where, f"repeat must be an integer or null, got {repeat!r}")
    if failed:
        probs = raw_sum = predicted = None
    else:
        predicted = predicted_bin(probs)
        if bin_rule == "stated" and stated is not None:
            predicted = stated
    return {"id": rid, "task": task, "model": str(model), "readout": readout,
            "repeat": None if repeat is None else int(repeat), "probs": probs,
            "parse_failed": bool(failed), "parse_error": error if failed else None,
            "stated_bin": stated, "predicted_bin": predicted,
            "raw_sum": None if raw_sum is None else float(raw_sum),
            "true_bin": truth[0], "true_speedup": truth[1], "where": where}


def _failed_flag(obj, where):
    failed = obj.get("parse_failed", False)
    if not isinstance(failed, bool):
        _fail(where, f"parse_failed must be true or false, got {failed!r}")
    return failed


def _our_row(obj, where, bin_rule):
    failed = _failed_flag(obj, where)
    probs = raw = stated = None
    if not failed:
        if obj.get("probs") is None:
            _fail(where, "missing field 'probs' (8 probabilities); set parse_failed: true if the "
                         "answer could not be parsed")
        probs, raw = _probs_field(obj["probs"], where, "probs")
        if _is_number(obj.get("raw_sum")):
            raw = obj["raw_sum"]  # the parser's sum before it renormalised
        if obj.get("stated_bin") is not None:
            stated = _bin_field(obj["stated_bin"], where, "stated_bin")
    truth = _truth(obj, where, "true_speedup", "true_bin", "our prediction rows carry the label")
    return _row(where, rid=obj.get("id", where), task=obj.get("task"),
                model=obj.get("model", "unknown"), readout=obj.get("readout"),
                repeat=obj.get("repeat"), probs=probs, raw_sum=raw, failed=failed,
                error=obj.get("parse_error"), stated=stated, truth=truth, bin_rule=bin_rule)


def _paper_row(obj, where, eval_rows, rows_path, bin_rule):
    cid = obj.get("comparison_id")
    if cid is None:
        _fail(where, "missing field 'comparison_id' (paper-format prediction row)")
    failed = _failed_flag(obj, where)
    probs = raw = stated = None
    if not failed:  # a row the paper marked parse_failed is a failure whatever else it holds
        if obj.get("bin_probabilities") is None:
            _fail(where, "missing field 'bin_probabilities'; or mark the row parse_failed: true")
        probs, raw = _paper_probs(obj["bin_probabilities"], where)
        if _is_number(obj.get("raw_probability_sum")):
            raw = obj["raw_probability_sum"]
        if obj.get("predicted_bin") is not None:
            stated = _bin_field(obj["predicted_bin"], where, "predicted_bin")
    task = obj.get("pack")
    if obj.get("true_bin") is not None or obj.get("aggregated_speedup") is not None:
        truth = _truth(obj, where, "aggregated_speedup", "true_bin", "")
    elif eval_rows is None:
        _fail(where, "paper-format row without true_bin; pass the eval-set rows with --rows")
    elif cid not in eval_rows:
        _fail(where, f"comparison_id {cid!r} is not in {rows_path}; pass the matching eval set")
    else:
        ev_where, ev = eval_rows[cid]
        truth = _truth(ev, ev_where, "aggregated_speedup", "true_bin", "eval rows carry the label")
        task = task or ev.get("pack")
    return _row(where, rid=cid, task=task, model=obj.get("surrogate_label", "unknown"),
                readout=None, repeat=obj.get("repeat"), probs=probs, raw_sum=raw, failed=failed,
                error=obj.get("parse_error"), stated=stated, truth=truth, bin_rule=bin_rule)


def load_predictions(path, rows_path=None, bin_rule="argmax"):
    """Read a predictions file (ours or the paper's format, detected per line) into normalised rows.

    rows_path: the paper's eval-set rows, joined on comparison_id for true_bin, aggregated_speedup
    and pack. bin_rule: "argmax" (default) or "stated" (see the module docstring). Raises
    RowError naming the file and line for anything that cannot be scored.
    """
    if bin_rule not in ("argmax", "stated"):
        raise ValueError(f"bin_rule must be 'argmax' or 'stated', got {bin_rule!r}")
    eval_rows = None
    if rows_path is not None:
        eval_rows = {}
        for i, obj in _read_jsonl(rows_path):
            if obj.get("comparison_id") is None:
                _fail(f"{rows_path}:{i}", "missing field 'comparison_id' (eval-set row)")
            if obj["comparison_id"] in eval_rows:
                _fail(f"{rows_path}:{i}", f"comparison_id {obj['comparison_id']!r} appears twice")
            eval_rows[obj["comparison_id"]] = (f"{rows_path}:{i}", obj)
    rows = []
    for i, obj in _read_jsonl(path):
        where = f"{path}:{i}"
        if any(k in obj for k in ("comparison_id", "bin_probabilities", "surrogate_label")):
            rows.append(_paper_row(obj, where, eval_rows, rows_path, bin_rule))
        else:
            rows.append(_our_row(obj, where, bin_rule))
    if not rows:
        _fail(path, "holds no prediction rows")
    return rows
