"""Local measurement on worker processes: builds in parallel, timing exclusive.

Builds of a batch run first, on all cores; then the runner times candidates one
at a time with the machine otherwise idle, so no two timings (and no compile)
ever share the cores: `LocalRunner.capacity` is 1, and the loop builds the next
batch only after the last one is timed. Candidates whose generated source is
identical (they differ only in run-time knobs) are compiled once.

The builder lowers each candidate here, has a worker compile each distinct loop
module into an artifact, and returns every candidate's `codegen.Kernel`; the
runner sends that kernel to its worker, which loads the artifact and times it.
"""
from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from codegen import Kernel, get_backend
from ir.settings import Settings, resolve
from schedules import get_template
from tuner.measure import jobs
from tuner.measure.base import Builder, BuildResult, Runner
from tuner.measure.result import (BUILD_TIMEOUT, COMPILE_ERROR, OK, RUN_TIMEOUT, RUNTIME_ERROR, WORKER_DIED,
                                  WRONG_RESULT, MeasureInput, MeasureResult)
from tuner.measure.worker import Worker, WorkerDied, WorkerTimeout

_SERIAL = {"NUMBA_NUM_THREADS": "1"}   # a worker's own numba threads would compete with its neighbours


class LocalBuilder(Builder):
    def __init__(self, n_workers: int | None = None, timeout: float = 120.0, settings: Settings | None = None):
        self.timeout, self.settings = timeout, resolve(settings)
        self.backend = get_backend(self.settings.backend, self.settings)
        self.workers = [Worker(_SERIAL) for _ in range(n_workers or self.settings.num_threads)]
        self.parallel = len(self.workers)
        # threads that live as long as the builder: a worker dies with the thread that started it
        # (PR_SET_PDEATHSIG), so they must not come and go with each batch
        self._pool = ThreadPoolExecutor(len(self.workers), thread_name_prefix="builder")
        self._free: "queue.SimpleQueue[Worker]" = queue.SimpleQueue()
        for w in self.workers:
            self._free.put(w)

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        lowered, keys = [], []
        for inp in inputs:
            try:
                low = get_template(inp.template).lower(inp.workload, inp.config)
                keys.append(self.backend.source_key(low.module))
                lowered.append(low)
            except Exception as e:  # a template that cannot lower this config
                keys.append(f"error:{type(e).__name__}: {e}")
                lowered.append(None)
        unique = [k for k in dict.fromkeys(keys) if not k.startswith("error:")]
        module = {k: lowered[keys.index(k)].module for k in unique}
        built = dict(self._pool.map(lambda k: (k, self._build_on_free(module[k])), unique))
        out = []
        for inp, low, k in zip(inputs, lowered, keys):
            if k.startswith("error:"):
                out.append(BuildResult(COMPILE_ERROR, k[6:]))
                continue
            result, artifact = built[k]
            if result.status != OK:
                out.append(result)
                continue
            kernel = Kernel(inp.workload, inp.template, inp.config, low, artifact)
            out.append(BuildResult(OK, compile_s=result.compile_s, cached=result.cached, kernel=kernel))
        return out

    def _build_on_free(self, module) -> tuple[BuildResult, object]:
        """Compile on whichever worker is free: a long compile never holds up the short ones
        a fixed split would have queued behind it."""
        worker = self._free.get()
        try:
            return self._build_one(worker, module)
        finally:
            self._free.put(worker)

    def _build_one(self, worker: Worker, module) -> tuple[BuildResult, object]:
        try:
            reply = worker.call(jobs.build_job, {"module": module, "settings": self.settings.to_json()},
                                self.timeout)
        except WorkerTimeout as e:
            return BuildResult(BUILD_TIMEOUT, f"build: {e}"), None
        except WorkerDied as e:
            return BuildResult(WORKER_DIED, f"build: {e}"), None
        if reply[0] != "ok":
            return BuildResult(COMPILE_ERROR, reply[1]), None
        art = reply[1]
        return BuildResult(OK, compile_s=art.compile_s, cached=art.cached), art

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def run_request(inp: MeasureInput, build: BuildResult, settings: Settings, **knobs) -> dict:
    """What a worker needs to check and time one built candidate: its kernel (data: the lowered
    launch and the artifact; nothing is looked up, lowered or compiled there), the settings, the knobs."""
    return {"settings": settings.to_json(), "fault": inp.fault, "kernel": build.kernel, **knobs}


