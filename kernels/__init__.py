"""FlashAttention from Scratch: the kernels of the book and the harness around them.

Importing this package first chooses where kernels run (:mod:`kernels.mode`):
on a GPU, or in Numba's CUDA simulator when there is none.

Where things are:

- ``kernels/chapters/chNN_<name>.py``: generated from ``book/NN_<name>.md`` by
  ``python tools/sync_chapters.py`` (a chapter's cells tagged ``export``); never
  edited by hand. :data:`CHAPTERS` lists them.
- ``kernels/*.py``: hand-written. The harness every chapter shares (``mode``,
  ``simulator``, ``api``, ``reference``, ``check``, ``bench``, ``results``, ``tables``,
  ``compile_report``, ``source_steps``, ``record``, ``plots``, ``gpus``,
  ``notebook``, ``exercises``), what a model calls: the lean call (``launch``) and the
  models built on it (``models``, ``llama``), the book's targets for the lean call
  (``targets``) and FlashAttention-4 measured beside it (``flash_attention_4``).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from .mode import MODE, SIMULATED, describe  # noqa: F401  (must come first)

_CHAPTER_FILE = re.compile(r"ch(\d\d)_(\w+)\.py")

#: chapter number -> the name of the module generated from it (``kernels.chapters.
#: chNN_<name>``), for chapters that define kernels; the name is also the chapter's key
#: in the recorded results
CHAPTERS = {int(m.group(1)): m.group(2)
            for p in sorted((Path(__file__).parent / "chapters").glob("ch*.py"))
            if (m := _CHAPTER_FILE.fullmatch(p.name))}


def chapter_module_name(chapter: int) -> str:
    """``kernels.chapters.chNN_<name>``: the module generated from chapter ``chapter``."""
    return f"kernels.chapters.ch{chapter:02d}_{CHAPTERS[chapter]}"


def chapter_module(chapter: int):
    return importlib.import_module(chapter_module_name(chapter))


#: hand-written modules that measure a chapter on a GPU beyond its kernels' timings:
#: chapter -> {name in the recorded results: module}
MEASURED_BY = {7: {"flash_attention_4": "kernels.flash_attention_4"},
               8: {"models": "kernels.models", "llama": "kernels.llama",
                  "layouts": "kernels.layouts"},
               9: {"training": "kernels.training"}}


def measuring_modules(chapters=None) -> dict:
    """{name: module} of what a recording of ``chapters`` (all by default) measures
    beyond the kernels' timings (its ``gpu_measurements()``, guarded by the hash of what
    its ``MEASURES`` declares: kernels.results.measured_hash): the chapter modules that
    have such a function, and the hand-written modules of :data:`MEASURED_BY`."""
    out = {}
    for chapter in sorted(CHAPTERS) if chapters is None else chapters:
        module = chapter_module(chapter)
        if hasattr(module, "gpu_measurements"):
            out[CHAPTERS[chapter]] = module
        for name, path in MEASURED_BY.get(chapter, {}).items():
            out[name] = importlib.import_module(path)
    return out


def main_kernels() -> dict[int, str]:
    """{chapter: its kernel}: each chapter's last step (its ``MAIN_KERNEL``), the one
    the book compares across chapters; the chapters of forward kernels only (chapter 9's
    kernels are backward passes)."""
    return {chapter: chapter_module(chapter).MAIN_KERNEL for chapter in sorted(CHAPTERS)
            if getattr(chapter_module(chapter), "MAIN_KERNEL", None)}


def all_kernels():
    """(chapter, name, attention function) for every kernel of every chapter."""
    for chapter in sorted(CHAPTERS):
        for name, fn in chapter_module(chapter).KERNELS.items():
            yield chapter, name, fn


from .notebook import register_cell_magic  # noqa: E402

register_cell_magic()  # %%cuda cells, where this runs in IPython; nothing elsewhere
