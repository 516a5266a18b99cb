"""harness: what measure.py's protocol runs on, and its trust boundary. A first read may skip this folder.

measure.py (top level) is the trusted parent, and reads as the protocol: load the candidate, check
it, time it case by case, judge it. The machinery below it lives here, one file per seam:

  cpu_windows.py       the CPU protocol: one call a window, both sides frozen between windows, a
                       call's inputs copied into an arena just before it, its outputs read from
                       the frozen process and judged against the twin's.
  gpu_blocks.py        the GPU protocol: blocks of calls, each call's seed revealed once the call
                       before it committed to its outputs by their digests, a picked call handed over.
  sides.py             what the two protocols share: the verdict's words (Outcome, HarnessError),
                       commands to either side, the check of a call's outputs against the reference's.
  estimate.py          from windows to a case's row: the speedup, its noise (a bootstrap), the
                       disturbance, the physical floor. Numbers in, numbers out.
  measure_channel.py   the process boundary: a worker as the parent sees it (pipes read and written
                       against deadlines, limits watched, frozen and thawed, its memory read), one
                       typed parser of every reply, and printable() for any untrusted text.
  worker_set.py        the workers a measuring thread keeps (the reference worker, a fresh candidate
                       pair per measurement, a spare booting), the core they are timed on and its
                       cache flusher, the exchange folders that carry inputs and outputs.
  measure_sandbox.py   the isolation: bubblewrap with an allowlist of binds, a libseccomp filter, a
                       cgroup per sandbox (CPU time, memory, tasks), a host uid of its own, rlimits.
  measure_worker.py    the program on the far side: the trusted reference worker (makes inputs,
                       judges outputs) and the candidate worker (loads the candidate, runs it when
                       told). It imports nothing of the project but tasks/ and fingerprint.py.
  fingerprint.py       BLAKE3 of a tensor's bytes on its own device (Triton kernels), the very bytes
                       of the blake3 package: a binding commitment to outputs without a host copy.

docs/MEASUREMENT.md names, for each property the verdict rests on, the one place here that makes it true.
"""
