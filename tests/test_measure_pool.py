"""Tests of measure_pool.py: several measurements at once, one per device, in this process or on
a Ray cluster.

Scheduling is tested with a fake measure function (it sleeps and records who ran it when), real
measurements once on two CPU workers and once on a Ray node (measure.py's sandbox on each); the Ray
tests share one local cluster of 2 CPUs, on which a small search runs.
"""
import json
import os
import signal
import sys
import threading
import time

import pytest

import measure
from harness import measure_channel, worker_set
from runtime import measure_pool
from runtime.measure_pool import MeasurePool, pool_devices
from tasks import seed_source, variant_sources

TASK = "cross_entropy"


class FakeMeasurement:
    def __init__(self, source, **kw):
        self.source, self.kw = source, kw

    def to_dict(self):
        return {"status": "ok", "speedup": 1.0, "source": self.source,
                "device": self.kw.get("device"), "gpu": self.kw.get("gpu")}


class SleepyMeasure:
    """Takes `seconds`; records the thread and the interval of every call."""

    def __init__(self, seconds=0.2):
        self.seconds, self.calls, self.lock = seconds, [], threading.Lock()

    def __call__(self, task, source, **kw):
        start = time.monotonic()
        time.sleep(self.seconds)
        with self.lock:
            self.calls.append((threading.get_ident(), source, start, time.monotonic()))
        return FakeMeasurement(source, **kw)


def overlapping(a, b):
    return a[0] < b[1] and b[0] < a[1]


def most_at_once(spans):
    """The most intervals running at one moment (one of them starts then)."""
    return max(sum(a <= s < b for a, b in spans) for s, _ in spans)


def test_pool_runs_one_measurement_per_worker_and_several_at_once():
    fake = SleepyMeasure()
    with MeasurePool(["cuda:0", "cuda:1", "cuda:3"], measure_fn=fake) as pool:
        futures = [pool.submit(TASK, f"kernel {i}", scale="benchmark") for i in range(9)]
        results = [f.result(timeout=30) for f in futures]
    assert sorted(r["measurement"]["source"] for r in results) == sorted(f"kernel {i}" for i in range(9))
    assert len(fake.calls) == 9  # each once
    by_worker = {}
    for r in results:
        m = r["measurement"]
        assert r["worker"] == f"cuda:{m['gpu']}" and m["device"] == "cuda"  # pinned to its own GPU
        by_worker.setdefault(r["worker"], []).append((r["started"], r["ended"]))
    assert set(by_worker) == {"cuda:0", "cuda:1", "cuda:3"}
    for intervals in by_worker.values():  # never two at once on one worker
        assert not any(overlapping(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1:])
    spans = [(r["started"], r["ended"]) for r in results]
    assert most_at_once(spans) == 3
    assert len({t for t, *_ in fake.calls}) == 3  # one thread per worker


def test_pool_passes_the_harness_error_to_the_caller_and_goes_on():
    def flaky(task, source, **kw):
        if source == "bad":
            raise RuntimeError("the reference worker died")
        return FakeMeasurement(source, **kw)

    with MeasurePool(["cpu"], measure_fn=flaky) as pool:
        bad, good = pool.submit(TASK, "bad"), pool.submit(TASK, "good")
        with pytest.raises(RuntimeError, match="reference worker died"):
            bad.result(timeout=10)
        assert good.result(timeout=10)["worker"] == "cpu:0"
        assert pool.note == ""  # one CPU worker disturbs nobody


