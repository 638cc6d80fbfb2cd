"""The lean call: the book's fastest kernel for the GPU at hand, for use in a model.

``attention(q, k, v, causal=False, scale=None)`` takes torch tensors (or CuPy arrays)
of shape (B, H, S, D) and returns the output, like the chapters' kernels, but spends
a few microseconds of Python per call instead of tens. q, k and v may be views with
any strides whose D elements a row are contiguous (views of (B, S, H, D) storage, or
of a longer key/value cache), and k and v may have fewer heads than q (grouped-query
attention); the output comes back in q's layout.

- the full checks (:func:`kernels.api.prepare`, the chapter's refusal, the grid's
  limits) run once per *plan*: the shapes, strides, dtypes, device, causal flag and
  scale of a call. A plan keeps the compiled kernel, its launch configuration and its
  parameters, packed once. A later call with the same plan only checks what a plan
  cannot promise: that the arrays are aligned and share q's device, and a caller's
  ``out``.
- the kernel is launched by the driver's ``cuLaunchKernel`` with the plan's packed
  parameters, of which only the addresses change from call to call; a TMA tensor map
  is encoded once a plan and pointed at each call's array by the driver's
  ``cuTensorMapReplaceAddress`` (a model's layers share a plan, each with arrays of
  its own: a cache of maps by address would hold one map per layer and array).
- the output is the only allocation; the logsumexp goes to a buffer of the plan.
- the kernel goes onto the caller's stream: torch's current stream for torch
  tensors, CuPy's for CuPy arrays, so work queued before it on that stream is
  finished first and work after it sees its output.

Which kernel: up to ``MAX_ROWS`` query rows (decoding), one of chapter 8's split-keys
kernels, whose key/value arrays may be views of a longer cache (its
``decoding_kernel`` chooses, on every call, as a cache grows): from sm_80, the one that
puts a group's query rows, or one row of a large cache, on the tensor cores
(``split_keys_mma_attention``), else ``split_keys_attention``.
More rows: :func:`kernels.gpus.fastest`, the kernel the chapters' refusals point to
(chapter 7's on sm_90, chapter 6's from sm_80, chapter 5's ``wmma_copy16`` on sm_75),
except that on sm_90 a grid that would leave multiprocessors idle, or key tiles that
would leave a short last one, get one of chapter 7's forms with two consumer
warpgroups (its sweep entries ``hopper_overlap`` and ``hopper_two_consumers``), whose
blocks hold 128 rows instead of 192 (:func:`rows_kernel`); at D = 256 all have two
consumers.
:func:`register_torch_op` makes the call a ``torch.library.custom_op``, so that
``torch.compile`` and CUDA graphs can call it.

Gradients: where q, k or v requires one and autograd is on, the call saves the output
and the logsumexp, in an array of its own (:func:`attention_with_lse`), for
:func:`attention_backward`:
chapter 9's kernels, packed once per shape as the forward's are, on the caller's stream
(from sm_80, D = 64 and 128). Eager code and CUDA graphs get the two through a
``torch.autograd.Function``; ``torch.compile`` through a second custom op,
``fa_from_scratch::attention_with_lse``, with a registered backward.
"""

import ctypes
import functools
import math
import threading
from dataclasses import dataclass, field
from typing import Optional

from . import gpus
from .api import (POINTER_ALIGNMENT, STRIDE_ALIGNMENT, KernelLaunch, Strides, array_info,
                  check_no_overlap, check_strides, device_pointer, dtype_name, element_strides,
                  prepare)
from .chapters import (ch05_tensor_cores, ch06_mma_attention, ch07_hopper_attention,
                       ch08_in_a_real_model, ch09_backward_pass)
from .chapters.ch08_in_a_real_model import (MAX_ROWS,  # up to MAX_ROWS rows
                                            SPLIT_KERNELS, decoding_kernel, split_planner)

#: the chapters whose CUDA C++ kernels the lean call launches, by number
CHAPTER_MODULES = {5: ch05_tensor_cores, 6: ch06_mma_attention, 7: ch07_hopper_attention,
                   8: ch08_in_a_real_model}
_CTYPES = {"u64": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
           "f32": ctypes.c_float, "strides": ctypes.c_int64 * 3,  # the CUDA struct Strides
           "tensor_map": ctypes.c_uint64 * 16}  # a CUtensorMap: 128 B
_PLANS_KEPT = 512


class Driver:
    """The driver calls a call makes. ``cuLaunchKernel`` through CuPy's thin wrapper of
    it (``cupy.cuda.driver.launchKernel``), given the parameters already packed: one C
    call, 4 us of host time where ctypes' conversion of its eleven arguments made it 6
    (H200 host); not CuPy's kernel launch, which converts every argument on every call.
    ``cuTensorMapReplaceAddress``, which CuPy does not wrap, through ctypes."""

    def __init__(self):
        import ctypes.util

        from cupy.cuda import driver

        lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        self.launch = driver.launchKernel  # (function, grid, block, shared, stream, params, extra)
        self._error_name = lib.cuGetErrorName
        self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._replace_address = lib.cuTensorMapReplaceAddress
        self._replace_address.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._replace_address.restype = ctypes.c_int

    def replace_address(self, tensor_map, address: int) -> None:
        """Point a packed tensor map at the same shape at another ``address`` (a host
        call of the driver's, where encoding a new map is tens of microseconds)."""
        code = self._replace_address(ctypes.addressof(tensor_map), address)
        if code:
            raise RuntimeError(f"attention: cuTensorMapReplaceAddress failed: "
                               f"{self.error(code)}")

    def error(self, code: int) -> str:
        name = ctypes.c_char_p()
        self._error_name(code, ctypes.byref(name))
        return name.value.decode() if name.value else f"error {code}"


