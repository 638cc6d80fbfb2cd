"""Chapter 5: WMMA kernels compiled by NVRTC. Without a GPU: the headers, the
machine code (HMMA, registers, no local memory) for sm_75 to sm_90, the smaller
tilings and the launcher's refusals. On a GPU: every step against the reference, fp16
and bf16, and the smaller tilings run on a GPU standing in for one with less shared
memory."""

import functools
from pathlib import Path

import pytest

import kernels
from conftest import (HOT_LOCAL_MEMORY, ON_GPU, SHAPES, array_libraries, gpu_only,
                      growing_scores, refuses_misaligned_views_and_too_many_heads,
                      rows_that_see_no_key, shape_id, sim_only, toolchain_major)
from kernels import compile_report, gpus
from kernels.check import check_attention, random_inputs
from kernels.chapters.ch05_tensor_cores import (ARCHS, DTYPES, KERNELS, MAX_ROW_TILES,
                                                STEPS, T4, fitted, refusal, WmmaConfig,
                                                compile_cubin, cuda_include_dirs,
                                                launch_wmma, nvrtc_options, shared_bytes,
                                                tensor_core_attention)

MAIN = "tensor_core_attention"
report = functools.cache(compile_report.report)
compile_only = pytest.mark.skipif(ON_GPU, reason="compile-only; runs without a GPU")


def test_headers_are_found_and_a_missing_one_is_named(monkeypatch, tmp_path):
    found = [Path(d) for d in cuda_include_dirs()]
    assert any((d / "mma.h").is_file() for d in found)
    assert any((d / "crt" / "mma.h").is_file() for d in found)
    import kernels.chapters.ch05_tensor_cores as tc

    monkeypatch.setattr(tc.sys, "path", [str(tmp_path)])
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(tc, "Path", lambda p: tmp_path / "nowhere" / str(p).lstrip("/"))
    with pytest.raises(FileNotFoundError, match=r"pip install 'cuda-toolkit\[crt\]'"):
        cuda_include_dirs()


def test_cuda12_headers_split_over_two_packages_are_both_passed(monkeypatch, tmp_path):
    """CUDA 12's pip packages keep mma.h (runtime) and crt/mma.h (nvcc) apart."""
    import kernels.chapters.ch05_tensor_cores as tc

    runtime, nvcc = (tmp_path / "nvidia" / sub / "include" for sub in ("cuda_runtime", "cuda_nvcc"))
    (runtime / "mma.h").parent.mkdir(parents=True)
    (runtime / "mma.h").write_text("")
    (nvcc / "crt").mkdir(parents=True)
    (nvcc / "crt" / "mma.h").write_text("")
    monkeypatch.setattr(tc.sys, "path", [str(tmp_path)])
    assert cuda_include_dirs() == (str(runtime), str(nvcc))
    opts = nvrtc_options(STEPS[MAIN], 64, "float16")
    assert opts[:2] == (f"-I{runtime}", f"-I{nvcc}")


def test_options_carry_the_switches_and_the_shared_size():
    opts = nvrtc_options(STEPS[MAIN], 128, "bfloat16")
    assert opts[0].startswith("-I") and "-DBF16=1" in opts and "-DHEAD_DIM=128" in opts
    assert f"-DSHARED_BYTES_EXPECTED={shared_bytes(STEPS[MAIN], 128)}" in opts
    assert f"-DROW_TILES={MAX_ROW_TILES[128]}" in opts


def test_shared_size_mismatch_does_not_compile():
    """The source recomputes the launcher's shared-memory size and refuses a mismatch."""
    opts = [o if not o.startswith("-DSHARED_BYTES_EXPECTED") else "-DSHARED_BYTES_EXPECTED=1"
            for o in nvrtc_options(STEPS[MAIN], 64)]
    with pytest.raises(RuntimeError, match="shared memory size differs"):
        compile_report.nvrtc_cubin(kernels.chapters.ch05_tensor_cores.SOURCE, opts, "sm_90")


def test_every_step_fits_the_shared_memory_of_a_hopper_block():
    hopper = next(g for g in gpus.READER_GPUS if g.compute_capability == (9, 0))
    for name, cfg in STEPS.items():
        for D in (16, 32, 64, 128):
            assert shared_bytes(cfg, D) <= hopper.shared_optin, (name, D)
            assert fitted(cfg, D, hopper.shared_optin) == cfg
    assert shared_bytes(STEPS[MAIN], 64) > 48 * 1024  # past what Numba could launch


def test_smaller_gpus_get_a_smaller_tiling_or_a_refusal_by_name():
    l4 = gpus.READER_GPUS[3]
    cfg = fitted(STEPS["wmma_cp_async"], 128, l4.shared_optin)  # 110 KB at D = 128
    assert cfg.tiles_at(128) == (1, 32) and shared_bytes(cfg, 128) <= l4.shared_optin
    assert fitted(STEPS["wmma_copy16"], 64, T4.shared_optin).row_tiles == 1
    assert fitted(STEPS[MAIN], 64, 1024) is None
    assert "no smaller tiling fits the 1024" in refusal(MAIN, 64, (9, 0), 1024, "small GPU")
    why = refusal("wmma_cp_async", 64, *T4.limits())
    assert "cp.async" in why and "Tesla T4 is 7.5" in why and "wmma_copy16" in why
    assert "bf16" in refusal("wmma_copy16", 64, *T4.limits(), dtype="bfloat16")
    assert refusal("wmma_copy16", 128, *T4.limits()) is None


