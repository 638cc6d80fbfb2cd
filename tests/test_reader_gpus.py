"""Every kernel of every chapter against the GPUs readers have (sm_75 to sm_120), with
no GPU: each compiles for that architecture with no spills (conftest.HOT_LOCAL_MEMORY
names the few builds a toolchain leaves short) and fits its shared memory,
in the tiling it runs with there, or its chapter refuses it by name, pointing to a
kernel that does run there. The GPUs' properties are stood in by kernels.gpus.
Blackwell's (sm_100, sm_120) are compiled for with CUDA 13 (compile_report.toolchain_archs):
with CUDA 12, their refusals are checked and their builds skipped."""

import re

import pytest

import kernels

from conftest import HOT_LOCAL_MEMORY, ON_GPU, toolchain_major
from kernels import compile_report, gpus
from kernels.chapters import ch05_tensor_cores, ch06_mma_attention, ch07_hopper_attention
from kernels.chapters.ch04_shared_memory import SHARED_LIMIT as NUMBA_SHARED_LIMIT

pytestmark = pytest.mark.skipif(ON_GPU, reason="compile-only; runs without a GPU")

CHAPTERS = {5: ch05_tensor_cores, 6: ch06_mma_attention, 7: ch07_hopper_attention}
MAINS = {5: "tensor_core_attention", 6: "flash_attention_2", 7: "hopper_attention"}
#: whether a GPU of a compute capability has each chapter's instructions: WMMA from
#: 7.0, mma.sync from 8.0, wgmma on 9.0 alone (sm_90a's: Blackwell has none)
HAS_INSTRUCTIONS = {5: lambda cc: cc >= (7, 0), 6: lambda cc: cc >= (8, 0),
                    7: lambda cc: cc == (9, 0)}


def _reported(chapter: int) -> dict:
    """The chapter's compile report (cached on disk), by (label, arch)."""
    return {(r["kernel"], r["arch"]): r
            for r in compile_report.report(kernels.CHAPTERS[chapter])}


def _compiled(chapter: int, name: str, D: int, dtype: str, gpu) -> dict:
    """The build of ``name`` that runs on ``gpu``: from the report where it has one."""
    module = CHAPTERS[chapter]
    arch = "sm_90a" if chapter == 7 else gpu.arch
    label = f"{name} D={D} {dtype}"
    if chapter == 5 and gpu == ch05_tensor_cores.T4:
        label += " (T4 tiling)"
    row = _reported(chapter).get((label, arch))
    if row is not None:
        return row
    extra = {"shared_limit": gpu.shared_optin} if chapter == 5 else {}
    return compile_report.cubin_report(module.compile_cubin(name, D, dtype, arch, **extra),
                                       arch, label)


def _shared_bytes(chapter: int, name: str, D: int, gpu) -> int:
    module = CHAPTERS[chapter]
    if chapter == 5:
        return module.shared_bytes(module.fitted(module.STEPS[name], D, gpu.shared_optin), D)
    return module.shared_bytes(module.CONFIGS[name], D)


@pytest.mark.parametrize("gpu", gpus.READER_GPUS, ids=lambda g: g.arch)
@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_kernel_runs_or_is_refused_by_name(chapter, gpu):
    module, seen, hot, built = CHAPTERS[chapter], 0, set(), set()
    for name in getattr(module, "CONFIGS", module.STEPS):  # every step and sweep entry
        for D in (64, 128):
            for dtype in (module.DTYPES if name == MAINS[chapter] else ("float16",)):
                why = module.refusal(name, D, *gpu.limits(), dtype=dtype)
                if why:
                    assert gpu.name in why and name in why, why
                    instead = re.search(r"use chapter (\d)'s (\w+)", why)
                    if instead and int(instead[1]) in CHAPTERS:  # the kernel named runs there
                        other = CHAPTERS[int(instead[1])]
                        assert other.refusal(instead[2], D, *gpu.limits()) is None, why
                    continue
                seen += 1
                assert _shared_bytes(chapter, name, D, gpu) <= gpu.shared_optin
                if gpu.arch not in compile_report.toolchain_archs():
                    continue  # Blackwell with CUDA 12: checked with CUDA 13
                r = _compiled(chapter, name, D, dtype, gpu)
                built.add((r["kernel"], r["arch"]))
                if r["stack_bytes"] and not compile_report.cold_local_memory(r["sass"]):
                    hot.add((r["kernel"], r["arch"]))
    # every kernel is refused where its chapter's instructions are missing, and only there
    assert bool(seen) == HAS_INSTRUCTIONS[chapter](gpu.compute_capability)
    # no local memory in a main loop, but for the builds known to have it (conftest)
    assert hot == HOT_LOCAL_MEMORY[toolchain_major()] & built


@pytest.mark.parametrize("gpu", gpus.READER_GPUS, ids=lambda g: g.arch)
def test_every_chapter_has_a_kernel_for_every_gpu(gpu):
    """What a refusal points to exists: the book's fastest kernel for that GPU runs."""
    chapter, name = re.fullmatch(r"chapter (\d)'s (\w+).*", gpus.instead(
        gpu.compute_capability)).groups()
    assert CHAPTERS[int(chapter)].refusal(name, 128, *gpu.limits()) is None


