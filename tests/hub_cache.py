"""A Hugging Face Hub cache laid out by a test, holding small datasets of the paper's schemas.

The layout is the Hub client's own (huggingface_hub; `hf download OWNER/NAME --repo-type dataset`
fills it so):

    HF_HUB_CACHE/datasets--OWNER--NAME/
        blobs/<sha256 of the file>                      the files' bytes
        refs/main                                       the commit the branch points at
        snapshots/<commit>/README.md -> ../../blobs/..  the dataset card
        snapshots/<commit>/<config>/<split>-00000-of-00001.parquet -> ../../../blobs/...

and each dataset card's YAML header maps a config's splits to its Parquet files, as the paper's
cards do (`configs: - config_name: combined, data_files: - split: eval, path: combined/eval-*`;
`datasets`' push_to_hub writes that layout). The tests read it with HF_HUB_OFFLINE=1 (conftest.py
sets it for the whole run): nothing is fetched.

paper_datasets(cache) lays out the paper's four datasets (docs/PAPER.md §10) with the columns of
their published cards, small: the eval set and predictions of tests/fixtures (a `combined` config
and one per task or forecaster), its RL pool of training rows, and the discovery pairs of
tests/fixtures (`combined`, `gpu_mode`, `kernelbench_l3`).
"""
import hashlib
import io
import json
import os
from pathlib import Path


FIXTURES = Path(__file__).resolve().parent / "fixtures"
EVAL_SET = "codezakh/gpu-forecasters-eval-set"
PREDICTIONS = "codezakh/gpu-forecasters-eval-set-predictions"
RL_POOL = "codezakh/gpu-forecasters-rl-training-pool"
DISCOVERY = "codezakh/gpu-forecasters-discovery-pairs"


def fixture_rows(name):
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def parquet_bytes(rows):
    import pyarrow as pa
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def card(configs):
    """A dataset card whose YAML header lists each config's splits and their files."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        for split in splits:
            lines += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    return "\n".join(lines + ["---", "", "A dataset laid out by a test.", ""])


def lay_out(cache, repo, files, commit=None):
    """Write `files` ({path in the repo: bytes or text}) as a cached snapshot of dataset `repo`
    at `commit` (default: a hash of the files), with refs/main pointing at it. The snapshot's
    folder."""
    folder = Path(cache) / ("datasets--" + repo.replace("/", "--"))
    data = {p: b.encode() if isinstance(b, str) else b for p, b in files.items()}
    commit = commit or hashlib.sha1(b"".join(p.encode() + b for p, b in sorted(data.items()))).hexdigest()
    snapshot = folder / "snapshots" / commit
    for path, content in data.items():
        blob = folder / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return snapshot


def lay_out_dataset(cache, repo, configs, with_card=True):
    """configs: {config: {split: rows}} as Parquet files, `{config}/{split}-00000-of-00001.parquet`,
    and a card that lists them (with_card=False: the files alone)."""
    files = {f"{config}/{split}-00000-of-00001.parquet": parquet_bytes(rows)
             for config, splits in configs.items() for split, rows in splits.items()}
    if with_card:
        files["README.md"] = card(configs)
    return lay_out(cache, repo, files)


def by(rows, key):
    out = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def rl_pool_rows():
    """Training rows in the RL pool's published columns (tests/fixtures/paper_rl_pool.jsonl): 9 of
    them over two tasks, with code that differs from row to row (a cost model needs distinct
    candidates); rows of pair_type seed are kernels against the task's seed, rows of parent_edit a
    child against its parent (the row before it), as the paper's pool holds them."""
    return fixture_rows("paper_rl_pool.jsonl")


def paper_datasets(cache):
    """The paper's four datasets, small, in the Hub cache `cache`; {repo: snapshot folder}."""
    evals = fixture_rows("paper_eval_rows.jsonl")
    preds = fixture_rows("paper_predictions.jsonl")
    pool = rl_pool_rows()
    pairs = fixture_rows("paper_discovery_pairs.jsonl")
    return {
        EVAL_SET: lay_out_dataset(cache, EVAL_SET, {"combined": {"eval": evals},
                                                    **{p: {"eval": rs} for p, rs in by(evals, "pack").items()}}),
        PREDICTIONS: lay_out_dataset(cache, PREDICTIONS, {
            "combined": {"predictions": preds},
            **{label: {"predictions": rs} for label, rs in by(preds, "surrogate_label").items()}}),
        RL_POOL: lay_out_dataset(cache, RL_POOL, {"combined": {"train": pool},
                                                  **{p: {"train": rs} for p, rs in by(pool, "pack").items()}}),
        DISCOVERY: lay_out_dataset(cache, DISCOVERY, {
            "combined": {"pairs": pairs},
            **{f: {"pairs": rs} for f, rs in by(pairs, "benchmark_family").items()}}),
    }
