"""Chapter 0's exercises: the sliding-window mask, the arithmetic intensity of
decoding, and the bytes of the score matrix."""

from __future__ import annotations

import numpy as np

import kernels.results
from kernels.bench import attention_flops, min_bytes
from kernels.exercises import exercise, verdict
from kernels.exercises.attention_checks import keys_text, window_mask

#: (S_q, S_k, window): square and not, rows that see no key, a one-key window, a
#: window longer than the sequence
WINDOW_CASES = [(6, 6, 3), (6, 4, 2), (3, 7, 3), (5, 5, 1), (4, 6, 10), (9, 12, 4)]


def _drawn(mask: np.ndarray) -> list[str]:
    return ["  " + "".join("#" if x else "." for x in row) for row in mask]


@exercise("0.1", "A sliding window", wrong_answers={
    "aligned top-left, as if S_q == S_k":
        lambda S_q, S_k, w: (np.arange(S_k)[None, :] <= np.arange(S_q)[:, None])
        & (np.arange(S_k)[None, :] > np.arange(S_q)[:, None] - w),
    "window + 1 keys (<= at both ends)":
        lambda S_q, S_k, w: (np.arange(S_k)[None, :] <= np.arange(S_q)[:, None] + S_k - S_q)
        & (np.arange(S_k)[None, :] >= np.arange(S_q)[:, None] + S_k - S_q - w),
    "the window without the causal bound: future keys seen":
        lambda S_q, S_k, w: np.arange(S_k)[None, :] > np.arange(S_q)[:, None] + S_k - S_q - w,
})
def check_sliding_window(sliding_window):
    """``sliding_window(S_q, S_k, window)``: the (S_q, S_k) boolean mask."""
    for S_q, S_k, window in WINDOW_CASES:
        where = f"S_q={S_q}, S_k={S_k}, window={window}"
        got = np.asarray(sliding_window(S_q, S_k, window))
        if got.shape != (S_q, S_k):
            return verdict("0.1", [f"{where}: the mask has shape {got.shape}, not "
                                   f"(S_q, S_k) = {(S_q, S_k)}"])
        want = window_mask(S_q, S_k, window)
        wrong = np.flatnonzero((got.astype(bool) != want).any(axis=1))
        if wrong.size:
            i = wrong[0]
            return verdict("0.1", [
                f"{where}: row {i} should see {keys_text(np.flatnonzero(want[i]))}; yours sees "
                f"{keys_text(np.flatnonzero(got[i]))}",
                f"(rows {', '.join(str(r) for r in wrong)} differ; the last row sees the "
                "last key, and each row sees at most `window` keys)"])
    S_q, S_k, window = WINDOW_CASES[1]
    return verdict("0.1", [], [
        f"the mask is right at {len(WINDOW_CASES)} shapes; at S_q={S_q}, S_k={S_k}, "
        f"window={window} (# = seen; the first {S_q - S_k} rows see no key):",
        *_drawn(window_mask(S_q, S_k, window))])


#: (S_q, S_k, D): square, decoding (one query row), prefill against a cache, ragged
INTENSITY_CASES = [(2048, 2048, 64), (4096, 4096, 128), (1, 4096, 128), (1, 512, 64),
                   (8, 4096, 128), (512, 16384, 64), (300, 129, 64), (1, 1, 64)]


def _intensity(S_q, S_k, D) -> float:
    return attention_flops(1, 1, S_q, S_k, D) / min_bytes(1, 1, S_q, S_k, D)


