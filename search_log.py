"""search_log.py: what a search leaves on disk (docs/PAPER.md §1, §7).

search.py decides; this module remembers. Two kinds of files come out of a search:

  The event log (events.jsonl). Every expensive request (a mutation, a forecast, a measurement)
  and its result is one JSON line, appended, flushed and fsynced before the search goes on, as in
  the paper's search. It is the search's memory: a rerun replays the search from the start and
  answers each request from the log, so a crash or Ctrl-C loses at most the request in flight.
  Its first event holds the search's options; a rerun with other options is refused.
  A corrupt last line (a write torn by the crash) is dropped; a corrupt line anywhere else means
  the file was damaged, and we refuse rather than guess.

  The run outputs, rewritten atomically after every step so a crash never leaves half a file:
    archive.json         the PUCT tree of measured kernels (puct.Archive.to_dict())
    best_kernel.py       the fastest kernel found
    summary.json         counts, times and the best-speedup-vs-measurements curve
    training_rows.jsonl  every successful measurement as a training row in the paper's RL-pool
                         schema (row_id, pack, anchor_code, candidate_code, aggregated_speedup,
                         relative_bin, hardware, pair_type, source_id). This is how the loop
                         closes: train_grpo.py trains the forecaster on the search's measurements,
                         and the trained forecaster gates the next search.
    best_speedup.png     that curve; with --compare, compare.png and compare.json put the gated
                         and the ungated search side by side (the paper's Figure 4).
"""
import json
import os
import sys
import time
from pathlib import Path

import bins


class SearchError(Exception):
    """A problem the user can fix; search.py's main() prints it as one line. Defined here because
    the event log raises it too."""


# ---- the event log ----------------------------------------------------------------------------

class EventLog:
    """Append-only JSON Lines log: one event (kind, step, request_id, parent_id, payload, time) per
    line, flushed and fsynced before we go on.

    Reading drops a corrupt last line (the write a crash interrupted) and truncates the file to
    the last good line, so the next append starts on a clean line. A corrupt line anywhere else
    means the file was edited or damaged: refuse rather than guess.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.events = []
        if self.path.exists():
            raw, keep, pos = self.path.read_bytes(), 0, 0
            for i, line in enumerate(raw.split(b"\n")):
                end = pos + len(line)
                if line.strip():
                    try:
                        self.events.append(json.loads(line))
                    except ValueError:
                        if raw[end:].strip():
                            raise SearchError(f"{self.path} line {i + 1} is corrupt; delete the file "
                                              "or pass a new --out to start afresh")
                        break
                keep, pos = min(end + 1, len(raw)), end + 1
            with open(self.path, "r+b") as f:  # cut a torn tail; end on a newline
                f.truncate(keep)
                if keep and raw[keep - 1:keep] != b"\n":
                    f.seek(0, 2)
                    f.write(b"\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")

    def append(self, kind, step, request_id, parent_id, payload):
        event = dict(kind=kind, step=step, request_id=request_id, parent_id=parent_id,
                     payload=payload, time=time.time())
        self._file.write(json.dumps(event, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.events.append(event)
        return event

    def claim(self, config):
        """Log this search's options, or check them against those already logged: one log holds
        one search. Returns True when it already did (the rerun resumes it)."""
        mine = json.loads(json.dumps(config))
        old = next((e["payload"] for e in self.events if e["kind"] == "config"), None)
        if old is None:
            self.append("config", None, "config", None, mine)
            return False
        for k in list(mine) + [k for k in old if k not in mine]:  # task, gate, seed first
            if old.get(k) != mine.get(k):
                raise SearchError(f"{self.path.parent} holds a run with {k}={old.get(k)!r}, but this command "
                                  f"asks for {k}={mine.get(k)!r}; rerun with the same options or pass a new --out")
        return True

    def results(self):
        """{(kind, request_id): payload} of every logged result: what a replay answers from."""
        return {(e["kind"], e["request_id"]): e["payload"] for e in self.events if e["kind"] != "request"}

    def close(self):
        self._file.close()


# ---- the run outputs --------------------------------------------------------------------------

def write_atomic(path, text):
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one


def training_row(task, run, node_id, anchor_code, code, measurement, pair_type):
    """One measured kernel as a training row of the forecaster (the paper's RL-pool schema). The
    anchor is the task's seed, the reference the forecaster compares against."""
    s = measurement["speedup"]
    return {"row_id": f"{run}/{node_id}", "pack": task, "anchor_code": anchor_code, "candidate_code": code, "aggregated_speedup": s,
            "relative_bin": bins.speedup_to_bin(s), "hardware": measurement.get("device", ""),
            "pair_type": pair_type, "source_id": f"search:{run}:{node_id}"}


def write_outputs(out, archive, summary, rows, curve=None, title=""):
    """Rewrite the run's outputs in `out`; draw best_speedup.png when a curve is given."""
    out = Path(out)
    write_atomic(out / "archive.json", json.dumps(archive.to_dict(), indent=1))
    write_atomic(out / "best_kernel.py", archive.best().code)
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    write_atomic(out / "training_rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    if curve is not None:
        plot_curves({f"{summary['gate']} gate": curve}, out / "best_speedup.png", title)


def write_compare(out, results, task):
    """compare.json and compare.png of a --compare run: {arm: summary} of the gated and the
    ungated search with the same budget."""
    out = Path(out)
    plot_curves({f"{arm} ({s['gate']})": s["best_vs_measurements"] for arm, s in results.items()},
                out / "compare.png", f"{task}: gated vs ungated search, same budget")
    write_atomic(out / "compare.json", json.dumps(results, indent=1))


def plot_curves(curves, path, title):
    """Best speedup against measurements spent, one step line per search."""
    try:
        import matplotlib
    except ImportError:  # a bare GPU machine may lack it; the curve is also in summary.json
        print(f"matplotlib is not installed: {path} not drawn (pip install matplotlib)", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        xs, ys = zip(*curve)
        ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel("measurements (seed excluded)")
    ax.set_ylabel("best speedup over reference (x)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = Path(f"{path}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
