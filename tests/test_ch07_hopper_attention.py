"""Chapter 7: FlashAttention on Hopper (wgmma, TMA, mbarriers, warp specialisation),
compiled by NVRTC for sm_90a. Without a GPU: the machine code (HGMMA, UTMALDG, SYNCS,
USETMAXREG where a producer is, no local memory), the shared-memory budgets and the
refusals. On a GPU: every step and the sweep against the reference, fp16 and bf16, and
compute-sanitizer's racecheck and synccheck on a small ragged shape."""

import dataclasses
import functools
import os
import shutil
import subprocess
import sys

import pytest

import kernels
from conftest import (ON_GPU, SHAPES, array_libraries, gpu_only, growing_scores,
                      refuses_misaligned_views_and_too_many_heads, rows_that_see_no_key,
                      shape_id, sim_only)
from kernels import compile_report
from kernels.check import check_attention, random_inputs
from kernels.chapters.ch07_hopper_attention import (ARCHS, CONFIGS, DTYPES, KERNELS,
                                                    MAIN_HEAD_DIMS, STEPS, SWEEP,
                                                    WHAT_IFS, WIDE_KERNELS, WhatIf,
                                                    early_scores_without_final_wait, grid,
                                                    waits_before_the_epilogue,
                                                    head_dims,
                                                    hopper_attention, launch_hopper,
                                                    nvrtc_options, refusal, shared_bytes,
                                                    source, what_if_source)

MAIN = "hopper_attention"
report = functools.cache(compile_report.report)
compile_only = pytest.mark.skipif(ON_GPU, reason="compile-only; runs without a GPU")
H100_SHARED = 227 * 1024


def test_options_carry_the_switches_and_the_shared_size():
    opts = nvrtc_options(STEPS[MAIN], 128, "bfloat16")
    assert "-DBF16=1" in opts and "-DBLOCK_N=128" in opts and "-DCONSUMERS=3" in opts
    assert "-DPRODUCER=1" in opts and f"-DSHARED_BYTES_EXPECTED={shared_bytes(STEPS[MAIN], 128)}" in opts
    assert "-DOWN_KEYS=1" in opts and "-DOWN_KEYS=0" in nvrtc_options(STEPS["three_consumers"], 64)
    assert "-DBLOCK_N=128" in nvrtc_options(STEPS[MAIN], 64)
    assert "-DTMA_STORE=1" in opts and "-DTMA_STORE=0" in nvrtc_options(STEPS["persistent"], 128)
    assert "-DBLOCK_N=96" in nvrtc_options(STEPS["tma_store"], 128)


def test_o_tiles_take_shared_memory_where_tma_stores_o():
    """A tile of 64 rows of whole boxes a consumer; none where O is stored from
    registers (D = 256, and a third stage at D = 128, have no room for them)."""
    for D in (64, 128):
        tiles = shared_bytes(STEPS["tma_store"], D) - shared_bytes(STEPS["persistent"], D)
        assert tiles == 3 * 64 * 2 * D
    assert not STEPS[MAIN].at(256).tma_store and not CONFIGS["hopper_stages_3"].at(128).tma_store
    assert CONFIGS["hopper_stages_3"].at(64).tma_store
    for name in CONFIGS:
        for D in head_dims(name):
            assert shared_bytes(CONFIGS[name], D) <= H100_SHARED, (name, D)


def test_shared_size_mismatch_does_not_compile():
    opts = [o if not o.startswith("-DSHARED_BYTES_EXPECTED") else "-DSHARED_BYTES_EXPECTED=1"
            for o in nvrtc_options(STEPS[MAIN], 64)]
    with pytest.raises(RuntimeError, match="shared memory size differs"):
        compile_report.nvrtc_cubin(source(STEPS[MAIN], 64), opts, "sm_90a")


def test_every_kernel_fits_an_h100_and_is_refused_elsewhere_by_name():
    for name in CONFIGS:
        for D in (64, 128):
            assert shared_bytes(CONFIGS[name], D) <= H100_SHARED, (name, D)
            assert refusal(name, D, (9, 0), H100_SHARED, "H100") is None
    why = refusal(MAIN, 64, (8, 9), 99 * 1024, "NVIDIA L4")
    assert "NVIDIA L4 is 8.9" in why and "flash_attention_2" in why
    assert "wmma_copy16" in refusal(MAIN, 64, (7, 5), 64 * 1024, "Tesla T4")
    assert "a block may have 1024" in refusal(MAIN, 128, (9, 0), 1024, "small")


