"""Bad input is refused, clearly, before anything launches."""

import numpy as np
import pytest

from conftest import ON_GPU, gpu_only, sim_only
import kernels
from kernels.check import random_inputs, to_device

KERNELS = {name: fn for _, name, fn in kernels.all_kernels()}
ALL = pytest.mark.parametrize("name", sorted(KERNELS))
#: kernels of chapters that run on a GPU only (CUDA C++ through CuPy)
GPU_ONLY = {name for c, name, _ in kernels.all_kernels()
            if not getattr(kernels.chapter_module(c), "RUNS_IN_SIMULATOR", True)}
#: kernels that take any strides and grouped-query attention (chapters 6-8)
STRIDED = {name for c, name, _ in kernels.all_kernels()
           if name in getattr(kernels.chapter_module(c), "STRIDED_KERNELS", ())}


def inputs(B=1, H=2, S_q=5, S_k=6, D=64, dtype=np.float16):
    q, k, v, _ = random_inputs(B, H, S_q, S_k, D, dtype)
    return q, k, v


def call(name, q, k, v, **kw):
    return KERNELS[name](*to_device(q, k, v), **kw)


@ALL
def test_wrong_rank(name):
    q, k, v = inputs()
    with pytest.raises(ValueError, match=r"q must have rank 4 \(B, H, S, D\)"):
        call(name, q[0], k, v)


@ALL
def test_wrong_dtype(name):
    q, k, v = inputs(dtype=np.float32)
    with pytest.raises(TypeError, match="dtype float32; this kernel takes float16"):
        call(name, q, k, v)


@ALL
def test_mismatched_shapes(name):
    q, k, v = inputs()
    with pytest.raises(ValueError, match="k has shape"):
        call(name, q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(ValueError, match="v has shape"):
        call(name, q, k, np.ascontiguousarray(v[:, :, :3]))
    q2, k2, v2 = inputs(D=32)
    with pytest.raises(ValueError, match="same B"):
        call(name, q, k2, v2)


@ALL
def test_grouped_heads(name):
    """Kernels that take grouped-query attention refuse H not a multiple of H_kv, by
    name; the others refuse k and v with fewer heads than q."""
    q, k, v = inputs(H=4)
    few = np.ascontiguousarray(k[:, :3]), np.ascontiguousarray(v[:, :3])
    if name in STRIDED:
        with pytest.raises(ValueError, match=r"H_kv = 3 heads and q has H = 4: H must be a "
                                             "multiple of H_kv"):
            call(name, q, *few)
    else:
        with pytest.raises(ValueError, match="same B, H and D"):
            call(name, q, *(x[:, :2] for x in few))


@ALL
def test_unsupported_head_dim(name):
    q, k, v = inputs(D=24)
    with pytest.raises(ValueError, match=f"{name}: head dim D=24 is not supported"):
        call(name, q, k, v)


@ALL
def test_non_contiguous(name):
    """A kernel without strides refuses a view; one with strides refuses, by argument
    and stride, a view whose rows are not contiguous or whose strides are not whole
    16-byte steps, and an out that overlaps itself or an input."""
    q, k, v = inputs(H=2, S_q=2, S_k=2)
    wide = inputs(H=2, S_q=2, S_k=2, D=128)[0]
    padded = np.zeros((1, 2, 2, 68), np.float16)
    if ON_GPU:
        torch = pytest.importorskip("torch")
        q, k, v, wide, padded = (torch.from_numpy(x).cuda() for x in (q, k, v, wide, padded))
        transposed = q.transpose(1, 2)
    else:
        transposed = np.swapaxes(q, 1, 2)
    if name not in STRIDED:
        with pytest.raises(ValueError, match="q is not C-contiguous"):
            KERNELS[name](transposed, k, v)
        return
    with pytest.raises(ValueError, match="q has stride 2 along D"):
        KERNELS[name](wide[..., ::2], k, v)
    with pytest.raises(ValueError, match="k has row stride 68 elements; a strided kernel "
                                         "needs non-negative multiples of 8 elements"):
        KERNELS[name](q, padded[..., :64], v)
    with pytest.raises(ValueError, match="out overlaps q"):
        KERNELS[name](q, k, v, out=q)
    rows_on_one = (np.lib.stride_tricks.as_strided(q, strides=(512, 256, 0, 2)) if not ON_GPU
                   else torch.as_strided(q, q.shape, (256, 128, 0, 1)))
    with pytest.raises(ValueError, match="make its rows overlap"):
        KERNELS[name](q, k, v, out=rows_on_one)


@pytest.mark.parametrize("name", sorted(STRIDED))
def test_expanded_views_are_refused_by_argument_and_dimension(name):
    """A stride of 0 along a dimension of more than one element (``expand``'s views) is
    refused before launch: a TMA tensor map cannot step by 0, and took such a view for a
    dense one. K and V expanded along the heads are told to pass the one head instead
    (the strided kernels take fewer key/value heads: multi-query attention)."""
    q, k, v = inputs(B=2, H=4, S_q=5, S_k=6)
    if ON_GPU:
        torch = pytest.importorskip("torch")
        q, k, v = (torch.from_numpy(x).cuda() for x in (q, k, v))
        expand = lambda x, shape: x.expand(shape)  # noqa: E731
    else:
        expand = np.broadcast_to
    heads = expand(k[:, :1], k.shape), expand(v[:, :1], v.shape)
    with pytest.raises(ValueError, match=r"k has head stride 0: its 4 heads are one in "
                                         r"memory \(an expanded view\); pass k\[:, :1\]"):
        KERNELS[name](q, *heads)
    with pytest.raises(ValueError, match=r"q has batch stride 0: its 2 batches are one in "
                                         r"memory \(an expanded view\); copy it with "):
        KERNELS[name](expand(q[:1], q.shape), k, v)
    with pytest.raises(ValueError, match="v has row stride 0"):
        KERNELS[name](q, k, expand(v[:, :, :1], v.shape))


@sim_only
@pytest.mark.parametrize("name", sorted(STRIDED))
def test_strided_views_pass_the_checks(name):
    """Views of (B, S, H, D) storage, and k and v as the first rows of a longer cache
    with fewer heads (grouped), pass every check: in the simulator the call gets as far
    as the refusal to run CUDA C++ without a GPU."""
    storage = np.zeros((2, 7, 4, 64), np.float16)  # (B, S, H, D)
    cache = np.zeros((2, 2, 20, 64), np.float16)  # (B, H_kv, S_max, D)
    q = storage.transpose(0, 2, 1, 3)
    with pytest.raises(RuntimeError, match="runs on a GPU only"):
        KERNELS[name](q, cache[:, :, :7], cache[:, :, 3:10])


@ALL
def test_bad_scale_and_causal(name):
    q, k, v = inputs()
    with pytest.raises(ValueError, match="scale must be finite"):
        call(name, q, k, v, scale=float("nan"))
    with pytest.raises(TypeError, match="causal must be a bool"):
        call(name, q, k, v, causal="yes")
    with pytest.raises(TypeError, match="scale must be a number or None, got str"):
        call(name, q, k, v, scale="0.125")


@ALL
def test_bad_out(name):
    q, k, v = inputs()
    (out,) = to_device(np.empty((1, 2, 6, 64), np.float16))
    with pytest.raises(ValueError, match="out must be"):
        call(name, q, k, v, out=out)


@ALL
def test_not_an_array(name):
    q, k, v = inputs()
    with pytest.raises(TypeError, match="q must be an array"):
        KERNELS[name](q.tolist(), *to_device(k, v))


@gpu_only
@ALL
def test_host_array_on_gpu(name):
    q, k, v = inputs()
    with pytest.raises(TypeError, match="q is a host \\(NumPy\\) array"):
        KERNELS[name](q, *to_device(k, v))


class FakeDeviceArray:
    def __init__(self, a):
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": "<f2", "data": (0, False),
                                         "version": 3, "strides": None}


