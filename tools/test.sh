#!/usr/bin/env bash
# Set up (a .venv with the test dependencies) and run the tests. Without a GPU
# the kernels run in Numba's CUDA simulator; on a GPU they run for real.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python -m pytest "$@"