@compile_only
def test_machine_code_has_hgmma_tma_mbarriers_and_no_local_memory():
    rows = report("hopper_attention")
    assert {r["arch"] for r in rows} == set(ARCHS)
    assert {r["kernel"].split()[0] for r in rows} == set(STEPS)
    for r in rows:
        step = STEPS[r["kernel"].split()[0]]
        counts = r["sass_counts"]
        assert "HGMMA.64x" in r["sass"] and "UTMALDG" in r["sass"], r["kernel"]
        assert "SYNCS.PHASECHK" in r["sass"], r["kernel"]  # mbarrier waits
        assert ("USETMAXREG" in r["sass"]) == step.producer, r["kernel"]
        D = int(r["kernel"].split()[1][2:])
        assert ("UTMASTG" in r["sass"]) == step.at(D).tma_store, r["kernel"]  # TMA stores
        assert r["stack_bytes"] == 0 and "LDL" not in counts, r["kernel"]
        assert r["ptxas_notes"] == [], (r["kernel"], r["ptxas_notes"])  # no serialized wgmma
        assert "HMMA" not in counts and "LDSM" not in counts, r["kernel"]  # no mma.sync
    bf16 = [r for r in rows if r["kernel"].endswith("bfloat16")]
    assert bf16 and all(".BF16" in r["sass"] for r in bf16)


def compile_usage(name: str, D: int) -> dict:
    """Kernel ``name``'s registers and local memory at head dim D, compiled for sm_90a."""
    cfg = CONFIGS[name]
    return compile_report.compile_cuda(source(cfg, D), nvrtc_options(cfg, D), "sm_90a", name)


def test_early_scores_are_a_persistent_grids_and_d64s_only():
    causal = CONFIGS["hopper_causal_early_scores"]
    assert causal.at(64).early_scores and not causal.at(128).early_scores
    assert dataclasses.replace(causal, early_scores=False) == dataclasses.replace(
        CONFIGS["hopper_causal_persistent"], at_d128=causal.at_d128)
    early = CONFIGS["hopper_early_scores"]
    assert early.at(64).early_scores and not early.at(128).early_scores
    assert not early.at(256).early_scores
    assert "-DEARLY_SCORES=1" in nvrtc_options(early, 64)
    assert "-DEARLY_SCORES=0" in nvrtc_options(early, 128)
    assert dataclasses.replace(early, early_scores=False, at_d128=()) == dataclasses.replace(
        CONFIGS[MAIN], at_d128=())  # nothing else differs
    for no in (dict(persistent=False, causal_persistent=False), dict(overlap=True),
               dict(pingpong=True)):
        with pytest.raises(ValueError, match="early_scores needs a persistent grid"):
            dataclasses.replace(STEPS["persistent"], early_scores=True, **no)


@compile_only
def test_sweep_compiles_without_spills_or_serialized_multiplies():
    """No spills, and no note from ptxas that it serialized wgmma (C7517: a wait it put
    in where it could not tell that a multiply's registers were free)."""
    for name in SWEEP:
        for D in (64, 128):
            usage = compile_usage(name, D)
            assert usage["stack_bytes"] == 0, (name, D)
            assert usage["ptxas_notes"] == [], (name, D, usage["ptxas_notes"])


def test_wide_head_dims_take_whole_boxes_and_two_consumers_at_256():
    """D = 96 fills its tiles' second 64-column box with TMA's zeros (D = 128's tiles and
    settings); D = 256's O takes 128 registers a thread: two consumers, 80 keys a tile."""
    for name in WIDE_KERNELS:
        assert head_dims(name) == MAIN_HEAD_DIMS
        assert shared_bytes(CONFIGS[name], 96) == shared_bytes(CONFIGS[name], 128)
        assert shared_bytes(CONFIGS[name], 256) <= H100_SHARED
        assert refusal(name, 256, (9, 0), H100_SHARED, "H100") is None
    opts = nvrtc_options(STEPS[MAIN], 256)
    assert "-DCONSUMERS=2" in opts and "-DBLOCK_N=80" in opts and "-DHEAD_DIM=256" in opts
    assert "-DCONSUMERS=3" in nvrtc_options(STEPS[MAIN], 96)
    assert "m64n128k16" in source(STEPS[MAIN], 96) and "m64n96k16" not in source(STEPS[MAIN], 96)
    for name in set(CONFIGS) - set(WIDE_KERNELS):
        assert "not D=96" in refusal(name, 96, (9, 0), H100_SHARED, "H100")


