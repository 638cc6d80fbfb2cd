"""The shape of every chapter page: it ends with at least three exercises, a GPU
chapter's among them one that predicts a recorded measurement, and its prose (the text
outside code blocks and the front matter) stays under 12,000 words."""

import re
from pathlib import Path

import pytest

from kernels import exercises

BOOK = Path(__file__).resolve().parent.parent / "book"
CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.md"))
#: the chapters that time kernels on a GPU: each has a prediction exercise
GPU_CHAPTERS = range(1, 10)
MAX_PROSE_WORDS = 12_000
EXERCISE = re.compile(r"^### (\d+)\.(\d+) ", re.M)
CHECK_CALL = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def _without_front_matter(text: str) -> str:
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        return text[end + 4:] if end >= 0 else text
    return text


def _split(text: str) -> tuple[str, str]:
    """(the prose, the code) of a MyST page: code is what lies inside ``` (or ~~~)
    fences, each closed by a fence of its character at least as long."""
    prose, code, fence = [], [], None
    for line in _without_front_matter(text).splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            code.append(line)
        elif fence is not None:
            code.append(line)
            mark = line.strip()
            if mark and set(mark) == {fence[0]} and len(mark) >= len(fence):
                fence = None
        else:
            prose.append(line)
    return "\n".join(prose), "\n".join(code)


def _exercises_section(text: str) -> str:
    """The page from its ``## Exercises`` heading to the next heading of that level."""
    _, found, rest = text.partition("\n## Exercises\n")
    assert found, "no '## Exercises' section"
    return re.split(r"^## ", rest, maxsplit=1, flags=re.M)[0]


def prose_words(text: str) -> int:
    """The words of a page's prose, as ``wc -w`` counts them (a heading's # is one)."""
    return len(_split(text)[0].split())


def test_the_prose_count_leaves_out_code_and_front_matter():
    page = ("---\njupytext:\n  x: y\n---\n\n# Title words\n\n```{code-cell} ipython3\n"
            "a = 1  # not prose\n```\n\nThree more words\n\n````\n```\ninner\n```\n````\n")
    assert prose_words(page) == 6  # '#', 'Title', 'words', 'Three', 'more', 'words'


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.name)
def test_every_chapter_ends_with_three_exercises(page):
    chapter = int(page.name[:2])
    prose = _split(_exercises_section(page.read_text()))[0]
    numbers = EXERCISE.findall(prose)
    assert len(numbers) >= 3, f"{page.name}: {len(numbers)} exercise(s) under '## Exercises'"
    assert all(int(n) == chapter for n, _ in numbers), f"{page.name}: {numbers}"


@pytest.mark.parametrize("page", [p for p in CHAPTERS if int(p.name[:2]) in GPU_CHAPTERS],
                         ids=lambda p: p.name)
def test_every_gpu_chapter_has_a_prediction_exercise(page):
    """A prediction exercise: a checker registered by kernels.exercises.predictions
    (kind "prediction"), called in the chapter's exercises."""
    code = _split(_exercises_section(page.read_text()))[1]
    ids = sorted(set(CHECK_CALL.findall(code)))
    kinds = {i: exercises.get(i).kind for i in ids}
    assert "prediction" in kinds.values(), (
        f"{page.name}: no exercise predicts a recorded measurement ({kinds})")


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.name)
def test_no_chapter_runs_past_twelve_thousand_words_of_prose(page):
    words = prose_words(page.read_text())
    assert words <= MAX_PROSE_WORDS, f"{page.name}: {words} words of prose"
