"""reproduce_paper.py: every table and figure of the paper that its published datasets determine,
in the paper's protocol, as one markdown report beside the published values, with its plots.

    hf download codezakh/gpu-forecasters-eval-set --repo-type dataset      # once, where the Hub can be reached
    hf download codezakh/gpu-forecasters-eval-set-predictions --repo-type dataset
    hf download codezakh/gpu-forecasters-discovery-pairs --repo-type dataset
    hf download codezakh/gpu-forecasters-rl-training-pool --repo-type dataset
    HF_HUB_OFFLINE=1 python scripts/reproduce_paper.py --out runs/paper          # seconds, on any machine
    python scripts/reproduce_paper.py --out runs/paper --discovery-predictions disc_preds.jsonl

The four inputs default to the paper's datasets by their Hub names (docs/PAPER.md §10; data/hub.py
reads them from the Hugging Face cache); each also takes a JSON Lines file or another hf: name.
What the report holds, and where each figure comes from:

1. The datasets: rows per dataset and per task, beside the counts the paper gives.
2. The forecasters on the eval set (the predictions joined with the eval set on comparison_id,
   one forecaster per surrogate_label): parse rate, accuracy and off-by-one accuracy on the stated
   bin, ECE, Brier, CRPS, NLL, AURC and selective risk at 50% coverage: metrics.paper_report,
   the original code's definitions (docs/FIDELITY.md); per task, and the mean over repeats.
3. Risk-coverage: the paper protocol's curve of each forecaster (max-prob = p[stated bin], bin
   mismatch), and the AURC of every confidence score (max-prob, entropy, margin).
4. Speedup recovered under a measurement budget (Table 1): per forecaster and budget, with the
   exact random baseline; the base GPT-OSS-20B's mean beside the paper's 82.88%, and the
   Brier-trained adapter's gain over it beside the paper's 2.10 points. The original release has
   no code for this table; the definition is this project's (docs/PAPER.md §5), so a gap between
   the two is a gap between definitions as much as between numbers.
5. Discovery moments: how many of the published parent->child pairs are discoveries (child at
   least 1.414x its parent), the base rate a flagger has to beat; with --discovery-predictions
   (forecaster.py --eval hf:codezakh/gpu-forecasters-discovery-pairs ...: no forecasts of the
   pairs are published) the precision and recall of flagging at --tau, and their curve.
6. The RL pool: rows per task and pair type, and whether gdn_chunk_fwd_o is held out.
Which forecaster is the base GPT-OSS-20B and which the Brier adapter: --base-label and
--brier-label, else the one label whose name says so (the report states the match).

Writes OUT/report.md and OUT/plots/ (a reliability diagram per forecaster, the risk-coverage
curves, speedup recovered, and with discovery forecasts their precision-recall curve), each file
whole or not at all.

What is not here. Before reading anything, each dataset is looked for (available): a file on
disk, or a Hub name in the Hugging Face cache, or else on the Hub if the Hub answers within a few
seconds (the Hub's client would retry an unreachable Hub for half a minute per file). The report
holds the sections the datasets at hand determine and names, at its top, each one missing with
the sections it would add and the command that fetches it; with none at hand it is one line of
error naming all four. --example builds the report from the project's small example data instead
(tests/fixtures, hand-made in the datasets' schemas; tests/fixtures/README.md), and says so at its
top: its figures exercise the code and are no result.
"""
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import metrics  # noqa: E402
from bins import CONFIDENCE_KINDS  # noqa: E402
from data import hub  # noqa: E402
from data.dataset import load_predictions, load_rows  # noqa: E402
from data.records import RecordError, write_atomic  # noqa: E402
from runtime import cli  # noqa: E402
from runtime.cli import flag  # noqa: E402

# The values docs/PAPER.md gives (§10, §11); tests/test_reproduce_paper.py checks each is written there.
PUBLISHED = {
    "eval_rows": 424,
    "eval_by_task": {"cross_entropy": 79, "fp8_quant": 57, "gdn_chunk_fwd_h": 73},
    "prediction_rows": 8904, "forecasters": 7, "repeats": 3,
    "rl_rows": 2322, "rl_holdout": "gdn_chunk_fwd_o",
    "discovery_pairs": 1347,
    "base_speedup_recovered_pct": 82.88,  # mean over budgets of 1-50% of the candidates measured (Table 1)
    "brier_gain_points": 2.10,            # the Brier adapter over the base model, same measure
}
BASE_NAME = re.compile(r"base|20b", re.I)
TRAINED_NAME = re.compile(r"correct|brier|crps|120b", re.I)


