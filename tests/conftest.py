"""Tests run on a GPU when there is one, else in Numba's CUDA simulator.

``kernels`` is imported first so that it chooses the mode before numba.cuda loads.
"""

import functools

import kernels  # noqa: F401  (must precede any numba.cuda import)
import pytest

ON_GPU = kernels.MODE == "gpu"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
sim_only = pytest.mark.skipif(ON_GPU, reason="simulator behaviour")

#: builds whose local memory is touched inside their main loop, by the major version of
#: the CUDA toolchain that compiled them; the compile tests ask for exactly these (of
#: the builds they compile). Reading rows at strides known only at run time (chapter 6's
#: "Where the rows are") costs registers that two of the sweep's variants (8 warps,
#: 4 stages, at D = 128 on sm_80) do not have with either toolchain, nor two steps with
#: CUDA 13's ptxas: they keep one or a few values in local memory and reload them once a
#: key tile. (Builds that keep 8 bytes in a cold divergent-shuffle subroutine, which
#: a converged warp never runs, are allowed and not listed.)
_SWEEP_ON_SM80 = {("fa2_8_warps D=128 float16", "sm_80"), ("fa2_stages_4 D=128 float16", "sm_80")}
#: chapter 9's backward at D = 128, whose dK and dV accumulators take 128 registers a
#: thread: its dK/dV kernel at 255 registers keeps 8 to 32 bytes in local memory in the
#: atomic step (which adds dQ's product) on every architecture. On sm_86 and sm_89 that
#: step's D = 128 block does not fit (``mma_step``): those builds are compiled,
#: never launched.
_BACKWARD_AT_255 = {(f"mma_backward atomic_dq D=128 {dtype}", arch)
                    for dtype in ("float16", "bfloat16")
                    for arch in ("sm_80", "sm_86", "sm_89", "sm_90")}
#: builds whose local memory differs between releases of one major version: the
#: separate step's D = 128 dK/dV kernel on sm_90 keeps 8 bytes there with ptxas 12.9
#: and 13.0, none with 13.5. The compile tests take them either way.
TOOLCHAIN_DEPENDENT = {(f"mma_backward separate_dq D=128 {dtype}", "sm_90")
                       for dtype in ("float16", "bfloat16")}
#: Blackwell's builds of chapters 5, 6 and 8 (CUDA 13.5): five of their steps and three
#: of chapter 6's sweep variants keep 8 to 24 bytes in local memory on sm_100 or sm_120,
#: as the sweep's do on sm_80 and a few steps on sm_86 to sm_90; chapter 8's tensor-core
#: decoding kernel at D = 256, at 255 registers on every architecture, keeps 40 bytes
#: there on both (and none on sm_80 to sm_90; on sm_120 its tiles do not fit a block: it
#: is compiled, never launched). (CUDA 12's Blackwell builds, from 12.8, are not known
#: here: cuda12_check.sh says which.)
_ON_BLACKWELL = {("wmma_four_warps D=128 float16", "sm_120"),
                 ("wmma_two_row_tiles D=128 float16", "sm_120"),
                 ("mma_fragments D=128 float16", "sm_120"),
                 ("mma_two_row_tiles D=128 float16", "sm_120"),
                 ("mma_lane_offsets D=128 float16", "sm_100"),
                 ("fa2_8_warps D=128 float16", "sm_100"), ("fa2_stages_4 D=128 float16", "sm_100"),
                 ("fa2_8_warps_16_rows D=64 float16", "sm_100"),
                 ("fa2_8_warps_16_rows D=64 float16", "sm_120"),
                 ("split_keys_mma D=256 float16", "sm_100"),
                 ("split_keys_mma D=256 float16", "sm_120")}
HOT_LOCAL_MEMORY = {
    12: _SWEEP_ON_SM80 | _BACKWARD_AT_255,
    13: _SWEEP_ON_SM80 | _BACKWARD_AT_255 | _ON_BLACKWELL | {
        ("mma_unpadded D=64 float16", "sm_86"), ("mma_unpadded D=64 float16", "sm_89"),
        ("mma_two_row_tiles D=128 float16", "sm_90")},
}


@functools.cache
def toolchain_major() -> int:
    """The major version of the CUDA toolchain the compile tests use (12 or 13)."""
    from kernels import compile_report

    return int(compile_report.toolchain()["ptxas"].split(".")[0])


def pytest_report_header(config):
    return kernels.describe() if kernels.MODE != "gpu" else f"kernels mode: {kernels.MODE}"


