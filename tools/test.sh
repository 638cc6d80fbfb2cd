#!/usr/bin/env bash
# Set up (a .venv with the test dependencies) and run the tests. Without a GPU
# the kernels run in Numba's CUDA simulator; on a GPU they run for real.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/venv.sh
venv cu13,test
.venv/bin/python -m pytest "$@"
