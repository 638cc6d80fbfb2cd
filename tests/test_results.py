"""The committed GPU results: present, complete, and recorded from today's kernels."""

import pytest

import kernels
from kernels.check import TOLERANCES
from kernels import record, results

pytestmark = pytest.mark.recorded_results

FILES = results.results_files()
PROVENANCE = {"gpu", "compute_capability", "driver", "cuda_runtime", "torch", "cudnn",
              "numba", "numba_cuda", "cupy", "date", "git_commit"}
RECORD = {"chapter", "kernel", "B", "H", "S_q", "S_k", "D", "dtype", "causal", "status",
          "sdpa_default_ms", "sdpa_flash_ms", "source_hash"}
TIMED = {"median_ms", "min_ms", "max_ms", "tflops", "rel_err"}


def test_results_are_committed():
    assert FILES, "no results/*.json: run tools/gpu_record.sh on an H100 or H200"
    names = {results.load(p)["provenance"]["gpu"] for p in FILES}
    assert any("H100" in n or "H200" in n for n in names), names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_results_are_fresh(path):
    """Fails when a kernel changed after its results were recorded: re-record."""
    data = results.load(path)
    stale = results.stale(data) + results.stale_measurements(data)
    assert not stale, "re-record on a GPU (tools/gpu_record.sh): " + "; ".join(stale)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_results_are_complete(path):
    data = results.load(path)
    assert PROVENANCE <= set(data["provenance"])
    assert data["tests"].get("returncode") == 0, "recorded while tests failed"
    kernel_records = [r for r in data["records"] if not r["kernel"].startswith("sdpa_")]
    recorded = {r["kernel"] for r in kernel_records}
    assert recorded == {name for _, name, _ in kernels.all_kernels()}
    for r in kernel_records:
        assert RECORD <= set(r), r["kernel"]
        assert r["status"] in ("ok", "skipped"), (r["kernel"], r.get("note"))
        if r["status"] == "ok":
            tol = TOLERANCES[r.get("dtype", "float16")].rel
            assert TIMED <= set(r) and r["rel_err"] < tol and r["min_ms"] <= r["median_ms"]
        else:
            assert "predicted" in r["note"]
    # every kernel was measured at the journey's H100 shape (a decoding kernel, at the
    # first decoding shape)
    decoding = {name for name, shapes in record.shape_sets().items() if shapes == "decoding"}
    for name in recorded:
        want = ((1, 32, 1, 128, False) if name in decoding else (16, 16, 2048, 64, False))
        assert any(r["kernel"] == name and r["status"] == "ok" and
                   (r["B"], r["H"], r["S_q"], r["D"], r["causal"]) == want
                   for r in kernel_records), name



@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_form_the_lean_call_chooses_among_has_a_record_at_the_shapes_of_few_heads(path):
    """kernels.launch.rate_shape reads the forms' rates at the causal calls of few heads
    too (kernels.bench.FEW_HEADS_SHAPES): each form recorded there in each of its
    dtypes, or the choice there falls back to a form's padded work alone."""
    from kernels import launch
    from kernels.bench import FEW_HEADS_SHAPES

    data = results.load(path)
    dtypes = record.record_dtypes()
    missing = [(name, shape.label(), dtype) for shape in FEW_HEADS_SHAPES
               for name in launch.forms(shape.D, True) if name in record.also_shape_sets()
               for dtype in dtypes.get(name, ("float16",))
               if not results.timed(data["records"], name, shape, dtype)]
    assert not missing, f"record chapter 7's few_heads set (--shape-set few_heads): {missing}"
