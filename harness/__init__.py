"""harness: measure.py's process boundary. A first read may skip this folder.

measure.py (top level) is the trusted parent: it owns the seeds, the clock and the verdict. What
it needs to keep a hostile candidate at arm's length lives here:

  measure_worker.py    the process that runs code: the trusted reference worker (makes inputs,
                       runs and checks the reference) and the untrusted candidate worker (loads the
                       candidate, runs it when told). It imports nothing of the project but tasks/.
  measure_sandbox.py   where a candidate worker runs: bubblewrap with an allowlist of binds, a
                       libseccomp filter, its own cgroup (CPU time, memory, tasks), an unprivileged uid.
  measure_channel.py   how the parent talks to its workers: one typed parser of every reply (types,
                       ranges, sizes, depth), escaping of candidate text, the exchange folders that
                       carry inputs and outputs, and the workers kept for the next candidate.
  fingerprint.py       BLAKE3 of a tensor's bytes on its own device (Triton kernels), the very bytes
                       of the blake3 package: a binding commitment to outputs without a host copy.

docs/MEASUREMENT.md maps each attack on a measurement to its defence here.
"""
