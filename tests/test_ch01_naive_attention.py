"""Chapter 1's kernels against the float64 reference."""

import pytest

from conftest import ON_GPU, SHAPES, shape_id
from kernels.check import check_attention
from kernels.chapters.ch01_naive_attention import KERNELS


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
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
