"""Chapter 2's kernels against the float64 reference."""

import pytest

from conftest import ON_GPU, SHAPES, shape_id
from kernels.check import check_attention
from kernels.chapters.ch02_loop_inversion import KERNELS

ALL = pytest.mark.parametrize("name", sorted(KERNELS))


@ALL
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_reference(name, shape):
    assert check_attention(KERNELS[name], *shape).ok


@ALL
def test_custom_scale(name):
    shape = (1, 2, 33, 40, 64, True) if ON_GPU else (1, 1, 5, 6, 16, True)
    check_attention(KERNELS[name], *shape, scale=0.3)


@ALL
def test_large_logits(name):
    """q and k scaled by 6: logits reach a few hundred."""
    shape = (1, 2, 300, 300, 64, True) if ON_GPU else (1, 1, 5, 37, 16, False)
    check_attention(KERNELS[name], *shape, std=6.0)