@compile_only
def test_what_ifs_change_only_their_lines_and_compile_without_spills():
    for what_if, w in WHAT_IFS.items():
        original, changed = source(CONFIGS[w.kernel], 64), what_if_source(what_if, 64)
        for line, replacement in w.changes:
            assert original.count(line) == 1 and line not in changed, what_if
            assert replacement in changed, what_if
        usage = compile_report.compile_cuda(changed, nvrtc_options(w.config(), 64),
                                            "sm_90a", what_if)
        assert usage["stack_bytes"] == 0 and usage["spill_stores"] == 0, what_if
    fma = compile_report.compile_cuda(what_if_source("exp2 on the FMA pipe, every other tile", 64),
                                      nvrtc_options(CONFIGS[MAIN], 64), "sm_90a", "fma")
    kept = compile_usage(MAIN, 64)
    assert fma["sass_counts"]["MUFU"] < kept["sass_counts"]["MUFU"]  # the exponentials moved


def test_a_what_ifs_switches_leave_its_kernels_launch_as_it_is():
    switched = {name: w for name, w in WHAT_IFS.items() if w.switches}
    assert switched  # FlashAttention-4's schedule, the slices in a fixed order
    for name, w in switched.items():
        kernel, changed = CONFIGS[w.kernel], w.config()
        assert changed != kernel, name
        for D in head_dims(w.kernel):
            assert changed.at(D).threads() == kernel.at(D).threads(), name
            assert shared_bytes(changed, D) == shared_bytes(kernel, D), name
            for S, causal in ((300, True), (16384, False)):
                assert grid(changed, D, S, 64, causal, 132) == grid(kernel, D, S, 64, causal, 132)


@compile_only
def test_the_epilogue_takes_the_approximations_not_the_exact_forms_chains_and_slow_path():
    """inverse_sum and logsumexp as __fdividef and __log2f, against the what-if with
    1.f / sum and log2f: no call to the division's slow path and the logarithm's dozen
    FMAs gone, in both head dims; nor a slow path in the chapter's kernel."""
    what_if = "the epilogue's reciprocal and logarithm exact"
    for D in (64, 128):
        options = nvrtc_options(CONFIGS["hopper_dynamic_items"], D)
        approximate, exact = (compile_report.instructions(compile_report.compile_cuda(
            src, options, "sm_90a", f"D={D}")["sass"])
            for src in (source(CONFIGS["hopper_dynamic_items"], D), what_if_source(what_if, D)))
        assert "CALL.REL.NOINC" in exact and "CALL.REL.NOINC" not in approximate, D
        assert approximate.count("FFMA") <= exact.count("FFMA") - 20, D
        assert "MUFU.LG2" in approximate, D
    main = compile_report.compile_cuda(source(CONFIGS[MAIN], 64), nvrtc_options(CONFIGS[MAIN], 64),
                                       "sm_90a", "D=64")["sass"]
    assert "CALL.REL.NOINC" not in compile_report.instructions(main)


@compile_only
def test_the_descriptors_by_addition_take_fewer_uniform_instructions():
    """Each wgmma's descriptor as an add to the tile's (FlashAttention-4's machine code)
    in place of the mask, shift and moves of building it from the address."""
    def uniform(src):
        sass = compile_report.compile_cuda(src, nvrtc_options(CONFIGS[MAIN], 64), "sm_90a",
                                           "D=64")["sass"]
        return sum(op.startswith("U") for op in compile_report.instructions(sass))

    kept = uniform(source(CONFIGS[MAIN], 64))
    assert uniform(what_if_source("wgmma descriptors by addition", 64)) < kept - 24


def test_a_what_if_whose_line_is_not_in_the_source_is_refused(monkeypatch):
    monkeypatch.setitem(WHAT_IFS, "nothing", WhatIf(MAIN, (("no such line", "x"),)))
    with pytest.raises(ValueError, match="0 times, not once"):
        what_if_source("nothing", 64)


@compile_only
def test_wide_head_dims_compile_without_spills():
    for name in WIDE_KERNELS:
        for D in (96, 256):
            usage = compile_usage(name, D)
            assert usage["stack_bytes"] == 0 and usage["spill_stores"] == 0, (name, D)


