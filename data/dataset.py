"""dataset.py: the rows a forecaster learns from, is judged on and writes (docs/PAPER.md §10).

Three kinds of row, each one JSON object per line of a JSON Lines file (records.py writes and
reads the files; this module says what a row holds):

- Training row (the paper's RL-pool schema): row_id, pack (the task), anchor_code (the reference
  the forecast compares against), candidate_code, aggregated_speedup (measured), relative_bin,
  hardware, pair_type, source_id. A search writes one per successful measurement (training_row);
  train_grpo.py trains on them. The paper's eval-set rows (comparison_id, pack, anchor_code,
  candidate_code, aggregated_speedup, true_bin, ...) read the same way, and so do its discovery
  pairs (pair_id, problem_id, benchmark_family, parent_code, child_code, g_speedup, true_bin, ...):
  the parent is the anchor, the child the candidate, g_speedup the child's speedup over the
  parent. load_rows reads all three and recomputes every row's true bin from its speedup: bins.py
  is the one bin definition, and a stated bin that disagrees is overruled with a warning.
- Prediction row: one forecast of one row: id, task, model, readout, repeat, probs (8 floats, or
  null on a parse failure or a deferral), parse_failed, parse_error, deferred (the model declined
  to forecast: the abstain variant), stated_bin, predicted_bin, raw_sum, true_speedup, true_bin,
  tokens_in, tokens_out, seconds, attempts, reasoning. forecaster.py's --eval and
  train_grpo.py's evaluation write them (prediction_row); metrics.py scores them.
- The paper's published predictions, another format (`bin_probabilities` as a list of {bin, p},
  `parse_failed`, joined with the eval-set rows on `comparison_id`). load_predictions reads ours
  and the paper's, detecting the format per line, into one normalised row.
Bad input raises records.RecordError naming the file, the line and the fix.

Where the rows come from: a JSON Lines file, or a dataset on the Hugging Face Hub named
`hf:OWNER/NAME[/CONFIG][:SPLIT]` (the paper's published datasets: hub.py reads them through the
Hub's client and cache). read_source is the one place that tells the two apart; every loader
below reads through it, so a Hub row is checked as a file's line is, and an error names
`hf:OWNER/NAME/CONFIG:SPLIT row N` where a file's names `path:line`.

Which bin is scored: the argmax of the probabilities (lowest bin on ties), as in the forecaster's
contract. The paper's data also carries the model's *stated* bin, which can differ;
`load_predictions(..., bin_rule="stated")` scores the stated bin instead (the paper's tables use
it; ECE and max-prob confidence then use p[stated bin]). Either way metrics.py reports the
disagreement rate between stated bin and argmax.
"""
import math
import warnings
from pathlib import Path

from bins import BINS, N_BINS, predicted_bin, speedup_to_bin
from data import hub
from data.records import RecordError, read_jsonl


def _fail(where, problem):
    raise RecordError(f"{where}: {problem}")


def read_source(source):
    """[(row number, where, row)] of a JSON Lines file (where: `path:line`) or of a Hub dataset
    named hf:OWNER/NAME[/CONFIG][:SPLIT] (where: `hf:OWNER/NAME/CONFIG:SPLIT row N`)."""
    if hub.is_hub_name(source):
        name, rows = hub.read_rows(source)
        return [(n, f"{name} row {n}", row) for n, row in rows]
    return [(n, f"{source}:{n}", row) for n, row in read_jsonl(source)]


def source_exists(source):
    """Whether a command-line input can be read: a Hub name (checked when read) or an existing file."""
    return hub.is_hub_name(source) or Path(source).is_file()


# ---- training rows and eval rows ----------------------------------------------------------------

REQUIRED_FIELDS = ("pack", "anchor_code", "candidate_code", "aggregated_speedup")


def training_row(task, run, node_id, anchor_code, code, measurement, pair_type):
    """One measured kernel of a search as a training row. The anchor is the task's seed, the
    reference the forecaster compares against."""
    s = measurement["speedup"]
    return {"row_id": f"{run}/{node_id}", "pack": task, "anchor_code": anchor_code,
            "candidate_code": code, "aggregated_speedup": s, "relative_bin": speedup_to_bin(s),
            "hardware": measurement.get("device", ""), "pair_type": pair_type,
            "source_id": f"search:{run}:{node_id}"}


DISCOVERY_FIELDS = {"pair_id": "row_id", "problem_id": "pack", "parent_code": "anchor_code",
                    "child_code": "candidate_code", "g_speedup": "aggregated_speedup"}


KERNELBENCH_FAMILY = "kernelbench_l3"  # the paper's other family of discovery pairs


