"""The one kernel API of the book, and the input checks every kernel shares.

Every chapter's kernel is called as ``attention(q, k, v, causal=False,
scale=None, out=None)`` on (B, H, S, D) arrays: GPU arrays through the CUDA
array interface (torch, CuPy, Numba) on a GPU, NumPy arrays in the simulator.
:func:`prepare` checks the arguments before anything launches and hands the
kernel what it needs; bad input raises ``TypeError`` or ``ValueError`` with a
message that names the argument and the kernel.

Causal masking is aligned bottom-right, as in FlashAttention: query row ``i``
sees key ``j`` when ``j <= i + (S_k - S_q)``. With ``S_q > S_k`` the first
``S_q - S_k`` rows see no key at all; their output is 0 (and their logsumexp
-inf). PyTorch's ``is_causal=True`` aligns top-left instead; the two agree when
``S_q == S_k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .mode import SIMULATED

_DTYPES = {"<f2": "float16", "<f4": "float32"}
#: bfloat16 has no NumPy dtype: arrays of it are torch tensors, named by this string
BFLOAT16 = "bfloat16"


def dtype_name(dtype) -> str:
    """"float16", "float32" or "bfloat16" for a NumPy dtype, a torch dtype or a name."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16", "torch.bfloat16"):
        return BFLOAT16
    if str(dtype).startswith("torch."):
        return str(dtype)[len("torch."):]
    return np.dtype(dtype).name


def _kind(x) -> str:
    if isinstance(x, np.ndarray):
        return "host"
    if hasattr(x, "__cuda_array_interface__"):
        return "device"
    return "other"


def array_info(x) -> tuple[tuple, str, bool]:
    """(shape, dtype name, C-contiguous) of a NumPy or CUDA-array-interface array
    (torch tensors are asked directly: bfloat16 has no array-interface type)."""
    if isinstance(x, np.ndarray):
        return x.shape, x.dtype.name, x.flags.c_contiguous or x.size == 0
    if type(x).__module__.split(".")[0] == "torch":
        name = dtype_name(x.dtype)
        if name not in ("float16", "float32", BFLOAT16):
            raise TypeError(f"unsupported element type {x.dtype}")
        return tuple(x.shape), name, x.is_contiguous()
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    if typestr not in _DTYPES:
        raise TypeError(f"unsupported element type {typestr!r}")
    dtype = _DTYPES[typestr]
    strides = cai.get("strides")
    contiguous = (strides is None or 0 in shape
                  or tuple(strides) == _c_strides(shape, np.dtype(dtype).itemsize))
    return shape, dtype, contiguous


