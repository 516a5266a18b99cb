"""`metrics.py --protocol paper` against an independent implementation of the original's definitions.

The reference below is written from the paper's definitions (docs/FIDELITY.md, docs/PAPER.md
§4-§5), in plain Python loops, and imports nothing from the project: it reads the JSON Lines
files itself. The fixture is paper-format predictions in which the stated bin often differs from
the argmax of the probabilities, with parse failures, confidence ties, three tasks, three repeats
and two forecasters.
"""
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EDGES = [0.5, 2 ** -0.5, 1.0, 2 ** 0.5, 2.0, 2 ** 1.5, 4.0]


# ---- the fixture --------------------------------------------------------------------------------

def true_bin(s):
    return 1 + sum(s >= e for e in EDGES)


def write_fixture(folder, seed=0, n_per_task=24):
    rng = random.Random(seed)
    evals, preds = [], []
    for task in ("cross_entropy", "trimul", "fp8_quant"):
        for i in range(n_per_task):
            s = 2 ** rng.uniform(-2.5, 2.6)
            evals.append({"comparison_id": f"{task}-{i}", "pack": task, "anchor_code": "a",
                          "candidate_code": "c", "hardware": "NVIDIA A100-SXM4-80GB",
                          "aggregated_speedup": s, "true_bin": true_bin(s), "source_id": f"{task}/{i}",
                          "source_search": "s", "internal_experiment": "x"})
    stats = {"rows": 0, "failed": 0, "stated_not_argmax": 0}
    for label, sharp in (("base", 1.0), ("brier", 3.0)):
        for repeat in range(3):
            for ev in evals:
                stats["rows"] += 1
                row = {"comparison_id": ev["comparison_id"], "pack": ev["pack"], "surrogate_label": label,
                       "repeat": repeat, "reasoning": "r", "input_tokens": 10, "output_tokens": 5,
                       "elapsed_s": 1.0}
                if rng.random() < 0.15:
                    stats["failed"] += 1
                    preds.append({**row, "predicted_bin": None, "bin_probabilities": [],
                                  "raw_probability_sum": None, "parse_failed": True,
                                  "parse_error": "no tool call"})
                    continue
                centre = min(8, max(1, ev["true_bin"] + rng.choice([-2, -1, 0, 0, 0, 1, 2])))
                w = [rng.random() * 0.2 + (sharp if b == centre else 0) + (0.4 if abs(b - centre) == 1 else 0)
                     for b in range(1, 9)]
                p = [round(x / sum(w), 2) for x in w]  # rounded: ties between rows' confidences
                if sum(p) == 0:
                    p[centre - 1] = 1.0
                argmax = p.index(max(p)) + 1
                stated = argmax if rng.random() < 0.5 else rng.choice([b for b in range(1, 9) if b != argmax])
                stats["stated_not_argmax"] += stated != argmax
                preds.append({**row, "predicted_bin": stated,
                              "bin_probabilities": [{"bin": b, "p": p[b - 1]} for b in range(1, 9)],
                              "raw_probability_sum": sum(p), "parse_failed": False, "parse_error": None})
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (folder / "preds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in preds))
    return folder / "preds.jsonl", folder / "eval.jsonl", stats


# ---- the independent implementation of the original's definitions ------------------------------

def load(preds_path, eval_path):
    truth = {}
    for line in Path(eval_path).read_text().splitlines():
        r = json.loads(line)
        truth[r["comparison_id"]] = r
    rows = []
    for line in Path(preds_path).read_text().splitlines():
        r = json.loads(line)
        t = truth[r["comparison_id"]]
        item = {"label": r["surrogate_label"], "task": t["pack"], "repeat": r["repeat"],
                "y": t["true_bin"], "speedup": t["aggregated_speedup"], "parsed": not r["parse_failed"]}
        if item["parsed"]:
            p = {d["bin"]: d["p"] for d in r["bin_probabilities"]}
            total = sum(p.values())
            item["p"] = [p[b] / total for b in range(1, 9)]
            item["bin"] = r["predicted_bin"]  # the bin the model stated
        rows.append(item)
    return rows


def half_brier(p, y):
    return 0.5 * sum((p[b - 1] - (1.0 if b == y else 0.0)) ** 2 for b in range(1, 9))


def ranked_crps(p, y):
    cum, total = 0.0, 0.0
    for k in range(1, 8):
        cum += p[k - 1]
        total += (cum - (1.0 if k >= y else 0.0)) ** 2
    return total / 7


def neg_log(p, y):
    return -math.log(max(p[y - 1], 1e-12))


def curve(rows, score):
    """(coverage, risk) per threshold in {-inf, each parsed score, +inf}; trust iff score >= tau;
    risk = share of trusted rows whose stated bin is wrong, None when nothing is trusted."""
    scores = sorted({score(r) for r in rows if r["parsed"]})
    points = []
    for tau in [-math.inf] + scores + [math.inf]:
        trusted = [r for r in rows if r["parsed"] and score(r) >= tau]
        risk = sum(r["bin"] != r["y"] for r in trusted) / len(trusted) if trusted else None
        points.append((len(trusted) / len(rows), risk))
    return [pt for pt in points if pt[1] is not None]


def area(points):
    pts = sorted(points, key=lambda pt: pt[0])
    if len(pts) < 2:
        return None
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(pts, pts[1:]) if b[0] != a[0])


