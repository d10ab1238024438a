"""Features of a (workload, config) for the cost model.

Three parts, in a fixed layout per template so that rows of different shapes of one
template are comparable (transfer learning):
  * the config's knobs (`ConfigSpace.features`: log2 of sizes, one-hot choices);
  * the problem: log2 of the sizes (M, N, K for matmul-like outputs), flops;
  * the loop nest (read from `template.lower(...).module`, once per code shape):
    register-tile size, loads and accumulations in the innermost loop, arithmetic
    intensity, loop depth, unrolled loops; and, where the knobs name them, the
    working set of one cache block vs L1/L2, the innermost extent, the number of
    parallel blocks per thread and their imbalance;
  * for GPU templates (kind "cuda") instead of the CPU blocking: what the config asks
    of the device (`template.resources`: threads per block, blocks, shared memory,
    registers), the occupancy that allows, waves of blocks over the SMs, and bytes
    moved per FLOP — what decides a GPU kernel's speed before any measurement.
"""
from __future__ import annotations

import math
import re

import numpy as np

from schedules.loopnest import Alloc, Assign, Call, For, If, UNROLLED
from schedules.microkernel import vector_tile_shape
from ir.settings import current
from schedules.space import Config, ConfigSpace

L1, L2 = 32 * 1024, 1024 * 1024   # bytes per core (Zen 4; only ratios enter the features)


def _log2(v: float) -> float:
    return math.log2(v) if v > 0 else 0.0


def problem_sizes(wl) -> tuple[int, int, int]:
    """(M, N, K) of the output viewed as a matrix; K = flops / (2 M N) (1 for elementwise)."""
    out = list(wl.output_shape) or [1]
    n = int(out[-1])
    m = int(np.prod(out[:-1])) if len(out) > 1 else 1
    k = max(1, round(wl.flops() / max(1, 2 * m * n)))
    return m, n, k


def _walk(stmts, depth=0, acc=None):
    """Yield (stmt, depth) over a statement tree."""
    for s in stmts:
        yield s, depth
        if isinstance(s, For):
            yield from _walk(s.body, depth + 1)
        elif isinstance(s, If):
            yield from _walk(s.then, depth)
            yield from _walk(s.orelse, depth)


def loop_nest_features(module) -> list[float]:
    """[log2 regtile accumulators, loads in hottest loop, intensity, max depth, #loops, #unrolled, log2 alloc]."""
    best = (0, 0)   # (accumulations, loads) of the loop body with most accumulations
    depth = loops = unrolled = alloc = 0
    for fn in module.functions:
        for s, d in _walk(fn.body):
            if isinstance(s, For):
                loops += 1
                depth = max(depth, d + 1)
                unrolled += s.kind == UNROLLED
                direct = [x for x in s.body if isinstance(x, Assign)]
                accs = sum(1 for x in direct if x.op)
                loads = sum(x.value.count("[") for x in direct)
                # a register tile as vector IR (one call): its MR x NR accumulators, MR + NR loads per k
                for mr, nr in filter(None, (vector_tile_shape(x.expr) for x in s.body if isinstance(x, Call))):
                    accs, loads = accs + mr * nr, loads + mr + nr
                if accs > best[0]:
                    best = (accs, loads)
            elif isinstance(s, Alloc):
                size = 1
                for e in s.shape:
                    size *= int(e) if str(e).isdigit() else 1
                alloc += size
    accs, loads = best
    return [_log2(accs), float(loads), accs / max(loads, 1), float(depth), float(loops), float(unrolled),
            _log2(alloc)]


def _tile(cfg: Config) -> tuple[int, int]:
    for _, v in cfg.to_json().items():
        if isinstance(v, str):
            m = re.fullmatch(r"(\d+)x(\d+)", v)
            if m:
                return int(m.group(1)), int(m.group(2))
    return 1, 1


