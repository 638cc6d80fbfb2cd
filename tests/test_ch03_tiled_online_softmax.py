"""Chapter 3: the tiled online softmax, its logsumexp, its numerics and its variants."""

import numpy as np
import pytest

from conftest import ON_GPU, SHAPES, rows_that_see_no_key, shape_id
from kernels.check import check_attention, random_inputs
from kernels.reference import reference_attention
from kernels.chapters.ch02_loop_inversion import HEAD_DIMS
from kernels.chapters.ch03_tiled_online_softmax import (KERNELS, KEY_TILE, THREAD_TILES,
                                                        online_softmax_tile,
                                                        tiled_online_softmax)

#: the chapter's two kernels; the variants differ from one of them in one place
#: each, and in the simulator they are checked on fewer shapes
MAINS = ("tiled_online_softmax_row_lanes", "tiled_online_softmax")
VARIANT_SHAPES = SHAPES if ON_GPU else [SHAPES[3], SHAPES[4], SHAPES[-1]]


@pytest.mark.parametrize("name", MAINS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_reference_with_lse(name, shape):
    assert check_attention(KERNELS[name], *shape, lse=True).ok


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_thread_tiles_fit(D):
    """Every head dim's block layout divides evenly and fits in 48 KB of shared memory."""
    rows, keys, rows_per_thread, lanes = THREAD_TILES[D]
    threads = rows // rows_per_thread * lanes
    assert lanes & (lanes - 1) == 0 and lanes <= 32 and 32 % lanes == 0
    assert keys % lanes == 0 and D % lanes == 0 and keys % 4 == 0
    assert threads % D == 0 and keys % (threads // D) == 0  # the K/V copy
    shared = 4 * ((rows + 2 * keys) * (D + 4) + rows * (keys + 4))
    assert shared <= 48 * 1024


@pytest.mark.parametrize("name", sorted(set(KERNELS) - set(MAINS)))
@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=shape_id)
def test_variants_match_reference(name, shape):
    assert check_attention(KERNELS[name], *shape, lse=True).ok


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_large_logits(name):
    """q and k ~ N(0, 100): logits of several hundred, far past fp32 exp's range."""
    shape = (2, 4, 1024, 1024, 64, True) if ON_GPU else (1, 1, 9, 33, 64, False)
    q, k, _, _ = random_inputs(*shape[:5], std=10.0, seed=1)
    logits = q[0, 0].astype(np.float64) @ k[0, 0].astype(np.float64).T / np.sqrt(shape[4])
    assert np.abs(logits).max() > 200
    check_attention(KERNELS[name], *shape, std=10.0, lse=True)


@pytest.mark.parametrize("name", MAINS)
def test_custom_scale(name):
    shape = (1, 2, 33, 40, 128, True) if ON_GPU else (1, 1, 5, 6, 16, True)
    check_attention(KERNELS[name], *shape, scale=0.3, lse=True)


@pytest.mark.parametrize("name", MAINS)
def test_rows_that_see_no_key_give_zero_and_minus_inf(name):
    rows_that_see_no_key(KERNELS[name], *((300, 129, 64) if ON_GPU else (9, 4, 16)))


def test_return_lse_gives_output_and_lse_in_the_inputs_library():
    q, k, v, _ = random_inputs(1, 1, 5, 7, 64)
    if ON_GPU:
        torch = pytest.importorskip("torch")
        out, lse = tiled_online_softmax(*(torch.from_numpy(x).cuda() for x in (q, k, v)),
                                        return_lse=True)
        assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
        out, lse = out.cpu().numpy(), lse.cpu().numpy()
    else:
        out, lse = tiled_online_softmax(q, k, v, return_lse=True)
    ref_out, ref_lse = reference_attention(q, k, v)
    assert lse.shape == (1, 1, 5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    assert np.abs(out - ref_out).max() < 1e-2


def test_lse_argument_is_checked():
    q, k, v, _ = random_inputs(1, 1, 5, 7, 16)
    bad = np.zeros((1, 1, 6), np.float32)
    if ON_GPU:
        pytest.skip("shape checks are the same on the GPU (tests/test_api.py)")
    with pytest.raises(ValueError, match=r"lse must be a C-contiguous \(1, 1, 5\) float32"):
        tiled_online_softmax(q, k, v, lse=bad)


def test_unguarded_update_gives_nan_guarded_does_not():
    """exp(-inf - (-inf)): a first tile in which a row sees no key."""
    masked = np.full(KEY_TILE, -np.inf, np.float32)
    v = np.ones((KEY_TILE, 4), np.float32)
    start = (np.float32(-np.inf), np.float32(0), np.zeros(4, np.float32))
    with np.errstate(invalid="ignore"):
        _, l, acc = online_softmax_tile(*start, masked, v, guard=False)
    assert np.isnan(l) and np.isnan(acc).all()
    m, l, acc = online_softmax_tile(*start, masked, v)
    assert m == -np.inf and l == 0 and (acc == 0).all()


def test_tiles_of_the_update_give_the_softmax():
    rng = np.random.default_rng(0)
    s = rng.standard_normal(3 * KEY_TILE) * 20  # base-2 scores
    s[:KEY_TILE] = -np.inf  # a first tile wholly masked
    v = rng.standard_normal((3 * KEY_TILE, 4))
    state = (-np.inf, 0.0, np.zeros(4))
    for t in range(3):
        state = online_softmax_tile(*state, s[t * KEY_TILE:(t + 1) * KEY_TILE],
                                    v[t * KEY_TILE:(t + 1) * KEY_TILE])
    m, l, acc = state
    p = np.exp2(s - s.max())
    np.testing.assert_allclose(acc / l, p @ v / p.sum(), rtol=1e-12)
    np.testing.assert_allclose(m + np.log2(l), np.log2(np.exp2(s - s.max()).sum()) + s.max())
