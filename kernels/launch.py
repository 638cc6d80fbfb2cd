"""The lean call: the book's fastest kernel for the GPU at hand, for use in a model.

``attention(q, k, v, causal=False, scale=None)`` takes torch tensors (or CuPy arrays)
of shape (B, H, S, D) and returns the output, like the chapters' kernels, but spends
a few microseconds of Python per call instead of tens:

- the full checks (:func:`kernels.api.prepare`, the chapter's refusal, the grid's
  limits) run once per *plan*: the shapes, dtypes, device, causal flag and scale of
  a call. A plan keeps the compiled kernel, its launch configuration and the
  constant arguments. A later call with the same plan only checks what a plan cannot
  promise: that the arrays are contiguous and aligned, and share q's device.
- the output is the only allocation; the logsumexp goes to a buffer of the plan.
- the kernel goes onto the caller's stream: torch's current stream for torch
  tensors, CuPy's for CuPy arrays, so work queued before it on that stream is
  finished first and work after it sees its output.

Which kernel: :func:`kernels.gpus.fastest`, the one the chapters' refusals point to
(chapter 7's on sm_90, chapter 6's from sm_80, chapter 5's ``wmma_copy16`` in the
tiling that fits on sm_75). :func:`register_torch_op` makes it a
``torch.library.custom_op``, so that ``torch.compile`` and CUDA graphs can call it.
"""

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import gpus
from .api import POINTER_ALIGNMENT, _describe, device_pointer, dtype_name, prepare


@dataclass
class Plan:
    """What a call of one shape needs, made once."""

    kernel: str  # "chapter N's name"
    fn: object  # cupy.cuda.function.Function
    grid: tuple
    block: tuple
    shared: int
    out_shape: tuple
    lse: object  # scratch logsumexp buffer, (B, H, S_q) float32, in the caller's library
    consts: tuple  # S_q, S_k, scale (log2 units), causal
    maps: tuple | None = None  # chapter 7: (heads, rows, D, box rows, dtype) of q, k, v

    def args(self, q: int, k: int, v: int, o: int, lse: int) -> tuple:
        if self.maps is None:
            return (np.uint64(q), np.uint64(k), np.uint64(v), np.uint64(o),
                    np.uint64(lse)) + self.consts
        from .hopper_attention import tensor_map

        return tuple(tensor_map(p, *m) for p, m in zip((q, k, v), self.maps)) + (
            np.uint64(o), np.uint64(lse)) + self.consts


_PLANS: dict = {}
_STREAMS: dict = {}  # raw stream handle -> cupy.cuda.ExternalStream


def _library(x) -> str:
    module = type(x).__module__.split(".")[0]
    if module not in ("torch", "cupy"):
        raise TypeError(f"attention: q must be a torch.Tensor or a cupy.ndarray on the GPU, "
                        f"got {type(x).__name__}")
    return module


def _plan(q, k, v, causal: bool, scale) -> Plan:
    """The full checks of the chapters' API, then the launch of the chosen kernel."""
    import kernels

    if kernels.MODE != "gpu":
        raise RuntimeError("kernels.launch.attention runs on a GPU only")
    gpu = gpus.current()
    chapter, name = gpus.fastest(gpu.compute_capability)
    if chapter < 5:
        raise RuntimeError(f"the lean call launches the CUDA C++ kernels of chapters 5-7; "
                           f"this {gpu.name} has none: use chapter {chapter}'s {name}")
    module = kernels.chapter_module(chapter)
    a = prepare(q, k, v, causal=causal, scale=scale, kernel=name,
                head_dims=module.HEAD_DIMS, dtypes=module.DTYPES, pointers=True)
    why = module.refusal(name, a.D, *gpu.limits(), dtype=a.dtype)
    if why:
        raise RuntimeError(why)
    heads = a.B * a.H
    if heads > 65535:
        raise ValueError(f"attention: B * H = {heads} blocks in y; at most 65535")
    maps = None
    if chapter == 7:
        cfg = module.CONFIGS[name].at(a.D)
        fn, shared = module._compiled(name, a.D, a.dtype, a.scale < 0)
        rows = 64 * cfg.consumers
        grid, block = (math.ceil(a.S_q / rows), heads), (cfg.threads(),)
        maps = ((heads, a.S_q, a.D, rows, a.dtype), (heads, a.S_k, a.D, cfg.block_n, a.dtype),
                (heads, a.S_k, a.D, cfg.block_n, a.dtype))
    elif chapter == 6:
        cfg = module.CONFIGS[name]
        fn, shared = module._compiled(name, a.D, a.dtype, a.scale < 0)
        grid, block = (math.ceil(a.S_q / cfg.block_rows(a.D)), heads), (32 * cfg.at(a.D).warps,)
    else:
        cfg = module.fitted(module.STEPS[name], a.D, gpu.shared_optin)
        fn, shared = module._compiled(cfg, a.D, a.dtype)
        grid, block = (math.ceil(a.S_q / cfg.block_rows(a.D)), heads), (32 * cfg.warps,)
    # chapters 6 and 7 take |scale| (a negative one is compiled in); chapter 5 the signed
    scale_log2 = (a.scale if chapter == 5 else abs(a.scale)) * module.LOG2E
    consts = (np.int32(a.S_q), np.int32(a.S_k), np.float32(scale_log2), np.int32(a.causal))
    lse = _empty(q, (a.B, a.H, a.S_q), "float32")
    return Plan(f"chapter {chapter}'s {name}", fn, grid, block, shared, (a.B, a.H, a.S_q, a.D),
                lse, consts, maps)


