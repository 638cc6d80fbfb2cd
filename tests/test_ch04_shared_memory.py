"""Chapter 4: shared-memory layouts, fp16 tiles, larger thread tiles, the 48 KB budget."""

import numpy as np
import pytest

from conftest import ON_GPU, SHAPES, rows_that_see_no_key, shape_id
from kernels.check import check_attention, random_inputs, to_device
from kernels.chapters.ch02_loop_inversion import HEAD_DIMS
from kernels.chapters.ch04_shared_memory import (FP32_TILES, KERNELS, LAYOUTS,
                                                 SHARED_LIMIT, SHARED_TILES, TILE_SWEEP,
                                                 ThreadTiles, check_tiles, launch_shared,
                                                 shared_bytes, shared_memory_attention,
                                                 shared_memory_kernel, tile_stride)
from kernels.chapters.ch03_tiled_online_softmax import THREAD_TILES

MAIN = "shared_memory_attention"
SWEEP = set(TILE_SWEEP)  # D = 64 only
VARIANT_SHAPES = SHAPES if ON_GPU else [SHAPES[3], SHAPES[4], SHAPES[-1]]
D64_SHAPES = [s for s in SHAPES if s[4] == 64]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_main_kernel_matches_reference_with_lse(shape):
    assert check_attention(KERNELS[MAIN], *shape, lse=True).ok


@pytest.mark.parametrize("name", sorted(set(KERNELS) - {MAIN} - SWEEP))
@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=shape_id)
def test_steps_match_reference(name, shape):
    assert check_attention(KERNELS[name], *shape, lse=True).ok


@pytest.mark.parametrize("name", sorted(SWEEP))
@pytest.mark.parametrize("shape", D64_SHAPES, ids=shape_id)
def test_sweep_matches_reference(name, shape):
    assert check_attention(KERNELS[name], *shape, lse=True).ok


def test_several_row_blocks_and_key_tiles():
    """More rows than a block and more keys than a tile, ragged, causal, S_q < S_k."""
    shape = (1, 2, 1000, 1337, 64, True) if ON_GPU else (1, 1, 70, 75, 16, True)
    for name in (MAIN, "shared_memory_prefetch", "shared_memory_swizzled"):
        assert check_attention(KERNELS[name], *shape, lse=True).ok


def test_large_logits():
    shape = (2, 4, 1024, 1024, 64, True) if ON_GPU else (1, 1, 9, 33, 64, False)
    assert check_attention(KERNELS[MAIN], *shape, std=10.0, lse=True).ok


def test_rows_that_see_no_key_give_zero_and_minus_inf():
    rows_that_see_no_key(shared_memory_attention, *((300, 129, 64) if ON_GPU else (9, 4, 16)))


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_chapter_tiles_divide_and_fit(D):
    for tiles, fp16 in ((SHARED_TILES[D], True), (FP32_TILES[D], False),
                        (THREAD_TILES[D], False), (THREAD_TILES[D], True)):
        check_tiles(D, tiles, fp16)
        assert shared_bytes(D, tiles, fp16_tiles=fp16) <= SHARED_LIMIT
    for tiles in TILE_SWEEP.values():
        check_tiles(64, tiles, True)
        assert shared_bytes(64, tiles, fp16_tiles=True) <= SHARED_LIMIT


def test_bad_tiles_and_layouts_are_refused():
    with pytest.raises(ValueError, match="lanes_per_row=3"):
        check_tiles(64, ThreadTiles(64, 30, 4, 3))
    with pytest.raises(ValueError, match="multiple of rows_per_thread"):
        check_tiles(64, ThreadTiles(62, 32, 4, 8))
    with pytest.raises(ValueError, match="swizzled"):
        shared_memory_kernel(64, SHARED_TILES[64], layout="swizzled", fp16_tiles=True)
    with pytest.raises(ValueError, match="layout"):
        shared_memory_kernel(64, SHARED_TILES[64], layout="diagonal")


def test_the_48_kb_budget_is_checked_before_launch():
    """fp32 4 x 4 tiles at D = 128 need 75 KB: the launcher says so."""
    q, k, v, _ = random_inputs(1, 1, 4, 4, 128)
    with pytest.raises(ValueError, match=f"at most {SHARED_LIMIT}"):
        launch_shared(*to_device(q, k, v), False, None, None, None, False, name="too_big",
                      tiles={128: ThreadTiles(64, 32, 4, 8)})


def test_padding_is_16_bytes_in_either_dtype():
    for D in HEAD_DIMS:
        assert (tile_stride(D, "padded") - D) * 4 == 16
        assert (tile_stride(D, "padded", fp16_tiles=True) - D) * 2 == 16
        assert tile_stride(D, "unpadded") == tile_stride(D, "swizzled") == D
    assert set(LAYOUTS) == {"padded", "unpadded", "swizzled"}
