"""Chapter 10's exercises: reading the recorded measurements (the last, a record's
TFLOPS from its shape and time).

Both take the reader's function and run it on the recorded results, and on a copy
whose runs measured other ceilings, so that an answer typed in from the tables, or one
that reads the wrong run's ceiling, does not pass.
"""

from __future__ import annotations

import copy

from .. import results
from ..bench import STANDARD_SUITE, attention_flops, min_bytes
from . import exercise, verdict

FINAL = "hopper_attention"
FINAL_CHAPTER = 7


def _fractions(recorded: dict, rate, ceiling: float | None = None) -> dict:
    """{shape label: rate(shape, record) / ceiling} for each suite shape the final
    kernel ran; the ceiling is the matmul rate of the run that recorded chapter 7 unless
    given."""
    if ceiling is None:
        ceiling = results.chapter_run(recorded, FINAL_CHAPTER)["ceilings"]["matmul_tflops"]
    return {s.label(): rate(s, r) / ceiling for s in STANDARD_SUITE
            if (r := results.find(recorded["records"], FINAL, s)) and r["status"] == "ok"}


def _expected_fractions(recorded: dict) -> dict:
    return _fractions(recorded, lambda s, r: r["tflops"])


def _other_ceilings(recorded: dict) -> dict:
    """A copy of ``recorded`` in which chapter 7 was recorded by a run of its own whose
    matmul ceiling differs from every other run's (the file's own run's included)."""
    other = copy.deepcopy(recorded)
    own = results.chapter_run(recorded, FINAL_CHAPTER)
    run = {"chapters": [FINAL_CHAPTER], "provenance": own["provenance"],
           "ceilings": dict(own["ceilings"], matmul_tflops=0.8 * own["ceilings"]["matmul_tflops"])}
    other["ceilings"] = dict(other["ceilings"], matmul_tflops=1.25 * own["ceilings"]["matmul_tflops"])
    other["merged_runs"] = other.get("merged_runs", []) + [run]
    return other


def _file_ceiling(recorded: dict) -> dict:
    return _fractions(recorded, lambda s, r: r["tflops"], recorded["ceilings"]["matmul_tflops"])


def _causal_not_halved(recorded: dict) -> dict:
    def full_square(s, r):  # the FLOPs of the whole S_q x S_k square, masked or not
        return 4 * s.B * s.H * s.S_q * s.S_k * s.D / (r["median_ms"] * 1e-3) / 1e12

    return _fractions(recorded, full_square)


def _sdpa_beside(recorded: dict) -> dict:
    return _fractions(recorded, lambda s, r: results.sdpa_tflops(r, "default"))


def _compare_fractions(got, want: dict, recorded: dict) -> list[str]:
    if not isinstance(got, dict):
        return [f"fraction_of_matmul returned a {type(got).__name__}; return a dict "
                "{shape.label(): fraction}"]
    missing = [label for label in want if label not in got]
    if missing:
        return [f"no fraction for {len(missing)} suite shape(s), e.g. {missing[0]}"]
    for label, w in want.items():
        g = got[label]
        if not isinstance(g, (int, float)) or abs(g - w) > 1e-6 * w:
            shown = f"{g:.4f}" if isinstance(g, (int, float)) else repr(g)
            problem = f"at {label}: expected {w:.4f}, got {shown}"
            hints = {"that is the share of the file's own run's ceiling (results['ceilings']); "
                     "chapter 7 was recorded by another run: kernels.results.chapter_run("
                     "recorded, 7)": _file_ceiling(recorded).get(label),
                     "a causal pass does half the FLOPs: the records' tflops already "
                     "count that": _causal_not_halved(recorded).get(label),
                     "that is SDPA's rate, timed beside the kernel; the kernel's is its "
                     "record's tflops": _sdpa_beside(recorded).get(label)}
            hint = next((h for h, v in hints.items()
                         if isinstance(g, (int, float)) and v and abs(g - v) <= 1e-6 * v), None)
            return [problem] + ([hint] if hint else [])
    return []


