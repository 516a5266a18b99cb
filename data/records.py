"""records.py: what the project keeps on disk, written so that a crash never leaves half of it.

Every long command here (a search, an evaluation, a training run, a measurement) may be killed
and rerun, and a rerun must pick up where the last one stopped. Four habits make that safe, and
this module is their one home:

1. The cache root. Measurements, forecasts, converted models and the offline tokenizer
   vocabulary are cached in folders under $GPU_FORECASTERS_CACHE (default
   ~/.cache/gpu-forecasters); cache_dir(name) is the one place that reads the variable.
2. Atomic writes. A file that is rewritten (a cache entry, a search's summary, a plot) goes to a
   temporary file beside it, which os.replace then swaps in: a reader sees the old file or the
   new one, never half of one.
3. JSON Lines. Files that grow (the event log, prediction rows, a training log) hold one JSON
   object per line and are only appended to. A crash can tear the last line; read_jsonl drops
   it on request and cuts it off, so the next append starts on a clean line (read_jsonl_as_is
   drops it and writes nothing: a reader of a run still going). A corrupt line anywhere else means
   the file was damaged, and we refuse rather than guess.
4. The event log of a run: every expensive request and its result, one event per line,
   flushed and fsynced before the run goes on. A rerun replays the run and answers each request
   that has a logged result from the log (search.py is such a run). Requests may run
   concurrently (submit): each result is logged the moment it arrives, whatever thread brings it.

It imports nothing from the project and nothing outside the standard library, so every module,
the trusted measurement harness included, can use it. The rows these files hold (training rows,
prediction rows) are described in dataset.py.
"""
import concurrent.futures
import json
import os
import threading
import time
from pathlib import Path


class RecordError(ValueError):
    """A file cannot be used as it is; the message names the file, the line and the fix."""


# ---- the cache root -------------------------------------------------------------------------------

def cache_dir(name):
    """The cache folder `name` under $GPU_FORECASTERS_CACHE (default ~/.cache/gpu-forecasters)."""
    root = os.environ.get("GPU_FORECASTERS_CACHE") or Path.home() / ".cache" / "gpu-forecasters"
    return Path(root) / name


# ---- atomic writes --------------------------------------------------------------------------------

