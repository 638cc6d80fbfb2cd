"""The book speaks to its reader: no word of how it was made (issues, commits, branches,
development runs, targets, questions left open) in any chapter's text or code."""

import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parent.parent / "book"
#: what a reader cannot know or check: the project's own bookkeeping
MAKING = re.compile(r"the issue|issue's|this issue|\bcommit [0-9a-f]{7}|\bwithdrawn\b|"
                    r"development runs?\b|on a branch|\bdev/|\bsessions?\b|"
                    r"the (book's )?targets?\b( [^a]|$)|left open here", re.I)


@pytest.mark.parametrize("chapter", sorted(BOOK.glob("*.md")), ids=lambda p: p.name)
def test_no_chapter_speaks_of_its_own_making(chapter):
    found = [f"{chapter.name}:{n}: {line.strip()}"
             for n, line in enumerate(chapter.read_text().splitlines(), 1)
             if MAKING.search(line) and not line.lstrip().startswith("|")]
    assert not found, "\n".join(found)
