"""Every chapter's exercises: each solution passes its checker, each stub does not, and
every wrong answer a checker lists fails it, saying what is wrong."""

import re
from pathlib import Path

import pytest

import kernels
from kernels import exercises

BOOK = Path(__file__).resolve().parent.parent / "book"
CHECK_CALL = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")
#: a MyST code cell and its tags (read without jupytext, which a GPU machine lacks)
CELL = re.compile(r"```\{code-cell\} ipython3\n(?::tags: \[([^\]]*)\]\n)?\n?(.*?)\n```", re.S)


def _cells(tag: str) -> list:
    """(chapter file, exercise id, source) of every code cell tagged ``tag``."""
    out = []
    for path in sorted(BOOK.glob("[0-9][0-9]_*.md")):
        for tags, source in CELL.findall(path.read_text()):
            if tag in [t.strip() for t in tags.split(",")]:
                ids = CHECK_CALL.findall(source)
                assert len(ids) == 1, f"{path.name}: a {tag} cell calls one checker: {source[:200]}"
                out.append((path.name, ids[0], source))
    return out


SOLUTIONS, STUBS = _cells("solution"), _cells("exercise")


def _run(source: str, exercise_id: str):
    from kernels.notebook import as_python

    exercises._LAST.pop(exercise_id, None)
    exec(compile(as_python(source), f"<exercise {exercise_id}>", "exec"), {"__name__": "__main__"})
    return exercises.last_verdict(exercise_id)


def test_every_chapter_ends_with_exercises_whose_checkers_exist():
    registered = exercises.load_all()
    chapters = {int(name[:2]) for name, _, _ in SOLUTIONS}
    assert chapters >= set(kernels.CHAPTERS), "a chapter without exercises"
    for chapter in chapters:
        ids = {i for name, i, _ in SOLUTIONS if int(name[:2]) == chapter}
        assert len(ids) >= 2, f"chapter {chapter} has {len(ids)} exercise(s)"
        assert all(i.startswith(f"{chapter}.") for i in ids)
    assert {i for _, i, _ in SOLUTIONS} == {i for _, i, _ in STUBS} == set(registered)


@pytest.mark.parametrize("chapter, exercise_id, source", SOLUTIONS,
                         ids=[i for _, i, _ in SOLUTIONS])
def test_the_solution_passes(chapter, exercise_id, source):
    verdict = _run(source, exercise_id)
    assert verdict is not None, f"{chapter}: the solution cell did not call its checker"
    assert verdict.passed, str(verdict)


@pytest.mark.parametrize("chapter, exercise_id, source", STUBS, ids=[i for _, i, _ in STUBS])
def test_the_stub_does_not_pass(chapter, exercise_id, source):
    verdict = _run(source, exercise_id)
    assert verdict is not None and not verdict.passed and verdict.lines, str(verdict)


@pytest.mark.parametrize("exercise_id, why", [
    (e.id, why) for e in exercises.load_all().values() for why in e.wrong_answers])
def test_a_wrong_answer_fails_and_says_why(exercise_id, why):
    e = exercises.get(exercise_id)
    answer = e.wrong_answers[why]
    verdict = e.check(*answer) if isinstance(answer, tuple) else e.check(answer)
    assert not verdict.passed and verdict.lines, f"{why}: {verdict}"
