"""Predict the measurement, then check.

A prediction exercise asks the reader for one number before they look it up: how many
times faster one kernel ran than another, or the share of a ceiling a kernel reached,
reasoned from the chapter's idea. Its checker reads the recorded value from
:mod:`kernels.results` when it runs (no number is typed into a checker, so a new
recording changes the answer and not the code), says it with the GPU that recorded it,
and whether the prediction fell within the exercise's :class:`Band`: within a stated
share of the recorded value and, where the question is which side of a line the
measurement falls on (faster or slower: 1), on the recorded side.

Each chapter's module says only what is measured, as a function of the recorded
results that returns a :class:`Measured` (:func:`speedup` builds the common one), and
the band; :func:`prediction` registers the checker, of kind ``"prediction"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from .. import results
from . import exercise, verdict


@dataclass(frozen=True)
class Measured:
    """A recorded value, the GPU that recorded it, and what it is made of, in words."""

    value: float
    gpu: str
    how: str


@dataclass(frozen=True)
class Band:
    """How close a prediction must come: within ``within`` of the recorded value (0.3:
    30% of it, either way) and, given ``side_of``, on the same side of that line as the
    recorded value; ``sides`` says what below and above the line mean."""

    within: float
    side_of: float | None = None
    sides: tuple[str, str] = ("below", "above")

    def side(self, value: float) -> str:
        return self.sides[value > self.side_of]

    def describe(self, recorded: float, shown, most: float | None = None) -> str:
        low, high = recorded * (1 - self.within), recorded * (1 + self.within)
        high = high if most is None else min(high, most)
        words = (f"within {self.within:.0%} of the recorded value ({shown(low)} to "
                 f"{shown(high)})")
        if self.side_of is not None:
            words += f", and on its side of {self.side_of:g} ({self.side(recorded)})"
        return words

    def misses(self, predicted: float, recorded: float, shown) -> list[str]:
        """What keeps ``predicted`` out of the band around ``recorded`` (none: inside)."""
        out = []
        if self.side_of is not None and (predicted > self.side_of) != (recorded > self.side_of):
            says = (f"is on the line, {self.side_of:g}" if predicted == self.side_of
                    else f"says {self.side(predicted)}")
            out.append(f"your prediction, {shown(predicted)}, {says}; it was "
                       f"{self.side(recorded)}")
        off = abs(predicted - recorded) / recorded
        if off > self.within:
            out.append(f"your prediction, {shown(predicted)}, is {off:.0%} "
                       f"{'above' if predicted > recorded else 'below'} the recorded value")
        return out


#: how each unit shows a value, and how a reader writes it
#: (and the most it can be)
UNITS = {"times": (lambda v: f"{v:.2f}x", "a number of times, such as 2.0 for twice", None),
         "share": (lambda v: f"{v:.0%}", "a fraction between 0 and 1, such as 0.5 for half", 1.0)}


@dataclass(frozen=True)
class Prediction:
    """What a prediction exercise measures, its band and its unit."""

    measure: object  # (the recorded results) -> Measured | None
    band: Band
    unit: str


#: every prediction exercise, by id (for the tests)
PREDICTIONS: dict[str, Prediction] = {}


def speedup(slow: str, fast: str, shape, chapter: int):
    """A measure: how many times faster kernel ``fast`` ran than kernel ``slow`` on
    ``shape`` (fp16), in the recorded results; None where either was not timed there."""
    def measure(recorded: dict) -> Measured | None:
        a, b = (results.timed(recorded["records"], k, shape) for k in (slow, fast))
        if not (a and b):
            return None
        return Measured(a["median_ms"] / b["median_ms"], recorded_gpu(recorded, chapter),
                        f"{fast} {b['median_ms']:.3g} ms, {slow} {a['median_ms']:.3g} ms, "
                        f"at {shape.label()}")

    return measure


def recorded_gpu(recorded: dict, chapter: int) -> str:
    """The GPU of the run that recorded ``chapter``."""
    return results.chapter_run(recorded, chapter)["provenance"]["gpu"]


def prediction(id: str, title: str, *, measure, band: Band, unit: str = "times",
               wrong_answers=None):
    """Register exercise ``id``, of kind ``"prediction"``: its checker takes the reader's
    predicted number, reads ``measure(recorded results)`` (a :class:`Measured`, or None
    where the records lack it) and says whether the prediction is within ``band``.
    ``unit`` is "times" or "share". Returns the checker."""
    shown, how_to_write, most = UNITS[unit]

    def check(predicted):
        if isinstance(predicted, bool) or not isinstance(predicted, Real) \
                or not math.isfinite(predicted):
            return verdict(id, [f"write your prediction as a number: {how_to_write} "
                                f"(yours is {predicted!r}); the checker then shows the "
                                "recorded value"])
        if predicted <= 0:
            return verdict(id, [f"{predicted!r}: this quantity is positive; write "
                                f"{how_to_write}"])
        if unit == "share" and predicted > 1:
            return verdict(id, [f"{predicted!r}: a share is a fraction between 0 and 1 "
                                f"(did you write a percentage? {predicted:g}% is "
                                f"{predicted / 100:g})"])
        recorded = results.load()
        measured = measure(recorded) if recorded is not None else None
        if measured is None:
            return verdict(id, ["the recorded results do not hold this measurement: "
                                "record the chapter on a GPU first (`python -m "
                                "kernels.record`)"])
        value = float(predicted)
        said = [f"recorded on the {measured.gpu}: {shown(measured.value)} ({measured.how})",
                f"the band: {band.describe(measured.value, shown, most)}"]
        misses = band.misses(value, measured.value, shown)
        if misses:
            return verdict(id, misses + said)
        off = abs(value - measured.value) / measured.value
        return verdict(id, [], [said[0], f"your prediction, {shown(value)}, is within the "
                                f"band ({off:.0%} off): "
                                + band.describe(measured.value, shown, most)])

    PREDICTIONS[id] = Prediction(measure, band, unit)
    check.__name__ = f"check_prediction_{id.replace('.', '_')}"
    check.__doc__ = f"``predicted``: the reader's prediction of exercise {id}'s measurement."
    return exercise(id, title, wrong_answers=wrong_answers, kind="prediction")(check)