# (B, H, S_q, S_k, D, causal) for every kernel: ragged lengths, one token, S_q != S_k
# both ways (with S_q > S_k, causal rows that see no key), more rows than one block
# and more keys than one tile, in sizes the simulator can afford.
SIM_SHAPES = [
    (1, 1, 1, 1, 16, False),
    (1, 1, 1, 1, 16, True),
    (1, 2, 13, 13, 16, False),
    (1, 2, 13, 13, 16, True),
    (2, 1, 9, 4, 16, True),
    (1, 1, 4, 11, 32, True),
    (1, 1, 3, 7, 32, False),
    (1, 1, 6, 6, 64, True),
    (1, 1, 37, 41, 16, True),
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
SHAPES = GPU_SHAPES if ON_GPU else SIM_SHAPES


def shape_id(s):
    return "x".join(map(str, s[:5])) + ("-causal" if s[5] else "")


# Checks that every chapter's GPU-only kernels share (chapters 5 and 6). Each raises on
# failure; the chapters' tests call them with their own kernels.

def growing_scores(D, growth, dtype):
    """q, k, v (torch, on the GPU) whose every row's maximum score rises along the keys,
    by 4 * growth * scale a key: fast enough to move a row's maximum by more than 8
    (base 2) every tile at growth 0.5, slowly at 0.05. Shape (1, 2, 200 rows, 1000 keys)."""
    import numpy as np
    import torch

    from kernels.check import random_inputs

    q, k, v, _ = random_inputs(1, 2, 200, 1000, D, dtype=np.float32)
    q[..., 0] = 4.0
    k[..., 0] = growth * np.arange(1000)
    return [torch.from_numpy(x).cuda().to(getattr(torch, dtype)) for x in (q, k, v)]


def rows_that_see_no_key(attention, S_q=300, S_k=129, D=64):
    """Causal with S_q > S_k, bottom-right aligned: the first S_q - S_k rows see no
    key, and get 0 and -inf; the others a finite logsumexp."""
    import numpy as np

    from kernels.check import random_inputs, to_device, to_host
    from kernels.reference import reference_attention

    q, k, v, _ = random_inputs(1, 2, S_q, S_k, D)
    out, lse = attention(*to_device(q, k, v), causal=True, return_lse=True)
    out, lse = to_host(out), to_host(lse)
    empty = S_q - S_k
    assert np.all(out[:, :, :empty] == 0) and np.all(np.isneginf(lse[:, :, :empty]))
    assert np.all(np.isfinite(lse[:, :, empty:]))
    _, ref = reference_attention(q, k, v, causal=True)
    # atol too: row `empty` sees one key, and its logsumexp (that one score) may be near 0
    np.testing.assert_allclose(lse[:, :, empty:], ref[:, :, empty:], rtol=1e-5, atol=1e-5)


def array_libraries(attention):
    """fp16 torch tensors, CuPy arrays and Numba device arrays; bf16 torch tensors."""
    import numpy as np
    import torch
    import cupy

    from kernels.check import random_inputs, to_device, to_host
    from kernels.reference import reference_attention

    q, k, v, _ = random_inputs(1, 2, 70, 70, 64)
    ref, _ = reference_attention(q, k, v)
    for arrays in ([torch.from_numpy(x).cuda() for x in (q, k, v)],
                   [cupy.asarray(x) for x in (q, k, v)], list(to_device(q, k, v))):
        got = to_host(attention(*arrays))
        assert np.abs(got.astype(np.float64) - ref).max() < 1e-2
    out = attention(*(torch.from_numpy(x).cuda().bfloat16() for x in (q, k, v)))
    assert out.dtype == torch.bfloat16
    assert np.abs(out.double().cpu().numpy() - ref).max() < 8e-2


def refuses_misaligned_views_and_too_many_heads(attention, launch, alignment=32):
    """A view half ``alignment`` bytes past an aligned start (32: the wide loads of
    chapter 5; 16: the copies of the kernels that take strides), and B * H past the
    grid's 65535 in y; ``launch(q, k, v)`` launches without allocating the (large)
    output first."""
    import torch

    skip = alignment // 4  # elements: half the alignment
    x = torch.randn(2 * 64 * 64 + skip, device="cuda", dtype=torch.float16)
    q = x[skip:].view(1, 2, 64, 64)  # contiguous, but half the alignment past its start
    k = v = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match=f"not a multiple of {alignment} bytes"):
        attention(q, k, v)
    big = torch.zeros(65536, 1, 1, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="at most 65535"):
        launch(big, big, big)
