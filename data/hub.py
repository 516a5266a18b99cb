"""hub.py: the rows of a dataset on the Hugging Face Hub, named `hf:OWNER/NAME[/CONFIG][:SPLIT]`.

The paper published its eval set, its forecasters' predictions, its RL training pool and its
discovery pairs as Hub datasets (docs/PAPER.md §10). Every command that reads rows takes such a
name wherever it takes a JSON Lines file (dataset.read_source is the one place that tells the two
apart), and the rows are checked as the lines of a file are, with the same one-line errors:

    python metrics.py hf:codezakh/gpu-forecasters-eval-set-predictions --rows hf:codezakh/gpu-forecasters-eval-set

1. The name. OWNER/NAME is the dataset's repository; CONFIG one of its configurations (the
   paper's datasets have `combined`, holding every row, and one per task or forecaster); SPLIT
   one of the configuration's splits (`eval`, `predictions`, `train`, `pairs`). Left out, each
   is the only one there is, else the one the dataset card marks default (or names `default`),
   else `combined`; where that leaves a choice, the error lists the choices.
2. The files, through the Hub's own client and cache (huggingface_hub): the dataset card
   (README.md), whose YAML header lists each configuration's files per split (the layout
   `datasets`' push_to_hub writes), then the files of the configuration and split asked for
   (snapshot_download with those patterns). Both come from the cache (HF_HUB_CACHE, default
   ~/.cache/huggingface/hub) when they are there; with HF_HUB_OFFLINE=1 only from there, and a
   dataset missing from it is one line naming the command that fills it:
   `hf download OWNER/NAME --repo-type dataset` (reachable and in_cache let a command look before
   it reads, so that an unreachable Hub costs seconds, not the client's retries). A card without
   a `configs` header is read as `datasets` reads one: every data file, one configuration named
   `default`, split by the word each file name starts with (`train-00000-of-00001.parquet`: train).
3. The rows: Parquet files through pyarrow, JSON Lines files through records.read_jsonl, in file
   order; row numbers count from 1 across the split's files.

Why not `datasets.load_dataset`: offline it reloads only the Arrow copy it prepares in its own
cache on a first online load, never the Hub cache that `hf download` fills, so a machine that
downloaded the data could still not read it offline; and the rows here are a list of dicts, which
needs none of its machinery.
"""
import re
from pathlib import Path

from data.records import RecordError, read_jsonl

PREFIX = "hf:"
DATA_SUFFIXES = (".parquet", ".jsonl")
NAME = re.compile(r"^hf:(?P<repo>[\w.-]+/[\w.-]+)(?:/(?P<config>[\w.-]+))?(?::(?P<split>[\w.-]+))?$")
PREFERRED_CONFIGS = ("default", "combined")  # after the card's own `default: true`


def is_hub_name(source):
    """Whether a command-line input names a Hub dataset rather than a file."""
    return isinstance(source, str) and source.startswith(PREFIX)


def fill_command(repo):
    """The command that puts a dataset into the Hugging Face cache."""
    return f"hf download {repo} --repo-type dataset"


def in_cache(name):
    """Whether a Hub dataset is in the Hugging Face cache (its card is: a dataset fetched before)."""
    from huggingface_hub import try_to_load_from_cache
    repo, _, _ = parse_name(name)
    return isinstance(try_to_load_from_cache(repo, "README.md", repo_type="dataset"), str)


def reachable(timeout_s=3.0):
    """Whether the Hub (HF_ENDPOINT) accepts a connection within timeout_s, its name resolved
    included; False in offline mode. A look before any download: the Hub's client retries a Hub
    it cannot reach for half a minute a file before it says so."""
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants
    if constants.is_offline_mode():
        return False
    url = urlparse(constants.ENDPOINT)
    answered = []

    def connect():  # in a thread: a resolver that hangs is not bounded by the socket's timeout
        try:
            socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                     timeout=timeout_s).close()
            answered.append(True)
        except OSError:
            pass
    probe = threading.Thread(target=connect, name="hub-probe", daemon=True)
    probe.start()
    probe.join(timeout_s)
    return bool(answered)


def go_offline():
    """The Hub's client reads the cache alone from now on (as with HF_HUB_OFFLINE=1)."""
    import os

    from huggingface_hub import constants
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True


def parse_name(name):
    """(repo, config or None, split or None) of `hf:OWNER/NAME[/CONFIG][:SPLIT]`."""
    m = NAME.match(name)
    if not m:
        raise RecordError(f"{name}: not a dataset name; write hf:OWNER/NAME[/CONFIG][:SPLIT], "
                          "e.g. hf:codezakh/gpu-forecasters-eval-set")
    return m["repo"], m["config"], m["split"]


# ---- the files, through the Hub's client and cache -----------------------------------------------

def _hub_error(name, repo, e):
    """One line for whatever the Hub's client raised."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    if isinstance(e, GatedRepoError):
        return RecordError(f"{name}: the dataset is gated; accept its terms on huggingface.co and log in "
                           "(`hf auth login`)")
    if isinstance(e, RepositoryNotFoundError):
        return RecordError(f"{name}: no dataset {repo} on the Hugging Face Hub (or it is private: `hf auth login`)")
    if isinstance(e, LocalEntryNotFoundError) and constants.is_offline_mode():
        return RecordError(f"{name}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                           f"is set; fill the cache with `{fill_command(repo)}` (where the Hub can be reached, "
                           "with the same HF_HUB_CACHE), or unset HF_HUB_OFFLINE")
    if isinstance(e, LocalEntryNotFoundError):
        return RecordError(f"{name}: the Hugging Face Hub cannot be reached and the dataset is not in the cache "
                           f"({constants.HF_HUB_CACHE}); run `{fill_command(repo)}` where it can be")
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    return RecordError(f"{name}: cannot read the dataset ({first}); `{fill_command(repo)}` fetches it whole")


def _card(name, repo):
    """The dataset card's YAML header ({} without one), from the cache or the Hub."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.repocard import metadata_load
    try:
        return metadata_load(hf_hub_download(repo, "README.md", repo_type="dataset")) or {}
    except EntryNotFoundError:  # a dataset without a card: its files alone say what it holds
        return {}
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        raise _hub_error(name, repo, e) from None


