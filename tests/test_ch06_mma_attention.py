"""Chapter 6: FlashAttention-2 with mma.sync, compiled by NVRTC. Without a GPU: the
fragment layouts, the machine code (HMMA.16816, LDSM, no local memory) for sm_80, sm_86,
sm_89 and sm_90, the shared-memory budgets and the refusals. On a GPU: every step, the
sweep and the Triton peer against the reference, fp16 and bf16."""

import functools

import pytest

import kernels
from conftest import (HOT_LOCAL_MEMORY, ON_GPU, SHAPES, array_libraries, gpu_only,
                      growing_scores, refuses_misaligned_views_and_too_many_heads,
                      rows_that_see_no_key, shape_id, sim_only, toolchain_major)
from kernels import compile_report
from kernels.check import check_attention, random_inputs
from kernels.chapters.ch06_mma_attention import (ARCHS, CONFIGS, DTYPES, KERNELS, STEPS,
                                                 SWEEP, compile_cubin, flash_attention_2,
                                                 fragment_owner, launch_mma, nvrtc_options,
                                                 refusal, shared_bytes)

MAIN = "flash_attention_2"
report = functools.cache(compile_report.report)
compile_only = pytest.mark.skipif(ON_GPU, reason="compile-only; runs without a GPU")
#: opt-in shared memory a block may have: A100, RTX 30 / L4 / RTX 40, H100 / H200
SHARED_LIMITS = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024,
                 "sm_90": 227 * 1024}


def test_fragment_layouts_cover_every_element_once():
    for operand, rows, cols, registers in (("a", 16, 16, 4), ("b", 16, 8, 2), ("c", 16, 8, 4)):
        owners = [fragment_owner(operand, r, c) for r in range(rows) for c in range(cols)]
        per_slot = 2 if operand in "ab" else 1  # two 16-bit elements a register
        assert all(0 <= lane < 32 and 0 <= reg < registers for lane, reg in owners)
        assert max(owners.count(o) for o in owners) == per_slot
        assert len(set(owners)) == 32 * registers


def test_two_accumulator_tiles_are_one_a_fragment():
    """Why P never leaves the registers: element (row, key) of a 16-key chunk of S sits,
    as an accumulator of its 8-key tile, in the same lane that holds it as the A operand,
    and the register pairs match the packing of accumulate_pv."""
    for row in range(16):
        for key in range(16):
            lane_c, reg_c = fragment_owner("c", row, key % 8)
            lane_a, reg_a = fragment_owner("a", row, key)
            assert lane_c == lane_a
            assert reg_a == reg_c // 2 + 2 * (key // 8)  # a[i] = pack(c[2h], c[2h + 1])
    with pytest.raises(ValueError, match="operand must be"):
        fragment_owner("d", 0, 0)


def test_options_carry_the_switches_and_the_shared_size():
    opts = nvrtc_options(STEPS[MAIN], 128, "bfloat16")
    assert "-DBF16=1" in opts and "-DHEAD_DIM=128" in opts and "-DKEYS=64" in opts
    assert "-DQ_REGISTERS=0" in opts and "-DLANE_OFFSETS=1" in opts
    assert f"-DSHARED_BYTES_EXPECTED={shared_bytes(STEPS[MAIN], 128)}" in opts
    assert "-DQ_REGISTERS=1" in nvrtc_options(STEPS[MAIN], 64)


def test_shared_size_mismatch_does_not_compile():
    opts = [o if not o.startswith("-DSHARED_BYTES_EXPECTED") else "-DSHARED_BYTES_EXPECTED=1"
            for o in nvrtc_options(STEPS[MAIN], 64)]
    with pytest.raises(RuntimeError, match="shared memory size differs"):
        compile_report.nvrtc_cubin(kernels.chapters.ch06_mma_attention.SOURCE, opts, "sm_90")


@pytest.mark.parametrize("arch", sorted(SHARED_LIMITS))
def test_every_step_fits_the_shared_memory_of_every_target(arch):
    """Every step runs on every target; a sweep entry too, or it is refused by name."""
    for name, cfg in CONFIGS.items():
        for D in (64, 128):
            fits = shared_bytes(cfg, D) <= SHARED_LIMITS[arch]
            assert fits or name in SWEEP, (name, D, arch)
            why = refusal(name, D, (int(arch[3]), int(arch[4])), SHARED_LIMITS[arch], "GPU")
            assert (why is None) == fits and (fits or "on this GPU" in why)


def test_older_gpus_and_small_shared_memory_are_refused_by_name():
    why = refusal(MAIN, 64, (7, 5), 64 * 1024, "Tesla T4")
    assert "Tesla T4 is 7.5" in why and "wmma_copy16" in why
    why = refusal("fa2_stages_4", 128, (8, 9), 64 * 1024, "small GPU")
    assert "163840 bytes of shared memory at D=128" in why and "65536" in why


