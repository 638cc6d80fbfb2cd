#!/usr/bin/env bash
# Which of the book's kernels, a CUDA graph and torch's profiler the abort at exit needs:
# each variant (of variant.py, or VARIANTS) run N times in a fresh process, taking turns,
# and the exit statuses counted. The environment passes through: TEARDOWN_CUPTI=0, or
# LD_PRELOAD of stack_at_signal.so for the native stack (no gdb on the GPU machine).
#   bash dev/exit-abort/narrow.sh 6
#   TEARDOWN_CUPTI=0 VARIANTS=measurements bash dev/exit-abort/narrow.sh 8
set -u
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
logs=${OUT:-/tmp}/narrow
mkdir -p "$logs"
# VARIANTS="measurements book_profile6": words joined by _ (measurements: chapter 8's,
# shortened; measurements_forward, measurements_generation: its two halves;
# measurements_generation_unprofiled: the second, step_device_ms not run;
# training_kernel_times: chapter 9's profiled step, GPT-2-shaped)
py() { timeout 180 python3 "$@"; }  # 124: it hung (a handler on a corrupt heap can)
IFS=' ' read -r -a variants <<< "${VARIANTS:-}"
[ ${#variants[@]} -gt 0 ] || variants=(book_graph_profile book_profile book_graph sdpa_graph_profile book)
for i in $(seq "${1:-6}"); do
  for v in "${variants[@]}"; do
    start=$(date +%s)
    if [ "$v" = measurements ]; then
      py -c "from kernels import models; models.model_measurements(batches=(1,), steps=8)"
    elif [ "$v" = measurements_forward ]; then  # without the generation
      py -c "from kernels import models; models._generation = lambda *a, **k: {}; models.model_measurements(batches=(1,), steps=8)"
    elif [ "$v" = measurements_generation ]; then  # without the forward at batch 1
      py -c "from kernels import models; models.model_measurements(batches=(), steps=8)"
    elif [ "$v" = measurements_generation_unprofiled ]; then  # and no profiler
      py -c "from kernels import models; models.step_device_ms = lambda *a: 1.0; models.model_measurements(batches=(), steps=8)"
    elif [ "$v" = training_kernel_times ]; then  # chapter 9's profiled "kernel time a step"
      py -c "from kernels import models, training; training.kernel_times({'sdpa': models.sdpa_attend, 'book': models.book_attend})"
    else
      py dev/exit-abort/variant.py ${v//_/ }
    fi >"$logs/$v-$i.log" 2>&1 </dev/null
    echo "$v | run $i | rc=$? | $(( $(date +%s) - start ))s"
  done
done | tee "$logs/runs.txt"
echo "--- aborts (rc != 0) by variant:"
for v in "${variants[@]}"; do
  echo "$v: $(grep "^$v |" "$logs/runs.txt" | grep -vc 'rc=0 ') of $(grep -c "^$v |" "$logs/runs.txt")"
done
