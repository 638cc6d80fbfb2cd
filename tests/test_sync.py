"""kernels/ and notebooks/ are what the chapters generate, exactly."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("jupytext", reason="the chapters' tooling (pip install -e .[book])")

ROOT = Path(__file__).resolve().parent.parent


def _sync():
    spec = importlib.util.spec_from_file_location("sync_chapters", ROOT / "tools" / "sync_chapters.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sync_chapters"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_generated_files_match_the_chapters():
    stale = _sync().stale()
    assert not stale, ("out of date with the chapters: "
                       + ", ".join(str(p.relative_to(ROOT)) for p in stale)
                       + "; run `python tools/sync_chapters.py`")


def test_every_chapter_module_is_registered():
    import kernels

    sync = _sync()
    exported = {sync.module_name(c) for c in sync.chapters() if sync.extract(c)}
    assert exported == set(kernels.CHAPTERS.values())


def test_extraction_takes_only_export_cells(tmp_path, monkeypatch):
    sync = _sync()
    chapter = tmp_path / "07_demo.md"
    chapter.write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n---\n# Demo\n\n"
        "```{code-cell} ipython3\n:tags: [export]\n\nX = 1\n```\n\n"
        "```{code-cell} ipython3\nprint('not exported')\n```\n")
    monkeypatch.setattr(sync, "ROOT", tmp_path)
    text = sync.extract(chapter)
    assert "X = 1" in text and "not exported" not in text
    assert text.startswith("# Generated from 07_demo.md")
