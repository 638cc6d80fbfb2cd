"""Execute a chapter's code cells in order, as a notebook would, without Jupyter.

For GPU machines that have the kernels' dependencies but no Jupyter or IPython:
``python tools/run_chapter.py book/06_mma_attention.md`` runs every code cell of the
chapter in one namespace, printing what the notebook would display (tables as their
Markdown text) and each cell's time, and stops at the first error. Figures are drawn
with matplotlib's Agg backend and not shown. Each cell's source is registered with
``linecache``, as IPython does, so code that reads its own source (Triton's JIT) works.
"""

from __future__ import annotations

import linecache
import re
import sys
import time
import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401  (before the stand-in below: pyplot asks for IPython)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, uninstalled
CELL = re.compile(r"```\{code-cell\} ipython3\n(?::tags: \[[^\]]*\]\n\n)?(.*?)```", re.S)


def stand_in_ipython() -> None:
    """IPython.display.display and Markdown, as printing."""
    display = types.ModuleType("IPython.display")
    display.Markdown = str
    display.display = print
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: None
    ipython.version_info = (0, 0)
    sys.modules.setdefault("IPython", ipython)
    sys.modules.setdefault("IPython.display", display)


def run(path: str) -> int:
    cells = CELL.findall(open(path).read())
    stand_in_ipython()
    from kernels.notebook import as_python  # after the stand-in: kernels asks for IPython

    namespace = {"__name__": "__main__", "display": print}
    start = time.perf_counter()
    for i, code in enumerate(cells):
        t = time.perf_counter()
        code = as_python(code)
        name = f"<cell {i}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        print(f"--- cell {i} ---", flush=True)
        exec(compile(code, name, "exec"), namespace)
        print(f"--- cell {i}: {time.perf_counter() - t:.1f} s", flush=True)
    print(f"{path}: all {len(cells)} code cells ran in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