def element_strides(x) -> tuple:
    """The strides of a NumPy, torch or CUDA-array-interface array, in elements."""
    if isinstance(x, np.ndarray):
        return tuple(s // x.itemsize for s in x.strides)
    if type(x).__module__.split(".")[0] == "torch":
        return tuple(x.stride())
    cai = x.__cuda_array_interface__
    itemsize = np.dtype(cai["typestr"]).itemsize
    strides = cai.get("strides")
    return tuple(s // itemsize for s in strides) if strides else tuple(
        s // itemsize for s in _c_strides(tuple(cai["shape"]), itemsize))


def _c_strides(shape, itemsize) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Strides:
    """Where the rows of a (B, H, S, D) array lie: element (b, h, s, d) is ``b * batch +
    h * head + s * row + d`` elements from its start (its D elements a row contiguous). A
    dimension of extent 1 is never stepped along: its stride is 0."""

    batch: int
    head: int
    row: int

    @classmethod
    def of(cls, shape: tuple, strides: tuple) -> "Strides":
        return cls(*(0 if n == 1 else st for n, st in zip(shape[:3], strides[:3])))

    @classmethod
    def contiguous(cls, H: int, S: int, D: int) -> "Strides":
        return cls(H * S * D, S * D, D)

    def span(self, shape: tuple) -> int:
        """Elements from the first to one past the last this array reaches."""
        return sum((n - 1) * st for n, st in zip(shape[:3], (self.batch, self.head, self.row))) \
            + shape[3]


#: a strided array's start and its batch, head and row strides must be multiples of
#: 16 bytes: cp.async and TMA copy 16 bytes at once, and TMA takes no other strides
STRIDE_ALIGNMENT = 16


@dataclass
class Prepared:
    """Checked arguments, in the form the kernels take."""

    q: object
    k: object
    v: object
    out: object  # what the kernel writes (a NumPy or Numba device array)
    result: object  # what the caller gets back (same library as q)
    B: int
    H: int
    S_q: int
    S_k: int
    D: int
    causal: bool
    scale: float
    lse_view: object = None  # the caller's logsumexp array, as the kernel takes it
    lse_result: object = None  # the logsumexp array the caller gets back, if any
    return_lse: bool = False
    dtype: str = "float16"  # of q, k, v and out
    H_kv: int = 0  # heads of k and v (grouped-query attention: fewer than H); 0: H
    strides: dict = None  # "q", "k", "v", "out" -> Strides (strided kernels)

    def __post_init__(self):
        self.H_kv = self.H_kv or self.H

    @property
    def group(self) -> int:
        """Query heads a key/value head serves (1: every head its own)."""
        return self.H // self.H_kv

    @property
    def diagonal(self) -> int:
        """Key ``j`` is visible to query ``i`` when ``j <= i + diagonal`` (causal)."""
        return self.S_k - self.S_q

    def lse(self) -> object:
        """Where the kernel writes the logsumexp, (B, H, S_q) float32: the caller's
        array, or a scratch buffer when the caller did not ask for it."""
        if self.lse_view is not None:
            return self.lse_view
        return self.scratch("lse", (self.B, self.H, self.S_q), np.float32)

    def returned(self):
        """What the kernel function returns: the output, and the logsumexp if asked."""
        return (self.result, self.lse_result) if self.return_lse else self.result

    def pointers(self) -> tuple[int, int, int, int, int]:
        """Device addresses of q, k, v, out and the logsumexp (``pointers=True``)."""
        return (self.q, self.k, self.v, self.out, device_pointer(self.lse()))

    def scratch(self, name: str, shape: tuple, dtype, zeroed: bool = False) -> object:
        """A work buffer kept between calls, so timings leave cudaMalloc out; ``zeroed``:
        zeros when it is made (a kernel that leaves it as it found it, such as counters
        set back to zero, may rely on that)."""
        key = (name, tuple(shape), np.dtype(dtype).str)
        buf = _SCRATCH.get(name)
        if buf is None or buf[0] != key:
            _SCRATCH.pop(name, None)  # free the old one first
            if SIMULATED:
                arr = (np.zeros if zeroed else np.empty)(shape, dtype)
            else:
                from numba import cuda

                arr = (cuda.to_device(np.zeros(shape, dtype)) if zeroed
                       else cuda.device_array(shape, dtype))
            _SCRATCH[name] = buf = (key, arr)
        return buf[1]


_SCRATCH: dict[str, tuple] = {}


def device_pointer(x) -> int:
    """The device address of a GPU array (torch, CuPy or Numba)."""
    if type(x).__module__.split(".")[0] == "torch":
        return x.data_ptr()
    return x.__cuda_array_interface__["data"][0]


#: wide loads (16 bytes, and WMMA's 32) need arrays that start on such a boundary
POINTER_ALIGNMENT = 32


def prepare(q, k, v, *, causal=False, scale=None, out=None, kernel: str,
            head_dims=(64, 128), dtypes=(np.float16,), lse=None,
            return_lse=False, pointers=False, strided=False, grouped=False) -> Prepared:
    """Check an attention call's arguments; raise before anything launches.

    Kernels that also compute the logsumexp of each row take ``lse`` (a float32
    (B, H, S_q) array to write it to) and ``return_lse`` (allocate one and return
    it); with neither, their logsumexp goes to a scratch buffer. With
    ``pointers=True`` (kernels launched through CuPy) q, k, v and out come back as
    device addresses, checked to be POINTER_ALIGNMENT-aligned; otherwise as Numba
    device arrays (NumPy arrays in the simulator).

    Kernels that take strides (``strided=True``) accept q, k, v and out with any
    strides whose D elements a row are contiguous and whose start and other strides are
    multiples of STRIDE_ALIGNMENT bytes (views of (B, S, H, D) storage, or of a longer
    cache); their strides come back in ``Prepared.strides``, and an output they allocate
    has q's layout. Kernels that take grouped-query attention (``grouped=True``) accept
    k and v with H_kv heads, H a multiple of H_kv.
    """
    where = f"{kernel}: "
    names = ("q", "k", "v") + (("out",) if out is not None else ()) \
        + (("lse",) if lse is not None else ())
    arrays = (q, k, v) + ((out,) if out is not None else ()) \
        + ((lse,) if lse is not None else ())
    want = "host" if SIMULATED else "device"
    for name, x in zip(names, arrays):
        kind = _kind(x)
        if kind == "other":
            raise TypeError(
                f"{where}{name} must be an array (NumPy in the simulator, a GPU "
                f"array with __cuda_array_interface__ on a GPU), got {type(x).__name__}")
        if kind != want:
            if SIMULATED:
                raise TypeError(f"{where}{name} is a GPU array but kernels run in "
                                "the simulator: pass NumPy arrays")
            raise TypeError(f"{where}{name} is a host (NumPy) array but kernels run "
                            "on the GPU: pass a GPU array (torch.Tensor on cuda, "
                            "cupy.ndarray or a Numba device array)")
    shapes, layouts = {}, {}
    for name, x in zip(names, arrays):
        try:
            shape, dtype, contiguous = array_info(x)
        except TypeError as e:
            raise TypeError(f"{where}{name}: {e}") from None
        if name == "lse":
            shapes[name] = (shape, dtype, contiguous)
            continue
        if len(shape) != 4:
            raise ValueError(f"{where}{name} must have rank 4 (B, H, S, D), "
                             f"got shape {shape}")
        if dtype not in [dtype_name(d) for d in dtypes]:
            allowed = ", ".join(dtype_name(d) for d in dtypes)
            raise TypeError(f"{where}{name} has dtype {dtype}; this kernel "
                            f"takes {allowed}")
        if strided:
            strides = element_strides(x)
            check_strides(where, name, shape, strides, np.dtype(
                "float16" if dtype == BFLOAT16 else dtype).itemsize)
            layouts[name] = Strides.of(shape, strides)
        elif not contiguous:
            raise ValueError(f"{where}{name} is not C-contiguous; call "
                             ".contiguous() (torch) or np.ascontiguousarray first")
        shapes[name] = (shape, dtype)
    (B, H, S_q, D), dt = shapes["q"]
    S_k = shapes["k"][0][2]
    H_kv = shapes["k"][0][1] if grouped else H
    if shapes["k"][0] != (B, H_kv, S_k, D):
        if grouped:
            raise ValueError(f"{where}k has shape {shapes['k'][0]}; q is {(B, H, S_q, D)}, "
                             "so k must be (B, H_kv, S_k, D) with the same B and D")
        raise ValueError(f"{where}k has shape {shapes['k'][0]}; q is {(B, H, S_q, D)}, "
                         "so k must be (B, H, S_k, D) with the same B, H and D")
    if grouped and H_kv >= 1 and H % H_kv:
        raise ValueError(f"{where}k and v have H_kv = {H_kv} heads and q has H = {H}: H "
                         "must be a multiple of H_kv (each key/value head serves H / H_kv "
                         "query heads)")
    if shapes["v"][0] != shapes["k"][0]:
        raise ValueError(f"{where}v has shape {shapes['v'][0]}, k has "
                         f"{shapes['k'][0]}: they must match")
    if len({shapes[n][1] for n in ("q", "k", "v")}) != 1:
        raise TypeError(f"{where}q, k and v must share one dtype")
    check_not_empty(where, B, H, S_q, S_k)
    if D not in head_dims:
        raise ValueError(f"{where}head dim D={D} is not supported; this kernel "
                         f"takes D in {tuple(head_dims)}")
    if out is not None and shapes["out"] != ((B, H, S_q, D), dt):
        raise ValueError(f"{where}out must be {(B, H, S_q, D)} {dt}, got "
                         f"{shapes['out'][0]} {shapes['out'][1]}")
    if lse is not None and shapes["lse"] != ((B, H, S_q), "float32", True):
        raise ValueError(f"{where}lse must be a C-contiguous {(B, H, S_q)} float32 array, "
                         f"got {shapes['lse'][0]} {shapes['lse'][1]}")
    scale = checked_scale(where, causal, scale, D)

    if out is None:
        result = _empty_in_layout(q) if strided else _empty_like(q, (B, H, S_q, D), dt)
        if strided:
            layouts["out"] = Strides.of(result.shape, element_strides(result))
    else:
        result = out
        if strided:
            check_no_overlap(where, out, layouts["out"], (B, H, S_q, D),
                              {n: (x, layouts[n], shapes[n][0])
                               for n, x in zip(("q", "k", "v"), (q, k, v))},
                              4 if dt == "float32" else 2)
    lse_result = lse if lse is not None else (
        _empty_like(q, (B, H, S_q), "float32") if return_lse else None)
    if SIMULATED:
        views = (q, k, v, result, lse_result)
    elif pointers:
        views = tuple(None if x is None else device_pointer(x)
                      for x in (q, k, v, result))
        alignment = STRIDE_ALIGNMENT if strided else POINTER_ALIGNMENT
        for name, p in zip(("q", "k", "v", "out"), views):
            if p % alignment:
                raise ValueError(f"{where}{name} starts at an address that is not a "
                                 f"multiple of {alignment} bytes (a view with an "
                                 "offset?); pass a fresh contiguous copy")
        views += (None if lse_result is None else cuda_array(lse_result),)
    else:
        views = tuple(None if x is None else cuda_array(x)
                      for x in (q, k, v, result, lse_result))
    return Prepared(*views[:3], out=views[3], result=result, B=B, H=H, S_q=S_q,
                    S_k=S_k, D=D, causal=bool(causal), scale=scale, lse_view=views[4],
                    lse_result=lse_result, return_lse=bool(return_lse), dtype=dt,
                    H_kv=H_kv, strides=layouts if strided else None)


def check_not_empty(where: str, B: int, H: int, S_q: int, S_k: int) -> None:
    """Refuse a call with no batch, head, query row or key: attention over no keys has no
    answer (a softmax over nothing), and a kernel's grid of no blocks is no launch."""
    if min(B, H, S_q, S_k) < 1:
        raise ValueError(f"{where}empty input: B, H, S_q, S_k must all be >= 1, "
                         f"got {(B, H, S_q, S_k)}")


def checked_scale(where: str, causal, scale, D: int) -> float:
    """The call's scale (1 / sqrt(D) where it is None), after refusing a ``causal`` that is
    not a bool (a string such as "yes" is truthy, and would be taken as True) and a scale
    that is not a finite non-zero number."""
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{where}causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        return 1.0 / math.sqrt(D)
    try:
        if isinstance(scale, (str, bytes, bool, np.bool_)):
            raise TypeError
        scale = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"{where}scale must be a number or None, got "
                        f"{type(scale).__name__}") from None
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"{where}scale must be finite and non-zero, got {scale}")
    return scale


