#!/usr/bin/env bash
# Run chapters live on a GPU machine that has no Jupyter (tools/run_chapter.py), each in
# its own process, and print a table last: chapter, cells, seconds, status.
#   bash tools/gpu_chapters.sh book/07_hopper_attention.md book/08_in_a_real_model.md
# With no arguments, every chapter and the front page. Each chapter's whole output goes
# to $OUT/<chapter>.log where $OUT is set (a scratch GPU machine), else to _build/live/.
# Wheels in .whl/ (numpy<2.5 for numba-cuda) are installed to /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_wheels.sh
export PYTHONUNBUFFERED=1
logs=${OUT:-_build/live}
mkdir -p "$logs"
chapters=("$@")
[ ${#chapters[@]} -gt 0 ] || chapters=(book/index.md book/[0-9][0-9]_*.md)
summary=()
for chapter in "${chapters[@]}"; do
  name=$(basename "$chapter" .md)
  start=$(date +%s)
  python3 tools/run_chapter.py "$chapter" >"$logs/$name.log" 2>&1
  status=$?
  cells=$(grep -c '^--- cell [0-9]* ---$' "$logs/$name.log")
  summary+=("$(printf '%-28s %5s cells %5ss  %s' "$name" "$cells" "$(( $(date +%s) - start ))" \
    "$([ $status -eq 0 ] && echo ok || echo "FAILED: $(grep -m1 -E 'Error|Exception' "$logs/$name.log" | cut -c1-120)")")")
  echo "${summary[-1]}"
done
echo "---- live run on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no GPU') ----"
printf '%s\n' "${summary[@]}"
