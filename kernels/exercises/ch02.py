"""Chapter 2's exercises: a butterfly sum over eight lanes, the key range a block of rows
visits under a sliding window, and a prediction of what the loop inversion gains."""

from __future__ import annotations

import functools
import math

import numpy as np

import kernels
from kernels.api import prepare
from kernels.chapters.ch02_loop_inversion import (FULL_MASK, HEAD_DIMS, KV_TILE,
                                                  ROW_LANES, ROWS_PER_BLOCK,
                                                  load_row_slice, row_of_thread, row_sum,
                                                  stage_kv_tile)
from kernels.check import to_device, to_host
from kernels.exercises import exercise, verdict
from kernels.exercises.attention_checks import check_kernel, keys_text, windowed_reference
from numba import cuda, float32, uint64
from kernels.bench import Shape
from kernels.exercises.predictions import Band, prediction, speedup

GROUP = 8  #: lanes a row in exercise 2.1
WARPS = 2  #: warps the sum is checked on


@functools.cache
def _group_sum_kernel(group_sum):
    @cuda.jit
    def kernel(x, out):
        t = cuda.threadIdx.x
        out[t] = group_sum(x[t])

    return kernel


def _span(lane: int, width: int) -> tuple[int, int]:
    first = lane - lane % width
    return first, first + width - 1


@cuda.jit(device=True)
def _sum_four_lanes(x):
    offset = 1
    while offset < 4:
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
        offset *= 2
    return x


@cuda.jit(device=True)
def _sum_sixteen_lanes(x):
    offset = 1
    while offset <= GROUP:
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
        offset *= 2
    return x


@cuda.jit(device=True)
def _sum_down(x):
    offset = GROUP // 2
    while offset > 0:
        x += cuda.shfl_down_sync(FULL_MASK, x, offset)
        offset //= 2
    return x


@exercise("2.1", "Eight lanes a row", wrong_answers={
    "two steps: the sum of four lanes": _sum_four_lanes,
    "four steps: the sum of sixteen lanes": _sum_sixteen_lanes,
    "shfl_down: only the first lane of a group gets its total": _sum_down,
})
def check_group_sum(group_sum):
    """``group_sum(x)``, a device function: every lane gets the sum of x over its
    group of eight lanes (0-7, 8-15, ...)."""
    lanes = 32 * WARPS
    x = np.random.default_rng().integers(1, 100, lanes).astype(np.float32)
    out, = to_device(np.full(lanes, np.nan, np.float32))
    dx, = to_device(x)
    _group_sum_kernel(group_sum)[1, lanes](dx, out)
    got = to_host(out)
    sums = {width: np.repeat(x.reshape(-1, width).sum(axis=1), width)
            for width in (1, 2, 4, 8, 16, 32)}
    wrong = np.flatnonzero(got != sums[GROUP])
    if wrong.size:
        lane = int(wrong[0])
        first, last = _span(lane, GROUP)
        problems = [f"lane {lane} got {got[lane]:g}; lanes {first}-{last} sum to "
                    f"{sums[GROUP][lane]:g} ({wrong.size} of {lanes} lanes are wrong)"]
        leaders = np.arange(0, lanes, GROUP)
        if (got[leaders] == sums[GROUP][leaders]).all():
            problems.append(f"lanes {', '.join(str(x) for x in leaders)} are right: only "
                            "the first lane of each group holds the total, where every "
                            "lane needs it")
        for width, s in sums.items():
            if width != GROUP and got[lane] == s[lane]:
                a, b = _span(lane, width)
                problems.append(f"{got[lane]:g} is lane {lane}'s own value: nothing was added"
                                if width == 1 else
                                f"{got[lane]:g} is the sum over the {width} lanes {a}-{b}")
                break
        return verdict("2.1", problems)
    return verdict("2.1", [], [f"all {lanes} lanes of {WARPS} warps hold the sum of their "
                               f"group of {GROUP}, after log2({GROUP}) = "
                               f"{int(math.log2(GROUP))} exchanges"])


def tight_range(row0, rows, S_q, S_k, window) -> tuple[int, int]:
    """The keys [start, end) that some row of the block row0 .. row0 + rows - 1 sees
    under the sliding window: the first row's first key to the last row's diagonal."""
    diagonal = S_k - S_q
    last_row = min(row0 + rows, S_q) - 1
    return max(0, row0 + diagonal - window + 1), min(S_k, last_row + diagonal + 1)


