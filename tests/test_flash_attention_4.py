"""FlashAttention-4 as a peer of the lean call: its measurement, what chapter 10 reads
of it, and (on a GPU where flash-attn-4 is installed) one shape measured for real."""

import matplotlib
import pytest

matplotlib.use("Agg")

import kernels  # noqa: E402
from kernels import flash_attention_4, plots, results, targets  # noqa: E402
from kernels.bench import Shape  # noqa: E402

from conftest import gpu_only  # noqa: E402

SHORT, LONG = Shape(32, 32, 512, 512, 64, causal=True), Shape(2, 16, 8192, 8192, 128)


def _row(shape, dtype, lean, fa4, sdpa):
    tflops = {"lean call": lean, "FlashAttention-4": fa4, "SDPA default": sdpa}
    return dict(shape=shape.as_dict(), dtype=dtype, tflops=tflops, ms={},
                errors={name: dict(rel_err=1e-3, max_abs_err=1e-3, ok=t is not None)
                        for name, t in tflops.items()})


RUN = {"measurements": {"flash_attention_4": dict(status="ok", rows=[
    _row(SHORT, "float16", 240, 250, 258), _row(LONG, "float16", 700, 650, 660),
    _row(SHORT, "bfloat16", 245, None, 258), _row(LONG, "bfloat16", 690, 640, 650)])}}


def test_chapter_7s_recording_measures_it_and_its_hash_guards_it():
    assert kernels.measuring_modules([7])["flash_attention_4"] is flash_attention_4
    assert flash_attention_4.USES_THE_LEAN_CALL  # measured again after the lean call's records
    assert results.code_text(flash_attention_4.measure_shape) in results.measured_parts(
        flash_attention_4)


def test_where_it_is_not_installed_the_measurement_says_so(monkeypatch):
    monkeypatch.setattr(flash_attention_4, "flash_attn_func", lambda: None)
    got = flash_attention_4.gpu_measurements()
    assert got["status"] == "not installed" and "rows" not in got


def test_the_target_counts_the_shapes_where_the_lean_call_is_at_least_as_fast():
    rows = {r["dtype"]: r for r in targets.against_flash_attention_4(RUN)}
    fp16 = rows["float16"]
    assert (fp16["met"], fp16["of"], fp16["at"]) == (1, 2, SHORT.label())
    assert fp16["worst"] == pytest.approx(240 / 250)
    assert targets.flash_attention_4_line(fp16) == (
        f"float16: the lean call at least FlashAttention-4's speed at 1 of 2 shapes; "
        f"the worst 0.960 at {SHORT.label()}")
    bf16 = rows["bfloat16"]  # a shape where FlashAttention-4 failed its check is left out
    assert (bf16["met"], bf16["of"]) == (1, 1)
    assert targets.against_flash_attention_4({"measurements": {}}) == []
    not_installed = {"measurements": {"flash_attention_4": {"status": "not installed"}}}
    assert targets.against_flash_attention_4(not_installed) == []


def test_the_figure_has_a_panel_a_head_dim_and_mask():
    fig = plots.against_peers(RUN["measurements"]["flash_attention_4"]["rows"])
    assert [ax.get_title() for ax in fig.axes] == ["D = 64, causal", "D = 128"]
    lines = fig.axes[0].get_lines()  # fp16 and bf16 over SDPA, fp16 over FA4, and the 1
    assert len(lines) == 4


@gpu_only
def test_one_shape_measured_for_real():
    fa4 = flash_attention_4.flash_attn_func()
    if fa4 is None:
        pytest.skip("flash-attn-4 is not installed")
    from kernels import gpus

    if gpus.current().compute_capability[0] != 9:
        pytest.skip("FlashAttention-4's Hopper kernel: an H100 or H200")
    row = flash_attention_4.measure_shape(Shape(1, 4, 1000, 1000, 64, causal=True), "bfloat16", fa4)
    assert all(e["ok"] for e in row["errors"].values()), row["errors"]
    assert all(t and t > 0 for t in row["tflops"].values())
