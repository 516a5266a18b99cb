"""The parent's clock under injected jitter: a simulation of the GPU's timed blocks.

harness.estimate.case_times turns the trusted side's figures (the reference's own event times, and the
parent's wall clock around each side's block) into a speedup and its noise. On a real GPU each
block's wall window carries the harness's share (fingerprints, a device sync, the pipe) and a
tenth of a millisecond or more of jitter. These tests draw such windows for honest kernels whose
true speedups are known and check that the estimate stays near the truth, that its noise figure
covers the error, and that the physical floor's rule rejects only what is significantly below it.
No GPU is needed: the estimator only ever sees numbers.
"""
import math
import random

import pytest

import measure
from harness import gpu_blocks
from harness.estimate import apply_floor, case_times
from harness.sides import Outcome


def simulate(rng, ref_call_ms, speedup, k, m, share_ms=0.4, jitter_ms=(0.1, 0.3), spike=(0.05, 2.0), second=0.0):
    """m pairs of GPU blocks of k calls: the reference's event times and both sides' windows, in
    a random order per pair; the side that runs second saves `second` of its time (warm caches)."""
    cand_call_ms = ref_call_ms / speedup
    ref_ms, ref_win, cand_win, cand_first = [], [], [], []
    for _ in range(m):
        first = rng.random() < 0.5
        r = sum(ref_call_ms * rng.gauss(1.0, 0.01) for _ in range(k)) * (1 - (0.0 if first else second))
        c = sum(cand_call_ms * rng.gauss(1.0, 0.01) for _ in range(k)) * (1 - (second if first else 0.0))

        def jitter():  # per-block jitter, and now and then a long stall (another process, a clock change)
            return rng.uniform(*jitter_ms) + (spike[1] if rng.random() < spike[0] else 0.0)
        ref_ms.append(r)
        ref_win.append(r + share_ms + jitter())
        cand_win.append(c + share_ms + jitter())
        cand_first.append(first)
    return dict(ref_ms=ref_ms, ref_win=ref_win, cand_win=cand_win, cand_first=cand_first)


def block_calls(ref_call_ms, cand_call_ms):
    """The calls per GPU block that gpu_blocks.GpuBlocks.block_pairs picks once it has seen both sides."""
    blocks = gpu_blocks.GpuBlocks.__new__(gpu_blocks.GpuBlocks)
    blocks.bytes_per_call = {"c": 1}
    blocks.call_ms = {("c", "ref"): ref_call_ms, ("c", "cand"): cand_call_ms}
    return blocks.block_pairs("c")


@pytest.fixture(autouse=True)
def _case_str_is_identity(monkeypatch):
    monkeypatch.setattr(measure, "case_str", lambda case: case)
    monkeypatch.setattr(gpu_blocks, "case_str", lambda case: case)


@pytest.mark.parametrize("ref_call_ms, speedup", [
    (0.05, 3.0),    # an fp8-quant-like kernel: short calls, a modest speedup
    (2.0, 20.0),    # a GDN-like kernel: long reference calls, a large speedup
    (0.5, 1.0),     # the A/A case: the reference against itself
    (0.2, 0.3),     # a slower candidate
])
def test_honest_kernels_keep_their_speedup_under_jitter(ref_call_ms, speedup):
    rng = random.Random(1234)
    k = block_calls(ref_call_ms, ref_call_ms / speedup)
    errors, covered, runs = [], 0, 200
    for _ in range(runs):
        m = rng.randint(8, 12)  # REPS: at least 8 blocks at benchmark scale
        row = case_times(simulate(rng, ref_call_ms, speedup, k, m), k, 0.0, "c")
        err = abs(math.log(row["speedup"] / speedup))
        errors.append(err)
        covered += err <= 3 * row["noise"] + 0.01
    errors.sort()
    # Within 10% in 99% of runs, never off by a third, and the noise figure covers the error.
    assert errors[int(0.99 * runs)] < math.log(1.10), (k, errors[-5:])
    assert errors[-1] < math.log(1.33), (k, errors[-5:])
    assert covered >= 0.95 * runs, (k, covered)


