#!/usr/bin/env bash
# Everything the GPU must check and record, in one call (see CONTRIBUTING.md, "Recording GPU results").
#
# Runs the test suite on the GPU, measures the chip's ceilings, checks and times
# every kernel of every chapter against SDPA, counts bytes with Nsight Compute,
# and writes the results with their provenance. Extra arguments go to
# `python -m kernels.record` (e.g. --quick, --no-profile).
#
# Wheels in .whl/ (e.g. numpy<2.5, which numba-cuda 0.30 needs) are installed to
# /tmp/site first, for GPU machines without network access.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_wheels.sh
export PYTHONUNBUFFERED=1
if [ -n "${OUT:-}" ]; then  # a scratch machine: results come back through $OUT
  python3 -m kernels.record --out "$OUT/record.json" "$@" 2>&1 | tee "$OUT/record.log"
else
  python3 -m kernels.record "$@"
fi
