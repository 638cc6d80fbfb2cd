#!/usr/bin/env bash
# Set up (a .venv with the book's dependencies) and build the rendered book.
# Executes every chapter (in the CUDA simulator without a GPU) and fails on any
# cell error or Sphinx warning. The HTML lands in _build/html/index.html.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/venv.sh
venv cu13,book
.venv/bin/python tools/sync_chapters.py --check
rm -rf _build/html _build/.doctrees  # a clean build: every chapter runs again
.venv/bin/jupyter-book build . --warningiserror --keep-going "$@"
echo "book: $(pwd)/_build/html/index.html"
