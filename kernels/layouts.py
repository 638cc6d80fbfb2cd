"""The lean call on the layouts models hand it, measured: strided (B, S, H, D) views
against contiguous copies of them, and grouped-query decoding against SDPA's.

``strided_measurements()``: at a few suite shapes, q, k and v as views of one (B, S, 3,
H, D) projection, as a model's attention receives them, and the same values copied to
contiguous (B, H, S, D) arrays; the lean call's device time on each, after a check that
both give the same output.

``gqa_decoding_measurements()``: Llama-3-8B's decoding attention (32 query heads, 8
key/value heads of 128, one query row) against a (B, S_k, 8, 128) cache read through
views, at cache lengths of 8k to 128k keys and batches of 1 to 16: the lean call
(chapter 8's split-keys kernel, a group of query heads a block) and SDPA's default with
``enable_gqa=True``, each checked against the float64 reference first, with the share
of the copy ceiling their reads of K and V reach; and the lean call's kernel with its
splits combined by a second kernel instead of by its last block (chapter 8's
``fused_combine=False``); and the first two timed again after a flush that leaves L2
clean (kernels.bench.flush_l2_clean), since a short step also writes back what the
harness's flush left in L2.

``head_dim_measurements()`` and ``wide_decoding_measurements()``: the head dims beyond
64 and 128 that models use, 96 (Phi-3) and 256 (Gemma), through the lean call (chapter
6's kernel; chapter 8's for decoding), checked against the float64 reference first,
against SDPA's default and FlashAttention-2 backends on inputs of the same dtype.

``gpu_measurements()`` is what a GPU run records (``python -m kernels.record``, chapter
8). Hand-written; it sits above the lean call and the chapters' modules never import it.
"""

from __future__ import annotations

import time

from . import gpus, launch
from .bench import (Shape, benchmark_kernel, benchmark_sdpa, copy_bandwidth, flush_l2_clean,
                    tflops, time_alternating)
from .check import TOLERANCES, free_poisoned_block
from .reference import reference_attention

#: its calls go through the lean call, whose choice of form reads this GPU's records:
#: kernels.rerecord measures it after the timings it records again
USES_THE_LEAN_CALL = True

#: suite shapes the strided inputs are timed at, through the lean call
STRIDED_SHAPES = (Shape(1, 16, 16384, 16384, 128), Shape(2, 16, 8192, 8192, 128),
                  Shape(2, 16, 8192, 8192, 128, causal=True), Shape(8, 16, 1024, 1024, 128),
                  Shape(16, 16, 2048, 2048, 64), Shape(4, 16, 4096, 4096, 64, causal=True))
#: Llama-3-8B's decoding attention: query heads, key/value heads, head dim
GQA_HEADS = (32, 8, 128)
GQA_LENGTHS = (8192, 32768, 131072)
GQA_BATCHES = (1, 4, 16)
DTYPES = ("float16", "bfloat16")
#: Phi-3's and Gemma's head dims, which chapter 7's tiles do not take
WIDE_HEAD_DIMS = (96, 256)
#: the prefill shapes each wide head dim is timed at, and the decoding ones: (B, query
#: heads, key/value heads, S_k), one query row a head
WIDE_SHAPES = tuple(shape for D in WIDE_HEAD_DIMS for shape in (
    Shape(4, 16, 4096, 4096, D), Shape(4, 16, 4096, 4096, D, causal=True),
    Shape(16, 16, 1024, 1024, D), Shape(1, 16, 16384, 16384, D)))
WIDE_DECODING = ((1, 32, 32, 32768), (8, 32, 32, 8192), (4, 32, 8, 32768))
#: quick=True (a chapter's live cell) measures these instead
QUICK = dict(strided=STRIDED_SHAPES[1:2], lengths=(8192, 32768), batches=(1, 4),
             dtypes=("float16",), wide=WIDE_SHAPES[::4], wide_decoding=WIDE_DECODING[:1])