def at_coverage(points, c):
    pts = sorted(points, key=lambda pt: pt[0])
    if not pts:
        return None
    if c <= pts[0][0]:
        return pts[0][1]
    if c >= pts[-1][0]:
        return pts[-1][1]
    for a, b in zip(pts, pts[1:]):
        if a[0] <= c <= b[0]:
            return a[1] if a[0] == b[0] else a[1] + (c - a[0]) / (b[0] - a[0]) * (b[1] - a[1])


def reference(rows):
    parsed = [r for r in rows if r["parsed"]]
    uniform = [1 / 8] * 8
    out = {"n": len(rows), "parse_rate": len(parsed) / len(rows)}
    out["accuracy"] = sum(r["bin"] == r["y"] for r in parsed) / len(parsed)
    out["off_by_one"] = sum(abs(r["bin"] - r["y"]) <= 1 for r in parsed) / len(parsed)
    for name, f in (("brier", half_brier), ("crps", ranked_crps), ("nll", neg_log)):
        out[name] = sum(f(r["p"] if r["parsed"] else uniform, r["y"]) for r in rows) / len(rows)
        out[name + "_parsed"] = sum(f(r["p"], r["y"]) for r in parsed) / len(parsed)
    buckets = {}
    for r in parsed:
        conf = r["p"][r["bin"] - 1]
        buckets.setdefault(min(int(conf * 10), 9), []).append((conf, r["bin"] == r["y"]))
    out["ece"] = sum(len(b) / len(parsed) * abs(sum(c for c, _ in b) / len(b) - sum(h for _, h in b) / len(b))
                     for b in buckets.values())
    points = curve(rows, lambda r: r["p"][r["bin"] - 1])
    out["aurc"] = area(points)
    out["selective_risk_at_50"] = at_coverage(points, 0.5)
    return out


# ---- the comparison -------------------------------------------------------------------------------

KEYS = ("n", "parse_rate", "accuracy", "off_by_one", "ece", "brier", "crps", "nll", "brier_parsed",
        "crps_parsed", "nll_parsed", "aurc", "selective_risk_at_50")