@exercise("10.1", "the share of the measured matmul rate the final kernel reaches",
          wrong_answers={"the file's own run's ceiling": _file_ceiling,
                         "causal FLOPs not halved": _causal_not_halved,
                         "SDPA's TFLOPS instead of the kernel's": _sdpa_beside})
def check_fraction_of_matmul(fraction_of_matmul):
    """``fraction_of_matmul(recorded)`` -> {shape label: the final kernel's TFLOPS over
    the matmul ceiling of the run that recorded chapter 7}, on the recorded results and
    on a copy whose runs measured other ceilings."""
    recorded = results.load()
    if recorded is None:
        return verdict("10.1", ["no recorded results to read: run `python -m kernels.record` "
                               "on a GPU first"])
    for name, data in (("the recorded results", recorded),
                       ("a copy whose runs measured other ceilings", _other_ceilings(recorded))):
        problems = _compare_fractions(fraction_of_matmul(data), _expected_fractions(data), data)
        if problems:
            return verdict("10.1", [f"on {name}: {problems[0]}"] + problems[1:])
    fractions = _expected_fractions(recorded)
    best = max(fractions, key=fractions.get)
    return verdict("10.1", [], [
        f"all {len(fractions)} suite shapes, on the recorded results and on a copy with "
        "other ceilings",
        f"the highest: {fractions[best]:.0%} of the measured matmul rate, at {best}"])


def _expected_length(ceilings: dict, causal: bool) -> float:
    ridge = ceilings["matmul_tflops"] / ceilings["copy_tb_s"]
    S = 4096
    return S * ridge / (attention_flops(1, 1, S, S, 64, causal) / min_bytes(1, 1, S, S, 64))


def _causal_ignored(ceilings, causal):
    return 2 * ceilings["matmul_tflops"] / ceilings["copy_tb_s"]


def _reads_only(ceilings, causal):  # q, k and v read, the output never written
    ridge = ceilings["matmul_tflops"] / ceilings["copy_tb_s"]
    return 1.5 * ridge * (2 if causal else 1)


def _fp32_bytes(ceilings, causal):
    return 2 * _expected_length(ceilings, causal)


@exercise("10.2", "the sequence length at which attention reaches the ridge point",
          wrong_answers={"causal FLOPs not halved": _causal_ignored,
                         "the output's write left out of the bytes": _reads_only,
                         "fp32 bytes": _fp32_bytes})
def check_ridge_length(ridge_length):
    """``ridge_length(ceilings, causal)`` -> the S at which attention's FLOPs over its
    fewest fp16 bytes reach the ceilings' ridge point, for the recorded ceilings and
    two made-up ones, causal and not."""
    recorded = results.load()
    cases = [dict(matmul_tflops=700.0, copy_tb_s=3.5), dict(matmul_tflops=120.0, copy_tb_s=0.3)]
    if recorded is not None:
        cases.insert(0, results.chapter_run(recorded, FINAL_CHAPTER)["ceilings"])
    for ceilings in cases:
        ridge = ceilings["matmul_tflops"] / ceilings["copy_tb_s"]
        for causal in (False, True):
            want, got = _expected_length(ceilings, causal), ridge_length(ceilings, causal)
            if not isinstance(got, (int, float)) or abs(got - want) > 1e-3 * want:
                where = (f"with a matmul rate of {ceilings['matmul_tflops']:.0f} TFLOPS and "
                         f"{ceilings['copy_tb_s']:.2f} TB/s (ridge {ridge:.0f} FLOP per byte), "
                         f"{'causal' if causal else 'not causal'}")
                number = isinstance(got, (int, float))
                problems = [f"{where}: expected S = {want:.0f}, got "
                            + (f"{got:.0f}" if number else repr(got))]
                hints = {"that is the ridge point's intensity; the question is the S at "
                         "which attention's intensity reaches it": ridge,
                         "a causal pass does half the FLOPs on the same bytes": want / 2,
                         "the fewest bytes write the output once too (kernels.bench."
                         "min_bytes)": 0.75 * want,
                         "fp16: two bytes an element": 2 * want}
                hint = next((h for h, v in hints.items() if number and abs(got - v) < 1e-3 * v), None)
                problems += [hint] if hint else []
                return verdict("10.2", problems)
    first = cases[0]
    return verdict("10.2", [], [
        f"{len(cases)} sets of ceilings, causal and not",
        f"with the first: memory-bound below S = {_expected_length(first, False):.0f}, "
        f"causal below S = {_expected_length(first, True):.0f}; B, H and D cancel"])