_DRIVER: list = []


def _driver() -> Driver:
    if not _DRIVER:
        _DRIVER.append(Driver())
    return _DRIVER[0]


def _packed(ctype: str, value):
    """A parameter's value as the C type the kernel takes it in (a tensor map on the
    64-byte boundary the driver's CUtensorMap is declared with)."""
    if ctype == "tensor_map":
        room = (ctypes.c_uint64 * 24)()  # 192 bytes hold 128 starting on a 64-byte boundary
        packed = _CTYPES[ctype].from_buffer(room, -ctypes.addressof(room) % 64)
        packed[:] = [int(x) for x in value["opaque"]]
        return packed
    if ctype == "strides":
        return _CTYPES[ctype](value.batch, value.head, value.row)
    return _CTYPES[ctype](value)


class Launch:
    """A chapter's :class:`~kernels.api.KernelLaunch`, packed once as the driver takes
    its parameters: an array of pointers to the values. A call sets the values that
    follow its arrays' addresses (:meth:`place`) and any other it must (by name:
    ``named["S_k"].value``), and launches."""

    def __init__(self, description: KernelLaunch):
        self.description = description
        self.driver = _driver()
        self.function = description.function.kernel.ptr  # its CUfunction
        self.grid = tuple(description.grid) + (1,) * (3 - len(description.grid))
        self.block = tuple(description.block) + (1,) * (3 - len(description.block))
        self.shared = description.shared_bytes
        self.params = [_packed(p.ctype, p.value) for p in description.params]
        self.pointers = (ctypes.c_void_p * len(self.params))(*map(ctypes.addressof, self.params))
        self.pointers_address = ctypes.addressof(self.pointers)
        #: (index, argument, whether the value is a tensor map) of each value that
        #: follows an argument's address: the address itself, or a tensor map made once
        #: and pointed at each call's address
        self.follows = [(i, p.array, p.ctype == "tensor_map")
                        for i, p in enumerate(description.params) if p.array is not None]
        self.mapped = {}  # index -> the address a tensor map points at
        #: the arrays the kernel reaches through a tensor map: laid out as it was made
        self.mapped_arrays = {array for _, array, is_map in self.follows if is_map}
        #: the packed values by the kernel's names for them (not the tensor maps)
        self.named = {p.name: self.params[i] for i, p in enumerate(description.params)
                      if p.ctype != "tensor_map"}

    def place(self, addresses: dict) -> None:
        """Point the parameters that follow q, k, v and out at these ``addresses``."""
        for i, array, is_map in self.follows:
            address = addresses[array]
            if not is_map:
                self.params[i].value = address
            elif self.mapped.get(i) != address:
                self.driver.replace_address(self.params[i], address)
                self.mapped[i] = address

    def __call__(self, stream: int) -> None:
        try:
            self.driver.launch(self.function, *self.grid, *self.block, self.shared, stream,
                               self.pointers_address, 0)
        except Exception as error:  # CuPy's CUDADriverError, which names the driver's code
            raise RuntimeError(f"attention: cuLaunchKernel failed: {error}") from error


@dataclass
class Plan:
    """What a call of one shape needs, made once."""

    kernel: str  # "chapter N's name" (of a split plan: its latest call's)
    library: str  # "torch" or "cupy"
    launch: Launch
    lse: object  # the logsumexp buffer, kept alive with the plan
    out_strides: Strides | None  # of an output the call allocates; None: contiguous only
    alignment: int  # bytes every array's start must be a multiple of
    split: dict | None = None  # chapter 8: what each call works out from S_k
    scratch: list = field(default_factory=list)


_PLANS: dict = {}
_LOCK = threading.Lock()  # a plan's parameters are set, then launched, by one thread at once


def _library(x) -> str:
    module = type(x).__module__.split(".")[0]
    if module not in ("torch", "cupy"):
        raise TypeError(f"attention: q must be a torch.Tensor or a cupy.ndarray on the GPU, "
                        f"got {type(x).__name__}")
    return module


#: chapter 7's kernels the lean call chooses between, by the work their blocks and key
#: tiles round up to (those that take every head dim the lean call does)
ROW_BLOCK_CHOICES = ch07_hopper_attention.WIDE_KERNELS
#: and for causal calls at the head dims it takes, the persistent grid whose items go
#: heaviest first, its heads in sections that fit in L2, without and with the early
#: scores (the last: its head dims are the causal grid's)
CAUSAL_CHOICES = ROW_BLOCK_CHOICES + ("hopper_causal_persistent", "hopper_causal_early_scores")


