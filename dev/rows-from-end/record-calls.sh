#!/usr/bin/env bash
# A GPU's recording of branch rows-from-end-step (GPU: h100 or h200), in four device calls of
# under 600 s each, back to back on one machine of two GPUs (nvidia-h100-x2,
# nvidia-h200-x2). Each call: bash dev/rows-from-end/record-calls.sh GPU STEP;
# build/commit holds the commit recorded. Each step leaves its files in build/GPU (kept
# on a warm machine between calls) and copies them to $OUT; should the machine be lost
# between calls, copy the last call's files here into build/GPU and carry them with the
# next (carry [".whl", "build/commit", "build/GPU"]; the first call carries the first two
# only).
#   1 counted: the GPU suite on GPU 1 beside chapter 7's measurements (Nsight Compute's
#     counters, the what-ifs: named kernels, no lean call) on GPU 0        about 250 s
#   2 d64:     chapter 7's timings at head dim 64, alone                    about 410 s
#   3 rest:    chapter 7's timings at 96, 128, 256, alone; then chapter 8's layouts and
#              models through the lean call, which now reads all the new records  ~440 s
#   4 host:    llama, then training, alone                                  about 505 s
# Afterwards: cp $OUT/nvidia-GPU.json results/, and the freshness tests must pass.
set -uo pipefail
gpu=$1 step=$2
GPU=${gpu^^}
[ "$(nvidia-smi -L | grep -c "$GPU")" -ge 1 ] || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_GIT_COMMIT=$(cat build/commit)
B=build/$gpu; mkdir -p $B; results=results/nvidia-$gpu.json
touch $B/.step  # a call brings back at most 8 files from $OUT: only this step's go there
R="python3 -m kernels.record"
case $step in
counted)  # on a machine of one GPU, the suite first, then the counters: ~450 s
  other=1; [ "$(nvidia-smi -L | grep -c "$GPU")" -ge 2 ] || other=0
  (CUDA_VISIBLE_DEVICES=$other FA_BOOK_MODE=gpu python3 -c 'import subprocess,sys; from kernels.record import pytest_command; sys.exit(subprocess.call(pytest_command()))' > $B/gpu-tests.log 2>&1; echo $? > $B/tests.rc) &
  [ $other = 1 ] || wait
  CUDA_VISIBLE_DEVICES=0 $R --chapters 7 --measurements-only $results \
    --only hopper_attention --out $B/counted.json > $B/counted.log 2>&1; echo "counted rc=$?"
  wait; echo "tests rc=$(cat $B/tests.rc)"; tail -1 $B/gpu-tests.log ;;
d64)
  [ "$(cat $B/tests.rc)" = 0 ] || exit 5
  CUDA_VISIBLE_DEVICES=0 $R --chapters 7 --merge $results --head-dims 64 \
    --no-measurements --no-profile --tests-log $B/gpu-tests.log --out $B/d64.json \
    > $B/d64.log 2>&1; echo "d64 rc=$?"; grep "^wrote" $B/d64.log ;;
rest)
  CUDA_VISIBLE_DEVICES=0 $R --chapters 7 --merge $B/d64.json --head-dims 96 128 256 \
    --no-measurements --no-profile --tests-log $B/gpu-tests.log --out $B/timed.json \
    > $B/rest.log 2>&1; echo "rest rc=$?"; grep "^wrote" $B/rest.log
  B=$B results=$results python3 - <<'PY' || exit 6
import json
import os
from kernels import results
B = os.environ["B"]
timed, counted = (json.load(open(f"{B}/{n}.json")) for n in ("timed", "counted"))
timed["measurements"]["hopper_attention"] = counted["measurements"]["hopper_attention"]
results.save(timed, os.environ["results"])  # the lean call reads its records here
print("stale records:", results.stale(timed))
PY
  CUDA_VISIBLE_DEVICES=0 $R --chapters 8 --measurements-only $results \
    --only layouts models --out $B/measured.json > $B/measured.log 2>&1; echo "layouts models rc=$?"
  cp $B/measured.json $results ;;
host)
  cp $B/measured.json $results
  CUDA_VISIBLE_DEVICES=0 $R --chapters 8 --measurements-only $results \
    --only llama --out $B/llama.json > $B/llama.log 2>&1; echo "llama rc=$?"
  CUDA_VISIBLE_DEVICES=0 $R --chapters 9 --measurements-only $B/llama.json \
    --only training --out $B/nvidia-$gpu.json > $B/training.log 2>&1; echo "training rc=$?" ;;
*) echo "unknown step $step"; exit 2 ;;
esac
find $B -type f -newer $B/.step -exec cp {} $OUT/ \; ; true
