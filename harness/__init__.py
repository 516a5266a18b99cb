"""harness: measure.py's process boundary. A first read may skip this folder.

measure.py (top level) is the trusted parent: it owns the seeds, the clock and the verdict. What
it needs to keep a hostile candidate at arm's length lives here:

  measure_worker.py    the process that runs code: the trusted reference worker (makes inputs,
                       runs and checks the reference) and the untrusted candidate worker (loads the
                       candidate, runs it when told). It imports nothing of the project but tasks/.
  measure_sandbox.py   where a candidate worker runs: bubblewrap with an allowlist of binds, a
                       libseccomp filter, its own cgroup (CPU time, memory, tasks), an unprivileged uid.
  measure_channel.py   the process boundary: a worker as the parent sees it (pipes read and written
                       against deadlines, limits watched, frozen and thawed, its memory read), one
                       typed parser of every reply, and printable() for any untrusted text.
  worker_set.py        the workers a measuring thread keeps (the reference worker, a fresh candidate
                       pair per measurement, a spare booting), the core they are timed on and its
                       cache flusher, the exchange folders that carry inputs and outputs.
  fingerprint.py       BLAKE3 of a tensor's bytes on its own device (Triton kernels), the very bytes
                       of the blake3 package: a binding commitment to outputs without a host copy.

docs/MEASUREMENT.md maps each attack on a measurement to its defence here.
"""
