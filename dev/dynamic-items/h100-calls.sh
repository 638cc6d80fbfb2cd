#!/usr/bin/env bash
# The H100's recording of branch dynamic-items, in four device calls of under 600 s
# each, back to back on one nvidia-h100-x2 machine (the H200 was recorded at 7c325ed in
# the same steps, one after another on one H200). Each call: bash
# dev/dynamic-items/h100-calls.sh STEP; build/commit holds the commit recorded. Each step
# leaves its files in build/h100 and copies them to $OUT; copied here into build/h100
# after each call, they travel with the next (carry [".whl", "build/commit",
# "build/h100"]; the first call carries the first two only).
#   1 counted: the GPU suite on GPU 1 beside chapter 7's measurements (Nsight Compute's
#     counters, the what-ifs: named kernels, no lean call) on GPU 0        about 250 s
#   2 d64:     chapter 7's timings at head dim 64, alone                    about 410 s
#   3 rest:    chapter 7's timings at 96, 128, 256, alone; then chapter 8's layouts and
#              models through the lean call, which now reads all the new records  ~440 s
#   4 host:    llama, then training, alone                                  about 505 s
# Afterwards: cp $OUT/nvidia-h100.json results/, and the freshness tests must pass.
set -uo pipefail
step=$1
[ "$(nvidia-smi -L | grep -c 'H100')" -ge 1 ] || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_GIT_COMMIT=$(cat build/commit)
B=build/h100; mkdir -p $B
R="python3 -m kernels.record"
case $step in
counted)  # on one H100 (nvidia-h100-x1), the suite first, then the counters: ~450 s
  other=1; [ "$(nvidia-smi -L | grep -c 'H100')" -ge 2 ] || other=0
  (CUDA_VISIBLE_DEVICES=$other FA_BOOK_MODE=gpu python3 -c 'import subprocess,sys; from kernels.record import pytest_command; sys.exit(subprocess.call(pytest_command()))' > $B/gpu-tests.log 2>&1; echo $? > $B/tests.rc) &
  [ $other = 1 ] || wait
  CUDA_VISIBLE_DEVICES=0 $R --chapters 7 --measurements-only results/nvidia-h100.json \
    --only hopper_attention --out $B/counted.json > $B/counted.log 2>&1; echo "counted rc=$?"
  wait; echo "tests rc=$(cat $B/tests.rc)"; tail -1 $B/gpu-tests.log ;;
d64)
  [ "$(cat $B/tests.rc)" = 0 ] || exit 5
  CUDA_VISIBLE_DEVICES=0 $R --chapters 7 --merge results/nvidia-h100.json --head-dims 64 \
    --no-measurements --no-profile --tests-log $B/gpu-tests.log --out $B/d64.json \
    > $B/d64.log 2>&1; echo "d64 rc=$?"; grep "^wrote" $B/d64.log ;;
rest)
  CUDA_VISIBLE_DEVICES=0 $R --chapters 7 --merge $B/d64.json --head-dims 96 128 256 \
    --no-measurements --no-profile --tests-log $B/gpu-tests.log --out $B/timed.json \
    > $B/rest.log 2>&1; echo "rest rc=$?"; grep "^wrote" $B/rest.log
  python3 - <<'PY' || exit 6
import json
from kernels import results
timed, counted = (json.load(open(f"build/h100/{n}.json")) for n in ("timed", "counted"))
timed["measurements"]["hopper_attention"] = counted["measurements"]["hopper_attention"]
results.save(timed, "results/nvidia-h100.json")  # the lean call reads its records here
print("stale records:", results.stale(timed))
PY
  CUDA_VISIBLE_DEVICES=0 $R --chapters 8 --measurements-only results/nvidia-h100.json \
    --only layouts models --out $B/measured.json > $B/measured.log 2>&1; echo "layouts models rc=$?"
  cp $B/measured.json results/nvidia-h100.json ;;
host)
  cp $B/measured.json results/nvidia-h100.json
  CUDA_VISIBLE_DEVICES=0 $R --chapters 8 --measurements-only results/nvidia-h100.json \
    --only llama --out $B/llama.json > $B/llama.log 2>&1; echo "llama rc=$?"
  CUDA_VISIBLE_DEVICES=0 $R --chapters 9 --measurements-only $B/llama.json \
    --only training --out $B/nvidia-h100.json > $B/training.log 2>&1; echo "training rc=$?"
  cp $B/nvidia-h100.json $OUT/ ;;
*) echo "unknown step $step"; exit 2 ;;
esac
cp $B/* $OUT/ 2>/dev/null; true