def rows_kernel(gpu: gpus.Gpu, heads: int, S_q: int, D: int, S_k: Optional[int] = None,
                causal: bool = False, dtype: str = "float16") -> tuple[int, str]:
    """(chapter, kernel) for more than MAX_ROWS query rows: the fastest kernel for the
    GPU; on sm_90, whichever of chapter 7's kernels (ROW_BLOCK_CHOICES, CAUSAL_CHOICES
    for a causal call) finishes first by a simple model: the work it does at this shape,
    counted in whole blocks and whole key tiles (:func:`form_work`), over the rate at
    which it did such work at the nearest recorded shape, in the call's dtype
    (:func:`recorded_rate`). At a
    recorded shape the model picks the kernel recorded fastest there; between them, the
    padding decides: where the 192-row blocks of the chapter's kernel leave
    multiprocessors idle, or spill into a short last wave, a 128-row form wins."""
    chapter, name = gpus.fastest(gpu.compute_capability)
    if chapter != 7 or not gpu.multiprocessors:
        return chapter, name
    S_k = S_q if S_k is None else S_k

    def cost(kernel):
        work = form_work(kernel, gpu.multiprocessors, heads, S_q, S_k, D, causal)
        return work / recorded_rate(kernel, gpu.multiprocessors, D, S_k, causal, dtype,
                                    heads)

    return 7, min(forms(D, causal), key=cost)


def forms(D: int, causal: bool) -> list[str]:
    """The forms of chapter 7's kernel :func:`rows_kernel` chooses among at head dim D:
    CAUSAL_CHOICES for a causal call at the causal grid's head dims, else
    ROW_BLOCK_CHOICES (a head dim no kernel takes gets these, whose refusal names it);
    less a form with the early scores where they are off, as it is its base kernel
    there (and recorded at D = 64 only)."""
    causal_grid = causal and D in ch07_hopper_attention.head_dims(CAUSAL_CHOICES[-1])
    configs = ch07_hopper_attention.CONFIGS
    return [k for k in (CAUSAL_CHOICES if causal_grid else ROW_BLOCK_CHOICES)
            if configs[k].at(D).early_scores or not configs[k].early_scores]


def padded_work(kernel: str, multiprocessors: int, heads: int, S_q: int, S_k: int,
                D: int) -> int:
    """Query rows x keys a chapter 7 kernel computes, rounded up: to whole waves of
    blocks (one a multiprocessor, 64 rows a consumer warpgroup) and to whole key tiles."""
    cfg = ch07_hopper_attention.CONFIGS[kernel].at(D)
    rows = 64 * cfg.consumers
    waves = math.ceil(heads * math.ceil(S_q / rows) / multiprocessors)
    return waves * rows * math.ceil(S_k / cfg.block_n) * cfg.block_n


#: a causal call of more items than this many waves is taken as balanced (scheduled_work)
WAVES_SCHEDULED = 8


def scheduled_work(kernel: str, multiprocessors: int, heads: int, S_q: int, S_k: int,
                   D: int) -> float:
    """Query rows x keys of a causal call on the multiprocessor that finishes last, as a
    chapter 7 form hands out its items. An item, a head's row block, walks the key tiles
    its last row sees (bottom-right aligned). A causal persistent grid deals every head's
    heaviest row block first, every gridDim-th item a block; the counter's items, and a
    grid of a block an item, go head after head, each head's heaviest first, to the first
    multiprocessor free. Past WAVES_SCHEDULED waves, the work over the multiprocessors."""
    import heapq

    cfg = ch07_hopper_attention.CONFIGS[kernel].at(D)
    rows = 64 * cfg.consumers
    blocks = math.ceil(S_q / rows)

    def last_row(r):  # the r-th row block from the head's last, its last row
        return S_q - r * rows if cfg.rows_from_end else min(S_q, (blocks - r) * rows)

    tiles = [math.ceil(max(0, min(S_k, last_row(r) + S_k - S_q)) / cfg.block_n)
             for r in range(blocks)]
    items, unit = heads * blocks, rows * cfg.block_n
    if items > WAVES_SCHEDULED * multiprocessors:
        return max(max(tiles), sum(tiles) * heads / multiprocessors) * unit
    if cfg.causal_persistent and not cfg.dynamic_items:
        loads = [0] * multiprocessors
        for i, t in enumerate(t for t in tiles for _ in range(heads)):
            loads[i % multiprocessors] += t
        return max(loads) * unit
    free = [0] * min(multiprocessors, items)
    for t in (t for _ in range(heads) for t in tiles):
        heapq.heappush(free, heapq.heappop(free) + t)
    return max(free) * unit


def form_work(kernel: str, multiprocessors: int, heads: int, S_q: int, S_k: int, D: int,
              causal: bool) -> float:
    """The work :func:`rows_kernel` prices a form by: a causal call's as the form
    schedules it (:func:`scheduled_work`), another's in whole waves and key tiles
    (:func:`padded_work`)."""
    work = scheduled_work if causal else padded_work
    return work(kernel, multiprocessors, heads, S_q, S_k, D)