def run_metrics(*args):
    return subprocess.run([sys.executable, str(ROOT / "metrics.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def assert_matches(got, want, where):
    for k in KEYS:
        assert got[k] == pytest.approx(want[k], abs=1e-12), f"{where}: {k}"


def test_paper_protocol_matches_an_independent_implementation(tmp_path):
    preds, evals, stats = write_fixture(tmp_path)
    assert stats["stated_not_argmax"] > stats["rows"] / 4 and stats["failed"] > stats["rows"] / 10
    res = run_metrics(preds, "--rows", evals, "--protocol", "paper", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["protocol"] == "paper"
    rows = load(preds, evals)
    for label in ("base", "brier"):
        rep = out["forecasters"][label]
        mine = [r for r in rows if r["label"] == label]
        assert_matches(rep["overall"], reference(mine), f"{label} overall")
        for task in ("cross_entropy", "trimul", "fp8_quant"):
            assert_matches(rep["tasks"][task], reference([r for r in mine if r["task"] == task]),
                           f"{label} {task}")
        per = {k: reference([r for r in mine if r["repeat"] == k]) for k in range(3)}
        for k in range(3):
            assert_matches(rep["repeats"]["per_repeat"][str(k)], per[k], f"{label} repeat {k}")
        for key in KEYS:
            assert rep["repeats"]["mean"][key] == pytest.approx(sum(per[k][key] for k in range(3)) / 3)
    # the protocol is named in the table output too
    res = run_metrics(preds, "--rows", evals, "--protocol", "paper")
    assert res.returncode == 0 and "protocol: paper" in res.stdout


# ---- paper_protocol.py on hand-worked examples ------------------------------------------------------

def hand_rows():
    """Speedups 3.0 (bin 7), 1.0 (4), 2.0 (6), 0.5 (2); forecasts bin 6 at .9, bin 7 at .8, bin 6 at
    .4, and a parse failure."""
    def row(bin_, conf, s):
        if bin_ is None:
            return {"probs": None, "predicted_bin": None, "true_bin": true_bin(s), "true_speedup": s}
        p = [(1 - conf) / 7] * 8
        p[bin_ - 1] = conf
        return {"probs": p, "predicted_bin": bin_, "true_bin": true_bin(s), "true_speedup": s}
    return [row(6, 0.9, 3.0), row(7, 0.8, 1.0), row(6, 0.4, 2.0), row(None, None, 0.5)]


def test_paper_curve_aurc_and_interpolation_by_hand():
    import paper_protocol as pp
    rows = hand_rows()
    # thresholds -inf, .4, .8, .9, inf trust {0,1,2}, {0,1,2}, {0,1}, {0}, {}: coverage .75 .75 .5 .25 0
    pts = pp.curve(rows, "maxprob", "binary_mismatch")
    assert [(c, r) for _, c, r in pts] == [(0.75, 2 / 3), (0.75, 2 / 3), (0.5, 1.0), (0.25, 1.0), (0.0, None)]
    assert pp.aurc(pts) == pytest.approx(0.25 * 1 + 0.25 * (1 + 2 / 3) / 2)  # from .25 to .75, not to 0
    assert pp.risk_at(pts, 0.5) == 1.0 and pp.risk_at(pts, 0.1) == 1.0 and pp.risk_at(pts, 0.9) == pytest.approx(2 / 3)
    assert pp.risk_at(pts, 0.625) == pytest.approx(1 - 0.5 / 3)  # halfway between (.5, 1) and (.75, 2/3)
    # speedup distance: midpoints 2^.75 (bin 6) and 2^1.5 (bin 7) of the original's prompt table
    d = [abs(2 ** 0.75 - 3.0), abs(2 ** 1.5 - 1.0), abs(2 ** 0.75 - 2.0)]
    pts = pp.curve(rows, "maxprob", "speedup_distance")
    assert [r for _, _, r in pts][:4] == pytest.approx([sum(d) / 3, sum(d) / 3, (d[0] + d[1]) / 2, d[0]])
    # regret: best 3.0; trusting {0,1,2} takes the bin-7 forecast (1.0x) and measures the 0.5x: 2;
    # {0,1}: bin 7 (1.0x) or measured 2.0x: 1; {0}: its 3.0x: 0; nothing trusted: all measured: 0
    pts = pp.curve(rows, "maxprob", "regret")
    assert [(c, r) for _, c, r in pts] == [(0.75, 2.0), (0.75, 2.0), (0.5, 1.0), (0.25, 0.0), (0.0, 0.0)]
    assert pp.aurc(pts) == pytest.approx(0.25 * 0.5 + 0.25 * 1.5)


def test_paper_threshold_for_coverage_and_deferral_agreement():
    import paper_protocol as pp
    rows = hand_rows()  # parsed scores .9 .8 .4 of 4 rows
    assert pp.threshold_for_coverage(rows, 0.5) == pytest.approx(0.6)  # k = 2: between .8 and .4
    assert pp.threshold_for_coverage(rows, 0.3) == pytest.approx(0.85)  # k = round(1.2) = 1
    assert pp.threshold_for_coverage(rows, 0.625) == pytest.approx(0.6)  # round(2.5) = 2 (to even)
    assert pp.threshold_for_coverage(rows, 0.75) == -math.inf and pp.threshold_for_coverage(rows, 0.1) == math.inf
    assert pp.deferred(rows, 0.6) == {2, 3} and pp.deferred(rows, 0.85) == {1, 2, 3}
    assert pp.jaccard({2, 3}, {1, 2, 3}) == pytest.approx(2 / 3) and pp.jaccard(set(), set()) is None


def test_constant_confidence_has_zero_paper_aurc_but_not_ours():
    import paper_protocol as pp
    from selective import aurc as our_aurc
    rows = [dict(r, probs=[0.3] + [0.1] * 7, predicted_bin=1) for r in hand_rows()[:3]]  # all wrong
    assert pp.aurc(pp.curve(rows)) == 0.0  # a zero-width curve
    assert our_aurc([0.3] * 3, [False] * 3) == pytest.approx(1.0)  # risk 1 over coverage 0..1


def test_protocol_is_named_and_paper_refuses_argmax(tmp_path):
    preds, evals, _ = write_fixture(tmp_path, n_per_task=4)
    res = run_metrics(preds, "--rows", evals, "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["protocol"] == "ours"
    res = run_metrics(preds, "--rows", evals)
    assert res.stdout.startswith("protocol: ours")
    res = run_metrics(preds, "--rows", evals, "--protocol", "paper", "--bin-rule", "argmax")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "stated bin" in res.stderr
