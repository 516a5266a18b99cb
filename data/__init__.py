"""data: the records. A first read may skip this folder.

Every measurement becomes a training row, and every run leaves files a crash must not spoil:

  records.py       atomic files, JSON lines, the search's event log, the cache folder.
  dataset.py       the rows a forecaster learns from, is judged on and writes, read strictly.
  hub.py           the same rows from a Hugging Face Hub dataset by name (the paper's published ones).
  pair_sampler.py  a bin-balanced set of (anchor, candidate) pairs from measured kernels.
  plots.py         the project's pictures: reliability diagrams, risk-coverage curves, searches.
"""