def gpu_measurements(progress=None, quick=False) -> dict:
    """The four measurements, in each of DTYPES (``quick``: QUICK's sizes)."""
    import torch

    progress = progress or (lambda line: None)
    dtypes = QUICK["dtypes"] if quick else DTYPES
    copy = copy_bandwidth()
    progress(f"copy ceiling: {copy['copy_tb_s']:.2f} TB/s")
    out = dict(gpu=gpus.current().name, quick=quick, copy_tb_s=copy["copy_tb_s"],
               strided=[row for dtype in dtypes for row in strided_measurements(
                   QUICK["strided"] if quick else STRIDED_SHAPES, dtype, progress)],
               gqa_decoding=[row for dtype in dtypes for row in gqa_decoding_measurements(
                   QUICK["lengths"] if quick else GQA_LENGTHS,
                   QUICK["batches"] if quick else GQA_BATCHES, dtype, copy["copy_tb_s"],
                   progress)],
               head_dims=[row for dtype in dtypes for row in head_dim_measurements(
                   QUICK["wide"] if quick else WIDE_SHAPES, dtype, progress)],
               wide_decoding=[row for dtype in dtypes for row in wide_decoding_measurements(
                   QUICK["wide_decoding"] if quick else WIDE_DECODING, dtype, progress)])
    torch.cuda.empty_cache()
    return out


def projection_views(shape: Shape, dtype):
    """q, k, v as a model's attention receives them: (B, H, S, D) views of one (B, S, 3,
    H, D) projection, each row 3 * H * D elements from the next."""
    import torch

    qkv = torch.randn(shape.B, shape.S_q, 3, shape.H, shape.D, device="cuda",
                      dtype=getattr(torch, dtype))
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def strided_measurements(shapes, dtype="float16", progress=None) -> list[dict]:
    """At each shape, the lean call's device time on views of a (B, S, 3, H, D)
    projection and on contiguous copies of them; both outputs must agree to the bit (one
    kernel, one order of arithmetic) before either is timed."""
    import torch

    progress = progress or (lambda line: None)
    rows = []
    for shape in shapes:
        t0 = time.perf_counter()
        views = projection_views(shape, dtype)
        copies = [x.contiguous() for x in views]
        row = dict(shape=shape.as_dict(), dtype=dtype, ms=None, same_output=None)
        outs = [launch.attention(*args, causal=shape.causal) for args in (views, copies)]
        row["same_output"] = bool(torch.equal(outs[0], outs[1])
                                  and torch.isfinite(outs[0]).all())
        if row["same_output"]:  # a few percent apart at most: timed taking turns
            row["ms"] = {name: t.median_ms for name, t in time_alternating({
                name: lambda a=args: launch.attention(*a, causal=shape.causal)
                for name, args in (("strided", views), ("contiguous", copies))}).items()}
            progress(f"{shape.label()} {dtype}: strided {row['ms']['strided']:.3f} ms, "
                     f"contiguous {row['ms']['contiguous']:.3f} ms "
                     f"({row['ms']['strided'] / row['ms']['contiguous']:.3f}x) "
                     f"[{time.perf_counter() - t0:.1f} s]")
        else:
            progress(f"{shape.label()} {dtype}: strided and contiguous outputs differ: not timed")
        rows.append(row)
        del views, copies, outs
    return rows


def reference_error(out, q, k, v) -> dict:
    """||out - ref|| / ||ref|| and max |out - ref| against the float64 reference
    (:func:`kernels.reference.reference_attention`, which spreads a key/value head over
    its group), one batch element at a time: a long cache's reference stays in memory."""
    err2 = ref2 = worst = 0.0
    for b in range(q.shape[0]):
        ref, _ = reference_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1])
        diff = out[b:b + 1].double() - ref
        err2 += diff.square().sum().item()
        ref2 += ref.square().sum().item()
        worst = max(worst, diff.abs().max().item())
        del ref, diff
    return dict(rel_err=(err2 / ref2) ** 0.5, max_abs_err=worst)