def rate_shape(D: int, S_k: int, causal: bool, heads: int | None = None):
    """The recorded shape whose rate stands for a call: one of the suite's, or of the
    causal calls of few heads (kernels.bench.FEW_HEADS_SHAPES), where the forms rank
    otherwise; head dim 64 for D <= 64, else 128; causal or not as the call is; the
    nearest key count (by ratio, the longer of two as near), and among the shapes of
    that count the nearest number of heads, B·H (by ratio, the more of two as near;
    ``heads`` None: the suite's shape)."""
    from .bench import FEW_HEADS_SHAPES, STANDARD_SUITE

    suite_D = 64 if D <= 64 else 128
    return min((s for s in STANDARD_SUITE + (FEW_HEADS_SHAPES if heads else [])
                if s.D == suite_D and s.causal == causal),
               key=lambda s: (abs(math.log(s.S_k / S_k)), -s.S_k,
                              abs(math.log(s.B * s.H / heads)) if heads else 0.0, -s.B * s.H))


def recorded_rate(kernel: str, multiprocessors: int, D: int, S_k: int,
                  causal: bool, dtype: str = "float16", heads: int | None = None) -> float:
    """The rate at which the kernel did its padded work at :func:`rate_shape` in the
    recorded run, in ``dtype``, up to a constant."""
    shape = rate_shape(D, S_k, causal, heads)
    work = form_work(kernel, multiprocessors, shape.B * shape.H, shape.S_q, shape.S_k,
                     shape.D, causal)
    return work * recorded_tflops(kernel, shape, dtype)


@functools.cache
def recorded_tflops(kernel: str, shape, dtype: str = "float16") -> float:
    """The kernel's recorded TFLOPS at ``shape`` in ``dtype``, else in fp16 (the forms
    are recorded in both dtypes; a kernel recorded in fp16 only is read there), else
    1.0 (a kernel with a record is then always preferred, and among kernels without, the
    choice goes by the work alone)."""
    from . import results

    data = results.load()
    record = results.timed(data["records"], kernel, shape, dtype) if data else None
    return record["tflops"] if record else 1.0


def launched() -> tuple:
    """What a measurement of the lean call depends on that its code does not name: the
    chapters' kernels it launches (by their source hash) and the functions that choose
    between them (the measuring modules declare them among their ``MEASURES``)."""
    return (ch05_tensor_cores.KERNELS["wmma_copy16"],
            ch06_mma_attention.KERNELS[ch06_mma_attention.MAIN_KERNEL],
            *(ch07_hopper_attention.KERNELS[name] for name in CAUSAL_CHOICES),
            *ch08_in_a_real_model.KERNELS.values(), ch09_backward_pass.mma_backward,
            ch09_backward_pass.hopper_backward, gpus.fastest, decoding_kernel,
            ch08_in_a_real_model.mma_config, ch09_backward_pass.backward_step)


def _plan(q, k, v, causal: bool, scale, lib: str) -> Plan:
    """The full checks of the chapters' API, then the chosen kernel's launch, packed."""
    import kernels

    if kernels.MODE != "gpu":
        raise RuntimeError("kernels.launch.attention runs on a GPU only")
    gpu = gpus.current()
    if lib == "torch":  # a tensor that requires a gradient has no __cuda_array_interface__
        q, k, v = (x.detach() for x in (q, k, v))
    if q.shape[2] <= MAX_ROWS:
        return _split_plan(q, k, v, causal, scale, gpu, lib)
    chapter, name = rows_kernel(gpu, q.shape[0] * q.shape[1], q.shape[2], q.shape[3],
                                k.shape[2], causal, dtype_name(q.dtype))
    if chapter not in CHAPTER_MODULES:
        raise RuntimeError(f"the lean call launches the CUDA C++ kernels of chapters 5-8; "
                           f"this {gpu.name} has none: use chapter {chapter}'s {name}")
    module = CHAPTER_MODULES[chapter]
    B, H, S_q, _ = q.shape
    lse = _empty(q, (B, H, S_q), "float32")
    strided = name in getattr(module, "STRIDED_KERNELS", ())
    head_dims = module.head_dims(name) if hasattr(module, "head_dims") else module.HEAD_DIMS
    a = prepare(q, k, v, causal=causal, scale=scale, kernel=name, head_dims=head_dims,
                dtypes=module.DTYPES, lse=lse, pointers=True, strided=strided, grouped=strided)
    description = module.launch_description(name, a, gpu)
    return Plan(f"chapter {chapter}'s {name}", lib, Launch(description), lse,
                a.strides["out"] if strided else None,
                STRIDE_ALIGNMENT if strided else POINTER_ALIGNMENT)


