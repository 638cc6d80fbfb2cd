#!/usr/bin/env bash
# What a GPU must check of the lean call, in one run: its GPU tests, the drawn cases of
# tests/test_properties.py (2,000 by default), and compute-sanitizer's memcheck, racecheck
# and synccheck over every kernel it can choose (tools/sanitize_forms.py). Prints a table
# last; each part's whole output goes to $OUT/<part>.log where $OUT is set (a scratch GPU
# machine), else to _build/gpu-check/.
#
#   bash tools/gpu_check.sh                  # all of it
#   PARTS="tests properties" bash tools/gpu_check.sh
#   TESTS="tests/test_launch.py" FA_PROPERTY_CASES=500 bash tools/gpu_check.sh
#
# Recording results is kernels.record's and kernels.rerecord's work (CONTRIBUTING.md).
# Wheels in .whl/ (numpy<2.5 for numba-cuda) are installed to /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_wheels.sh
export PYTHONUNBUFFERED=1
logs=${OUT:-_build/gpu-check}
mkdir -p "$logs"
PARTS=${PARTS:-tests properties memcheck racecheck synccheck}
TESTS=${TESTS:-tests/test_launch.py tests/test_api.py tests/test_layouts.py tests/test_ch09_backward_pass.py}
export FA_PROPERTY_CASES=${FA_PROPERTY_CASES:-2000}
summary=()

run() {  # run PART COMMAND...: the command's output to $logs/PART.log, a line of summary
  local part=$1 start status line
  shift
  start=$(date +%s)
  "$@" >"$logs/$part.log" 2>&1
  status=$?
  case $part in
    tests|properties) line=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$logs/$part.log" | tail -1) ;;
    *) line=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$logs/$part.log" | tr '\n' ' ') ;;
  esac
  summary+=("$(printf '%-11s %5ss  exit %-3s %s' "$part" "$(( $(date +%s) - start ))" "$status" "$line")")
  echo "${summary[-1]}"
}

sanitize() {  # sanitize TOOL: the lean call's kernels under compute-sanitizer's TOOL
  compute-sanitizer --tool "$1" --report-api-errors no --print-limit 20 \
    python3 tools/sanitize_forms.py
}

for part in $PARTS; do
  case $part in
    # shellcheck disable=SC2086
    tests) run tests python3 -m pytest -q -p no:cacheprovider $TESTS ;;
    properties) run properties python3 -m pytest -q -p no:cacheprovider tests/test_properties.py ;;
    memcheck|racecheck|synccheck) run "$part" sanitize "$part" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
echo "---- $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no GPU'); property cases: $FA_PROPERTY_CASES ----"
printf '%s\n' "${summary[@]}"