def discovery_row(pair):
    """A discovery pair (the paper's schema) as a row: the child forecast against its parent. A
    pair of the kernelbench_l3 family names a KernelBench problem (its code is in the row): its
    pack becomes `kernelbench:<problem_id>`, a task the forecaster's prompt knows without a
    KernelBench checkout."""
    row = {**pair, **{ours: pair[theirs] for theirs, ours in DISCOVERY_FIELDS.items() if theirs in pair}}
    if pair.get("benchmark_family") == KERNELBENCH_FAMILY and isinstance(row.get("pack"), str) \
            and not row["pack"].startswith("kernelbench:"):
        row["pack"] = "kernelbench:" + row["pack"]
    return row


def _known_pack(pack, tasks):
    """A built-in task, a KernelBench problem, or a problem file a search ran on."""
    return pack in tasks or (isinstance(pack, str) and (pack.startswith("kernelbench:") or pack.endswith(".py")))


def load_rows(path, tasks=None):
    """Training, eval or discovery-pair rows, from a JSON Lines file or a Hub dataset (read_source),
    with `true_bin` recomputed from aggregated_speedup and `row_id` set (row_id, else comparison_id
    or pair_id, else the line number). tasks: the packs allowed (None: any).

    A stated relative_bin (or true_bin) that disagrees with the speedup is overruled, with one
    warning for the file. Raises RecordError naming the line for anything unusable.
    """
    rows, disagree = [], 0
    for n, where, row in read_source(path):
        if "parent_code" in row or "child_code" in row:
            row = discovery_row(row)
            if tasks is not None and not _known_pack(row.get("pack"), tasks):
                _fail(where, f"discovery pair of problem {row.get('problem_id')!r} (family "
                             f"{row.get('benchmark_family')!r}), which is not a task here; keep the "
                             f"gpu_mode family's pairs of {', '.join(tasks)} and the {KERNELBENCH_FAMILY} family's")
        missing = [k for k in REQUIRED_FIELDS if row.get(k) is None]  # a Parquet row has null where a line has nothing
        if missing:
            _fail(where, f"missing field(s) {', '.join(missing)}; a training row needs "
                         f"{', '.join(REQUIRED_FIELDS)}")
        if tasks is not None and not _known_pack(row["pack"], tasks):
            _fail(where, f"pack {row['pack']!r} is not a task; use one of {', '.join(tasks)}, "
                         f"kernelbench:NAME or a problem file's path")
        stated = row.get("relative_bin", row.get("true_bin"))  # RL pool / eval-set schema
        try:
            row["true_bin"] = speedup_to_bin(row["aggregated_speedup"])
        except (TypeError, ValueError) as e:
            _fail(where, f"aggregated_speedup: {e}")
        if stated is not None and stated != row["true_bin"]:
            disagree += 1
        fallback = f"row{n}" if hub.is_hub_name(path) else f"line{n}"
        row["row_id"] = str(row.get("row_id", row.get("comparison_id", fallback)))
        rows.append(row)
    if not rows:
        _fail(path, "holds no training rows")
    if disagree:
        warnings.warn(f"{path}: {disagree} row(s) state a relative_bin that disagrees with "
                      f"aggregated_speedup; using the bin of the speedup (bins.speedup_to_bin)")
    return rows


# ---- writing prediction rows --------------------------------------------------------------------

def prediction_row(row, forecast, repeat, **override):
    """The prediction row of a forecast (a Forecast, or any object with to_dict()) of one
    load_rows row; keyword arguments override the forecast's fields (model, tokens, seconds)."""
    f = {**forecast.to_dict(), **override}
    return dict(id=row["row_id"], task=row["pack"], model=f["model"], readout=f["readout"],
                repeat=repeat, probs=None if f["probs"] is None else [float(p) for p in f["probs"]],
                parse_failed=bool(f["parse_failed"]), parse_error=f["parse_error"],
                deferred=bool(f.get("deferred", False)),
                stated_bin=f["stated_bin"], predicted_bin=f["predicted_bin"], raw_sum=f["raw_sum"],
                true_speedup=float(row["aggregated_speedup"]), true_bin=row["true_bin"],
                tokens_in=f["tokens_in"], tokens_out=f["tokens_out"], seconds=f["seconds"],
                attempts=f.get("attempts", 1), reasoning=f["reasoning"])


def written_predictions(path):
    """(id, repeat) of the rows already in a prediction file that is being appended to, so an
    interrupted evaluation resumes; a torn last line is cut off."""
    if not Path(path).exists():
        return set()
    return {(str(r["id"]), int(r["repeat"])) for _, r in read_jsonl(path, cut_torn_tail=True)
            if "id" in r and "repeat" in r}


# ---- reading prediction files ----------------------------------------------------------------
# One normalised row per forecast, whichever format it came from:
#   id, task, model, readout, repeat, probs (8 floats summing to 1, or None on a parse failure or a
#   deferral), parse_failed, parse_error, deferred, stated_bin, predicted_bin (the bin scored),
#   raw_sum, true_bin, true_speedup (None when only the bin is known), where ("file:line").

