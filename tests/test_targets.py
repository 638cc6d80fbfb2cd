"""The book's targets for the lean call, as chapter 10 reads them from each recorded run."""

import pytest

from kernels import results, targets

FILES = results.results_files()


def test_forward_targets_read_the_lean_calls_form_against_sdpa_and_the_book():
    from kernels.bench import Shape

    shape = Shape(2, 4, 1024, 1024, 64)
    base = dict(B=2, H=4, S_q=1024, S_k=1024, D=64, causal=False, status="ok")

    def rec(kernel, dtype, tflops, sdpa_ms=None):
        flops = shape.flops
        return dict(base, kernel=kernel, dtype=dtype, tflops=tflops, flops=flops,
                    median_ms=flops / tflops / 1e9, sdpa_default_ms=sdpa_ms)

    ms = shape.flops / 400 / 1e9  # the time of 400 TFLOPS
    run = {"records": [
        rec("hopper_attention", "float16", 400, sdpa_ms=ms * 1.1),
        rec("hopper_overlap", "float16", 380, sdpa_ms=ms),
        rec("hopper_attention", "bfloat16", 360, sdpa_ms=ms * 0.9),
        rec("hopper_overlap", "bfloat16", 390, sdpa_ms=ms),
        rec("hopper_stages_3", "float16", 410),  # a book kernel the lean call does not run
        rec("triton_attention", "float16", 500),  # a peer: not the book's
    ]}
    assert targets.lean_call_form(run["records"], shape) == "hopper_attention"
    assert targets.lean_call_form(run["records"], shape, "bfloat16") == "hopper_overlap"
    fp16 = targets.forward_measures(run, shape, "float16")
    assert fp16 == pytest.approx({"vs SDPA default": 1.1, "of the fastest": 400 / 410,
                                  "bf16 / fp16": 390 / 400})
    bf16 = targets.forward_measures(run, shape, "bfloat16")  # bf16's own form
    assert bf16 == pytest.approx({"vs SDPA default": 390 / 400, "of the fastest": 1.0,
                                  "bf16 / fp16": 390 / 400})
    rows = {(r["target"], r["dtype"]): r for r in targets.forward_targets(run, [shape])}
    speed = rows[("at least SDPA default's speed, S >= 1024", "float16")]
    assert (speed["met"], speed["of"], speed["at"]) == (1, 1, shape.label())
    assert rows[("at least SDPA default's speed, S >= 1024", "bfloat16")]["met"] == 0
    assert rows[("within 3% of the book's fastest kernel", "float16")]["met"] == 1
    assert rows[("within 3% of the book's fastest kernel", "bfloat16")]["met"] == 1
    assert rows[("bf16 within 5% of fp16", "both")]["worst"] == pytest.approx(390 / 400)
    assert not any("S <= 512" in target for target, _ in rows)  # no such shape given


def test_the_ratio_over_rounds_spans_the_kernels_own_spread():
    from kernels.bench import Shape

    shape = Shape(1, 2, 4096, 4096, 128)
    run = {"records": [dict(B=1, H=2, S_q=4096, S_k=4096, D=128, causal=False, status="ok",
                            kernel="hopper_attention", dtype="float16", tflops=600,
                            flops=shape.flops, median_ms=2.0, min_ms=1.9, max_ms=2.2,
                            sdpa_default_ms=2.1, reps=6)]}
    record = targets.lean_call_record(run, shape, "float16")
    assert record is run["records"][0]
    assert targets.lean_call_record(run, shape, "bfloat16") is None
    low, high = targets.ratio_over_rounds(record)
    assert (low, high) == pytest.approx((2.1 / 2.2, 2.1 / 1.9))
    assert low < targets.forward_measures(run, shape, "float16")["vs SDPA default"] < high


def test_decoding_targets_read_chapter_8s_grouped_decoding_through_the_lean_call():
    def row(B, dtype, lean_us, sdpa_us, kv_bytes, of_copy):
        return dict(B=B, H=32, H_kv=8, S_k=8192, D=128, dtype=dtype, kv_bytes=kv_bytes,
                    us={"lean call": lean_us, "SDPA default": sdpa_us},
                    of_copy={"lean call": of_copy})

    run = {"measurements": {"layouts": {"gqa_decoding": [
        row(1, "float16", 20.0, 21.0, 32 << 20, 0.35),  # small: the copy target leaves it out
        row(16, "float16", 100.0, 99.0, 512 << 20, 0.95),
        row(1, "bfloat16", 22.0, 21.0, 32 << 20, 0.33),
        row(16, "bfloat16", 100.0, 101.0, 512 << 20, 0.85)]}}}
    rows = {(r["target"], r["dtype"]): r for r in targets.decoding_targets(run)}
    slower = rows[("decoding: no slower than SDPA default", "float16")]
    assert (slower["met"], slower["of"], slower["worst"]) == (1, 2, 0.99)
    assert slower["at"] == "B=16 H=32 H_kv=8 S_k=8192 D=128"
    assert slower["short"] == {"B=16 H=32 H_kv=8 S_k=8192 D=128": 0.99}
    copy = rows[("decoding, 0.5 GB of K and V or more: 90% of the copy ceiling", "bfloat16")]
    assert (copy["met"], copy["of"], copy["worst"]) == (0, 1, 0.85)
    assert rows[("decoding: no slower than SDPA default", "bfloat16")]["short"] == {
        "B=1 H=32 H_kv=8 S_k=8192 D=128": pytest.approx(21 / 22)}
    assert rows[("decoding: bf16 within 5% of fp16", "both")]["worst"] == pytest.approx(20 / 22)
    assert targets.decoding_targets({"measurements": {}}) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
@pytest.mark.recorded_results
def test_the_lean_calls_form_read_from_a_run_is_the_one_it_takes(path, monkeypatch):
    """targets.lean_call_form, which chapter 10 reads each GPU's targets with, names the
    form launch.rows_kernel takes on that GPU, from that GPU's records, in each dtype."""
    from kernels import gpus, launch
    from kernels.bench import STANDARD_SUITE

    data = results.load(path)
    monkeypatch.setattr(results, "load", lambda *a, **k: data)
    launch.recorded_tflops.cache_clear()
    try:
        gpu = gpus.recorded(data["provenance"])
        for s in STANDARD_SUITE:
            for dtype in ("float16", "bfloat16"):
                taken = launch.rows_kernel(gpu, s.B * s.H, s.S_q, s.D, s.S_k, s.causal,
                                           dtype)[1]
                assert targets.lean_call_form(data["records"], s, dtype) == taken, (
                    s.label(), dtype)
    finally:
        launch.recorded_tflops.cache_clear()