def write_atomic(path, data):
    """Write text or bytes to `path` so that readers see the old file or the new one, never half
    of one. The temporary file carries the process and thread ids: two processes or threads writing
    the same entry (two searches sharing a cache, two measuring threads) never write into each
    other's temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


# ---- JSON Lines -----------------------------------------------------------------------------------

def read_jsonl(path, *, cut_torn_tail=False, fix="fix or delete this line"):
    """[(line number, object)] for every non-blank line of a JSON Lines file.

    A line that is not a JSON object raises RecordError naming `path:line` and `fix`. With
    cut_torn_tail, a corrupt *last* line (a write torn by a crash) is dropped instead, and the
    file is cut back to its last good line, ending on a newline, so the next append starts clean.
    """
    raw = _read_bytes(path)
    out, good_end, _ = _parse_lines(raw, path, fix, torn_tail_ok=cut_torn_tail)
    if cut_torn_tail and (good_end < len(raw) or (raw and not raw.endswith(b"\n"))):
        with open(path, "r+b") as f:
            f.truncate(good_end)
            if good_end and raw[good_end - 1:good_end] != b"\n":
                f.seek(0, 2)
                f.write(b"\n")
    return out


def read_jsonl_as_is(path, *, fix="fix or delete this line"):
    """(rows, torn) for a reader that must not write to the file (report.py, reading a run that
    may still be running): rows as read_jsonl's, with a corrupt last line (a write torn by a crash,
    or still under way) left out and the file left as it is; torn is that line's number, None when
    the file ends cleanly. A corrupt line before the last raises RecordError."""
    out, _, torn = _parse_lines(_read_bytes(path), path, fix, torn_tail_ok=True)
    return out, torn


def _read_bytes(path):
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise RecordError(f"{path}: cannot read the file ({e.strerror}); check the path") from None


def _parse_lines(raw, path, fix, torn_tail_ok):
    """(rows, end of the last good line, number of a torn last line or None)."""
    out, good_end, pos = [], 0, 0
    for n, line in enumerate(raw.split(b"\n"), 1):
        end = pos + len(line)
        if line.strip():
            try:
                obj = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                if torn_tail_ok and not raw[end:].strip():
                    return out, good_end, n
                problem = f"not valid JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) \
                    else "not UTF-8 text"
                raise RecordError(f"{path}:{n}: {problem}; {fix}") from None
            if not isinstance(obj, dict):
                raise RecordError(f"{path}:{n}: expected one JSON object per line; {fix}")
            out.append((n, obj))
        good_end, pos = min(end + 1, len(raw)), end + 1
    return out, good_end, None


# ---- the event log of a search --------------------------------------------------------------------

class EventLog:
    """Append-only JSON Lines log of a run: one event (kind, step, request_id, parent_id, payload,
    time) per line, flushed and fsynced before the run goes on. Opening it reads the events already
    there, dropping a torn last line; a corrupt line anywhere else is refused (RecordError).

    A rerun replays the run from its start, and call() and submit() answer every request a previous
    run got a result for from the log: only the work the crash interrupted is done again."""

    def __init__(self, path):
        self.path = Path(path)
        self.events = []
        if self.path.exists():
            fix = "delete the file or pass a new --out to start afresh"
            self.events = [e for _, e in read_jsonl(self.path, cut_torn_tail=True, fix=fix)]
        self.results = {(e["kind"], e["request_id"]): e["payload"] for e in self.events
                        if e["kind"] != "request"}  # what a replay answers from
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")
        self._lock = threading.Lock()  # results of concurrent requests arrive on other threads

    def append(self, kind, step, request_id, parent_id, payload):
        event = dict(kind=kind, step=step, request_id=request_id, parent_id=parent_id,
                     payload=payload, time=time.time())
        with self._lock:
            if self._file.closed:  # a result that came back after the run stopped (Ctrl-C): not kept
                return event
            self._file.write(json.dumps(event, default=str) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            self.events.append(event)
            if kind != "request":
                self.results[(kind, request_id)] = payload
        return event

    def call(self, kind, request_id, step, parent_id, fn):
        """The result of an expensive request: from the log when a run got it before, else fn()'s,
        with the request logged before fn runs and its result after."""
        if (kind, request_id) in self.results:
            return self.results[(kind, request_id)]
        self.append("request", step, request_id, parent_id, {"what": kind})
        payload = json.loads(json.dumps(fn(), default=str))  # live and replayed runs see the same types
        self.append(kind, step, request_id, parent_id, payload)
        return payload

    def submit(self, kind, request_id, step, parent_id, send):
        """call() for a request that runs while the run goes on: send() starts it and returns a
        concurrent.futures.Future. The request is logged before it is sent and its result the
        moment it arrives, so a crash loses no result that came back. Returns a Future of the
        logged result (done at once when the log has it); a request that fails logs no result."""
        out = concurrent.futures.Future()
        if (kind, request_id) in self.results:
            out.set_result(self.results[(kind, request_id)])
            return out
        self.append("request", step, request_id, parent_id, {"what": kind})

        def arrived(f):
            try:
                payload = json.loads(json.dumps(f.result(), default=str))
                self.append(kind, step, request_id, parent_id, payload)
            except BaseException as e:  # the request failed or was cancelled: the caller decides
                out.set_exception(e)
            else:
                out.set_result(payload)
        send().add_done_callback(arrived)
        return out

    def note(self, kind, request_id, step, parent_id, payload):
        """A derived event (what the run decided from its results): written once; a replay that
        derives the same again writes nothing."""
        if self.results.get((kind, request_id)) != json.loads(json.dumps(payload, default=str)):
            self.append(kind, step, request_id, parent_id, payload)

    def close(self):
        """Stop logging. A request still running (a measurement in flight when the run is
        interrupted) may come back later: its result is not written, and a rerun sends it again.
        Such a result may be the interruption's doing (its workers killed at exit, a `crashed`
        verdict), which a rerun must not replay as the candidate's."""
        with self._lock:
            self._file.close()
