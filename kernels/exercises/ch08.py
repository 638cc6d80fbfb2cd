"""Chapter 8's exercises: combining the splits' partial answers by their logsumexp, and
a loop over keys whose bounds every lane of a warp agrees on, and a prediction of the
share of the copy bandwidth a decoding step reaches."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels

from .. import gpus
from ..api import prepare
from ..check import LSE_TOLERANCE
from ..chapters import ch08_in_a_real_model as ch08
from ..reference import reference_attention
from . import builds, exercise, verdict
from .cexpr import ExpressionError, parse
from .. import results
from ..bench import Shape, min_bytes
from .predictions import Band, Measured, prediction, recorded_gpu

LOG2E = ch08.LOG2E

# ---- 8.1: combining the splits --------------------------------------------------------


def split_partials(q, k, v, causal: bool, bounds) -> tuple[np.ndarray, np.ndarray]:
    """What the split kernel writes for each split of the keys (``bounds``: its (first,
    end) keys), in float64 rounded to float32: (o_split (splits, rows, D), the softmax
    average of V over the split's keys; lse_split (splits, rows), their logsumexp in base 2,
    -inf where a row sees none of them). Rows are (batch, head, query row), flattened."""
    B, H, S_q, D = q.shape
    S_k = k.shape[2]
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * (LOG2E / math.sqrt(D))  # scores in log2 units
    if causal:  # bottom-right: row i sees key j when j <= i + S_k - S_q
        s = np.where(np.arange(S_k)[None, :] <= np.arange(S_q)[:, None] + S_k - S_q, s, -np.inf)
    o_split, lse_split = [], []
    for first, end in bounds:
        x = s[..., first:end].reshape(B * H * S_q, end - first)
        top = x.max(axis=1)
        seen = top > -np.inf
        p = np.exp2(x - np.where(seen, top, 0)[:, None])
        total = p.sum(axis=1)
        vs = np.repeat(v[:, :, first:end].reshape(B * H, end - first, D), S_q, axis=0)
        o = np.einsum("rk,rkd->rd", p, vs) / np.where(seen, total, 1)[:, None]
        o_split.append(np.where(seen[:, None], o, 0))
        lse_split.append(np.where(seen, top + np.log2(np.where(seen, total, 1)), -np.inf))
    return np.array(o_split, np.float32), np.array(lse_split, np.float32)


def combine_cases() -> list[tuple]:
    """(what, q, k, v, causal, split bounds): the chapter's split plan on a large GPU, and
    the edges: splits a row sees nothing of, rows that see no key at all, large scores."""
    rng = np.random.default_rng(8)

    def draw(B, H, S_q, S_k, D, std=1.0):
        q, k = (rng.standard_normal((B, H, n, D)).astype(np.float16).astype(np.float64) * std
                for n in (S_q, S_k))
        v = rng.standard_normal((B, H, S_k, D)).astype(np.float16).astype(np.float64)
        return q, k, v

    def even(S_k, keys):
        return [(a, min(S_k, a + keys)) for a in range(0, S_k, keys)]

    splits, keys = ch08.split_plan(4, 4096, 132)
    return [
        (f"1 row, 4 heads, 4096 keys in the chapter's plan on 132 multiprocessors ({splits} "
         f"splits of {keys})", *draw(1, 4, 1, 4096, 64), False, even(4096, keys)),
        ("2 rows, 300 keys in splits of 64, scores of thousands (q and k of std 20)",
         *draw(1, 2, 2, 300, 64, std=20.0), False, even(300, 64)),
        ("3 rows, causal, 20 keys in splits of 8 (row 0 sees nothing of the last split)",
         *draw(1, 2, 3, 20, 64), True, even(20, 8)),
        ("8 rows, causal, 5 keys in splits of 2 (rows 0-2 see no key at all)",
         *draw(1, 1, 8, 5, 64), True, even(5, 2)),
    ]


def _row(i: int, S_q: int) -> str:
    return f"query row {i % S_q} of head {i // S_q}"


@exercise("8.1", "Combine the splits by their logsumexp", wrong_answers={
    "the splits' answers averaged": lambda o, lse: (o.mean(axis=0), lse.max(axis=0) / LOG2E),
    "weights 2^lse, the largest not subtracted first": lambda o, lse: (
        (np.exp2(lse.astype(np.float64))[..., None] * o).sum(0)
        / np.exp2(lse.astype(np.float64)).sum(0)[:, None],
        np.log(np.exp2(lse.astype(np.float64)).sum(0))),
    "the base-2 logsumexps read as natural logs": lambda o, lse: (
        (np.exp(lse - lse.max(0))[..., None] * o).sum(0) / np.exp(lse - lse.max(0)).sum(0)[:, None],
        lse.max(0) + np.log(np.exp(lse - lse.max(0)).sum(0))),
})
def check_combine(combine):
    """``combine(o_split, lse_split)``: (o (rows, D), lse (rows,), natural log) from each
    split's answer o_split (splits, rows, D) and its logsumexp in base 2, lse_split
    (splits, rows), as the split kernel writes them (-inf: the row saw none of the split's
    keys)."""
    checked = []
    for what, q, k, v, causal, bounds in combine_cases():
        o_split, lse_split = split_partials(q, k, v, causal, bounds)
        with np.errstate(all="ignore"):
            got = combine(o_split.copy(), lse_split.copy())
        if not (isinstance(got, tuple) and len(got) == 2):
            return verdict("8.1", [f"combine returned {type(got).__name__}: return (o, lse)"])
        o, lse = (np.asarray(x, np.float64) for x in got)
        ref, ref_lse = (x.reshape(-1, *x.shape[3:]) for x in reference_attention(q, k, v, causal))
        if o.shape != ref.shape or lse.shape != ref_lse.shape:
            return verdict("8.1", [f"{what}: o has shape {o.shape} and lse {lse.shape}; they "
                                   f"should be {ref.shape} and {ref_lse.shape}"])
        S_q = q.shape[2]
        for i in range(len(ref)):
            if np.isneginf(ref_lse[i]):
                if not (np.isneginf(lse[i]) and np.all(o[i] == 0)):
                    return verdict("8.1", [
                        f"{what}: {_row(i, S_q)} sees no key; its lse must be -inf and its "
                        f"output 0, yours are {lse[i]:.6g} and {_describe(o[i])}"])
                continue
            lse_err = abs(lse[i] - ref_lse[i]) / max(1.0, abs(ref_lse[i]))
            if not lse_err <= LSE_TOLERANCE:
                hint = ("; that is the base-2 value: lse in natural log is lse2 * ln 2"
                        if np.isclose(lse[i], ref_lse[i] * LOG2E, rtol=1e-4) else "")
                return verdict("8.1", [f"{what}: {_row(i, S_q)}: your lse is {lse[i]:.6g}, the "
                                       f"float64 reference's {ref_lse[i]:.6g} (natural log){hint}"])
            err = np.abs(o[i] - ref[i]).max() if np.isfinite(o[i]).all() else np.inf
            if not err <= 1e-4:
                return verdict("8.1", [f"{what}: {_row(i, S_q)}: your output is off by up to "
                                       f"{err:.3g} ({_describe(o[i])}), against the float64 "
                                       "reference over all the keys"])
        checked.append(what)
    return verdict("8.1", [], [
        "output within 1e-4 and logsumexp within the book's tolerance of the float64 "
        "reference over all the keys, -inf and 0 for rows that see none, on:"] + checked)


def _describe(row: np.ndarray) -> str:
    if not np.isfinite(row).all():
        return f"{np.isnan(row).sum()} NaN and {np.isinf(row).sum()} inf of {row.size} elements"
    return f"largest |element| {np.abs(row).max():.3g}"


# ---- 8.2: a loop every lane of a warp agrees on ---------------------------------------

#: the for-loop over a split's keys in the chapter's split kernel: its condition
KEY_LOOP = r"(for \(int j0 = key_begin \+ lane_group; )(.*?)(;\s*j0 \+= UNROLL \* GROUPS\))"
#: (keys, keys a split): the splits the model runs, at every head dim
_SPLITS = ((8192, 512), (1000, 384), (70, 64), (33, 64), (1, 64))


def loop_problem(condition) -> str | None:
    """Run the split kernel's key loop with ``condition``, thread by thread, for every
    split of ``_SPLITS``: the first thing that goes wrong, in words, or None."""
    for D in ch08.HEAD_DIMS:
        lanes = ch08.lanes_a_key(D)
        groups = ch08.WARPS * 32 // lanes
        step = ch08.UNROLL * groups
        for S_k, per_split in _SPLITS:
            for split in range(math.ceil(S_k / per_split)):
                key_begin = split * per_split
                key_end = min(S_k, key_begin + per_split)
                where = f"D = {D}, keys {key_begin}-{key_end - 1} of a split"
                cap = math.ceil((key_end - key_begin) / step) + 2
                trips, read = [], set()
                for thread in range(ch08.WARPS * 32):
                    group, lane = thread // lanes, thread % lanes
                    warp_first = key_begin + (group // (32 // lanes)) * (32 // lanes)
                    j0, n = key_begin + group, 0
                    while condition(j0=j0, key_begin=key_begin, key_end=key_end, lane_group=group,
                                    lane=lane, warp_first=warp_first, GROUPS=groups,
                                    LANES=lanes, UNROLL=ch08.UNROLL, WARPS=ch08.WARPS, D=D,
                                    S_k=S_k, keys_per_split=per_split, split=split,
                                    **{"threadIdx.x": thread}):
                        n += 1
                        if n > cap:
                            return (f"{where}: thread {thread} is still in the loop after "
                                    f"{cap} iterations, more than the split's keys need: the "
                                    "loop does not stop at the split's end")
                        read.update(j for u in range(ch08.UNROLL)
                                    if (j := j0 + u * groups) < key_end)
                        j0 += step
                    trips.append(n)
                for warp in range(ch08.WARPS):
                    counts = trips[32 * warp:32 * (warp + 1)]
                    if len(set(counts)) > 1:
                        by_group = {}
                        for t, c in enumerate(counts):
                            by_group.setdefault((32 * warp + t) // lanes, c)
                        return (f"{where}: the lanes of warp {warp} run "
                                f"{min(counts)} to {max(counts)} iterations (lane groups "
                                + ", ".join(f"{g}: {c}" for g, c in by_group.items())
                                + "): in the last one, group_sum's __shfl_xor_sync names all "
                                "32 lanes, and some have left the loop (undefined: a hang, or "
                                "sums of stale values)")
                missed = sorted(set(range(key_begin, key_end)) - read)
                if missed:
                    return (f"{where}: {len(missed)} key(s) are never read, from key "
                            f"{missed[0]}: the loop stops before every lane group has taken "
                            "its last keys")
    return None


def _loop_source(condition: str) -> str:
    return builds.substitute(ch08.SOURCE, KEY_LOOP,
                             lambda m: f"{m.group(1)}{condition}{m.group(3)}",
                             "the key loop's condition")


def _loop_attention(source: str):
    """split_keys_attention with its split kernel compiled from ``source``."""
    def attention(q, k, v, causal=False, scale=None, out=None, lse=None, return_lse=False):
        a = prepare(q, k, v, causal=causal, scale=scale, out=out,
                    kernel="split_keys_attention (your loop)", head_dims=ch08.HEAD_DIMS,
                    dtypes=ch08.DTYPES, lse=lse, return_lse=return_lse, pointers=True,
                    strided=True, grouped=True)
        gpu = gpus.current()
        ch08.check_runs(a, gpu)
        block_rows = ch08.heads_a_block(a.group, a.S_q) * a.S_q
        fn = builds.gpu_kernel(source, ch08.nvrtc_options(a.D, ch08.rows_compiled(block_rows),
                                                          a.dtype), "split_keys_kernel")
        ch08.run_split(a, gpu, dataclasses.replace(ch08.split_keys_kernel(a, gpu), function=fn))
        return a.returned()
    return attention


#: decoding shapes: one row and a few, ragged splits, a split of one key, causal rows
DECODING_CHECKS = [(1, 4, 1, 1000, 128, False), (2, 2, 3, 777, 64, True),
                   (1, 2, 1, 70, 64, False), (1, 32, 1, 8192, 128, False)]


@exercise("8.2", "A loop every lane of a warp agrees on", wrong_answers={
    "each lane group's own next key": "j0 < key_end",
    "the last key of all, not of the split": "j0 < S_k",
    "whole steps only": "warp_first + (j0 - key_begin - lane_group) + UNROLL * GROUPS <= key_end",
})
def check_key_loop(condition: str):
    """``condition``: the C++ condition of the split kernel's loop over a split's keys,
    ``for (int j0 = key_begin + lane_group; condition; j0 += UNROLL * GROUPS)``."""
    try:
        expression = parse(condition)
        wrong = loop_problem(expression)
    except ExpressionError as e:
        return verdict("8.2", [str(e)])
    if wrong:
        return verdict("8.2", [wrong])
    dims = ", ".join(map(str, ch08.HEAD_DIMS))
    checked = [f"the loop, thread by thread at D = {dims}, over splits of 1 to 512 keys: "
               "every lane of a warp runs it as many times, and every key of the split is "
               "read once"]
    source = _loop_source(condition)
    report, error = builds.try_build(source, ch08.nvrtc_options(128, 1), "sm_90")
    if report is None:
        return verdict("8.2", [f"NVRTC cannot compile the kernel with your condition: {error}"])
    checked.append(f"the split kernel with your condition compiles for sm_90 (D = 128, one "
                   f"row): {report['registers']} registers, {builds.local_memory(report)}")
    if kernels.MODE != "gpu":
        return verdict("8.2", [], checked + [builds.NO_GPU])
    problems, ran = builds.gpu_checks(_loop_attention(source), DECODING_CHECKS)
    return verdict("8.2", problems, checked + ran)


# ---- 8.3: predict the measurement ------------------------------------------------------

#: one query row a head against a long cache: a decoding step of a 32-head model
DECODING_SHAPE = Shape(1, 32, 1, 32768, 128)


def share_of_copy(recorded: dict) -> Measured | None:
    """The split-keys kernel's fewest bytes over its time at DECODING_SHAPE, as a share
    of the copy bandwidth measured by the run that recorded chapter 8."""
    r = results.timed(recorded["records"], "split_keys_attention", DECODING_SHAPE)
    if r is None:
        return None
    s = DECODING_SHAPE
    nbytes = min_bytes(s.B, s.H, s.S_q, s.S_k, s.D)
    copy = results.chapter_run(recorded, 8)["ceilings"]["copy_tb_s"]
    rate = nbytes / (r["median_ms"] * 1e-3) / 1e12
    return Measured(rate / copy, recorded_gpu(recorded, 8),
                    f"split_keys_attention {r['median_ms'] * 1e3:.0f} µs for "
                    f"{nbytes / 1e6:.0f} MB "
                    f"at {s.label()}: {rate:.2f} TB/s of the {copy:.2f} TB/s copy ceiling")


check_decoding_prediction = prediction(
    "8.3", "Predict: how close a decoding step comes to the copy ceiling",
    measure=share_of_copy, band=Band(0.25), unit="share",
    wrong_answers={"a few percent: one query row cannot keep the GPU busy": 0.05,
                   "a percentage, not a fraction": 85.0})
