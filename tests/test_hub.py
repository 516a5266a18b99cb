"""The paper's datasets by their Hub names (data/hub.py, dataset.read_source): every command takes
`hf:OWNER/NAME[/CONFIG][:SPLIT]` where it takes a JSON Lines file, reads it through the Hub's own
client from its cache, and checks its rows as it checks a file's lines.

The cache is laid out by the test (tests/hub_cache.py: blobs, refs/main, snapshots/<commit>, a
dataset card whose YAML header maps configs and splits to Parquet files, the paper's columns) and
read with HF_HUB_OFFLINE=1 (conftest.py): nothing is fetched.
"""
import json

import pytest
from hub_cache import (
    DISCOVERY,
    EVAL_SET,
    FIXTURES,
    PREDICTIONS,
    RL_POOL,
    fixture_rows,
    lay_out,
    lay_out_dataset,
    paper_datasets,
    parquet_bytes,
    rl_pool_rows,
)

import eval_set
import forecaster
import metrics
import train_costmodel
import train_grpo
from data import hub
from data.dataset import load_predictions, load_rows, read_source
from data.records import RecordError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hub cache, offline, that the Hub's client reads (its constants are read at import)."""
    from huggingface_hub import constants
    folder = tmp_path / "hub"
    folder.mkdir()
    assert constants.HF_HUB_OFFLINE  # conftest.py: HF_HUB_OFFLINE=1 for the whole run
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))
    return folder


@pytest.fixture
def paper(cache):
    paper_datasets(cache)
    return cache


def without_where(rows):
    return [{k: v for k, v in r.items() if k != "where"} for r in rows]


def test_the_paper_datasets_read_by_name_equal_the_same_rows_read_from_files(paper):
    name, rows = hub.read_rows(f"hf:{EVAL_SET}")
    assert name == f"hf:{EVAL_SET}/combined:eval"  # several configs: `combined` holds every row
    assert [r for _, r in rows] == fixture_rows("paper_eval_rows.jsonl")
    assert load_rows(f"hf:{EVAL_SET}") == load_rows(FIXTURES / "paper_eval_rows.jsonl")
    assert [r["pack"] for r in load_rows(f"hf:{EVAL_SET}/trimul")] == ["trimul"] * 3  # a config; its one split
    # the predictions' list of {bin, p} structs and their nulls come back as the file's JSON does
    hub_preds = load_predictions(f"hf:{PREDICTIONS}", f"hf:{EVAL_SET}", bin_rule="stated")
    file_preds = load_predictions(FIXTURES / "paper_predictions.jsonl", FIXTURES / "paper_eval_rows.jsonl",
                                  bin_rule="stated")
    assert without_where(hub_preds) == without_where(file_preds)
    assert hub_preds[1]["where"] == f"hf:{PREDICTIONS}/combined:predictions row 2"
    assert {r["model"] for r in load_predictions(f"hf:{PREDICTIONS}/brier:predictions", f"hf:{EVAL_SET}")} == {"brier"}
    pairs = load_rows(f"hf:{DISCOVERY}/gpu_mode:pairs")  # the child forecast against its parent
    assert [p["row_id"] for p in pairs] == [p["pair_id"] for p in fixture_rows("paper_discovery_pairs.jsonl")]
    assert [r["row_id"] for r in load_rows(f"hf:{RL_POOL}:train")] == [r["row_id"] for r in rl_pool_rows()]