def _split_plan(q, k, v, causal, scale, gpu, lib) -> Plan:
    """Chapter 8's split-keys kernels, for up to MAX_ROWS query rows: checked in full on
    the first call. A decoding loop calls the plan with one more key each time, so each
    call works out what depends on S_k (:func:`decoding_kernel`'s choice of kernel, made
    again as the cache grows; the splits; S_k) and on K's and V's views of the cache
    (their strides, checked once for each strides seen)."""
    module = CHAPTER_MODULES[8]
    B, H, S_q, D = q.shape
    lse = _empty(q, (B, H, S_q), "float32")
    a = prepare(q, k, v, causal=causal, scale=scale, kernel="split_keys_attention",
                head_dims=module.HEAD_DIMS, dtypes=module.DTYPES, lse=lse, pointers=True,
                strided=True, grouped=True)
    scratch, kernels, per_keys = [], {}, {}

    def kernel_launches(name: str) -> tuple:
        """(the split kernel's Launch, S_k -> (splits, keys a split)) of kernel ``name``,
        made on its first use."""
        kernel_of, launch_description = SPLIT_KERNELS[name]
        kernel = kernel_of(a, gpu)
        splits_for = split_planner(kernel, a, gpu)
        most, _ = splits_for(1 << 30)  # the most splits a call gets
        buffers = (_empty(q, (most, B * H * S_q, D), "float32"),  # each split's answer
                   _empty(q, (most, B * H * S_q), "float32"),  # and its logsumexp
                   # zeros: the kernel sets a counter back to zero when its rows are done
                   _empty(q, (module.blocks_a_split(a, kernel.rows),), "int32", zeroed=True))
        scratch.extend(buffers)
        split, _ = launch_description(a, gpu, *buffers, kernel)  # it combines its splits
        return Launch(split), splits_for

    def for_keys(S_k: int) -> tuple:
        """("chapter 8's <kernel>", its Launch, splits, keys a split) of a call with S_k
        keys."""
        got = per_keys.get(S_k)
        if got is None:
            name = decoding_kernel(a, gpu, S_k)
            if name not in kernels:
                kernels[name] = kernel_launches(name)
            split, splits_for = kernels[name]
            got = per_keys[S_k] = (f"chapter 8's {name}", split, *splits_for(S_k))
        return got

    name, split, _, _ = for_keys(a.S_k)
    plans = dict(for_keys=for_keys, kv_shape=(B, a.H_kv, D), kv_strides={})
    return Plan(name, lib, split, lse, a.strides["out"], STRIDE_ALIGNMENT, split=plans,
                scratch=scratch)


def _empty(like, shape, dtype: str, zeroed: bool = False):
    """A new array on ``like``'s device and library (``zeroed``: of zeros)."""
    if _library(like) == "torch":
        import torch

        return (torch.zeros if zeroed else torch.empty)(shape, dtype=getattr(torch, dtype),
                                                         device=like.device)
    import cupy

    return (cupy.zeros if zeroed else cupy.empty)(shape, dtype)


def torch_functions():
    """What a call needs of torch, looked up once: its current stream as a raw handle
    (through the function torch.compile's generated code calls, a private one, so
    through the public way where it is missing) and ``empty_like``."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda index: torch.cuda.current_stream(index).cuda_stream)
    return raw, torch.empty_like


_TORCH: list = []  # [(raw stream of a device, empty_like)] once torch is first called


def _checked_out(out, q, k, v, plan: Plan) -> tuple[int, Strides | None]:
    """The address and strides of a caller's ``out`` (any GPU array library), checked
    against q: its shape and dtype, strides the kernel can write (contiguous, for a
    kernel that takes no strides), and no overlap with q, k or v."""
    shape, dtype, contiguous = array_info(out)
    want = array_info(q)[:2]
    if (shape, dtype) != want or (plan.out_strides is None and not contiguous):
        kind = "" if plan.out_strides is not None else "contiguous "
        raise ValueError(f"attention: out must be a {kind}{want[0]} {want[1]} array, "
                         f"got {shape} {dtype}")
    if plan.out_strides is None:
        return device_pointer(out), None
    strides = element_strides(out)
    check_strides("attention: ", "out", shape, strides, 2)
    layout = Strides.of(shape, strides)
    inputs = {name: (x, Strides.of(tuple(x.shape), element_strides(x)), tuple(x.shape))
              for name, x in (("q", q), ("k", k), ("v", v))}
    check_no_overlap("attention: ", out, layout, shape, inputs, 2)
    return device_pointer(out), layout


def plan_for(q, k, v, causal=False, scale=None) -> Plan:
    """The plan of a call (made, with every check, on its first use)."""
    lib = _library(q)
    if len(q.shape) != 4:
        raise ValueError(f"attention: q must be (B, H, S_q, D), got shape {tuple(q.shape)}")
    if lib == "torch":
        key = (q.shape, q.stride(), q.dtype, k.dtype, v.dtype, q.device, causal, scale)
    else:
        key = (q.shape, q.strides, q.dtype.str, k.dtype.str, v.dtype.str, q.device.id, causal,
               scale)
    if q.shape[2] > MAX_ROWS:  # the split-keys plan takes any S_k and K/V strides; others, one
        key += (k.shape, v.shape, k.stride(), v.stride()) if lib == "torch" else (
            k.shape, v.shape, k.strides, v.strides)
    else:
        key += (len(k.shape) == 4 and k.shape[1],)  # H_kv
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLANS_KEPT:
            _PLANS.pop(next(iter(_PLANS)))
        plan = _PLANS[key] = _plan(q, k, v, causal, scale, lib)
    return plan


def _split_keys(k, v, split: dict) -> tuple[int, Strides, Strides]:
    """(S_k, k's strides, v's strides) of a split-keys call, checked: k and v of one
    shape, (B, H_kv, S_k, D) as the plan's, with strides the kernel can read (checked
    once for each strides seen: a cache's views keep theirs as S_k grows)."""
    B, H_kv, D = split["kv_shape"]
    shape = tuple(k.shape)
    if shape != tuple(v.shape) or len(shape) != 4 or (shape[0], shape[1], shape[3]) != (B, H_kv, D):
        raise ValueError(f"attention: k and v must both be (B, H_kv, S_k, D) = ({B}, {H_kv}, "
                         f"S_k, {D}), got {shape} and {tuple(v.shape)}")
    S_k = shape[2]
    key = (S_k == 1, element_strides(k), element_strides(v))
    strides = split["kv_strides"].get(key)
    if strides is None:
        for name, x_strides in (("k", key[1]), ("v", key[2])):
            check_strides("attention: ", name, shape, x_strides, 2)
        strides = split["kv_strides"][key] = (Strides.of(shape, key[1]), Strides.of(shape, key[2]))
    return S_k, *strides


