"""The scripts of benchmarks/ at a tiny size, without a GPU: each one's ``main`` parses
its arguments, resolves the kernels it names and runs as far as this machine allows."""
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counters_at_the_tiny_shape(capsys):
    counters = _script("counters")
    found = counters.main(["unfused_attention", "sdpa_default", "--tiny"])
    out = capsys.readouterr().out
    assert counters.TINY.label() in out
    if found.get("status") == "ncu not found":  # no Nsight Compute here: said, nothing counted
        assert "ncu not found" in out
    else:
        assert {n: k["status"] for n, k in found["kernels"].items()} == dict(
            unfused_attention="ok", sdpa_default="ok")


def test_counters_refuses_a_kernel_the_book_does_not_have():
    with pytest.raises(SystemExit):
        _script("counters").main(["no_such_kernel", "--tiny"])
