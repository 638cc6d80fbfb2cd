"""Chapter 1's exercises: a sliding window in the minimal fused kernel, the logsumexp
its online softmax already holds, and a prediction of the fused kernel's time
against the unfused kernels'."""

from __future__ import annotations

import functools
import math

import numpy as np

import kernels
from kernels.api import prepare
from kernels.chapters.ch01_naive_attention import HEAD_DIMS
from kernels.exercises import exercise, verdict
from kernels.exercises.attention_checks import (check_kernel, keys_text, window_mask,
                                                windowed_reference, wrong_rows)
from numba import cuda, float32
from kernels.bench import Shape
from kernels.exercises.predictions import Band, prediction, speedup

#: (shape (B, H, S_q, S_k, D, causal), window): rows that see no key (S_q > S_k), a
#: one-key window, a window longer than the sequence
WINDOW_CASES = {
    "sim": [((1, 1, 9, 12, 16, True), 4), ((1, 2, 8, 5, 16, True), 3),
            ((1, 1, 6, 6, 32, True), 1), ((1, 1, 5, 7, 16, True), 10)],
    "gpu": [((2, 2, 300, 400, 64, True), 64), ((1, 2, 200, 100, 64, True), 30),
            ((1, 1, 64, 64, 128, True), 1), ((1, 1, 50, 70, 64, True), 200)],
}
#: shapes for the logsumexp: full, causal with rows that see no key, two heads
LSE_SHAPES = {
    "sim": [(1, 1, 9, 12, 16, False), (1, 1, 8, 5, 16, True), (1, 2, 6, 6, 32, True)],
    "gpu": [(2, 4, 257, 257, 64, False), (1, 3, 300, 129, 64, True),
            (1, 1, 129, 300, 128, True)],
}


def _mode() -> str:
    return "sim" if kernels.SIMULATED else "gpu"


@cuda.jit(device=True)
def _attend(q, k, v, b, h, i, d, first, last, scale, partial):
    """minimal_fused_kernel's loop over keys first..last: (m, l, acc) of lane d."""
    D = q.shape[3]
    q_d = float32(q[b, h, i, d]) * scale
    m = -math.inf
    l = float32(0.0)
    acc = float32(0.0)
    for j in range(first, last + 1):
        partial[d] = q_d * float32(k[b, h, j, d])
        cuda.syncthreads()
        stride = D // 2
        while stride > 0:
            if d < stride:
                partial[d] += partial[d + stride]
            cuda.syncthreads()
            stride //= 2
        score = partial[0]
        cuda.syncthreads()
        m_new = max(m, score)
        correction = math.exp(m - m_new)
        p = math.exp(score - m_new)
        l = l * correction + p
        acc = acc * correction + p * float32(v[b, h, j, d])
        m = m_new
    return m, l, acc


TOP_LEFT, ONE_MORE, UNCLAMPED = range(3)


@functools.cache
def _window_mistake(rule):
    """A windowed fused kernel with a wrong key range."""
    @cuda.jit
    def kernel(q, k, v, o, scale, diagonal, window):
        i, bh, d = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        b, h = bh // q.shape[1], bh % q.shape[1]
        partial = cuda.shared.array(128, float32)
        end = i if rule == TOP_LEFT else i + diagonal  # the last key row i sees
        first = end - window if rule == ONE_MORE else end - window + 1
        if rule != UNCLAMPED:
            first = max(0, first)
        m, l, acc = _attend(q, k, v, b, h, i, d, first, min(k.shape[2] - 1, end),
                            scale, partial)
        o[b, h, i, d] = acc / l if l > 0 else float32(0.0)

    return kernel


def _windowed(kernel, window):
    """The attention function that launches a reader's windowed kernel."""
    def attention(q, k, v, causal=False, scale=None, out=None):
        a = prepare(q, k, v, causal=causal, scale=scale, out=out,
                    kernel="windowed_fused_kernel", head_dims=HEAD_DIMS)
        kernel[(a.S_q, a.B * a.H), a.D](a.q, a.k, a.v, a.out, np.float32(a.scale),
                                        a.diagonal, window)
        return a.result

    attention.__name__ = "windowed_fused_kernel"
    return attention


