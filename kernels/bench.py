"""How fast is a kernel? The one timing harness of the book.

Every kernel and every SDPA backend is timed by :func:`time_gpu`: CUDA events
around each call, compilation and warm-up left out, the L2 cache flushed
between calls (a copy of a buffer several times its size, which leaves L2 holding
lines the copy wrote: a call writes them back to DRAM as its own take their place;
:func:`flush_l2_clean` reads instead), and the median, min and max of many calls
reported. A kernel is timed only after it passed
:func:`kernels.check.check_attention` on the same shape. Paths compared a few percent
apart are timed in turns (:func:`time_alternating`): the suite (:func:`run_suite`) times
every kernel at a shape that way, with SDPA's backends among them.

Throughput uses one formula for the whole book: ``4 * B * H * S_q * S_k * D``
floating-point operations (two matmuls of ``2 * S_q * S_k * D`` each), halved
for causal attention.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from .api import dtype_name
from .check import check_attention, fresh_inputs
from .mode import MODE


#: fp32 CUDA-core peak of an H100/H200 SXM (datasheet): 132 SMs x 128 fp32 lanes
#: x 2 FLOPs per FMA x 1.98 GHz boost clock. The ceiling of chapters 1-4.
FP32_PEAK_TFLOPS = 132 * 128 * 2 * 1.98e9 / 1e12


@dataclass(frozen=True)
class Shape:
    B: int
    H: int
    S_q: int
    S_k: int
    D: int
    causal: bool = False

    @property
    def flops(self) -> float:
        return attention_flops(self.B, self.H, self.S_q, self.S_k, self.D, self.causal)

    def label(self) -> str:
        s = f"S={self.S_q}" if self.S_q == self.S_k else f"S_q={self.S_q} S_k={self.S_k}"
        return (f"B={self.B} H={self.H} {s} D={self.D}"
                + (" causal" if self.causal else ""))

    def as_dict(self) -> dict:
        return asdict(self)


def attention_flops(B, H, S_q, S_k, D, causal=False) -> float:
    """4 * B * H * S_q * S_k * D, halved for causal: the book's one FLOP count."""
    flops = 4.0 * B * H * S_q * S_k * D
    return flops / 2 if causal else flops


def min_bytes(B, H, S_q, S_k, D, itemsize=2) -> int:
    """The fewest bytes a forward pass must move: read q, k, v once, write o once."""
    return itemsize * B * H * D * (2 * S_q + 2 * S_k)


