"""Measurement on a Ray cluster: `RayBuilder` and `RayRunner` (registered as "ray").

Where things run, and why timings stay exclusive per node:

- `RayRunner` places one runner actor on every alive node (hard node-affinity
  scheduling) that holds *all* of that node's CPUs, so Ray schedules no other
  CPU task (no build task, no second timing) there while it lives. The actor
  handles one call at a time and runs the job in a `tuner.measure.worker.Worker`
  child (as the local runner does: timeouts, a crashing kernel costs one
  result and a fresh child, never the actor). Its kernels run with the node's
  CPU count as threads (`Settings.threads`, `NUMBA_NUM_THREADS`), so each node
  measures under its own target (`Target.key` includes the threads) and every
  result names the target of the node that measured it.
- `RayBuilder` lowers each candidate on the driver (cheap) and dedupes
  identical sources. While a `RayRunner` of this process holds the nodes, it
  does not compile: each kernel goes to the actor that times it, which
  compiles it there (once per distinct source: the actor's worker child keeps
  what it compiled) right before timing it, so a compile never shares a
  node's cores with a timing. Without a live `RayRunner` (`--builder ray --runner local`) it
  compiles as Ray tasks anywhere (one CPU each, `NUMBA_NUM_THREADS=1`) and
  returns every kernel with its artifact.
- Retries: a result lost to Ray itself (the actor's process killed, the actor
  killed, its node gone, the actor's worker child SIGKILLed from outside: Ray
  kills an exiting actor's children first, so `ray.kill` can show as that) is submitted again to another healthy actor, up to
  `retries` more times, and only then recorded as `worker_died`. The failed
  actor takes no new work until a ping says it is back (Ray restarts it:
  `max_restarts`; a failed ping is tried again while its node is alive); an
  actor whose node is gone, or that stays silent `ping_timeout` s, leaves the pool.
  A kernel that kills its own child process is the kernel's fault, not the
  node's: it is recorded as `worker_died` at once, as the local runner does.
- Targets: every node describes its target when its actor starts; `target_key`
  keeps only the actors of nodes of that key (`tune --target-key`). The tuning
  loop's own target (claims, resume, the search's history) is `RayRunner.target`,
  the first kind of node; on a cluster of several kinds each record still names
  the node that measured it, and `--target-key` tunes one kind as a whole.
- The driver's node: if `tune` runs on a cluster node, its search and database
  work share that node's cores with its actor; start that node with
  `ray start --head --num-cpus 0` to keep timings off it.

`import ray` happens only here, and only when a Ray stage is created.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import socket
import time
import weakref
from collections.abc import Iterator

from codegen import Target, get_backend
from ir.errors import TensortuneError
from ir.settings import Settings, resolve
from schedules import get_template
from tuner.measure import jobs
from tuner.measure.base import Builder, BuildResult, Runner
from tuner.measure.result import (BUILD_TIMEOUT, COMPILE_ERROR, OK, RUNTIME_ERROR, WORKER_DIED, MeasureInput,
                                  MeasureResult)

_RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
_live_runners: "weakref.WeakSet[RayRunner]" = weakref.WeakSet()   # builders defer their compiles to these
_tickets = itertools.count(1)


class RayError(TensortuneError):
    """Ray is missing, no cluster answers at the address, or no node fits the filter."""


class ChildKilled(Exception):
    """Raised in an actor whose worker child was SIGKILLed by someone else: Ray killing the
    exiting actor's children (`ray.kill`), or the OOM killer. The node lost the result, the
    kernel did not crash, so the driver retries it elsewhere as for a lost actor."""


def _import_ray():
    for k, v in _RAY_ENV.items():
        os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError as e:
        raise RayError(f"the Ray runner needs Ray: pip install 'tensortune[cluster]' ({e})") from None
    return ray


def _answers(address: str, timeout: float = 3.0) -> bool:
    """Whether something listens at a HOST:PORT address (ray.init would wait long to find out)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return True   # not HOST:PORT: let Ray judge it
    try:
        with socket.create_connection((host, int(port)), timeout):
            return True
    except OSError:
        return False


