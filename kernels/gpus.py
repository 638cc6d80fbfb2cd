"""The GPUs the book's readers have, and what the kernels need of one.

A launcher asks the GPU at hand (:func:`current`) for its compute capability and
the shared memory a block may opt in to, never a constant. ``READER_GPUS`` stands
in for the GPUs this machine does not have, so that every kernel's compile and
refusal can be checked for each of them without one (``tests/test_reader_gpus.py``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .markdown import table


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int]
    shared_optin: int  #: bytes of shared memory a block may opt in to
    multiprocessors: int = 0  #: SMs (0 where unknown: the reader GPUs stood in for)

    @property
    def arch(self) -> str:
        return "sm_{}{}".format(*self.compute_capability)

    def limits(self) -> tuple[tuple[int, int], int, str]:
        """(compute capability, shared memory a block may have, name): what the
        chapters' ``refusal`` functions take after the kernel and head dim."""
        return self.compute_capability, self.shared_optin, self.name


#: one GPU of each architecture readers run the notebooks on, with its opt-in
#: shared memory a block (CUDA C++ Programming Guide, "Compute Capabilities", the table
#: of memory information a compute capability: "Maximum amount of shared memory per
#: thread block"). Blackwell's two: the datacenter B200 (10.0, 227 KB as on Hopper) and
#: the RTX 50 series (12.0, 99 KB as on the RTX 30 and 40 series)
READER_GPUS = (
    Gpu("Tesla T4", (7, 5), 64 * 1024),
    Gpu("A100", (8, 0), 163 * 1024),
    Gpu("RTX 3090 / A10 (sm_86)", (8, 6), 99 * 1024),
    Gpu("L4 / RTX 4090 (sm_89)", (8, 9), 99 * 1024),
    Gpu("H100 / H200", (9, 0), 227 * 1024),
    Gpu("B200 (sm_100)", (10, 0), 227 * 1024),
    Gpu("RTX 5090 / RTX 50 (sm_120)", (12, 0), 99 * 1024),
)

@dataclass(frozen=True)
class Multiprocessor:
    """What one SM (streaming multiprocessor) of a compute capability can hold at once:
    the limits on how many blocks stay resident (CUDA programming guide, the table of
    technical specifications a compute capability)."""

    threads: int  #: resident threads
    blocks: int  #: resident blocks
    registers: int  #: 32-bit registers
    shared: int  #: bytes of shared memory, all its blocks together
    registers_a_thread: int = 255  #: the most one thread may have
    #: registers are given to a warp in units of this many
    register_unit: int = 256
    #: bytes of shared memory the system keeps for each resident block
    shared_reserved: int = 1024


#: compute capability -> what one of its SMs holds (the architectures of READER_GPUS)
MULTIPROCESSORS = {
    (7, 5): Multiprocessor(1024, 16, 64 * 1024, 64 * 1024, shared_reserved=0),
    (8, 0): Multiprocessor(2048, 32, 64 * 1024, 164 * 1024),
    (8, 6): Multiprocessor(1536, 16, 64 * 1024, 100 * 1024),
    (8, 9): Multiprocessor(1536, 24, 64 * 1024, 100 * 1024),
    (9, 0): Multiprocessor(2048, 32, 64 * 1024, 228 * 1024),
    (10, 0): Multiprocessor(2048, 32, 64 * 1024, 228 * 1024),
    (12, 0): Multiprocessor(1536, 24, 64 * 1024, 100 * 1024),
}

#: the first compute capability with each instruction the kernels use (wgmma is sm_90a's
#: alone: Blackwell, 10.0 and 12.0, has none, though its own sm_100a and sm_120a have
#: setmaxnreg, so chapter 7's kernels run on 9.0 only, as its refusal says)
FEATURES = {"wmma": (7, 0), "ldmatrix": (7, 5), "cp.async": (8, 0), "bf16": (8, 0),
            "mma.sync m16n8k16": (8, 0), "wgmma, TMA and setmaxnreg": (9, 0)}