def attention(q, k, v, causal=False, scale=None, out=None):
    """softmax(q k^T * scale) v with the book's fastest kernel for this GPU, on the
    caller's stream. q: (B, H, S_q, D), k and v: (B, H_kv, S_k, D) with H a multiple of
    H_kv and D one of 64, 96, 128 and 256 (from sm_80), torch or CuPy, fp16 or bf16 (bf16: torch only); any strides whose D elements
    a row are contiguous and whose starts and other strides are multiples of 16 bytes
    (on sm_75, chapter 5's kernel: contiguous, H_kv = H). ``out`` (q's shape) to write
    into, else a new array in q's layout. Causal masks align bottom-right. Where q, k or v
    requires a gradient (torch, autograd on), the output carries one (:func:`attention_backward`)."""
    if out is None and _wants_gradient(q, k, v):
        import torch

        if torch.compiler.is_compiling():  # torch.compile traces the custom op, not CuPy
            return register_torch_op(differentiable=True)(q, k, v, causal, scale)[0]
        return _eager_autograd().apply(q, k, v, causal, scale)
    return _attention(q, k, v, causal, scale, out)


def _attention(q, k, v, causal, scale, out, plan=None, lse=None):
    """The call itself (chapter 8's lean call, no gradient); ``plan``: the call's plan
    where the caller has looked it up; ``lse``: a (B, H, S_q) float32 array to write the
    logsumexp into (else the plan's buffer)."""
    if plan is None:
        plan = plan_for(q, k, v, causal, scale)
    lib = plan.library
    if type(k) is not type(q) or type(v) is not type(q):
        raise TypeError("attention: q, k and v must come from one library")
    if lib == "torch":
        if not (q.device == k.device == v.device):
            raise ValueError("attention: q, k and v must be on one device")
        addresses = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr()}
        lse_address = (plan.lse if lse is None else lse).data_ptr()
        if not _TORCH:
            _TORCH.append(torch_functions())
        raw_stream, empty_like = _TORCH[0]
        stream = raw_stream(q.device.index)
    else:
        import cupy

        if not (q.device.id == k.device.id == v.device.id):
            raise ValueError("attention: q, k and v must be on one device")
        addresses = {"q": q.data.ptr, "k": k.data.ptr, "v": v.data.ptr}
        lse_address = (plan.lse if lse is None else lse).data.ptr
        stream = cupy.cuda.get_current_stream().ptr
        empty_like = cupy.empty_like
    out_strides = plan.out_strides
    if out is None:
        out = empty_like(q)  # q's layout: the strides the plan was made with
        addresses["out"] = out.data_ptr() if lib == "torch" else out.data.ptr
    else:
        addresses["out"], out_strides = _checked_out(out, q, k, v, plan)
        if out_strides != plan.out_strides and "out" in plan.launch.mapped_arrays:
            # a TMA store writes O as its tensor map says, made once in q's layout: the
            # answer in that layout, then copied into the caller's
            out[...] = _attention(q, k, v, causal, scale, None, plan, lse)
            return out
    if (addresses["q"] | addresses["k"] | addresses["v"] | addresses["out"]) % plan.alignment:
        raise ValueError(f"attention: q, k, v and out must start on {plan.alignment}-byte "
                         "boundaries (a view with an offset?); pass a fresh contiguous copy")
    with _LOCK:
        if plan.split is not None:  # the kernel for this S_k, and its splits
            S_k, k_strides, v_strides = _split_keys(k, v, plan.split)
            plan.kernel, launch, splits, keys = plan.split["for_keys"](S_k)
        else:
            launch = plan.launch
        launch.place(addresses)
        launch.named["lse"].value = lse_address
        if out_strides is not None:
            _set_strides(launch.named["o_strides"], out_strides)
        if plan.split is not None:
            named = launch.named
            named["S_k"].value, named["keys_per_split"].value = S_k, keys
            _set_strides(named["k_strides"], k_strides)
            _set_strides(named["v_strides"], v_strides)
            launch.grid = (splits, *launch.grid[1:])
            launch(stream)  # its last block of each row group combines the splits
        else:
            launch(stream)
    return out


