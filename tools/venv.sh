# Sourced by tools/book.sh and tools/test.sh: `venv EXTRAS` makes .venv if it is
# missing and installs the package with those extras into it (idempotent).
venv() {
  local python=${PYTHON:-python3}
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$1]"
}
