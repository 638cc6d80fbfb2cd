"""Tests run on a GPU when there is one, else in Numba's CUDA simulator.

``kernels`` is imported first so that it chooses the mode before numba.cuda loads.
"""

import kernels  # noqa: F401  (must precede any numba.cuda import)
import pytest

ON_GPU = kernels.MODE == "gpu"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
sim_only = pytest.mark.skipif(ON_GPU, reason="simulator behaviour")


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
