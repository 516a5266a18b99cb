"""measure_pool.py: measure several candidates at once, each on a device of its own.

The paper measured its searches in parallel on cloud GPUs. One step of its search already holds 8
independent measurements (2 parents x 4 children), and the surrogate-filtered search forecasts 16
children per parent while earlier ones are measured: a user with an 8-GPU node who measures one
candidate at a time uses an eighth of it. This module runs measurements side by side, through
measure.measure() unchanged (the same sandbox, verification and clock on every worker):

  MeasurePool   pool workers in this process, one per device. Each is a long-lived thread that
                owns its device (a GPU; on CPU a share of the cores) and measures one candidate at
                a time with its own reference worker and candidate sandboxes, pinned to its GPU
                (harness/worker_set.py keeps a thread's workers; a worker's die-with-parent signal follows
                the thread that started it, so the threads live as long as the pool).
  RayPool       the same on a Ray cluster (one machine or many): each measurement is a Ray task
                that asks for one GPU (on CPU a share of the CPUs, so that as many measurements
                are in flight as --workers asks, or as the cluster has CPUs), carries the candidate's source, runs
                measure.py on the node that Ray picks (sandbox included) and sends its result back.
                A task whose worker or node dies is retried once elsewhere, then labelled `crashed`.

Both answer submit(task, source, **measure_kwargs) with a concurrent.futures.Future of a dict:
the measurement, the worker that ran it, and when it started and ended (time.time() on the
worker's machine). measure_fn is what a worker calls: measure.measure, which search_setup passes
(a test passes a stand-in); the pool never imports measure.py, the entry point above it.

What may overlap. Two timings on one GPU spoil both, and a candidate's code (its import, its JIT
compile, its correctness calls) runs on the GPU it is given: a hostile candidate could slow a
rival's timing from there. So a device runs one measurement at a time, and only the harness's own
work overlaps it: the spare sandboxes that boot (Python, torch, the task; no candidate code) while
a candidate is measured. On CPU there is no such isolation at all: workers share the cores and the
memory bandwidth, and their CPU times disturb each other (`note` says so; keep one worker for
figures you report). Ray workers on one node share its CPUs the same way.
"""
import concurrent.futures
import logging
import os
import queue
import threading
import time

from harness import measure_sandbox, worker_set


def pool_devices(devices="all", workers=None):
    """The pool's devices: 'cuda:i' for each GPU asked for (--devices all | 0,1,3), or 'cpu' once
    per worker (--workers N, default 1) on a machine without one. A ValueError says what is wrong."""
    import torch
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if n_gpus == 0:
        if devices not in (None, "all"):
            raise ValueError(f"--devices {devices} names GPUs but none is visible; on CPU use --workers N")
        return ["cpu"] * (workers or 1)
    if devices in (None, "all"):
        ids = list(range(n_gpus))
    else:
        try:
            ids = [int(d) for d in devices.split(",")]
        except ValueError:
            raise ValueError(f"--devices takes 'all' or GPU indices like 0,1,3, got {devices!r}") from None
        bad = [i for i in ids if not 0 <= i < n_gpus]
        if bad:
            raise ValueError(f"--devices {devices}: GPU {bad[0]} is not among the {n_gpus} visible (0..{n_gpus - 1})")
        if len(set(ids)) != len(ids):
            raise ValueError(f"--devices {devices} names a GPU twice; two timings sharing a GPU spoil both")
    if workers is not None:
        if workers > len(ids):
            raise ValueError(f"--workers {workers}: at most one worker per GPU, and {len(ids)} are in use")
        ids = ids[:workers]
    return [f"cuda:{i}" for i in ids]


