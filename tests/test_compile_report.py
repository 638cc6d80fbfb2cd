"""The compiler's report, with no GPU: registers, spills, instruction mix."""

import functools
import os

import pytest

import kernels
from conftest import HOT_LOCAL_MEMORY, ON_GPU, TOOLCHAIN_DEPENDENT, toolchain_major
from kernels import compile_report

report = functools.cache(compile_report.report)  # one compilation per chapter
# compilation needs no GPU: it runs in CI, and the GPU's time goes to kernels
pytestmark = pytest.mark.skipif(ON_GPU, reason="compile-only; runs without a GPU")

#: kernels allowed a stack frame: the variant that adds up partial sums in one thread
#: (its loops over the block's rows are not unrolled)
LOCAL_MEMORY_EXPECTED = ("one_thread",)
#: kernels allowed to spill: chapter 4's fp32 tiles with prefetch (4 x 4 thread tiles
#: and a K/V tile in flight need more than 255 registers on sm_80)
SPILLS_EXPECTED = ("shared_memory_kernel(D=64, prefetch=True) 64x32/4x4",
                   # chapter 5's bf16 kernel at D = 64 (see test_ch05_tensor_cores)
                   "tensor_core_attention D=64 bfloat16")


@pytest.fixture(scope="module", params=sorted(kernels.CHAPTERS))
def chapter(request):
    return request.param, report(kernels.CHAPTERS[request.param])


def test_every_kernel_compiles_for_every_readers_architecture(chapter):
    number, rows = chapter
    module = kernels.chapter_module(number)
    names = set()
    for kernel, _, *label in getattr(module, "COMPILE_SIGNATURES", ()):
        py = kernel.py_func if hasattr(kernel, "py_func") else kernel.fn
        names.add(label[0] if label else py.__name__)
    expected = {(n, "sm_{}{}".format(*cc)) for n in names for cc in compile_report.ARCHS}
    # CUDA C++ chapters: every entry of CUDA_COMPILE for each of its archs (the module's
    # ARCHS unless the entry names its own), and Blackwell's where its chapter runs there
    expected |= {(label, arch) for label, _, _, *archs in getattr(module, "CUDA_COMPILE", ())
                 for arch in compile_report.build_archs(kernels.CHAPTERS[number],
                                                        archs[0] if archs else module.ARCHS)}
    assert {(r["kernel"], r["arch"]) for r in rows} == expected
    assert all(r["registers"] > 0 for r in rows)


def test_no_spills_or_local_memory(chapter):
    hot = set()
    for r in chapter[1]:
        if r["kernel"] in SPILLS_EXPECTED:
            continue
        assert r["spill_stores"] == r["spill_loads"] == 0, r["kernel"]
        if any(word in r["kernel"] for word in LOCAL_MEMORY_EXPECTED):
            continue
        if compile_report.cold_local_memory(r["sass"]):  # a split warp's shuffle only
            continue
        if r["stack_bytes"] or "LDL" in r["sass_counts"] or "STL" in r["sass_counts"]:
            hot.add((r["kernel"], r["arch"]))
    built = {(r["kernel"], r["arch"]) for r in chapter[1]}
    assert (hot - TOOLCHAIN_DEPENDENT
            == (HOT_LOCAL_MEMORY[toolchain_major()] & built) - TOOLCHAIN_DEPENDENT)


#: the kernels that compute in fp64 without meaning to: chapters 1 and 2 start the
#: softmax's running max at ``-math.inf``, a Python float, so Numba types the max, the
#: exponentials, the sum and the accumulator's update as fp64. They stay listed until
#: the chapters start it at ``float32(-math.inf)`` and are recorded again; a kernel
#: that loses its fp64 must leave the list
FP64_UNINTENDED = {"softmax_rows_kernel", "minimal_fused_kernel",
                   "per_row_kv_kernel(D=64)", "per_row_kv_kernel(D=128)",
                   "loop_inverted_kernel(D=64)", "loop_inverted_kernel(D=128)"}