#: (S_q, S_k, window) for the key ranges: square and not both ways, rows that see no
#: key, a one-key window, windows longer than the sequence, a last block of one row
RANGE_CASES = [(100, 100, 8), (100, 300, 20), (300, 100, 5), (40, 45, 6), (37, 20, 50),
               (64, 64, 1), (33, 1, 3), (96, 200, 500)]
#: (shape, window) for the attention: two blocks of rows; rows that see no key
ATTENTION_CASES = {
    "sim": [((1, 1, 40, 45, 16, True), 6), ((1, 1, 36, 20, 16, True), 7)],
    "gpu": [((2, 2, 300, 400, 64, True), 64), ((1, 2, 300, 100, 64, True), 30),
            ((1, 1, 128, 128, 128, True), 1)],
}


@functools.cache
def _range_kernel(key_range):
    @cuda.jit
    def kernel(cases, out):
        t = cuda.threadIdx.x
        if t < cases.shape[0]:
            start, end = key_range(cases[t, 0], cases[t, 1], cases[t, 2], cases[t, 3],
                                   cases[t, 4], cases[t, 5])
            out[t, 0] = start
            out[t, 1] = end

    return kernel


@functools.cache
def _windowed_inverted_kernel(D, key_range):
    """loop_inverted_kernel under the sliding window: the block visits the keys
    ``key_range`` gives, and each row masks those outside its own window."""
    W = D // ROW_LANES
    TILE_ELEMS = KV_TILE * D

    @cuda.jit
    def kernel(q, k, v, o, scale, diagonal, window):
        b, h, i, t, row0 = row_of_thread(q)
        S_q, S_k = q.shape[2], k.shape[2]
        row = min(i, S_q - 1)
        k_tile = cuda.shared.array(TILE_ELEMS, float32, alignment=16)
        v_tile = cuda.shared.array(TILE_ELEMS, float32, alignment=16)
        q_reg = cuda.local.array(W, float32)
        acc = cuda.local.array(W, float32)
        load_row_slice(q, b, h, row, t, W, scale, q_reg, acc)
        m = -math.inf
        l = float32(0.0)
        start, end = key_range(row0, ROWS_PER_BLOCK, S_q, S_k, diagonal, window)
        for kv0 in range(start, end, KV_TILE):
            cuda.syncthreads()
            stage_kv_tile(k, v, k_tile, v_tile, b, h, kv0, D, KV_TILE)
            cuda.syncthreads()
            for c in range(min(KV_TILE, end - kv0)):
                base = uint64(c * D + t * W)
                part = float32(0.0)
                for e in range(uint64(W)):
                    part += q_reg[e] * k_tile[base + e]
                score = row_sum(part)
                j = kv0 + c
                if j > row + diagonal or j <= row + diagonal - window:
                    continue  # outside this row's window (after the shuffles)
                m_new = max(m, score)
                correction = math.exp(m - m_new)
                p = math.exp(score - m_new)
                l = l * correction + p
                for e in range(uint64(W)):
                    acc[e] = acc[e] * correction + p * v_tile[base + e]
                m = m_new
        if i < S_q:
            inv = float32(1.0) / l if l > 0 else float32(0.0)
            for e in range(W):
                o[b, h, i, t * W + e] = acc[e] * inv

    return kernel


def _windowed(key_range, window):
    def attention(q, k, v, causal=False, scale=None, out=None):
        a = prepare(q, k, v, causal=causal, scale=scale, out=out,
                    kernel="windowed_loop_inverted", head_dims=HEAD_DIMS)
        grid = (math.ceil(a.S_q / ROWS_PER_BLOCK), a.B * a.H)
        _windowed_inverted_kernel(a.D, key_range)[grid, ROWS_PER_BLOCK * ROW_LANES](
            a.q, a.k, a.v, a.out, np.float32(a.scale), a.diagonal, window)
        return a.result

    attention.__name__ = "windowed loop_inverted_kernel"
    return attention


@cuda.jit(device=True)
def _from_last_row(row0, rows, S_q, S_k, diagonal, window):
    last_row = min(row0 + rows, S_q) - 1
    return max(0, last_row + diagonal - window + 1), min(S_k, last_row + diagonal + 1)


