"""The chapters' kernels: one module a chapter, ``chNN_<name>.py``, generated from
``book/NN_<name>.md`` by ``python tools/sync_chapters.py``. Edit the chapter, not
these files (a test fails while they differ)."""
