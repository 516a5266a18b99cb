"""report.py: a search as one page: its tree, its code, its forecasts against its measurements, and
what the gate saved (docs/PAPER.md §4, §7; the paper's Figure 4).

    python report.py runs/cross_entropy-topk-0         # writes runs/cross_entropy-topk-0/report.html
    python report.py runs/cross_entropy-compare-0      # a --compare folder: both searches on one page
    python report.py runs/a runs/b --out a-vs-b.html   # any runs side by side, whatever their gates

search.py writes the same page into its run folder when it ends (and again on a resume); this
command rebuilds it from run folders alone, for runs made before the page existed too. The page
is a view of the run's event log, never a second source of truth: everything on it is read from
events.jsonl (search.py logs there every request, every result and every decision), read without
writing to it, so a search still running can be drawn too (a torn last line is left out and named).
What an older log does not hold (the mutator's prompt, the forecaster's raw answer, the labels the
gate had), the page says is not recorded.

The page, and where this file computes it (build_run, top to bottom):
  - the tree: every child the search considered, under its parent (a generation a column):
    measured ones coloured by speedup, skipped ones marked forecast-only, failed ones crossed;
    archive nodes sized by their PUCT visits (the archive replayed with puct.Archive from the log's
    step records); the path to the best kernel drawn over it;
  - a node, on click: its code, its diff against its parent, the mutation that made it, its
    forecast (8 bins, the measured bin marked), the gate's decision with the threshold in force at
    that moment, its measurement (status, per-case times, noise, flags, the harness's message), and
    what the models said (the mutator's prompt and answer, the forecaster's answer);
  - over the run: best speedup against measurements (Figure 4; several runs on one chart), the
    gate's threshold, coverage and realised bin-mismatch rate against --target-risk, the confusion
    of forecast bin against measured bin and the reliability diagram of the search's own forecasts;
  - the ledger: candidates considered, forecast, measured and skipped; seconds measuring,
    forecasting and mutating; the models' tokens; candidates considered per measurement; what a
    measurement cost on the machine that ran it;
  - the audit (search.py --audit F): skipped children measured anyway, outside the budget; from
    them the gate's miss rate (skipped children faster than their parent) with an exact
    (Clopper-Pearson) interval. A live search never learns what it skipped: this is the estimate.
Every speedup carries its noise: a gain within two standard errors of its parent's speedup (of 1.0
for the seed: measure.py's within_noise) is shown as within the noise, in the tree, the node and
the curve.

How the page is built (write_report): one HTML file that opens from disk, offline. Plotly's
JavaScript, from the plotly wheel, is inlined; the charts are plotly figures built here; the page's
own code (report_page/page.js, inlined with its frame page.html and its style page.css) draws them
for the run picked, lists a node on click and writes the tables. The data travel gzip-compressed and base64-encoded inside the page (a
320-measurement search holds a few MB of kernel code; scripts/bench_report.py measures the page).
A candidate's text can never become markup or script: the data cannot close their element
(base64), the page code only ever sets textContent, control characters are shown escaped (\\x1b),
and the page's Content-Security-Policy runs only its own two scripts and fetches nothing.
"""
import base64
import difflib
import gzip
import hashlib
import html
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import bins
from data.records import RecordError, read_jsonl, read_jsonl_as_is, write_atomic
from forecast_answer import Forecast
from gate import Gate, forecast_speedup
from harness.measure_channel import printable
from mutators import PYTHON_BLOCK, goal_reward
from puct import Archive, Child
from runtime import cli
from runtime.cli import flag
from selective import ece, reliability, risk_upper_bound

# What the models said is most of a page's weight: one model text (a prompt, an answer) keeps at most
# TEXT_CAP characters, and a page about TEXT_BUDGET in all (a 320-measurement search has ~2,600 of
# them: ~1,900 characters each, the page then ~9 MB); the log keeps every text whole.
TEXT_CAP, MIN_TEXT_CAP, TEXT_BUDGET = 6000, 1000, 5_000_000
LEVEL = 0.95           # of the miss rate's interval
PAGE = Path(__file__).resolve().parent / "report_page"  # the page's frame, style and code
SPEEDUP_CLIP = 3.0     # the tree's colours saturate at 2^-3 = 0.125x and 2^3 = 8x


class ReportError(Exception):
    """A folder or log the page cannot be drawn from; main() prints it as one line."""


# ---- 1. the run's files, read without writing to them --------------------------------------------

def run_folders(paths):
    """The run folders named on the command line; a --compare folder (OUT/ungated, OUT/gated) counts
    as its two runs."""
    out = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"{p}: no such folder; pass a run folder that search.py wrote (its --out)")
        arms = [p / arm for arm in ("ungated", "gated") if (p / arm / "events.jsonl").is_file()]
        out += arms if arms and not (p / "events.jsonl").exists() else [p]
    return out


def read_events(folder):
    """([(line number, event)], torn) of a run folder's events.jsonl: torn is the line number of a
    torn last line that was left out (a crash, or a write still under way), None when the log ends
    cleanly. The file is never written."""
    log = Path(folder) / "events.jsonl"
    if not log.is_file():
        raise ReportError(f"{folder} is not a search's run folder (it holds no events.jsonl); pass the folder "
                          "search.py wrote (its --out)")
    try:
        rows, torn = read_jsonl_as_is(log, fix="the log is damaged before its end, and a page drawn from it would "
                                                "be wrong; restore the file or rerun the search into a new --out")
    except RecordError as e:
        raise ReportError(str(e)) from None
    for n, e in rows:
        if not {"kind", "request_id", "payload"} <= set(e) or not isinstance(e["payload"], (dict, type(None))):
            raise ReportError(f"{log}:{n}: not an event of search.py's log (kind, request_id, payload)")
    if not any(e["kind"] == "config" for _, e in rows):
        raise ReportError(f"{log} holds no config event: not the event log of a search.py run")
    return rows, torn


def _index(rows):
    """The log by kind: the config, the results by (kind, request id) (the last one logged wins, as
    on a replay), the requests, the selections and steps in the order they were first logged."""
    log = dict(config=None, results={}, requested={}, selections={}, steps={}, end=None, notes={}, times=[])
    for n, e in rows:
        kind, rid, payload = e["kind"], e["request_id"], e["payload"] or {}
        if isinstance(e.get("time"), (int, float)):
            log["times"].append(e["time"])
        entry = dict(payload=payload, line=n, step=e.get("step"), parent=e.get("parent_id"), time=e.get("time"))
        if kind == "config":
            log["config"] = log["config"] or payload
        elif kind == "request":
            log["requested"][(payload.get("what"), rid)] = entry
        elif kind == "selection":
            log["selections"][rid] = entry
        elif kind == "step":
            log["steps"][rid] = entry
        elif kind == "end":
            log["end"] = payload
        elif kind == "seed":
            log["notes"]["seed"] = payload
        else:  # mutation, forecast, measurement, audit
            log["results"][(kind, rid)] = entry
    return log


# ---- 2. the view of one run -------------------------------------------------------------------------