def blocking_features(cfg: Config, m: int, n: int, k: int, threads: int) -> list[float]:
    mr, nr = _tile(cfg)
    mb, nb, kb = (int(cfg.get(x, 0) or 0) for x in ("MB", "NB", "KB"))
    par = cfg.get("parallel")
    t = threads if par in (True, None) else 1
    kb_eff = min(kb, k) if kb else k
    rows, cols = (mb or 1) * mr, (nb or 1) * nr
    ws = 4 * kb_eff * (rows + cols) + 4 * rows * cols   # A panel + B panel + C block, bytes
    n_blocks = math.ceil(m / rows) * math.ceil(n / cols)
    per_thread = math.ceil(n_blocks / t)
    imbalance = per_thread * t / n_blocks
    tile_ai = 2 * mr * nr / (4 * (mr + nr))            # flops per byte loaded in the micro-kernel
    return [_log2(mr * nr), float(mr), float(nr), _log2(ws), min(ws / L1, 64.0), min(ws / L2, 64.0),
            _log2(kb_eff), _log2(n_blocks), _log2(per_thread), imbalance, float(t), tile_ai,
            float(m % mr == 0), float(n % nr == 0), _log2(math.ceil(k / kb_eff))]


def gpu_features(template, wl, cfg: Config, lim) -> list[float]:
    """[log2 threads, log2 blocks, log2 shared bytes, regs/thread, occupancy, waves, tail, bytes/FLOP, warps]."""
    from schedules.gpu import occupancy
    r = template.resources(wl, cfg)
    occ = occupancy(lim, r.threads, r.shared_bytes, r.regs_per_thread)
    sms = lim.sm_count or 108   # a declared architecture does not say: an A100's count
    per_wave = max(1, sms * max(1, int(occ * lim.threads_per_sm) // max(1, r.threads)))
    waves = r.blocks / per_wave
    tail = (math.ceil(waves) - waves) if waves > 1 else 1.0 - waves   # idle share of the last wave
    flops = r.flops or wl.flops() or 1
    return [_log2(r.threads), _log2(r.blocks), _log2(r.shared_bytes), float(r.regs_per_thread), occ,
            _log2(waves * 1024) / 10, tail, r.bytes_moved / flops, float(-(-r.threads // lim.warp))]


class Featurizer:
    """configs -> feature matrix for one task (template + workload); cached per config."""

    def __init__(self, template, workload, space: ConfigSpace | None = None, threads: int | None = None):
        self.template, self.workload = template, workload
        self.space = space or template.space(workload)
        self.threads = threads or current().num_threads
        self.m, self.n, self.k = problem_sizes(workload)
        self.problem = [_log2(self.m), _log2(self.n), _log2(self.k), _log2(workload.flops()),
                        float(len(workload.ops))]
        self._nest: dict[tuple, list[float]] = {}
        self._rows: dict[Config, np.ndarray] = {}
        self.gpu = getattr(template, "kind", "cpu") == "cuda"
        if self.gpu:
            from schedules.gpu import limits
            self.limits = limits()

    def _nest_features(self, cfg: Config) -> list[float]:
        key = self.space.code_key(cfg)
        if key not in self._nest:
            try:
                self._nest[key] = loop_nest_features(self.template.lower(self.workload, cfg).module)
            except Exception:  # a config the template cannot lower: its measurement will say why
                self._nest[key] = [0.0] * 7
        return self._nest[key]

    def row(self, cfg: Config) -> np.ndarray:
        r = self._rows.get(cfg)
        if r is None:
            device = gpu_features(self.template, self.workload, cfg, self.limits) if self.gpu \
                else blocking_features(cfg, self.m, self.n, self.k, self.threads)
            r = np.array(self.space.features(cfg) + self.problem + self._nest_features(cfg) + device,
                         dtype=np.float32)
            self._rows[cfg] = r
        return r

    def __call__(self, configs) -> np.ndarray:
        rows = [self.row(c) for c in configs]
        return np.stack(rows) if rows else np.zeros((0, self.width), np.float32)

    @property
    def width(self) -> int:
        first = next(iter(self.space), None)
        return len(self.row(first)) if first is not None else 0
