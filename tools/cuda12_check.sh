#!/usr/bin/env bash
# The CUDA 12 install path, checked without a GPU: a second environment (.venv-cu12)
# with the package's cu12 extra (NVVM, NVRTC, ptxas and headers of CUDA 12), in which
# every kernel of every chapter is compiled for sm_75 to sm_90 (Blackwell's sm_100 and
# sm_120 are checked with CUDA 13 alone, for the time CI takes) and held to the same
# compile tests as with CUDA 13 (no spills, shared memory that fits, refusals by name,
# the tensor-core instructions in the SASS). FA_CUDA_TOOLCHAIN makes the tests fail if
# the compilers they find are not CUDA 12's.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/venv.sh
venv cu12,test .venv-cu12
FA_CUDA_TOOLCHAIN=12 .venv-cu12/bin/python -m pytest -p no:cacheprovider "$@" \
  tests/test_compile_report.py tests/test_reader_gpus.py \
  tests/test_ch05_tensor_cores.py tests/test_ch06_mma_attention.py \
  tests/test_ch07_hopper_attention.py