def test_no_fp64_but_where_listed(chapter):
    """No kernel does fp64 arithmetic (the book's kernels compute in fp32 and fp16),
    but those of FP64_UNINTENDED, which each do on every architecture."""
    for r in chapter[1]:
        n = compile_report.fp64_count(r["sass"])
        assert (n > 0) == (r["kernel"] in FP64_UNINTENDED), (r["kernel"], r["arch"], n)


def test_fp64_instructions_are_counted():
    sass = """
        /*0010*/                   DFMA R4, R2, R6, R4 ;
        /*0020*/              @!P0 DSETP.GEU.AND P1, PT, R2, R4, PT ;
        /*0030*/                   F2F.F64.F32 R2, R0 ;
        /*0040*/                   F2F.F16.F32 R3, R0 ;
        /*0050*/                   FFMA R1, R2, R3, R4 ;
"""
    assert compile_report.fp64_count(sass) == 3


def test_toolchain_is_one_cuda_release_and_the_one_asked_for():
    """NVRTC and ptxas come from one CUDA release; FA_CUDA_TOOLCHAIN (set by
    tools/cuda12_check.sh) says which major version these compile tests must use."""
    versions = compile_report.toolchain()
    majors = {v.split(".")[0] for v in versions.values()}
    assert len(majors) == 1, versions
    assert int(majors.pop()) in HOT_LOCAL_MEMORY, versions  # a toolchain the tests know
    if os.environ.get("FA_CUDA_TOOLCHAIN"):
        assert versions["ptxas"].split(".")[0] == os.environ["FA_CUDA_TOOLCHAIN"], versions


def test_fused_kernel_uses_shared_memory_and_barriers():
    fused = next(r for r in report("naive_attention") if r["kernel"] == "minimal_fused_kernel")
    assert fused["shared_bytes"] == 128 * 4  # the float32 partial-sum array
    assert fused["sass_counts"]["BAR"] >= 2 and "MUFU" in fused["sass_counts"]


def test_shared_memory_reads_are_16_bytes_wide():
    """The aligned, uint64-indexed tiles compile to LDS.128, never to scalar LDS."""
    for module in ("loop_inversion", "tiled_online_softmax"):
        for r in report(module):
            if r["shared_bytes"] and not any(v in r["kernel"] for v in ("one_thread",
                                                                        "shared_tree")):
                # sm_75 writes LDS.U.128 (.U: the same address across the warp)
                loads = {w.replace(".U.", ".") for w in r["sass"].split() if w.startswith("LDS")}
                assert loads == {"LDS.128"}, (r["kernel"], loads)


def test_per_row_kernel_reads_global_memory_only():
    for r in report("loop_inversion"):
        if r["kernel"].startswith("per_row_kv"):
            assert r["shared_bytes"] == 0 and "LDS" not in r["sass_counts"], r["kernel"]
            assert r["sass_counts"]["SHFL"] == 2  # the butterfly over 4 lanes


def test_register_tiles_use_fewer_registers_and_more_fma_per_load():
    """The register-tiled kernel: fewer registers than four-lanes-a-row, and more
    multiply-adds per shared-memory load in its unrolled loops."""
    rows = {r["kernel"]: r for r in report("tiled_online_softmax") if r["arch"] == "sm_90"}
    lanes = rows["row_lanes_kernel(D=64)"]
    tiles = rows["tiled_online_softmax_kernel(D=64)"]
    assert tiles["registers"] < lanes["registers"]

    def per_load(r):
        return r["sass_counts"]["FFMA"] / r["sass_counts"]["LDS"]

    assert per_load(tiles) > per_load(lanes)


