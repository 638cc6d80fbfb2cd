"""The compiler's report, with no GPU: registers, spills, instruction mix."""

import pytest

import kernels
from kernels.compile_report import report


@pytest.fixture(scope="module")
def naive():
    return report("naive_attention")


def test_every_kernel_compiles_for_sm80_and_sm90(naive):
    module = kernels.chapter_module(1)
    names = {k.py_func.__name__ if hasattr(k, "py_func") else k.fn.__name__
             for k, _ in module.COMPILE_SIGNATURES}
    assert {(r["kernel"], r["arch"]) for r in naive} == {
        (n, a) for n in names for a in ("sm_80", "sm_90")}
    assert all(r["registers"] > 0 for r in naive)


def test_no_spills_or_local_memory(naive):
    for r in naive:
        assert r["spill_stores"] == r["spill_loads"] == r["stack_bytes"] == 0, r["kernel"]
        assert "LDL" not in r["sass_counts"] and "STL" not in r["sass_counts"], r["kernel"]


def test_fused_kernel_uses_shared_memory_and_barriers(naive):
    fused = next(r for r in naive if r["kernel"] == "minimal_fused_kernel")
    assert fused["shared_bytes"] == 128 * 4  # the float32 partial-sum array
    assert fused["sass_counts"]["BAR"] >= 2 and "MUFU" in fused["sass_counts"]