def connect(address: str = "auto"):
    """The `ray` module, connected to the cluster at `address` ("auto": the one started on
    this machine with `ray start`; HOST:PORT: its head). An already connected driver
    (a test's cluster) is used as it is. No answer is one clear error."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    if not _answers(address):
        raise RayError(f"no Ray cluster answers at {address} (start one with `ray start --head`, "
                       "or give the head's HOST:PORT)")
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise RayError(f"cannot connect to a Ray cluster at {address}: {str(e).splitlines()[0] if str(e) else e}") \
            from None
    return ray


# ---------------------------------------------------------------- worker side (actor, build tasks)

def _target_job(req: dict) -> dict:
    """Runs in the actor's child: the target this node measures under."""
    return jobs._backend(req).target().describe()


def _build_reply(reply) -> tuple[BuildResult, object]:
    if reply[0] != "ok":
        return BuildResult(COMPILE_ERROR, reply[1]), None
    art = reply[1]
    return BuildResult(OK, compile_s=art.compile_s, cached=art.cached), art


class NodeRunner:
    """The runner actor of one node (made remote in `RayRunner`): it compiles what it is
    given unbuilt, then checks and times, one candidate per call, in a worker child."""

    def __init__(self, settings: dict, threads: int, run_timeout: float, build_timeout: float, knobs: dict):
        from tuner.measure.local import LocalRunner
        from tuner.measure.worker import Worker
        self.settings = Settings.from_json(settings).with_(threads=threads)
        self.worker = Worker({"NUMBA_NUM_THREADS": str(threads)})
        self.local = LocalRunner(timeout=run_timeout, settings=self.settings, **knobs)
        self.local.worker.close()
        self.local.worker = self.worker        # one child process builds and times: never both at once
        self.build_timeout = build_timeout

    def describe(self) -> dict:
        target = self.worker.call(_target_job, {"settings": self.settings.to_json()}, 120.0)
        if target[0] != "ok":
            raise RuntimeError(f"the node cannot describe its target: {target[1]}")
        return {"pid": os.getpid(), "target": target[1], "threads": self.settings.threads}

    def ping(self) -> int:
        return os.getpid()

    def measure(self, inp: MeasureInput, build: BuildResult) -> MeasureResult:
        """Compile the kernel first if it comes unbuilt (a candidate whose source this child
        already compiled loads from its modules at once: identical sources compile once).
        Test hook: `fault="exit-actor"` kills this actor's own process (a lost node, in small)."""
        if inp.fault == "exit-actor":
            os._exit(1)
        if build.status == OK and build.kernel is not None and build.kernel.artifact is None:
            built, art = self._build(build.kernel.lowered.module)
            if built.status != OK:
                self._raise_if_killed(built.status)
                return MeasureResult(inp, built.status, error=built.error, compile_s=built.compile_s)
            build = BuildResult(OK, compile_s=built.compile_s, cached=built.cached,
                                kernel=dataclasses.replace(build.kernel, artifact=art))
        r = self.local._run_one(inp, build)
        self._raise_if_killed(r.status)
        return r

    def _raise_if_killed(self, status: str) -> None:
        """A child that died of SIGKILL was killed from outside (a kernel crashes with SIGSEGV,
        SIGBUS, SIGILL or an exit code; our own timeouts are not WORKER_DIED)."""
        if status == WORKER_DIED and self.worker.last_exit == -signal.SIGKILL:
            raise ChildKilled(f"the worker child on this node was SIGKILLed from outside (pid {os.getpid()})")

    def _build(self, module) -> tuple[BuildResult, object]:
        from tuner.measure.worker import WorkerDied, WorkerTimeout
        try:
            reply = self.worker.call(jobs.build_job, {"module": module, "settings": self.settings.to_json()},
                                     self.build_timeout)
        except WorkerTimeout as e:
            return BuildResult(BUILD_TIMEOUT, f"build: {e}"), None
        except WorkerDied as e:
            return BuildResult(WORKER_DIED, f"build: {e}"), None
        return _build_reply(reply)


def _build_task(module, settings: dict):
    """A Ray task: compile one loop module in this (serial) Ray worker."""
    return jobs.build_job({"module": module, "settings": settings})


# ---------------------------------------------------------------- driver side

