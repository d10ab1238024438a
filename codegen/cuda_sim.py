"""Warp shuffles for numba-cuda's simulator, which has none (numba-cuda 0.30): GPU templates
reduce across a warp with `cuda.shfl_down_sync` / `cuda.shfl_sync`, and their tests run
under the simulator, where every CUDA thread is a Python thread.

A shuffle here is what it is on the GPU: the lanes of one warp (32 consecutive threads of
the block; the last warp may be short) each publish a value, meet at a barrier of that
warp only, read a lane's value and meet again. Lanes must reach the shuffle together, as a
full mask (0xffffffff) demands on a GPU; a warp whose lanes diverge around it fails with a
broken barrier after `TIMEOUT_S` instead of hanging the test run.
"""
from __future__ import annotations

import threading

TIMEOUT_S = 60.0
_LOCK = threading.Lock()


class _Warp:
    __slots__ = ("barrier", "slots")

    def __init__(self, lanes: int):
        self.barrier = threading.Barrier(lanes, timeout=TIMEOUT_S)
        self.slots = [None] * lanes


def _warp_of_caller():
    """(lane, the caller's warp state): one per warp of the block the calling thread runs in."""
    me = threading.current_thread()
    manager = me._manager
    tid = me.thread_id
    warp, lane = divmod(tid, 32)
    with _LOCK:
        warps = manager.__dict__.setdefault("_tt_warps", {})
        w = warps.get(warp)
        if w is None:
            bx, by, bz = manager._block_dim
            w = warps[warp] = _Warp(min(32, bx * by * bz - warp * 32))
    return lane, w


def _exchange(value, source_lane):
    """Every lane publishes `value`; each gets the value of `source_lane(lane, lanes)` (None:
    its own)."""
    lane, w = _warp_of_caller()
    w.slots[lane] = value
    w.barrier.wait()
    src = source_lane(lane, len(w.slots))
    got = value if src is None else w.slots[src]
    w.barrier.wait()
    return got


def _shfl_sync(self, mask, value, src_lane):
    return _exchange(value, lambda lane, n: int(src_lane) % 32 if int(src_lane) % 32 < n else None)


def _shfl_down_sync(self, mask, value, delta):
    return _exchange(value, lambda lane, n: lane + int(delta) if lane + int(delta) < n else None)


def _shfl_up_sync(self, mask, value, delta):
    return _exchange(value, lambda lane, n: lane - int(delta) if lane >= int(delta) else None)


def _shfl_xor_sync(self, mask, value, lane_mask):
    return _exchange(value, lambda lane, n: lane ^ int(lane_mask) if (lane ^ int(lane_mask)) < n else None)


def _syncwarp(self, mask=0xffffffff):
    _warp_of_caller()[1].barrier.wait()


def install() -> None:
    """Give the simulator's `cuda` module the warp intrinsics it lacks (idempotent; an
    intrinsic a newer simulator has is left as it is)."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule
    for name, fn in (("shfl_sync", _shfl_sync), ("shfl_down_sync", _shfl_down_sync), ("shfl_up_sync", _shfl_up_sync),
                     ("shfl_xor_sync", _shfl_xor_sync), ("syncwarp", _syncwarp)):
        if not hasattr(FakeCUDAModule, name):
            setattr(FakeCUDAModule, name, fn)


__all__ = ["install"]
