"""FlashAttention-4's Hopper kernel as a peer of the lean call, measured.

FlashAttention-4 (the ``flash-attn-4`` package: CuTe's Python DSL, compiled on its first
call at a configuration) runs an sm90 forward on the H100 and H200 beside its Blackwell
one. ``gpu_measurements()`` sets it beside the lean call and SDPA's default at every
shape of the standard suite, in fp16 and bf16: each path on fresh inputs in its own
layout ((B, H, S, D) for the lean call and SDPA, (B, S, H, D) for FlashAttention-4,
the same values), checked at full size against the float64 reference
(:func:`kernels.check.check_attention`), then the three timed in turns
(:func:`kernels.bench.time_alternating`, the suite's rounds), as chapter 7's records
time its kernels and SDPA. FlashAttention-4's own output is timed as it returns it; its
check copies that output into the poisoned array the check reads.

It is a peer, not a dependency of the book: where it is not installed, the measurement
records that, and chapter 10 says so. ``python -m kernels.record --chapters 7
--measurements-only results/<gpu>.json --only flash_attention_4`` records it alone.
Hand-written; it sits above the lean call and the chapters' modules never import it.
"""

from __future__ import annotations

import importlib.metadata
import time

from . import launch
from .bench import STANDARD_SUITE, SUITE_ROUND_S, SUITE_ROUNDS, Shape, time_alternating, tflops
from .check import check_attention, fresh_inputs
from .reference import sdpa

#: its calls go through the lean call, whose choice of form reads this GPU's records:
#: kernels.rerecord measures it after the timings it records again
USES_THE_LEAN_CALL = True
DTYPES = ("float16", "bfloat16")
#: the names the measurement gives its three paths
PATHS = ("lean call", "FlashAttention-4", "SDPA default")
#: quick=True (a chapter's live cell) measures these instead
QUICK = dict(shapes=(Shape(16, 32, 1024, 1024, 64), Shape(4, 16, 4096, 4096, 128, causal=True)),
             dtypes=("float16",))


def flash_attn_func():
    """FlashAttention-4's ``flash_attn_func`` ((B, S, H, D) inputs), or None where the
    package is not installed."""
    try:
        from flash_attn.cute import flash_attn_func as f
    except ImportError:
        return None
    return f


def version() -> str | None:
    """The installed flash-attn-4's version, or None."""
    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return None


def copied_into(out, got):
    """``got`` (a torch tensor) copied into ``out``, the check's poisoned array (a torch
    tensor, or in fp16 a Numba one)."""
    import torch

    torch.as_tensor(out, device="cuda").copy_(got)
    return out


def as_peer(fa4):
    """FlashAttention-4 with the book's kernel signature, for the check: (B, H, S, D)
    arrays in, handed to it as (B, S, H, D) views, its output copied into ``out``."""
    def attention(q, k, v, causal=False, scale=None, out=None):
        got = fa4(*(x.transpose(1, 2) for x in (q, k, v)), softmax_scale=scale, causal=causal)
        return copied_into(out, (got[0] if isinstance(got, tuple) else got).transpose(1, 2))
    return attention


def sdpa_default(q, k, v, causal=False, scale=None, out=None):
    """SDPA's default backend (:func:`kernels.reference.sdpa`) with the book's kernel
    signature, for the check."""
    return copied_into(out, sdpa(q, k, v, causal, scale, "default"))


def measure_shape(shape: Shape, dtype: str, fa4) -> dict:
    """The three paths at one shape and dtype: each checked, then those that passed
    timed in turns; TFLOPS by path (None where it failed its check) and each check's
    errors."""
    import torch

    q, k, v, _ = fresh_inputs(shape.B, shape.H, shape.S_q, shape.S_k, shape.D, dtype)
    q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # its own layout
    out = torch.empty_like(q)
    calls = {"lean call": lambda: launch.attention(q, k, v, causal=shape.causal, out=out),
             "FlashAttention-4": lambda: fa4(q4, k4, v4, causal=shape.causal),
             "SDPA default": lambda: sdpa(q, k, v, shape.causal, None, "default")}
    checked = {"lean call": launch.attention, "FlashAttention-4": as_peer(fa4),
               "SDPA default": sdpa_default}
    errors, passed = {}, {}
    for name in PATHS:
        c = check_attention(checked[name], shape.B, shape.H, shape.S_q, shape.S_k, shape.D,
                            shape.causal, dtype=dtype, name=name, raise_on_fail=False)
        errors[name] = dict(rel_err=c.rel_err, max_abs_err=c.max_abs_err, ok=c.ok)
        if c.ok:  # never time a path that failed its check
            passed[name] = calls[name]
    times = time_alternating(passed, rounds=SUITE_ROUNDS, budget_s=SUITE_ROUND_S, min_reps=1)
    return dict(shape=shape.as_dict(), dtype=dtype, errors=errors,
                ms={name: t.median_ms for name, t in times.items()},
                tflops={name: tflops(shape, times[name].median_ms) if name in times else None
                        for name in PATHS})


def gpu_measurements(progress=None, quick=False) -> dict:
    """The three paths at every suite shape in each of DTYPES (``quick``: QUICK's), or
    why FlashAttention-4 was not measured."""
    progress = progress or (lambda line: None)
    fa4 = flash_attn_func()
    if fa4 is None:
        return dict(status="not installed", note="flash_attn.cute does not import here")
    shapes, dtypes = (QUICK["shapes"], QUICK["dtypes"]) if quick else (STANDARD_SUITE, DTYPES)
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            t0 = time.perf_counter()
            rows.append(measure_shape(shape, dtype, fa4))
            progress(f"{shape.label()} {dtype}: " + ", ".join(
                f"{name} {t:.0f}" if t else f"{name} -" for name, t in rows[-1]["tflops"].items())
                + f" TFLOPS [{time.perf_counter() - t0:.1f} s]")
    return dict(status="ok", version=version(), quick=quick, rows=rows)


#: what the measurement depends on (kernels.results.measured_hash follows their code
#: from these): the kernels the lean call launches and its choices, and this module's
#: measuring code and settings
MEASURES = (*launch.launched(), gpu_measurements, DTYPES, PATHS, QUICK)