class MeasurePool:
    """Pool workers in this process, one per device (see the module docstring). submit() queues a
    candidate; the first free worker takes it, so candidates start in the order they came."""

    def __init__(self, devices, measure_fn):
        self.devices, self.measure_fn = list(devices), measure_fn
        self.names = [d if d.startswith("cuda") else f"cpu:{i}" for i, d in enumerate(self.devices)]
        cpu_workers = self.devices.count("cpu")
        self.note = (f"{cpu_workers} CPU workers share this machine's {os.cpu_count()} cores: their CPU "
                     "timings disturb each other; measure with one worker for figures you keep"
                     if cpu_workers > 1 else "")
        self.jobs = queue.Queue()
        self.threads = [threading.Thread(target=self._serve, args=(name, device), name=f"measure-{name}", daemon=True)
                        for name, device in zip(self.names, self.devices)]
        for t in self.threads:
            t.start()

    def __len__(self):
        return len(self.devices)

    def submit(self, task, source, **measure_kwargs):
        future = concurrent.futures.Future()
        self.jobs.put((future, task, source, measure_kwargs))
        return future

    def _serve(self, name, device):
        """One pool worker: its device, one measurement at a time, until close()."""
        pinned = dict(device=device.split(":")[0], gpu=int(device.split(":")[1]) if device.startswith("cuda") else None)
        try:
            while (job := self.jobs.get()) is not None:
                future, task, source, kwargs = job
                if not future.set_running_or_notify_cancel():
                    continue
                started = time.time()
                try:
                    m = self.measure_fn(task, source, **kwargs, **pinned)
                except BaseException as e:  # the trusted side failed, or bad usage: the caller decides
                    future.set_exception(e)
                    continue
                ended = time.time()
                future.set_result(dict(measurement=m.to_dict(), worker=name, started=started, ended=ended,
                                       seconds=ended - started))
        finally:
            worker_set.release_workers()  # from this thread, which started them

    def close(self, wait=True):
        """Cancel what no worker has started, end the workers and their processes once their
        measurements are done (wait=False: without waiting for them; at exit, say)."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads if wait else ():
            t.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------
# A Ray cluster: the distributed engine, so no scheduler or RPC of our own.
# ---------------------------------------------------------------------------------------------

RAY_RETRIES = 1   # a task whose worker or node died runs once more, elsewhere when Ray can


def _measure_on_node(measure_fn, task, source, kwargs):
    """A Ray task: measure.py on the node that runs it (its sandbox, its reference worker), on the
    GPU that Ray gave the task (Ray sets CUDA_VISIBLE_DEVICES; measure_sandbox passes it on)."""
    import ray
    started = time.time()
    m = measure_fn(task, source, **kwargs)
    ended = time.time()
    gpus = ray.get_gpu_ids()
    where = f"cuda{','.join(map(str, gpus))}" if gpus else f"cpu-pid{os.getpid()}"
    return dict(measurement=m.to_dict(), worker=f"ray:{ray.util.get_node_ip_address()}:{where}",
                started=started, ended=ended, seconds=ended - started)


class RayPool:
    """Measurements as Ray tasks. address: 'local' starts a cluster on this machine (or uses the one
    this process already started), 'auto' joins the cluster running here (`ray start --head` and
    `ray start --address HEAD:6379` on the other nodes), or a cluster's address. num_cpus: the
    CPUs a local cluster offers (default: the cores this process may run on; Ray's own count
    rounds a container's CPU quota down, to 1 on a 1.5-core quota). workers: on a cluster without
    GPUs, the measurements in flight (default: one per CPU); on GPUs it is one per GPU."""

    def __init__(self, address, measure_fn, num_cpus=None, workers=None):
        import ray
        self.ray, self.measure_fn = ray, measure_fn
        self.owns_cluster = not ray.is_initialized()
        if self.owns_cluster:
            # The project's code travels to every node with the job (Ray's working_dir, which
            # leaves out what .gitignore names); the nodes need only the same Python environment.
            runtime_env = {"working_dir": measure_sandbox.ROOT}
            local = {"include_dashboard": False, "num_cpus": num_cpus or len(os.sched_getaffinity(0))}
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING,
                     **(local if address == "local" else {}))
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), resources.get("CPU", 1)
        if workers is not None and workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        self.device = "cuda" if gpus else "cpu"
        self.workers = gpus or workers or max(int(cpus), 1)
        self.note = ("--workers applies on CPU: on GPUs each measurement takes one" if gpus and workers else
                     "" if gpus else f"Ray on CPU: {self.workers} measurements at a time on {cpus:g} shared CPUs; "
                     "their CPU timings disturb each other")
        # On CPU each task asks for its share of the cluster, so that Ray runs `workers` at once.
        self.task = ray.remote(_measure_on_node).options(
            num_gpus=1 if gpus else 0, num_cpus=1 if gpus else min(1.0, cpus / self.workers),
            max_retries=RAY_RETRIES, retry_exceptions=False)

    def __len__(self):
        return self.workers

    def submit(self, task, source, **measure_kwargs):
        """The source travels in the task; the result (or the reason it was lost) comes back here."""
        ray, out, sent = self.ray, concurrent.futures.Future(), time.time()
        ref = self.task.remote(self.measure_fn, task, source, measure_kwargs)
        out.set_running_or_notify_cancel()

        def arrived(f):
            try:
                out.set_result(f.result())
            except ray.exceptions.RayTaskError as e:  # measure() raised: the harness's error, not a crash
                out.set_exception(e.as_instanceof_cause())
            except ray.exceptions.RayError as e:  # the worker or its node died, twice
                # measure.Measurement's fields that a crash has (the others are absent, as in
                # the record of a measurement that crashed on its own)
                m = dict(task=task, status="crashed", speedup=None, cases=[], message=(
                    f"the Ray worker measuring it was lost {RAY_RETRIES + 1} times (retried on another "
                    f"worker): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")[:2000])
                now = time.time()
                out.set_result(dict(measurement=m, worker="ray:lost", started=sent, ended=now,
                                    seconds=now - sent))

        ref.future().add_done_callback(arrived)
        return out

    def close(self, wait=True):
        """Leave the cluster (and stop it when this pool started it); tasks in flight are lost,
        and a resumed search sends them again."""
        if self.owns_cluster:
            self.ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