@compile_only
def test_the_softmax_of_a_tile_is_long_chains():
    """A row's max and sum are each one running value, and the two rows of a thread go
    one after the other: the longest chain of the softmax's instructions holds at
    least both rows' maxima, 2 x 2 NT (NT: 8-key column tiles). SHORT_CHAINS, the one
    switch hopper_short_chains changes, halves it at least, for about as many
    instructions."""
    from kernels.chapters.ch07_hopper_attention import softmax_chain

    for D in (64, 128):
        chain = softmax_chain(STEPS[MAIN], D, masked=False)
        column_tiles = STEPS[MAIN].at(D).block_n // 8
        assert 4 * column_tiles <= chain["longest chain"] < chain["instructions a thread"]
        short = softmax_chain(CONFIGS["hopper_short_chains"], D, masked=False)
        assert 2 * short["longest chain"] < chain["longest chain"]
        assert short["instructions a thread"] < 1.1 * chain["instructions a thread"]
    options = set(nvrtc_options(CONFIGS["hopper_short_chains"], 128))
    assert options ^ set(nvrtc_options(STEPS[MAIN], 128)) == {"-DSHORT_CHAINS=0",
                                                             "-DSHORT_CHAINS=1"}


@sim_only
def test_refuses_to_run_without_a_gpu():
    q, k, v, _ = random_inputs(1, 1, 4, 4, 64)
    with pytest.raises(RuntimeError, match="runs on a GPU only"):
        hopper_attention(q, k, v)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_main_kernel_matches_reference(shape, dtype):
    assert check_attention(hopper_attention, *shape, lse=True, dtype=dtype).ok


#: (B, H, S_q, S_k, causal): ragged, unequal, causal both ways, and long enough that a
#: persistent block takes several items
WIDE_SHAPES = [(1, 3, 77, 130, True), (2, 4, 300, 300, False), (1, 2, 450, 200, True),
               (2, 4, 1000, 1000, True), (3, 50, 385, 385, False), (1, 8, 2048, 2048, False)]


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [96, 256])
@pytest.mark.parametrize("name", WIDE_KERNELS)
def test_wide_head_dims_match_reference(name, D, dtype):
    for B, H, S_q, S_k, causal in WIDE_SHAPES:
        assert check_attention(KERNELS[name], B, H, S_q, S_k, D, causal, lse=True,
                               dtype=dtype).ok, (B, H, S_q, S_k, causal)
    assert check_attention(KERNELS[name], 1, 2, 500, 500, D, True, std=10.0, lse=True,
                           dtype=dtype).ok


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
    assert check_attention(KERNELS[name], *shape, lse=True).ok


@gpu_only
@pytest.mark.parametrize("name", [MAIN, "intra_warpgroup_overlap", "wgmma_tma"])
def test_negative_scale_and_large_logits(name):
    assert check_attention(KERNELS[name], 1, 3, 300, 300, 64, True, scale=-0.2, lse=True).ok
    for dtype in DTYPES:
        assert check_attention(KERNELS[name], 2, 4, 1024, 1024, 128, True, std=10.0,
                               lse=True, dtype=dtype).ok


@gpu_only
@pytest.mark.parametrize("growth", [0.5, 0.05])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", [MAIN, "intra_warpgroup_overlap", "hopper_overlap"])
def test_scores_that_grow_along_the_keys(name, D, growth):
    """The rescale threshold's two paths, and the overlap's deferred rescale of O."""
    for dtype in DTYPES:
        assert check_attention(KERNELS[name], 1, 2, 200, 1000, D, True, dtype=dtype, lse=True,
                               inputs=growing_scores(D, growth, dtype)).ok