def decoding_case(B, heads, kv_heads, S_k, D, dtype):
    """(q, k, v, bytes of K and V): one query row for each of ``heads`` against a (B,
    S_k, kv_heads, D) cache of random values, q and the cache's K and V as (B, H, S, D)
    views (a cache's rows lie kv_heads * D elements apart)."""
    import torch

    cache = torch.randn(2, B, S_k, kv_heads, D, device="cuda", dtype=getattr(torch, dtype))
    k, v = (c.transpose(1, 2) for c in cache)
    q = torch.randn(B, 1, heads, D, device="cuda", dtype=cache.dtype).transpose(1, 2)
    return q, k, v, cache.numel() * cache.element_size()


def checked_then_timed(paths: dict, q, k, v, dtype, out=None,
                       flush=None) -> tuple[dict, dict]:
    """({path: µs}, {path: its errors}) of each of ``paths`` ({name: call}, returning
    its output, or None where it wrote ``out``) on one attention case: each checked
    against the float64 reference (:func:`reference_error`) first, and those that passed
    timed in turns (kernels.bench.time_alternating, ``flush`` as time_gpu takes it).
    Before each check the output is poisoned: ``out`` filled with NaN, and a block of
    q's size left NaN for a new output (kernels.check.free_poisoned_block); the outputs
    are held until every path is checked, so that none is handed another's answer. A
    path that cannot run here (RuntimeError: an SDPA backend or a kernel this GPU does
    not have) is in neither."""
    tol, errors, passed, held = TOLERANCES[dtype], {}, {}, []
    for name, path in paths.items():
        if out is not None:
            out.fill_(float("nan"))
        free_poisoned_block(q)
        try:
            got = path()
        except RuntimeError:
            continue
        held.append(got)
        errors[name] = e = reference_error(out if got is None else got, q, k, v)
        if e["rel_err"] <= tol.rel and e["max_abs_err"] <= tol.max_abs:  # else untimed
            passed[name] = path
    us = {name: t.median_ms * 1e3 for name, t in time_alternating(passed, flush=flush).items()}
    return us, errors


