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
