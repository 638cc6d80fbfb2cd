"""The GPU page's exercises (chapter 0's 0.4 to 0.6): a guarded element-wise kernel, a
block's maximum through shared memory, and a row's softmax in one block.

Each checker launches the reader's kernel (in the simulator without a GPU) on inputs
that sit inside larger buffers: past the end of each input lies a value no right answer
reads, and past the end of the output one no right answer writes. The simulator raises
IndexError for an access out of bounds; a GPU does not, and the buffers catch it there.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

import kernels  # noqa: F401  (chooses GPU or simulator before numba.cuda loads)
from kernels.exercises import exercise, verdict
from numba import cuda, float32

#: what lies past the end of every input and output: too large for any right answer
BEYOND = np.float32(1e30)
#: the threads a block the checkers launch
SAXPY_THREADS, BLOCK = 32, 64


def _padded(values: np.ndarray, extra: int = BLOCK):
    """A device buffer holding ``values`` followed by ``extra`` elements of BEYOND, and
    the view of its first ``values.size`` elements (the array the kernel is given)."""
    flat = np.concatenate([values.ravel(), np.full(extra, BEYOND, np.float32)])
    buffer = cuda.to_device(flat.astype(np.float32))
    return buffer, buffer[:values.size].reshape(values.shape)


def _launch(kernel, grid, block, *arrays) -> str | None:
    """Launch ``kernel``; say what went wrong where an access left its array."""
    try:
        with warnings.catch_warnings():  # an overflow is the verdict's to tell
            warnings.simplefilter("ignore", RuntimeWarning)  # (every simulated thread's)
            kernel[grid, block](*arrays)
        cuda.synchronize()
    except IndexError as e:
        return (f"a thread read or wrote past the end of an array ({e}): only threads "
                "whose index is inside the array may touch it")
    return None


def _past_the_end(buffer, n: int) -> str | None:
    written = np.flatnonzero(buffer.copy_to_host()[n:] != BEYOND)
    if written.size:
        return (f"a thread wrote past the end of the output (element {n + written[0]} of an "
                f"output of {n}): only threads whose index is inside it may write")
    return None


def _wrong(got, want, what: str) -> str | None:
    bad = np.flatnonzero(~np.isclose(got, want, rtol=1e-5, atol=1e-6))
    if bad.size:
        i = bad[0]
        return (f"{what}: element {i} is {got[i]:.6g}, not {want[i]:.6g} "
                f"({bad.size} of {got.size} wrong)")
    return None


@cuda.jit
def _no_guard(a, x, y, out):
    i = cuda.grid(1)
    out[i] = a * x[i] + y[i]


@cuda.jit
def _thread_index_only(a, x, y, out):
    i = cuda.threadIdx.x
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def _scaled_sum(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * (x[i] + y[i])


SAXPY_SIZES = (1, 31, 32, 33, 100)


@exercise("0.4", "Your first kernel: a * x + y", wrong_answers={
    "no guard: the threads past the end write anyway": _no_guard,
    "threadIdx.x alone: every block does the first block's elements": _thread_index_only,
    "a * (x + y)": _scaled_sum,
})
def check_saxpy(saxpy):
    """``saxpy(a, x, y, out)``: out[i] = a * x[i] + y[i], launched with SAXPY_THREADS
    threads a block and one block more than the elements need."""
    rng = np.random.default_rng(3)
    for n in SAXPY_SIZES:
        x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        a = np.float32(2.5)
        _, dx = _padded(x)
        _, dy = _padded(y)
        out_buffer, out = _padded(np.full(n, np.nan, np.float32))
        blocks = math.ceil(n / SAXPY_THREADS) + 1
        where = f"n = {n}, {blocks} blocks of {SAXPY_THREADS} threads"
        problem = (_launch(saxpy, blocks, SAXPY_THREADS, a, dx, dy, out)
                   or _past_the_end(out_buffer, n)
                   or _wrong(out.copy_to_host(), a * x + y, "out"))
        if problem:
            return verdict("0.4", [f"{where}: {problem}"])
    return verdict("0.4", [], [
        f"right at n = {', '.join(map(str, SAXPY_SIZES))}, each with "
        f"{SAXPY_THREADS}-thread blocks and one block more than needed: the threads past "
        "the end touched nothing"])


def _max_mistake(missing: float, first_stride: int, guarded: bool = True):
    """A block maximum with one mistake: the elements past the end read as ``missing``,
    the tree's first stride ``first_stride``, or (``guarded`` False) no guard on the
    load."""
    @cuda.jit
    def kernel(x, out):
        i, t = cuda.grid(1), cuda.threadIdx.x
        best = cuda.shared.array(BLOCK, float32)
        best[t] = x[i] if not guarded or i < x.size else float32(missing)
        cuda.syncthreads()
        stride = first_stride
        while stride > 0:
            if t < stride:
                best[t] = max(best[t], best[t + stride])
            cuda.syncthreads()
            stride //= 2
        if t == 0:
            out[cuda.blockIdx.x] = best[0]

    return kernel


#: (n, the values' offset): a ragged last block, all negative, one element
MAX_CASES = ((200, 0.0), (128, 0.0), (150, -10.0), (1, -3.0))


@exercise("0.5", "A block's maximum through shared memory", wrong_answers={
    "the missing elements read as 0 (wrong where every value is negative)":
        _max_mistake(0.0, BLOCK // 2),
    "the tree starts at a quarter of the block: half of it is never read":
        _max_mistake(-math.inf, BLOCK // 4),
    "no guard on the load: the last block reads past the end":
        _max_mistake(-math.inf, BLOCK // 2, guarded=False),
})
def check_block_max(block_max):
    """``block_max(x, out)``: out[b] = the maximum of x[64 b : 64 b + 64], launched with
    one block of BLOCK threads for each 64 elements."""
    rng = np.random.default_rng(4)
    for n, offset in MAX_CASES:
        x = (rng.standard_normal(n) + offset).astype(np.float32)
        blocks = math.ceil(n / BLOCK)
        _, dx = _padded(x)
        out_buffer, out = _padded(np.full(blocks, np.nan, np.float32))
        want = np.array([x[b * BLOCK:(b + 1) * BLOCK].max() for b in range(blocks)])
        where = f"n = {n} ({blocks} blocks of {BLOCK} threads" + (
            ", every value negative)" if offset < 0 else ")")
        problem = (_launch(block_max, blocks, BLOCK, dx, out)
                   or _past_the_end(out_buffer, blocks)
                   or _wrong(out.copy_to_host(), want, "out (one maximum a block)"))
        if problem:
            return verdict("0.5", [f"{where}: {problem}"])
    return verdict("0.5", [], [
        f"right at n = {', '.join(str(n) for n, _ in MAX_CASES)}: a ragged last block, "
        "all-negative values and a single element; each block took "
        f"{int(math.log2(BLOCK))} steps of its tree"])


def _softmax_mistake(subtract_max: bool, pad_sum: bool, sum_from: int):
    @cuda.jit
    def kernel(x, out):
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        n = x.shape[1]
        buf = cuda.shared.array(BLOCK, float32)
        v = x[row, t] if t < n else float32(-math.inf)
        buf[t] = v
        cuda.syncthreads()
        stride = BLOCK // 2
        while stride > 0:
            if t < stride:
                buf[t] = max(buf[t], buf[t + stride])
            cuda.syncthreads()
            stride //= 2
        m = buf[0] if subtract_max else float32(0.0)
        cuda.syncthreads()
        if t < n:
            e = math.exp(v - m)
        elif pad_sum:
            e = math.exp(float32(0.0) - m)
        else:
            e = float32(0.0)
        buf[t] = e
        cuda.syncthreads()
        stride = sum_from
        while stride > 0:
            if t < stride:
                buf[t] += buf[t + stride]
            cuda.syncthreads()
            stride //= 2
        if t < n:
            out[row, t] = e / buf[0]

    return kernel


#: (rows, n, scale of the scores): a full block, a ragged row, one element, large scores
SOFTMAX_CASES = ((3, 64, 1.0), (2, 37, 3.0), (2, 1, 1.0), (2, 50, 60.0))


@exercise("0.6", "A row's softmax in one block", wrong_answers={
    "no maximum subtracted: exp overflows at large scores": _softmax_mistake(False, False, 32),
    "the lanes past the row add exp(0 - m) to the sum": _softmax_mistake(True, True, 32),
    "the sum's tree starts at 16: lanes 32-63 are left out": _softmax_mistake(True, False, 16),
})
def check_row_softmax(row_softmax):
    """``row_softmax(x, out)``: out[r] = softmax(x[r]) for each row r of x (rows, n),
    n <= BLOCK, launched with one block of BLOCK threads a row."""
    rng = np.random.default_rng(5)
    for rows, n, scale in SOFTMAX_CASES:
        x = (scale * rng.standard_normal((rows, n))).astype(np.float32)
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
        _, dx = _padded(x)
        out_buffer, out = _padded(np.full((rows, n), np.nan, np.float32))
        where = f"{rows} rows of {n}" + (f", scores up to {np.abs(x).max():.0f}"
                                         if scale > 10 else "")
        problem = (_launch(row_softmax, rows, BLOCK, dx, out)
                   or _past_the_end(out_buffer, rows * n))
        if not problem:
            got = out.copy_to_host()
            sums = got.sum(axis=1)
            problem = _wrong(got.ravel(), want.ravel(), "out (row-major)")
            if problem and np.isfinite(sums).all():
                problem += f"; the rows sum to {', '.join(f'{s:.4g}' for s in sums)}, not 1"
        if problem:
            return verdict("0.6", [f"{where}: {problem}"])
    return verdict("0.6", [], [
        f"right on {len(SOFTMAX_CASES)} inputs: a full block, a ragged row, one element, "
        "and scores large enough that exp(x) alone overflows fp32",
        "chapter 1's fused kernel uses this shape of code: one block a query row, "
        "a tree in shared memory, a barrier after every step"])