def _wants_gradient(q, k, v) -> bool:
    if not (getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
            or getattr(v, "requires_grad", False)):
        return False
    import torch

    return torch.is_grad_enabled()


def attention_with_lse(q, k, v, causal=False, scale=None):
    """(output, logsumexp) of the lean call: the logsumexp (B, H, S_q) float32 in an array
    of its own, for a backward."""
    plan = plan_for(q, k, v, causal, scale)
    lse = _empty(q, tuple(q.shape[:3]), "float32")
    return _attention(q, k, v, causal, scale, None, plan, lse), lse


@dataclass
class BackwardPlan:
    """Chapter 9's three launches for one shape, packed once; a call points them at its
    arrays."""

    launches: list  # of Launch
    #: chapter 9's ``scratch``, kept with the plan: the row sums delta, and dQ's fp32
    #: accumulator where dQ is added with reductions
    scratch: dict
    scratch_addresses: dict  # their device addresses, by name
    dense: tuple  # whether q, k and v are dense: their gradients' layouts (gradient_like)


_BACKWARD_PLANS: dict = {}


def _layout_key(*xs) -> tuple:
    return tuple(part for x in xs for part in (x.shape, x.stride(), x.dtype))


def _dense(x) -> bool:
    """Whether x's elements fill its span with no gap and no overlap: its strides, sorted,
    are a contiguous array's for its sizes in that order."""
    expected = 1
    for stride, size in sorted((st, n) for st, n in zip(x.stride(), x.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def gradient_like(x, dense=None):
    """An empty array for x's gradient: in x's layout where x is dense (``dense``: known
    already), so that a view of a (B, S, H, D) projection gets its gradient in
    (B, S, H, D) storage, which the ops before it read without strided copies; else
    contiguous (``torch.empty_like`` would keep the order of a view of a packed
    (B, S, 3, H, D) projection, whose backward then stacks the three gradients with a
    slower copy). Both through ``empty_like``, the cheapest of torch's allocations on the
    host."""
    import torch

    if dense is None:
        dense = _dense(x)
    return torch.empty_like(x) if dense else torch.empty_like(
        x, memory_format=torch.contiguous_format)


def attention_backward(q, k, v, out, lse, dout, causal=False, scale=None):
    """dq, dk, dv (torch, in q's, k's and v's dtype and layout where that is dense, else
    contiguous: ``gradient_like``) of the lean call's output for
    the output gradient ``dout``, from the forward's ``out`` and logsumexp ``lse``: chapter
    9's tensor-core kernels, the step ``backward_step`` chooses: on sm_90 the one_barrier
    step from S = 128 (dQ added by TMA's reductions, a block's warpgroups meeting once a
    tile), and the separate dQ kernel below that or where
    ``torch.use_deterministic_algorithms`` is on. The checks of chapter 9's API
    (``check_backward``) run once a shape, without the scans for NaN and infinity, which
    would wait for the GPU; later calls of the shape check that the arrays share q's
    device and start 16-byte aligned."""
    import torch

    dout = _aligned_dout(dout)
    deterministic = torch.are_deterministic_algorithms_enabled()
    key = _layout_key(q, k, v, out, dout, lse) + (q.get_device(), causal, scale, deterministic)
    plan = _BACKWARD_PLANS.get(key)
    if plan is None:
        if len(_BACKWARD_PLANS) >= _PLANS_KEPT:
            _BACKWARD_PLANS.pop(next(iter(_BACKWARD_PLANS)))
        plan = _BACKWARD_PLANS[key] = _backward_plan(q, k, v, out, lse, dout, causal, scale,
                                                     deterministic)
    dq, dk, dv = (gradient_like(x, dense) for x, dense in zip((q, k, v), plan.dense))
    device = q.get_device()  # an index, which costs less to get and compare than q.device
    if not (k.get_device() == device and v.get_device() == device
            and out.get_device() == device and dout.get_device() == device
            and lse.get_device() == device):
        raise ValueError("attention_backward: q, k, v, out, dout and lse must be on one device")
    addresses = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "out": out.data_ptr(),
                 "dout": dout.data_ptr(), "lse": lse.data_ptr(), **plan.scratch_addresses,
                 "dq": dq.data_ptr(), "dk": dk.data_ptr(), "dv": dv.data_ptr()}
    if (addresses["q"] | addresses["k"] | addresses["v"] | addresses["out"]
            | addresses["dout"]) % STRIDE_ALIGNMENT:
        raise ValueError("attention_backward: q, k, v, out and dout must start on 16-byte "
                         "boundaries (a view with an offset?)")
    if not _TORCH:
        _TORCH.append(torch_functions())
    stream = _TORCH[0][0](device)
    with _LOCK:
        for launch in plan.launches:
            launch.place(addresses)
            launch(stream)
    return dq, dk, dv


def _backward_plan(q, k, v, out, lse, dout, causal, scale, deterministic) -> BackwardPlan:
    """The checks of chapter 9's API and the launches of the step ``backward_step``
    chooses, packed for arrays of these layouts (the gradients' as gradient_like makes
    them)."""
    q, k, v, out, lse, dout = (x.detach() for x in (q, k, v, out, lse, dout))
    a = ch09_backward_pass.check_backward(
        q, k, v, out, lse, dout, causal=causal, scale=scale, kernel="attention_backward",
        head_dims=ch09_backward_pass.HEAD_DIMS, dtypes=ch09_backward_pass.DTYPES,
        strided=True, finite=False)
    gpu = gpus.current()
    step = ch09_backward_pass.backward_step(a.D, a.S_q, a.S_k, *gpu.limits()[:2], deterministic)
    work = ch09_backward_pass.scratch(a, step)
    dense = tuple(_dense(x) for x in (q, k, v))
    grads = dict(zip(("dq", "dk", "dv"), (gradient_like(x, d) for x, d in zip((q, k, v), dense))))
    tensors = dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse, **grads, **work)
    described = ch09_backward_pass.backward_launches(
        a, ch09_backward_pass.backward_arrays(tensors), gpu, step)
    return BackwardPlan([Launch(d) for d in described], work,
                        {name: x.data_ptr() for name, x in work.items()}, dense)