class LocalRunner(Runner):
    """Times candidates one at a time per worker process: `repeat` repeats of `number`
    calls (None: as many as fill `min_repeat_ms`), median kept, spread recorded;
    `flush_cache` evicts the caches before each repeat.

    On the CPU there is one worker (capacity 1). On a GPU backend there is one worker per
    GPU, each seeing only its own (CUDA_VISIBLE_DEVICES), and `capacity` batches are timed
    at once, one per GPU. A CUDA error leaves a CUDA context unusable, so a worker whose
    candidate failed at run time on a GPU is replaced before the next one."""

    capacity = 1   # one host: timings never overlap each other or a build

    def __init__(self, timeout: float = 30.0, repeat: int = 5, min_repeat_ms: float = 20.0, check: bool = True,
                 number: int | None = None, flush_cache: bool = False, settings: Settings | None = None,
                 devices: int | None = None):
        if repeat < 1 or (number is not None and number < 1):
            raise ValueError(f"repeat and number must be >= 1, got repeat={repeat}, number={number}")
        self.timeout, self.repeat, self.min_repeat_ms, self.check = timeout, repeat, min_repeat_ms, check
        self.number, self.flush_cache = number, flush_cache
        self.settings = resolve(settings)
        backend = get_backend(self.settings.backend, self.settings)
        self.device = backend.device
        if self.device:
            n = devices or backend.device_count()
            self.workers = [Worker({**_SERIAL, "CUDA_VISIBLE_DEVICES": str(i)} if n > 1 else _SERIAL)
                            for i in range(n)]
        else:
            self.workers = [Worker(_SERIAL)]
        self.worker = self.workers[0]
        self.capacity = len(self.workers)
        if self.capacity > 1:
            self._free: "queue.Queue[Worker]" = queue.Queue()
            for w in self.workers:
                self._free.put(w)
            self._done: "queue.Queue[tuple]" = queue.Queue()
            self._pool = ThreadPoolExecutor(self.capacity, thread_name_prefix="gpu-runner")
            self._in_flight = 0

    def submit(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> int:
        if self.capacity == 1:
            return super().submit(inputs, builds)
        from tuner.measure.base import _tickets
        ticket = next(_tickets)
        self._in_flight += len(inputs)

        def measure_batch():
            worker = self._free.get()
            try:
                for inp, b in zip(inputs, builds):
                    try:
                        r = self._run_one(inp, b, worker)
                    except Exception as e:  # never lose a result: the loop waits for one per input
                        r = MeasureResult(inp, RUNTIME_ERROR, error=f"run: {type(e).__name__}: {e}")
                    self._done.put((ticket, r))
            finally:
                self._free.put(worker)
        self._pool.submit(measure_batch)
        return ticket

    def next_result(self) -> tuple[int, MeasureResult]:
        if self.capacity == 1:
            return super().next_result()
        if self._in_flight <= 0:
            raise RuntimeError("next_result: no batch in flight")
        self._in_flight -= 1
        return self._done.get()

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        return list(self.stream(inputs, builds))

    def stream(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> Iterator[MeasureResult]:
        for inp, b in zip(inputs, builds):
            yield self._run_one(inp, b)

    def _run_one(self, inp: MeasureInput, build: BuildResult, worker: Worker | None = None) -> MeasureResult:
        worker = worker or self.worker
        if build.status != OK:
            return MeasureResult(inp, build.status, error=build.error, compile_s=build.compile_s)
        if build.kernel is None:
            return MeasureResult(inp, RUNTIME_ERROR, error="the builder gave no kernel to run (a builder that "
                                 "builds nothing, as `replay`, goes with its own runner)")
        req = run_request(inp, build, self.settings, repeat=self.repeat, min_repeat_ms=self.min_repeat_ms,
                          check=self.check, number=self.number, flush_cache=self.flush_cache)
        t0 = time.perf_counter()
        try:
            reply = worker.call(jobs.run_job, req, self.timeout)
        except WorkerTimeout as e:
            return MeasureResult(inp, RUN_TIMEOUT, error=f"run: {e}", compile_s=build.compile_s)
        except WorkerDied as e:
            return MeasureResult(inp, WORKER_DIED, error=f"run: {e}", compile_s=build.compile_s)
        run_s = time.perf_counter() - t0
        if reply[0] != "ok":
            if self.device:   # a CUDA error poisons the context: the next candidate gets a fresh worker
                worker.kill()
            return MeasureResult(inp, RUNTIME_ERROR, error=reply[1], compile_s=build.compile_s, run_s=run_s)
        r = reply[1]
        if "wrong" in r:
            return MeasureResult(inp, WRONG_RESULT, error=r["wrong"], compile_s=build.compile_s, run_s=run_s,
                                 target=r.get("target"))
        return MeasureResult(inp, OK, latencies=r["latencies"], compile_s=build.compile_s, run_s=run_s,
                             target=r.get("target"))

    def close(self) -> None:
        for w in self.workers:
            w.close()
        if self.capacity > 1:
            self._pool.shutdown(wait=False, cancel_futures=True)
