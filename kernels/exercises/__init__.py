"""Exercises: a small task at the end of each chapter, and a checker that says pass or
what is wrong.

A chapter's exercise has three cells: the task's stub, which the reader fills in (tag
``exercise``); a call of its checker; and a solution, hidden behind a toggle in the
rendered book (tags ``solution`` and ``hide-cell``), which calls the checker too. A
checker is a function of this package, registered under the exercise's id with
:func:`exercise` (``"3.2"``: chapter 3's second exercise); it runs the reader's code
(their kernel in the simulator for the Numba chapters, so no GPU is needed; compiled,
and on a GPU run, for the CUDA C++ chapters) and returns a :class:`Verdict`, which
:func:`check` prints in the notebook. ``tests/test_exercises.py`` runs every solution through its checker
(it must pass), every stub (it must not) and every wrong answer the checker module
lists (each must fail, saying why).

The checkers live in ``kernels/exercises/chNN.py``, one module a chapter (the GPU page's,
which continue chapter 0's, in ``ch00_the_gpu.py``). A prediction exercise (the reader
predicts a recorded measurement, then checks) is registered with
:func:`kernels.exercises.predictions.prediction`, its kind ``"prediction"``.
"""

from __future__ import annotations

import importlib
import pkgutil
import traceback
from dataclasses import dataclass, field


@dataclass
class Verdict:
    """What a checker found: passed, and the lines that say what was checked, or, where
    it failed, what is wrong (the first of them the one to fix first)."""

    exercise: str
    passed: bool
    lines: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = (f"Exercise {self.exercise}: passed" if self.passed
                else f"Exercise {self.exercise}: not yet")
        return "\n".join([head] + [f"  {line}" for line in self.lines])

    def _repr_pretty_(self, printer, cycle):  # IPython shows it as text
        printer.text(str(self))


@dataclass(frozen=True)
class Exercise:
    id: str  # "chapter.number"
    title: str
    check: object  # the checker: (the reader's answer, ...) -> Verdict
    #: answers the checker must refuse: {why it is wrong: the answer}; the tests run them
    wrong_answers: dict = field(default_factory=dict)
    needs_gpu: bool = False  # its checker runs the answer on a GPU (CUDA C++ chapters)
    #: "code" (the reader writes code the checker runs) or "prediction" (the reader
    #: predicts a recorded measurement: :mod:`kernels.exercises.predictions`)
    kind: str = "code"


_EXERCISES: dict[str, Exercise] = {}
_LAST: dict[str, Verdict] = {}


def exercise(id: str, title: str, *, wrong_answers=None, needs_gpu=False, kind="code"):
    """Register a checker under an exercise's id (a decorator)."""
    def register(check):
        def run(*args, **kwargs) -> Verdict:
            try:
                verdict = check(*args, **kwargs)
            except Exception as e:  # the reader's code raised: say where
                where = traceback.extract_tb(e.__traceback__)[-1]
                verdict = Verdict(id, False, [f"your code raised {type(e).__name__}: {e}",
                                              f"(at {where.filename}:{where.lineno})"])
            _LAST[id] = verdict
            return verdict

        run.__name__, run.__doc__ = check.__name__, check.__doc__
        _EXERCISES[id] = Exercise(id, title, run, dict(wrong_answers or {}), needs_gpu, kind)
        return run

    return register


def verdict(id: str, problems: list[str], checked: list[str] = ()) -> Verdict:
    """A verdict from the problems found (none: passed) and what was checked."""
    return Verdict(id, not problems, list(problems) if problems else list(checked))


def check(id: str, *args, **kwargs) -> None:
    """Run exercise ``id``'s checker on the reader's answer and print what it found.

    It returns nothing, so that a cell ending with the call shows the verdict once
    (:func:`last_verdict` keeps it)."""
    print(get(id).check(*args, **kwargs))


def get(id: str) -> Exercise:
    load_all()
    if id not in _EXERCISES:
        raise KeyError(f"no exercise {id!r}; there are {', '.join(sorted(_EXERCISES))}")
    return _EXERCISES[id]


def last_verdict(id: str) -> Verdict | None:
    """The verdict of the last check of exercise ``id`` (for the tests)."""
    return _LAST.get(id)


def load_all() -> dict[str, Exercise]:
    """Every exercise of every chapter (importing the chapters' checker modules)."""
    for m in pkgutil.iter_modules(__path__):
        if m.name.startswith("ch"):
            importlib.import_module(f"{__name__}.{m.name}")
    return dict(_EXERCISES)
