"""Additions to Numba's CUDA simulator: warp-level functions and a fast barrier.

numba-cuda's simulator runs every CUDA thread of a block as a Python thread but
has no warp-level functions: ``cuda.shfl_xor_sync`` and friends raise
AttributeError there. This module adds them to the simulator's fake ``cuda``
module with warp-synchronous semantics: the lanes named in ``mask`` (among the
32 lanes of one warp of the block, lanes numbered by the linear thread index as
on the hardware) meet, exchange their values, and go on together.

What the hardware leaves undefined is made loud here, so that bugs of the kind
that broke the journey's warp reductions show up on the CPU:

- a lane named in ``mask`` that has exited, or that waits at ``syncthreads``
  instead, raises ``WarpDivergenceError`` naming it (the hardware may hang or
  return garbage);
- reading a lane that is not taking part (not in ``mask``, or past the end of a
  partial warp) gives NaN for floats and a poison value for integers (the
  hardware gives an undefined value).

The simulator's ``syncthreads`` is a busy-polling loop that costs milliseconds
per barrier; ``install()`` also replaces it with a condition-variable barrier
with the same meaning (a barrier completes when every thread of the block that
has not exited reaches it), which makes barrier-heavy kernels 20-100x faster on
the CPU. It also lets ``cuda.shared.array`` and ``cuda.local.array`` take the
``alignment`` argument that the GPU compiler needs for 16-byte loads. ``install()``
is called by ``kernels.mode`` when it selects the simulator.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
#: What a lane reads from a lane that is not taking part, for integer values.
INT_POISON = -0x21524111  # 0xDEADBEEF as a signed 32-bit integer

_POLL_S = 0.05  # how often a waiting lane looks for lanes that cannot come


class WarpDivergenceError(RuntimeError):
    """A warp-synchronous call that some lane named in its mask never reached."""


class _Round:
    """One meeting of the lanes of ``mask`` at a warp-level call."""

    __slots__ = ("values", "expected", "done", "_since")

    def __init__(self, expected: int):
        self.values: dict[int, object] = {}
        self.expected = expected
        self.done = False
        self._since = None  # when every missing lane was first seen at a barrier


class _WarpState:
    def __init__(self):
        self.cond = threading.Condition()
        self.open: dict[int, _Round] = {}  # mask -> round still gathering lanes
        self.lanes: dict | None = None  # lane -> thread, filled on first need


_states_lock = threading.Lock()


def _warp_state(thread, warp: int) -> _WarpState:
    manager = thread._manager
    with _states_lock:
        states = manager.__dict__.setdefault("_fa_warp_states", {})
        if warp not in states:
            states[warp] = _WarpState()
        return states[warp]


def _block_threads(thread) -> int:
    return int(np.prod(thread._manager._block_dim))


def _lanes_present(thread, warp: int) -> int:
    """Mask of the lanes this warp has in the block (a last warp may be partial)."""
    n = min(WARP_SIZE, _block_threads(thread) - warp * WARP_SIZE)
    return (1 << n) - 1


def _warp_threads(thread, warp: int) -> dict[int, object]:
    """Lane -> simulator thread, for every thread of this warp (started or not)."""
    state = _warp_state(thread, warp)
    if state.lanes is None:
        block = thread._manager._fa_barrier.threads
        state.lanes = {t.thread_id % WARP_SIZE: t for t in block
                       if t.thread_id // WARP_SIZE == warp}
    return state.lanes


def _exchange(name: str, mask: int, value):
    """Meet the other lanes of ``mask``; return {lane: value} for all of them."""
    thread = threading.current_thread()
    if not hasattr(thread, "_manager"):
        raise RuntimeError(f"cuda.{name} called outside a simulated kernel")
    mask = int(mask) & FULL_MASK
    warp, lane = divmod(thread.thread_id, WARP_SIZE)
    if not (mask >> lane) & 1:
        raise WarpDivergenceError(
            f"cuda.{name}: lane {lane} of warp {warp} called it with mask "
            f"{mask:#010x}, which does not name the calling lane"
        )
    members = mask & _lanes_present(thread, warp)
    state = _warp_state(thread, warp)
    with state.cond:
        rnd = state.open.get(mask)
        if rnd is None:
            rnd = state.open[mask] = _Round(bin(members).count("1"))
        rnd.values[lane] = value
        if len(rnd.values) == rnd.expected:
            rnd.done = True
            del state.open[mask]
            state.cond.notify_all()
        started = time.monotonic()
        while not rnd.done:
            state.cond.wait(_POLL_S)
            if rnd.done or thread.abort:
                break
            _raise_if_stuck(name, mask, warp, members, rnd, thread, started)
    if thread.abort:
        raise RuntimeError("abort flag set while waiting in a warp-level call")
    return rnd.values


def _raise_if_stuck(name, mask, warp, members, rnd, thread, started):
    """Raise if a lane the call waits for can never come: it has exited, or every
    missing lane has been waiting at ``syncthreads`` for a while (a deadlock)."""
    missing = [lane for lane in range(WARP_SIZE)
               if (members >> lane) & 1 and lane not in rnd.values]
    lanes = _warp_threads(thread, warp)
    # marked by the block's own wrapper as it leaves the kernel; not is_alive(), which
    # is also False for a thread that is still starting (its ident set, not yet started)
    exited = [lane for lane in missing if lanes[lane].left_kernel]
    if thread.abort:
        return  # a lane raised (and so left): its own error is reported, not this wait
    at_barrier = [lane for lane in missing if lanes[lane].syncthreads_blocked]
    deadlocked = at_barrier and len(at_barrier) == len(missing)
    if deadlocked and rnd._since is None:
        rnd._since = time.monotonic()  # a barrier may be releasing: confirm it persists
    elif not deadlocked:
        rnd._since = None
    if exited or (deadlocked and time.monotonic() - rnd._since > 0.5):
        why = []
        if exited:
            why.append(f"lane(s) {exited} exited")
        if at_barrier:
            why.append(f"lane(s) {at_barrier} wait at cuda.syncthreads()")
        raise WarpDivergenceError(
            f"cuda.{name} with mask {mask:#010x} in warp {warp}: "
            f"{' and '.join(why)} and will never reach it; lanes "
            f"{sorted(rnd.values)} are waiting. Every lane named in the mask "
            "must make the same call (on a GPU this hangs or reads garbage)."
        )
    if time.monotonic() - started > 120:
        raise WarpDivergenceError(
            f"cuda.{name} with mask {mask:#010x} in warp {warp}: lanes "
            f"{missing} did not arrive within 120 s"
        )


def _poison_like(value):
    if isinstance(value, (float, np.floating)):
        return type(value)(np.nan)
    if isinstance(value, (bool, np.bool_)):
        return value
    return type(value)(INT_POISON)


def _read_lane(values: dict, src: int, own):
    return values[src] if src in values else _poison_like(own)


def _lane():
    return threading.current_thread().thread_id % WARP_SIZE


def shfl_sync(self, mask, value, src_lane):
    values = _exchange("shfl_sync", mask, value)
    return _read_lane(values, int(src_lane) % WARP_SIZE, value)


def shfl_up_sync(self, mask, value, delta):
    lane = _lane()
    values = _exchange("shfl_up_sync", mask, value)
    src = lane - int(delta)
    return value if src < 0 else _read_lane(values, src, value)


def shfl_down_sync(self, mask, value, delta):
    lane = _lane()
    values = _exchange("shfl_down_sync", mask, value)
    src = lane + int(delta)
    return value if src >= WARP_SIZE else _read_lane(values, src, value)


def shfl_xor_sync(self, mask, value, lane_mask):
    lane = _lane()
    values = _exchange("shfl_xor_sync", mask, value)
    src = lane ^ int(lane_mask)
    return value if src >= WARP_SIZE else _read_lane(values, src, value)


def ballot_sync(self, mask, predicate):
    values = _exchange("ballot_sync", mask, bool(predicate))
    return sum(1 << lane for lane, p in values.items() if p)


def all_sync(self, mask, predicate):
    values = _exchange("all_sync", mask, bool(predicate))
    return int(all(values.values()))


def any_sync(self, mask, predicate):
    values = _exchange("any_sync", mask, bool(predicate))
    return int(any(values.values()))


def syncwarp(self, mask=FULL_MASK):
    _exchange("syncwarp", mask, None)


def activemask(self):
    """The lanes the calling warp has in the block.

    The simulator runs lanes as independent threads and cannot tell a divergent
    branch from a converged one, so this is the mask of converged code: all
    lanes of the warp that exist (fewer in a partial last warp).
    """
    thread = threading.current_thread()
    return _lanes_present(thread, thread.thread_id // WARP_SIZE)


WARP_FUNCTIONS = {
    "shfl_sync": shfl_sync,
    "shfl_up_sync": shfl_up_sync,
    "shfl_down_sync": shfl_down_sync,
    "shfl_xor_sync": shfl_xor_sync,
    "ballot_sync": ballot_sync,
    "all_sync": all_sync,
    "any_sync": any_sync,
    "syncwarp": syncwarp,
    "activemask": activemask,
}


class _BlockBarrier:
    """``__syncthreads()`` for one simulated block: waits for every live thread."""

    def __init__(self, threads: int):
        self.cond = threading.Condition()
        self.live = threads
        self.waiting = 0
        self.generation = 0
        self.threads: list = []
        self.waiters: list = []

    def _release(self):
        for t in self.waiters:  # cleared here, under the lock, so that no warp-level
            t.syncthreads_blocked = False  # call sees a released thread as waiting
        self.waiters = []
        self.waiting = 0
        self.generation += 1
        self.cond.notify_all()

    def arrive(self, thread):
        with self.cond:
            generation = self.generation
            thread.syncthreads_blocked = True
            self.waiters.append(thread)
            self.waiting += 1
            if self.waiting == self.live:
                self._release()
            else:
                while self.generation == generation and not thread.abort:
                    self.cond.wait()

    def leave(self):
        with self.cond:
            self.live -= 1
            if self.waiting and self.waiting == self.live:
                self._release()

    def abort_all(self):
        with self.cond:
            for t in self.threads:
                t.abort = True
            self.cond.notify_all()


def _syncthreads(self):
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    self._manager._fa_barrier.arrive(self)
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")


def _run_block(self, grid_point, *args):
    from numba.cuda.simulator.kernel import BlockThread

    n = int(np.prod(self._block_dim))
    barrier = self._fa_barrier = _BlockBarrier(n)
    # the manager runs block after block: warp states (and their lane -> thread maps)
    # of the last block must not be seen by this one's threads
    self.__dict__["_fa_warp_states"] = {}

    def target():
        try:
            self._f(*args)
        except BaseException:
            barrier.abort_all()  # before left_kernel: a waiting lane sees the abort
            raise
        finally:
            threading.current_thread().left_kernel = True
            barrier.leave()

    barrier.threads = [BlockThread(target, self, grid_point, point, self._debug)
                       for point in np.ndindex(*self._block_dim)]
    for t in barrier.threads:
        t.left_kernel = False
    for t in barrier.threads:
        t.start()
    for t in barrier.threads:
        t.join()
    failed = [t for t in barrier.threads if t.exception]
    # Report the error that started it, not the aborts it caused in other threads.
    failed.sort(key=lambda t: "abort flag" in str(t.exception[0]))
    if failed:
        raise failed[0].exception[0].with_traceback(failed[0].exception[1])


def _shared_array(self, shape, dtype, alignment=None):
    """The simulator's shared array, accepting ``alignment`` (NumPy's own
    allocations are aligned to 16 bytes or more, so there is nothing to do)."""
    import traceback

    from numba.core import types
    from numba.np import numpy_support

    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    caller = traceback.extract_stack(sys._getframe())[-2][0:2]  # one array per source line
    res = self._allocations.get(caller)
    if res is None:
        res = self._allocations[caller] = np.empty(shape, dtype)
    return res


def _local_array(self, shape, dtype, alignment=None):
    from numba.core import types
    from numba.np import numpy_support

    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    return np.empty(shape, dtype)


def install() -> None:
    """Add the warp-level functions, the fast barrier and array alignment to the
    simulator."""
    from numba.cuda.simulator.kernel import BlockManager, BlockThread
    from numba.cuda.simulator.kernelapi import FakeCUDALocal, FakeCUDAModule, FakeCUDAShared

    for name, fn in WARP_FUNCTIONS.items():
        if not hasattr(FakeCUDAModule, name):
            setattr(FakeCUDAModule, name, fn)
    BlockThread.syncthreads = _syncthreads
    BlockManager.run = _run_block
    FakeCUDAShared.array = _shared_array
    FakeCUDALocal.array = _local_array