@compile_only
def test_machine_code_has_hmma16816_ldsm_and_no_local_memory():
    rows = report("mma_attention")
    assert {r["arch"] for r in rows} == set(compile_report.build_archs("mma_attention", ARCHS))
    for r in rows:
        step = STEPS[r["kernel"].split()[0]]
        assert "HMMA.16816.F32" in r["sass"], (r["kernel"], r["arch"])
        assert ("LDSM" in r["sass"]) == step.ldmatrix, (r["kernel"], r["arch"])
        assert ("LDGSTS" in r["sass_counts"]) == (step.stages > 1), r["kernel"]
        assert 0 < r["registers"] <= 255
        # a build may keep a register or two in local memory around the slow path of a
        # shuffle on a split warp, which these warps never take (sm_80 at D = 128; CUDA
        # 12's mma_unpadded at D = 64 on sm_86), as test_reader_gpus allows; and the steps
        # of conftest.HOT_LOCAL_MEMORY reload a value or two once a key tile
        assert (r["stack_bytes"] == 0 and "LDL" not in r["sass_counts"]) or (
            compile_report.cold_local_memory(r["sass"])) or (
            (r["kernel"], r["arch"]) in HOT_LOCAL_MEMORY[toolchain_major()]), (
            r["kernel"], r["arch"])
    bf16 = [r for r in rows if r["kernel"].endswith("bfloat16")]
    assert bf16 and all("HMMA.16816.F32.BF16" in r["sass"] for r in bf16)


@compile_only
def test_lane_offsets_take_integer_work_out_of_the_loop():
    """Same multiplies and loads, fewer integer instructions (address arithmetic)."""
    rows = {r["kernel"]: r for r in report("mma_attention") if r["arch"] == "sm_90"}
    for D in (64, 128):
        before = rows[f"mma_two_row_tiles D={D} float16"]["sass"]
        after = rows[f"mma_lane_offsets D={D} float16"]["sass"]
        count = compile_report.opcode_count
        for op in ("HMMA", "LDSM", "LDGSTS"):
            assert count(after, op) == count(before, op), (D, op)
        integer = ("IMAD", "LOP3", "IADD3", "SHF", "LEA")
        assert sum(count(after, op) for op in integer) < sum(count(before, op) for op in integer)


@compile_only
def test_sweep_compiles_without_spills():
    for name in SWEEP:
        for D in (64, 128):
            usage = compile_report.compile_cuda(kernels.chapters.ch06_mma_attention.SOURCE,
                                                nvrtc_options(SWEEP[name], D), "sm_90", name)
            assert usage["stack_bytes"] == 0, (name, D)


@compile_only
def test_bf16_compiles_for_sm80():
    assert len(compile_cubin(MAIN, 128, "bfloat16", "sm_80")) > 0


@sim_only
def test_refuses_to_run_without_a_gpu():
    q, k, v, _ = random_inputs(1, 1, 4, 4, 64)
    for name in (MAIN, "triton_attention"):
        with pytest.raises(RuntimeError, match="runs on a GPU only"):
            KERNELS[name](q, k, v)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [MAIN, "triton_attention"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_main_kernels_match_reference(shape, name, dtype):
    assert check_attention(KERNELS[name], *shape, lse=True, dtype=dtype).ok


@gpu_only
@pytest.mark.parametrize("name", sorted(set(STEPS) - {MAIN}))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_steps_match_reference(name, shape):
    assert check_attention(KERNELS[name], *shape, lse=True).ok


@gpu_only
@pytest.mark.parametrize("name", sorted(SWEEP))
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[2] != s[3]][:2] + SHAPES[-2:],
                         ids=shape_id)
def test_sweep_matches_reference(name, shape):
    """Ragged, causal with S_q != S_k, and full-size shapes: the sweep entries share
    every line of source with the steps, so fewer shapes suffice."""
    assert check_attention(KERNELS[name], *shape, lse=True).ok


@gpu_only
@pytest.mark.parametrize("name", [MAIN, "mma_fragments", "triton_attention"])
def test_negative_scale_and_large_logits(name):
    assert check_attention(KERNELS[name], 1, 3, 300, 300, 64, True, scale=-0.2, lse=True).ok
    for dtype in DTYPES:
        assert check_attention(KERNELS[name], 2, 4, 1024, 1024, 128, True, std=10.0,
                               lse=True, dtype=dtype).ok


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("growth", [0.5, 0.05])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["mma_lane_offsets", MAIN])
def test_scores_that_grow_along_the_keys(name, D, growth, dtype):
    """Every row's maximum rises along the keys: at growth 0.5 by more than 8 (base 2) a
    tile, so the chapter's kernel rescales O on every tile; at 0.05 slowly, so it keeps
    an old maximum for several tiles, with P up to 2^8."""
    assert check_attention(KERNELS[name], 1, 2, 200, 1000, D, True, dtype=dtype, lse=True,
                           inputs=growing_scores(D, growth, dtype)).ok


@gpu_only
@pytest.mark.parametrize("name", [MAIN, "triton_attention"])
def test_rows_that_see_no_key_give_zero_and_minus_inf(name):
    rows_that_see_no_key(KERNELS[name])


@gpu_only
@pytest.mark.parametrize("name", [MAIN, "triton_attention"])
def test_takes_torch_cupy_and_numba_arrays_and_bf16_tensors(name):
    array_libraries(KERNELS[name])


@gpu_only
def test_misaligned_views_and_too_many_heads_are_refused():
    refuses_misaligned_views_and_too_many_heads(
        flash_attention_2,
        lambda q, k, v: launch_mma(q, k, v, False, None, None, None, False, name=MAIN), alignment=16)
