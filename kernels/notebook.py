"""CUDA C++ in the chapters' notebooks: ``%%cuda NAME`` cells.

A chapter writes its CUDA C++ as a code cell of its own, so that the rendered book
highlights it as C++ and a reader edits it as C++:

.. code-block:: text

    %%cuda KERNEL_SOURCE
    extern "C" __global__ void attention_kernel(...) { ... }

Run in a notebook, the cell magic binds the cell's text to ``NAME`` (a ``str``) in the
notebook's namespace; the cells after it compile that string, so an edit followed by
re-running the chapter's cells compiles the edit. ``tools/sync_chapters.py`` writes
the same binding into the chapter's generated module (:func:`as_python`), so the
tested source is the shown one, and ``tools/run_chapter.py`` runs the cell the same way
where there is no IPython. The book's build highlights the body as CUDA C++
(``tools/cuda_cells.py``, a Sphinx extension).
"""

from __future__ import annotations

import re

#: the first line of a CUDA C++ cell: ``%%cuda NAME``
CUDA_CELL = re.compile(r"\A%%cuda[ \t]+([A-Za-z_]\w*)[ \t]*\n")


def cuda_text(body: str) -> str:
    """The string a ``%%cuda`` cell's body binds: the body without its leading and
    trailing blank lines (the same in a notebook, a generated module and a run)."""
    return body.strip("\n")


def split_cuda_cell(source: str) -> tuple[str, str] | None:
    """(NAME, text) of a ``%%cuda NAME`` cell, None for any other cell."""
    m = CUDA_CELL.match(source.lstrip("\n"))
    if m is None:
        return None
    return m.group(1), cuda_text(source.lstrip("\n")[m.end():])


def as_python(source: str) -> str:
    """A code cell as plain Python: a ``%%cuda NAME`` cell as ``NAME = r'''...'''``,
    any other cell as it is."""
    cell = split_cuda_cell(source)
    if cell is None:
        return source
    name, text = cell
    if "'''" in text or text.endswith("\\"):
        raise ValueError(f"%%cuda {name}: the source may not contain ''' or end in a "
                         "backslash (it is written as a raw Python string)")
    return f"{name} = r'''\n{text}'''"


def _cuda_magic(line: str, cell: str) -> None:
    from IPython import get_ipython

    name = line.strip()
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise ValueError(f"%%cuda needs the name to bind the source to, got {line!r}")
    get_ipython().user_ns[name] = "\n" + cuda_text(cell)


def register_cell_magic() -> None:
    """Register ``%%cuda`` with the running IPython, if any (a no-op elsewhere)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "register_magic_function"):
        shell.register_magic_function(_cuda_magic, magic_kind="cell", magic_name="cuda")