@cuda.jit(device=True)
def _to_first_row(row0, rows, S_q, S_k, diagonal, window):
    return max(0, row0 + diagonal - window + 1), min(S_k, row0 + diagonal + 1)


@cuda.jit(device=True)
def _one_key_early(row0, rows, S_q, S_k, diagonal, window):
    last_row = min(row0 + rows, S_q) - 1
    return max(0, row0 + diagonal - window), min(S_k, last_row + diagonal + 1)


@exercise("2.2", "The keys a block visits under a sliding window", wrong_answers={
    "the window of the block's last row: the first rows miss keys": _from_last_row,
    "up to the first row's diagonal: the last rows miss keys": _to_first_row,
    "one key before the window": _one_key_early,
})
def check_window_key_range(key_range):
    """``key_range(row0, rows, S_q, S_k, diagonal, window)``, a device function giving
    (start, end): the keys the block of query rows row0 .. row0 + rows - 1 visits."""
    cases = [(row0, ROWS_PER_BLOCK, S_q, S_k, S_k - S_q, window)
             for S_q, S_k, window in RANGE_CASES for row0 in range(0, S_q, ROWS_PER_BLOCK)]
    dcases, = to_device(np.array(cases, np.int64))
    out, = to_device(np.zeros((len(cases), 2), np.int64))
    _range_kernel(key_range)[1, len(cases)](dcases, out)
    for (row0, rows, S_q, S_k, _, window), (start, end) in zip(cases, to_host(out)):
        want = tight_range(row0, rows, S_q, S_k, window)
        if (start, end) == want or (want[1] <= want[0] and end <= start):
            continue
        last = min(row0 + rows, S_q) - 1
        problem = (f"S_q={S_q}, S_k={S_k}, window={window}: the rows {row0}-{last} see "
                   f"{keys_text(range(*want))} between them; yours visits "
                   f"{keys_text(range(start, end))}")
        missed = [j for j in range(*want) if not start <= j < end]
        extra = [j for j in range(start, end) if not want[0] <= j < want[1]]
        detail = (f"it misses key {missed[0]}" if missed else
                  f"key {extra[0]} is in no row's window: the block would load it for "
                  "nothing")
        if missed:
            row = next(i for i in range(row0, last + 1)
                       if tight_range(i, 1, S_q, S_k, window)[0] <= missed[0]
                       < tight_range(i, 1, S_q, S_k, window)[1])
            detail += (f", which row {row} sees (its window: "
                       f"{keys_text(range(*tight_range(row, 1, S_q, S_k, window)))})")
        return verdict("2.2", [problem, detail])
    checked = [f"the key range is exact for {len(cases)} blocks of {ROWS_PER_BLOCK} rows"]
    for shape, window in ATTENTION_CASES["sim" if kernels.SIMULATED else "gpu"]:
        problems, ok = check_kernel(_windowed(key_range, window), [shape],
                                    reference=windowed_reference(window))
        if problems:
            return verdict("2.2", problems)
        checked += [f"in the loop-inverted kernel, window={window}: {line}" for line in ok]
    S_q, S_k, window = 300, 100, 5
    blocks = range(0, S_q, ROWS_PER_BLOCK)
    visited = sum(max(0, e - s) for s, e in (tight_range(r, ROWS_PER_BLOCK, S_q, S_k, window)
                                             for r in blocks))
    causal = sum(max(0, tight_range(r, ROWS_PER_BLOCK, S_q, S_k, S_k)[1]) for r in blocks)
    checked.append(f"at S_q={S_q}, S_k={S_k}, window={window} the blocks of a head load "
                   f"{visited} keys in all; from key 0 to the diagonal (causal_key_end) "
                   f"they would load {causal}")
    return verdict("2.2", [], checked)


# ---- 2.3: predict the measurement ------------------------------------------------------

#: a suite shape whose two timings the chapter does not print
INVERSION_SHAPE = Shape(4, 16, 4096, 4096, 128)

check_inversion_prediction = prediction(
    "2.3", "Predict: what the loop inversion gains",
    measure=speedup("per_row_kv_attention", "loop_inverted_attention", INVERSION_SHAPE, 2),
    band=Band(0.25),
    wrong_answers={"four times faster: K and V loaded once for the block's rows": 4.0,
                   "half the speed": 0.5})