@exercise("0.2", "How much arithmetic per byte when decoding", wrong_answers={
    "S / 2, which holds only for square shapes": lambda S_q, S_k, D: S_q / 2,
    "4 bytes an element (fp32)":
        lambda S_q, S_k, D: 4 * S_q * S_k * D / (4 * D * (2 * S_q + 2 * S_k)),
    "the output's bytes left out":
        lambda S_q, S_k, D: 4 * S_q * S_k * D / (2 * D * (S_q + 2 * S_k)),
})
def check_intensity(intensity):
    """``intensity(S_q, S_k, D)``: FLOPs per byte of one (batch element, head), fp16,
    not causal."""
    for S_q, S_k, D in INTENSITY_CASES:
        got, want = float(intensity(S_q, S_k, D)), _intensity(S_q, S_k, D)
        if not np.isclose(got, want, rtol=1e-9, atol=0.0):
            return verdict("0.2", [
                f"S_q={S_q}, S_k={S_k}, D={D}: {want:.6g} FLOP per byte "
                f"({attention_flops(1, 1, S_q, S_k, D):.0f} FLOPs over "
                f"{min_bytes(1, 1, S_q, S_k, D)} bytes), yours {got:.6g}"])
    lines = [f"right at {len(INTENSITY_CASES)} shapes; for example:",
             f"S = 4096 square: {_intensity(4096, 4096, 128):.0f} FLOP per byte; "
             f"a decoding step, S_q = 1 against S_k = 4096: {_intensity(1, 4096, 128):.3f}"]
    recorded = kernels.results.load()
    if recorded is not None:
        ceilings = recorded["ceilings"]
        ridge = ceilings["matmul_tflops"] / ceilings["copy_tb_s"]
        decoding = _intensity(1, 4096, 128)
        lines.append(f"the ridge point of the recorded {recorded['provenance']['gpu']}: "
                     f"{ridge:.0f} FLOP per byte, {ridge / decoding:.0f}x the decoding "
                     "step's: " + ("it is bound by memory" if decoding < ridge
                                   else "it is bound by arithmetic"))
    return verdict("0.2", [], lines)


# ---- 0.3: the bytes of the score matrix ------------------------------------------------

#: (B, H, S_q, S_k, bytes an element): the journey's shape in fp32 and fp16, decoding,
#: a ragged shape, one element
SCORE_CASES = [(16, 16, 2048, 2048, 4), (16, 16, 2048, 2048, 2), (1, 32, 1, 8192, 2),
               (4, 8, 300, 129, 4), (1, 1, 1, 1, 2), (2, 32, 16384, 16384, 2)]


def _score_bytes(B, H, S_q, S_k, itemsize) -> int:
    return B * H * S_q * S_k * itemsize


@exercise("0.3", "The bytes of the score matrix", wrong_answers={
    "one head only (H left out)": lambda B, H, S_q, S_k, itemsize: B * S_q * S_k * itemsize,
    "bits, not bytes": lambda B, H, S_q, S_k, itemsize: 8 * B * H * S_q * S_k * itemsize,
    "the size of Q (S_q x D), not of S": lambda B, H, S_q, S_k, itemsize:
        B * H * S_q * 64 * itemsize,
})
def check_score_bytes(score_bytes):
    """``score_bytes(B, H, S_q, S_k, itemsize)``: the bytes the score matrices S of a
    batch take, ``itemsize`` bytes an element."""
    for B, H, S_q, S_k, itemsize in SCORE_CASES:
        got, want = score_bytes(B, H, S_q, S_k, itemsize), _score_bytes(B, H, S_q, S_k, itemsize)
        if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
            return verdict("0.3", [f"score_bytes returned {got!r}: return a number of bytes"])
        if got != want:
            hint = ("; that is S_q x S_k x itemsize for one head: a batch has B x H of them"
                    if got * H == want and H > 1 else
                    "; that counts bits: a byte is 8 bits" if got == 8 * want else "")
            return verdict("0.3", [f"B={B}, H={H}, S_q={S_q}, S_k={S_k}, {itemsize} bytes an "
                                   f"element: S takes {want} bytes, yours says {got}{hint}"])
    journey = _score_bytes(16, 16, 2048, 2048, 4)
    inputs = 3 * 16 * 16 * 2048 * 64 * 2  # q, k and v at D = 64 in fp16
    long = _score_bytes(1, 32, 131072, 131072, 2)  # a 128k-token context
    return verdict("0.3", [], [
        f"right at {len(SCORE_CASES)} shapes",
        f"B=16, H=16, S=2048 in fp32: {journey / 1e9:.1f} GB of scores, against "
        f"{inputs / 1e9:.1f} GB for q, k and v (D = 64, fp16)",
        f"one sequence of 131072 tokens, H=32, in fp16: {long / 1e9:,.0f} GB, against an "
        "H200's 141 GB of memory: a fused kernel never stores S at all"])
