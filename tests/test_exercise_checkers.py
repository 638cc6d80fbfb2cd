"""The CUDA C++ chapters' exercise checkers agree with the chapters: the code the
chapters ship passes the checkers' models of the hardware, and the C++ expressions the
checkers evaluate are read as C++ reads them."""

import re

import pytest

from kernels.chapters import ch05_tensor_cores, ch06_mma_attention, ch07_hopper_attention
from kernels.chapters import ch08_in_a_real_model
from kernels.exercises import ch05, ch06, ch07, ch08
from kernels.exercises.cexpr import ExpressionError, parse


def test_expressions_are_read_as_cpp_reads_them():
    assert parse("-7 / 2")() == -3 and parse("-7 % 2")() == -1  # towards zero, as in C++
    assert parse("a & 1 < 2")(a=2) == 0  # & binds more loosely than < in C++
    assert parse("1 + 2 << 3")() == 24 and parse("x ? 4 : 5 + 1")(x=0) == 6
    assert parse("(u32)-1")() == 2**32 - 1 and parse("(int)(unsigned)-1")() == -1
    assert parse("1ull << 62 | 0x10")() == (1 << 62) + 16
    assert parse("threadIdx.x / 32")(**{"threadIdx.x": 70}) == 2
    for text in ("lane +", "f(1)", "a = 1", "(int)"):
        with pytest.raises(ExpressionError):
            parse(text)
    with pytest.raises(ExpressionError, match="not defined"):
        parse("lanes")(lane=1)


def test_the_chapters_k_addresses_pass_the_ldmatrix_model():
    row, col = re.search(ch06.K_ADDRESS, ch06_mma_attention.SOURCE, re.S).group(2, 3)
    assert ch06.check_k_addresses(row, col).passed


def test_the_chapters_descriptor_has_the_fields_the_ptx_manual_gives():
    describe = ch07.chapter_descriptor()
    fields = {name: (first, bits) for name, first, bits in ch07.FIELDS}
    for _, address, leading in ch07.descriptor_calls():
        d = describe(address, leading)
        value = {name: d >> first & ((1 << bits) - 1) for name, (first, bits) in fields.items()}
        assert value["start address >> 4"] == address >> 4
        assert value["leading byte offset >> 4"] == leading >> 4
        assert value["stride byte offset >> 4"] == 1024 >> 4
        assert value["swizzle mode"] == 1  # the 128-byte swizzle
        assert d == sum(v << fields[n][0] for n, v in value.items())


def test_the_chapters_ring_parities_pass_the_ring_model():
    lap = parse(re.search(r"u32 lap\(int t\) \{ return (.*?); \}",
                          ch07_hopper_attention.KERNEL_SOURCE).group(1))

    def full(t, stages):
        return lap(t=t, STAGES=stages)

    def free(t, stages):
        return lap(t=t, STAGES=stages) ^ 1  # the producer's wait, as the kernel has it

    assert ch07.check_ring_parities(full, free).passed


def test_the_chapters_key_loop_passes_the_warp_model():
    condition = re.search(ch08.KEY_LOOP, ch08_in_a_real_model.SOURCE, re.S).group(2)
    assert ch08.loop_problem(parse(condition)) is None


def test_the_shared_memory_parts_add_up_to_the_launchers_count():
    for cfg in ch05_tensor_cores.STEPS.values():
        for D in ch05_tensor_cores.HEAD_DIMS:
            assert sum(ch05.shared_parts(cfg, D).values()) == ch05_tensor_cores.shared_bytes(cfg, D)


def test_the_split_partials_are_what_the_split_kernel_writes():
    """Exercise 8.1's partial results, combined as combine_splits_kernel does, give the
    float64 reference: the checker's cases test the combine, not their own making."""
    import numpy as np

    from kernels.reference import reference_attention

    for _, q, k, v, causal, bounds in ch08.combine_cases():
        partials = ch08.split_partials(q, k, v, causal, bounds)
        o_split, lse_split = (x.astype(np.float64) for x in partials)
        top = lse_split.max(axis=0)
        seen = top > -np.inf
        w = np.exp2(lse_split - np.where(seen, top, 0))
        o = (w[..., None] * o_split).sum(0) / np.where(seen, w.sum(0), 1)[:, None]
        ref, _ = reference_attention(q, k, v, causal)
        assert np.allclose(o, ref.reshape(o.shape), atol=1e-5)


# ---- the prediction exercises (kernels.exercises.predictions) ---------------------------

from kernels import exercises, results  # noqa: E402
from kernels.exercises.predictions import PREDICTIONS  # noqa: E402

exercises.load_all()
PREDICTION_IDS = sorted(PREDICTIONS, key=lambda i: tuple(map(int, i.split("."))))


