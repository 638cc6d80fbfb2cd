"""The lean call: the book's fastest kernel for the GPU at hand, for use in a model.

``attention(q, k, v, causal=False, scale=None)`` takes torch tensors (or CuPy arrays)
of shape (B, H, S, D) and returns the output, like the chapters' kernels, but spends
a few microseconds of Python per call instead of tens:

- the full checks (:func:`kernels.api.prepare`, the chapter's refusal, the grid's
  limits) run once per *plan*: the shapes, dtypes, device, causal flag and scale of
  a call. A plan keeps the compiled kernel, its launch configuration and its
  parameters, packed once. A later call with the same plan only checks what a plan
  cannot promise: that the arrays are contiguous and aligned, and share q's device.
- the kernel is launched by the driver's ``cuLaunchKernel`` with the plan's packed
  parameters, of which only the addresses change from call to call.
- the output is the only allocation; the logsumexp goes to a buffer of the plan.
- the kernel goes onto the caller's stream: torch's current stream for torch
  tensors, CuPy's for CuPy arrays, so work queued before it on that stream is
  finished first and work after it sees its output.

Which kernel: up to ``MAX_ROWS`` query rows (decoding), chapter 8's
``split_keys_attention``, whose key/value arrays may be views of a longer cache.
More rows: :func:`kernels.gpus.fastest`, the kernel the chapters' refusals point to
(chapter 7's on sm_90, chapter 6's from sm_80, chapter 5's ``wmma_copy16`` on sm_75),
except that on sm_90 a grid that would leave multiprocessors idle gets chapter 7's
kernel with two consumer warpgroups (its sweep entry ``hopper_two_consumers``), whose
blocks hold 128 rows instead of 192 (:func:`rows_kernel`).
:func:`register_torch_op` makes the call a ``torch.library.custom_op``, so that
``torch.compile`` and CUDA graphs can call it.
"""

import ctypes
import functools
import math
import threading
from dataclasses import dataclass, field
from typing import Optional

from . import gpus
from .api import POINTER_ALIGNMENT, _describe, device_pointer, prepare
from .in_a_real_model import MAX_ROWS, split_plan  # up to MAX_ROWS query rows: split keys

_U64, _I32, _I64, _F32 = ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_float
_TENSOR_MAP = ctypes.c_uint64 * 16  # a CUtensorMap's 128 bytes
_PLANS_KEPT = 512
_MAPS_KEPT = 64


class Driver:
    """``cuLaunchKernel`` from the CUDA driver, called through ctypes: one C call with
    the parameters already packed, which CuPy's launch (a conversion of every
    argument on every call) is not."""

    def __init__(self):
        import ctypes.util

        lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        self.launch = lib.cuLaunchKernel
        self.launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.launch.restype = ctypes.c_int
        self._error_name = lib.cuGetErrorName
        self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def error(self, code: int) -> str:
        name = ctypes.c_char_p()
        self._error_name(code, ctypes.byref(name))
        return name.value.decode() if name.value else f"error {code}"


_DRIVER: list = []


def _driver() -> Driver:
    if not _DRIVER:
        _DRIVER.append(Driver())
    return _DRIVER[0]


class Launch:
    """One kernel launch, its parameters packed once as the driver takes them: an array
    of pointers to the values. A call changes the values it must (``params[i].value``,
    or ``point(i, buffer)`` for a tensor map) and launches."""

    def __init__(self, fn, grid, block, shared: int, params: list):
        self.function = ctypes.c_void_p(fn.kernel.ptr)  # CuPy's RawKernel: its CUfunction
        self.grid, self.block, self.shared = tuple(grid) + (1,) * (3 - len(grid)), \
            tuple(block) + (1,) * (3 - len(block)), shared
        self.params = params
        self.pointers = (ctypes.c_void_p * len(params))(*map(ctypes.addressof, params))

    def point(self, i: int, buffer) -> None:
        self.pointers[i] = ctypes.addressof(buffer)

    def __call__(self, stream: int) -> None:
        driver = _driver()
        code = driver.launch(self.function, *self.grid, *self.block, self.shared,
                             stream, self.pointers, None)
        if code:
            raise RuntimeError(f"attention: cuLaunchKernel failed: {driver.error(code)}")


@dataclass
class Plan:
    """What a call of one shape needs, made once."""

    kernel: str  # "chapter N's name"
    library: str  # "torch" or "cupy"
    launch: Launch
    lse: object  # scratch logsumexp buffer(s), kept alive with the plan
    maps: tuple | None = None  # chapter 7: (heads, rows, D, box rows, dtype) of q, k, v
    split: dict | None = None  # chapter 8: what each call works out from S_k
    combine: Launch | None = None
    scratch: list = field(default_factory=list)


