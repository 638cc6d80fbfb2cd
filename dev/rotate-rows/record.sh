#!/usr/bin/env bash
# The branch's remaining recording, in steps (one device call each, the machine kept warm):
#   bash dev/rotate-rows/record.sh tests models_llama   # chapter 7's GPU tests; chapter 8's models and llama
#   bash dev/rotate-rows/record.sh hopper               # chapter 7's what-ifs and counters
#   bash dev/rotate-rows/record.sh stage training       # FlashAttention-4's first wheels; chapter 9's training
#   bash dev/rotate-rows/record.sh fa4                  # FlashAttention-4 beside the lean call
# Each step writes its log and the results file under $OUT.
set -uo pipefail
[ -d /tmp/site/numpy ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_GIT_COMMIT=$(cat build/commit)
R=results/nvidia-h200.json
for step in "$@"; do
  t0=$SECONDS
  case $step in
    tests) python3 -m pytest -q -x tests/test_ch07_hopper_attention.py tests/test_ch07_protocol.py -p no:cacheprovider 2>&1 | tail -30 > $OUT/pytest_ch07.log; tail -3 $OUT/pytest_ch07.log ;;
    models_llama) python3 -m kernels.record --chapters 8 --measurements-only $R --only models llama 2>&1 | tee $OUT/models_llama.log | tail -5 ;;
    hopper) python3 -m kernels.record --chapters 7 --measurements-only $R --only hopper_attention 2>&1 | tee $OUT/hopper.log | tail -5 ;;
    training) python3 -m kernels.record --chapters 9 --measurements-only $R --only training 2>&1 | tee $OUT/training.log | tail -5 ;;
    stage) bash tools/peer_wheels.sh stage ;;
    fa4) bash tools/peer_wheels.sh install > /tmp/pp.txt && eval "$(tail -1 /tmp/pp.txt)" &&
         python3 -m kernels.record --chapters 7 --measurements-only $R --only flash_attention_4 2>&1 | tee $OUT/fa4.log | tail -8 ;;
  esac
  echo "== $step: $((SECONDS - t0)) s"
  cp $R $OUT/results_after_$step.json
done
