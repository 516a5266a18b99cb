"""plots.py: the project's pictures, in the paper's spirit.

For a forecaster (`python metrics.py PRED.jsonl --plots DIR`), three PNGs:
- reliability diagram: accuracy against stated confidence (max-prob) in 10 equal-width buckets,
  with each bucket's row count, the diagonal being perfect calibration;
- risk-coverage: one curve per confidence score (max-prob, negative entropy, top-2 margin) with
  its AURC, by the definition of the table metrics.py prints beside it (--protocol); a good
  selective forecaster keeps risk low while it trusts most rows;
- speedup recovered against the measurement budget, with the exact random-ranking baseline.
scripts/reproduce_paper.py adds the paper protocol's risk-coverage curves of several forecasters
in one PNG (plot_paper_risk_coverage) and the discovery moments' precision-recall curve
(plot_precision_recall).
For a search (search.py), best speedup against measurements spent: best_speedup.png, and with
--compare the gated and the ungated search side by side (compare.png, the paper's Figure 4).
scripts/calibration_demo.py draws its three rewards side by side with plot_reliability_panels.
matplotlib runs headless (Agg); the modules that draw import this one only when they draw.
"""
import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import paper_protocol  # noqa: E402
from bins import CONFIDENCE_KINDS, hit  # noqa: E402
from data.records import write_atomic  # noqa: E402
from selective import aurc, ece, reliability, risk_coverage, row_confidence  # noqa: E402