def test_every_gpu_chapter_has_a_prediction_checker():
    assert {int(i.split(".")[0]) for i in PREDICTION_IDS} >= set(range(1, 10))
    assert all(exercises.get(i).kind == "prediction" for i in PREDICTION_IDS)


@pytest.mark.parametrize("exercise_id", PREDICTION_IDS)
def test_a_prediction_inside_its_band_passes_and_one_outside_fails(exercise_id):
    p, check = PREDICTIONS[exercise_id], exercises.get(exercise_id).check
    recorded = results.load()
    measured = p.measure(recorded)
    assert measured is not None, f"{exercise_id}: the recorded results lack its measurement"
    gpu = results.chapter_run(recorded)["provenance"]["gpu"]
    assert measured.gpu == gpu

    inside = measured.value * (1 + 0.9 * p.band.within)
    right = check(min(inside, 1.0) if p.unit == "share" else inside)
    assert right.passed, str(right)
    assert gpu in right.lines[0] and "recorded" in right.lines[0]

    for wrong in (measured.value * (1 + 1.1 * p.band.within),
                  measured.value * (1 - 1.1 * p.band.within)):
        if p.unit == "share" and wrong > 1:
            continue
        verdict = check(wrong)
        assert not verdict.passed, str(verdict)
        said = "\n".join(verdict.lines)
        assert gpu in said and "the band" in said and "your prediction" in said, said

    if p.band.side_of is not None:  # inside the band's width, but on the other side
        line, value = p.band.side_of, measured.value
        other = line * (0.99 if value > line else 1.01)
        if abs(other - value) <= p.band.within * value:
            verdict = check(other)
            assert not verdict.passed and "it was" in verdict.lines[0], str(verdict)


@pytest.mark.parametrize("exercise_id", PREDICTION_IDS)
def test_a_prediction_that_is_no_number_is_refused_without_the_answer(exercise_id):
    check = exercises.get(exercise_id).check
    for answer in (None, "2", True, float("nan"), -1.0, 0):
        verdict = check(answer)
        assert not verdict.passed and verdict.lines, answer
        assert not any("recorded on" in line for line in verdict.lines), verdict
    if PREDICTIONS[exercise_id].unit == "share":
        verdict = check(42.0)
        assert not verdict.passed and "percentage" in verdict.lines[0]


def _doctored(recorded: dict) -> dict:
    """A copy of the recorded results whose every time is scaled by a factor of its
    kernel's own (the rates with them), so that every ratio and share changes."""
    import copy
    import zlib

    other = copy.deepcopy(recorded)
    for r in other["records"]:
        f = 1.2 + zlib.crc32(r["kernel"].encode()) % 1000 / 500
        if not r.get("median_ms"):
            continue
        r["median_ms"] *= f
        if r.get("tflops"):
            r["tflops"] /= f
    for t in other["measurements"]["backward_pass"]["timings"]:
        t["ms"] = {k: 5.0 * v for k, v in t["ms"].items()}  # beyond every kernel's factor
    return other


@pytest.mark.parametrize("exercise_id", PREDICTION_IDS)
def test_a_prediction_checker_reads_the_records_when_it_runs(exercise_id, monkeypatch):
    """No recorded value is typed into a checker: on other records it says another."""
    p, check = PREDICTIONS[exercise_id], exercises.get(exercise_id).check
    recorded = results.load()
    other = _doctored(recorded)
    before, after = p.measure(recorded).value, p.measure(other).value
    assert abs(after - before) > 0.2 * p.band.within * before
    monkeypatch.setattr(results, "load", lambda *a, **k: other)
    assert check(after).passed
    far = before if abs(after - before) > p.band.within * after else None
    if far is not None:
        assert not check(far).passed


def test_the_new_code_checkers_pass_their_answers_and_say_what_is_wrong():
    from kernels.bench import attention_flops

    scores = exercises.get("0.3").check
    assert scores(lambda B, H, S_q, S_k, itemsize: B * H * S_q * S_k * itemsize).passed
    wrong = scores(lambda B, H, S_q, S_k, itemsize: B * S_q * S_k * itemsize)
    assert not wrong.passed and "B x H" in wrong.lines[0]

    tflops = exercises.get("10.3").check
    assert tflops(lambda r: attention_flops(r["B"], r["H"], r["S_q"], r["S_k"], r["D"],
                                            r["causal"]) / (r["median_ms"] * 1e-3) / 1e12).passed
    wrong = tflops(lambda r: 4 * r["B"] * r["H"] * r["S_q"] * r["S_k"] * r["D"]
                   / (r["median_ms"] * 1e-3) / 1e12)
    assert not wrong.passed and "causal" in wrong.lines[-1]
    assert not tflops(lambda r: r["flops"] / r["median_ms"]).passed  # the records' own are gone