def test_tiled_kernel_uses_exp2_without_extra_multiplies():
    """Folding log2(e) into the scale: math.exp multiplies every exponent by log2(e)
    before its MUFU.EX2; the folded kernel multiplies q once instead."""
    rows = {r["kernel"]: r for r in report("tiled_online_softmax") if r["arch"] == "sm_90"}

    def count(r, text):
        return sum(text in line for line in r["sass"].splitlines())

    folded = rows["tiled_online_softmax_kernel(D=64)"]
    natural = rows["tiled_online_softmax_kernel(D=64, exp2=False)"]
    log2e = "1.4426950"  # log2(e) as a SASS immediate
    assert count(natural, log2e) >= count(natural, "MUFU.EX2") > 0
    assert count(folded, log2e) < count(folded, "MUFU.EX2") / 2


def _sass_ops(r):
    return {w.replace(".U.", ".") for w in r["sass"].split() if w[:3] in ("LDG", "LDS", "STS")}


def test_fp16_tiles_copy_8_bytes_at_a_time():
    """Chapter 4: fp16 tiles are copied with 8-byte loads and stores; fp32 tiles
    with 2-byte loads, and read back with LDS.128."""
    rows = [r for r in report("shared_memory") if r["arch"] == "sm_90"]
    fp16 = [r for r in rows if "fp16_tiles=True" in r["kernel"]]
    fp32 = [r for r in rows if "fp16_tiles=True" not in r["kernel"]]
    assert fp16 and fp32
    for r in fp16:
        ops = _sass_ops(r)
        assert "LDG.E.64" in ops and "STS.64" in ops and "LDG.E.U16" not in ops, r["kernel"]
        assert "HADD2.F32" in r["sass"], r["kernel"]  # fp16 -> fp32 as tiles are read
    for r in fp32:
        ops = _sass_ops(r)
        assert "LDG.E.U16" in ops and "LDG.E.64" not in ops, r["kernel"]
        assert {op for op in ops if op.startswith("LDS")} == {"LDS.128"}, r["kernel"]


def test_larger_thread_tiles_do_more_multiply_adds_per_shared_load():
    """The 4 x 4 thread tile issues more FFMA per shared-memory load than 2 x 4."""
    rows = {r["kernel"]: r for r in report("shared_memory") if r["arch"] == "sm_90"}
    two = next(r for k, r in rows.items() if k.endswith("64x32/2x4") and "fp16_tiles=True" in k)
    four = next(r for k, r in rows.items() if k.endswith("64x32/4x4")
                and k.count("=") == 2 and "fp16_tiles=True" in k and "D=64" in k)

    def ratio(r):
        return r["sass_counts"]["FFMA"] / r["sass_counts"]["LDS"]

    assert ratio(four) > 1.5 * ratio(two)


@pytest.fixture
def no_kept_builds(tmp_path, monkeypatch):
    """An empty place to keep builds in: every build is compiled."""
    monkeypatch.setattr(compile_report, "cache_dir", lambda: tmp_path)
    return tmp_path


def test_a_build_is_compiled_once_and_kept_by_what_it_is_made_of(no_kept_builds,
                                                                  monkeypatch):
    """The same source, options and architecture are compiled once; changing any of them
    compiles again; a cubin's cuobjdump reading is kept by the cubin."""
    from kernels.chapters.ch06_mma_attention import CONFIGS, SOURCE, nvrtc_options

    built, build = [], compile_report._nvrtc_build
    monkeypatch.setattr(compile_report, "_nvrtc_build",
                        lambda *a: built.append(a[2]) or build(*a))
    options = nvrtc_options(CONFIGS["flash_attention_2"], 64)
    first = compile_report.nvrtc_compile(SOURCE, options, "sm_80")
    assert compile_report.nvrtc_compile(SOURCE, options, "sm_80") == first
    assert built == ["sm_80"]
    compile_report.nvrtc_compile(SOURCE, options, "sm_86")
    compile_report.nvrtc_compile(SOURCE + "\n", options, "sm_80")
    assert built == ["sm_80", "sm_86", "sm_80"]
    read = compile_report.cubin_report(first[0], "sm_80", "a")
    again = compile_report.cubin_report(first[0], "sm_80", "b")
    assert again == dict(read, kernel="b") and "HMMA" in read["sass"]
    assert len(list((no_kept_builds / "builds").glob("*.json"))) == 4  # 3 builds, 1 reading


