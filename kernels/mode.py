"""Where the kernels run: on a GPU, or in Numba's CUDA simulator on the CPU.

The choice must be made before ``numba.cuda`` is first imported, because the
simulator replaces the whole module; importing ``kernels`` makes it. The
environment variable ``FA_BOOK_MODE`` overrides the automatic choice:

- ``auto`` (default): ``gpu`` when the CUDA driver reports a device, else ``sim``;
- ``gpu``: real kernels on the GPU;
- ``sim``: Numba's CUDA simulator (one Python thread per CUDA thread: tiny sizes
  only), with the warp-level functions of :mod:`kernels.simulator` added;
- ``compile``: real ``numba.cuda`` without touching a device, for compiling to
  PTX and machine code on a machine with no GPU (see :mod:`kernels.compile_report`).
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "FA_BOOK_MODE"
MODES = ("auto", "gpu", "sim", "compile")


def gpu_available() -> bool:
    """True when the CUDA driver loads and reports at least one device."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 \
            and count.value > 0
    return False


def _select() -> str:
    requested = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if requested not in MODES:
        raise ValueError(f"{ENV}={requested!r}: expected one of {', '.join(MODES)}")
    mode = requested
    if mode == "auto":
        mode = "gpu" if gpu_available() else "sim"
    simulate = mode == "sim"
    if "numba.cuda" in sys.modules:
        from numba.cuda.core import config

        if bool(config.ENABLE_CUDASIM) != simulate:
            raise RuntimeError(
                f"numba.cuda was imported before kernels chose mode {mode!r}; "
                "import kernels first (or set NUMBA_ENABLE_CUDASIM to match)"
            )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if simulate else "0"
    if simulate:
        from . import simulator

        simulator.install()
    return mode


#: "gpu", "sim" or "compile"
MODE: str = _select()
SIMULATED: bool = MODE == "sim"


def device_name() -> str | None:
    """The name of the GPU kernels run on (None without one)."""
    if MODE != "gpu":
        return None
    from numba import cuda

    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else name


def describe() -> str:
    """One line saying what produced the output that follows."""
    if MODE == "gpu":
        from numba import cuda

        cc = ".".join(map(str, cuda.get_current_device().compute_capability))
        return f"mode: gpu ({device_name()}, compute capability {cc}); timings are live"
    if MODE == "sim":
        return ("mode: sim (Numba's CUDA simulator on the CPU, tiny shapes); "
                "GPU figures below come from recorded results")
    return "mode: compile (numba.cuda without a device: compile reports only)"