_PLANS: dict = {}
_MAPS: dict = {}  # (address, heads, rows, D, box rows, dtype) -> packed tensor map
_LOCK = threading.Lock()  # a plan's parameters are set, then launched, by one thread at once


def _library(x) -> str:
    module = type(x).__module__.split(".")[0]
    if module not in ("torch", "cupy"):
        raise TypeError(f"attention: q must be a torch.Tensor or a cupy.ndarray on the GPU, "
                        f"got {type(x).__name__}")
    return module


#: chapter 7's kernels the lean call chooses between, by how their blocks fill the GPU
ROW_BLOCK_CHOICES = ("hopper_attention", "hopper_two_consumers")


def rows_kernel(gpu: gpus.Gpu, heads: int, S_q: int, D: int) -> tuple[int, str]:
    """(chapter, kernel) for more than MAX_ROWS query rows: the fastest kernel for the
    GPU; on sm_90, chapter 7's kernel with three consumers or with two, whichever
    finishes first by a simple model: waves of blocks (one block an SM) times rows a
    block, over the kernel's recorded throughput on a large shape. Where the 192-row
    blocks of the chapter's kernel leave multiprocessors idle, or spill into a short
    last wave, the 128-row blocks win."""
    chapter, name = gpus.fastest(gpu.compute_capability)
    if chapter != 7 or not gpu.multiprocessors:
        return chapter, name
    from .hopper_attention import CONFIGS

    def cost(kernel):
        rows = 64 * CONFIGS[kernel].at(D).consumers
        waves = math.ceil(heads * math.ceil(S_q / rows) / gpu.multiprocessors)
        return waves * rows / recorded_tflops(kernel, D)

    return 7, min(ROW_BLOCK_CHOICES, key=cost)


@functools.cache
def recorded_tflops(kernel: str, D: int) -> float:
    """The kernel's recorded fp16 TFLOPS on the suite's large shape of head dim D (1.0
    where nothing is recorded: the choice then goes by waves and rows alone)."""
    from . import results
    from .bench import Shape

    data = results.load()
    shape = Shape(16, 16, 2048, 2048, 64) if D == 64 else Shape(4, 16, 4096, 4096, 128)
    record = results.find(data["records"], kernel, shape) if data else None
    return record["tflops"] if record and record.get("status") == "ok" else 1.0