def test_hub_rows_are_checked_as_file_rows_with_the_same_one_line_errors(cache, tmp_path):
    rows = fixture_rows("paper_eval_rows.jsonl")
    bad = [rows[0], {k: v for k, v in rows[1].items() if k != "candidate_code"}]
    lay_out_dataset(cache, "someone/bad", {"default": {"eval": bad}})
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(RecordError) as from_hub:
        load_rows("hf:someone/bad")
    with pytest.raises(RecordError) as from_file:
        load_rows(path)
    assert str(from_hub.value) == "hf:someone/bad/default:eval row 2: missing field(s) candidate_code; a training " \
                                  "row needs pack, anchor_code, candidate_code, aggregated_speedup"
    assert str(from_file.value) == f"{path}:2" + str(from_hub.value).split("row 2", 1)[1]
    negative = [{**rows[0], "aggregated_speedup": -1.0}]
    lay_out_dataset(cache, "someone/negative", {"default": {"eval": negative}})
    with pytest.raises(RecordError, match=r"^hf:someone/negative/default:eval row 1: aggregated_speedup: "):
        load_rows("hf:someone/negative")
    preds = [{**fixture_rows("paper_predictions.jsonl")[0], "bin_probabilities": [{"bin": 1, "p": 1.0}]}]
    lay_out_dataset(cache, "someone/preds", {"p": {"predictions": preds}})
    with pytest.raises(RecordError, match="row 1: bin_probabilities must give each of bins 1..8"):
        load_predictions("hf:someone/preds", FIXTURES / "paper_eval_rows.jsonl")


def test_configs_and_splits_are_chosen_as_named_else_the_only_default_or_combined_one(cache):
    rows = fixture_rows("paper_eval_rows.jsonl")
    lay_out_dataset(cache, "o/two", {"a": {"eval": rows[:1], "test": rows[1:2]}, "b": {"eval": rows[2:]}})
    with pytest.raises(RecordError, match=r"^hf:o/two: name a config, one of a, b \(hf:OWNER/NAME/CONFIG:SPLIT\)$"):
        hub.read_rows("hf:o/two")
    with pytest.raises(RecordError, match=r"^hf:o/two/a: name a split in config 'a', one of eval, test"):
        hub.read_rows("hf:o/two/a")
    with pytest.raises(RecordError, match=r"^hf:o/two/c: no config 'c'; there are a, b$"):
        hub.read_rows("hf:o/two/c")
    with pytest.raises(RecordError, match=r"^hf:o/two/a:train: no split 'train' in config 'a'; there are eval, test$"):
        hub.read_rows("hf:o/two/a:train")
    assert [r["comparison_id"] for _, r in hub.read_rows("hf:o/two/a:test")[1]] == ["e2"]
    assert hub.read_rows("hf:o/two/b")[0] == "hf:o/two/b:eval"
    # a card that marks a default config
    lay_out(cache, "o/marked", {"x/eval-0.parquet": parquet_bytes(rows[:1]), "y/eval-0.parquet": parquet_bytes(rows),
                                "README.md": "---\nconfigs:\n- config_name: x\n  data_files: x/*.parquet\n"
                                             "- config_name: y\n  default: true\n  data_files:\n    eval: y/*.parquet\n---\n"})
    assert hub.read_rows("hf:o/marked")[0] == "hf:o/marked/y:eval" and len(hub.read_rows("hf:o/marked")[1]) == 4
    assert hub.read_rows("hf:o/marked/x")[0] == "hf:o/marked/x:train"  # a bare pattern is split train
    # no card: the data files by convention, the split the first word of the file name, JSON Lines too
    lay_out(cache, "o/bare", {"data/train-00000-of-00001.parquet": parquet_bytes(rows[:3]),
                              "data/test.jsonl": json.dumps(rows[3]) + "\n"})
    assert len(hub.read_rows("hf:o/bare:train")[1]) == 3
    assert hub.read_rows("hf:o/bare:test")[1] == [(1, rows[3])]
    for name in ("hf:nobody", "hf:a/b/c/d", "hf:a/b:c:d"):
        with pytest.raises(RecordError, match=r"not a dataset name; write hf:OWNER/NAME\[/CONFIG\]\[:SPLIT\]"):
            hub.read_rows(name)