@exercise("1.1", "A sliding window in the fused kernel", wrong_answers={
    "the window aligned top-left (ignores S_k - S_q)": _window_mistake(TOP_LEFT),
    "window + 1 keys": _window_mistake(ONE_MORE),
    "the first key not clamped at 0 (negative indices wrap around)":
        _window_mistake(UNCLAMPED),
})
def check_windowed_fused(kernel):
    """``kernel(q, k, v, o, scale, diagonal, window)``, launched one block of D threads
    per query row, as minimal_fused_kernel."""
    checked = []
    for shape, window in WINDOW_CASES[_mode()]:
        def explain(shape, captured, window=window):
            rows = wrong_rows(captured, windowed_reference(window), True, 1e-2)
            if not rows:
                return []
            b, h, i = rows[0]
            keys = np.flatnonzero(window_mask(shape[2], shape[3], window)[i])
            return [f"window={window}, S_q={shape[2]}, S_k={shape[3]}: row {i} should "
                    f"see {keys_text(keys)} (of (b, h) = ({b}, {h}); {len(rows)} rows "
                    "are wrong)"]

        problems, ok = check_kernel(_windowed(kernel, window), [shape], explain=explain,
                                    reference=windowed_reference(window))
        if problems:
            return verdict("1.1", problems)
        checked += [f"window={window}: {line}" for line in ok]
    shape, window = WINDOW_CASES[_mode()][0]
    seen = window_mask(shape[2], shape[3], window).sum()
    causal = window_mask(shape[2], shape[3], shape[3]).sum()
    return verdict("1.1", [], checked + [
        f"at S_q={shape[2]}, S_k={shape[3]}, window={window} the kernel visits {seen} "
        f"(row, key) pairs; masking the window inside the causal loop would visit {causal}"])


LOG_L, ZERO_FOR_EMPTY, BASE_2 = range(3)


@functools.cache
def _lse_mistake(rule):
    """minimal_fused_kernel writing a wrong logsumexp."""
    @cuda.jit
    def kernel(q, k, v, o, lse, scale, causal, diagonal):
        i, bh, d = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        b, h = bh // q.shape[1], bh % q.shape[1]
        partial = cuda.shared.array(128, float32)
        last = k.shape[2] - 1
        if causal:
            last = min(last, i + diagonal)
        m, l, acc = _attend(q, k, v, b, h, i, d, 0, last, scale, partial)
        o[b, h, i, d] = acc / l if l > 0 else float32(0.0)
        if d == 0:
            if l == 0:
                lse[b, h, i] = float32(0.0) if rule == ZERO_FOR_EMPTY else -math.inf
            elif rule == LOG_L:
                lse[b, h, i] = math.log(l)
            elif rule == BASE_2:
                lse[b, h, i] = m + math.log2(l)
            else:
                lse[b, h, i] = m + math.log(l)

    return kernel


def _with_lse(kernel):
    def attention(q, k, v, causal=False, scale=None, out=None, lse=None):
        a = prepare(q, k, v, causal=causal, scale=scale, out=out, lse=lse,
                    kernel="minimal_fused_lse_kernel", head_dims=HEAD_DIMS)
        kernel[(a.S_q, a.B * a.H), a.D](a.q, a.k, a.v, a.out, a.lse(),
                                        np.float32(a.scale), a.causal, a.diagonal)
        return a.result

    attention.__name__ = "minimal_fused_lse_kernel"
    return attention


@exercise("1.2", "The logsumexp the online softmax already holds", wrong_answers={
    "log(l) alone: l is a sum of exp(s - m), not of exp(s)": _lse_mistake(LOG_L),
    "0 for a row that sees no key (it is -inf)": _lse_mistake(ZERO_FOR_EMPTY),
    "log2 (the kernel's exp is natural)": _lse_mistake(BASE_2),
})
def check_fused_lse(kernel):
    """``kernel(q, k, v, o, lse, scale, causal, diagonal)``, launched as
    minimal_fused_kernel; lse is (B, H, S_q) float32."""
    problems, checked = check_kernel(_with_lse(kernel), LSE_SHAPES[_mode()], lse=True)
    return verdict("1.2", problems, checked)


# ---- 1.3: predict the measurement ------------------------------------------------------

#: a suite shape whose fused/unfused timings the chapter does not print
FUSED_SHAPE = Shape(16, 16, 1024, 1024, 128)

check_fused_prediction = prediction(
    "1.3", "Predict: the fused kernel's time against the unfused kernels'",
    measure=speedup("minimal_fused_attention", "unfused_attention", FUSED_SHAPE, 1),
    band=Band(0.3, side_of=1.0, sides=("faster than the unfused kernels",
                                       "slower than the unfused kernels")),
    wrong_answers={"fusing halved the time (the wrong side of 1)": 0.5,
                   "ten times slower": 10.0})
