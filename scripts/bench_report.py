"""Benchmark: the size of a search's report (report.py) and how long a browser takes to draw it.

A search of the paper's size, 320 measurements (topk: 16 mutations forecast per parent, 4 measured,
2 parents a step, with --audit 0.25), runs here with stand-ins that write what a language-model
search writes into its log: LLM-sized kernels (the task's hand-written kernels, edited), a
mutator's prompt and answers with a few KB of reasoning each, a forecaster's raw answers, real
measure.py-shaped measurements with per-case noise. No GPU, no model, no real measurement: the
log is the workload. Then it writes the page (report.write_report), prints its size and the time
to build it, and opens it in headless Chromium several times, printing the time from navigation
to the page's ready mark (the page's code sets it when every chart is drawn) and how much of it
was plotly.js alone (parsing and running its 4.8 MB: the floor of any page that inlines it). The
machine it ran on, and its load, head the output.

    python scripts/bench_report.py [--budget 320] [--loads 5] [--out DIR] [--compare]

--compare draws two such searches on one page (search.py --compare). Needs Debian's chromium and
chromium-driver (README) and selenium for the browser part; without them it reports the size only.
"""
import argparse
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import report  # noqa: E402
from forecast_answer import Forecast  # noqa: E402
from models.forecaster_backends import Completion  # noqa: E402
from mutators import LLMMutator, set_tunable, tunables  # noqa: E402
from runtime.measure_pool import MeasurePool  # noqa: E402
from search import Args, Search  # noqa: E402

WORDS = re.findall(r"[a-z]{3,}", " ".join(p.read_text().lower() for p in sorted((ROOT / "docs").glob("*.md"))))
KERNELS = [p.read_text() for p in sorted((ROOT / "tasks" / "kernels").glob("*/*.py")) if p.stat().st_size > 2500]


def prose(rng, chars):
    out, n = [], 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