def test_a_compile_with_an_empty_log_leaves_python_bytes_alone(no_kept_builds):
    """NVRTC writes its log into the buffer it is handed. An empty log is one NUL, and
    handed CPython's shared one-byte ``b" "``, it turned every ``b" "`` of the process
    into ``b"\\x00"`` (and Python 3.12's parser then dropped spaces from f-strings)."""
    from kernels.chapters.ch06_mma_attention import CONFIGS, SOURCE, nvrtc_options

    options = nvrtc_options(CONFIGS["flash_attention_2"], 64)
    cubin, log = compile_report.nvrtc_compile(SOURCE, options, "sm_90")
    assert log == "" and cubin.startswith(b"\x7fELF")
    assert " ".encode()[0] == 32  # the shared one-byte b" ", read back
    assert eval(compile('f"{a} {b}"', "f-string", "eval"), {}, dict(a=1, b=2)) == "1 2"


#: a few lines as cuobjdump -sass prints them: predicates, modifiers, opcodes whose
#: names start alike (SHF and SHFL), and a label line that is no instruction
SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;            /* 0x000000000c04723c */
        /*0020*/              @!P0 HMMA.16816.F32.BF16 R16, R8, R14, R16 ;     /* 0x0000000e0810823c */
        /*0030*/                   SHF.L.U32 R2, R3, 0x1, RZ ;                 /* 0x0000000103027819 */
        /*0040*/                   SHFL.BFLY PT, R5, R4, 0x1, 0x1f ;           /* 0x0c201f0004057f89 */
        /*0050*/               @P1 BRA.DIV UR4, `(.L_x_3) ;                    /* 0x0000000000001947 */
        /*0060*/                   BRA `(.L_x_4) ;                             /* 0x0000000000007947 */
.L_x_3:
        /*0070*/                   MUFU.EX2 R201, R7 ;                         /* 0x00000007007b7308 */
"""


def test_sass_opcodes_are_counted_by_instruction():
    assert compile_report.instructions(SASS) == [
        "LDC", "HMMA.16816.F32", "HMMA.16816.F32.BF16", "SHF.L.U32", "SHFL.BFLY", "BRA.DIV",
        "BRA", "MUFU.EX2"]
    count = compile_report.opcode_count
    assert count(SASS, "HMMA") == 2 and count(SASS, "HMMA.16816.F32.BF16") == 1
    assert count(SASS, "SHF") == 1 and count(SASS, "SHFL") == 1
    assert count(SASS, "BRA") == 2 and count(SASS, "BRA.DIV") == 1 and count(SASS, "BR") == 0
    assert compile_report.sass_counts(SASS) == {"HMMA": 2, "MUFU": 1, "SHFL": 1}  # OPCODES only
    assert compile_report.registers_used(SASS) == 202
    assert compile_report.registers_used("") == 0


def test_a_dependent_chain_counts_instructions_that_wait_for_each_other():
    """Three maxima in a row are a chain of 3; two side by side, of 1 each; a shuffle
    writes its register after a predicate; a load starts no chain."""
    line = "        /*{:04x}*/                   {} ;"
    serial = "\n".join(line.format(16 * i, x) for i, x in enumerate([
        "LDG.E R2, [R4.64]", "FMNMX R7, R2, -INF , !PT", "FMNMX R7, R3, R7, !PT",
        "SHFL.BFLY PT, R8, R7, 0x1, 0x1f", "FMNMX R9, R7, R8, !PT"]))
    assert compile_report.dependent_chain(serial) == 4
    side = "\n".join(line.format(16 * i, x) for i, x in enumerate([
        "FMNMX R7, R2, -INF , !PT", "FMNMX R8, R3, -INF , !PT", "@P0 FADD R9, R4, R5"]))
    assert compile_report.dependent_chain(side) == 1
    assert compile_report.dependent_chain(side, opcodes=("FADD",)) == 1
