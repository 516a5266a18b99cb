"""Tests for records.py: the cache root, atomic writes, JSON Lines with a torn last line, the event
log."""
import json
from pathlib import Path

import pytest
from test_search import run

from data.records import EventLog, RecordError, cache_dir, read_jsonl, write_atomic


def test_cache_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPU_FORECASTERS_CACHE", str(tmp_path))
    assert cache_dir("forecasts") == tmp_path / "forecasts"
    monkeypatch.delenv("GPU_FORECASTERS_CACHE")
    assert cache_dir("x") == Path.home() / ".cache" / "gpu-forecasters" / "x"


def test_write_atomic_replaces_whole_files_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "new" / "folder" / "a.json"
    write_atomic(path, "one")
    write_atomic(path, "two")
    assert path.read_text() == "two"
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.json", "b.bin"]


def test_read_jsonl_refuses_a_corrupt_line_naming_it(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": \n{"a": 4}\n')
    with pytest.raises(RecordError, match=r"x.jsonl:4: not valid JSON .*; fix or delete this line"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(RecordError, match="x.jsonl:2: expected one JSON object per line"):
        read_jsonl(path)
    with pytest.raises(RecordError, match="cannot read the file"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_read_jsonl_cuts_a_torn_last_line_only_when_asked(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3, "b"')  # the write a crash interrupted
    with pytest.raises(RecordError, match="x.jsonl:4"):
        read_jsonl(path)
    assert read_jsonl(path, cut_torn_tail=True) == [(1, {"a": 1}), (3, {"a": 2})]
    assert path.read_text() == '{"a": 1}\n\n{"a": 2}\n'  # the next append starts on a clean line
    path.write_text('{"a": 1}\n{"a": 2}')  # a good last line without its newline gets one
    assert [r for _, r in read_jsonl(path, cut_torn_tail=True)] == [{"a": 1}, {"a": 2}]
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')  # a corrupt line that is not the last: refuse
    with pytest.raises(RecordError, match="x.jsonl:2"):
        read_jsonl(path, cut_torn_tail=True)
    assert path.read_text() == '{"a": 1}\n{"a": \n{"a": 3}\n'  # and leave the file as it was


def test_event_log_appends_and_reopens(tmp_path):
    log = EventLog(tmp_path / "run" / "events.jsonl")
    log.append("request", 0, "r1", None, {"what": "measurement"})
    log.append("measurement", 0, "r1", None, {"speedup": 1.5})
    log.close()
    with open(tmp_path / "run" / "events.jsonl", "a") as f:
        f.write('{"kind": "measurement", "st')  # torn by a crash
    again = EventLog(tmp_path / "run" / "events.jsonl")
    assert [(e["kind"], e["payload"]) for e in again.events] == [
        ("request", {"what": "measurement"}), ("measurement", {"speedup": 1.5})]
    again.append("step", 0, "step0", None, {})
    again.close()
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["request", "measurement", "step"]


def test_event_log_answers_a_rerun_from_its_results(tmp_path):
    calls = []

    def work():
        calls.append(1)
        return {"speedup": 2.0}
    log = EventLog(tmp_path / "events.jsonl")
    assert log.call("measurement", "c1", 0, "seed", work) == {"speedup": 2.0}
    log.note("step", "step0", 0, None, {"best": 2.0})
    log.close()
    again = EventLog(tmp_path / "events.jsonl")  # the rerun: the result comes from the log
    assert again.call("measurement", "c1", 0, "seed", work) == {"speedup": 2.0} and len(calls) == 1
    again.note("step", "step0", 0, None, {"best": 2.0})  # derived the same again: not rewritten
    again.close()
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert kinds == ["request", "measurement", "step"]


def test_corrupt_middle_line_is_refused(tmp_path):
    run(tmp_path, budget=2)
    log = tmp_path / "run" / "events.jsonl"
    lines = log.read_text().splitlines()
    lines[1] = lines[1][:10]
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match="events.jsonl:2: not valid JSON"):
        EventLog(log)