@compile_only
def test_machine_code_has_hmma_and_no_local_memory():
    rows = report("tensor_cores")
    assert {r["arch"] for r in rows} == set(compile_report.build_archs("tensor_cores", ARCHS)) | {
        T4.arch}  # and Blackwell's where the toolchain has them
    for r in rows:
        assert r["sass_counts"].get("HMMA", 0) > 0, (r["kernel"], r["arch"])
        assert 0 < r["registers"] <= 255
        # none in local memory, but for the builds conftest.HOT_LOCAL_MEMORY names (two
        # steps on sm_120, with CUDA 13)
        assert (r["stack_bytes"] == 0 and "LDL" not in r["sass_counts"]) or (
            (r["kernel"], r["arch"]) in HOT_LOCAL_MEMORY[toolchain_major()]), (
            r["kernel"], r["arch"])


@compile_only
def test_cp_async_steps_copy_with_ldgsts_and_the_others_do_not():
    for r in report("tensor_cores"):
        uses = "LDGSTS" in r["sass_counts"]
        assert uses == STEPS[r["kernel"].split()[0]].cp_async, r["kernel"]


@compile_only
def test_every_head_dim_compiles():
    for D in (16, 32):
        for dtype in DTYPES:
            assert len(compile_cubin(MAIN, D, dtype, "sm_80")) > 0


def test_config_rows_and_keys():
    assert STEPS[MAIN].tiles_at(64) == (2, 64) and STEPS[MAIN].tiles_at(128) == (1, 32)
    assert STEPS["wmma_first"].block_rows(64) == 16
    assert WmmaConfig().block_rows(128) == 64


@sim_only
def test_refuses_to_run_without_a_gpu():
    q, k, v, _ = random_inputs(1, 1, 4, 4, 64)
    with pytest.raises(RuntimeError, match="runs on a GPU only"):
        tensor_core_attention(q, k, v)


@gpu_only
@pytest.mark.parametrize("name,D", [("wmma_copy16", 64), ("tensor_core_attention", 64),
                                    ("wmma_cp_async", 128)])
def test_smaller_tilings_compute_the_same(monkeypatch, name, D):
    """The tilings a 64 KB (T4) or 99 KB (L4) GPU gets, run on this GPU: checked like
    the rest, and the launcher says which tiling it chose."""
    real = gpus.current()
    limit = 64 * 1024 if D == 64 else 99 * 1024
    small = gpus.Gpu("GPU with less shared memory", real.compute_capability, limit)
    monkeypatch.setattr(gpus, "current", lambda: small)
    assert fitted(STEPS[name], D, limit) != STEPS[name]
    with pytest.warns(UserWarning, match=f"{name} at D={D} needs .* it runs with"):
        assert check_attention(KERNELS[name], 2, 3, 200, 333, D, True, lse=True).ok


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_main_kernel_matches_reference(shape, dtype):
    assert check_attention(KERNELS[MAIN], *shape, lse=True, dtype=dtype).ok


@gpu_only
@pytest.mark.parametrize("name", sorted(set(KERNELS) - {MAIN}))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_steps_match_reference(name, shape):
    assert check_attention(KERNELS[name], *shape, lse=True).ok


@gpu_only
@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("D", [16, 32])
def test_small_head_dims(name, D):
    assert check_attention(KERNELS[name], 1, 2, 100, 77, D, True, lse=True).ok


@gpu_only
def test_large_logits_and_many_tiles():
    for dtype in DTYPES:
        assert check_attention(KERNELS[MAIN], 2, 4, 1024, 1024, 64, True, std=10.0,
                               lse=True, dtype=dtype).ok
    assert check_attention(KERNELS[MAIN], 1, 2, 1000, 1337, 128, True, lse=True).ok


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("growth", [0.5, 0.05])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["wmma_rescale_in_registers", MAIN])
def test_scores_that_grow_along_the_keys(name, D, growth, dtype):
    """Every row's maximum rises tile after tile: at growth 0.5 by more than 8 (base
    2) a tile at D = 64 and 128 (the chapter's kernel rescales O on every tile), at
    0.05 slowly (it keeps an old maximum for several tiles, with P up to 2^8)."""
    assert check_attention(KERNELS[name], 1, 2, 200, 1000, D, True, dtype=dtype, lse=True,
                           inputs=growing_scores(D, growth, dtype)).ok


@gpu_only
def test_rows_that_see_no_key_give_zero_and_minus_inf():
    rows_that_see_no_key(tensor_core_attention)


@gpu_only
def test_takes_torch_cupy_and_numba_arrays_and_bf16_tensors():
    array_libraries(tensor_core_attention)


@gpu_only
def test_misaligned_views_are_refused():
    refuses_misaligned_views_and_too_many_heads(
        tensor_core_attention,
        lambda q, k, v: launch_wmma(q, k, v, False, None, None, None, False, name=MAIN))