def test_numba_chapters_fit_every_gpu():
    """Chapters 1-4 launch at most 48 KB of static shared memory, which every reader
    GPU has; their compile reports cover every reader architecture before Blackwell
    (test_compile_report), whose two the CUDA C++ chapters that run there add."""
    assert NUMBA_SHARED_LIMIT <= min(g.shared_optin for g in gpus.READER_GPUS)
    assert {"sm_{}{}".format(*cc) for cc in compile_report.ARCHS} | set(
        compile_report.BLACKWELL_ARCHS) == {g.arch for g in gpus.READER_GPUS}
    blackwell = tuple(a for a in compile_report.BLACKWELL_ARCHS
                      if a in compile_report.toolchain_archs())
    for chapter in compile_report.BLACKWELL_CHAPTERS:  # what a chapter builds for sm_90
        assert compile_report.build_archs(chapter, ("sm_80", "sm_90")) == (
            "sm_80", "sm_90", *blackwell)
        assert compile_report.build_archs(chapter, ("sm_75",)) == ("sm_75",)
    # chapter 7's sm_90a builds, and a chapter left out, stay as they are
    assert compile_report.build_archs("hopper_attention", ("sm_90a",)) == ("sm_90a",)
    assert compile_report.build_archs("backward_pass", ("sm_80", "sm_90")) == ("sm_80", "sm_90")


@pytest.mark.parametrize("capability", [(10, 0), (12, 0)], ids=["sm_100", "sm_120"])
def test_blackwell_refuses_chapter_7_by_name_and_runs_chapter_6(capability):
    """Chapter 7's refusal takes only compute capability 9.0: on a B200 and an RTX 50 it
    names wgmma and points to chapter 6's flash_attention_2, which runs there at every
    head dim the lean call takes."""
    gpu = next(g for g in gpus.READER_GPUS if g.compute_capability == capability)
    for name in ch07_hopper_attention.CONFIGS:
        for D in ch07_hopper_attention.head_dims(name):
            why = ch07_hopper_attention.refusal(name, D, *gpu.limits())
            assert "wgmma" in why and gpu.name in why, why
            assert "use chapter 6's flash_attention_2" in why, why
    assert gpus.fastest(capability) == (6, "flash_attention_2")
    for D in ch06_mma_attention.head_dims("flash_attention_2"):
        assert ch06_mma_attention.refusal("flash_attention_2", D, *gpu.limits()) is None


def test_each_instruction_compiles_where_the_chapters_say():
    """The instructions the chapters' refusals turn on, compiled by NVRTC for each
    architecture's own target (sm_90a, sm_100a, sm_120a: the most a kernel may use
    there): wgmma on sm_90a alone; tcgen05 on sm_100a alone; mma.sync m16n8k16 on every
    one; mma.sync's FP4 shape (kind::f8f6f4) on sm_120a alone; setmaxnreg on all three."""
    targets = ("sm_90a", "sm_100a", "sm_120a")
    if not set(targets) <= {a + "a" for a in compile_report.toolchain_archs()}:
        pytest.skip("Blackwell is compiled for with CUDA 13")
    compiles = {name: tuple(t for t in targets if compile_report.compiles(name, t))
                for name in compile_report.INSTRUCTIONS}
    assert compiles == {"wgmma": ("sm_90a",), "tcgen05.mma": ("sm_100a",),
                        "mma.sync m16n8k16": targets, "mma.sync FP4 (kind::f8f6f4)": ("sm_120a",),
                        "setmaxnreg": targets}
    assert not compile_report.compiles("wgmma", "sm_90")  # sm_90a's, not sm_90's


def test_support_rows_say_where_each_kernel_runs():
    rows = {r["kernel"]: r for r in gpus.support_rows(
        ch05_tensor_cores.STEPS, ch05_tensor_cores.refusal, ch05_tensor_cores.fitted)}
    assert rows["wmma_cp_async"]["Tesla T4"] == "no: cp.async"
    assert rows["wmma_cp_async"]["L4 / RTX 4090 (sm_89)"] == "yes, smaller tiles"
    assert rows["tensor_core_attention"]["H100 / H200"] == "yes"
    rows = {r["kernel"]: r for r in gpus.support_rows(
        ch07_hopper_attention.CONFIGS, ch07_hopper_attention.refusal)}
    assert rows["hopper_attention"]["A100"] == "no: wgmma"
    assert rows["hopper_attention"]["H100 / H200"] == "yes"
    assert rows["hopper_attention"]["B200 (sm_100)"] == "no: wgmma"
    assert rows["hopper_attention"]["RTX 5090 / RTX 50 (sm_120)"] == "no: wgmma"


def test_support_table_is_the_support_rows_as_markdown():
    text = gpus.support_table(ch07_hopper_attention.CONFIGS, ch07_hopper_attention.refusal)
    lines = text.splitlines()
    assert lines[0] == "| kernel | " + " | ".join(g.name for g in gpus.READER_GPUS) + " |"
    assert len(lines) == 2 + len(ch07_hopper_attention.CONFIGS)
    assert "| hopper_attention | no: wgmma |" in text


def test_every_reader_gpu_has_its_multiprocessors_limits():
    """The GPU page's occupancy counts read kernels.gpus.MULTIPROCESSORS: one entry for
    each reader GPU's architecture, whose block opt-in fits the SM's shared memory."""
    for gpu in gpus.READER_GPUS:
        sm = gpus.MULTIPROCESSORS[gpu.compute_capability]
        assert gpu.shared_optin <= sm.shared - sm.shared_reserved
        assert sm.threads % 32 == 0 and sm.registers == 64 * 1024