def _empty(like, shape, dtype: str):
    if _library(like) == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    import cupy

    return cupy.empty(shape, dtype)


def _stream(lib: str, device_index: int):
    """The caller's stream, as CuPy launches take it."""
    import cupy

    if lib == "torch":
        import torch

        current = torch.cuda.current_stream(device_index)
    else:
        return cupy.cuda.get_current_stream()
    stream = _STREAMS.get(current.cuda_stream)
    if stream is None:
        stream = _STREAMS[current.cuda_stream] = (
            cupy.cuda.Stream.from_external(current)  # the CUDA stream protocol, where both have it
            if hasattr(current, "__cuda_stream__") and hasattr(cupy.cuda.Stream, "from_external")
            else cupy.cuda.ExternalStream(current.cuda_stream, device_index))
    return stream


def _out_pointer(out, q) -> int:
    """The address of a caller's ``out`` (any GPU array library), checked against q."""
    want = _describe(q)[:2]
    if _describe(out) != (*want, True):
        raise ValueError(f"attention: out must be a contiguous {want[0]} {want[1]} array, "
                         f"got {_describe(out)[:2]}")
    return device_pointer(out)


def plan_for(q, k, v, causal=False, scale=None) -> Plan:
    """The plan of a call (made, with every check, on its first use)."""
    lib = _library(q)
    if lib == "torch":
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, causal, scale)
    else:
        key = (q.shape, k.shape, v.shape, q.dtype.str, k.dtype.str, v.dtype.str,
               q.device.id, causal, scale)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan(q, k, v, causal, scale)
    return plan


def attention(q, k, v, causal=False, scale=None, out=None):
    """softmax(q k^T * scale) v with the book's fastest kernel for this GPU, on the
    caller's stream. q: (B, H, S_q, D), k and v: (B, H, S_k, D), torch or CuPy, fp16
    or bf16 (bf16: torch only), contiguous; ``out`` (like q) to write into, else a
    new array. Causal masks align bottom-right."""
    plan = plan_for(q, k, v, causal, scale)
    lib = _library(k), _library(v)
    if lib != ("torch", "torch") and lib != ("cupy", "cupy") or type(k) is not type(q):
        raise TypeError("attention: q, k and v must come from one library")
    if lib[0] == "torch":
        if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
            raise ValueError("attention: q, k and v must be contiguous; call .contiguous()")
        if not (q.device == k.device == v.device):
            raise ValueError("attention: q, k and v must be on one device")
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        stream = _stream("torch", q.device.index)
    else:
        if not (q.flags.c_contiguous and k.flags.c_contiguous and v.flags.c_contiguous):
            raise ValueError("attention: q, k and v must be C-contiguous")
        if not (q.device.id == k.device.id == v.device.id):
            raise ValueError("attention: q, k and v must be on one device")
        pointers = (q.data.ptr, k.data.ptr, v.data.ptr)
        stream = _stream("cupy", q.device.id)
    if out is None:
        out = _empty(q, plan.out_shape, dtype_name(q.dtype))
        o = device_pointer(out)
    else:
        o = _out_pointer(out, q)
    if (pointers[0] | pointers[1] | pointers[2] | o) % POINTER_ALIGNMENT:
        raise ValueError(f"attention: q, k, v and out must start on {POINTER_ALIGNMENT}-byte "
                         "boundaries (a view with an offset?); pass a fresh contiguous copy")
    plan.fn(plan.grid, plan.block, plan.args(*pointers, o, device_pointer(plan.lse)),
            shared_mem=plan.shared, stream=stream)
    return out


def register_torch_op():
    """``torch.ops.fa_from_scratch.attention(q, k, v, causal, scale)``: the lean call as
    a custom op, with a fake (meta) implementation that gives the output's shape, so
    that torch.compile traces through it and CUDA graphs capture it."""
    import torch

    if hasattr(torch.ops, "fa_from_scratch") and hasattr(torch.ops.fa_from_scratch, "attention"):
        return torch.ops.fa_from_scratch.attention

    @torch.library.custom_op("fa_from_scratch::attention", mutates_args=())
    def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     scale: Optional[float] = None) -> torch.Tensor:
        return attention(q, k, v, causal=causal, scale=scale)

    @attention_op.register_fake
    def _(q, k, v, causal=False, scale=None):
        return q.new_empty(q.shape)

    return torch.ops.fa_from_scratch.attention