def lower_all(inputs: list[MeasureInput], backend) -> tuple[list, list]:
    """(lowered or None, source key or "error:..." ) per input, as LocalBuilder lowers them."""
    lowered, keys = [], []
    for inp in inputs:
        try:
            low = get_template(inp.template).lower(inp.workload, inp.config)
            keys.append(backend.source_key(low.module))
            lowered.append(low)
        except Exception as e:  # a template that cannot lower this config
            keys.append(f"error:{type(e).__name__}: {e}")
            lowered.append(None)
    return lowered, keys


class RayBuilder(Builder):
    """Builds on the cluster: inside the runner actors that time the kernels when a
    `RayRunner` holds the nodes (see the module docstring), else as Ray tasks anywhere."""

    def __init__(self, timeout: float = 120.0, settings: Settings | None = None, address: str = "auto"):
        self.timeout, self.settings, self.address = timeout, resolve(settings), address
        self.backend = get_backend(self.settings.backend, self.settings)
        self._remote = None

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        from codegen import Kernel
        lowered, keys = lower_all(inputs, self.backend)
        deferred = bool(_live_runners)
        built = {} if deferred else self._compile({k: low.module for k, low in zip(keys, lowered)
                                                   if not k.startswith("error:")})
        out = []
        for inp, low, k in zip(inputs, lowered, keys):
            if k.startswith("error:"):
                out.append(BuildResult(COMPILE_ERROR, k[6:]))
                continue
            if deferred:   # compiled by the actor that times it
                kernel = Kernel(inp.workload, inp.template, inp.config, low, None)
                out.append(BuildResult(OK, kernel=kernel))
                continue
            result, art = built[k]
            if result.status != OK:
                out.append(result)
                continue
            out.append(BuildResult(OK, compile_s=result.compile_s, cached=result.cached,
                                   kernel=Kernel(inp.workload, inp.template, inp.config, low, art)))
        return out

    def _compile(self, modules: dict) -> dict:
        ray = connect(self.address)
        if self._remote is None:
            self._remote = ray.remote(num_cpus=1, max_retries=2,
                                      runtime_env={"env_vars": {"NUMBA_NUM_THREADS": "1"}})(_build_task)
        settings = self.settings.to_json()
        refs = {self._remote.remote(m, settings): k for k, m in modules.items()}
        out: dict = {}
        if not refs:
            return out
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=self.timeout)
        for ref in ready:
            try:
                art = ray.get(ref)
                out[refs[ref]] = (BuildResult(OK, compile_s=art.compile_s, cached=art.cached), art)
            except ray.exceptions.RayTaskError as e:   # the compile raised: the candidate's error
                cause = e.cause if getattr(e, "cause", None) is not None else e
                out[refs[ref]] = (BuildResult(COMPILE_ERROR, f"{type(cause).__name__}: {cause}"), None)
            except ray.exceptions.RayError as e:       # its worker or node died, retries spent
                out[refs[ref]] = (BuildResult(WORKER_DIED, f"build: {type(e).__name__}: {e}"), None)
        for ref in late:
            ray.cancel(ref, force=True)
            out[refs[ref]] = (BuildResult(BUILD_TIMEOUT, f"build: no answer within {self.timeout:.0f} s"), None)
        return out


@dataclasses.dataclass
class _Item:
    ticket: int
    input: MeasureInput
    build: BuildResult
    attempts: int = 0
    actor: int = -1          # index into RayRunner.actors of the current attempt
    errors: list = dataclasses.field(default_factory=list)