def visible(text, cap=None, where=""):
    """A candidate's or a model's text as the page shows it: every control character but newlines
    and tabs escaped (printable's \\x1b: an escape sequence shows as text), cut to `cap` characters
    with a note saying where the whole text is."""
    text = "" if text is None else str(text)
    cut = ""
    if cap is not None and len(text) > cap:
        head, tail = text[: cap * 2 // 3], text[-(cap // 3):]
        cut = f"\n[... {len(text) - len(head) - len(tail):,} characters left out here; the whole text is in {where} ...]\n"
        text = head + "\x00CUT\x00" + tail
    shown = "\n".join("\t".join(part if part.isprintable() else printable(part, len(part)) for part in line.split("\t"))
                      for line in text.split("\n"))  # isprintable: most text needs no escaping (C speed)
    return shown.replace("\\x00CUT\\x00", cut)


def gain(speedup, noise, ref=1.0, ref_noise=0.0):
    """(ratio, within noise) of a speedup against a reference speedup: within when the log-ratio is
    within two standard errors of zero (measure.py's rule for 1.0; two independent measurements'
    noises add in quadrature). None when either speedup is missing; within is None without noise."""
    if not speedup or not ref:
        return None
    ratio = speedup / ref
    within = None if noise is None or ref_noise is None else abs(math.log(ratio)) <= 2 * math.hypot(noise, ref_noise)
    return {"ratio": ratio, "within_noise": within}


def build_seconds(m):
    """What a measurement (a measure.Measurement dict) spent building its candidate: measure.py's
    build_s (the import and the first calls that compile lazily, torch.compile's among them); in a
    record without it, the import and correctness seconds, where every build happens (a C++
    extension at import, torch.compile's and Triton's JIT in the first calls). None when neither
    was recorded (a failure before the candidate loaded)."""
    if m.get("build_s") is not None:
        return m["build_s"]
    parts = [m.get(k) for k in ("import_s", "check_s") if m.get(k) is not None]
    return sum(parts) if parts else None


def _measurement(res):
    """What the page shows of a logged measurement (or audit)."""
    if res is None:
        return None
    p = res["payload"]
    m = p.get("measurement") or {}
    ok = m.get("status") == "ok" and bool(m.get("speedup"))
    cases = [{"case": visible(json.dumps(c.get("case"))), "reference_ms": c.get("reference_ms"),
              "candidate_ms": c.get("candidate_ms"), "speedup": c.get("speedup"), "noise": c.get("noise"),
              "flags": [visible(f) for f in c.get("flags") or []]} for c in m.get("cases") or []]
    return {"status": m.get("status", "unknown"), "ok": ok, "speedup": m.get("speedup") if ok else None,
            "noise": m.get("noise") if ok else None, "cases": cases, "flags": [visible(f) for f in m.get("flags") or []],
            "message": visible(m.get("message"), TEXT_CAP, f"events.jsonl, line {res['line']}"),
            "seconds": p.get("seconds"), "worker": p.get("worker"), "device": m.get("device"),
            "wall_s": m.get("wall_s"), "build_s": build_seconds(m),
            "timer": visible(m.get("timer")), "scale": m.get("scale"), "cached": m.get("cached"), "line": res["line"]}


def _forecast(entry, where, cap):
    """What the page shows of a logged forecast, and the Forecast the gate read."""
    probs = entry.get("probs")
    rec = entry.get("record") or {}
    f = Forecast(probs=probs, parse_failed=bool(entry.get("parse_failed")), deferred=bool(entry.get("deferred")))
    view = {"probs": probs, "parse_failed": f.parse_failed, "deferred": f.deferred,
            "parse_error": visible(rec.get("parse_error")) or None,
            "predicted_bin": None if probs is None else bins.predicted_bin(probs),
            "confidence": None if probs is None else bins.confidence(probs, "maxprob"),
            "expected_speedup": None if probs is None else forecast_speedup(f),
            "stated_bin": rec.get("stated_bin"), "readout": rec.get("readout"), "model": visible(rec.get("model")),
            "tokens_in": rec.get("tokens_in"), "tokens_out": rec.get("tokens_out"),
            "raw": visible(rec.get("raw"), cap, where) if rec.get("raw") else None}
    # the reasoning is part of a raw answer; alone, it is what a logits read-out or a cost model said
    view["reasoning"] = None if view["raw"] else visible(rec.get("reasoning"), cap, where) or None
    return view, f


def _threshold_note(cfg, sel):
    """The confidence gate's state when it judged a parent's children, in words."""
    tau, labels = sel.get("threshold"), sel.get("labels")
    if tau is not None:
        if cfg.get("threshold") is not None:
            return f"fixed threshold {tau:.3f} (--threshold)"
        had = f" from {labels} labels" if labels is not None else ""
        return (f"threshold {tau:.3f}, learnt{had} (target risk {cfg.get('target_risk')}, "
                f"delta {cfg.get('delta')})")
    if labels is None:
        return ("no threshold in force: every child deferred (too few labels, or none met the target risk; "
                "this log does not say which)")
    if labels < cfg.get("min_labels", 0):
        return f"no threshold yet: {labels} labels of the {cfg.get('min_labels')} needed; every child deferred"
    return (f"no threshold meets the target risk {cfg.get('target_risk')} with {labels} labels: "
            "every child deferred")


def _decision(cfg, sel, cid, forecast, f, parent_speedup):
    """The gate's decision on one child: outcome, reason, trust and the sentence the page shows."""
    gate, k = cfg.get("gate"), cfg.get("measure_per_parent")
    outcome = ("measured" if cid in sel["measure"] else "forecast" if cid in sel.get("forecast_reward", [])
               else "skipped")
    reason = sel["skip"].get(cid)
    out = {"outcome": outcome, "reason": reason, "trust": None, "threshold": None, "threshold_note": None}
    if gate == "none":
        out["text"] = ("measured: no gate, every mutation is measured" if outcome == "measured"
                       else f"skipped: {reason}")
        return out
    why = ("the forecast did not parse" if f.parse_failed else "the forecaster deferred" if f.deferred
           else None) if forecast is not None else "no forecast was logged"
    if gate == "topk":
        rank = cfg.get("rank_by", "expected_bin").replace("_", " ")
        out["text"] = {"measured": f"measured: among this parent's {k} best children by {rank}",
                       "below top-k": f"skipped: below this parent's {k} best children by {rank}"}.get(
            reason if outcome == "skipped" else outcome, f"skipped: {reason}")
        if why:
            out["text"] += f" ({why}: ranked after every parsed forecast)"
        return out
    tau = sel.get("threshold")
    out["threshold"], out["threshold_note"] = tau, _threshold_note(cfg, sel)
    trusted = tau is not None and Gate(cfg.get("score", "maxprob"), tau).decide(f) == "trust"
    out["trust"] = "trusted" if trusted else "deferred"
    conf = None if f.probs is None else bins.confidence(f.probs, cfg.get("score", "maxprob"))
    if trusted:
        judged = f"trusted ({cfg.get('score')} {conf:.3f} >= {tau:.3f})"
    elif why:
        judged = f"deferred ({why})"
    elif tau is None:
        judged = "deferred (no threshold in force)"
    else:
        judged = f"deferred ({cfg.get('score')} {conf:.3f} < {tau:.3f})"
    expected = None if f.probs is None else forecast_speedup(f)
    if outcome == "forecast":
        then = f"admitted on its forecast (expected {expected:.3f}x, --forecast-reward): not measured"
    elif outcome == "measured":
        then = ("predicts a gain over its parent" if trusted else "") + (": " if trusted else "") + "measured"
    elif reason == "confident: no gain over parent":
        vs = f" ({parent_speedup:.3f}x)" if parent_speedup else ""
        then = f"predicts no gain over its parent: expected {expected:.3f}x against the parent's{vs}; skipped"
    elif reason == "over the per-parent cap":
        then = f"over the cap of {k} measurements per parent: skipped"
    else:
        then = f"skipped: {reason}"
    out["text"] = f"{judged}; {then}"
    return out


def _seed_code(folder, log):
    """The seed's code: logged by search.py; from an older run, its archive.json or training rows."""
    if "code" in log["notes"].get("seed", {}):
        return log["notes"]["seed"]["code"]
    try:
        nodes = json.loads((Path(folder) / "archive.json").read_text())["nodes"]
        return next(n["code"] for n in nodes if n.get("is_seed"))
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        pass
    try:
        return next(r["candidate_code"] for _, r in read_jsonl(Path(folder) / "training_rows.jsonl")
                    if r.get("pair_type") == "seed")
    except (RecordError, StopIteration, KeyError):
        return None


def build_run(folder, text_budget=TEXT_BUDGET):
    """The page's view of one run folder: a dict of plain data (nodes, mutations, curve, gate,
    ledger, audit, notes) that write_report turns into a page and the tests read directly. The
    models' texts share `text_budget` characters (_text_cap)."""
    folder = Path(folder)
    rows, torn = read_events(folder)
    log = _index(rows)
    cfg = log["config"]
    notes, cap = [], _text_cap(log["results"], text_budget)
    if cap < TEXT_CAP:
        notes.append(f"what the models said is cut to {cap:,} characters a text on this page (a page holds about "
                     f"{TEXT_BUDGET:,} in all); events.jsonl holds every text whole, at the line each names")
    nodes = {"seed": _seed_node(folder, log, notes)}
    mutations = _children(cfg, log, cap, nodes, notes)          # every child considered, in the order sent
    _against_parents(nodes)                                     # gains and their noise, measured bins, diffs
    archive, picked = _replay_archive(cfg, log, nodes)          # PUCT's visits, as the search had them
    scores = archive.scores() if archive else {}
    for n in nodes.values():
        a_node = archive.nodes.get(n["id"]) if archive else None
        n["archive"] = {"kept": a_node is not None, "visits": a_node.visits if a_node else 0,
                        "score": scores.get(n["id"]), "picked_at": picked.get(n["id"], [])}
    best = archive.best() if archive and any(x.measured for x in archive.nodes.values()) else None
    path, at = [], best.id if best else None
    while at is not None:
        path.append(at)
        at = nodes[at]["parent"] if at in nodes else None
    for n in nodes.values():
        n["best_path"] = n["id"] in path
        n["code"] = None if n["code"] is None else visible(n["code"])  # as the page shows it

    view = {"name": folder.name, "folder": str(folder), "config": cfg, "nodes": list(nodes.values()),
            "mutations": mutations, "best": best.id if best else None, "notes": notes}
    view["curve"] = _curve(nodes)
    view["gate"] = _gate_over_time(cfg, log, nodes) if _is_gated(cfg) else None
    view["calibration"] = _calibration(nodes) if _is_gated(cfg) else None
    view["audit"] = _audit(nodes, view)
    view["state"] = _state(folder, log, torn, nodes)
    view["ledger"] = _ledger(cfg, log, nodes, mutations, view)
    return view


def _seed_node(folder, log, notes):
    res = log["results"].get(("measurement", "seed"))
    code = _seed_code(folder, log)
    if code is None:
        notes.append("the seed's code is not in this run's files (an older run whose archive.json is missing)")
    return {"id": "seed", "parent": None, "step": -1, "index": None, "code": code, "call": None, "mutation": None,
            "reply": None, "forecast": None, "number": None, "measurement": _measurement(res), "audit": None,
            "audit_requested": False, "in_flight": res is None,
            "gate": {"outcome": "seed", "reason": None, "trust": None, "threshold": None, "threshold_note": None,
                     "text": "the seed: the archive's root and every forecast's anchor, measured before the "
                             "search (not counted in the budget)"}}


def _children(cfg, log, cap, nodes, notes):
    """Every child the search considered, added to `nodes` as the selections logged them (a
    selection names each child a parent's mutations gave, measured, skipped or admitted on its
    forecast; its index in the mutation is the end of its id): its code and mutation, its forecast,
    the gate's decision, its measurement and audit. Returns the mutation calls, by tag."""
    results, requested, mutations, number = log["results"], log["requested"], {}, 0
    for rid, entry in log["selections"].items():
        tag, sel = rid.rsplit("/", 1)[0], entry["payload"]
        sel.setdefault("measure", [])
        sel.setdefault("skip", {})
        mut, fc = results.get(("mutation", f"{tag}/mutate")), results.get(("forecast", f"{tag}/forecast"))
        cands = mut["payload"].get("candidates", []) if mut else []
        index = {cid: _child_index(tag, cid, entry["line"]) for cid in
                 set(sel["measure"]) | set(sel["skip"]) | set(sel.get("forecast_reward", []))}
        cids = sorted(index, key=index.get)  # the order the forecasts were made in
        forecasts = fc["payload"].get("forecasts", []) if fc else []
        if fc and len(forecasts) != len(cids):
            notes.append(f"{tag}: {len(forecasts)} forecasts logged for {len(cids)} children; not matched")
            forecasts = []
        failed = [{"index": i, "error": visible(c.get("error"))} for i, c in enumerate(cands) if c.get("code") is None]
        at = f"events.jsonl, line {mut['line']}" if mut else ""
        mutations[tag] = {"parent": entry["parent"], "step": entry["step"], "proposed": len(cands), "failed": failed,
                          "mutator": mut["payload"].get("mutator") if mut else None,
                          "seconds": mut["payload"].get("seconds") if mut else None,
                          "prompt": _chat_text(mut["payload"]["prompt"], at, cap) if mut and mut["payload"].get("prompt")
                          else None,
                          "duplicates": len(cands) - len(failed) - len(cids),
                          "forecast_seconds": fc["payload"].get("seconds") if fc else None,
                          "audit_fraction": sel.get("audit_fraction")}
        parent_m = nodes.get(entry["parent"], {}).get("measurement")
        for j, cid in enumerate(cids):
            i = index[cid]
            cand = cands[i] if i < len(cands) else {}
            meta = dict(cand.get("meta") or {})
            reply = meta.pop("reply", None)
            forecast, f = (_forecast(forecasts[j], f"events.jsonl, line {fc['line']}", cap) if forecasts
                           else (None, Forecast(parse_failed=True)))
            measured = cid in sel["measure"]
            number += measured
            res = results.get(("measurement", cid))
            nodes[cid] = {
                "id": cid, "parent": entry["parent"], "step": entry["step"], "index": i, "code": cand.get("code"),
                "call": tag, "mutation": {k: visible(v) if isinstance(v, str) else v for k, v in meta.items()},
                "reply": _reply_text(reply, at, cap) if reply is not None else None,
                "forecast": forecast, "number": number if measured else None,
                "gate": _decision(cfg, sel, cid, forecasts[j] if forecasts else None, f,
                                  parent_m["speedup"] if parent_m else None),
                "measurement": _measurement(res), "audit": _measurement(results.get(("audit", cid))),
                "audit_requested": cid in sel.get("audit", []),
                "in_flight": measured and res is None and ("measurement", cid) in requested}
            if cid in sel.get("forecast_reward", []) and f.probs is not None:  # its forecast stands for it
                nodes[cid]["measurement"] = {"status": "forecast", "ok": False, "speedup": None, "noise": None,
                                             "forecast_speedup": forecast_speedup(f), "cases": [], "flags": [],
                                             "message": "", "line": None}
    waiting = sorted(tag for kind, rid in requested if kind == "mutation"
                     for tag in [rid.rsplit("/", 1)[0]] if tag not in mutations)
    if waiting:
        notes.append(f"mutated or forecast, not yet through the gate: {', '.join(waiting)}")
    return mutations


def _child_index(tag, cid, line):
    """A child's place in its parent's mutation: search.py names it TAGc<index>."""
    if not cid.startswith(f"{tag}c") or not cid[len(tag) + 1:].isdigit():
        raise ReportError(f"events.jsonl:{line}: {cid!r} is not a child id of {tag} (search.py names them {tag}c<n>)")
    return int(cid[len(tag) + 1:])


def _against_parents(nodes):
    """Each node against its parent: the gain of its measurement and of its audit, with whether it
    is within the noise; the bin it was measured in; its diff."""
    for n in nodes.values():
        m, a = n["measurement"], n["audit"]
        p = nodes.get(n["parent"]) if n["parent"] else None
        pm = p["measurement"] if p else None
        parent_ok = pm is not None and pm["ok"]
        if n["id"] == "seed":  # against 1.0, the reference's own speedup
            pm, parent_ok = {"speedup": 1.0, "noise": 0.0}, True
        n["gain"] = gain(m["speedup"], m["noise"], pm["speedup"], pm["noise"]) if m and m["ok"] and parent_ok else None
        n["audit_gain"] = gain(a["speedup"], a["noise"], pm["speedup"], pm["noise"]) if a and a["ok"] and parent_ok else None
        done = m if m and m["ok"] else a if a and a["ok"] else None
        n["measured_bin"] = bins.speedup_to_bin(done["speedup"]) if done else None
        n["diff"] = _diff(p["code"], n["code"]) if p and p["code"] is not None and n["code"] is not None else None


def _reply_text(reply, where, cap):
    """The mutator's answer as the page shows it: its last ```python block (the node's code, shown
    beside it) replaced by a mark, the rest cut to `cap` characters."""
    return visible(_mark_block(reply, -1, "the code: the node's code, shown above"), cap, where)


def _chat_text(messages, where, cap):
    """A logged chat ([{role, content}]) as text, the parent's code (its first ```python block)
    replaced by a mark: the parent's node shows it."""
    if isinstance(messages, list):
        text = "\n\n".join(f"[{m.get('role')}]\n{m.get('content')}" for m in messages if isinstance(m, dict))
    else:
        text = str(messages)
    return visible(_mark_block(text, 0, "the parent's code, shown at its node"), cap, where)


def _mark_block(text, k, mark):
    blocks = list(PYTHON_BLOCK.finditer(text))
    if not blocks:
        return text
    b = blocks[k]
    return text[:b.start()] + f"```python\n[{mark}]\n```" + text[b.end():]


def _text_cap(results, budget):
    """The characters each model text keeps on the page: TEXT_CAP, or less where the run has so
    many that they would pass `budget` (never below MIN_TEXT_CAP)."""
    n = 0
    for (kind, _), r in results.items():
        if kind == "mutation":
            n += bool(r["payload"].get("prompt")) + sum(bool((c.get("meta") or {}).get("reply"))
                                                        for c in r["payload"].get("candidates", []))
        elif kind == "forecast":
            n += sum(bool((f.get("record") or {}).get("raw") or (f.get("record") or {}).get("reasoning"))
                     for f in r["payload"].get("forecasts", []))
    return max(MIN_TEXT_CAP, min(TEXT_CAP, budget // max(1, n)))


def _diff(old, new):
    """The child's code against its parent's as difflib's opcodes over their lines ([tag, i1, i2, j1,
    j2]: the page draws the diff from the two codes it holds, so no line is carried twice)."""
    return [list(op) for op in difflib.SequenceMatcher(None, old.split("\n"), new.split("\n")).get_opcodes()]


def _reward(cfg, speedup):
    target = cfg.get("target_bin")
    return speedup if target is None else goal_reward(speedup, target)


def _replay_archive(cfg, log, nodes):
    """The archive as the search grew it (puct.Archive, replayed from the step records: which
    children each parent's expansion kept), and the steps at which PUCT picked each parent."""
    seed = nodes["seed"]["measurement"]
    picked = {}
    if not seed or not seed["ok"]:
        return None, picked
    archive = Archive(c=cfg.get("c", 1.0), capacity=cfg.get("capacity", 1000), keep_children=cfg.get("keep_children") or 2)
    archive.add_seed("seed", nodes["seed"]["code"] or "", _reward(cfg, seed["speedup"]))
    for entry in log["steps"].values():
        st = entry["payload"]
        for pid in st.get("parents", []):
            picked.setdefault(pid, []).append(entry["step"])
        for pid, kept in st.get("kept", {}).items():
            children = []
            for cid in kept:
                n = nodes.get(cid)
                m = n["measurement"] if n else None
                if m and m["ok"]:
                    children.append(Child(cid, n["code"] or cid, _reward(cfg, m["speedup"])))
                elif m and m["status"] == "forecast":
                    children.append(Child(cid, n["code"] or cid, m["forecast_speedup"], measured=False))
            archive.expand(pid, children, step=entry["step"])
    return archive, picked


def _curve(nodes):
    """Best speedup against measurements spent (Figure 4), as search.py draws it: the seed at 0,
    then one point per measured child in the order it was sent. `gains`: the children that set a
    new best, each with its noise and whether its gain over its parent is within it."""
    seed = nodes["seed"]["measurement"]
    if not seed or not seed["ok"]:
        return {"points": [], "gains": []}
    best, points = seed["speedup"], [[0, seed["speedup"]]]
    gains = [{"x": 0, "speedup": best, "node": "seed", "noise": seed["noise"],
              "within_noise": (nodes["seed"]["gain"] or {}).get("within_noise")}]
    for n in sorted((n for n in nodes.values() if n["number"]), key=lambda n: n["number"]):
        m = n["measurement"]
        if m is None or m["status"] == "forecast":
            continue  # in flight
        if m["ok"] and m["speedup"] > best:
            best = m["speedup"]
            gains.append({"x": n["number"], "speedup": best, "node": n["id"], "noise": m["noise"],
                          "within_noise": (n["gain"] or {}).get("within_noise")})
        points.append([n["number"], best])
    return {"points": points, "gains": gains}


def _measured_forecasts(nodes):
    """(node, forecast, measured bin) of every measured child with a parsed forecast, in the order sent."""
    out = []
    for n in sorted((n for n in nodes.values() if n["number"]), key=lambda n: n["number"]):
        m, f = n["measurement"], n["forecast"]
        if m and m["ok"] and f and f["probs"] is not None:
            out.append((n, f, bins.speedup_to_bin(m["speedup"])))
    return out


def _gate_over_time(cfg, log, nodes):
    """The gate over the run: at each parent's selection, the threshold in force and the coverage so
    far (children trusted / forecast); at each measurement, the realised bin-mismatch rate so far
    among measured forecasts, and among those the gate trusted."""
    by_call = {}
    for n in nodes.values():
        if n["call"]:
            by_call.setdefault(n["call"], []).append(n)
    sent, forecast, trusted, selections = 0, 0, 0, []
    for rid, entry in log["selections"].items():
        kids = by_call.get(rid.rsplit("/", 1)[0], [])
        forecast += sum(k["forecast"] is not None for k in kids)
        trusted += sum(k["gate"]["trust"] == "trusted" for k in kids)
        selections.append({"x": sent, "threshold": entry["payload"].get("threshold"),
                           "labels": entry["payload"].get("labels"),
                           "coverage": trusted / forecast if forecast and cfg.get("gate") == "confidence" else None})
        sent += len(entry["payload"].get("measure", []))
    mismatch, wrong, wrong_trusted, n_trusted = [], 0, 0, 0
    for k, (n, f, y) in enumerate(_measured_forecasts(nodes), 1):
        wrong += f["predicted_bin"] != y
        if n["gate"]["trust"] == "trusted":
            n_trusted += 1
            wrong_trusted += f["predicted_bin"] != y
        mismatch.append({"x": n["number"], "all": wrong / k,
                         "trusted": wrong_trusted / n_trusted if n_trusted else None})
    return {"selections": selections, "mismatch": mismatch, "target_risk": cfg.get("target_risk"),
            "kind": cfg.get("gate")}


def _calibration(nodes):
    """The confusion of forecast bin (argmax) against measured bin, and the reliability diagram's
    buckets (selective.reliability over max-prob confidence), of the search's measured children."""
    labelled = _measured_forecasts(nodes)
    confusion = [[0] * bins.N_BINS for _ in bins.BINS]
    for _, f, y in labelled:
        confusion[f["predicted_bin"] - 1][y - 1] += 1
    confs = [f["confidence"] for _, f, _ in labelled]
    hits = [bins.hit(f["predicted_bin"], y) for _, f, y in labelled]
    return {"confusion": confusion, "n": len(labelled), "reliability": reliability(confs, hits),
            "ece": ece(confs, hits), "accuracy": sum(hits) / len(hits) if hits else None}


def clopper_pearson(k, n, level=LEVEL):
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion k/n, from
    selective.risk_upper_bound, the exact one-sided bound the gate's threshold is learnt with."""
    if n <= 0:
        return None
    tail = (1 - level) / 2
    low = 0.0 if k == 0 else 1.0 - risk_upper_bound(n - k, n, tail)
    high = 1.0 if k == n else risk_upper_bound(k, n, tail)
    return low, high


def _audit(nodes, view):
    """The gate's miss rate from the audits (search.py --audit): of the audited skipped children
    with a result, those faster than their parent, with an exact interval; beside it those faster
    beyond the noise, and those faster than the best kernel the search found. A failed audit is no
    miss. The estimate holds for every skipped child: each was audited with the same probability."""
    skipped = [n for n in nodes.values() if n["gate"].get("outcome") == "skipped"
               and n["gate"].get("reason") != "budget spent"]
    asked = [n for n in skipped if n["audit_requested"]]
    fractions = {m["audit_fraction"] for m in view["mutations"].values() if m.get("audit_fraction")}
    if not asked:
        return {"requested": 0, "eligible": len(skipped), "fraction": max(fractions) if fractions else None}
    best = next((n["measurement"]["speedup"] for n in nodes.values() if n["id"] == view["best"]), None)
    done = [n for n in asked if n["audit"]]
    scored = [n for n in done if n["audit_gain"] is not None or not n["audit"]["ok"]]
    misses = [n for n in scored if n["audit_gain"] and n["audit_gain"]["ratio"] > 1]
    clear = [n for n in misses if n["audit_gain"]["within_noise"] is False]
    beat = [n for n in done if n["audit"]["ok"] and best and n["audit"]["speedup"] > best]
    by_reason = {}
    for n in scored:
        r = by_reason.setdefault(n["gate"]["reason"], [0, 0])
        r[0] += n in misses
        r[1] += 1
    k, m = len(misses), len(scored)
    interval = clopper_pearson(k, m)
    return {"requested": len(asked), "eligible": len(skipped), "done": len(done), "scored": m,
            "fraction": max(fractions) if fractions else None,
            "failed": sum(not n["audit"]["ok"] for n in done), "misses": k, "beyond_noise": len(clear),
            "beat_best": len(beat), "rate": k / m if m else None, "interval": interval, "level": LEVEL,
            "estimated_misses": (k / m * len(skipped), interval[0] * len(skipped), interval[1] * len(skipped))
            if m else None,
            "by_reason": by_reason, "nodes": [n["id"] for n in asked], "miss_nodes": [n["id"] for n in misses],
            "seconds": sum(n["audit"]["seconds"] or 0 for n in done)}


def _state(folder, log, torn, nodes):
    """Is the run complete, still going (or stopped), torn?"""
    end, sent = log["end"], sum(1 for n in nodes.values() if n["number"])
    flying = sorted(n["id"] for n in nodes.values() if n["in_flight"])
    lines = []
    summary, seed = _summary(folder), nodes["seed"]["measurement"]
    if seed is not None and not seed["ok"]:
        text = (f"stopped: the seed did not measure ok ({seed['status']}: {seed['message'][:200]}); a search "
                "needs its seed measured first")
        done = False
    elif end is not None and end.get("measurements") == sent and not flying:
        text = f"complete: {sent} measurements of a budget of {end.get('budget')}, {end.get('steps')} steps"
        done = True
    elif end is None and not flying and summary.get("measurements") == sent and sent >= (summary.get("budget") or 0) > 0:
        # a log from before the end record: its summary.json says the budget was spent
        text = f"complete: {sent} measurements of a budget of {summary['budget']} (by its summary.json)"
        done = True
    else:
        done = False
        budget = (end or {}).get("budget") or summary.get("budget")
        text = (f"no end recorded: {sent} measurements sent" + (f" of a budget of {budget}" if budget else "")
                + "; the search is still running, or stopped (rerun its command to resume), or was made before "
                "the log recorded its end")
    if flying:
        lines.append(f"{len(flying)} measurements sent without a result yet: {', '.join(flying[:12])}"
                     + (" ..." if len(flying) > 12 else ""))
    if torn is not None:
        lines.append(f"events.jsonl line {torn} is torn (a write cut short: a crash, or one under way) and is "
                     "left out of this page")
    return {"complete": done, "text": text, "notes": lines}


def _summary(folder):
    try:
        return json.loads((Path(folder) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _ledger(cfg, log, nodes, mutations, view):
    """The run's accounts as (label, value) rows of text: what was considered, forecast, measured
    and skipped, what it cost in seconds and tokens, what a measurement cost here."""
    kids = [n for n in nodes.values() if n["call"]]
    measured = [n for n in kids if n["number"]]
    results = [n["measurement"] for n in measured if n["measurement"] and n["measurement"]["status"] != "forecast"]
    ok = [m for m in results if m["ok"]]
    forecasts = [n["forecast"] for n in kids if n["forecast"] is not None]
    skipped = {}
    for n in kids:
        if n["gate"]["outcome"] == "skipped":
            skipped[n["gate"]["reason"]] = skipped.get(n["gate"]["reason"], 0) + 1
    failed = {}
    for m in results:
        if not m["ok"]:
            failed[m["status"]] = failed.get(m["status"], 0) + 1
    proposed = sum(m["proposed"] for m in mutations.values())
    n_failed_mut = sum(len(m["failed"]) for m in mutations.values())
    dups = sum(m["duplicates"] for m in mutations.values())
    seed = nodes["seed"]["measurement"]
    all_m = ([seed] if seed else []) + results
    m_seconds = sum(m["seconds"] or 0 for m in all_m)
    cost_s = sum(m.get("wall_s") or 0 for m in all_m)  # what they cost when made, a cached one too
    build_s = sum(m.get("build_s") or 0 for m in all_m)
    cached = sum(bool(m.get("cached")) for m in all_m)
    timed, timed_s = len(all_m) - cached, sum(m["seconds"] or 0 for m in all_m if not m.get("cached"))
    f_seconds = sum(m["forecast_seconds"] or 0 for m in mutations.values())
    mut_seconds = sum(m["seconds"] or 0 for m in mutations.values())
    mut_in = sum((n["mutation"] or {}).get("tokens_in") or 0 for n in kids)
    mut_out = sum((n["mutation"] or {}).get("tokens_out") or 0 for n in kids)
    fc_in = sum(f["tokens_in"] or 0 for f in forecasts)
    fc_out = sum(f["tokens_out"] or 0 for f in forecasts)
    llm_mutator = (str(cfg.get("mutator", "")).startswith("llm") or cfg.get("mutator") == "embedded"  # SmolLM2's
                   or any(m["prompt"] for m in mutations.values()))
    device = next((m for m in all_m if m.get("device")), {})
    cpu = (device.get("device") == "cpu" or cfg.get("scale") == "cpu")
    best = next((n for n in nodes.values() if n["id"] == view["best"]), None)
    times = log["times"]

    def pct(noise):
        return f" +-{2 * noise:.1%}" if noise is not None else ""

    def counts(d):
        return ", ".join(f"{v} {k}" for k, v in sorted(d.items())) if d else "none"

    speedups = [m["speedup"] if m["ok"] else None for m in results]
    if fc_in or fc_out:
        logits = all(f["readout"] == "logits" for f in forecasts)
        forecaster_tokens = f"{fc_in:,} / {fc_out:,}" + (" (the logits read-out writes no answer)" if logits else "")
    elif not _is_gated(cfg):
        forecaster_tokens = "none (no gate)"
    elif str(cfg.get("forecaster", "")).startswith("costmodel"):
        forecaster_tokens = "none: the cost model is no language model"
    else:
        forecaster_tokens = "none recorded in this log" if forecasts else "no forecast logged yet"
    rows = [
        ("run", view["name"]),
        ("state", view["state"]["text"]),
        ("task", visible(cfg.get("task"))),
        ("gate", _gate_words(cfg)),
        ("forecaster", visible(cfg.get("forecaster")) or ("not named in the log" if _is_gated(cfg) else "none (no gate)")),
        ("mutator", visible(cfg.get("mutator"))),
        ("protocol, seed", f"{cfg.get('protocol')}, {cfg.get('seed')}"),
        ("best speedup", f"{best['measurement']['speedup']:.3f}x{pct(best['measurement']['noise'])} ({best['id']})"
         if best and best["measurement"] and best["measurement"]["ok"] else "none measured"),
        ("seed speedup", f"{seed['speedup']:.3f}x{pct(seed['noise'])}" if seed and seed["ok"]
         else seed["status"] if seed else "not measured yet"),
        ("candidates proposed", f"{proposed} ({n_failed_mut} failed mutations, {dups} repeats of earlier code)"),
        ("candidates considered", str(len(kids))),
        ("forecast", f"{len(forecasts)} ({sum(f['parse_failed'] and not f['deferred'] for f in forecasts)} did not parse, "
         f"{sum(f['deferred'] for f in forecasts)} deferred by the forecaster)" if forecasts else "0"),
        ("measured", f"{len(measured)} sent: {len(ok)} ok, {len(results) - len(ok)} failed ({counts(failed)})"
         + (f", {len(measured) - len(results)} without a result yet" if len(measured) > len(results) else "")),
        ("skipped", f"{sum(skipped.values())} ({counts(skipped)})"),
        ("admitted on a forecast", str(sum(n["gate"]["outcome"] == "forecast" for n in kids))),
        ("audited", _audit_words(view["audit"])),
        ("fast_1", "-" if bins.fast_p(speedups) is None else f"{bins.fast_p(speedups):.2f} (share of measured "
         "candidates correct and faster than the reference)"),
        ("seconds measuring", f"{m_seconds:.1f} s ({len(all_m)} measurements, the seed's included)"),
        ("measuring's cost, builds included", f"{cost_s:.1f} s, {build_s:.1f} s of it building the kernels (the "
         "import and the first calls: C++ builds, torch.compile, Triton's JIT)" + (
             f"; the {cached} from the cache count what they cost when made" if cached else "")
         if cost_s else "not recorded"),
        ("seconds forecasting", f"{f_seconds:.1f} s" if _is_gated(cfg) else "none (no gate)"),
        ("a forecast against a measurement", f"{f_seconds / len(forecasts):.2f} s a forecast, {cost_s / len(all_m):.1f} s "
         f"a measurement: one measurement costs {cost_s / len(all_m) / (f_seconds / len(forecasts)):.0f} forecasts"
         if forecasts and f_seconds and cost_s else "-"),
        ("seconds mutating", f"{mut_seconds:.1f} s"),
        ("mutator tokens in / out", f"{mut_in:,} / {mut_out:,}" if llm_mutator
         else f"none: the {visible(cfg.get('mutator'))} mutator is no language model"),
        ("forecaster tokens in / out", forecaster_tokens),
        ("considered per measurement", f"{len(kids) / len(measured):.2f}" if measured else "-"),
        ("a measurement here", (f"{timed_s / timed:.1f} s on average, on {device.get('device') or 'an unrecorded device'}"
                                if timed else "none timed yet")
         + (f" ({cached} more came from the measurement cache, in no time)" if cached else "")
         + (f"; timer: {device.get('timer')}" if device.get("timer") else "")),
        ("log", f"{len(log['times'])} events over {cli.duration(max(times) - min(times)) if times else '0 s'} (first to last)"),
    ]
    note = ""
    if cpu:
        # a log from before --space searched the Triton kernels, in Triton's interpreter
        interpreted = cfg.get("space", "triton") == "triton"
        rows.insert(2, ("times", "CPU times (Triton's interpreter, small shapes), not GPU times" if interpreted else
                        "CPU times on one core (CPU kernels: C++, torch.compile, PyTorch; small shapes), not GPU times"))
        note = ("measured on CPU: the times are CPU times of Triton kernels run by its interpreter on small shapes; they "
                "exercise the machinery and say nothing about a GPU's speed" if interpreted else
                "measured on CPU: the times are CPU times of CPU kernels on one core, at small shapes; they say nothing "
                "about a GPU's speed")
    return {"rows": [[k, v] for k, v in rows], "cpu": note}


def _is_gated(cfg):
    return cfg.get("gate", "none") != "none"


def _gate_words(cfg):
    gate = cfg.get("gate")
    if gate == "topk":
        return (f"topk: forecast {cfg.get('mutations')} mutations per parent, measure the "
                f"{cfg.get('measure_per_parent')} best by {str(cfg.get('rank_by')).replace('_', ' ')}")
    if gate == "confidence":
        tau = f"fixed threshold {cfg['threshold']}" if cfg.get("threshold") is not None else (
            f"threshold learnt for target risk {cfg.get('target_risk')} (delta {cfg.get('delta')}, "
            f"after {cfg.get('min_labels')} labels)")
        return (f"confidence ({cfg.get('score')}, {tau}); at most {cfg.get('measure_per_parent')} measured per parent"
                + ("; trusted forecasts stand in for measurements (--forecast-reward)" if cfg.get("forecast_reward") else ""))
    return f"none: every mutation measured ({cfg.get('mutations')} per parent)"


def _audit_words(a):
    if not a["requested"]:
        return (f"none of {a['eligible']} skipped children (search.py --audit F measures a fraction of them "
                "anyway, and this page then reports the gate's miss rate)") if a["eligible"] else "none"
    return (f"{a['requested']} of {a['eligible']} skipped children (--audit {a['fraction']}), outside the budget; "
            f"{a['done']} back, {a['seconds']:.1f} s measuring")


def audit_summary(a):
    """The audit's finding in one paragraph of text (the page shows it under the gate's charts)."""
    if not a["requested"]:
        return _audit_words(a)
    if not a["scored"]:
        return f"{a['requested']} skipped children audited; no result yet."
    lo, hi = a["interval"]
    est = a["estimated_misses"]
    reasons = "; ".join(f"{r}: {k} of {n}" for r, (k, n) in sorted(a["by_reason"].items()))
    return (f"{a['misses']} of {a['scored']} audited skipped children were faster than their parent: the gate's "
            f"miss rate is {a['rate']:.1%} ({a['level']:.0%} Clopper-Pearson interval {lo:.1%} to {hi:.1%}; "
            f"exact binomial, each skipped child audited with the same probability). {a['beyond_noise']} of them "
            f"were faster beyond the measurements' noise; {a['beat_best']} beat the best kernel the search found. "
            f"Over all {a['eligible']} skipped children that is about {est[0]:.1f} missed ({est[1]:.1f} to "
            f"{est[2]:.1f}). A failed audit counts as no miss ({a['failed']} failed). By the gate's reason: {reasons}.")


# ---- 3. the figures (plotly) -------------------------------------------------------------------------

NODE_KINDS = (  # (kind, legend, symbol): how the tree marks each kind of node
    ("seed", "seed", "square"),
    ("measured", "measured (colour: speedup)", "circle"),
    ("noise", "measured, within the noise of its parent (a dot: no clear gain)", "circle-dot"),
    ("failed", "failed (incorrect, crashed, ...)", "x-thin-open"),
    ("skipped", "skipped: forecast only", "circle-open"),
    ("audited", "skipped, measured by an audit", "diamond-open"),
    ("forecast", "admitted on a forecast", "star-diamond-open"),
    ("flight", "measurement under way", "hourglass"),
)
# red slower, blue faster, and parity a yellow no one takes for the grey of a skipped child's ring
COLORS = [[0.0, "#b2182b"], [0.35, "#ef8a62"], [0.5, "#f6e8a6"], [0.65, "#67a9cf"], [1.0, "#2166ac"]]


def _node_kind(n):
    m, a = n["measurement"], n["audit"]
    if n["id"] == "seed":
        return "seed"
    if n["in_flight"]:
        return "flight"
    if m and m["status"] == "forecast":
        return "forecast"
    if m and m["ok"]:
        return "noise" if (n["gain"] or {}).get("within_noise") else "measured"
    if m:
        return "failed"
    return "audited" if a else "skipped"


def _color(speedup):
    return max(-SPEEDUP_CLIP, min(SPEEDUP_CLIP, math.log2(speedup))) if speedup else 0.0


def _hover(n):
    m, f, a = n["measurement"], n["forecast"], n["audit"]
    lines = [f"<b>{n['id']}</b> (step {n['step']})"]
    if m and m["ok"]:
        g = n["gain"] or {}
        lines.append(f"{m['speedup']:.3f}x" + (f" +-{2 * m['noise']:.1%}" if m["noise"] is not None else "")
                     + (f", {g['ratio']:.3f}x its parent" if g and n["id"] != "seed" else "")
                     + (" (within noise)" if g.get("within_noise") else ""))
    elif m and m["status"] == "forecast":
        lines.append(f"forecast only: {m['forecast_speedup']:.3f}x expected")
    elif m:
        lines.append(html.escape(m["status"]))
    if a:
        lines.append("audit: " + (f"{a['speedup']:.3f}x" if a["ok"] else html.escape(a["status"])))
    if f and f["probs"] is not None:
        lines.append(f"forecast: bin {f['predicted_bin']} (p {f['confidence']:.2f}), ~{f['expected_speedup']:.2f}x")
    if n["id"] != "seed":
        lines.append(html.escape(n["gate"]["text"][:90]))
    if n["archive"]["kept"]:
        lines.append(f"archive: {n['archive']['visits']} visits")
    return "<br>".join(lines)


def tree_figure(view):
    """The tree: x a node's generation (the seed's children 1, theirs 2, ...; the step that made a
    node is in its hover and panel: a parent PUCT expands at many steps would otherwise draw its
    children across the whole width), y a tidy layout (each leaf a row, a parent at the middle of its
    children; a skipped leaf a third of a row), one trace per kind of node."""
    nodes = {n["id"]: n for n in view["nodes"]}
    kids = {}
    for n in view["nodes"]:
        if n["parent"] in nodes:
            kids.setdefault(n["parent"], []).append(n["id"])
    y, row = {}, [0.0]

    def place(nid):
        below = kids.get(nid, [])
        for c in below:
            place(c)
        if below:
            y[nid] = (y[below[0]] + y[below[-1]]) / 2
        else:
            w = 1.0 if nodes[nid]["number"] or nid == "seed" else 1 / 3
            y[nid], row[0] = row[0] + w / 2, row[0] + w
    place("seed")  # depth: at most one level a step
    x = {"seed": 0}
    for n in view["nodes"]:  # a parent comes before its children in the view: its x is known
        if n["id"] in y and n["id"] != "seed":
            x[n["id"]] = x[n["parent"]] + 1
    # every edge an elbow (out of the parent, then across to the child), drawn as one line that walks
    # the tree and back along each edge: one path for the browser to draw, not one per edge
    ex, ey = [x["seed"]], [y["seed"]]

    def walk(nid):
        for c in kids.get(nid, []):
            ex.extend((x[nid] + 0.5, x[c]))
            ey.extend((y[c], y[c]))
            walk(c)
            ex.extend((x[nid] + 0.5, x[nid]))
            ey.extend((y[c], y[nid]))
    walk("seed")
    traces = [dict(type="scatter", x=ex, y=ey, mode="lines", line=dict(color="#bbbbbb", width=1),
                   hoverinfo="skip", showlegend=False)]
    path = [nid for nid in y if nodes[nid]["best_path"]]
    px, py = [], []
    for nid in path:
        p = nodes[nid]["parent"]
        if p in y and nodes[p]["best_path"]:
            px += [x[p], x[p] + 0.5, x[nid], None]
            py += [y[p], y[nid], y[nid], None]
    if px:
        traces.append(dict(type="scatter", x=px, y=py, mode="lines", line=dict(color="#e6a100", width=4),
                           hoverinfo="skip", name="path to the best kernel"))
    for kind, legend, symbol in NODE_KINDS:
        members = [nodes[nid] for nid in y if _node_kind(nodes[nid]) == kind]
        if not members:
            continue
        speed = [(n["audit"] if kind == "audited" else n["measurement"]) or {} for n in members]
        color = [_color(s.get("speedup") or s.get("forecast_speedup")) for s in speed]
        size = [min(30, 9 + 3 * math.sqrt(n["archive"]["visits"])) if n["archive"]["kept"]
                else 8 if n["number"] else 7 for n in members]
        # one number where every node has the same (the many skipped ones): less for plotly to draw
        marker = dict(symbol=symbol, size=size if len(set(size)) > 1 else size[0], line=dict(width=1, color="#333333"))
        if kind in ("measured", "noise", "seed", "audited", "forecast"):
            marker.update(color=color, coloraxis="coloraxis")
            if kind in ("audited", "forecast"):
                marker["line"] = dict(width=2)
        else:
            marker["color"] = {"failed": "#7f0000", "skipped": "#999999", "flight": "#555555"}[kind]
        traces.append(dict(type="scatter", mode="markers", name=legend, x=[x[n["id"]] for n in members],
                           y=[y[n["id"]] for n in members], customdata=[n["id"] for n in members],
                           hovertext=[_hover(n) for n in members], hoverinfo="text", marker=marker))
    if view["best"] in y:
        traces.append(dict(type="scatter", mode="markers", name="best kernel", x=[x[view["best"]]],
                           y=[y[view["best"]]], customdata=[view["best"]], hoverinfo="skip",
                           marker=dict(symbol="star", size=20, color="rgba(0,0,0,0)",
                                       line=dict(width=2, color="#e6a100"))))
    ticks = list(range(-int(SPEEDUP_CLIP), int(SPEEDUP_CLIP) + 1))
    labels = [("<=" if t == ticks[0] else ">=" if t == ticks[-1] else "") + f"{2.0 ** t:g}x" for t in ticks]
    height = int(min(1100, max(440, 26 * row[0] + 120)))
    layout = dict(
        height=height, margin=dict(l=10, r=10, t=10, b=40), hovermode="closest", clickmode="event",
        dragmode="pan", plot_bgcolor="white",
        xaxis=dict(title="generation (0: the seed)", dtick=1, zeroline=False, gridcolor="#eeeeee",
                   range=[-0.4, max(x.values()) + 0.4]),
        yaxis=dict(visible=False, autorange="reversed"),
        coloraxis=dict(colorscale=COLORS, cmin=-SPEEDUP_CLIP, cmax=SPEEDUP_CLIP, cmid=0,
                       colorbar=dict(title=dict(text="speedup"), tickvals=ticks, ticktext=labels, thickness=14,
                                     len=min(1.0, 300 / height), lenmode="fraction", y=1, yanchor="top", x=1.02)),
        legend=dict(x=1.02, xanchor="left", y=max(0.0, 1 - 320 / height), yanchor="top", font=dict(size=11),
                    itemsizing="constant"))
    return _figure(traces, layout)


def curve_figure(views):
    """Figure 4: best speedup against measurements, one step line per run; each new best marked
    with its noise (two standard errors), hollow when its gain over its parent is within the noise."""
    traces = []
    for k, view in enumerate(views):
        pts = view["curve"]["points"]
        if not pts:
            continue
        color = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")[k % 6]
        label = f"{view['name']} ({view['config'].get('gate')})"
        traces.append(dict(type="scatter", x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines",
                           line=dict(shape="hv", color=color, width=2), name=label, hoverinfo="skip",
                           legendgroup=str(k)))
        g = view["curve"]["gains"]
        up = [s["speedup"] * (math.exp(2 * s["noise"]) - 1) if s["noise"] is not None else 0 for s in g]
        down = [s["speedup"] * (1 - math.exp(-2 * s["noise"])) if s["noise"] is not None else 0 for s in g]
        traces.append(dict(
            type="scatter", x=[s["x"] for s in g], y=[s["speedup"] for s in g], mode="markers",
            name=f"{label}: new best (+-2 standard errors)", legendgroup=str(k), showlegend=False,
            customdata=[[k, s["node"]] for s in g],
            hovertext=[f"<b>{s['node']}</b>: {s['speedup']:.3f}x" + (f" +-{2 * s['noise']:.1%}" if s["noise"] is not None else "")
                       + (" (gain within the noise of its parent)" if s["within_noise"] else "") for s in g],
            hoverinfo="text", error_y=dict(type="data", symmetric=False, array=up, arrayminus=down, color=color),
            marker=dict(color=color, size=9, symbol=["circle-open" if s["within_noise"] else "circle" for s in g],
                        line=dict(width=2, color=color))))
    layout = dict(height=360, margin=dict(l=60, r=10, t=10, b=50), hovermode="closest", plot_bgcolor="white",
                  xaxis=dict(title="measurements (the seed's excluded)", gridcolor="#eeeeee", rangemode="tozero"),
                  yaxis=dict(title="best speedup over the reference (x)", type="log", gridcolor="#eeeeee"),
                  legend=dict(orientation="h", y=-0.25, x=0),
                  shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1, line=dict(dash="dot", color="#888888"))])
    return _figure(traces, layout)


def gate_figure(view):
    """The gate over the run: threshold and coverage at each selection, realised bin-mismatch rate
    against --target-risk at each measurement."""
    g = view["gate"]
    if g is None:
        return None
    sel, mis = g["selections"], g["mismatch"]
    traces = []
    if g["kind"] == "confidence":
        traces.append(dict(type="scatter", x=[s["x"] for s in sel], y=[s["threshold"] for s in sel],
                           mode="lines+markers", line=dict(shape="hv", color="#9467bd"), connectgaps=False,
                           name="threshold in force (none: every child deferred)"))
        traces.append(dict(type="scatter", x=[s["x"] for s in sel], y=[s["coverage"] for s in sel],
                           mode="lines", line=dict(color="#2ca02c"), name="coverage: share of forecasts trusted"))
    traces.append(dict(type="scatter", x=[m["x"] for m in mis], y=[m["all"] for m in mis], mode="lines+markers",
                       marker=dict(size=4), line=dict(color="#d62728"),
                       name="bin mismatch, measured forecasts (so far)"))
    if any(m["trusted"] is not None for m in mis):
        traces.append(dict(type="scatter", x=[m["x"] for m in mis], y=[m["trusted"] for m in mis],
                           mode="lines", line=dict(color="#d62728", dash="dash"),
                           name="bin mismatch, measured forecasts the gate trusted"))
    layout = dict(height=320, margin=dict(l=50, r=10, t=10, b=50), plot_bgcolor="white", hovermode="x unified",
                  xaxis=dict(title="measurements", gridcolor="#eeeeee", rangemode="tozero"),
                  yaxis=dict(range=[0, 1.02], gridcolor="#eeeeee"), legend=dict(orientation="h", y=-0.3, x=0),
                  shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=g["target_risk"], y1=g["target_risk"],
                               line=dict(dash="dot", color="#555555"))],
                  annotations=[dict(xref="paper", x=1, y=g["target_risk"], xanchor="right", yanchor="bottom",
                                    showarrow=False, text=f"--target-risk {g['target_risk']}", font=dict(size=11))])
    return _figure(traces, layout)


def confusion_figure(view):
    c = view["calibration"]
    if c is None:
        return None
    names = [f"{b}: {bins.bin_label(b)}" for b in bins.BINS]
    trace = dict(type="heatmap", z=c["confusion"], x=names, y=names, colorscale="Blues", showscale=False,
                 text=[[str(v) if v else "" for v in row] for row in c["confusion"]], texttemplate="%{text}",
                 hovertemplate="forecast %{y}<br>measured %{x}<br>%{z} children<extra></extra>")
    diagonal = [dict(type="rect", x0=b - 1.5, x1=b - 0.5, y0=b - 1.5, y1=b - 0.5, line=dict(color="#e6a100", width=1))
                for b in bins.BINS]
    layout = dict(height=340, margin=dict(l=120, r=10, t=10, b=100), xaxis=dict(title="measured bin", tickangle=-45),
                  yaxis=dict(title="forecast bin (argmax)"), shapes=diagonal)
    return _figure([trace], layout)


def reliability_figure(view):
    c = view["calibration"]
    if c is None:
        return None
    filled = [(i, n, conf, acc) for i, (n, conf, acc) in enumerate(c["reliability"]) if n]
    traces = [
        dict(type="scatter", x=[0, 1], y=[0, 1], mode="lines", line=dict(dash="dot", color="#888888"),
             name="perfect calibration", hoverinfo="skip"),
        dict(type="bar", x=[i / 10 + 0.05 for i, *_ in filled], y=[a for *_, a in filled], width=0.1,
             marker=dict(color="rgba(31,119,180,0.7)", line=dict(color="#333333", width=1)),
             text=[f"n={n}" for _, n, _, _ in filled], textposition="outside", cliponaxis=False,
             name="accuracy of the bucket"),
        dict(type="scatter", x=[i / 10 + 0.05 for i, *_ in filled], y=[cf for _, _, cf, _ in filled], mode="markers",
             marker=dict(symbol="line-ew-open", size=18, color="#d62728", line=dict(width=3)),
             name="mean confidence of the bucket")]
    layout = dict(height=340, margin=dict(l=50, r=10, t=10, b=50), plot_bgcolor="white",
                  xaxis=dict(title="confidence p[forecast bin]", range=[0, 1], gridcolor="#eeeeee"),
                  yaxis=dict(title="accuracy", range=[0, 1.12], gridcolor="#eeeeee"),
                  legend=dict(orientation="h", y=-0.25, x=0))
    return _figure(traces, layout)


def _figure(traces, layout):
    """A figure spec checked by plotly's own schema (a misspelt attribute fails here, not in a
    browser) and returned as the JSON plotly.js draws."""
    import plotly.graph_objects as go
    return json.loads(go.Figure(data=traces, layout=layout).to_json())


# ---- 4. the page ---------------------------------------------------------------------------------------

def page_data(views):
    """Everything the page's code reads: the runs' views with their figures, and the bins."""
    for v in views:
        v["figures"] = {"tree": tree_figure(v), "gate": gate_figure(v), "confusion": confusion_figure(v),
                        "reliability": reliability_figure(v)}
        v["audit_text"] = audit_summary(v["audit"])
    return {"runs": views, "curve": curve_figure(views),
            "bins": [{"bin": b, "name": bins.BIN_NAMES[b - 1], "label": bins.bin_label(b)} for b in bins.BINS]}


def write_report(runs, path):
    """Draw the runs (folders) into one HTML page at `path`, atomically; returns the path."""
    views = [build_run(r, TEXT_BUDGET // len(runs)) for r in runs]
    names = [v["name"] for v in views]
    if len(set(names)) < len(names):  # two folders of one name (a/run, b/run): their parents tell them apart
        for v in views:
            v["name"] = f"{Path(v['folder']).parent.name}/{v['name']}"
    data = page_data(views)
    title = "search report: " + ", ".join(f"{v['name']} ({v['config'].get('task')})" for v in views)
    write_atomic(path, render_page(data, title))
    return Path(path)


def render_page(data, title):
    """The HTML of the page: its frame (report_page/page.html) with its style, plotly.js and its
    code (page.css, page.js) inline, the data gzip-compressed and base64-encoded (no text in it can
    end its element), a Content-Security-Policy that runs only these two scripts, by their hashes,
    and forbids fetching anything."""
    from plotly.offline import get_plotlyjs
    plotly_js, page_js = get_plotlyjs(), (PAGE / "page.js").read_text()
    for name, script in (("plotly.js", plotly_js), ("report_page/page.js", page_js)):
        if "</script" in script.lower():
            raise ReportError(f"{name} holds '</script': it cannot be inlined")
    blob = base64.b64encode(gzip.compress(json.dumps(_json_safe(data), allow_nan=False).encode(), 9, mtime=0))
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
                      for s in (plotly_js, page_js))
    csp = (f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data: blob:; "
           "font-src data:; base-uri 'none'; form-action 'none'")
    parts = {"title": html.escape(title), "csp": csp, "css": (PAGE / "page.css").read_text(), "plotly_js": plotly_js,
             "data": blob.decode(), "page_js": page_js}
    # one pass: a part's own text (the scripts) is never searched for markers
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m[1]], (PAGE / "page.html").read_text())


def _json_safe(x):
    """JSON that JavaScript reads: NaN and infinities (which a log may hold) become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


# ---- 5. the command line ---------------------------------------------------------------------------------

@dataclass
class Args:
    """Draw a search (or several side by side) as one self-contained HTML page: the tree, each node's
    code, diff, forecast and measurement, the gate's behaviour, the ledger and the audit."""
    runs: list[str] = flag(None, "run folders that search.py wrote (its --out); a --compare folder counts as its "
                           "two runs", positional=True)
    out: str | None = flag(None, "the page's path; default RUN/report.html for one run or a --compare folder "
                           "(needed for several runs)")


def main(argv=None):
    args = cli.parse(Args, argv, gpu=False)
    try:
        runs = run_folders(args.runs)
        if args.out:
            out = Path(args.out) / "report.html" if Path(args.out).is_dir() else Path(args.out)
        elif len(args.runs) == 1:
            out = Path(args.runs[0]) / "report.html"
        else:
            raise ReportError("several runs make one page: pass --out FILE.html for it")
        write_report(runs, out)
    except ReportError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB; {len(runs)} run{'s' if len(runs) > 1 else ''}): "
          "open it in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
