# Sourced by tools/book.sh, tools/test.sh and tools/cuda12_check.sh: `venv EXTRAS [DIR]`
# makes the virtual environment DIR (default .venv) if it is missing and installs the
# package with those extras into it (idempotent).
venv() {
  local python=${PYTHON:-python3} dir=${2:-.venv}
  [ -x "$dir/bin/python" ] || "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  "$dir/bin/python" -m pip install -q -e ".[$1]"
}