#: (B, H, S_q, S_k, D, causal) where the chapter's consumers compute different numbers
#: of tiles (causal, 192-row blocks), or none (every row past S_q, or before any key);
#: and, not causal, with more items than an H100 or H200 has multiprocessors, so that a
#: persistent block takes several, ragged ones among them
OWN_KEY_SHAPES = [(1, 2, 300, 300, 64, True), (1, 3, 385, 385, 128, False),
                  (1, 3, 385, 385, 128, True), (1, 2, 450, 200, 64, True),
                  (1, 2, 200, 450, 128, True), (1, 1, 64, 64, 64, True),
                  (2, 4, 2048, 2048, 64, True), (1, 2, 4096, 4096, 128, True),
                  (3, 50, 385, 385, 128, False), (4, 40, 300, 700, 64, False),
                  (2, 70, 1000, 77, 64, False), (8, 32, 1000, 1000, 64, False),
                  # long items after one a consumer skips: the others must not run a lap
                  # of the ring ahead of it (a version that let them hung here)
                  (2, 32, 8192, 8192, 64, False), (1, 16, 8192, 8192, 128, False),
                  # causal, with more items than multiprocessors: a persistent causal
                  # grid's blocks take several, of every cost
                  (4, 40, 300, 700, 64, True), (8, 32, 1000, 1000, 64, True)]


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", OWN_KEY_SHAPES, ids=shape_id)
@pytest.mark.parametrize("name", [MAIN, "hopper_overlap", "hopper_causal_persistent",
                                  "hopper_early_scores", "hopper_causal_early_scores"])
def test_consumers_that_skip_tiles_and_blocks_that_take_many_items(name, shape, dtype):
    """(hopper_overlap skips no tiles: its persistent blocks carry the overlap's ring
    positions from item to item; hopper_causal_persistent's blocks take causal items,
    of every cost, by row block, in sections of heads; hopper_early_scores's blocks
    issue each next item's first scores before the epilogue, at D = 64, and
    hopper_causal_early_scores's on the causal grid)"""
    assert check_attention(KERNELS[name], *shape, lse=True, dtype=dtype).ok


def test_persistent_grid_only_without_causal_masking_and_with_more_items_than_sms():
    cfg = STEPS[MAIN]
    assert cfg.persistent and STEPS["persistent"].persistent and not STEPS["own_keys"].persistent
    assert grid(cfg, 64, 4096, 64, False, 132) == (132, 1)  # 22 x 64 items
    assert grid(cfg, 64, 4096, 64, True, 132) == (22, 64)  # causal: a block an item
    assert grid(cfg, 128, 512, 8, False, 132) == (3, 8)  # fewer items than SMs
    assert grid(STEPS["own_keys"], 64, 4096, 64, False, 132) == (22, 64)
    with pytest.raises(ValueError, match="persistent grid needs the producer"):
        dataclasses.replace(STEPS["wgmma_tma"], persistent=True)
    assert grid(CONFIGS["hopper_overlap"], 128, 4096, 64, False, 132) == (132, 1)
    assert grid(CONFIGS["hopper_causal_persistent"], 64, 4096, 64, True, 132) == (132, 1)
    assert grid(CONFIGS["hopper_causal_persistent"], 64, 512, 8, True, 132) == (3, 8)
    with pytest.raises(ValueError, match="causal_persistent is a persistent grid's"):
        dataclasses.replace(STEPS["own_keys"], causal_persistent=True)
    assert CONFIGS["hopper_causal_persistent"].causal_sections
    assert grid(CONFIGS["hopper_causal_all_heads"], 64, 4096, 64, True, 132) == (132, 1)
    with pytest.raises(ValueError, match="causal_sections order a causal_persistent"):
        dataclasses.replace(STEPS[MAIN], causal_sections=True)


def test_sections_hold_the_heads_whose_k_and_v_fit_in_l2():
    """A power of two of heads whose K and V fit in L2_SECTION_BYTES together, a query head
    of grouped-query attention counting for its share; one at least, all at most."""
    from kernels.chapters.ch07_hopper_attention import L2_SECTION_BYTES, section_heads

    assert section_heads(256, 1, 2048, 64) == 64  # 512 KB a head: 100 fit
    assert section_heads(32, 1, 16384, 128) == 4  # 8 MB a head: 6 fit
    assert section_heads(128, 4, 8192, 128) == 32  # 4 MB a key/value head, 1 MB a query head
    assert section_heads(8, 1, 10 ** 7, 128) == 1  # none fits: one a section
    assert section_heads(3, 1, 512, 64) == 3  # all fit
    assert section_heads(1024, 1, 1024, 64) * 2 * 1024 * 64 * 2 <= L2_SECTION_BYTES


