"""Warp-level functions: the simulator's (kernels.simulator) against a NumPy model,
and, on a GPU, the real instructions against the same model and against the
simulator itself, run in a subprocess on the same inputs.

Run as a script (``python tests/test_simulator.py SEED OUT.npz``) it writes the
outputs of every warp kernel for inputs drawn from SEED, in whatever mode
``FA_BOOK_MODE`` selects.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ON_GPU, gpu_only, sim_only
from numba import cuda

FULL = 0xFFFFFFFF
THREADS = 64  # two warps


@cuda.jit
def shuffles(x, out):
    t = cuda.threadIdx.x
    v = x[t]
    out[0, t] = cuda.shfl_sync(FULL, v, (t * 7 + 3) % 32)
    out[1, t] = cuda.shfl_up_sync(FULL, v, 3)
    out[2, t] = cuda.shfl_down_sync(FULL, v, 5)
    out[3, t] = cuda.shfl_xor_sync(FULL, v, 6)
    s = v
    offset = 16
    while offset > 0:  # butterfly: every lane ends with the warp's sum
        s += cuda.shfl_xor_sync(FULL, s, offset)
        offset //= 2
    out[4, t] = s
    half = 0x0000FFFF if t % 32 < 16 else 0xFFFF0000
    out[5, t] = cuda.shfl_down_sync(half, v, 2)


def shuffles_model(x):
    out = np.zeros((6, THREADS), np.float32)
    for w in range(THREADS // 32):
        xs = x[32 * w:32 * w + 32]
        lane = np.arange(32)
        out[0, 32 * w:32 * w + 32] = xs[((lane + 32 * w) * 7 + 3) % 32]
        out[1, 32 * w:32 * w + 32] = np.where(lane >= 3, xs[np.maximum(lane - 3, 0)], xs)
        out[2, 32 * w:32 * w + 32] = np.where(lane + 5 < 32, xs[np.minimum(lane + 5, 31)], xs)
        out[3, 32 * w:32 * w + 32] = xs[lane ^ 6]
        s = xs.copy()
        offset = 16
        while offset:
            s = (s + s[lane ^ offset]).astype(np.float32)
            offset //= 2
        out[4, 32 * w:32 * w + 32] = s
        # shfl_down by 2 within each half-warp: lanes 30, 31 keep their own value
        # (the source is past the warp); lanes 14, 15 would read lanes 16, 17,
        # outside their mask, which is undefined: the test skips those two
        out[5, 32 * w:32 * w + 32] = np.where(lane + 2 < 32, xs[np.minimum(lane + 2, 31)], xs)
    return out


def _defined_half_lanes():
    lanes = np.arange(THREADS) % 32
    return ~np.isin(lanes, (14, 15))


@cuda.jit
def votes(x, out):
    t = cuda.threadIdx.x
    p = x[t] > 0
    out[0, t] = cuda.ballot_sync(FULL, p)
    out[1, t] = cuda.all_sync(FULL, p) != 0
    out[2, t] = cuda.any_sync(FULL, p) != 0
    out[3, t] = cuda.all_sync(FULL, x[t] > -1000) != 0
    half = 0x0000FFFF if t % 32 < 16 else 0xFFFF0000
    out[4, t] = cuda.ballot_sync(half, p)
    cuda.syncwarp(FULL)
    out[5, t] = cuda.activemask()


def votes_model(x):
    out = np.zeros((6, THREADS), np.int64)
    for w in range(THREADS // 32):
        p = x[32 * w:32 * w + 32] > 0
        bits = sum(1 << i for i in range(32) if p[i])
        sl = slice(32 * w, 32 * w + 32)
        out[0, sl] = bits
        out[1, sl] = p.all()
        out[2, sl] = p.any()
        out[3, sl] = 1
        out[4, 32 * w:32 * w + 16] = bits & 0x0000FFFF
        out[4, 32 * w + 16:32 * w + 32] = bits & 0xFFFF0000
        out[5, sl] = FULL
    return out


def run(kernel, x, rows, dtype):
    out = np.zeros((rows, THREADS), dtype)
    if ON_GPU:
        dx, dout = cuda.to_device(x), cuda.to_device(out)
        kernel[1, THREADS](dx, dout)
        return dout.copy_to_host()
    kernel[1, THREADS](x, out)
    return out


@pytest.mark.parametrize("trial", range(3))
def test_shuffles_match_model(trial):
    x = np.random.default_rng().standard_normal(THREADS).astype(np.float32)
    got = run(shuffles, x, 6, np.float32)
    want = shuffles_model(x)
    np.testing.assert_array_equal(got[:5], want[:5])
    defined = _defined_half_lanes()
    np.testing.assert_array_equal(got[5][defined], want[5][defined])


@pytest.mark.parametrize("trial", range(3))
def test_votes_match_model(trial):
    x = np.random.default_rng().integers(-5, 5, THREADS).astype(np.int32)
    x[:32] = np.abs(x[:32]) + 1 if trial == 0 else x[:32]  # one all-true warp
    got = run(votes, x, 6, np.int64)
    np.testing.assert_array_equal(got & 0xFFFFFFFF, votes_model(x))


def run_all(seed: int) -> dict:
    """Every warp kernel on inputs drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    xf = rng.standard_normal(THREADS).astype(np.float32)
    xi = rng.integers(-5, 5, THREADS).astype(np.int32)
    return dict(xf=xf, xi=xi, shuffles=run(shuffles, xf, 6, np.float32),
                votes=run(votes, xi, 6, np.int64) & 0xFFFFFFFF)