def test_offline_without_the_cache_the_error_is_one_line_naming_the_command_that_fills_it(cache, tmp_path, capsys):
    with pytest.raises(RecordError) as e:
        read_source(f"hf:{EVAL_SET}")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"hf:{EVAL_SET}: not in the Hugging Face cache ({cache})")
    assert f"`hf download {EVAL_SET} --repo-type dataset`" in msg and "HF_HUB_OFFLINE" in msg
    assert metrics.main([f"hf:{PREDICTIONS}", "--rows", f"hf:{EVAL_SET}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"hf download {EVAL_SET} --repo-type dataset" in err  # --rows is read first
    # the card is cached but not the config's files (a download cut short with --include)
    lay_out(cache, "o/partial", {"README.md": "---\nconfigs:\n- config_name: combined\n  data_files:\n"
                                              "  - split: eval\n    path: combined/eval-*\n---\n"})
    with pytest.raises(RecordError, match=r"^hf:o/partial/combined:eval: the cached copy has no file for it "
                                          r"\(combined/eval-\*\); run `hf download o/partial --repo-type dataset`$"):
        read_source("hf:o/partial")


def test_every_command_reads_hub_names(paper, tmp_path, capsys):
    # metrics.py: the published predictions joined with the eval set, both by name, as from files
    assert metrics.main([f"hf:{PREDICTIONS}", "--rows", f"hf:{EVAL_SET}", "--protocol", "paper", "--json"]) == 0
    from_hub = json.loads(capsys.readouterr().out)
    assert metrics.main([str(FIXTURES / "paper_predictions.jsonl"), "--rows", str(FIXTURES / "paper_eval_rows.jsonl"),
                         "--protocol", "paper", "--json"]) == 0
    assert from_hub == json.loads(capsys.readouterr().out)
    # train_costmodel.py on the RL pool, then forecaster.py --eval on the eval set and the discovery pairs
    model = tmp_path / "cm"
    assert train_costmodel.main(["--data", f"hf:{RL_POOL}", "--out", str(model)]) == 0
    assert "trained on 9 rows of cross_entropy, trimul" in capsys.readouterr().out
    preds = tmp_path / "preds.jsonl"
    assert forecaster.main(["--eval", f"hf:{EVAL_SET}", "--costmodel", str(model), "--out", str(preds)]) == 0
    assert sorted(r["id"] for r in load_predictions(preds)) == ["e1", "e2", "e3", "e4"]
    disc = tmp_path / "disc.jsonl"
    assert forecaster.main(["--eval", f"hf:{DISCOVERY}", "--costmodel", str(model), "--out", str(disc)]) == 0
    assert metrics.main([str(disc), "--discovery", "0.5"]) == 0
    assert "(2 of 5 pairs)" in capsys.readouterr().out
    # train_grpo.py: the rows are read (and checked) before any model loads
    assert train_grpo.main(["--data", f"hf:{RL_POOL}", "--out", str(tmp_path / "g"),
                            "--holdout-task", "gdn_chunk_fwd_o"]) == 2
    assert "tasks in the data: cross_entropy, trimul" in capsys.readouterr().err
    assert train_grpo.main(["--data", f"hf:{RL_POOL}:test", "--out", str(tmp_path / "g")]) == 2
    assert f"hf:{RL_POOL}:test: no split 'test' in config 'combined'" in capsys.readouterr().err
    # eval_set.py: the pool's rows against the seed are measured kernels; a child over its parent is not
    assert eval_set.main([f"hf:{RL_POOL}", "--out", str(tmp_path / "es"), "--per-bin", "1"]) == 0
    kernels = [json.loads(x) for x in (tmp_path / "es" / "kernels.jsonl").read_text().splitlines()]
    pool = rl_pool_rows()
    assert sorted(k["code"] for k in kernels if not k["is_seed"]) == sorted(
        r["candidate_code"] for r in pool if r["pair_type"] == "seed")
    assert {(k["task"], k["speedup"]) for k in kernels if k["is_seed"]} == {("cross_entropy", 1.0), ("trimul", 1.0)}
    assert {k["kernel_id"].split("/pool-")[0] for k in kernels if not k["is_seed"]} == {RL_POOL}