def test_a_section_what_if_sizes_the_sections_of_its_launches_alone():
    """The sections' what-ifs change the causal grid's sections, not its source, and only
    for the launches they describe: L2_SECTION_BYTES is back after each."""
    import kernels.chapters.ch07_hopper_attention as chapter

    sized = {name: w for name, w in WHAT_IFS.items() if w.section_mb}
    assert sized and all(not w.changes and CONFIGS[w.kernel].causal_sections
                         for w in sized.values())
    kept = chapter.L2_SECTION_BYTES
    with chapter.l2_section_bytes(8 * 2**20):
        assert chapter.section_heads(1024, 1, 512, 64) == 64  # 128 KB a head: 64 fit in 8 MB
    assert chapter.L2_SECTION_BYTES == kept and chapter.section_heads(1024, 1, 512, 64) == 256
    with pytest.raises(RuntimeError), chapter.l2_section_bytes(1):
        raise RuntimeError("a launch that fails")
    assert chapter.L2_SECTION_BYTES == kept


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_causal_grid_in_sections_takes_every_item_once(monkeypatch, dtype):
    """25 heads of 1200 causal rows (175 items, more than an H100's or H200's 132
    multiprocessors: a persistent grid) in sections of 4 heads and a last one of 1."""
    import kernels.chapters.ch07_hopper_attention as chapter

    monkeypatch.setattr(chapter, "L2_SECTION_BYTES", 5 * 2 * 1200 * 64 * 2)
    assert chapter.section_heads(25, 1, 1200, 64) == 4
    assert check_attention(KERNELS["hopper_causal_persistent"], 1, 25, 1200, 1200, 64, True,
                           lse=True, dtype=dtype).ok


@gpu_only
def test_rows_that_see_no_key_give_zero_and_minus_inf():
    rows_that_see_no_key(hopper_attention)


@gpu_only
def test_takes_torch_cupy_and_numba_arrays_and_bf16_tensors():
    array_libraries(hopper_attention)


@gpu_only
def test_misaligned_views_and_too_many_heads_are_refused():
    refuses_misaligned_views_and_too_many_heads(
        hopper_attention,
        lambda q, k, v: launch_hopper(q, k, v, False, None, None, None, False, name=MAIN), alignment=16)


SANITIZED = """
import kernels
from kernels.check import check_attention
from kernels.chapters.ch07_hopper_attention import KERNELS
for name in ("hopper_attention", "hopper_overlap", "intra_warpgroup_overlap", "wgmma_tma"):
    # 300 causal rows: consumers of one block compute 1, 1 and 2 tiles, and one none
    # 140 heads of 100 rows: persistent blocks take one or two items, two consumers idle
    for shape in ((1, 2, 77, 200, 64, True), (1, 1, 150, 100, 128, False),
                  (1, 2, 300, 300, 64, True), (1, 140, 100, 100, 64, False)):
        assert check_attention(KERNELS[name], *shape, lse=True).ok, (name, shape)
"""


