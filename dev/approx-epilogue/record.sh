#!/usr/bin/env bash
# The branch's recording, in steps (one device call a line, the machine kept warm):
#   bash dev/approx-epilogue/record.sh tests d64    # chapter 7's GPU tests; its timings at D = 64
#   bash dev/approx-epilogue/record.sh wide layouts # its timings at D = 96, 128, 256; chapter 8's layouts
#   bash dev/approx-epilogue/record.sh hopper models_llama
#   bash dev/approx-epilogue/record.sh stage training   # FlashAttention-4's first wheels; chapter 9's training
#   bash dev/approx-epilogue/record.sh fa4              # FlashAttention-4 beside the lean call
# The timings take the GPU tests' summary from the log the tests step wrote (kept here
# once fetched: dev/approx-epilogue/pytest_ch07.log).
# Each step writes its log and the results file under $OUT.
set -uo pipefail
[ -d /tmp/site/numpy ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_GIT_COMMIT=$(cat build/commit)
R=results/nvidia-h200.json
LOG=dev/approx-epilogue/pytest_ch07.log; [ -f $LOG ] || LOG=$OUT/pytest_ch07.log
TIMINGS="python3 -m kernels.record --chapters 7 --merge $R --out $R --tests-log $LOG --no-measurements --no-profile"
for step in "$@"; do
  t0=$SECONDS
  case $step in
    tests) python3 -m pytest -q -x tests/test_ch07_hopper_attention.py tests/test_ch07_protocol.py -p no:cacheprovider 2>&1 | tail -30 > $OUT/pytest_ch07.log; tail -3 $OUT/pytest_ch07.log ;;
    d64) $TIMINGS --head-dims 64 2>&1 | tee $OUT/record_d64.log | tail -3 ;;
    wide) $TIMINGS --head-dims 96 128 256 2>&1 | tee $OUT/record_wide.log | tail -3 ;;
    layouts) python3 -m kernels.record --chapters 8 --measurements-only $R --only layouts 2>&1 | tee $OUT/layouts.log | tail -5 ;;
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