# ---- 10.3: a record's TFLOPS -------------------------------------------------------------

_RECORD_FIELDS = ("kernel", "B", "H", "S_q", "S_k", "D", "causal", "dtype", "median_ms")


def _forward_records(recorded: dict) -> list[dict]:
    """The timed forward records, cut to their shape, dtype and time (the FLOPs and
    TFLOPS they carry left out)."""
    return [{k: r[k] for k in _RECORD_FIELDS} for r in recorded["records"]
            if r.get("status") == "ok" and r.get("median_ms")]


def _want_tflops(r: dict) -> float:
    return attention_flops(r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"]) / (
        r["median_ms"] * 1e-3) / 1e12


@exercise("10.3", "A record's TFLOPS", wrong_answers={
    "causal FLOPs not halved": lambda r: 4 * r["B"] * r["H"] * r["S_q"] * r["S_k"] * r["D"]
        / (r["median_ms"] * 1e-3) / 1e12,
    "milliseconds read as seconds": lambda r: attention_flops(
        r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"]) / r["median_ms"] / 1e12,
    "a multiply-add counted as one FLOP": lambda r: attention_flops(
        r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"]) / 2
        / (r["median_ms"] * 1e-3) / 1e12,
})
def check_tflops(tflops):
    """``tflops(record)``: a record's rate in TFLOPS, from its shape and its median
    time in milliseconds, by the book's FLOP count."""
    recorded = results.load()
    if recorded is None:
        return verdict("10.3", ["no recorded results to read: run `python -m kernels.record` "
                               "on a GPU first"])
    records = _forward_records(recorded)
    for r in records:
        got, want = tflops(dict(r)), _want_tflops(r)
        if not isinstance(got, (int, float)) or isinstance(got, bool) \
                or abs(got - want) > 1e-9 * want:
            shape = (f"{r['kernel']}, B={r['B']} H={r['H']} S_q={r['S_q']} S_k={r['S_k']} "
                     f"D={r['D']}{' causal' if r['causal'] else ''}, {r['median_ms']:.4g} ms")
            number = isinstance(got, (int, float)) and not isinstance(got, bool)
            problems = [f"{shape}: {want:.4g} TFLOPS, yours "
                        + (f"{got:.4g}" if number else repr(got))]
            hints = {"a causal pass does half the FLOPs (kernels.bench.attention_flops)":
                     2 * want,
                     "median_ms is in milliseconds: a thousandth of a second": want / 1e3,
                     "a multiply-add is two FLOPs: the count is 4 B H S_q S_k D": want / 2}
            hint = next((h for h, v in hints.items()
                         if number and abs(got - v) <= 1e-6 * v), None)
            return verdict("10.3", problems + ([hint] if hint else []))
    best = max(records, key=_want_tflops)
    return verdict("10.3", [], [
        f"the same TFLOPS as the recording on all {len(records)} timed records",
        f"the fastest: {best['kernel']}, {_want_tflops(best):.0f} TFLOPS at B={best['B']} "
        f"H={best['H']} S={best['S_q']} D={best['D']}{' causal' if best['causal'] else ''}, "
        f"{best['dtype']}"])