def check_strides(where: str, name: str, shape: tuple, strides: tuple, itemsize: int) -> None:
    """Refuse, naming the argument and the stride, an array a strided kernel cannot read:
    its D elements a row not contiguous, a stride (of a dimension it steps along) that is
    not a multiple of STRIDE_ALIGNMENT bytes, or a stride of 0 along a dimension of more
    than one element (an expanded view, whose rows are one row in memory: a TMA tensor map
    takes no such stride, and an ``out`` so laid out overlaps itself, which
    :func:`check_no_overlap` says)."""
    if shape[3] > 1 and strides[3] != 1:
        raise ValueError(f"{where}{name} has stride {strides[3]} along D (its last "
                         "dimension); the D elements of a row must be contiguous (stride 1)")
    step = STRIDE_ALIGNMENT // itemsize
    for label, n, st in zip(("batch", "head", "row"), shape[:3], strides[:3]):
        if n > 1 and st == 0 and name != "out":
            instead = (f"pass {name}[:, :1], one head, which every query head shares "
                       "(H_kv = 1: multi-query attention)"
                       if label == "head" and name in ("k", "v") else
                       "copy it with .contiguous()")
            many = {"batch": "batches"}.get(label, label + "s")
            raise ValueError(f"{where}{name} has {label} stride 0: its {n} {many} are one "
                             f"in memory (an expanded view); {instead}")
        if n > 1 and (st % step or st < 0):
            raise ValueError(f"{where}{name} has {label} stride {st} elements; a strided "
                             f"kernel needs non-negative multiples of {step} elements "
                             f"({STRIDE_ALIGNMENT} bytes): copy it with .contiguous()")