def _save(fig, path):
    """Write the figure as a PNG atomically (a viewer never opens half a file) and close it."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def _slug(name):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "forecaster"


def plot_reliability(rows, path, title=""):
    fig, ax = plt.subplots(figsize=(5.5, 5))
    draw_reliability(ax, rows, title)
    _save(fig, path)


def plot_reliability_panels(groups, path):
    """One reliability diagram per forecaster, side by side in one PNG: {title: rows}."""
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 5), squeeze=False)
    for ax, (title, rows) in zip(axes[0], groups.items()):
        draw_reliability(ax, rows, title)
    _save(fig, path)


def draw_reliability(ax, rows, title=""):
    parsed = [r for r in rows if r["probs"] is not None]
    confs = [row_confidence(r) for r in parsed]
    hits = [hit(r["predicted_bin"], r["true_bin"]) for r in parsed]
    filled = [(i, n, conf, acc) for i, (n, conf, acc) in enumerate(reliability(confs, hits)) if n]
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="perfect calibration")
    ax.bar([i / 10 for i, *_ in filled], [a for *_, a in filled], width=0.1, align="edge",
           color="tab:blue", alpha=0.75, edgecolor="black", label="accuracy of bucket")
    ax.plot([i / 10 + 0.05 for i, *_ in filled], [c for _, _, c, _ in filled], "_", ms=14, mew=2,
            color="tab:red", label="mean confidence of bucket")
    for i, n, _, acc in filled:
        ax.text(i / 10 + 0.05, min(acc, 0.93) + 0.02, f"n={n}", ha="center", fontsize=7)
    calibration_error = ece(confs, hits)
    ax.set(xlim=(0, 1), ylim=(0, 1.05), xlabel="confidence p[predicted bin]", ylabel="accuracy",
           title=title if calibration_error is None
           else f"{title}\nreliability (ECE {calibration_error:.3f})")
    ax.legend(loc="upper left", fontsize=8)


# beyond 0 and 1 too: a forecaster that is never wrong (AURC 0) draws its curve on the x axis, and
# one whose confidences are all equal a single point at coverage 1, which the axes would hide
RISK_LIMITS, COVERAGE_LIMITS = (-0.04, 1.02), (-0.02, 1.03)


def plot_risk_coverage(rows, path, title="", protocol="ours"):
    """The risk-coverage curve of each confidence score and its AURC, by the protocol's definition,
    the one metrics.py's table gives beside it: this project's (selective.aurc: the curve extended
    flat to coverage 0) or, with protocol "paper", the original's (paper_protocol.aurc: the
    covered range only). The two differ, by much on a few rows."""
    import paper_protocol
    correct = [r["probs"] is not None and hit(r["predicted_bin"], r["true_bin"]) for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for kind in CONFIDENCE_KINDS:
        if protocol == "paper":
            points = sorted((c, r) for _, c, r in paper_protocol.curve(rows, kind) if r is not None)
            cov, risk = [c for c, _ in points], [r for _, r in points]
            area = paper_protocol.aurc(paper_protocol.curve(rows, kind))
        else:
            confs = [row_confidence(r, kind) for r in rows]
            _, cov, risk = risk_coverage(confs, correct)
            area = aurc(confs, correct)
        if len(cov):
            ax.plot(cov, risk, marker="o", ms=3,  # straight segments: the trapezoid AURC integrates
                    label=f"{kind} (AURC {'-' if area is None else f'{area:.3f}'})")
    which = "the original's AURC (--protocol paper)" if protocol == "paper" else "this project's AURC"
    ax.set(xlim=COVERAGE_LIMITS, ylim=RISK_LIMITS, xlabel="coverage (trusted / all rows)",
           ylabel="risk (bin mismatch among trusted)", title=f"{title}\nrisk-coverage, {which}")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_speedup_recovered(reports, path):
    fig, ax = plt.subplots(figsize=(6, 4.5))
    drawn = []  # random baselines already drawn: forecasters scored on the same pools share one
    for i, (name, rep) in enumerate(reports.items()):
        sr = rep["speedup_recovered"]
        if not sr:
            continue
        budgets = [float(b.rstrip("%")) for b in sr["by_budget"]]
        color = f"C{i % 10}"
        ax.plot(budgets, list(sr["by_budget"].values()), "o-", color=color,
                label=f"{name} (mean {sr['mean']:.3f})")
        random = list(sr["random_by_budget"].values())
        if random not in drawn:
            drawn.append(random)
            ax.plot(budgets, random, "x--", color="grey" if len(drawn) == 1 else color,
                    label=f"random ranking, exact (mean {sr['random_mean']:.3f})")
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 5, 10, 20, 50], ["1%", "2%", "5%", "10%", "20%", "50%"])
    ax.set(ylim=(0, 1.02), xlabel="measurement budget (top b% of each task's pool)",
           ylabel="best found / best in pool", title="speedup recovered")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_paper_risk_coverage(groups, path):
    """The paper protocol's risk-coverage curve of each forecaster in one PNG ({name: rows}, the
    rows read with the stated bin scored): paper_protocol.curve, max-prob = p[stated bin], bin
    mismatch; its AURC spans the covered range only (paper_protocol.aurc)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for name, rows in groups.items():
        points = [(c, r) for _, c, r in paper_protocol.curve(rows) if r is not None]
        if points:
            area = paper_protocol.aurc(paper_protocol.curve(rows))
            cov, risk = zip(*sorted(points))
            ax.plot(cov, risk, marker="o", ms=4, label=f"{name} (AURC {area:.3f})" if area is not None else name)
    ax.set(xlim=COVERAGE_LIMITS, ylim=RISK_LIMITS, xlabel="coverage (trusted / all rows)",
           ylabel="risk (stated bin wrong among trusted)", title="risk-coverage (the paper's protocol, max-prob)")
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_precision_recall(discovery, path, title="discovery moments"):
    """Precision against recall of flagging P(child >= 1.414x parent) >= tau over tau
    (metrics.discovery_moments' curve), with the base rate: the precision of flagging every pair."""
    pts = [(c["recall"], c["precision"]) for c in discovery["curve"] if c["precision"] is not None]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    if pts:
        ax.plot(*zip(*pts), "o-", ms=3, label="forecast")
    ax.axhline(discovery["base_rate"], ls="--", color="grey", label=f"base rate {discovery['base_rate']:.3f}")
    ax.set(xlim=(0, 1.02), ylim=(0, 1.02), xlabel="recall", ylabel="precision", title=title)
    ax.legend(fontsize=8)
    _save(fig, path)


def write_plots(groups, reports, folder, protocol="ours"):
    """groups: {forecaster: rows}; reports: {forecaster: metrics.report(rows)}; protocol: whose AURC
    the risk-coverage plots give (the table's). Returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in groups.items():
        paths.append(folder / f"{_slug(name)}_reliability.png")
        plot_reliability(rows, paths[-1], title=name)
        paths.append(folder / f"{_slug(name)}_risk_coverage.png")
        plot_risk_coverage(rows, paths[-1], title=name, protocol=protocol)
    paths.append(folder / "speedup_recovered.png")
    plot_speedup_recovered(reports, paths[-1])
    return paths


# ---- a search -------------------------------------------------------------------------------------

def plot_curves(curves, path, title):
    """Best speedup against measurements spent, one step line per search ({label: [(x, y)]})."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        xs, ys = zip(*curve)
        ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel("measurements (seed excluded)")
    ax.set_ylabel("best speedup over reference (x)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)