def _snapshot(name, repo, patterns):
    """The snapshot folder holding (at least) the files matching `patterns`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, IncompleteSnapshotError, LocalEntryNotFoundError
    try:
        return Path(snapshot_download(repo, repo_type="dataset", allow_patterns=patterns))
    except IncompleteSnapshotError:
        raise RecordError(f"{name}: the cached copy is incomplete (an interrupted download); run "
                          f"`{fill_command(repo)}` again") from None
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as e:
        raise _hub_error(name, repo, e) from None


def _split_patterns(data_files):
    """{split: [glob patterns]} of a config's `data_files`, in any of the forms a card may write:
    a pattern, a list of patterns (split train), {split: patterns}, or [{split, path}]."""
    if isinstance(data_files, str):
        data_files = [data_files]
    if isinstance(data_files, dict):
        data_files = [{"split": s, "path": p} for s, p in data_files.items()]
    out = {}
    for f in data_files or []:
        split, paths = ("train", f) if isinstance(f, str) else (f.get("split", "train"), f.get("path", []))
        out.setdefault(split, []).extend([paths] if isinstance(paths, str) else paths)
    return out


def _configs(card):
    """{config: {split: [glob patterns]}} and the default config (or None) from a card's header."""
    configs, default = {}, None
    for c in card.get("configs") or []:
        configs[c.get("config_name", "default")] = _split_patterns(c.get("data_files"))
        if c.get("default"):
            default = c.get("config_name", "default")
    return configs, default


def _inferred_configs(folder):
    """No `configs` header: every data file, config `default`, split by the file name's first word."""
    splits = {}
    for p in sorted(folder.rglob("*")):
        if p.suffix in DATA_SUFFIXES and not any(part.startswith(".") for part in p.relative_to(folder).parts):
            word = re.match(r"[A-Za-z]*", p.name).group() or "train"
            splits.setdefault(word, []).append(p.relative_to(folder).as_posix())
    return {"default": splits} if splits else {}


def _choose(name, kind, asked, options, preferred=(), within=""):
    """The config (or split) asked for, else the only one, else the first preferred one there is."""
    if asked is not None:
        if asked not in options:
            raise RecordError(f"{name}: no {kind} {asked!r}{within}; there are {', '.join(options) or 'none'}")
        return asked
    if len(options) == 1:
        return next(iter(options))
    for p in preferred:
        if p in options:
            return p
    raise RecordError(f"{name}: name a {kind}{within}, one of {', '.join(options)} (hf:OWNER/NAME/CONFIG:SPLIT)")


def _files(folder, patterns):
    """The snapshot's files matching the data_files patterns, in order, each once."""
    out = []
    for pattern in patterns:
        for p in sorted(folder.glob(pattern)):
            if p.is_file() and p not in out:
                out.append(p)
    return out


# ---- the rows -------------------------------------------------------------------------------------

def _rows_of(path, name):
    """The rows of one data file, as plain dicts."""
    if path.suffix == ".jsonl":
        return [obj for _, obj in read_jsonl(path, fix="the dataset's file is damaged; download it again")]
    if path.suffix != ".parquet":
        raise RecordError(f"{name}: {path.name} is neither Parquet nor JSON Lines, the formats read here")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RecordError(f"{name}: reading Parquet needs pyarrow: `pip install pyarrow` "
                          "(requirements.txt has it)") from None
    try:
        return pq.read_table(path).to_pylist()
    except OSError as e:  # pyarrow's ArrowInvalid is an OSError too
        raise RecordError(f"{name}: {path.name} is not a readable Parquet file ({e}); download the dataset "
                          "again") from None


def read_rows(name):
    """(the name with its config and split filled in, [(row number, row)]) of a Hub dataset."""
    repo, config, split = parse_name(name)
    card = _card(name, repo)
    configs, default = _configs(card)
    if not configs:  # files named by convention: the snapshot's listing says which there are
        configs = _inferred_configs(_snapshot(name, repo, [f"*{s}" for s in DATA_SUFFIXES]))
    if not configs:
        raise RecordError(f"{name}: the dataset holds no Parquet or JSON Lines files")
    config = _choose(name, "config", config, configs, ((default,) if default else ()) + PREFERRED_CONFIGS)
    split = _choose(name, "split", split, configs[config], within=f" in config {config!r}")
    full = f"{PREFIX}{repo}/{config}:{split}"
    patterns = configs[config][split]
    files = _files(_snapshot(name, repo, patterns), patterns)
    if not files:
        raise RecordError(f"{full}: the cached copy has no file for it ({', '.join(patterns)}); run "
                          f"`{fill_command(repo)}`")
    rows = [row for path in files for row in _rows_of(path, full)]
    return full, list(enumerate(rows, 1))


def revision(name):
    """The commit of the dataset snapshot a Hub name is read from (the cached one when offline)."""
    repo, _, _ = parse_name(name)
    return _snapshot(name, repo, ["README.md"]).name