def is_finite_number(x):
    """A finite int or float read from JSON; not a bool (JSON's true is not the number 1)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bin_field(value, where, field):
    if not is_finite_number(value) or value != int(value) or not 1 <= value <= N_BINS:
        _fail(where, f"{field} must be an integer bin in 1..{N_BINS}, got {value!r}")
    return int(value)


def _probs_field(values, where, field):
    """(probs summing to 1, raw sum) from a list of 8 numbers; RecordError if unusable."""
    if not isinstance(values, list) or len(values) != N_BINS or not all(map(is_finite_number, values)):
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
        if not is_finite_number(s) or s <= 0:
            _fail(where, f"{speedup_key} must be a finite number > 0, got {s!r}")
        s = float(s)
    if b is not None:
        b = _bin_field(b, where, bin_key)
        if s is not None and speedup_to_bin(s) != b:
            _fail(where, f"{bin_key} {b} disagrees with {speedup_key} {s} (bin {speedup_to_bin(s)})")
    return (b if b is not None else speedup_to_bin(s)), s


def _row(where, *, rid, task, model, readout, repeat, probs, raw_sum, failed, error, stated,
         truth, bin_rule, deferred=False):
    if not isinstance(task, str) or not task:
        _fail(where, "missing field 'task' (or 'pack'): the task this forecast is for")
    if repeat is not None and (not is_finite_number(repeat) or repeat != int(repeat)):
        _fail(where, f"repeat must be an integer or null, got {repeat!r}")
    if failed or deferred:
        probs = raw_sum = predicted = None
    else:
        predicted = predicted_bin(probs)
        if bin_rule == "stated" and stated is not None:
            predicted = stated
    return {"id": rid, "task": task, "model": str(model), "readout": readout,
            "repeat": None if repeat is None else int(repeat), "probs": probs,
            "parse_failed": bool(failed), "parse_error": error if failed else None,
            "deferred": bool(deferred) and not failed, "stated_bin": stated, "predicted_bin": predicted,
            "raw_sum": None if raw_sum is None else float(raw_sum),
            "true_bin": truth[0], "true_speedup": truth[1], "where": where}


def _failed_flag(obj, where):
    failed = obj.get("parse_failed", False)
    if not isinstance(failed, bool):
        _fail(where, f"parse_failed must be true or false, got {failed!r}")
    return failed


def _our_row(obj, where, bin_rule):
    failed = _failed_flag(obj, where)
    deferred = obj.get("deferred", False)
    if not isinstance(deferred, bool):
        _fail(where, f"deferred must be true or false, got {deferred!r}")
    probs = raw = stated = None
    if not failed and not deferred:
        if obj.get("probs") is None:
            _fail(where, "no forecast: give 'probs' (8 probabilities, this project's rows) or "
                         "'bin_probabilities' with 'comparison_id' (the paper's published rows); set "
                         "parse_failed: true if the answer could not be parsed")
        probs, raw = _probs_field(obj["probs"], where, "probs")
        if is_finite_number(obj.get("raw_sum")):
            raw = obj["raw_sum"]  # the parser's sum before it renormalised
        if obj.get("stated_bin") is not None:
            stated = _bin_field(obj["stated_bin"], where, "stated_bin")
    truth = _truth(obj, where, "true_speedup", "true_bin", "our prediction rows carry the label")
    return _row(where, rid=obj.get("id", where), task=obj.get("task"),
                model=obj.get("model", "unknown"), readout=obj.get("readout"),
                repeat=obj.get("repeat"), probs=probs, raw_sum=raw, failed=failed,
                error=obj.get("parse_error"), stated=stated, truth=truth, bin_rule=bin_rule,
                deferred=deferred)


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
        if is_finite_number(obj.get("raw_probability_sum")):
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
    """Read a predictions file or Hub dataset (ours or the paper's format, detected per row) into
    normalised rows.

    rows_path: the paper's eval-set rows (a file or a Hub dataset), joined on comparison_id for true_bin, aggregated_speedup
    and pack. bin_rule: "argmax" (default) or "stated" (see the module docstring). Raises
    RecordError naming the file and line for anything that cannot be scored.
    """
    if bin_rule not in ("argmax", "stated"):
        raise ValueError(f"bin_rule must be 'argmax' or 'stated', got {bin_rule!r}")
    eval_rows = None
    if rows_path is not None:
        eval_rows = {}
        for _, ev_where, obj in read_source(rows_path):
            if obj.get("comparison_id") is None:
                _fail(ev_where, "missing field 'comparison_id' (eval-set row)")
            if obj["comparison_id"] in eval_rows:
                _fail(ev_where, f"comparison_id {obj['comparison_id']!r} appears twice")
            eval_rows[obj["comparison_id"]] = (ev_where, obj)
    rows = []
    for _, where, obj in read_source(path):
        if any(k in obj for k in ("comparison_id", "bin_probabilities", "surrogate_label")):
            rows.append(_paper_row(obj, where, eval_rows, rows_path, bin_rule))
        else:
            rows.append(_our_row(obj, where, bin_rule))
    if not rows:
        _fail(path, "holds no prediction rows")
    return rows