def fastest(compute_capability) -> tuple[int, str]:
    """(chapter, kernel) of the book's fastest kernel for a GPU of this compute
    capability: what a refusal points to, and what kernels.launch runs."""
    cc = tuple(compute_capability)
    if cc == (9, 0):
        return 7, "hopper_attention"
    if cc >= FEATURES["mma.sync m16n8k16"]:
        return 6, "flash_attention_2"
    if cc >= FEATURES["wmma"]:
        return 5, "wmma_copy16"  # the fastest step without cp.async
    return 4, "shared_memory_attention"


def instead(compute_capability) -> str:
    """The book's fastest kernel for a GPU of this compute capability, named for a
    refusal to point to."""
    chapter, name = fastest(compute_capability)
    return f"chapter {chapter}'s {name}" + (" (fp16)" if chapter == 5 else "")


@functools.cache
def current() -> Gpu:
    """The GPU kernels launch on (CuPy's current device)."""
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return Gpu(name, (props["major"], props["minor"]),
               dev.attributes["MaxSharedMemoryPerBlockOptin"], props["multiProcessorCount"])


def recorded(provenance: dict) -> Gpu:
    """The GPU of a recorded run, from its ``provenance`` (its shared memory a block
    unknown: 0), for what depends only on its name, architecture and multiprocessors."""
    capability = tuple(int(x) for x in provenance["compute_capability"].split("."))
    return Gpu(provenance["gpu"], capability, 0, provenance.get("multiprocessors", 0))


def short_gpu_name(name: str) -> str:
    """A GPU's name without its vendor: "NVIDIA H100 80GB HBM3" -> "H100 80GB HBM3"."""
    return re.sub(r"^(NVIDIA|Tesla)\s+", "", name).strip() or name


def live_label() -> str:
    """The GPU at hand, short, to head the column of what a chapter measures live:
    "H100 80GB HBM3 (this GPU)" (beside :func:`kernels.results.recorded_label`)."""
    return f"{short_gpu_name(current().name)} (this GPU)"


#: what a refusal names first, shortened for a table cell
_REASONS = ("wgmma", "mma.sync", "cp.async", "WMMA", "bf16", "shared memory")


def support_rows(configs: dict, refusal, fitted=None, head_dims=(64, 128)) -> list[dict]:
    """For a CUDA C++ chapter: one row a kernel of ``configs`` ({name: config}), one
    column a reader GPU, saying whether the kernel runs there at every head dim of
    ``head_dims`` in fp16 ("yes"; "yes, smaller tiles" where the chapter's ``fitted``
    picks a smaller tiling), or why not (the first thing ``refusal`` names)."""
    rows = []
    for name, cfg in configs.items():
        row = {"kernel": name}
        for gpu in READER_GPUS:
            why = next(filter(None, (refusal(name, D, *gpu.limits()) for D in head_dims)), None)
            if why:
                row[gpu.name] = "no: " + next((r for r in _REASONS if r in why), why)
            elif fitted and any(fitted(cfg, D, gpu.shared_optin) != cfg for D in head_dims):
                row[gpu.name] = "yes, smaller tiles"
            else:
                row[gpu.name] = "yes"
        rows.append(row)
    return rows


def support_table(configs: dict, refusal, fitted=None, head_dims=(64, 128)) -> str:
    """:func:`support_rows` as a Markdown table: a chapter's "Which GPUs run it"."""
    rows = support_rows(configs, refusal, fitted, head_dims)
    return table(rows, ["kernel"] + [gpu.name for gpu in READER_GPUS])


def chapter_support(configs: dict, refusal, fitted=None, head_dims=(64, 128)) -> dict:
    """For a CUDA C++ chapter: {reader GPU's name: how many of the chapter's steps
    (``configs``) run there, as :func:`support_rows` decides}: "all N steps", "K of N
    steps (the others: why)", or why none does."""
    rows = support_rows(configs, refusal, fitted, head_dims)
    out = {}
    for gpu in READER_GPUS:
        runs = [r for r in rows if r[gpu.name].startswith("yes")]
        refused = sorted({r[gpu.name] for r in rows if not r[gpu.name].startswith("yes")})
        if len(runs) == len(rows):
            out[gpu.name] = f"all {len(rows)} steps"
        elif runs:
            out[gpu.name] = f"{len(runs)} of {len(rows)} steps ({'; '.join(refused)})"
        else:
            out[gpu.name] = "; ".join(refused)
    return out
