"""Local measurement on worker processes: builds in parallel, timing exclusive.

Builds of a batch run first, on all cores; then the runner times candidates one
at a time with the machine otherwise idle, so no two timings (and no compile)
ever share the cores. Candidates whose generated source is identical (they differ
only in run-time knobs) are compiled once.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from codegen import get_backend
from schedules import get_template
from ir.settings import current
from tuner.measure import jobs
from tuner.measure.base import Builder, BuildResult, Runner
from tuner.measure.result import (BUILD_TIMEOUT, COMPILE_ERROR, OK, RUN_TIMEOUT, RUNTIME_ERROR, WORKER_DIED,
                                  WRONG_RESULT, MeasureInput, MeasureResult)
from tuner.measure.worker import Worker, WorkerDied, WorkerTimeout


def _request(inp: MeasureInput, **extra) -> dict:
    from ir.settings import current
    return {"workload": inp.workload.to_json(), "template": inp.template, "config": inp.config.to_json(),
            "fault": inp.fault, "settings": current().to_json(), **extra}


def source_key(inp: MeasureInput) -> str:
    t = get_template(inp.template)
    return get_backend().source_key(t.lower(inp.workload, inp.config).module)


class LocalBuilder(Builder):
    def __init__(self, n_workers: int | None = None, timeout: float = 120.0):
        self.timeout = timeout
        self.workers = [Worker({"NUMBA_NUM_THREADS": "1"}) for _ in range(n_workers or current().num_threads)]
        # threads that live as long as the builder: a worker dies with the thread that started it
        # (PR_SET_PDEATHSIG), so they must not come and go with each batch
        self._pool = ThreadPoolExecutor(len(self.workers), thread_name_prefix="builder")

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        keys = []
        for inp in inputs:
            try:
                keys.append(source_key(inp))
            except Exception as e:  # a template that cannot lower this config
                keys.append(f"error:{type(e).__name__}: {e}")
        unique = [k for k in dict.fromkeys(keys) if not k.startswith("error:")]
        first = {k: inputs[keys.index(k)] for k in unique}
        results: dict[str, BuildResult] = {}
        chunks = [unique[i::len(self.workers)] for i in range(len(self.workers))]
        for part in self._pool.map(lambda wc: self._build_all(*wc, first), zip(self.workers, chunks)):
            results.update(part)
        return [BuildResult(COMPILE_ERROR, k[6:]) if k.startswith("error:") else results[k] for k in keys]

    def _build_all(self, worker: Worker, keys: list[str], first: dict) -> dict:
        out = {}
        for k in keys:
            out[k] = self._build_one(worker, first[k])
        return out

    def _build_one(self, worker: Worker, inp: MeasureInput) -> BuildResult:
        try:
            reply = worker.call(jobs.build_job, _request(inp), self.timeout)
        except WorkerTimeout as e:
            return BuildResult(BUILD_TIMEOUT, f"build: {e}")
        except WorkerDied as e:
            return BuildResult(WORKER_DIED, f"build: {e}")
        if reply[0] != "ok":
            return BuildResult(COMPILE_ERROR, reply[1])
        return BuildResult(OK, compile_s=reply[1]["compile_s"], cached=bool(reply[1].get("cached")))

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class LocalRunner(Runner):
    """Times candidates one at a time in one worker process: `repeat` repeats of `number`
    calls (None: as many as fill `min_repeat_ms`), median kept, spread recorded;
    `flush_cache` evicts the caches before each repeat."""

    def __init__(self, timeout: float = 30.0, repeat: int = 5, min_repeat_ms: float = 20.0, check: bool = True,
                 number: int | None = None, flush_cache: bool = False):
        if repeat < 1 or (number is not None and number < 1):
            raise ValueError(f"repeat and number must be >= 1, got repeat={repeat}, number={number}")
        self.timeout, self.repeat, self.min_repeat_ms, self.check = timeout, repeat, min_repeat_ms, check
        self.number, self.flush_cache = number, flush_cache
        self.worker = Worker({"NUMBA_NUM_THREADS": "1"})

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        return list(self.stream(inputs, builds))

    def stream(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> Iterator[MeasureResult]:
        for inp, b in zip(inputs, builds):
            yield self._run_one(inp, b)

    def _run_one(self, inp: MeasureInput, build: BuildResult) -> MeasureResult:
        if build.status != OK:
            return MeasureResult(inp, build.status, error=build.error, compile_s=build.compile_s)
        req = _request(inp, repeat=self.repeat, min_repeat_ms=self.min_repeat_ms, check=self.check,
                       number=self.number, flush_cache=self.flush_cache)
        t0 = time.perf_counter()
        try:
            reply = self.worker.call(jobs.run_job, req, self.timeout)
        except WorkerTimeout as e:
            return MeasureResult(inp, RUN_TIMEOUT, error=f"run: {e}", compile_s=build.compile_s)
        except WorkerDied as e:
            return MeasureResult(inp, WORKER_DIED, error=f"run: {e}", compile_s=build.compile_s)
        run_s = time.perf_counter() - t0
        if reply[0] != "ok":
            return MeasureResult(inp, RUNTIME_ERROR, error=reply[1], compile_s=build.compile_s, run_s=run_s)
        r = reply[1]
        if "wrong" in r:
            return MeasureResult(inp, WRONG_RESULT, error=r["wrong"], compile_s=build.compile_s, run_s=run_s)
        return MeasureResult(inp, OK, latencies=r["latencies"], compile_s=build.compile_s, run_s=run_s)

    def close(self) -> None:
        self.worker.close()
