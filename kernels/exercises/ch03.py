"""Chapter 3's exercises: merging two partial online-softmax states, and the key tiles
a causal pass visits when S_q != S_k, and a prediction of what skipping the masked tiles
gains."""

from __future__ import annotations

import math

import numpy as np

from kernels.chapters.ch02_loop_inversion import causal_key_end
from kernels.chapters.ch03_tiled_online_softmax import online_softmax_tile
from kernels.check import to_device, to_host
from kernels.exercises import exercise, verdict
from numba import cuda
from kernels.bench import Shape
from kernels.exercises.predictions import Band, prediction, speedup

D = 4  #: elements of the accumulator in the merge's states


def _state(s, v):
    """The online-softmax state (m, l, acc), base 2, of the keys with scores s."""
    state = (-np.inf, 0.0, np.zeros(D))
    return online_softmax_tile(*state, s, v) if s.size else state


def _scenarios():
    """(what, scores, values, where the first part ends): the keys are split in two."""
    rng = np.random.default_rng(3)
    n = 12
    v = rng.standard_normal((n, D))
    s = rng.standard_normal(n) * 2
    first_high, second_high = s.copy(), s.copy()
    first_high[1] += 12
    second_high[9] += 12
    masked = s.copy()
    masked[7:] = -np.inf
    return [("two parts of random scores", s, v, 5),
            ("the larger maximum in the first part", first_high, v, 5),
            ("the larger maximum in the second part", second_high, v, 5),
            ("a first part that saw no key", s, v, 0),
            ("a second part whose keys are all masked (-inf)", masked, v, 7),
            ("two parts that saw no key", np.full(n, -np.inf), v, 6),
            ("scores near 1100: exp2 of a score overflows even float64", s + 1100, v, 4)]


def _text(state) -> str:
    m, l, acc = state
    return f"(m={m:.6g}, l={l:.6g}, acc=[{', '.join(f'{x:.4g}' for x in acc)}])"


def _merge_unguarded(a, b):
    m = max(a[0], b[0])
    scale_a, scale_b = np.exp2(a[0] - m), np.exp2(b[0] - m)
    return m, a[1] * scale_a + b[1] * scale_b, a[2] * scale_a + b[2] * scale_b


def _merge_natural(a, b):
    m = max(a[0], b[0])
    if m == -np.inf:
        return a
    scale_a, scale_b = np.exp(a[0] - m), np.exp(b[0] - m)
    return m, a[1] * scale_a + b[1] * scale_b, a[2] * scale_a + b[2] * scale_b


def _merge_sums_unscaled(a, b):
    m = max(a[0], b[0])
    if m == -np.inf:
        return a
    scale_a, scale_b = np.exp2(a[0] - m), np.exp2(b[0] - m)
    return m, a[1] + b[1], a[2] * scale_a + b[2] * scale_b


@exercise("3.1", "Merging two partial states", wrong_answers={
    "no guard for two empty parts: exp2(-inf - (-inf)) is NaN": _merge_unguarded,
    "exp instead of exp2 (the states are in base 2)": _merge_natural,
    "the sums l added without rescaling": _merge_sums_unscaled,
})
def check_merge(merge):
    """``merge(a, b)``: the online-softmax state (m, l, acc), base 2 as
    online_softmax_tile keeps it, of the keys of two states a and b together."""
    for what, s, v, cut in _scenarios():
        a, b = _state(s[:cut], v[:cut]), _state(s[cut:], v[cut:])
        want = _state(s, v)
        with np.errstate(all="ignore"):  # a NaN is reported below, not warned about
            m, l, acc = merge(a, b)
            acc = np.asarray(acc, np.float64)
            got = (float(m), float(l), acc)
            right = (got[0] == want[0] and np.isclose(got[1], want[1], rtol=1e-12, atol=0)
                     and acc.shape == want[2].shape
                     and np.allclose(acc, want[2], rtol=1e-12, atol=1e-300))
        if not right:
            problems = [f"{what}: merge(a, b) gave {_text(got)}, expected {_text(want)}",
                        f"a = {_text(a)}", f"b = {_text(b)}"]
            if np.isnan(got[1]) or np.isnan(acc).any():
                problems.insert(1, "NaN: exp2(-inf - (-inf)) where neither part saw a key?")
            elif got[0] != want[0]:
                problems.insert(1, "m should be the larger of the two maxima")
            else:
                wrong = [name for name, ok in (
                    ("l", np.isclose(got[1], want[1], rtol=1e-12, atol=0)),
                    ("acc", acc.shape == want[2].shape
                     and np.allclose(acc, want[2], rtol=1e-12, atol=1e-300))) if not ok]
                problems.insert(1, f"m is right; {' and '.join(wrong)} "
                                f"{'is' if len(wrong) == 1 else 'are'} not")
            return verdict("3.1", problems)
    return verdict("3.1", [], [
        f"right on {len(_scenarios())} pairs of states: "
        + "; ".join(what for what, *_ in _scenarios()),
        "the merged state is that of all the keys at once: acc / l is the output, "
        "m + log2(l) the base-2 logsumexp"])