def check_no_overlap(where: str, out, layout: Strides, shape: tuple, inputs: dict,
                      itemsize: int) -> None:
    """Refuse an ``out`` whose rows overlap one another, or whose memory overlaps an
    input's: the kernel would read what it has already written."""
    extents = sorted((st, n) for st, n in zip((layout.batch, layout.head, layout.row), shape[:3])
                     if n > 1)
    reach = shape[3]  # elements one step of the next stride must clear
    for st, n in extents:
        if st < reach:
            raise ValueError(f"{where}out's strides {(layout.batch, layout.head, layout.row)} "
                             f"make its rows overlap: pass an out whose rows are disjoint")
        reach = st * (n - 1) + reach
    start = device_pointer(out) if not isinstance(out, np.ndarray) else out.ctypes.data
    end = start + itemsize * layout.span(shape)
    for name, (x, x_layout, x_shape) in inputs.items():
        x_start = device_pointer(x) if not isinstance(x, np.ndarray) else x.ctypes.data
        x_end = x_start + itemsize * x_layout.span(x_shape)
        if start < x_end and x_start < end:
            raise ValueError(f"{where}out overlaps {name} in memory: pass an out of its own")


def _empty_in_layout(q):
    """An output like q in layout: torch and CuPy keep a dense q's strides and a view's
    order of dimensions ((B, S, H, D) storage for a view of it); other arrays are
    C-contiguous."""
    module = type(q).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.empty_like(q)
    if module == "cupy":
        import cupy

        return cupy.empty_like(q)
    return _empty_like(q, tuple(q.shape), array_info(q)[1])