def _standard_suite() -> list[Shape]:
    """FlashAttention-2/3 papers' setting: 16k tokens a batch, hidden size 2048."""
    shapes = []
    for causal in (False, True):
        for D in (64, 128):
            for S in (512, 1024, 2048, 4096, 8192, 16384):
                shapes.append(Shape(16384 // S, 2048 // D, S, S, D, causal))
    return shapes


STANDARD_SUITE = _standard_suite()
#: the earlier attempt's H100 shape and its L4 target shape (batch and heads guessed
#: there: 1 and 8)
JOURNEY_SHAPES = [Shape(16, 16, 2048, 2048, 64), Shape(1, 8, 512, 512, 64)]
#: sequence-length sweep at the journey's H100 shape, for plots over S
SWEEP_S = [Shape(16, 16, S, S, 64) for S in (128, 256, 512, 1024, 2048, 4096)]
#: decoding: a few query rows a head against a long key cache (chapter 8), timed only
#: for the kernels that ask for them (the "decoding" shape set)
DECODING_SHAPES = [Shape(1, 32, 1, 8192, 128), Shape(4, 32, 1, 8192, 128),
                   Shape(1, 32, 1, 32768, 128), Shape(8, 12, 1, 1024, 64),
                   Shape(1, 8, 1, 32768, 64), Shape(1, 32, 2, 8192, 128),
                   Shape(1, 32, 4, 8192, 128)]
#: causal calls of few heads (the suite pairs each length with many: B·H = 512 at
#: S = 1024), where chapter 7's forms rank otherwise: timed only for the
#: kernels that ask for them (the "few_heads" shape set), whose records the lean call's
#: choice reads (kernels.launch.rate_shape)
FEW_HEADS_SHAPES = [s for s in (Shape(B, 16, S, S, D, True) for D in (64, 128)
                                 for S in (1024, 2048, 4096)
                                 for B in ((1, 3, 8) if S < 4096 else (1, 3)))
                    if s not in STANDARD_SUITE]  # (8, 16, 2048, 128) is the suite's
#: the shapes timed only for the kernels that ask for them
ON_REQUEST_SHAPES = frozenset(DECODING_SHAPES) | frozenset(FEW_HEADS_SHAPES)


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    reps: int

    def as_dict(self) -> dict:
        return asdict(self)


_FLUSH: list = []
FLUSH_BYTES = 256 << 20  # several times the 50-60 MB L2 of an H100/H200


def _flush_buffers() -> list:
    from numba import cuda

    if not _FLUSH:
        _FLUSH.extend([cuda.device_array(FLUSH_BYTES, np.uint8),
                       cuda.device_array(FLUSH_BYTES, np.uint8)])
    return _FLUSH


def _flush_l2():
    """The harness's flush: a copy of FLUSH_BYTES, after which L2 holds written lines."""
    source, target = _flush_buffers()
    source.copy_to_device(target)


@functools.cache
def _reader():
    """(kernel, sink, blocks): a kernel that reads every word of an array, all SMs."""
    from numba import cuda

    @cuda.jit
    def read_words(words, sink):
        seen = np.uint64(0)
        for i in range(cuda.grid(1), words.size, cuda.gridsize(1)):
            seen |= words[i]
        if seen == 0x5EED:  # all but never: it keeps the reads from being dropped
            sink[0] = seen

    blocks = 4 * cuda.get_current_device().MULTIPROCESSOR_COUNT
    return read_words, cuda.device_array(1, np.uint64), blocks


def flush_l2_clean():
    """A flush that only reads FLUSH_BYTES: L2 is left holding clean lines, none for the
    timed call to write back (pass it to :func:`time_gpu` as ``flush``). After the
    harness's copy a call that reads less than L2 holds also pays for writing the copy's
    lines back, a share of a short call's time that a clean L2 does not cost."""
    read_words, sink, blocks = _reader()
    read_words[blocks, 256](_flush_buffers()[0].view(np.uint64), sink)


#: how long a call is repeated before it is timed, so that the clocks have come up: a
#: GPU left idle while a kernel compiles (seconds of host work) drops its clocks, and the
#: first milliseconds of work after that run several times slower (seen on the H200:
#: a 12 us kernel timed at 67-116 us when it was the first thing timed after its compile)
SPIN_UP_S = 0.05


def _hold_gpu(seconds: float) -> None:
    """Keep the GPU busy for about ``seconds`` (a kernel that waits on its clock) before
    the calls queued after it, so that the host queues every timed call while the GPU is
    still waiting: a call whose host side takes longer than the L2 flush before it would
    otherwise leave the GPU idle between its start event and its kernel, and that gap
    would be timed as the kernel's (seen: SDPA's 14 us call timed at 78 us)."""
    try:
        import torch
    except ImportError:  # no torch: nothing to hold the GPU with; small calls may show gaps
        return
    from numba import cuda

    clock_hz = cuda.get_current_device().CLOCK_RATE * 1e3  # kHz
    torch.cuda._sleep(int(min(seconds, 1.0) * clock_hz))


def time_gpu(fn, *, budget_s: float = 0.5, min_reps: int = 5, max_reps: int = 50,
             warmup: int = 1, spin_up_s: float = SPIN_UP_S, flush=None) -> Timing:
    """Median, min and max time of ``fn()`` on the GPU, in milliseconds, after
    ``spin_up_s`` of calls to bring the clocks up (:data:`SPIN_UP_S`), L2 emptied before
    each call by ``flush`` (by default a copy: see the module's docstring)."""
    if MODE != "gpu":
        raise RuntimeError("timing needs a GPU (kernels.mode is %r)" % MODE)
    from numba import cuda

    flush = flush or _flush_l2
    for _ in range(warmup):  # compilation, module load, allocator warm-up
        fn()
    spin_up, calls, host_s = time.perf_counter(), 0, 0.0
    while calls == 0 or time.perf_counter() - spin_up < spin_up_s:  # the clocks, as above
        t = time.perf_counter()
        flush()
        fn()
        host_s += time.perf_counter() - t  # what queuing a call costs the host
        calls += 1
        cuda.synchronize()
    start, end = cuda.event(), cuda.event()
    flush()
    start.record()
    fn()
    end.record()
    end.synchronize()
    estimate_ms = cuda.event_elapsed_time(start, end)
    reps = int(min(max_reps, max(min_reps, budget_s * 1e3 / max(estimate_ms, 1e-3))))
    events = [(cuda.event(), cuda.event()) for _ in range(reps)]
    _hold_gpu(1.25 * reps * host_s / calls)
    for s, e in events:
        flush()  # also gives the host time to queue the call behind it
        s.record()
        fn()
        e.record()
    events[-1][1].synchronize()
    times = [cuda.event_elapsed_time(s, e) for s, e in events]
    return Timing(statistics.median(times), min(times), max(times), reps)


def in_turns(names: list, rounds: int):
    """``(round, name)`` of each turn of a comparison taking turns: every name once a
    round, the order reversed every other round, so that a drift over the run falls on
    every name alike."""
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            yield r, name


def time_alternating(fns: dict, rounds: int = 6, budget_s: float = 0.15,
                     min_reps: int = 5, flush=None) -> dict:
    """{name: Timing} of each of ``fns``, timed by :func:`time_gpu` in ``rounds`` rounds,
    taking turns, the order reversed every other round, so that what drifts over a run
    (clocks, temperature) falls on every path alike: each path's median of its rounds'
    medians, with the smallest and largest of them. For comparisons of a few percent.
    The clocks are brought up before each call of the first round only: after it the GPU
    is never idle for long. ``flush``: as time_gpu takes it."""
    medians: dict = {name: [] for name in fns}
    for r, name in in_turns(list(fns), rounds):
        medians[name].append(time_gpu(fns[name], budget_s=budget_s, min_reps=min_reps,
                                      spin_up_s=SPIN_UP_S if r == 0 else 0.0,
                                      flush=flush).median_ms)
    return {name: Timing(statistics.median(m), min(m), max(m), rounds)
            for name, m in medians.items()}


def copy_bandwidth(n: int = 1 << 31) -> dict:
    """The copy ceiling: a device-to-device copy of ``n`` bytes (2 GiB: far beyond any
    cache), timed; the bytes it moves (read and written), its median time and TB/s."""
    from numba import cuda

    a, b = cuda.device_array(n, np.uint8), cuda.device_array(n, np.uint8)
    t = time_gpu(lambda: b.copy_to_device(a), budget_s=0.3)
    return dict(copy_bytes=2 * n, copy_ms=t.median_ms,
                copy_tb_s=2 * n / (t.median_ms * 1e-3) / 1e12)


def tflops(shape: Shape, ms: float) -> float:
    return shape.flops / (ms * 1e-3) / 1e12


def _check_kernel(attention, shape: Shape, name: str, dtype: str, *,
                  errors_as_records: bool = True) -> dict:
    """A record's check: ``attention`` against the float64 reference at full size on
    ``shape`` (status "ok" or "failed"; with ``errors_as_records``, "error" where the
    kernel raised, out of memory, say, rather than the exception)."""
    record = dict(kernel=name, **shape.as_dict(), dtype=dtype, flops=shape.flops)
    try:
        check = check_attention(attention, shape.B, shape.H, shape.S_q, shape.S_k,
                                shape.D, shape.causal, dtype=dtype, name=name,
                                raise_on_fail=False)
    except Exception as e:  # e.g. out of memory for S and P
        if not errors_as_records:
            raise
        return dict(record, status="error", note=f"{type(e).__name__}: {str(e)[:300]}")
    record.update(rel_err=check.rel_err, max_abs_err=check.max_abs_err,
                  unwritten=check.unwritten, nonfinite=check.nonfinite)
    if not check.ok:
        return dict(record, status="failed", note=check.summary())
    return dict(record, status="ok")


def _sdpa_calls(shape: Shape, backends, dtype: str) -> tuple[dict, dict]:
    """SDPA's backends on fresh inputs of ``shape``: ({backend: call} for those that
    take it, {backend: why not} for the others), each tried once."""
    import torch

    from .reference import sdpa

    q, k, v, _ = fresh_inputs(shape.B, shape.H, shape.S_q, shape.S_k, shape.D, dtype)
    q, k, v = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
    calls, unavailable = {}, {}
    for backend in backends:
        call = (lambda b=backend: sdpa(q, k, v, shape.causal, None, b))
        try:
            call()
        except RuntimeError as e:  # a backend that does not take this shape
            unavailable[backend] = f"unavailable: {str(e).splitlines()[0][:200]}"
        else:
            calls[backend] = call
    return calls, unavailable


def benchmark_sdpa(shape: Shape, backends=("default", "flash"), dtype="float16") -> dict:
    """Time SDPA backends on one shape in ``dtype``, each on its own; returns {backend:
    Timing or why not}."""
    calls, why_not = _sdpa_calls(shape, backends, dtype)
    return {b: time_gpu(calls[b]) if b in calls else why_not[b] for b in backends}


def device_inputs(shape: Shape, dtype="float16"):
    """Fresh random q, k, v on the GPU and an output array for them."""
    from numba import cuda

    q, k, v, _ = fresh_inputs(shape.B, shape.H, shape.S_q, shape.S_k, shape.D, dtype)
    if hasattr(q, "new_empty"):  # torch tensors
        return q, k, v, q.new_empty(q.shape)
    return q, k, v, cuda.device_array(q.shape, q.dtype)  # Numba's, without torch


def benchmark_kernel(attention, shape: Shape, *, name: str | None = None,
                     dtype="float16") -> dict:
    """Check ``attention`` at full size on ``shape``, then time it on its own if it
    passed (the suite times a shape's kernels in turns instead: :func:`run_suite`)."""
    record = _check_kernel(attention, shape, name or attention.__name__, dtype_name(dtype),
                           errors_as_records=False)
    if record["status"] != "ok":
        return record  # never time a kernel that failed its check
    dq, dk, dv, out = device_inputs(shape, dtype)
    timing = time_gpu(lambda: attention(dq, dk, dv, causal=shape.causal, out=out))
    record.update(**timing.as_dict(), tflops=tflops(shape, timing.median_ms))
    return record


def predicted_s(measured: list[dict], shape: Shape) -> float | None:
    """Seconds one call would take on ``shape``, scaled by FLOPs from the nearest
    measured shape with the same D and causality (None if there is none)."""
    same = [r for r in measured if r.get("status") == "ok" and r["D"] == shape.D
            and r["causal"] == shape.causal and r.get("dtype", "float16") == "float16"]
    if not same:
        same = [r for r in measured if r.get("status") == "ok"]
    if not same:
        return None
    near = min(same, key=lambda r: abs(math.log(r["flops"] / shape.flops)))
    return near["median_ms"] * 1e-3 * shape.flops / near["flops"]


SHAPE_SETS = {
    "journey": JOURNEY_SHAPES,
    "sweep": JOURNEY_SHAPES + SWEEP_S,
    "causal": JOURNEY_SHAPES + [s for s in STANDARD_SUITE if s.causal],
    # both head dims: the journey's shapes and the suite's D = 128 shape at S = 4096
    "heads": JOURNEY_SHAPES + [Shape(4, 16, 4096, 4096, 128)],
    # head dim 64 only (the early scores', which are their base kernels at other dims)
    "d64": JOURNEY_SHAPES + [s for s in STANDARD_SUITE if s.D == 64],
    "causal_d64": JOURNEY_SHAPES + [s for s in STANDARD_SUITE if s.causal and s.D == 64],
    "decoding": DECODING_SHAPES,
    "few_heads": FEW_HEADS_SHAPES,
    "few_heads_d64": [s for s in FEW_HEADS_SHAPES if s.D == 64],
}


#: rounds of turns a suite shape's kernels and SDPA's backends take (time_alternating),
#: and the time each call's median gets a round: on the H200, two kernels timed minutes
#: apart, each on its own, moved by up to 7% against one another at the same shape,
#: where timed in turns they came within 1% (chapter 7's early-scores entry beside its
#: base kernel: "The epilogue under the next scores"). At 0.1 s a round,
#: chapter 7's timings took 495 s on an H100 (its previous recording, timed the earlier
#: way and profiled too, 291 s), near a GPU call's 600 s; at 0.02 s a round takes the
#: most calls (50) of a kernel that takes 0.4 ms with the L2 flush before it
SUITE_ROUNDS, SUITE_ROUND_S = 6, 0.02


def run_suite(kernels, shapes, *, limit_s: float = 1.0, progress=print,
              sdpa_backends=("default", "flash"), shape_sets=None, also_shape_sets=None,
              dtypes=None) -> list[dict]:
    """Check every kernel on every shape, then time, shape by shape and dtype by dtype,
    the kernels that passed there and SDPA's backends in turns (:func:`time_alternating`,
    :data:`SUITE_ROUNDS` rounds): what drifts over a run falls on all of them alike, so
    the records at one shape compare like for like. Each timed record says so (``timed``:
    "in turns"; ``reps``: its rounds) and carries SDPA's times in its own dtype beside it.

    ``kernels``: (chapter, name, fn) triples. A kernel is skipped on a shape it
    would take more than ``limit_s`` per call on (predicted from its smaller
    shapes), and the record says so; the journey's shapes are always timed.
    ``shape_sets``: {kernel name: a key of SHAPE_SETS} for kernels timed on a
    subset of ``shapes`` only; the others are timed on all but ON_REQUEST_SHAPES.
    ``also_shape_sets``: {kernel name: a key of SHAPE_SETS} a kernel is timed on as
    well (those of ON_REQUEST_SHAPES it asks for). ``dtypes``: {kernel name: dtypes} for kernels timed
    in more than fp16. SDPA is timed in fp16 on every shape, and in another dtype on
    the shapes a kernel is timed on in it. Records come back SDPA's first, then
    kernel by kernel in the order of ``kernels``.
    """
    shape_sets, dtypes = shape_sets or {}, dtypes or {}
    shapes = sorted(set(shapes), key=lambda s: (s.flops, s.D, s.causal))
    subsets = {name: set(SHAPE_SETS[key]) for name, key in shape_sets.items()}
    also = {name: set(SHAPE_SETS[key]) for name, key in (also_shape_sets or {}).items()}
    order = {name: i for i, (_, name, _) in enumerate(kernels)}
    done: dict = {}  # (kernel, dtype) -> its records so far, for predicted_s
    sdpa_rows = []
    for shape in shapes:
        for dtype in dict.fromkeys(["float16", *(d for ds in dtypes.values() for d in ds)]):
            here = [(c, name, fn) for c, name, fn in kernels
                    if dtype in dtypes.get(name, ("float16",))
                    and ((shape in subsets[name] if name in subsets
                          else shape not in ON_REQUEST_SHAPES) or shape in also.get(name, ()))]
            if dtype != "float16" and not here:
                continue  # SDPA in another dtype only beside a kernel timed in it
            sdpa_rows += _time_shape(here, shape, dtype, done, sdpa_backends, limit_s,
                                     progress)
    records = [r for (name, dtype), rs in sorted(
        done.items(), key=lambda kv: (order[kv[0][0]], kv[0][1] != "float16", kv[0][1]))
        for r in rs]
    return sdpa_rows + records


def _time_shape(kernels, shape, dtype, done, sdpa_backends, limit_s, progress) -> list:
    """run_suite at one shape and dtype: each kernel checked (or skipped, as predicted too
    slow), then those that passed and SDPA's backends timed in turns; the kernels'
    records go into ``done``, SDPA's rows are returned."""
    t0 = time.perf_counter()
    mine, calls = {}, {}
    inputs = device_inputs(shape, dtype) if kernels else None
    for chapter, name, fn in kernels:
        earlier = done.setdefault((name, dtype), [])
        guess = predicted_s(earlier, shape) if dtype == "float16" else None
        if guess is not None and guess > limit_s and shape not in JOURNEY_SHAPES:
            rec = dict(kernel=name, **shape.as_dict(), dtype=dtype, flops=shape.flops,
                       status="skipped", note=f"predicted {guess:.1f} s a call (limit {limit_s} s)")
        else:
            rec = _check_kernel(fn, shape, name, dtype)
        if rec["status"] == "ok":  # never time a kernel that failed its check
            q, k, v, out = inputs
            calls[name] = functools.partial(fn, q, k, v, causal=shape.causal, out=out)
        mine[name] = dict(rec, chapter=chapter, sdpa_dtype=dtype)
    sdpa, unavailable = _sdpa_calls(shape, sdpa_backends, dtype)
    paths, timed = {**calls, **{("sdpa", b): c for b, c in sdpa.items()}}, "in turns"
    try:
        times = time_alternating(paths, rounds=SUITE_ROUNDS, budget_s=SUITE_ROUND_S,
                                 min_reps=1)
    except Exception as e:  # one call failed: time each on its own, so that only it is lost
        progress(f"  {shape.label()} {dtype}: timing in turns failed ({type(e).__name__}: "
                 f"{str(e)[:200]}); each timed on its own")
        times, timed = {}, "on its own"
        for name, call in paths.items():
            try:
                times[name] = time_alternating({name: call}, rounds=SUITE_ROUNDS,
                                               budget_s=SUITE_ROUND_S, min_reps=1)[name]
            except Exception as e2:
                times[name] = f"{type(e2).__name__}: {str(e2)[:300]}"
    sdpa_times = {b: times[("sdpa", b)] if b in sdpa else unavailable[b] for b in sdpa_backends}
    rows = []
    for backend, t in sdpa_times.items():
        row = dict(kernel=f"sdpa_{backend}", chapter=0, **shape.as_dict(), dtype=dtype,
                   flops=shape.flops)
        if isinstance(t, Timing):
            row.update(status="ok", **t.as_dict(), tflops=tflops(shape, t.median_ms),
                       timed=timed)
        else:
            row.update(status="unavailable", note=t)
        rows.append(row)
    for name, rec in mine.items():
        t = times.get(name)
        if isinstance(t, Timing):
            rec.update(**t.as_dict(), tflops=tflops(shape, t.median_ms), timed=timed)
        elif t is not None:
            rec.update(status="error", note=t)
        for backend, s in sdpa_times.items():
            rec[f"sdpa_{backend}_ms"] = s.median_ms if isinstance(s, Timing) else None
        done[name, dtype].append(rec)
    progress(f"  {shape.label()} {dtype} [{time.perf_counter() - t0:.1f} s]: " + ", ".join(
        f"{name} {r['tflops']:.1f}" if r["status"] == "ok" else f"{name} {r['status']}"
        for name, r in mine.items()) + "; " + ", ".join(
        f"sdpa {b} {t.median_ms:.3f} ms" if isinstance(t, Timing) else f"sdpa {b} {t}"
        for b, t in sdpa_times.items()))
    return rows


def host_time_alone(fn, *, reps: int = 2000) -> float:
    """Host time of ``fn()`` by itself, in microseconds: the median of many calls, each
    made with the GPU idle (synchronized before, outside the time), so that a full
    launch queue never makes the host wait."""
    import torch

    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def host_call_times(call, *, reps: int = 300, warmup: int = 20) -> dict:
    """What a caller waits for one call, in microseconds, measured on the host:
    ``back_to_back`` (calls queued one after another, the time per call, so the host's
    work per call, or the device's where that is longer) and ``then_synchronize``
    (median of one call followed by a wait for the device: launch plus kernel)."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    torch.cuda.synchronize()
    back_to_back = (time.perf_counter() - t0) / reps * 1e6
    single = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        single.append((time.perf_counter() - t) * 1e6)
    return dict(back_to_back_us=back_to_back, then_synchronize_us=statistics.median(single),
                reps=reps)