def test_the_order_within_a_pair_cancels_instead_of_widening_the_spread():
    # CPU-like windows where the side that runs second saves 10% (the first brought the inputs
    # into the caches): the estimate from the medians per order stays on the truth, and it
    # scatters less than one median over all pairs, which lands on either hump.
    rng = random.Random(5)
    by_order, pooled = [], []
    for _ in range(300):
        w = simulate(rng, 0.5, 1.0, 4, 30, share_ms=0.3, jitter_ms=(0.0, 0.05), spike=(0.0, 0.0), second=0.1)
        by_order.append(math.log(case_times(w, 4, 0.0, "c")["speedup"]))
        pooled.append(math.log(case_times({**w, "cand_first": None}, 4, 0.0, "c")["speedup"]))

    def rms(errors):
        return math.sqrt(sum(e * e for e in errors) / len(errors))
    assert abs(sum(by_order) / len(by_order)) < 0.005
    assert rms(by_order) < 0.6 * rms(pooled), (rms(by_order), rms(pooled))


def test_a_fast_candidate_gets_windows_long_enough_for_its_own_time():
    # A 20x candidate of a 2 ms reference: the block must hold enough of the candidate's calls
    # that ~0.3 ms of jitter is small beside them, not just BLOCK_MS of the reference's.
    k = block_calls(2.0, 0.1)
    assert k * 0.1 >= gpu_blocks.BLOCK_MS / 4
    # A candidate as fast as the reference keeps the usual block.
    assert block_calls(2.0, 2.0) == math.ceil(gpu_blocks.BLOCK_MS / 2.0)


def test_the_floor_rejects_only_what_is_significantly_below_it():
    def row(ms, noise):
        return dict(candidate_ms=ms, reference_ms=1.0, speedup=1.0 / ms, noise=noise, flags=[])

    near = row(0.097, 0.02)  # 3% below a 0.1 ms floor with 2% noise: the noise's doing
    apply_floor(near, 0.1, "c", "test")
    assert near["candidate_ms"] == 0.1 and near["speedup"] == pytest.approx(10.0) and near["flags"]
    above = row(0.2, 0.02)
    apply_floor(above, 0.1, "c", "test")
    assert above["candidate_ms"] == 0.2 and not above["flags"]
    with pytest.raises(Outcome) as e:
        apply_floor(row(0.05, 0.02), 0.1, "c", "test")  # half the floor: impossible
    assert e.value.status == "rejected" and "physical floor" in e.value.message


def test_an_honest_kernel_at_the_floor_is_not_rejected_under_jitter():
    # A kernel that runs exactly at the floor, measured with jitter: the rule never rejects it.
    rng = random.Random(7)
    ref_call_ms, speedup = 1.0, 10.0
    floor_ms = ref_call_ms / speedup
    k = block_calls(ref_call_ms, floor_ms)
    for _ in range(200):
        r = case_times(simulate(rng, ref_call_ms, speedup, k, 8), k, 0.0, "c")
        r["flags"] = list(r["flags"])
        apply_floor(r, floor_ms, "c", "test")
        assert r["candidate_ms"] >= floor_ms


@pytest.mark.parametrize("jitter_ms, quick, stretched", [
    ((0.0, 0.02), False, False),  # quiet windows: the noise target is met within the budget
    ((0.0, 3.0), False, True),    # noisy windows: timed on, up to STRETCH times the budget
    ((0.0, 3.0), True, False),    # --quick never stretches
])
def test_a_noisy_case_is_timed_on_until_its_noise_target_or_the_cap(monkeypatch, jitter_ms, quick, stretched):
    """measure.time_case on a simulated clock: blocks of windows drawn as above, each
    block taking 50 ms. The case stops at its budget when its noise figure is within
    NOISE_TARGET, and is timed on, to at most STRETCH times its budget, when it is not."""
    rng = random.Random(3)
    now = [0.0]
    monkeypatch.setattr(measure.time, "monotonic", lambda: now[0])

    class Sides:  # CPU: blocks of 16 pairs of one-call windows, nothing used outside them
        device = "cpu"

        def block_pairs(self, case):
            return 16

        def timed_block(self, case, n, ahead=False):
            now[0] += 0.05
            return simulate(rng, 0.5, 1.0, 1, n, share_ms=0.2, jitter_ms=jitter_ms, spike=(0.0, 0.0))

        def calls_per_window(self, n):
            return 1

        def outside_now(self):
            return {"ref": 0.0, "cand": 0.0}

        def hidden_ms(self, since):
            return 0.0

        def physical_floor(self, case, row):
            return None
    row = measure.time_case(Sides(), "c", 1, quick)
    budget, min_blocks, _ = measure.REPS[("cpu", quick)]
    spent = 2 * budget
    warm = 0.0 if quick else measure.WARM_S["cpu"] + 0.05  # the warm-up's pairs, then the budget's
    if stretched:
        assert now[0] - warm >= measure.STRETCH * spent - 0.05 and row["noise"] > measure.NOISE_TARGET
    else:
        assert now[0] - warm <= max(spent + 0.05, 0.05 * min_blocks)
    if not quick and not stretched:
        assert row["noise"] <= measure.NOISE_TARGET