@sim_only
@ALL
def test_device_array_in_simulator(name):
    q, k, v = inputs()
    with pytest.raises(TypeError, match="k is a GPU array but kernels run in the simulator"):
        KERNELS[name](q, FakeDeviceArray(k), v)


def test_empty_sequence():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="empty input"):
        call("minimal_fused_attention", q[:, :, :0], k, v)


@ALL
def test_returns_output_of_input_library(name):
    """Without ``out`` the kernel allocates the output in the inputs' library
    (torch and CuPy on a GPU, NumPy in the simulator)."""
    import numpy as np

    from kernels.check import random_inputs, to_device, to_host
    from kernels.reference import reference_attention

    q, k, v, _ = random_inputs(1, 1, 5, 5, 64)
    if ON_GPU:
        torch = pytest.importorskip("torch")
        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
        out = KERNELS[name](tq, tk, tv)
        assert isinstance(out, torch.Tensor) and out.is_cuda and out.shape == tq.shape
        got = out.cpu().numpy()
        cupy = pytest.importorskip("cupy")
        out = KERNELS[name](*(cupy.asarray(x) for x in (q, k, v)))
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(out), got)
    elif name in GPU_ONLY:
        with pytest.raises(RuntimeError, match="runs on a GPU only"):
            KERNELS[name](*to_device(q, k, v))
        return
    else:
        out = KERNELS[name](*to_device(q, k, v))
        assert isinstance(out, np.ndarray)
        got = to_host(out)
    ref, _ = reference_attention(q, k, v)
    assert np.abs(got - ref).max() < 1e-2
