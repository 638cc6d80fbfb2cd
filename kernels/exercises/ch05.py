"""Chapter 5's exercises: a step that fits a T4's shared memory without giving up rows,
rescaling O whatever the fragments' layout, and how high the rescale threshold may go
in fp16, and a prediction of how many times faster than chapter 4's kernel it runs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels

from .. import gpus
from ..api import prepare
from ..chapters import ch05_tensor_cores as ch05
from . import builds, exercise, verdict
from ..bench import Shape
from .predictions import Band, prediction, speedup

# ---- 5.1: a T4's 64 KB ----------------------------------------------------------------

T4 = gpus.READER_GPUS[0]
_T4_STEP = gpus.fastest(T4.compute_capability)[1]  # the fastest step a T4 runs (no cp.async)


def shared_parts(cfg, D: int) -> dict:
    """The dynamic shared memory of a block of step ``cfg`` at head dim D, part by part,
    as CONFIG_SOURCE carves it (their sum is the chapter's shared_bytes)."""
    row_tiles, keys = cfg.tiles_at(D)
    rows = 16 * row_tiles
    parts = {"K and V tiles": 2 * (2 if cfg.cp_async else 1) * (keys * (D + cfg.kv_pad) * 2
                                                               if cfg.kv_smem else 0),
             "fp32 scratch (S, then O)": cfg.warps * rows * (max(keys, D) + 4) * 4,
             "P": cfg.warps * rows * (keys + 8) * 2,
             "bounce buffer": 0 if cfg.kv_smem else cfg.warps * 16 * (D + 8) * 2,
             "row factors": cfg.warps * rows * 4}
    assert sum(parts.values()) == ch05.shared_bytes(cfg, D), "the layout has changed"
    return parts


def _parts_text(cfg, D: int) -> str:
    parts = shared_parts(cfg, D)
    return ", ".join(f"{name} {n}" for name, n in parts.items() if n) + \
        f": {sum(parts.values())} bytes"


def _options(cfg, D: int, expected: int | None = None) -> tuple:
    """NVRTC's options for ``cfg`` at D, the launcher's count of shared memory replaced by
    ``expected`` (the source refuses to compile where they differ)."""
    options = ch05.nvrtc_options(cfg, D)
    if expected is None:
        return options
    return tuple(f"-DSHARED_BYTES_EXPECTED={expected}" if o.startswith("-DSHARED_BYTES_EXPECTED=")
                 else o for o in options)


def _config_attention(cfg):
    """Chapter 5's kernel in the tiling ``cfg``, launched as the chapter launches
    wmma_copy16, whose parameters it shares."""
    def attention(q, k, v, causal=False, scale=None, out=None, lse=None, return_lse=False):
        a = prepare(q, k, v, causal=causal, scale=scale, out=out, kernel="your T4 tiling",
                    head_dims=ch05.HEAD_DIMS, dtypes=ch05.DTYPES, lse=lse,
                    return_lse=return_lse, pointers=True)
        launch = ch05.launch_description(_T4_STEP, a, gpus.current())
        nbytes = ch05.shared_bytes(cfg, a.D)
        fn = builds.gpu_kernel(ch05.SOURCE, ch05.nvrtc_options(cfg, a.D, a.dtype),
                               "attention_kernel", nbytes)
        dataclasses.replace(launch, function=fn, shared_bytes=nbytes, block=(32 * cfg.warps,),
                            grid=(math.ceil(a.S_q / cfg.block_rows(a.D)), a.B * a.H))()
        return a.returned()
    return attention


_KEPT = (("warps", "the warps of a block"), ("kv_pad", "the padding of the K/V rows"),
         ("kv_smem", "K and V staged in shared memory"), ("copy16", "the 16-byte copies"),
         ("cp_async", "the copies without cp.async (a T4 has none)"),
         ("rescale_in_registers", "the rescale of O"), ("rescale_threshold", "the threshold"))


@exercise("5.1", "Fit a T4's 64 KB without giving up rows", wrong_answers={
    "no padding": (dataclasses.replace(ch05.STEPS[_T4_STEP], kv_pad=0), 69632),
    "fewer keys at D = 64 only": (dataclasses.replace(ch05.STEPS[_T4_STEP], keys=32), 78080),
    "the scratch sized by the keys alone": (
        dataclasses.replace(ch05.STEPS[_T4_STEP], keys=32, keys_at_d128=32), 32000),
})
def check_t4_tiling(cfg, predicted_bytes_at_d128):
    """``cfg``: a WmmaConfig of wmma_copy16 whose shared memory fits a T4 at D = 64 and
    128, with every block's warps, every warp's rows and the padding kept;
    ``predicted_bytes_at_d128``: its dynamic shared memory at D = 128, counted by hand."""
    step = ch05.STEPS[_T4_STEP]
    if not isinstance(cfg, ch05.WmmaConfig):
        return verdict("5.1", [f"give a WmmaConfig (dataclasses.replace of STEPS[{_T4_STEP!r}]), "
                               f"got {type(cfg).__name__}"])
    for D in (64, 128):
        if cfg.block_rows(D) != step.block_rows(D):
            return verdict("5.1", [f"at D = {D} a block of yours has {cfg.block_rows(D)} query "
                                   f"rows, {_T4_STEP}'s {step.block_rows(D)}: keep every block's "
                                   "warps and every warp's rows"])
    for name, what in _KEPT:
        if getattr(cfg, name) != getattr(step, name):
            return verdict("5.1", [f"{name} = {getattr(cfg, name)!r}, {_T4_STEP} has "
                                   f"{getattr(step, name)!r}: keep {what}"])
    for D in (64, 128):
        if ch05.shared_bytes(cfg, D) > T4.shared_optin:
            return verdict("5.1", [f"at D = {D}: {_parts_text(cfg, D)}, over the "
                                   f"{T4.shared_optin} a block may have on a {T4.name}"])
    want = ch05.shared_bytes(cfg, 128)
    if predicted_bytes_at_d128 != want:
        _, refused = builds.try_build(ch05.SOURCE, _options(cfg, 128, predicted_bytes_at_d128),
                                      T4.arch)
        return verdict("5.1", [
            f"you count {predicted_bytes_at_d128!r} bytes at D = 128; the layout of "
            f"CONFIG_SOURCE gives {_parts_text(cfg, 128)}",
            "the kernel's source counts them too, and NVRTC refuses your number: "
            + (refused or "(it compiled: report this)")])
    checked = [f"at D = {D}: {_parts_text(cfg, D)}, within the {T4.shared_optin} of a {T4.name}, "
               f"with {cfg.block_rows(D)} rows a block as before" for D in (64, 128)]
    for D in (64, 128):
        report = builds.build(ch05.SOURCE, _options(cfg, D, want if D == 128 else None), T4.arch)
        checked.append(f"NVRTC for {T4.arch} (a T4) at D = {D}"
                       + (", with your count as the source's expected size" if D == 128 else "")
                       + f": {report['registers']} registers, {builds.local_memory(report)}")
    if kernels.MODE != "gpu":
        return verdict("5.1", [], checked + [builds.NO_GPU])
    problems, ran = builds.gpu_checks(_config_attention(cfg))
    return verdict("5.1", problems, checked + ran)


# ---- 5.2: rescale O, whatever the layout ----------------------------------------------

def _layouts() -> dict:
    """{name: (32, 8) array}: which element of a 16 x 16 row-major matrix each lane holds
    in each of its 8 fragment slots, for a few layouts a GPU might use."""
    rows, cols = np.divmod(np.arange(256), 16)
    mma = np.empty((32, 8), np.int64)  # mma.sync's m16n8 accumulator, for each 8 columns
    for r, c in zip(rows, cols):
        g, t, half = r % 8, (c % 8) // 2, c // 8
        mma[4 * g + t, 4 * half + 2 * (r // 8) + c % 2] = 16 * r + c
    shuffled = np.random.default_rng(5).permutation(256).reshape(32, 8)
    return {"8 consecutive elements of a row a lane": np.arange(256).reshape(32, 8),
            "the m16n8 accumulator layout of mma.sync, twice": mma,
            "column by column": (16 * cols + rows).reshape(32, 8),
            "shuffled at random": shuffled}


def _loader(layout: np.ndarray):
    def load_matrix(matrix) -> np.ndarray:
        """A 16 x 16 matrix loaded as an accumulator fragment: (32 lanes, 8 elements)."""
        m = np.asarray(matrix, np.float32)
        if m.shape != (16, 16):
            raise ValueError(f"load_matrix takes a 16 x 16 matrix, got shape {m.shape}")
        return m.reshape(-1)[layout]
    return load_matrix


@exercise("5.2", "Rescale O whatever the layout", wrong_answers={
    "the factors along the columns": lambda o, alpha, load: o * load(np.tile(alpha, (16, 1))),
    "the factors on the diagonal only": lambda o, alpha, load: o * load(np.diag(alpha)),
    "assumes row-major fragments": lambda o, alpha, load: o * np.repeat(alpha, 16).reshape(32, 8),
})
def check_rescale(rescale):
    """``rescale(o_fragment, alpha, load_matrix)``: O's accumulator fragment (32 lanes x 8
    elements, in a layout it is not told) with row r multiplied by alpha[r]; it may load
    any 16 x 16 matrix as a fragment of the same layout with ``load_matrix``."""
    rng = np.random.default_rng(2)
    o = rng.standard_normal((16, 16)).astype(np.float32)
    alpha = rng.uniform(0.05, 1.0, 16).astype(np.float32)
    want = alpha[:, None] * o
    for name, layout in _layouts().items():
        fragment = o.reshape(-1)[layout]
        got = rescale(fragment.copy(), alpha.copy(), _loader(layout))
        got = np.asarray(got) if got is not None else None
        if got is None or got.shape != (32, 8):
            return verdict("5.2", [f"rescale returned {'None' if got is None else got.shape}: "
                                   "return the rescaled fragment, 32 lanes x 8 elements"])
        out = np.empty(256, np.float32)
        out[layout.reshape(-1)] = got.reshape(-1)  # stored back, as store_matrix_sync would
        out = out.reshape(16, 16)
        wrong = np.argwhere(~np.isclose(out, want, rtol=1e-6, atol=0))
        if len(wrong):
            r, c = wrong[0]
            factors = out / o  # what each element was multiplied by
            factor = factors[r, c]
            which = (" (alpha[column]: your factors run along the columns)"
                     if np.allclose(factors, alpha[None, :], rtol=1e-5) else
                     " (every element was multiplied by the same factor)"
                     if np.allclose(factors, factor, rtol=1e-5) else
                     " (your factor matrix has 0 there)" if factor == 0 else "")
            return verdict("5.2", [
                f"in the layout '{name}', element ({r}, {c}) of O came out multiplied by "
                f"{factor:.4g}{which}; row {r}'s factor is alpha[{r}] = {alpha[r]:.4g}",
                "every element of a row must meet its row's factor, in a layout you are "
                "not told: load_matrix lays out any 16 x 16 matrix as it lays out O"])
    return verdict("5.2", [], [
        f"O's rows scaled by their factors in {len(_layouts())} layouts: "
        + "; ".join(_layouts()),
        "the layout never needed knowing: the factors, written as a matrix and loaded as "
        "an accumulator, are laid out as O's elements are"])


# ---- 5.3: the largest threshold fp16 holds ---------------------------------------------

_KEYS = 64  # keys a tile, as the chapter's kernel has at D = 64


def softmax_model(scores: np.ndarray, values: np.ndarray, threshold: int) -> np.ndarray:
    """The kernel's online softmax (SOFTMAX_SOURCE, RESCALE_THRESHOLD = ``threshold``) in
    NumPy, row by row over tiles of 64 keys: ``scores`` in log2 units (the kernel's
    ``s * scale_log2``), fp32 maxima, sums and O, P rounded to fp16 for P V."""
    rows, keys = scores.shape
    m = np.full(rows, -np.inf, np.float32)
    l = np.zeros(rows, np.float32)
    o = np.zeros((rows, values.shape[1]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for k0 in range(0, keys, _KEYS):
            x = scores[:, k0:k0 + _KEYS].astype(np.float32)
            tile_max = x.max(axis=1)
            m_new = np.where(tile_max > m + threshold, tile_max, m)
            base = np.where(m_new == -np.inf, 0, m_new).astype(np.float32)
            alpha = np.exp2(m - base)
            p = np.exp2(x - base[:, None])
            l = l * alpha + p.sum(axis=1)
            p16 = p.astype(np.float16)  # what to_elem2 makes of P, the A operand of P V
            pv = p16.astype(np.float32) @ values[k0:k0 + _KEYS].astype(np.float32)
            o = o * alpha[:, None] + pv
            m = m_new
        return o / l[:, None]


def _threshold_cases(threshold: int) -> dict:
    """{what: scores in log2 units}: random scores, and tiles built so that each one's
    maximum lies exactly ``threshold`` above the first tile's, where m stays."""
    rng = np.random.default_rng(3)
    random_scores = rng.standard_normal((8, 6 * _KEYS)) * 3
    edge = rng.uniform(-6, 0, (8, 6 * _KEYS))
    edge[:, 0] = 0.0  # the first tile's maximum: m
    edge[:, _KEYS:] += threshold
    edge[:, _KEYS::_KEYS] = threshold  # every later tile's maximum, exactly m + threshold
    return {"random scores": random_scores,
            f"every tile's maximum exactly {threshold} above the first's": edge}


def _power(n: int) -> str:
    return f"2^{n} = {2 ** n}" if n <= 24 else f"2^{n} = {2.0 ** n:.3g}"


def _threshold_problem(threshold: int) -> str | None:
    values = np.random.default_rng(4).standard_normal((6 * _KEYS, 64)).astype(np.float16)
    for what, scores in _threshold_cases(threshold).items():
        out = softmax_model(scores, values, threshold)
        if not np.isfinite(out).all():
            with np.errstate(over="ignore"):
                biggest = np.float16(2.0 ** threshold)
            return (f"{what}: m stays (no tile passes it by more than {threshold}), and P "
                    f"reaches {_power(threshold)}, which fp16 rounds to "
                    f"{biggest} (its largest finite value is {np.finfo(np.float16).max:.0f}): "
                    "O becomes inf and NaN")
        p = np.exp2(scores - scores.max(axis=1, keepdims=True))
        ref = p @ values.astype(np.float64) / p.sum(axis=1, keepdims=True)
        rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        if rel > 2e-3:
            return f"{what}: relative error {rel:.1e} against float64, over fp16's 2e-3"
    return None


@exercise("5.3", "The largest rescale threshold fp16 holds", wrong_answers={
    "one past fp16's range": 16, "the chapter's 8, which is safe but not the largest": 8,
    "bf16's (fp32's) exponent range": 127})
def check_threshold(threshold):
    """``threshold``: the largest RESCALE_THRESHOLD (an int, log2 units) for which the
    fp16 P of chapter 5's kernel can never overflow."""
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
        return verdict("5.3", [f"give the threshold as an int of at least 1 (log2 units; 0 "
                               f"means 'keep each maximum exact'), got {threshold!r}"])
    if threshold > 127:
        return verdict("5.3", [f"RESCALE_THRESHOLD = {threshold}: 2^{threshold} is past even "
                               "fp32's range (2^127 is its largest power of two): the kernel's "
                               "own exp2 would overflow before fp16 is reached"])
    wrong = _threshold_problem(threshold)
    if wrong:
        return verdict("5.3", [f"RESCALE_THRESHOLD = {threshold}: {wrong}"])
    if _threshold_problem(threshold + 1) is None:
        return verdict("5.3", [
            f"RESCALE_THRESHOLD = {threshold} is safe, but {threshold + 1} is too: P then "
            f"reaches {_power(threshold + 1)}, which fp16 still holds "
            f"(up to {np.finfo(np.float16).max:.0f}), and O is rescaled on fewer tiles"])
    return verdict("5.3", [], [
        f"RESCALE_THRESHOLD = {threshold}: P reaches at most {_power(threshold)}, "
        f"which fp16 holds; at {threshold + 1}, {_threshold_problem(threshold + 1)}",
        "a NumPy model of the kernel's softmax (fp32 maxima and sums, P rounded to fp16, O "
        "in fp32) against float64, on random scores and on tiles built to reach the bound"])


# ---- 5.4: predict the measurement ------------------------------------------------------

#: a suite shape at which chapters 4 and 5 were both timed
WALL_SHAPE = Shape(4, 32, 4096, 4096, 64)

check_wall_prediction = prediction(
    "5.4", "Predict: how far through the wall",
    measure=speedup("shared_memory_attention", "tensor_core_attention", WALL_SHAPE, 5),
    band=Band(0.3),
    wrong_answers={"the fp32 kernel's speed: the tensor cores idle": 1.0,
                   "the full ratio of the two peaks, and more": 20.0})