def cpu_windows(rng, m, speedup=1.0, second=0.0, deferral=0.0, drift=0.0):
    """m pairs of CPU one-call windows in a random order: both sides' windows carry a harness share,
    each is cheaper by `second` when it runs second in its pair (whatever the side), the reference's
    window right after the candidate's costs `deferral` more (work the candidate left to run), and
    the machine drifts by `drift` along the pairs, slowly (a sine over the run)."""
    ref_ms, ref_win, cand_win, cand_first = [], [], [], []
    for i in range(m):
        first = rng.random() < 0.5
        slow = 1 + drift * math.sin(6.3 * i / m)
        r = 0.5 * slow * rng.lognormvariate(0, 0.08)
        c = 0.5 / speedup * slow * rng.lognormvariate(0, 0.08)
        if first:  # the candidate, then the reference
            c, r = c, r * (1 - second) + 0.5 * deferral
        else:
            c = c * (1 - second)
        ref_ms.append(r)
        ref_win.append(r + 0.1)
        cand_win.append(c + 0.1)
        cand_first.append(first)
    return dict(ref_ms=ref_ms, ref_win=ref_win, cand_win=cand_win, cand_first=cand_first)


def test_work_left_for_the_reference_s_next_window_shows_as_a_disturbance():
    """case_times' disturbance: a difference in differences of the windows by their place in the
    pair. Honest windows, whatever the second place saves either side, show none beyond their
    noise; a candidate whose leftovers cost the reference's next window 10% shows it, beyond the
    threshold measure.py rejects at, while its speedup is inflated."""
    rng = random.Random(7)
    honest = [case_times(cpu_windows(rng, 300, second=0.05), 1, 0.0, "c") for _ in range(12)]
    flagged = [row["disturbance"] > max(measure.DISTURB_TOLERANCE, measure.DISTURB_SIGMAS * row["disturbance_noise"])
               for row in honest]
    assert sum(flagged) <= 1, [round(r["disturbance"], 3) for r in honest]
    attacked = [case_times(cpu_windows(rng, 300, second=0.05, deferral=0.1), 1, 0.0, "c") for _ in range(12)]
    caught = [row["disturbance"] > max(measure.DISTURB_TOLERANCE, measure.DISTURB_SIGMAS * row["disturbance_noise"])
              for row in attacked]
    assert sum(caught) >= 11 and min(r["speedup"] for r in attacked) > 1.02, [round(r["disturbance"], 3) for r in attacked]


def test_the_noise_figure_covers_the_error_when_the_machine_drifts():
    """The noise is a bootstrap over blocks of neighbouring pairs: under a slow drift of the
    machine (both sides alike, as a shared VM's load moves) the two-standard-error interval of
    an A/A's figure holds 1.0 about 95% of the time."""
    rng = random.Random(11)
    rows = [case_times(cpu_windows(rng, 200, drift=0.3), 1, 0.0, "c", disturbance_check=False) for _ in range(80)]
    covered = sum(abs(math.log(r["speedup"])) <= 2 * r["noise"] for r in rows) / len(rows)
    assert covered >= 0.9, covered