class Backend:
    """A language model's generate() as the mutator calls it: a few KB of reasoning, then the
    parent's kernel edited (a tune constant, some lines rewritten) or one of the task's kernels."""

    def generate(self, chats, *, max_new_tokens, temperature, seed, **kw):
        rng = random.Random(seed)
        parent = re.search(r"```python\n(.*?)```", chats[0][-1]["content"], re.S).group(1)
        out = []
        for _ in chats:
            code = parent if rng.random() < 0.8 else rng.choice(KERNELS)
            tunes = tunables(code)
            if tunes:
                name = rng.choice(sorted(tunes))
                code = set_tunable(code, name, rng.choice(tunes[name][1]))
            lines = code.splitlines()
            for _ in range(rng.randint(3, 12)):
                at = rng.randrange(len(lines))
                lines.insert(at, " " * (len(lines[at]) - len(lines[at].lstrip())) + "# " + prose(rng, rng.randint(30, 90)))
            code = "\n".join(lines) + "\n"
            text = (f"<|channel|>analysis<|message|>{prose(rng, rng.randint(2000, 6000))}<|end|>"
                    f"<|start|>assistant<|channel|>final<|message|>Here is the kernel.\n```python\n{code}```")
            out.append(Completion(text, tokens_in=3000 + len(parent) // 3, tokens_out=len(text) // 4, seconds=20.0))
        return out


class Forecaster:
    """Forecasts with a verbalized answer's raw text (reasoning and the tool call)."""

    def forecast_many(self, task, reference, codes):
        out = []
        for code in codes:
            rng = random.Random(code)
            probs = [rng.random() ** 3 for _ in range(8)]
            probs = [p / sum(probs) for p in probs]
            raw = (f"<|channel|>analysis<|message|>{prose(rng, rng.randint(1500, 4000))}<|end|><|start|>assistant"
                   f'<|channel|>commentary to=functions.forecast<|message|>{{"predicted_bin": 4, "reasoning": "..."}}')
            out.append(Forecast(probs=probs, predicted_bin=probs.index(max(probs)) + 1, reasoning=raw[:2000],
                                tokens_in=3500, tokens_out=len(raw) // 4, raw=raw, model="gpt-oss-20b"))
        return out


class Measurement:
    def __init__(self, d):
        self.d, self.status, self.speedup = d, d["status"], d["speedup"]

    def to_dict(self):
        return self.d


def measure(task, source, **kw):
    """A measure.py-shaped result: a speedup that follows the code's hash, three cases with noise."""
    rng = random.Random(source)
    if rng.random() < 0.15:
        return Measurement(dict(task=task, status="incorrect", speedup=None, noise=None, cases=[], flags=[],
                                message="mismatch at [3, 17]: expected 0.51, got 0.49 (rtol 1e-2)", device="H200"))
    s = 2 ** rng.gauss(0.3, 0.6)
    cases = [dict(case={"B": b, "V": 128256}, reference_ms=0.1 * b, candidate_ms=0.1 * b / s, speedup=s,
                  noise=rng.uniform(0.005, 0.03), flags=[]) for b in (1, 8, 64)]
    return Measurement(dict(task=task, status="ok", speedup=s, noise=rng.uniform(0.004, 0.02), cases=cases, flags=[],
                            message="", device="NVIDIA H200", timer="CUDA events, L2 flushed"))


def search(out, gate, budget):
    args = Args(task="cross_entropy", gate=gate, budget=budget, steps=budget, parents=2,
                mutations=16 if gate != "none" else 4, measure_per_parent=4, scale="benchmark", mutator="llm",
                audit=0.25 if gate != "none" else 0.0)
    seed = (ROOT / "tasks" / "kernels" / "cross_entropy" / "chunked.py").read_text()
    with MeasurePool(["cpu"], measure_fn=measure) as pool:
        Search(args, out, seed_code=seed, mutator=LLMMutator(Backend(), "cross-entropy"), pool=pool,
               forecaster=Forecaster() if gate != "none" else None, forecaster_name="stand-in",
               progress=False, say=lambda *a: None).run()


def browser_times(page, loads):
    """[(ready ms, plotly.js ms, every chart ms)] of `loads` fresh loads in headless Chromium: the
    first screen drawn (the page's ready mark), plotly.js parsed and run, and the charts below the
    first screen drawn too once scrolled to (the page draws them as they come into view)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
              f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        out = []
        for k in range(loads):
            driver.get(page.resolve().as_uri() + f"?load={k}")
            t = time.time()
            while not driver.execute_script("return document.body.dataset.ready") and time.time() - t < 60:
                time.sleep(0.02)
            ready = float(driver.execute_script("return document.body.dataset.ready"))
            plotly = driver.execute_script("return performance.getEntriesByType('navigation')[0].domInteractive")
            driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
            while driver.execute_script("return document.body.dataset.pending") != "0" and time.time() - t < 60:
                time.sleep(0.01)
            out.append((ready, plotly, driver.execute_script("return performance.now()")))
        return out
    finally:
        driver.quit()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budget", type=int, default=320, help="measurements of the search (default 320, the paper's)")
    p.add_argument("--loads", type=int, default=5, help="fresh loads of the page in the browser (default 5)")
    p.add_argument("--compare", action="store_true", help="a gated and an ungated search on one page")
    p.add_argument("--out", help="keep the runs and the page here (default: a temporary folder)")
    a = p.parse_args()
    where = Path(a.out) if a.out else Path(tempfile.mkdtemp())
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"python {platform.python_version()}")
    t = time.time()
    runs = [where / "gated"] + ([where / "ungated"] if a.compare else [])
    for run in runs:
        shutil.rmtree(run, ignore_errors=True)
        search(run, "topk" if run.name == "gated" else "none", a.budget)
    print(f"searched with stand-ins in {time.time() - t:.1f} s; events.jsonl "
          + ", ".join(f"{(r / 'events.jsonl').stat().st_size / 1e6:.1f} MB" for r in runs))
    t = time.time()
    page = report.write_report(runs, where / "report.html")
    views = [report.build_run(r) for r in runs]
    print(f"page: {page.stat().st_size / 1e6:.2f} MB ({len(report.render_page({}, '')) / 1e6:.2f} MB of it the "
          f"frame and plotly.js), {sum(len(v['nodes']) for v in views)} nodes, written in {time.time() - t:.1f} s")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        print("no chromium / chromedriver: the browser part skipped (README: apt-get install chromium chromium-driver)")
        return
    times = browser_times(page, a.loads)
    ready, plotly, every = zip(*times)
    print(f"headless Chromium, {a.loads} loads: first screen drawn in {statistics.median(ready):.0f} ms median "
          f"(min {min(ready):.0f}, max {max(ready):.0f}), of which plotly.js {statistics.median(plotly):.0f} ms; "
          f"every chart drawn (scrolled to the end) {statistics.median(every):.0f} ms")
    if not a.out:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