def checked_decoding_times(q, k, v, dtype, flash=False, separate=False,
                           clean_l2=False) -> tuple[dict, dict]:
    """({path: µs}, {path: relative error}) of the lean call and SDPA's default
    (``enable_gqa=True``), with ``flash`` its FlashAttention-2 backend, and with
    ``separate`` the lean call's kernel with its splits combined by a second kernel
    (through chapter 8's function, ``fused_combine=False``), on one decoding case, by
    :func:`checked_then_timed`. With ``clean_l2``, the lean call and SDPA's default timed
    again, in turns, after a flush that leaves L2 clean (kernels.bench.flush_l2_clean):
    "<path>, L2 clean"."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa_flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def separate_combine():
        return chapter_kernel(q, k, v, fused_combine=False)

    chapter_kernel = launch.CHAPTER_MODULES[8].KERNELS[  # the one the lean call chose
        launch.plan_for(q, k, v).kernel.removeprefix("chapter 8's ")]
    paths = {"lean call": lambda: launch.attention(q, k, v),
             "SDPA default": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
             **({"SDPA flash": sdpa_flash} if flash else {}),
             **({"separate combine": separate_combine} if separate else {})}
    us, errors = checked_then_timed(paths, q, k, v, dtype)
    if clean_l2:
        again = {f"{name}, L2 clean": paths[name] for name in ("lean call", "SDPA default")
                 if name in us}
        us.update({name: t.median_ms * 1e3 for name, t in
                   time_alternating(again, flush=flush_l2_clean).items()})
    return us, {name: e["rel_err"] for name, e in errors.items()}


def gqa_decoding_measurements(lengths, batches, dtype="float16", copy_tb_s=None,
                              progress=None) -> list[dict]:
    """One query row for each of GQA_HEADS' query heads against a (B, S_k, kv_heads, D)
    cache, read through views (:func:`decoding_case`): the lean call, SDPA's default and
    the lean call's kernel with a combining kernel, checked and timed by
    :func:`checked_decoding_times`, the first two also after a flush that leaves L2
    clean; ``of copy``: the K and V bytes
    a path reads over its time, as a share of ``copy_tb_s`` (a copy's read and written
    bytes over its time)."""
    import torch

    progress = progress or (lambda line: None)
    heads, kv_heads, D = GQA_HEADS
    rows = []
    for S_k in lengths:
        for B in batches:
            t0 = time.perf_counter()
            q, k, v, kv_bytes = decoding_case(B, heads, kv_heads, S_k, D, dtype)
            us, rel_err = checked_decoding_times(q, k, v, dtype, separate=True, clean_l2=True)
            of_copy = {name: kv_bytes / (t * 1e-6) / 1e12 / copy_tb_s
                       for name, t in us.items()} if copy_tb_s else {}
            rows.append(dict(B=B, H=heads, H_kv=kv_heads, S_k=S_k, D=D, dtype=dtype,
                             kv_bytes=kv_bytes, us=us, of_copy=of_copy, rel_err=rel_err))
            progress(f"B={B} S_k={S_k} {dtype} ({kv_bytes / 1e9:.2f} GB of K/V): " + ", ".join(
                f"{name} {t:.1f} us" + (f" ({of_copy[name]:.0%} of copy)" if name in of_copy
                                        else "")
                for name, t in us.items()) + f" [{time.perf_counter() - t0:.1f} s]")
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def head_dim_measurements(shapes, dtype="float16", progress=None) -> list[dict]:
    """At each shape, the lean call, checked at full size against the float64 reference
    and then timed (``benchmark_kernel``), and SDPA's default and FlashAttention-2
    backends on inputs of the same dtype: TFLOPS of each (None: failed its check, or a
    backend that does not take the shape)."""
    progress = progress or (lambda line: None)
    gpu = gpus.current()
    rows = []
    for shape in shapes:
        t0 = time.perf_counter()
        chapter, name = launch.rows_kernel(gpu, shape.B * shape.H, shape.S_q, shape.D, shape.S_k,
                                           shape.causal, dtype)
        record = benchmark_kernel(launch.attention, shape, name="lean call", dtype=dtype)
        sdpa = benchmark_sdpa(shape, dtype=dtype)
        row = dict(shape=shape.as_dict(), dtype=dtype, kernel=f"chapter {chapter}'s {name}",
                   rel_err=record["rel_err"], max_abs_err=record["max_abs_err"],
                   status=record["status"], tflops={
                       "lean call": record.get("tflops"),
                       **{f"SDPA {backend}": None if isinstance(t, str) else tflops(
                           shape, t.median_ms) for backend, t in sdpa.items()}})
        progress(f"{shape.label()} {dtype}: " + ", ".join(
            f"{path} {t:.0f}" if t else f"{path} -" for path, t in row["tflops"].items())
            + f" TFLOPS [{time.perf_counter() - t0:.1f} s]")
        rows.append(row)
    return rows


def wide_decoding_measurements(shapes, dtype="float16", progress=None) -> list[dict]:
    """One query row a head against a (B, S_k, kv_heads, D) cache read through views, at
    each (B, heads, kv_heads, S_k) of ``shapes`` and each wide head dim: the lean call
    (chapter 8's split-keys kernel), SDPA's default and its FlashAttention-2 backend,
    checked and timed by :func:`checked_decoding_times`."""
    progress = progress or (lambda line: None)
    rows = []
    for D in WIDE_HEAD_DIMS:
        for B, heads, kv_heads, S_k in shapes:
            q, k, v, _ = decoding_case(B, heads, kv_heads, S_k, D, dtype)
            us, rel_err = checked_decoding_times(q, k, v, dtype, flash=True)
            rows.append(dict(B=B, H=heads, H_kv=kv_heads, S_k=S_k, D=D, dtype=dtype, us=us,
                             rel_err=rel_err))
            progress(f"decoding D={D} B={B} heads {heads}/{kv_heads} S_k={S_k} {dtype}: "
                     + ", ".join(f"{name} {t:.1f} us" for name, t in us.items()))
            del q, k, v
    return rows


#: what the measurements depend on (kernels.results.measured_hash follows their code
#: from these): the kernels the lean call launches and its choices, the measuring code
#: and its shapes
MEASURES = (*launch.launched(), gpu_measurements, free_poisoned_block, STRIDED_SHAPES,
            GQA_HEADS, GQA_LENGTHS, GQA_BATCHES, DTYPES, QUICK, WIDE_SHAPES, WIDE_DECODING)