@dataclass(frozen=True)
class Param:
    """One parameter of a kernel, in the kernel's order: its name in the CUDA source,
    its C type ("u64", "i32", "i64", "f32", "strides": a :class:`Strides` as the CUDA
    struct of three ``long long``, or "tensor_map": a CUtensorMap's 128 bytes, passed by
    value), and its value for this launch. ``array`` names the argument whose
    address the value follows ("q", "k", "v", "out"); ``at`` gives the value for that
    argument at another address where the value is not the address itself (a tensor
    map). The lean call uses both to launch again on other arrays of the same shape."""

    name: str
    ctype: str
    value: object
    array: str | None = None
    at: object = None  # address -> value, for a value that is not the address

    def numpy(self):
        """The value as CuPy's launch takes it."""
        if self.ctype == "tensor_map":
            return self.value
        if self.ctype == "strides":
            packed = np.zeros((), STRIDES_STRUCT)
            packed["batch"], packed["head"], packed["row"] = (
                self.value.batch, self.value.head, self.value.row)
            return packed[()]
        return {"u64": np.uint64, "i32": np.int32, "i64": np.int64,
                "f32": np.float32}[self.ctype](self.value)


#: the CUDA struct ``Strides`` (three ``long long``), as CuPy passes a structured scalar
STRIDES_STRUCT = np.dtype([("batch", "<i8"), ("head", "<i8"), ("row", "<i8")])