def test_pool_devices_from_the_flags(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pool_devices("all", None) == ["cpu"]
    assert pool_devices("all", 2) == ["cpu", "cpu"]
    with pytest.raises(ValueError, match="none is visible; on CPU use --workers"):
        pool_devices("0,1", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert pool_devices("all", None) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert pool_devices("0,3", None) == ["cuda:0", "cuda:3"]
    assert pool_devices("all", 2) == ["cuda:0", "cuda:1"]
    for flag, workers, message in [("0,0", None, "names a GPU twice"), ("4", None, "GPU 4 is not among the 4"),
                                   ("one", None, "'all' or GPU indices"), ("0,1", 3, "at most one worker per GPU"),
                                   ("all", 0, "at least 1")]:
        with pytest.raises(ValueError, match=message):
            pool_devices(flag, workers)


def test_each_thread_has_its_own_workers_pinned_to_its_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    sets = {}

    def take(name, gpu):
        sets[name] = worker_set.workers(gpu)
        sets[name + " again"] = worker_set.workers(gpu)
        worker_set.release_workers()

    threads = [threading.Thread(target=take, args=(n, g)) for n, g in (("a", 1), ("b", 2), ("c", None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sets["a"] is sets["a again"] and sets["a"] is not sets["b"]
    assert (sets["a"].visible, sets["b"].visible, sets["c"].visible) == ("5", "6", "4,5,6")  # physical ids
    with pytest.raises(ValueError, match="GPU 3 is not among the 3"):
        worker_set.workers(3)


def test_spares_boot_for_the_kind_a_thread_keeps_asking_for_and_a_one_off_wastes_none(monkeypatch):
    """A search asks for one kind of candidate worker (with its timing twin) over and over: from the
    second request on a spare pair is booted while each candidate is measured. A one-off of another
    kind (a test's memory cap, another task) starts no spare, and the spare of the kind before it
    waits for its return. A spare boots at idle priority and is woken when it is taken."""
    booted, idles, woken = [], [], []

    class Fake:
        def __init__(self, kind):
            self.kind, self.killed = kind, False

        def alive(self):
            return not self.killed

        def kill(self):
            self.killed = True

        def tree(self):
            return [self]

    def new_pair(task, *rest, idle=False):
        booted.append((Fake(task), Fake(task)))
        idles.append(idle)
        return booted[-1]

    monkeypatch.setattr(worker_set, "pin", lambda worker, cores: None)
    monkeypatch.setattr(worker_set, "wake_up", lambda pids: woken.extend(pids))
    ws = worker_set.WorkerSet(None)
    monkeypatch.setattr(ws, "_new_pair", new_pair)
    got = [ws.candidate_pair(task, "cpu", True, 1) for task in ("a", "a", "a", "b", "a", "a")]
    assert [cand.kind for cand, twin in got] == ["a", "a", "a", "b", "a", "a"]
    assert len(set(map(id, got))) == 6  # a fresh pair each time
    # a: booted; a: booted, and a spare; a: the spare, and a new one; b: booted, no spare of b, the
    # spare of a kept; a: that spare, and a new one; a: the spare, and a new one
    assert [cand.kind for cand, twin in booted] == ["a", "a", "a", "a", "b", "a", "a"]
    assert not any(w.killed for pair in booted for w in pair)  # nothing booted for nothing
    assert [pair in got for pair in booted] == [True, True, True, True, True, True, False]
    assert idles == [False, False, True, True, False, True, True]  # the spares, and only they
    assert woken == [w for pair in got if idles[booted.index(pair)] for w in pair]  # each spare as it was taken
    spare = booted[-1]
    spare[1].kill()  # a spare pair with a dead member is not handed out, and its other member ends
    assert ws.candidate_pair("a", "cpu", True, 1) not in (spare, *got)
    assert spare[0].killed
    ws.close()
    assert all(w.killed for w in booted[-1])


def test_worker_sets_claim_cores_that_no_other_set_on_the_machine_holds(tmp_path, monkeypatch):
    """Each worker set times its pairs on a core of its own, machine-wide: a core another set holds,
    in this process or another, is skipped; with every core held, sets share; a core is free again
    once its set closes or its process ends, however it ends."""
    import subprocess
    monkeypatch.setattr(worker_set, "CORE_LOCKS", str(tmp_path))
    claim = worker_set.claim_core
    a, b = claim([0, 1], 0), claim([0, 1], 0)
    assert (a[0], b[0]) == (1, 0) and None not in (a[1], b[1])
    assert claim([0, 1], 0) == (1, None)  # every core held: shared
    os.close(a[1])
    again = claim([0, 1], 0)
    assert again[0] == 1
    os.close(again[1])
    os.close(b[1])
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(tmp_path / 'gpu-forecasters-core-1.lock')!r}, os.O_RDONLY | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        other = claim([0, 1], 0)
        assert other[0] == 0  # another process holds core 1
        os.close(other[1])
    finally:
        holder.kill()  # SIGKILL: the kernel releases its lock all the same
        holder.wait()
    freed = claim([0, 1], 0)
    assert freed[0] == 1
    os.close(freed[1])
    if len(os.sched_getaffinity(0)) >= 2:  # two sets of this process: two cores, and back on close
        first, second = worker_set.WorkerSet(None), worker_set.WorkerSet(None)
        try:
            assert first.core != second.core and first.core_lock is not None and second.core_lock is not None
        finally:
            first.close()
            second.close()
        assert first.core_lock is None


@pytest.mark.e2e
@pytest.mark.slow
def test_a_spare_worker_boots_at_idle_priority_and_wake_up_restores_it():
    """Measured: a spare pair booting beside a measurement at normal priority took two thirds of
    the core on which the reference worker makes the next inputs, and gdn_recompute_w_u came out
    of 12 windows instead of about 100. A spare boots at idle priority, every thread of it and,
    where the kernel groups processes by session, its session's group; taken, it is raised again."""
    from harness.measure_sandbox import can_undo_idle, sandbox_plan, wake_up
    if not can_undo_idle():
        pytest.skip("this process may not undo idle priority (neither root nor CAP_SYS_NICE): spares boot at normal priority")
    plan = sandbox_plan()
    w = measure_channel.WorkerProcess("candidate", TASK, "cpu", plan=None if plan.problem else plan,
                                      memory_bytes=2 << 30, idle=True)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the thread that started it is itself again

    def state():
        main = w._main_pid()
        policies = {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{main}/task")}
        group = None
        if os.path.exists(f"/proc/{main}/autogroup"):
            with open(f"/proc/{main}/autogroup") as f:
                group = f.read().split()[-1]  # "/autogroup-N nice K"
        return policies, group

    try:
        w.recv(time.monotonic() + 120, "ready")
        with open(f"/proc/{w._main_pid()}/cmdline", "rb") as f:  # the worker itself, not bubblewrap around it
            assert f.read().split(b"\0")[0] == os.fsencode(sys.executable)
        policies, group = state()
        assert policies == {os.SCHED_IDLE}
        assert group in (None, "19")
        wake_up(w.tree())
        policies, group = state()
        assert policies == {os.SCHED_OTHER}
        assert group in (None, "0")
    finally:
        w.kill()


@pytest.mark.slow
def test_two_cpu_workers_measure_real_candidates_at_once_in_their_sandboxes():
    sources = [seed_source(TASK), variant_sources(TASK)["torch_inplace"]]  # plain PyTorch: seconds each
    with MeasurePool(["cpu", "cpu"], measure.measure) as pool:
        assert "disturb each other" in pool.note
        results = [f.result(timeout=300) for f in [pool.submit(TASK, s, use_cache=False, quick=True) for s in sources]]
        mine = getattr(worker_set._THREAD, "workers", None)  # this thread's, from other tests
        pids = {w.proc.pid for ws in worker_set._ALL_SETS if ws is not mine for w, _ in ws.references.values()}
    assert [r["measurement"]["status"] for r in results] == ["ok", "ok"]
    assert {r["worker"] for r in results} == {"cpu:0", "cpu:1"}
    assert overlapping(*[(r["started"], r["ended"]) for r in results])
    assert all(r["measurement"]["sandbox"].startswith("bubblewrap") for r in results)
    assert len(pids) == 2  # a reference worker each, ended with the pool
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


# ---- Ray -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    pool = measure_pool.RayPool("local", measure.measure, num_cpus=2)
    yield pool
    pool.close()


@pytest.mark.e2e
def test_a_ray_node_measures_with_measure_py_in_its_sandbox(cluster):
    """The source travels in the task; measure.py on the node boots its sandboxed workers, which
    find the candidate's syntax error (a whole measurement is the same path, only longer)."""
    assert len(cluster) == 2 and cluster.device == "cpu"
    r = cluster.submit(TASK, "def custom_kernel(data):\n    return (\n", use_cache=False).result(timeout=300)
    m = r["measurement"]
    assert m["status"] == "compile_error" and m["sandbox"].startswith("bubblewrap") and "SyntaxError" in m["message"]
    assert r["worker"].startswith("ray:") and r["ended"] > r["started"]


def bits_in_pairs(task, source, *, meeting, **kw):
    """Travels to the Ray workers by value: BitMeasure's reward (1 + ones). The first two candidates
    wait for each other (so two measure at once, on two workers); the seed (no ones) waits for none."""
    if "1" in source:
        open(os.path.join(meeting, source.strip()), "w").close()
        deadline = time.time() + 60
        while len(os.listdir(meeting)) < 2 and time.time() < deadline:
            time.sleep(0.05)

    class Measured:
        def to_dict(self):
            return {"status": "ok", "speedup": 1.0 + source.count("1"), "message": "", "cases": []}
    return Measured()


@pytest.mark.e2e
def test_a_small_search_on_a_ray_local_cluster(cluster, tmp_path):
    import ray
    from test_search import BitMutator, cfg

    import search
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake travels to the workers
    pool = measure_pool.RayPool("local", measure_fn=bits_in_pairs)  # joins the running cluster
    (tmp_path / "meeting").mkdir()
    s = search.Search(cfg(budget=6), tmp_path / "ray", seed_code="00000000\n", mutator=BitMutator(), pool=pool,
                      measure_kwargs={"meeting": str(tmp_path / "meeting")}, progress=False, say=lambda *a: None)
    summary = s.run()
    assert summary["measurements"] == 6 and summary["best_speedup"] > 1
    events = [json.loads(line) for line in (tmp_path / "ray" / "events.jsonl").read_text().splitlines()]
    results = [e["payload"] for e in events if e["kind"] == "measurement" and e["request_id"] != "seed"]
    assert len(results) == 6 and all(r["worker"].startswith("ray:") for r in results)
    assert len({r["worker"] for r in results}) == 2
    assert most_at_once([(r["started"], r["ended"]) for r in results]) == 2  # the cluster's 2 CPUs


def die_in_the_middle(task, source, *, attempts_file, **kw):
    """Measures 'fine' kernels; kills the Ray worker that runs any other (every attempt)."""
    if source == "fine":
        return FakeMeasurement(source, **kw)
    with open(attempts_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.e2e
def test_a_ray_worker_killed_mid_task_is_retried_once_then_labelled_crashed(cluster, tmp_path):
    import ray
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake travels to the node
    attempts = tmp_path / "attempts"
    pool = measure_pool.RayPool("local", measure_fn=die_in_the_middle)
    doomed, fine = [pool.submit(TASK, source, attempts_file=str(attempts)) for source in ("doomed", "fine")]
    lost, ok = doomed.result(timeout=120), fine.result(timeout=120)
    assert ok["measurement"] == {"status": "ok", "speedup": 1.0, "source": "fine", "device": None, "gpu": None}
    assert lost["measurement"]["status"] == "crashed"
    assert "lost 2 times" in lost["measurement"]["message"]
    assert len(attempts.read_text().split()) == 2  # the first try and one retry, in two workers
    after = pool.submit(TASK, "fine", attempts_file=str(attempts)).result(timeout=120)  # the cluster goes on
    assert after["measurement"]["status"] == "ok"


def meet(task, source, *, meeting, n, **kw):
    """Travels to the Ray workers by value: waits (a minute at most) until n measurements have
    started, so that they are in flight together; the Ray task's own clock times it."""
    open(os.path.join(meeting, source), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(meeting)) < n and time.time() < deadline:
        time.sleep(0.05)
    return FakeMeasurement(source, **kw)


@pytest.mark.e2e
def test_a_ray_pool_on_cpu_keeps_as_many_in_flight_as_workers_asks(cluster, tmp_path):
    """On the 2-CPU cluster, workers=3 gives each task two thirds of a CPU: three measurements run
    at once, each in a Ray worker of its own, by the start and end times the workers took."""
    import ray
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = measure_pool.RayPool("local", measure_fn=meet, workers=3)  # joins the running cluster
    assert len(pool) == 3 and "3 measurements at a time on 2 shared CPUs" in pool.note
    results = [f.result(timeout=180) for f in [pool.submit(TASK, f"k{i}", meeting=str(tmp_path), n=3)
                                               for i in range(3)]]
    spans = [(r["started"], r["ended"]) for r in results]
    assert most_at_once(spans) == 3 and max(e - s for s, e in spans) < 60  # none waited out the minute
    assert len({r["worker"] for r in results}) == 3
    with pytest.raises(ValueError, match="at least 1"):
        measure_pool.RayPool("local", measure_fn=meet, workers=0)


def test_a_killed_processs_exchange_folder_is_removed_by_the_next(tmp_path):
    """A measuring process killed with SIGKILL leaves its exchange folder (inputs, handovers: in
    memory under /dev/shm); the next process to make one removes it, and never a live process's."""
    import subprocess

    from harness import worker_set
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{worker_set.EXCHANGE_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{worker_set.EXCHANGE_PREFIX}{os.getpid()}-def"
    other = tmp_path / "gpu-forecasters-measure-07y_5fcl"  # not one of ours by name: left alone
    for folder in (stale, live, other):
        (folder / "inputs").mkdir(parents=True)
    worker_set._remove_stale_exchanges(str(tmp_path))
    assert not stale.exists() and live.exists() and other.exists()