@gpu_only
def test_simulator_matches_the_gpu_bit_for_bit(tmp_path):
    seed = int(np.random.default_rng().integers(1 << 31))
    gpu = run_all(seed)
    path = tmp_path / "sim.npz"
    here = Path(__file__).resolve().parent
    path_env = os.pathsep.join([str(here.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    subprocess.run([sys.executable, __file__, str(seed), str(path)], check=True, cwd=here,
                   env={**os.environ, "FA_BOOK_MODE": "sim", "PYTHONPATH": path_env})
    sim = np.load(path)
    defined = _defined_half_lanes()
    np.testing.assert_array_equal(sim["xf"], gpu["xf"])
    np.testing.assert_array_equal(sim["shuffles"][:5], gpu["shuffles"][:5])
    np.testing.assert_array_equal(sim["shuffles"][5][defined], gpu["shuffles"][5][defined])
    np.testing.assert_array_equal(sim["votes"], gpu["votes"])


@cuda.jit
def exits_early(x, out):
    t = cuda.threadIdx.x
    if t >= 20:
        return
    out[t] = cuda.shfl_down_sync(FULL, x[t], 1)


@cuda.jit
def wrong_mask(x, out):
    t = cuda.threadIdx.x
    out[t] = cuda.shfl_xor_sync(0x1, x[t], 1)


@cuda.jit
def reads_outside_mask(x, out):
    t = cuda.threadIdx.x
    if t < 16:
        out[t] = cuda.shfl_down_sync(0xFFFF, x[t], 4)


@cuda.jit
def barrier_after_early_exit(x, out):
    partial = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x
    if t >= 48:
        return  # exited threads do not hold up the barrier
    partial[t] = x[t]
    cuda.syncthreads()
    stride = 32
    while stride > 0:
        if t < stride and t + stride < 48:
            partial[t] += partial[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[0] = partial[0]


@cuda.jit
def raises_in_one_thread(x, out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    out[t + (1000 if t == 5 else 0)] = x[t]
    cuda.syncthreads()


@cuda.jit
def one_lane_late(x, out):
    t = cuda.threadIdx.x
    if t == 31:
        time.sleep(0.3)  # simulator only: the other lanes look for it several times
    out[t] = cuda.shfl_xor_sync(FULL, x[t], 1)


@cuda.jit
def raises_before_a_shuffle(x, out):
    t = cuda.threadIdx.x
    v = x[t + (1000 if t == 5 else 0)]
    out[t] = cuda.shfl_xor_sync(FULL, v, 1)


@sim_only
def test_a_lane_still_starting_is_not_taken_for_exited(monkeypatch):
    # A thread that has its ident but is not yet marked started has is_alive() False:
    # make every lane look so, as one did for a moment in a CI run that then failed
    from numba.cuda.simulator.kernel import BlockThread

    monkeypatch.setattr(BlockThread, "is_alive", lambda self: False)
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    one_lane_late[1, 32](x, out)
    np.testing.assert_array_equal(out, x[np.arange(32) ^ 1])


@sim_only
def test_an_error_before_a_shuffle_is_raised_not_the_wait():
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        raises_before_a_shuffle[1, 32](np.ones(32, np.float32), np.zeros(32, np.float32))


@sim_only
def test_lane_that_exited_is_named():
    from kernels.simulator import WarpDivergenceError

    x = np.ones(32, np.float32)
    with pytest.raises(WarpDivergenceError, match=r"lane\(s\) \[20, 21.*exited"):
        exits_early[1, 32](x, np.zeros(32, np.float32))


@sim_only
def test_mask_must_name_the_calling_lane():
    from kernels.simulator import WarpDivergenceError

    with pytest.raises(WarpDivergenceError, match="does not name the calling lane"):
        wrong_mask[1, 32](np.ones(32, np.float32), np.zeros(32, np.float32))


@sim_only
def test_reading_a_lane_outside_the_mask_gives_nan():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    reads_outside_mask[1, 32](x, out)
    np.testing.assert_array_equal(out[:12], x[4:16])
    assert np.isnan(out[12:16]).all()  # lanes 16-19 are not in the mask


@sim_only
def test_barrier_ignores_exited_threads():
    x = np.random.default_rng().standard_normal(64).astype(np.float32)
    out = np.zeros(1, np.float32)
    barrier_after_early_exit[1, 64](x, out)
    assert out[0] == pytest.approx(x[:48].sum(), rel=1e-5)


@sim_only
def test_an_error_in_one_thread_is_raised_not_hung():
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        raises_in_one_thread[1, 32](np.ones(32, np.float32), np.zeros(32, np.float32))


if __name__ == "__main__":
    np.savez(sys.argv[2], **run_all(int(sys.argv[1])))