def layout_params(a: Prepared) -> tuple:
    """A strided kernel's layout parameters: the strides of q, k, v and out
    (``q_strides``, ..., ``o_strides``), then H and the query heads a key/value head
    serves (``group``)."""
    return (*(Param(f"{name[0]}_strides", "strides", a.strides[name])
              for name in ("q", "k", "v", "out")),
            Param("H", "i32", a.H), Param("group", "i32", a.group))


@dataclass(frozen=True)
class KernelLaunch:
    """What one launch of a compiled CUDA C++ kernel is: the CuPy kernel, its grid and
    block, its dynamic shared memory, and its parameters by name. Each CUDA chapter
    makes these in one public function (``launch_description``) that its own kernels
    launch through and that the lean call (:mod:`kernels.launch`) packs once."""

    function: object  # a cupy.RawKernel: ``function.kernel.ptr`` is its CUfunction
    grid: tuple
    block: tuple
    shared_bytes: int
    params: tuple  # of Param

    def index(self, name: str) -> int:
        """Where the parameter ``name`` is in the kernel's parameter list."""
        for i, p in enumerate(self.params):
            if p.name == name:
                return i
        raise KeyError(f"the kernel has no parameter {name!r}; it has "
                       + ", ".join(p.name for p in self.params))

    def __call__(self) -> None:
        """Launch through CuPy, on CuPy's current stream."""
        self.function(self.grid, self.block, tuple(p.numpy() for p in self.params),
                      shared_mem=self.shared_bytes)


def prepare_cuda(q, k, v, *, causal, scale, out, lse, return_lse, kernel: str,
                 head_dims, dtypes, needs=("cupy",), strided=False) -> Prepared:
    """:func:`prepare` for a kernel of CUDA C++ launched through CuPy (chapters 5-8):
    the arguments checked, device addresses for q, k, v and out; then, before anything
    is compiled, a refusal without a GPU and where a module it is launched through
    (``needs``: "cupy", "cuda.bindings") is missing. ``strided``: the kernel takes any
    strides and grouped-query attention (:func:`layout_params`)."""
    from .mode import MODE

    a = prepare(q, k, v, causal=causal, scale=scale, out=out, kernel=kernel,
                head_dims=head_dims, dtypes=dtypes, lse=lse, return_lse=return_lse,
                pointers=True, strided=strided, grouped=strided)
    if MODE != "gpu":
        raise RuntimeError(f"{kernel} runs on a GPU only (CUDA C++ through CuPy); without "
                           "one, compile_cubin shows what it compiles to")
    import importlib

    for module in needs:
        try:
            importlib.import_module(module)
        except ImportError:
            raise RuntimeError(f"{kernel} is launched through {' and '.join(needs)}: pip "
                               "install cupy-cuda13x cuda-bindings") from None
    return a


def kernel_function(name: str, doc: str, launch):
    """A step of a chapter as the book's one kernel API, ``name(q, k, v, causal=False,
    scale=None, out=None, lse=None, return_lse=False)``, calling the chapter's
    ``launch(q, k, v, causal, scale, out, lse, return_lse, name=name)``."""
    def attention(q, k, v, causal=False, scale=None, out=None, lse=None, return_lse=False):
        return launch(q, k, v, causal, scale, out, lse, return_lse, name=name)

    attention.__name__ = attention.__qualname__ = name
    attention.__doc__ = doc
    attention.launch = launch  # the chapter's: what it says of its kernels is read there
    return attention


def cuda_array(x):
    """A Numba view of a GPU array (torch, CuPy or Numba)."""
    from numba import cuda

    return cuda.as_cuda_array(x)


def _empty_like(x, shape, dtype: str):
    """A new output array from the same library as ``x``."""
    if isinstance(x, np.ndarray):
        return np.empty(shape, dtype)
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=x.device)
    if module == "cupy":
        import cupy

        return cupy.empty(shape, dtype)
    from numba import cuda

    return cuda.device_array(shape, dtype)