#: (S_q, S_k, rows, keys): the register-tiled kernel's blocks (64 x 32) and the first
#: kernel's (32 x 16), square, more keys than queries and fewer, one query row
TILE_CASES = [(512, 512, 64, 32), (100, 300, 64, 32), (300, 100, 64, 32), (37, 37, 32, 16),
              (64, 200, 64, 32), (200, 64, 32, 16), (1, 50, 64, 32), (130, 129, 64, 32)]


@cuda.jit
def _key_ends(cases, out):
    """causal_key_end of each (S_q, S_k, row0, rows): where a block's key loop stops."""
    t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if t < cases.shape[0]:
        S_q, S_k = cases[t, 0], cases[t, 1]
        out[t] = causal_key_end(S_q, S_k, cases[t, 2], cases[t, 3], True, S_k - S_q)


def tiles_per_block(cases) -> list[list[int]]:
    """For each (S_q, S_k, rows, keys): the key tiles each block of rows visits under
    the causal mask, as the chapter's kernels loop (``range(0, key_end, keys)``, with
    ``key_end`` from the chapter's ``causal_key_end``, run as a kernel)."""
    blocks = [(S_q, S_k, row0, rows) for S_q, S_k, rows, _ in cases
              for row0 in range(0, S_q, rows)]
    dblocks, = to_device(np.array(blocks, np.int64))
    out, = to_device(np.zeros(len(blocks), np.int64))
    _key_ends[math.ceil(len(blocks) / 64), 64](dblocks, out)
    ends = iter(int(e) for e in to_host(out))
    return [[len(range(0, next(ends), keys)) for _ in range(0, S_q, rows)]
            for S_q, S_k, rows, keys in cases]


@exercise("3.2", "The tiles a causal pass visits", wrong_answers={
    "aligned top-left (ignores S_k - S_q)": lambda S_q, S_k, rows, keys: sum(
        math.ceil(min(S_k, min(r + rows, S_q)) / keys) for r in range(0, S_q, rows)),
    "every tile (no skipping)": lambda S_q, S_k, rows, keys:
        math.ceil(S_q / rows) * math.ceil(S_k / keys),
    "whole tiles only (floor): the diagonal's partial tile left out":
        lambda S_q, S_k, rows, keys: sum(
            max(0, min(S_k, min(r + rows, S_q) + S_k - S_q)) // keys
            for r in range(0, S_q, rows)),
})
def check_tiles_visited(tiles_visited):
    """``tiles_visited(S_q, S_k, rows, keys)``: the K/V tiles a causal pass over one
    head visits, blocks of ``rows`` query rows, tiles of ``keys`` keys."""
    counts = tiles_per_block(TILE_CASES)
    for (S_q, S_k, rows, keys), per_block in zip(TILE_CASES, counts):
        got = tiles_visited(S_q, S_k, rows, keys)
        if got != sum(per_block):
            return verdict("3.2", [
                f"S_q={S_q}, S_k={S_k}, blocks of {rows} rows, tiles of {keys} keys: the "
                f"kernel visits {sum(per_block)} tiles, yours says {got}",
                f"tiles per block, first to last: {per_block} (of {math.ceil(S_k / keys)} "
                "each)"])
    lines = [f"right at {len(TILE_CASES)} shapes; the share of tiles visited:"]
    for (S_q, S_k, rows, keys), per_block in zip(TILE_CASES[:3], counts):
        total = len(per_block) * math.ceil(S_k / keys)
        lines.append(f"S_q={S_q}, S_k={S_k}: {sum(per_block)} of {total} "
                     f"({sum(per_block) / total:.0%})")
    return verdict("3.2", [], lines)


# ---- 3.3: predict the measurement ------------------------------------------------------

#: a causal suite shape at which both the kernel and its every-tile step were timed
SKIP_SHAPE = Shape(4, 32, 4096, 4096, 64, causal=True)

check_skip_prediction = prediction(
    "3.3", "Predict: what skipping the masked tiles gains",
    measure=speedup("tiled_online_softmax_no_tile_skip", "tiled_online_softmax", SKIP_SHAPE, 3),
    band=Band(0.2, side_of=1.0, sides=("slower with skipping", "faster with skipping")),
    wrong_answers={"no gain: the masked scores were cheap anyway": 1.0,
                   "four times faster": 4.0})