def _plan(q, k, v, causal: bool, scale, lib: str) -> Plan:
    """The full checks of the chapters' API, then the launch of the chosen kernel."""
    import kernels

    if kernels.MODE != "gpu":
        raise RuntimeError("kernels.launch.attention runs on a GPU only")
    gpu = gpus.current()
    if q.shape[2] <= MAX_ROWS:
        return _split_plan(q, k, v, causal, scale, gpu, lib)
    chapter, name = rows_kernel(gpu, q.shape[0] * q.shape[1], q.shape[2], q.shape[3])
    if chapter < 5:
        raise RuntimeError(f"the lean call launches the CUDA C++ kernels of chapters 5-8; "
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
        grid = module.grid(cfg, a.D, a.S_q, heads, a.causal, gpu.multiprocessors)
        block = (cfg.threads(),)
        maps = ((heads, a.S_q, a.D, rows, a.dtype), (heads, a.S_k, a.D, cfg.block_n, a.dtype),
                (heads, a.S_k, a.D, cfg.block_n, a.dtype))
        pointers = [_TENSOR_MAP() for _ in range(3)]
    elif chapter == 6:
        cfg = module.CONFIGS[name]
        fn, shared = module._compiled(name, a.D, a.dtype, a.scale < 0)
        grid, block = (math.ceil(a.S_q / cfg.block_rows(a.D)), heads), (32 * cfg.at(a.D).warps,)
        pointers = [_U64() for _ in range(3)]
    else:
        cfg = module.fitted(module.STEPS[name], a.D, gpu.shared_optin)
        fn, shared = module._compiled(cfg, a.D, a.dtype)
        grid, block = (math.ceil(a.S_q / cfg.block_rows(a.D)), heads), (32 * cfg.warps,)
        pointers = [_U64() for _ in range(3)]
    # chapters 6 and 7 take |scale| (a negative one is compiled in); chapter 5 the signed
    scale_log2 = (a.scale if chapter == 5 else abs(a.scale)) * module.LOG2E
    lse = _empty(q, (a.B, a.H, a.S_q), "float32")
    params = pointers + [_U64(), _U64(device_pointer(lse)), _I32(a.S_q), _I32(a.S_k),
                         _F32(scale_log2), _I32(a.causal)] + ([_I32(heads)] if chapter == 7 else [])
    return Plan(f"chapter {chapter}'s {name}", lib, Launch(fn, grid, block, shared, params),
                lse, maps)


def _split_plan(q, k, v, causal, scale, gpu, lib) -> Plan:
    """Chapter 8's split-keys kernel, for up to MAX_ROWS query rows: checked on q's
    shape only, since a decoding loop calls it with one more key each time."""
    from .in_a_real_model import (DTYPES, HEAD_DIMS, LOG2E, WARPS, _compiled, refusal,
                                  rows_compiled)

    name = "split_keys_attention"
    # q's checks; k's and v's shapes and strides are checked on every call
    a = prepare(q, q, q, causal=causal, scale=scale, kernel=name, head_dims=HEAD_DIMS,
                dtypes=DTYPES, pointers=True)
    if not (k.dtype == v.dtype == q.dtype):
        raise TypeError(f"attention: q, k and v must have one dtype, got {q.dtype}, "
                        f"{k.dtype} and {v.dtype}")
    why = refusal(a.D, a.S_q, gpu.compute_capability, gpu.name, a.dtype)
    if why:
        raise RuntimeError(why)
    heads = a.B * a.H
    if heads > 65535:
        raise ValueError(f"attention: B * H = {heads} blocks in y; at most 65535")
    split_fn, combine_fn = _compiled(a.D, rows_compiled(a.S_q), a.dtype)
    most, _ = split_plan(heads, 1 << 30, gpu.multiprocessors)  # the most splits a call gets
    lse = _empty(q, (a.B, a.H, a.S_q), "float32")
    o_split = _empty(q, (most, heads * a.S_q, a.D), "float32")
    lse_split = _empty(q, (most, heads * a.S_q), "float32")
    ptrs = [_U64(device_pointer(x)) for x in (lse, o_split, lse_split)]
    params = [_U64(), _U64(), _U64(), _U64(), ptrs[0], ptrs[1], ptrs[2], _I32(a.S_q),
              _I32(), _I64(), _I32(), _F32(a.scale * LOG2E), _I32(a.causal)]
    combine = Launch(combine_fn, (heads * a.S_q,), (a.D,), 0,
                     [ptrs[1], ptrs[2], _U64(), ptrs[0], _I32(), _I32(heads * a.S_q)])
    split = dict(heads=heads, multiprocessors=gpu.multiprocessors, plans={})
    return Plan(f"chapter 8's {name}", lib, Launch(split_fn, (1, heads), (32 * WARPS,), 0, params),
                lse, split=split, combine=combine, scratch=[o_split, lse_split])


def _empty(like, shape, dtype: str):
    if _library(like) == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    import cupy

    return cupy.empty(shape, dtype)


def _torch_functions():
    """What a call needs of torch, looked up once: its current stream as a raw handle
    (through the function torch.compile's generated code calls, a private one, so
    through the public way where it is missing) and ``empty_like``."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda index: torch.cuda.current_stream(index).cuda_stream)
    return raw, torch.empty_like


_TORCH: list = []  # [(raw stream of a device, empty_like)] once torch is first called


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
    if len(q.shape) != 4:
        raise ValueError(f"attention: q must be (B, H, S_q, D), got shape {tuple(q.shape)}")
    if lib == "torch":
        key = (q.shape, q.dtype, k.dtype, v.dtype, q.device, causal, scale)
    else:
        key = (q.shape, q.dtype.str, k.dtype.str, v.dtype.str, q.device.id, causal, scale)
    if q.shape[2] > MAX_ROWS:  # the split-keys plan takes any S_k; the others, one
        key += (k.shape, v.shape)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLANS_KEPT:
            _PLANS.pop(next(iter(_PLANS)))
        plan = _PLANS[key] = _plan(q, k, v, causal, scale, lib)
    return plan


def _map(address: int, spec: tuple):
    """Chapter 7's tensor map of the array at ``address``, packed (made on first use)."""
    key = (address,) + spec
    packed = _MAPS.get(key)
    if packed is None:
        from .hopper_attention import tensor_map

        if len(_MAPS) >= _MAPS_KEPT:
            _MAPS.pop(next(iter(_MAPS)))
        packed = _MAPS[key] = _TENSOR_MAP(*map(int, tensor_map(address, *spec)["opaque"]))
    return packed


def _split_keys(q, k, v, lib: str) -> tuple[int, int]:
    """(S_k, elements between heads of k and v) of a split-keys call, checked: k and v
    of one shape, (B, H, S_k, D) with rows contiguous and heads evenly spaced (a
    cache's first S_k rows, for one)."""
    B, H, _, D = q.shape
    if k.shape != v.shape or len(k.shape) != 4 or tuple(k.shape[:2]) != (B, H) or k.shape[3] != D:
        raise ValueError(f"attention: k and v must both be (B, H, S_k, D) = ({B}, {H}, S_k, "
                         f"{D}), got {tuple(k.shape)} and {tuple(v.shape)}")
    if lib == "torch":
        stride, other = k.stride(), v.stride()
    else:  # CuPy's strides are in bytes
        stride, other = (tuple(s // x.itemsize for s in x.strides) for x in (k, v))
    S_k = k.shape[2]
    head_stride = stride[1] if H > 1 else stride[0] if B > 1 else 0
    if (stride != other or stride[3] != 1 or (S_k > 1 and stride[2] != D)
            or (B > 1 and H > 1 and stride[0] != H * stride[1]) or head_stride % 8):
        raise ValueError("attention: k and v must have contiguous rows of D elements and "
                         "heads evenly spaced by a multiple of 8 elements, with the same "
                         f"strides; got {stride} and {other}")
    return S_k, head_stride


def attention(q, k, v, causal=False, scale=None, out=None):
    """softmax(q k^T * scale) v with the book's fastest kernel for this GPU, on the
    caller's stream. q: (B, H, S_q, D), k and v: (B, H, S_k, D), torch or CuPy, fp16
    or bf16 (bf16: torch only), contiguous (k and v, for up to MAX_ROWS query rows:
    rows contiguous and heads evenly spaced, as in a longer cache); ``out`` (like q) to
    write into, else a new array. Causal masks align bottom-right."""
    plan = plan_for(q, k, v, causal, scale)
    lib = plan.library
    if type(k) is not type(q) or type(v) is not type(q):
        raise TypeError("attention: q, k and v must come from one library")
    if lib == "torch":
        if not q.is_contiguous() or plan.split is None and not (
                k.is_contiguous() and v.is_contiguous()):
            raise ValueError("attention: q, k and v must be contiguous; call .contiguous()")
        if not (q.device == k.device == v.device):
            raise ValueError("attention: q, k and v must be on one device")
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        if not _TORCH:
            _TORCH.append(_torch_functions())
        raw_stream, empty_like = _TORCH[0]
        stream = raw_stream(q.device.index)
    else:
        import cupy

        if not q.flags.c_contiguous or plan.split is None and not (
                k.flags.c_contiguous and v.flags.c_contiguous):
            raise ValueError("attention: q, k and v must be C-contiguous")
        if not (q.device.id == k.device.id == v.device.id):
            raise ValueError("attention: q, k and v must be on one device")
        pointers = (q.data.ptr, k.data.ptr, v.data.ptr)
        stream = cupy.cuda.get_current_stream().ptr
        empty_like = cupy.empty_like
    if out is None:
        out = empty_like(q)  # q is contiguous: so is out
        o = out.data_ptr() if lib == "torch" else out.data.ptr
    else:
        o = _out_pointer(out, q)
    if (pointers[0] | pointers[1] | pointers[2] | o) % POINTER_ALIGNMENT:
        raise ValueError(f"attention: q, k, v and out must start on {POINTER_ALIGNMENT}-byte "
                         "boundaries (a view with an offset?); pass a fresh contiguous copy")
    launch = plan.launch
    with _LOCK:
        if plan.split is not None:
            S_k, head_stride = _split_keys(q, k, v, lib)
            s = plan.split
            splits, keys = s["plans"].get(S_k) or s["plans"].setdefault(
                S_k, split_plan(s["heads"], S_k, s["multiprocessors"]))
            p = launch.params
            p[0].value, p[1].value, p[2].value, p[3].value = *pointers, o
            p[8].value, p[9].value, p[10].value = S_k, head_stride, keys
            launch.grid = (splits, s["heads"], 1)
            launch(stream)
            if splits > 1:
                c = plan.combine.params
                c[2].value, c[4].value = o, splits
                plan.combine(stream)
        else:
            p = launch.params
            if plan.maps is None:
                p[0].value, p[1].value, p[2].value = pointers
            else:  # held here: making k's map may drop q's from the cache
                maps = [_map(pointers[i], plan.maps[i]) for i in range(3)]
                for i in range(3):
                    launch.point(i, maps[i])
            p[3].value = o
            launch(stream)
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