class RayRunner(Runner):
    """One runner actor per matching node; `capacity` = their number, so the tuning loop
    keeps that many batches in flight. A batch goes to the least loaded healthy actor;
    results stream back (ray.wait) as each candidate finishes."""

    def __init__(self, timeout: float = 30.0, repeat: int = 5, min_repeat_ms: float = 20.0, check: bool = True,
                 number: int | None = None, flush_cache: bool = False, settings: Settings | None = None,
                 address: str = "auto", target_key: str | None = None, retries: int = 2,
                 build_timeout: float = 120.0, max_restarts: int = 8, ping_timeout: float = 120.0):
        if repeat < 1 or (number is not None and number < 1):
            raise ValueError(f"repeat and number must be >= 1, got repeat={repeat}, number={number}")
        self.ray = ray = connect(address)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        self.settings, self.retries, self.timeout, self.ping_timeout = resolve(settings), retries, timeout, ping_timeout
        knobs = {"repeat": repeat, "min_repeat_ms": min_repeat_ms, "check": check, "number": number,
                 "flush_cache": flush_cache}
        remote = ray.remote(NodeRunner)
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
        if not nodes:
            raise RayError("the Ray cluster has no alive node with a CPU to measure on")
        made = []
        for n in nodes:
            cpus = int(n["Resources"]["CPU"])
            actor = remote.options(
                num_cpus=cpus, max_restarts=max_restarts, max_task_retries=0, max_concurrency=1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                runtime_env={"env_vars": {"NUMBA_NUM_THREADS": str(cpus)}},
            ).remote(self.settings.to_json(), cpus, timeout, build_timeout, knobs)
            made.append((n["NodeID"], actor, actor.describe.remote()))
        self.actors, self.nodes, self.targets, self.pids = [], [], [], []
        seen = []
        for node_id, actor, ref in made:
            try:
                d = ray.get(ref, timeout=300)
            except Exception as e:  # a node that cannot start an actor: measured without it
                ray.kill(actor)
                seen.append(f"{node_id[:8]}: {type(e).__name__}")
                continue
            seen.append(f"{node_id[:8]}: {d['target']['key']}")
            if target_key and d["target"]["key"] != target_key:
                ray.kill(actor)
                continue
            self.actors.append(actor)
            self.nodes.append(node_id)
            self.targets.append(Target.from_json(d["target"]))
            self.pids.append(d["pid"])
        if not self.actors:
            why = f"no node's target key is {target_key}" if target_key else "no node could start a runner actor"
            raise RayError(f"{why} (nodes: {', '.join(seen)})")
        self.capacity = len(self.actors)
        self.target = self.targets[0]   # the loop's target (claims, resume): the first node kind
        self.healthy = set(range(len(self.actors)))
        self.dead: set[int] = set()
        self.load = [0] * len(self.actors)
        self.pending: dict = {}     # ObjectRef -> _Item
        self.pings: dict = {}       # ObjectRef -> (actor index, since when it is suspect)
        self.repings: list = []     # (when, actor index, since): pings to send again
        self.waiting: list[_Item] = []   # no healthy actor right now
        self.done: list[tuple[int, MeasureResult]] = []
        self.retried = 0            # candidates submitted again after losing their actor or node
        _live_runners.add(self)

    # -- the Runner interface
    def submit(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> int:
        ticket = next(_tickets)
        self._refresh()
        actor = self._pick()
        for inp, b in zip(inputs, builds):
            item = _Item(ticket, inp, b)
            if b.status != OK or b.kernel is None:   # failed builds pass through, as LocalRunner does
                self.done.append((ticket, self._unmeasured(inp, b)))
                continue
            self._send(item, actor)
        return ticket

    def next_result(self) -> tuple[int, MeasureResult]:
        ray = self.ray
        while not self.done:
            self._send_due_pings()
            if not self.pending and not self.pings and not self.repings:
                if not self.waiting:
                    raise RuntimeError("next_result: no batch in flight")
                for item in self.waiting:   # no actor left at all, none coming back
                    self._fail(item, "no runner actor is left on the cluster; " + "; ".join(item.errors))
                self.waiting.clear()
                continue
            ready, _ = ray.wait(list(self.pending) + list(self.pings), num_returns=1,
                                timeout=1.0 if self.repings else 5.0)
            if not ready:
                self._expire_pings()
                continue
            ref = ready[0]
            if ref in self.pings:
                self._pinged(ref, *self.pings.pop(ref))
                continue
            item = self.pending.pop(ref)
            self.load[item.actor] -= 1
            try:
                r = ray.get(ref)
                r.input = item.input   # the tuner's own object, not the copy that travelled
                self.done.append((item.ticket, r))
            except ray.exceptions.RayTaskError as e:   # the actor's code raised: a bug, one result,
                if isinstance(e.cause, ChildKilled):    # unless the node killed its child: retried
                    self._lost(item, e)
                    continue
                self.done.append((item.ticket, MeasureResult(item.input, RUNTIME_ERROR,
                                                             error=f"runner actor: {e}"[:2000],
                                                             compile_s=item.build.compile_s)))
            except ray.exceptions.RayError as e:       # the actor, its process or its node died
                self._lost(item, e)
        return self.done.pop(0)

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        return list(self.stream(inputs, builds))

    def stream(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> Iterator[MeasureResult]:
        """One batch alone, results in input order."""
        ticket = self.submit(inputs, builds)
        by_input: dict[int, MeasureResult] = {}
        order = {id(inp): i for i, inp in enumerate(inputs)}
        nxt = 0
        while nxt < len(inputs):
            t, r = self.next_result()
            assert t == ticket
            by_input[order[id(r.input)]] = r
            while nxt in by_input:
                yield by_input.pop(nxt)
                nxt += 1

    def close(self) -> None:
        _live_runners.discard(self)
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a)
            except Exception:
                pass
        self.actors = []

    # -- placement and faults
    def _pick(self, avoid: int | None = None) -> int | None:
        choice = [i for i in self.healthy if i != avoid] or [i for i in self.healthy]
        return min(choice, key=lambda i: (self.load[i], i)) if choice else None

    def _send(self, item: _Item, actor: int | None) -> None:
        if actor is None:
            self.waiting.append(item)
            return
        item.actor, item.attempts = actor, item.attempts + 1
        self.load[actor] += 1
        self.pending[self.actors[actor].measure.remote(item.input, item.build)] = item

    def _lost(self, item: _Item, e: Exception) -> None:
        """Its actor failed: retry elsewhere (or record worker_died once retries run out)."""
        a = item.actor
        item.errors.append(f"{type(e).__name__} on node {self.nodes[a][:8]}")
        if a in self.healthy:   # no new work until a ping says it is back
            self.healthy.discard(a)
            self._ping(a, time.monotonic())
        if item.attempts > self.retries:
            self._fail(item, f"lost {item.attempts} times ({'; '.join(item.errors)})")
            return
        self.retried += 1
        self._send(item, self._pick(avoid=a))

    def _ping(self, a: int, since: float) -> None:
        self.pings[self.actors[a].ping.remote()] = (a, since)

    def _send_due_pings(self) -> None:
        now = time.monotonic()
        due = [(a, since) for when, a, since in self.repings if when <= now]
        self.repings = [x for x in self.repings if x[0] > now]
        for a, since in due:
            self._ping(a, since)

    def _expire_pings(self) -> None:
        """An actor that has not answered a ping within `ping_timeout` seconds is given up."""
        now = time.monotonic()
        for ref, (a, since) in list(self.pings.items()):
            if now - since > self.ping_timeout:
                del self.pings[ref]
                self.dead.add(a)

    def _pinged(self, ref, a: int, since: float) -> None:
        """A ping came back: the actor serves again; or it failed: gone for good if its node
        is, else (Ray is restarting it) ping again in a second, until `ping_timeout`."""
        try:
            self.pids[a] = self.ray.get(ref)   # a restarted actor has a new process
        except self.ray.exceptions.RayError:
            if not self._node_alive(a) or time.monotonic() - since > self.ping_timeout:
                self.dead.add(a)
            else:
                self.repings.append((time.monotonic() + 1.0, a, since))
            return
        self.healthy.add(a)
        waiting, self.waiting = self.waiting, []
        for item in waiting:
            self._send(item, self._pick())

    def _node_alive(self, a: int) -> bool:
        return any(n["NodeID"] == self.nodes[a] and n.get("Alive") for n in self.ray.nodes())

    def _refresh(self) -> None:
        """Take the pings that came back meanwhile (no waiting), so a batch goes to every healthy actor."""
        self._send_due_pings()
        if self.pings:
            ready, _ = self.ray.wait(list(self.pings), num_returns=len(self.pings), timeout=0)
            for ref in ready:
                self._pinged(ref, *self.pings.pop(ref))

    def _fail(self, item: _Item, why: str) -> None:
        self.done.append((item.ticket, MeasureResult(item.input, WORKER_DIED, error=f"run: {why}"[:2000],
                                                     compile_s=item.build.compile_s)))

    @staticmethod
    def _unmeasured(inp: MeasureInput, b: BuildResult) -> MeasureResult:
        if b.status != OK:
            return MeasureResult(inp, b.status, error=b.error, compile_s=b.compile_s)
        return MeasureResult(inp, RUNTIME_ERROR, error="the builder gave no kernel to run (a builder that "
                             "builds nothing, as `replay`, goes with its own runner)")

    @property
    def alive(self) -> int:
        return len(self.actors) - len(self.dead)

