"""FlashAttention from Scratch: the kernels of the book and the harness around them.

Importing this package first chooses where kernels run (:mod:`kernels.mode`):
on a GPU, or in Numba's CUDA simulator when there is none.

Hand-written here: the harness (``mode``, ``simulator``, ``api``, ``reference``,
``check``, ``bench``, ``results``, ``compile_report``, ``record``, ``plots``). Generated from
the chapters by ``python tools/sync_chapters.py``: one module per chapter that
defines kernels, listed in :data:`CHAPTERS`.
"""

from __future__ import annotations

import importlib

from .mode import MODE, SIMULATED, describe  # noqa: F401  (must come first)

#: chapter number -> the module generated from it, for chapters that define kernels
CHAPTERS = {1: "naive_attention", 2: "loop_inversion", 3: "tiled_online_softmax",
            4: "shared_memory", 5: "tensor_cores", 6: "mma_attention",
            7: "hopper_attention", 8: "in_a_real_model"}


def chapter_module(chapter: int):
    return importlib.import_module(f"kernels.{CHAPTERS[chapter]}")


def all_kernels():
    """(chapter, name, attention function) for every kernel of every chapter."""
    for chapter in sorted(CHAPTERS):
        for name, fn in chapter_module(chapter).KERNELS.items():
            yield chapter, name, fn