def _set_strides(packed, strides: Strides) -> None:
    packed[0], packed[1], packed[2] = strides.batch, strides.head, strides.row


def register_torch_op(differentiable=False):
    """``torch.ops.fa_from_scratch.attention(q, k, v, causal, scale)``: the lean call as
    a custom op, with a fake (meta) implementation that gives the output's shape, so
    that torch.compile traces through it and CUDA graphs capture it. With
    ``differentiable``: ``torch.ops.fa_from_scratch.attention_with_lse(q, k, v, causal,
    scale)`` -> (output, logsumexp), with a registered backward
    (``fa_from_scratch::attention_backward``, :func:`attention_backward`); it saves q, k,
    v, the output and the logsumexp."""
    import torch

    ops = getattr(torch.ops, "fa_from_scratch", None)
    name = "attention_with_lse" if differentiable else "attention"
    if ops is not None and hasattr(ops, name):
        return getattr(ops, name)
    if differentiable:
        return _register_differentiable()

    @torch.library.custom_op("fa_from_scratch::attention", mutates_args=())
    def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     scale: Optional[float] = None) -> torch.Tensor:
        return attention(q, k, v, causal=causal, scale=scale)

    @attention_op.register_fake
    def _(q, k, v, causal=False, scale=None):
        return torch.empty_like(q)  # as the call's: in q's layout

    return torch.ops.fa_from_scratch.attention


def _register_differentiable():
    import torch

    @torch.library.custom_op("fa_from_scratch::attention_with_lse", mutates_args=())
    def forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
        return attention_with_lse(q, k, v, causal, scale)

    @forward_op.register_fake
    def _(q, k, v, causal=False, scale=None):
        return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)

    @torch.library.custom_op("fa_from_scratch::attention_backward", mutates_args=())
    def backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, causal: bool,
                    scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return attention_backward(q, k, v, out, lse, dout, causal, scale)

    @backward_op.register_fake
    def _(dout, q, k, v, out, lse, causal, scale):
        return gradient_like(q), gradient_like(k), gradient_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx, dout, _dlse):  # the logsumexp is not differentiated
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.fa_from_scratch.attention_backward(
            dout, q, k, v, out, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None

    forward_op.register_autograd(backward, setup_context=setup_context)
    return torch.ops.fa_from_scratch.attention_with_lse


def _aligned_dout(dout):
    """The output gradient as the backward kernels take it: copied where its strides or
    start break api.check_strides' rule (e.g. the expanded gradient of a sum: stride 0
    along D)."""
    try:
        check_strides("", "dout", tuple(dout.shape), dout.stride(), dout.element_size())
    except ValueError:
        return dout.contiguous()
    return dout.contiguous() if dout.data_ptr() % STRIDE_ALIGNMENT else dout


@functools.cache
def _eager_autograd():
    """The differentiable lean call in eager code and CUDA graphs: the custom op's
    forward and backward as a ``torch.autograd.Function``, which saves the same tensors
    without the custom op's Python dispatch, whose host time a call
    (``kernels.training.attention_call_costs`` measures it) rivals the kernels' device
    time at a training step's small shapes."""
    import torch

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            out, lse = attention_with_lse(q, k, v, causal, scale)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal, ctx.scale = causal, scale
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = attention_backward(q, k, v, out, lse, dout, ctx.causal, ctx.scale)
            return dq, dk, dv, None, None

    return Attention


# The custom ops are registered when this module is imported, where torch is: torch.compile
# cannot register an op inside the code it traces (Dynamo skips torch.library's schema
# inference), so a model compiled in a fresh process would fail on its first call.
try:
    import torch as _torch  # noqa: F401
except ImportError:
    pass
else:
    register_torch_op()
    register_torch_op(differentiable=True)
