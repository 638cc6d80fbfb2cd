"""Chapter 1's kernels against the float64 reference."""

import pytest

from conftest import ON_GPU
from kernels.check import check_attention
from kernels.naive_attention import KERNELS

# (B, H, S_q, S_k, D, causal): ragged lengths, one token, S_q != S_k both ways
# (with S_q > S_k causal rows that see no key), in sizes the simulator can afford.
SIM_SHAPES = [
    (1, 1, 1, 1, 16, False),
    (1, 1, 1, 1, 16, True),
    (1, 2, 13, 13, 16, False),
    (1, 2, 13, 13, 16, True),
    (2, 1, 9, 4, 16, True),
    (1, 1, 4, 11, 32, True),
    (1, 1, 3, 7, 32, False),
    (1, 1, 6, 6, 64, True),
]
GPU_SHAPES = [
    (1, 1, 1, 1, 64, False),
    (1, 1, 1, 1, 128, True),
    (2, 3, 257, 257, 64, False),
    (2, 3, 257, 257, 64, True),
    (1, 4, 300, 129, 64, True),
    (1, 4, 129, 300, 128, True),
    (1, 2, 77, 1000, 128, False),
    (4, 8, 1024, 1024, 64, True),
    (2, 16, 2048, 2048, 128, False),
]


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("shape", GPU_SHAPES if ON_GPU else SIM_SHAPES,
                         ids=lambda s: "x".join(map(str, s[:5])) + ("-causal" if s[5] else ""))
def test_matches_reference(name, shape):
    result = check_attention(KERNELS[name], *shape)
    assert result.ok and result.rel_err < 2e-3


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_custom_scale(name):
    shape = (1, 2, 33, 40, 64, True) if ON_GPU else (1, 1, 5, 6, 16, True)
    check_attention(KERNELS[name], *shape, scale=0.3)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_large_logits(name):
    """q and k scaled by 4: logits reach about 16^2 / sqrt(D), far beyond exp's range."""
    shape = (1, 2, 64, 64, 64, False) if ON_GPU else (1, 1, 5, 6, 16, False)
    check_attention(KERNELS[name], *shape, std=4.0)


@pytest.mark.parametrize("name", sorted(KERNELS))
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
    else:
        out = KERNELS[name](*to_device(q, k, v))
        assert isinstance(out, np.ndarray)
        got = to_host(out)
    ref, _ = reference_attention(q, k, v)
    assert np.abs(got - ref).max() < 1e-2