@dataclass
class Args:
    """Reproduce the paper's tables and figures from its published datasets (eval set, predictions,
    discovery pairs, RL pool) in its protocol: one markdown report beside the published values, and
    the plots."""
    out: str = flag(None, "output folder: report.md and plots/", required=True, metavar="DIR")
    eval_set: str = flag("hf:codezakh/gpu-forecasters-eval-set", "the eval set: a Hub dataset or a JSON Lines file",
                         metavar="ROWS")
    predictions: str = flag("hf:codezakh/gpu-forecasters-eval-set-predictions", "the forecasters' predictions of "
                            "the eval set (the paper's format, or ours)", metavar="PRED")
    discovery_pairs: str = flag("hf:codezakh/gpu-forecasters-discovery-pairs", "the discovery pairs",
                                metavar="ROWS")
    rl_pool: str = flag("hf:codezakh/gpu-forecasters-rl-training-pool", "the RL training pool", metavar="ROWS")
    discovery_predictions: str | None = flag(None, "prediction rows of the discovery pairs (forecaster.py --eval "
                                             "on them): adds discovery precision and recall", metavar="PRED")
    tau: float = flag(0.5, "discovery flag threshold on P(child >= 1.414x parent)")
    base_label: str = flag("auto", "the predictions' surrogate_label of the base GPT-OSS-20B (auto: the one label "
                           "naming base or 20b and no training reward)")
    brier_label: str = flag("auto", "the surrogate_label of the correctness + Brier adapter (auto: the one label "
                            "naming brier)")
    example: bool = flag(False, "build the report from the project's small example data (tests/fixtures, hand-made "
                         "in the datasets' schemas) instead of the paper's datasets: it needs no Hub, and it says "
                         "at its top that its figures are no result")


DATASETS = {"eval_set": "the eval set", "predictions": "the predictions", "discovery_pairs": "the discovery pairs",
            "rl_pool": "the RL pool"}
ADDS = {  # what each dataset adds to the report
    "eval_set": "sections 2-4 with the predictions (the forecasters' scores, risk-coverage, Table 1)",
    "predictions": "sections 2-4 with the eval set (the forecasters' scores, risk-coverage, Table 1)",
    "discovery_pairs": "section 5 (discovery moments)",
    "rl_pool": "section 6 (the RL pool)",
}
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLE = {"eval_set": FIXTURES / "paper_eval_rows.jsonl", "predictions": FIXTURES / "paper_predictions.jsonl",
           "discovery_pairs": FIXTURES / "paper_discovery_pairs.jsonl", "rl_pool": FIXTURES / "paper_rl_pool.jsonl"}
EXAMPLE_BANNER = ("> **Built from the project's small example data, not the paper's datasets**: a handful of hand-made "
                  "rows in their schemas (`tests/fixtures`, `--example`). Every figure below exercises the code that "
                  "computes it and says nothing about the paper's results; the published values beside them are the "
                  "paper's.")


def available(sources):
    """{dataset: why it is missing} of the datasets that cannot be read here: a file that is not
    there, or a Hub name that is not in the Hugging Face cache while the Hub does not answer. Then
    the Hub's client is put offline (hub.go_offline), so that reading what the cache holds makes
    no network call either."""
    online = hub.reachable() if any(hub.is_hub_name(s) for s in sources.values()) else True
    if not online:
        hub.go_offline()
    missing = {}
    for key, source in sources.items():
        if not hub.is_hub_name(source):
            if not Path(source).is_file():
                missing[key] = f"{source}: no such file"
        elif not online and not hub.in_cache(source):
            missing[key] = (f"{source} is not in the Hugging Face cache and the Hub cannot be reached: "
                            f"`{hub.fill_command(hub.parse_name(source)[0])}` where it can")
    return missing


