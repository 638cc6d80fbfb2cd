#!/usr/bin/env bash
# A fresh notebook runtime runs chapter 1 from its first cell: outside the repository,
# in a new environment that has only Jupyter's kernel machinery and a numpy (as a
# notebook service has), the generated book/01_naive_attention.ipynb is executed
# whole. Its set-up cell installs the package, here from a copy of this checkout's
# tracked files (FA_BOOK_SOURCE=file://...) instead of the repository's address, and
# must keep the runtime's numpy. (A copy: CI runs this beside the tests, whose set-up
# writes into the checkout.)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/source"
mkdir "$root"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$root"
"${PYTHON:-python3}" -m venv "$work/runtime"
"$work/runtime/bin/python" -m pip install -q --upgrade pip
"$work/runtime/bin/python" -m pip install -q nbclient ipykernel "numpy==2.3.*"
cp "$root/book/01_naive_attention.ipynb" "$work/"
cd "$work"
FA_BOOK_SOURCE="file://$root" XDG_CACHE_HOME="$work/cache" runtime/bin/python - <<'PY'
import importlib.metadata, time
import nbclient, nbformat

numpy_before = importlib.metadata.version("numpy")
nb = nbformat.read("01_naive_attention.ipynb", as_version=4)
start = time.time()
nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",
                        resources={"metadata": {"path": "."}}).execute()
setup = "".join(o.get("text", "") for o in nb.cells[0].outputs)
print(setup.strip())
assert "installing flashattention-from-scratch[cu13] from file://" in setup, setup
assert "mode: sim" in setup, setup
import importlib, kernels  # the installed copy, not the checkout's
assert "site-packages" in kernels.__file__, kernels.__file__
assert importlib.metadata.version("numpy") == numpy_before, "the set-up cell moved numpy"
errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.output_type == "error"]
assert not errors, errors
print(f"fresh runtime: chapter 1 ran from its first cell, {len(nb.cells)} cells in "
      f"{time.time() - start:.0f} s, numpy {numpy_before} kept")
PY
