#!/usr/bin/env bash
# Does a process that graphs the model and profiles its generation abort at exit, and
# does TEARDOWN_CUPTI=0 stop it? Runs a short models.model_measurements() N times with
# and N times without it, alternating, and prints each exit status.
#   bash dev/exit-abort/repro.sh 8
set -u
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
logs=${OUT:-/tmp}/exit-abort
mkdir -p "$logs"
for i in $(seq "${1:-8}"); do
  for teardown in default 0; do
    start=$(date +%s)
    if [ $teardown = 0 ]; then export TEARDOWN_CUPTI=0; else unset TEARDOWN_CUPTI; fi
    python3 -c "from kernels import models; models.model_measurements(batches=(1,), steps=8)" \
      >"$logs/$i-$teardown.log" 2>&1
    rc=$?
    echo "run $i TEARDOWN_CUPTI=$teardown rc=$rc $(( $(date +%s) - start ))s $(grep -m1 -E 'free|corrupt|Error' "$logs/$i-$teardown.log" | cut -c1-100)"
  done
done