def none_here(missing, sources):
    """The one line of error when no dataset is at hand: every one named, and what to do."""
    names = [sources[k] for k in missing if hub.is_hub_name(sources[k])]
    files = [why for k, why in missing.items() if not hub.is_hub_name(sources[k])]
    hub_part = (f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} not in the Hugging Face cache and the Hub "
                "cannot be reached (fetch each with `hf download NAME --repo-type dataset` where it can, with the "
                "same HF_HUB_CACHE)") if names else ""
    return ("none of the four datasets is here: " + "; ".join(filter(None, [hub_part] + files))
            + "; or see the report built from the project's small example data: --example")


# ---- reading -------------------------------------------------------------------------------------

def revision(source):
    """The dataset commit a Hub name was read at, or "file" for a JSON Lines file."""
    if not hub.is_hub_name(source):
        return "file"
    return hub.revision(source)[:12]


def pick_label(labels, asked, pattern, exclude=None):
    """(label or None, how it was chosen) for a published figure's forecaster."""
    if asked != "auto":
        if asked not in labels:
            raise RecordError(f"no forecaster labelled {asked!r} in the predictions; they are {', '.join(labels)}")
        return asked, "named with a flag"
    found = [x for x in labels if pattern.search(x) and not (exclude and exclude.search(x))]
    if len(found) == 1:
        return found[0], "matched by its name"
    return None, f"{'several' if found else 'no'} labels match by name ({', '.join(found) or 'none'}); name one with the flag"


# ---- the report ----------------------------------------------------------------------------------

