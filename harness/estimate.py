"""estimate.py: what a case's windows say. The speedup, its noise, the disturbance, the floor.

Each side's timed windows come as numbers (the reference's own times per call, and the parent's
clock of each side's window: measure.py's protocol, cpu_windows.py and gpu_blocks.py); this file
turns them into a case's row, and only ever sees numbers (tests/test_measure_clock.py simulates
windows under injected jitter, drift and deferred work, and checks the row against the truth):

  case_times    the reference's time per call (the lower quartile of its own timer), the
                candidate's (plus the median over pairs of its window less the reference's, per
                order within the pair), the hidden time charged, the noise (a moving-block
                bootstrap over the pairs in time order), and the disturbance (a difference in
                differences: the reference's windows right after the candidate's against those
                after the gap between pairs, less the same on the candidate's side).
  apply_floor   on a GPU, a time below the task's unavoidable memory traffic at the device's
                bandwidth is rejected when it is below by more than the noise, clamped within it.
"""
import math
import random
import statistics

from harness.sides import Outcome

# The reference's figure over a case's windows (case_times): the lower quartile of its compute.
QUANTILE = 0.25
# The candidate's difference is a median per order within the pairs (case_times) once each order
# has this many pairs.
MIN_PER_ORDER = 10
# The physical floor's significance test (apply_floor): standard errors of log time.
FLOOR_SIGMAS = 4.0
# Peak DRAM bandwidth (bytes/s) of GPUs we know, most specific name first; a family's fallback
# is its fastest variant, since a floor must never be above what the card can do. The physical
# bound uses the larger of this and the copy bandwidth the reference worker measured.
PEAK_BANDWIDTH = [("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("H200", 4.8e12),
                  ("GB200", 8.0e12), ("B200", 8.0e12), ("A100 80GB PCIe", 1.935e12), ("A100", 2.039e12),
                  ("L40S", 0.864e12), ("L40", 0.864e12), ("L4", 0.3e12)]


def case_times(windows, k, hidden_ms, where, disturbance_check=True):
    """A case's row from the parent's windows, the trusted side's figures only: `windows` holds
    per window the reference's compute (its own, trusted timer), the reference's window and the
    candidate's window (lists in step, the two windows of a pair on the same inputs, run one
    after the other; k calls per window), and `hidden_ms` the CPU the candidate used outside its
    windows beyond what the reference did.

    The reference's time per call is the lower quartile of its compute (QUANTILE: noise on a
    shared machine only ever adds time). The candidate's is that plus the median, over pairs,
    of its window less the reference's: the harness's share of a window (the command, the reply,
    on a GPU the inputs and the digests: the same code on both sides) cancels within each pair, and so does the machine's
    drift, which on a shared CPU moves a window's cost by tens of percent over a few seconds.
    The side that runs second in a pair finds the inputs in the core's caches, which the first
    side brought there (on CPU fp8_quant's second side was about 5% faster): the order is drawn
    at random, so this only widens the spread of the differences, into two humps. So the
    candidate's difference is the mean of its medians over the two orders, where the order's
    share cancels (`cand_first`, per pair).
    The hidden CPU time is added whole, spread over the candidate's calls. The noise of the
    speedup is the standard error of its log, from a bootstrap over the pairs."""
    ref_win, cand_win, compute = windows["ref_win"], windows["cand_win"], windows["ref_ms"]
    m = len(ref_win)
    diff = [c - r for c, r in zip(cand_win, ref_win)]
    first = windows.get("cand_first") or [False] * m
    # With few pairs per order, a median of each would let one stall move it: one median then.
    split = min(sum(first), m - sum(first)) >= MIN_PER_ORDER

    def median_over_orders(picks):
        by_order = [[diff[i] for i in picks if first[i]], [diff[i] for i in picks if not first[i]]]
        if not (split and all(by_order)):
            return _quantile([diff[i] for i in picks], 0.5)
        return sum(_quantile(d, 0.5) for d in by_order) / 2

    def estimate(picks):
        r = max(_quantile([compute[i] for i in picks], QUANTILE), 1e-6)
        c = r + median_over_orders(picks) + hidden_ms / m
        return r / k, max(c, 0.02 * r) / k

    def disturbance(picks):
        """How much more the reference's window cost right after the candidate's (second in a pair
        it began) than first in a pair, beyond the same difference on the candidate's side, as a
        share of the reference's window: a difference in differences in which whatever the second
        place does to any window (the gap before it, what the first window left) cancels, and
        what remains is what the candidate's window left to run in the next one."""
        by = {(side, pos): [] for side in ("t", "c") for pos in (1, 2)}
        for i in picks:
            by[("c", 1) if first[i] else ("t", 1)].append(cand_win[i] if first[i] else ref_win[i])
            by[("t", 2) if first[i] else ("c", 2)].append(ref_win[i] if first[i] else cand_win[i])
        if not all(by.values()):
            return 0.0
        med = {key: _quantile(v, 0.5) for key, v in by.items()}
        did = (med[("t", 2)] - med[("t", 1)]) - (med[("c", 2)] - med[("c", 1)])
        return did / max(_quantile([ref_win[i] for i in picks], 0.5), 1e-9)

    reference_ms, candidate_ms = estimate(range(m))
    # Noise: a moving-block bootstrap over the pairs, in the order they were timed (blocks of about
    # the square root of their number): neighbouring pairs share the machine's moment, which an
    # independent resampling of pairs would count as independent evidence.
    rng = random.Random(m)  # a fixed draw: the same windows give the same noise figure
    length = max(1, round(math.sqrt(m)))
    draws = [_blocks(m, length, rng) for _ in range(200)]
    logs = [math.log(r / c) for r, c in (estimate(picks) for picks in draws)]
    noise = statistics.stdev(logs)
    check = split and disturbance_check  # (not while a case is still being timed: only its noise is asked then)
    disturbed = disturbance(range(m)) if check else 0.0
    disturbed_noise = statistics.stdev([disturbance(picks) for picks in draws[:100]]) if check else 0.0
    flags = []
    if hidden_ms > 0.05 * candidate_ms * m * k:
        flags.append(f"{where}: the candidate used {hidden_ms:.1f} ms of CPU outside its windows (while the "
                     "reference ran, or between calls): charged to its time")
    if candidate_ms <= 0.02 * reference_ms:
        flags.append(f"{where}: the candidate's time is below the resolution of the parent's clock; its "
                     "speedup is a lower bound")
    share = _quantile([w - c for w, c in zip(ref_win, compute)], 0.5)
    return dict(reference_ms=reference_ms, candidate_ms=candidate_ms, speedup=reference_ms / candidate_ms,
                noise=noise, reference_spread=_spread([c / k for c in compute]),
                candidate_spread=_spread([max(c + d, 1e-9) / k for c, d in zip(compute, diff)]),
                harness_ms=share / k, reps=m * k, windows=m, window_calls=k, hidden_ms=round(hidden_ms, 3), flags=flags,
                disturbance=disturbed, disturbance_noise=disturbed_noise)


def _blocks(m, length, rng):
    """A moving-block bootstrap draw of m indices: runs of `length` consecutive ones from random
    starts (wrapping around), as many as make up m."""
    picks = []
    while len(picks) < m:
        start = rng.randrange(m)
        picks += [(start + j) % m for j in range(length)]
    return picks[:m]


def apply_floor(row, floor_ms, where, why):
    """A time below the physical floor is impossible, but a fast honest kernel near the floor can
    come out below it by the measurement's noise alone. So the rule has a significance test: a
    time below the floor by more than FLOOR_SIGMAS standard errors is rejected; one below it
    within the noise is clamped to the floor (the fastest the kernel can be) and flagged."""
    ms = row["candidate_ms"]
    if ms >= floor_ms:
        return
    if math.log(floor_ms / ms) > FLOOR_SIGMAS * row["noise"] + math.log(1.02):
        raise Outcome("rejected", f"{where}: {ms:.4f} ms is below the physical floor {floor_ms:.4f} ms of this "
                                   f"GPU ({why}) by more than the measurement's noise: impossible")
    row["candidate_ms"] = floor_ms
    row["speedup"] = row["reference_ms"] / floor_ms
    row["flags"].append(f"{where}: {ms:.4f} ms is below the physical floor {floor_ms:.4f} ms within the "
                        "measurement's noise: the floor stands as its time")


def peak_bandwidth(device_name):
    """PEAK_BANDWIDTH's figure for this GPU (its list is most specific name first), or None."""
    return next((bw for key, bw in PEAK_BANDWIDTH if key in device_name), None)


def physical_floor_ms(min_bytes, device_name, measured_bandwidth):
    """The least time in which a GPU can move `min_bytes`: at the larger of its datasheet peak
    (when known) and the copy bandwidth measured on it. None when neither is known."""
    bandwidth = max(peak_bandwidth(device_name) or 0.0, measured_bandwidth or 0.0)
    return min_bytes / bandwidth * 1e3 if bandwidth > 0 else None


def _quantile(xs, q):
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _median(xs):
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2


def _spread(xs):
    """Interquartile range relative to the median: 0.02 means the middle half is within 2%."""
    s = sorted(xs)
    n = len(s)
    q1, q3 = s[int(0.25 * (n - 1))], s[int(math.ceil(0.75 * (n - 1)))]
    med = _median(s)
    return (q3 - q1) / med if med > 0 else 0.0
