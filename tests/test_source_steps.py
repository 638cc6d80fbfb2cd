"""kernels.source_steps: the preprocessor that shows a step as the lines it changes."""

import pytest

from kernels.source_steps import defines, preprocess, step_changes

SOURCE = """a
#if A
b
#if !B && C > 1  // nested
c
#elif B || D
d
#else
e
#endif
#else
f
#endif
#ifdef C
g
#endif
h"""


@pytest.mark.parametrize("macros, kept", [
    ({"A": 1, "B": 0, "C": 2}, "abcgh"),
    ({"A": 1, "B": 1, "C": 2}, "abdgh"),
    ({"A": 1, "C": 1}, "abegh"),  # B undefined: 0
    ({"A": 1, "D": 1}, "abdh"),
    ({"A": 0, "C": 0}, "afgh"),
    ({}, "afh"),
])
def test_preprocess_keeps_what_the_compiler_keeps(macros, kept):
    assert "".join(preprocess(SOURCE, macros)) == kept


def test_unbalanced_source_is_refused():
    with pytest.raises(ValueError, match="unbalanced"):
        preprocess("#if A\nx", {"A": 1})


def test_defines_read_nvrtc_options():
    assert defines(["-DA=1", "-DB=-3", "-DC", "--std=c++17", "-I/x"]) == {"A": 1, "B": -3, "C": 1}


def test_step_changes_show_the_switches_and_the_lines():
    switches, diff = step_changes(SOURCE, ["-DA=1", "-DB=0", "-DC=2"], ["-DA=1", "-DB=1", "-DC=2"])
    assert switches == {"B": (0, 1)}
    assert "-c" in diff.splitlines() and "+d" in diff.splitlines()
    assert step_changes(SOURCE, ["-DA=1"], ["-DA=1"]) == ({}, "")


def test_chapter_7_steps_read_as_their_edits():
    """The chapter's new steps change the lines they are named for, and nothing else."""
    from kernels.chapters.ch07_hopper_attention import (COMPUTE_SOURCE, CONFIG_SOURCE,
                                                        KERNEL_SOURCE, STEPS,
                                                        nvrtc_options)

    source = "\n".join([CONFIG_SOURCE, COMPUTE_SOURCE, KERNEL_SOURCE])

    def change(before, after):
        return step_changes(source, nvrtc_options(STEPS[before], 128),
                            nvrtc_options(STEPS[after], 128))

    switches, diff = change("three_consumers", "uniform_warpgroup")
    assert switches == {"UNIFORM_WARPGROUP": (0, 1)} and "__shfl_sync" in diff
    assert len([l for l in diff.splitlines() if l[:1] in "+-"]) == 2
    switches, diff = change("uniform_warpgroup", "own_keys")
    assert switches == {"OWN_KEYS": (0, 1)} and "release(sh.k_free(ring + t));" in diff
    assert change("own_keys", "persistent") == ({}, "")  # the launch's grid changes
    switches, diff = change("persistent", "tma_store")
    assert switches == {"TMA_STORE": (0, 1), "SHARED_BYTES_EXPECTED": switches[
        "SHARED_BYTES_EXPECTED"]} and "store_o_tma(" in diff and "bulk_wait_read();" in diff
    assert "-    store_o(o_acc" in diff  # the stores from registers go
    switches, diff = change("tma_store", "hopper_attention")
    assert switches["BLOCK_N"] == (96, 128) and diff == ""


def test_listing_drops_empty_macros_and_their_invocations():
    from kernels.source_steps import body, listing

    source = """// switches:
//   T  timers on
#if T
#define TICK(i) t[i] = clock();
#define DONE done();
#else
#define TICK(i)
#define DONE
#endif
int f() {
  TICK(0);
  work();
  DONE;
}"""
    assert listing(source, ["-DT=0"]).splitlines()[2:] == ["int f() {", "  work();", "}"]
    assert "  TICK(0);" in listing(source, ["-DT=1"]).splitlines()
    assert body(source).splitlines()[0] == "#if T"


@pytest.mark.parametrize("chapter, final", [(5, "tensor_core_attention"), (6, "flash_attention_2")])
def test_a_chapters_kernel_whole_has_no_switch_left(chapter, final):
    """The listing of chapters 5 and 6: no #if and no timer of chapter 5's phase build."""
    import kernels
    from kernels.source_steps import listing

    m = kernels.chapter_module(chapter)
    text = listing(m.SOURCE, m.nvrtc_options(m.STEPS[final], 64))
    assert "#if" not in text and "#else" not in text and "PHASE" not in text
    assert "attention_kernel(" in text


def test_chapters_5_and_6_steps_read_as_their_edits():
    import kernels

    ch5, ch6 = kernels.chapter_module(5), kernels.chapter_module(6)

    def change(m, D, before, after):
        return step_changes(m.SOURCE, m.nvrtc_options(m.STEPS[before], D),
                            m.nvrtc_options(m.STEPS[after], D))

    switches, diff = change(ch5, 64, "wmma_four_warps", "wmma_two_row_tiles")
    assert switches["ROW_TILES"] == (1, 2) and diff == ""  # constants only
    switches, diff = change(ch5, 64, "wmma_copy16", "wmma_cp_async")
    assert switches["CP_ASYNC"] == (0, 1) and "cp_async16(ks + r * KV_STRIDE + col" in diff
    switches, diff = change(ch6, 128, "mma_ldmatrix", "mma_swizzled")
    assert switches["SWIZZLE"] == (0, 1) and "((col >> 3) ^ (row & 7))" in diff
    switches, diff = change(ch6, 128, "mma_cp_async", "mma_two_row_tiles")
    assert switches["Q_REGISTERS"] == (1, 0) and "-      load_a(qf[rt][kk]" in diff