def _f(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def _beside(ours, paper):
    return f"{ours} (paper: {paper})" if paper is not None else f"{ours}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def datasets_section(sources, evals, preds, pairs, pool, missing=()):
    """Section 1; a dataset that is not at hand is named so, its rows a dash (the predictions are
    read joined with the eval set: without it, they cannot be read)."""
    p = PUBLISHED

    def row(name, key, rows, paper):
        shown = sources[key]
        if not hub.is_hub_name(shown) and Path(shown).is_relative_to(ROOT):  # the example's files
            shown = Path(shown).relative_to(ROOT)
        if rows is None:
            return [name, f"`{shown}`", "not here" if key in missing else "needs the eval set", "-", paper]
        return [name, f"`{shown}`", revision(sources[key]), len(rows), paper]
    lines = ["## 1. The datasets", ""] + table(
        ["dataset", "read from", "revision", "rows", "paper"],
        [row("eval set", "eval_set", evals, p["eval_rows"]),
         row("predictions", "predictions", preds,
             f"{p['prediction_rows']} = {p['forecasters']} forecasters x {p['repeats']} repeats x {p['eval_rows']}"),
         row("discovery pairs", "discovery_pairs", pairs, p["discovery_pairs"]),
         row("RL pool", "rl_pool", pool, p["rl_rows"])])
    if preds is not None:
        labels = sorted({r["model"] for r in preds})
        repeats = sorted({r["repeat"] for r in preds}, key=str)
        lines += ["", f"Predictions: {len(labels)} forecasters ({', '.join(labels)}) x {len(repeats)} repeats "
                  f"(paper: {p['forecasters']} x {p['repeats']})."]
    if evals is not None:
        by_task = metrics.group_by(evals, lambda r: r["pack"])
        lines += ["", "Eval-set rows per task:", ""]
        lines += table(["task", "rows", "paper"], [[t, len(rs), p["eval_by_task"].get(t, "-")]
                                                  for t, rs in sorted(by_task.items())])
    return lines


def forecasters_section(reports):
    lines = ["## 2. The forecasters on the eval set", "",
             "The paper's protocol: the stated bin is scored; half-Brier; CRPS = ranked probability score / 7; "
             "Brier, CRPS and NLL score a parse failure as the uniform forecast; accuracy and ECE over parsed "
             "rows; AURC over the covered range; risk@50% interpolated at 50% coverage (docs/FIDELITY.md). "
             "All rows of every repeat pooled; the mean over repeats follows.", ""]
    cols = ["n", "parse_rate", "accuracy", "off_by_one", "ece", "brier", "crps", "nll", "aurc", "selective_risk_at_50"]
    head = ["forecaster", "n", "parse", "acc", "acc±1", "ECE", "Brier", "CRPS", "NLL", "AURC", "risk@50%"]
    lines += table(head, [[name] + [rep["overall"]["n"]] + [_f(rep["overall"][c]) for c in cols[1:]]
                          for name, rep in reports.items()])
    lines += ["", "Mean over repeats (each repeat scored alone):", ""]
    lines += table(["forecaster", "repeats", "acc", "ECE", "Brier", "CRPS", "speedup recovered"],
                   [[name, rep["repeats"]["n"]] + [_f(rep["repeats"]["mean"].get(c)) for c in
                                                  ("accuracy", "ece", "brier", "crps", "speedup_recovered")]
                    for name, rep in reports.items()])
    tasks = sorted({t for rep in reports.values() for t in rep["tasks"]})
    lines += ["", "Accuracy (stated bin) per task:", ""]
    lines += table(["forecaster"] + tasks, [[name] + [_f(rep["tasks"][t]["accuracy"]) if t in rep["tasks"] else "-"
                                                      for t in tasks] for name, rep in reports.items()])
    return lines


def selective_section(reports):
    lines = ["## 3. Risk-coverage", "",
             "AURC of each confidence score (bin-mismatch risk, the paper protocol's curve; lower is better), "
             "and selective risk at 50% coverage. The curves: `plots/risk_coverage.png`.", ""]
    head = ["forecaster"] + [f"AURC {k}" for k in CONFIDENCE_KINDS] + [f"risk@50% {k}" for k in CONFIDENCE_KINDS]
    rows = []
    for name, rep in reports.items():
        sel = rep["overall"]["selective"]
        rows.append([name] + [_f(sel[k]["binary_mismatch"]["aurc"]) for k in CONFIDENCE_KINDS]
                    + [_f(sel[k]["binary_mismatch"]["selective_risk_at_50"]) for k in CONFIDENCE_KINDS])
    return lines + table(head, rows)


def speedup_section(reports, base, brier):
    p = PUBLISHED
    lines = ["## 4. Speedup recovered under a measurement budget (Table 1)", "",
             "Best speedup found among the top b% of each task's candidates, ranked by the forecast's expected "
             "log2 speedup, over the best in the pool; mean over tasks, then over repeats (docs/PAPER.md §5: "
             "this project's definition; the original release has no code for the table).", ""]
    budgets, rows = None, []
    for name, rep in reports.items():
        sr = rep["speedup_recovered"]
        if sr is None:
            rows.append([name, "needs every row's measured speedup"])
            continue
        budgets = budgets or list(sr["by_budget"])
        paper = f"{p['base_speedup_recovered_pct']:.2f}%" if name == base[0] else ""
        rows.append([name] + [_f(v) for v in sr["by_budget"].values()] + [_f(sr["mean"]), _f(sr["random_mean"]), paper])
    lines += table(["forecaster"] + (budgets or []) + ["mean", "random ranking (exact)", "paper"], rows)
    lines += [""]
    b, t = base[0], brier[0]
    if b is None:
        lines.append(f"Base GPT-OSS-20B: {base[1]} (paper: {p['base_speedup_recovered_pct']:.2f}%).")
    else:
        sr_b = reports[b]["speedup_recovered"]
        ours = f"{100 * sr_b['mean']:.2f}%" if sr_b else "-"
        lines.append(f"Base GPT-OSS-20B (`{b}`, {base[1]}): "
                     + _beside(f"{ours} of the available speedup", f"{p['base_speedup_recovered_pct']:.2f}%") + ".")
    if t is None:
        lines.append(f"Correctness + Brier adapter: {brier[1]} (paper: +{p['brier_gain_points']:.2f} points over the "
                     "base, and a lower ECE).")
    elif b is not None and reports[t]["speedup_recovered"] and reports[b]["speedup_recovered"]:
        gain = 100 * (reports[t]["speedup_recovered"]["mean"] - reports[b]["speedup_recovered"]["mean"])
        lines.append(f"Correctness + Brier adapter (`{t}`, {brier[1]}): "
                     + _beside(f"{gain:+.2f} points of speedup recovered over the base",
                               f"+{p['brier_gain_points']:.2f}") + "; "
                     + _beside(f"ECE {_f(reports[t]['overall']['ece'])} against the base's "
                               f"{_f(reports[b]['overall']['ece'])}", "lower") + ".")
    return lines


def discovery_section(pairs, disc, tau):
    found = [r for r in pairs if r["true_bin"] >= 5]
    lines = ["## 5. Discovery moments", "",
             f"A discovery: a child at least 1.414x faster than its parent (bin 5 or above). "
             f"{len(found)} of the {len(pairs)} published pairs are discoveries: base rate "
             f"{_f(len(found) / len(pairs) if pairs else None)}, the precision of flagging every pair.", ""]
    fams = metrics.group_by(pairs, lambda r: r.get("benchmark_family", "-"))
    lines += table(["family", "pairs", "discoveries", "base rate"],
                   [[f, len(rs), sum(r["true_bin"] >= 5 for r in rs), _f(sum(r["true_bin"] >= 5 for r in rs) / len(rs))]
                    for f, rs in sorted(fams.items())])
    lines += [""]
    if disc is None:
        lines.append("Precision and recall need forecasts of the pairs, which the paper did not publish: "
                     "`python forecaster.py --eval hf:codezakh/gpu-forecasters-discovery-pairs --out disc_preds.jsonl "
                     "--repeats 3`, then `--discovery-predictions disc_preds.jsonl` here "
                     "(paper: better than chance, with low precision).")
        return lines
    head = ["forecaster", "pairs", "flagged", "precision", "recall", "base rate"]
    lines += [f"Flagged when P(child >= 1.414x parent) >= {tau}; the curve over tau: `plots/discovery_pr_*.png` "
              "(paper: better than chance, with low precision).", ""]
    lines += table(head, [[name, d["n"], d["flagged"], _f(d["precision"]), _f(d["recall"]), _f(d["base_rate"])]
                          for name, d in disc.items()])
    return lines


def pool_section(pool):
    p = PUBLISHED
    by_task = metrics.group_by(pool, lambda r: r["pack"])
    kinds = sorted({r.get("pair_type", "-") for r in pool})
    lines = ["## 6. The RL training pool", "",
             f"{_beside(f'{len(pool)} rows', p['rl_rows'])}; {p['rl_holdout']}: "
             + _beside(f"{len(by_task.get(p['rl_holdout'], []))} rows", "held out") + ".", ""]
    return lines + table(["task"] + kinds, [[t] + [sum(r.get("pair_type", "-") == k for r in rs) for k in kinds]
                                           for t, rs in sorted(by_task.items())])


NOT_HERE = ["## What the published datasets do not determine", "",
            "- The search comparison (Figure 4: filtered against standard search at 320 measurements): "
            "`python search.py --task cross_entropy --protocol paper --compare` runs it.",
            "- Forecasts beyond the published ones (a new model, an adapter of your own): `python forecaster.py "
            "--eval hf:codezakh/gpu-forecasters-eval-set --out preds.jsonl --repeats 3 --protocol paper`, then "
            "`python metrics.py preds.jsonl --protocol paper`.",
            "- Discovery precision and recall without forecasts of the pairs (section 5)."]


def missing_section(missing, sources):
    """The report's first lines where datasets are missing: each, what it would add, how to get it."""
    lines = ["## Not in this report", "",
             "These datasets were not at hand, so the sections that need them are left out:", ""]
    for key, why in missing.items():
        lines.append(f"- {DATASETS[key]} would add {ADDS[key]}: {why}.")
    if all(hub.is_hub_name(sources[k]) for k in missing):
        lines += ["", "Fetch them where the Hub can be reached (with the same HF_HUB_CACHE), then run this command "
                  "again; or see a whole report built from the project's small example data with `--example`."]
    return lines


def write_report(args, sources, missing=None):
    """Read the datasets at hand (`sources`, less those `missing`), score them, write OUT/report.md
    and OUT/plots/ with the sections they determine. The report's text."""
    from data import plots  # matplotlib only here
    missing = missing or {}
    have = lambda key: key not in missing  # noqa: E731
    evals = load_rows(sources["eval_set"]) if have("eval_set") else None
    preds = (load_predictions(sources["predictions"], sources["eval_set"], bin_rule="stated")
             if have("predictions") and have("eval_set") else None)
    pairs = load_rows(sources["discovery_pairs"]) if have("discovery_pairs") else None
    pool = load_rows(sources["rl_pool"]) if have("rl_pool") else None
    groups = metrics.group_by(preds, metrics.forecaster_name) if preds is not None else {}
    reports = {name: metrics.paper_report(rs) for name, rs in sorted(groups.items())}
    labels = list(reports)
    base = pick_label(labels, args.base_label, BASE_NAME, exclude=TRAINED_NAME)
    brier = pick_label(labels, args.brier_label, re.compile("brier", re.I))
    disc = None
    if args.discovery_predictions and pairs is not None:
        drows = load_predictions(args.discovery_predictions)
        known = {r["row_id"] for r in pairs}
        stray = sorted({r["id"] for r in drows} - known)
        if stray:
            raise RecordError(f"{args.discovery_predictions}: forecasts of {len(stray)} pair(s) not in "
                              f"{sources['discovery_pairs']} (e.g. {stray[0]!r}); pass the predictions of these pairs")
        disc = {name: metrics.discovery_moments(rs, args.tau)
                for name, rs in sorted(metrics.group_by(drows, metrics.forecaster_name).items())}
    out = Path(args.out)
    plot_dir = out / "plots"
    for name, rows in groups.items():
        plots.plot_reliability(rows, plot_dir / f"reliability_{plots._slug(name)}.png", title=name)
    if groups:
        plots.plot_paper_risk_coverage(groups, plot_dir / "risk_coverage.png")
        plots.plot_speedup_recovered(reports, plot_dir / "speedup_recovered.png")
    for name, d in (disc or {}).items():
        plots.plot_precision_recall(d, plot_dir / f"discovery_pr_{plots._slug(name)}.png", title=f"{name}: discovery")
    sections = [datasets_section(sources, evals, preds, pairs, pool, missing)]
    if preds is not None:
        sections += [forecasters_section(reports), selective_section(reports), speedup_section(reports, base, brier)]
    if pairs is not None:
        sections.append(discovery_section(pairs, disc, args.tau))
    if pool is not None:
        sections.append(pool_section(pool))
    head = ["# The paper's tables and figures, from its published datasets", ""]
    if args.example:
        head += [EXAMPLE_BANNER, ""]
    head += ["Written by `scripts/reproduce_paper.py` in the paper's protocol (`metrics.py --protocol paper`); each "
             "figure beside the value docs/PAPER.md gives, where it gives one. Plots in `plots/`.", ""]
    if missing:
        head += missing_section(missing, sources) + [""]
    text = "\n".join(head + [line for section in sections for line in section + [""]] + NOT_HERE) + "\n"
    write_atomic(out / "report.md", text)
    return text


def main(argv=None):
    args = cli.parse(Args, argv, gpu=False)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"reproduce_paper.py: error: --out {args.out} is an existing file; pass a folder", file=sys.stderr)
        return 2
    sources = {k: getattr(args, k) for k in DATASETS}
    if args.example:
        given = [f"--{k.replace('_', '-')}" for k in DATASETS if getattr(args, k) != Args.__dataclass_fields__[k].default]
        if given:
            print(f"reproduce_paper.py: error: --example reads the project's example data; drop {', '.join(given)} "
                  "(or --example, for your datasets)", file=sys.stderr)
            return 2
        sources = {k: str(path) for k, path in EXAMPLE.items()}
    missing = available(sources)
    if len(missing) == len(sources):
        print(f"reproduce_paper.py: error: {none_here(missing, sources)}", file=sys.stderr)
        return 2
    try:
        write_report(args, sources, missing)
    except (RecordError, OSError) as e:
        print(f"reproduce_paper.py: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/report.md and {args.out}/plots/"
          + (" from the project's small example data (its figures are no result)" if args.example else ""))
    if missing:
        print("reproduce_paper.py: warning: the report leaves out what these datasets would add: "
              + "; ".join(f"{DATASETS[k]}: {ADDS[k]}" for k in missing)
              + " (the report's first section says how to fetch them)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