@gpu_only
@pytest.mark.parametrize("tool", ["racecheck", "synccheck"])
def test_compute_sanitizer_finds_nothing(tool):
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(sanitizer):
        pytest.skip("compute-sanitizer is not installed")
    proc = subprocess.run([sanitizer, "--tool", tool, "--report-api-errors", "no",
                           "--kernel-name", "kns=attention_kernel",
                           sys.executable, "-c", SANITIZED],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FA_BOOK_MODE": "gpu"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-3000:]


@compile_only
def test_the_early_scores_run_under_the_epilogue_only_with_the_wait_after_the_loop():
    """With the wait after the loop, nothing waits for the next item's first scores
    before the epilogue; without it, ptxas puts a wait there (C7517)."""
    notes, waits = waits_before_the_epilogue(source(CONFIGS["hopper_early_scores"], 64))
    assert notes == [] and waits == []
    notes, waits = waits_before_the_epilogue(early_scores_without_final_wait(64))
    assert any("C7517" in n for n in notes) and waits == ["WARPGROUP.DEPBAR.LE"]


@gpu_only
def test_a_section_what_if_computes_attention():
    """The causal grid in sections of 8 MB (1024 items of 192 rows, sections of 32 heads)
    is still attention, with its logsumexp."""
    from kernels.chapters.ch07_hopper_attention import what_if_kernel

    assert check_attention(what_if_kernel("sections of 8 MB"), 4, 64, 600, 600, 64, True,
                           lse=True).ok


@gpu_only
@pytest.mark.parametrize("what_if", ["FlashAttention-4's schedule at D = 64",
                                     "wgmma descriptors by addition",
                                     "slices in a fixed order",
                                     "the epilogue's reciprocal and logarithm exact"])
def test_a_what_if_of_lines_or_switches_computes_attention(what_if):
    """Tiles cut by S_k and by the diagonal, S_q != S_k both ways, rows no key is seen by,
    a persistent grid's blocks with one item or two, and bf16 (and the counter's slices
    in a fixed order, the one what-if with switches only; and its epilogue's exact
    reciprocal and logarithm)."""
    from kernels.chapters.ch07_hopper_attention import what_if_kernel

    fn = what_if_kernel(what_if)
    shapes = [(1, 3, 300, 129, 64, True, "float16"), (1, 3, 129, 300, 64, True, "bfloat16"),
              (2, 70, 333, 333, 64, False, "float16"), (1, 140, 100, 100, 64, False, "float16")]
    if what_if != "FlashAttention-4's schedule at D = 64":  # (D = 64's alone)
        shapes.append((1, 2, 77, 200, 128, True, "float16"))
    for B, H, S_q, S_k, D, causal, dtype in shapes:
        assert check_attention(fn, B, H, S_q, S_k, D, causal, lse=True, dtype=dtype).ok, \
            (what_if, B, H, S_q, S_k, D, causal, dtype)


def test_items_from_a_counter_are_a_persistent_grids_in_the_items_own_order():
    cfg = CONFIGS["hopper_dynamic_items"]
    assert "-DDYNAMIC_ITEMS=1" in nvrtc_options(cfg, 64)
    assert all("-DDYNAMIC_ITEMS=0" in nvrtc_options(CONFIGS[name], 64)
               for name in CONFIGS if name != "hopper_dynamic_items")
    for no in (dict(persistent=False, causal_persistent=False), dict(causal_sections=True),
               dict(early_scores=True)):
        with pytest.raises(ValueError, match="dynamic_items"):
            dataclasses.replace(cfg, **no)
    assert grid(cfg, 64, 512, 1024, True, 132) == (132, 1)  # causal calls persistent too


def test_only_the_counters_items_take_their_slices_in_turn():
    """ROTATE_ROWS moves which 64-row slice of an item a consumer computes, so each must
    walk its own slice's tiles (own keys); the early scores pick the next item's slice
    before its Q lands, and are refused with it."""
    assert "-DROTATE_ROWS=1" in nvrtc_options(CONFIGS["hopper_dynamic_items"], 64)
    assert all("-DROTATE_ROWS=0" in nvrtc_options(CONFIGS[name], 64)
               for name in CONFIGS if name != "hopper_dynamic_items")
    with pytest.raises(ValueError, match="rotate_rows"):
        dataclasses.replace(CONFIGS["hopper_overlap"], rotate_rows=True)
    with pytest.raises(ValueError, match="rotate_rows"):
        dataclasses.replace(CONFIGS["hopper_early_scores"], rotate_rows=True)


@gpu_only
def test_slices_taken_in_turn_compute_attention_item_after_item():
    """Blocks that take several items each, so that every consumer takes every slice:
    one-block heads cut by S_q, causal rows past S_k and before it, both head dims, bf16."""
    kernel = KERNELS["hopper_dynamic_items"]
    for B, H, S_q, S_k, D, causal, dtype in [
            (2, 300, 129, 129, 64, True, "float16"), (4, 33, 512, 512, 64, True, "bfloat16"),
            (1, 90, 300, 129, 64, True, "float16"), (1, 90, 129, 300, 64, True, "float16"),
            (2, 100, 300, 300, 128, True, "float16"), (3, 60, 640, 640, 128, False, "bfloat16")]:
        assert check_attention(kernel, B, H, S_q, S_k, D, causal, lse=True, dtype=dtype).ok, (
            B, H, S_q, S_k, D, causal, dtype)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_items_from_a_counter_are_each_taken_once_call_after_call(dtype):
    """Persistent grids (more items than multiprocessors), causal and not, ragged, and
    one of a few items, each twice: a call that left its counters off zero would hand
    the next one's blocks items past the end, and rows would go unwritten."""
    kernel = KERNELS["hopper_dynamic_items"]
    for B, H, S, D, causal in [(1, 25, 1200, 64, True), (3, 40, 777, 128, True),
                               (2, 70, 333, 64, False), (1, 2, 100, 128, True)] * 2:
        assert check_attention(kernel, B, H, S, S, D, causal, lse=True, dtype=dtype).ok, (
            B, H, S, D, causal)
