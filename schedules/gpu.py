"""What GPU templates share: the device limits a config must fit, an occupancy estimate,
and the launch-geometry arithmetic. Pure arithmetic on the target's properties (see
`codegen.cuda`): no numba-cuda import, so spaces are made and pruned anywhere.

A config is pruned before any build when its block needs more threads, static shared
memory or registers than the device allows (`fits`). Registers per thread are an
estimate the template gives (accumulators + staging + addressing); the compiler's
count is known only after a build, so the estimate errs high.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ARCH = "8.0"   # what spaces are pruned for when the settings' backend is not cuda


@dataclass(frozen=True)
class Limits:
    max_threads_per_block: int = 1024
    shared_per_block: int = 48 << 10
    regs_per_thread: int = 255
    regs_per_block: int = 65536
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32
    shared_per_sm: int = 164 << 10
    regs_per_sm: int = 65536
    warp: int = 32
    sm_count: int = 0     # 0: unknown (a declared architecture)

    @classmethod
    def of(cls, target) -> "Limits":
        return cls(**{k: int(target.get(k)) for k in cls.__dataclass_fields__ if target.get(k) is not None})


@dataclass(frozen=True)
class Resources:
    """What one config of a GPU template asks of the device: every CUDA template says it
    (`Template.resources(wl, cfg)`), for pruning (`constraint`) and the cost model's
    features (`tuner.cost_model.features`)."""
    threads: int                 # threads per block
    blocks: int                  # blocks in the grid (of the main kernel)
    shared_bytes: int = 0        # static shared memory per block
    regs_per_thread: int = 32    # an estimate (accumulators, staged values, addressing)
    bytes_moved: int = 0         # global-memory traffic of one call (reads + writes), estimated
    flops: int = 0


def constraint(template, wl, lim: Limits | None = None):
    """A `ConfigSpace` constraint: configs whose `template.resources(wl, cfg)` do not fit `lim`
    (default: this machine's `limits()`) are pruned."""
    lim = lim or limits()

    def why(values: dict) -> str | None:
        from schedules.space import Config
        r = template.resources(wl, Config(values))
        return fits(lim, r.threads, r.shared_bytes, r.regs_per_thread)
    return why


def limits(settings=None) -> Limits:
    """The limits of the GPU the settings' cuda backend targets (the device, or the
    declared/simulated architecture); a declared 8.0 where the cuda backend cannot answer."""
    from codegen.backend import get_backend
    from ir.settings import resolve
    settings = resolve(settings)
    try:
        return Limits.of(get_backend("cuda", settings).target())
    except Exception:  # numba-cuda missing or no device: spaces still exist, pruned for the default arch
        from codegen.cuda import declared_props, parse_arch
        return Limits(**{k: v for k, v in declared_props(parse_arch(settings.cuda_arch or DEFAULT_ARCH), "").items()
                         if k in Limits.__dataclass_fields__})


def fits(lim: Limits, threads: int, shared_bytes: int = 0, regs_per_thread: int = 32) -> str | None:
    """None when a block of `threads` threads using `shared_bytes` of static shared memory
    and about `regs_per_thread` registers can launch on the device, else why not."""
    if threads > lim.max_threads_per_block:
        return f"{threads} threads per block, the device allows {lim.max_threads_per_block}"
    if shared_bytes > lim.shared_per_block:
        return f"{shared_bytes} bytes of shared memory per block, the device allows {lim.shared_per_block}"
    if regs_per_thread > lim.regs_per_thread:
        return f"~{regs_per_thread} registers per thread, the device allows {lim.regs_per_thread}"
    if regs_per_thread * threads > lim.regs_per_block:
        return f"~{regs_per_thread * threads} registers per block, the device allows {lim.regs_per_block}"
    return None


def occupancy(lim: Limits, threads: int, shared_bytes: int = 0, regs_per_thread: int = 32) -> float:
    """Resident warps per SM / the most an SM holds (the CUDA occupancy calculator's rule,
    without allocation granularity): what hides memory latency on a GPU."""
    warps = -(-threads // lim.warp)
    by_threads = lim.threads_per_sm // max(1, warps * lim.warp)
    by_shared = lim.shared_per_sm // shared_bytes if shared_bytes else lim.blocks_per_sm
    by_regs = lim.regs_per_sm // max(1, regs_per_thread * warps * lim.warp)
    blocks = max(0, min(lim.blocks_per_sm, by_threads, by_shared, by_regs))
    return min(1.0, blocks * warps * lim.warp / lim.threads_per_sm)


def blocks_for(n: int, per_block: int) -> int:
    """Blocks that cover n items at `per_block` items each (at least one)."""
    return max(1, -(-int(n) // int(per_block)))


__all__ = ["DEFAULT_ARCH", "Limits", "Resources", "constraint", "limits", "fits", "occupancy", "blocks_for"]
