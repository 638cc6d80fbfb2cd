"""Mode selection: automatic, overridable by FA_BOOK_MODE, refused when too late."""

import os
import subprocess
import sys

import kernels
from conftest import ON_GPU
from kernels.mode import gpu_available


def run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env})


def test_auto_mode_follows_the_driver():
    assert kernels.MODE == ("gpu" if gpu_available() else "sim") or \
        os.environ.get("FA_BOOK_MODE", "auto") != "auto"
    assert kernels.describe().startswith(f"mode: {kernels.MODE}")


def test_override_to_simulator_and_compile():
    p = run("import kernels; print(kernels.MODE, kernels.SIMULATED)", FA_BOOK_MODE="sim")
    assert p.stdout.split() == ["sim", "True"], p.stderr
    p = run("import kernels; print(kernels.MODE, kernels.SIMULATED)", FA_BOOK_MODE="compile")
    assert p.stdout.split() == ["compile", "False"], p.stderr


def test_unknown_mode_is_refused():
    p = run("import kernels", FA_BOOK_MODE="tpu")
    assert p.returncode != 0 and "FA_BOOK_MODE='tpu': expected one of" in p.stderr


def test_too_late_to_choose():
    mode = "sim" if ON_GPU else "compile"  # the opposite of what numba.cuda loaded as
    p = run("import numba.cuda; import kernels", FA_BOOK_MODE=mode,
            NUMBA_ENABLE_CUDASIM="0" if mode == "sim" else "1")
    assert p.returncode != 0 and "numba.cuda was imported before kernels" in p.stderr
