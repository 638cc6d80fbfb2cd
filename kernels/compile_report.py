"""What the compiler made of a kernel, with no GPU needed.

Each chapter module lists its Numba kernels with the argument types they are
launched with (``COMPILE_SIGNATURES``). For each, Numba compiles the kernel to
PTX (``numba.cuda.compile_ptx``, with the kernel's own options such as
fastmath), and ``ptxas`` from the pip CUDA packages turns the PTX into machine
code for each of ``ARCHS`` (sm_75 to sm_90), reporting registers, shared memory, stack frame and
spills; ``cuobjdump -sass`` then gives the instruction mix.

Chapters written in CUDA C++ list ``CUDA_COMPILE`` instead: (label, source,
NVRTC options). :func:`nvrtc_cubin` compiles each with NVRTC from pip
(``cuda.bindings``), for each architecture of the module's ``ARCHS``, with no GPU
and no driver; the report is the same. The chapters whose kernels run on Blackwell
(``BLACKWELL_CHAPTERS``) build for its two architectures too what they build for
sm_90 (:func:`build_archs`).

The simulator replaces ``numba.cuda`` whole, so the compilation runs in a
subprocess in ``compile`` mode: :func:`report` starts it and returns its JSON.
From the command line: ``python -m kernels.compile_report naive_attention`` (a
chapter's name, as in :data:`kernels.CHAPTERS`).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

#: the architectures Numba kernels are compiled for: T4, A100, RTX 30, L4/RTX 40, H100
ARCHS = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0))
#: Blackwell's architectures: the B200 (sm_100) and the RTX 50 series (sm_120)
BLACKWELL_ARCHS = ("sm_100", "sm_120")
#: the chapters that build for BLACKWELL_ARCHS each CUDA C++ entry they build for sm_90
#: (the portable architecture, whose kernels run on every later GPU): chapters
#: 5, 6 and 8, whose kernels the lean call runs there. Chapter 7's builds are sm_90a's,
#: which run on 9.0 alone; chapter 9's and the Numba chapters' stay at their own
#: architectures, as each build adds to the time the compile reports take in CI.
BLACKWELL_CHAPTERS = ("tensor_cores", "mma_attention", "in_a_real_model")


@functools.cache
def toolchain_archs() -> frozenset:
    """The real architectures the book builds for with this NVRTC ("sm_75", ...
    "sm_120"): those it has, Blackwell's with CUDA 13 only. (CUDA 12 has them from 12.8;
    the CUDA 12 check keeps to the GPUs before them, for the time CI takes.)"""
    from cuda.bindings import nvrtc

    _, archs = nvrtc.nvrtcGetSupportedArchs()
    _, major, _ = nvrtc.nvrtcVersion()
    return frozenset(f"sm_{a}" for a in archs
                     if major >= 13 or f"sm_{a}" not in BLACKWELL_ARCHS)


def build_archs(module_name: str, archs) -> tuple:
    """The architectures a CUDA C++ entry of chapter ``module_name`` is built for: its
    own (``archs``), and, for an entry built for sm_90 in a chapter of
    BLACKWELL_CHAPTERS, those of BLACKWELL_ARCHS that the toolchain has."""
    archs = tuple(archs)
    if module_name in BLACKWELL_CHAPTERS and "sm_90" in archs:
        archs += tuple(a for a in BLACKWELL_ARCHS if a in toolchain_archs())
    return archs


#: one instruction of each kind the chapters' refusals turn on, as a kernel of its own:
#: chapter 7's multiplies (wgmma) and its register split (setmaxnreg); Blackwell's
#: multiplies on sm_100 (tcgen05.mma, its accumulator in tensor memory); chapters 6, 8
#: and 9's (mma.sync m16n8k16); and mma.sync's FP4 shape (kind::f8f6f4)
INSTRUCTIONS = {
    "wgmma": r'''extern "C" __global__ void k(float* o, unsigned long long a,
                                  unsigned long long b) {
  float d[4] = {0, 0, 0, 0};
  asm volatile("wgmma.fence.sync.aligned;\n"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
               "{%0,%1,%2,%3}, %4, %5, 1, 1, 1, 0, 0;\n"
               "wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b));
  o[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}''',
    "setmaxnreg": r'''extern "C" __global__ void k() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
}''',
    "tcgen05.mma": r'''extern "C" __global__ void k(unsigned tmem, unsigned long long a,
                                  unsigned long long b, unsigned idesc, unsigned accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
               "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n"
               :: "r"(tmem), "l"(a), "l"(b), "r"(idesc), "r"(accumulate));
}''',
    "mma.sync m16n8k16": r'''extern "C" __global__ void k(float* o, const unsigned* a) {
  float d[4] = {0, 0, 0, 0};
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]));
  o[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}''',
    "mma.sync FP4 (kind::f8f6f4)": r'''extern "C" __global__ void k(float* o, const unsigned* a) {
  float d[4] = {0, 0, 0, 0};
  asm volatile("mma.sync.aligned.m16n8k32.row.col.kind::f8f6f4.f32.e2m1.e2m1.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]));
  o[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}''',
}


@functools.cache
def compiles(instruction: str, arch: str) -> bool:
    """Whether NVRTC compiles the kernel of :data:`INSTRUCTIONS` ``instruction`` for
    ``arch`` (such as "sm_100a"): whether a GPU of that architecture has it."""
    try:
        nvrtc_cubin(INSTRUCTIONS[instruction], (), arch)
    except RuntimeError:
        return False
    return True


#: SASS opcodes worth counting in a report, and what they are
OPCODES = {
    "FFMA": "fp32 fused multiply-add", "FMUL": "fp32 multiply", "FADD": "fp32 add",
    "MUFU": "special function (exp2, rcp)", "HMMA": "tensor-core matrix multiply",
    "LDG": "global load", "LDGSTS": "global-to-shared copy (cp.async)",
    "STG": "global store", "LDS": "shared load",
    "STS": "shared store", "BAR": "barrier", "SHFL": "warp shuffle",
    "LDL": "local-memory load", "STL": "local-memory store",
    "DFMA": "fp64 fused multiply-add", "DMUL": "fp64 multiply", "DADD": "fp64 add",
}
#: the fp64 arithmetic a kernel in fp32 and fp16 should not have (a Python float such as
#: ``-math.inf`` where a ``float32`` was meant makes Numba compute in fp64)
FP64_OPCODES = ("DFMA", "DMUL", "DADD", "DSETP", "DMNMX")


def cuda_tool(name: str) -> str:
    """Path of a CUDA binary tool (ptxas, cuobjdump): pip packages first, then PATH."""
    roots = [Path(sysconfig.get_paths()["purelib"]) / "nvidia" / sub / "bin"
             for sub in ("cu13", "cu12", "cuda_nvcc", "cuda_cuobjdump")]
    for root in roots:
        if (root / name).exists():
            return str(root / name)
    found = shutil.which(name) or next(
        (p for p in (f"/usr/local/cuda/bin/{name}",) if os.path.exists(p)), None)
    if found:
        return found
    raise FileNotFoundError(
        f"{name} not found: pip install 'cuda-toolkit[nvcc,cuobjdump]' (or put a CUDA "
        "toolkit's bin/ on PATH)")


def toolchain() -> dict:
    """The CUDA compilers' versions: NVRTC (chapters 5-7) and ptxas (every kernel's
    machine code), e.g. ``{"nvrtc": "13.0", "ptxas": "13.0"}``."""
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    out = subprocess.run([cuda_tool("ptxas"), "--version"], capture_output=True,
                         text=True, check=True).stdout
    return dict(nvrtc=f"{major}.{minor}", ptxas=re.search(r"release (\d+\.\d+)", out)[1])


def _parse_ptxas(log: str) -> dict:
    def num(pattern, default=0):
        m = re.search(pattern, log)
        return int(m.group(1)) if m else default

    return dict(registers=num(r"Used (\d+) registers"),
                shared_bytes=num(r"(\d+) bytes smem"),
                stack_bytes=num(r"(\d+) bytes stack frame"),
                spill_stores=num(r"(\d+) bytes spill stores"),
                spill_loads=num(r"(\d+) bytes spill loads"))


#: one SASS instruction line as cuobjdump prints it: its address, an optional predicate
#: (``@P0``, ``@!UP1``), then the mnemonic with its modifiers (``HMMA.16816.F32``)
_INSTRUCTION = re.compile(
    r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", re.M)


def instructions(sass: str) -> list[str]:
    """The mnemonics of a kernel's SASS, one an instruction, in order, each with its
    modifiers (``HMMA.16816.F32``, ``BRA.DIV``)."""
    return _INSTRUCTION.findall(sass)


def opcode_count(sass: str, op: str) -> int:
    """How many instructions of the SASS are ``op``: every form of an opcode
    (``"HMMA"`` counts ``HMMA.16816.F32`` and ``HMMA.16816.F32.BF16``), or one form
    (``"BRA.DIV"``)."""
    return sum(1 for m in instructions(sass) if m == op or m.startswith(op + "."))


def fp64_count(sass: str) -> int:
    """How many fp64 instructions the SASS has: arithmetic and compares on doubles
    (:data:`FP64_OPCODES`) and conversions to or from them (``F2F.F64.F32``)."""
    return sum(1 for m in instructions(sass)
               if m.split(".")[0] in FP64_OPCODES or (m.startswith(("F2F.", "I2F.", "F2I."))
                                                      and ".F64" in m))


def registers_used(sass: str) -> int:
    """The registers a thread uses, read from the SASS: the highest ``R`` named, plus
    one (a launch may reserve more, e.g. for ``setmaxnreg`` to hand out)."""
    return max((int(x) for x in re.findall(r"\bR(\d+)\b", sass)), default=-1) + 1


#: the opcodes of a softmax's arithmetic, exponentials, shuffles and votes: the chains
#: :func:`dependent_chain` counts
SOFTMAX_OPCODES = ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "MUFU", "SHFL", "F2FP",
                   "VOTE", "SEL")
#: an instruction's predicate guard, mnemonic and operands
_OPERANDS = re.compile(
    r"^\s+/\*[0-9a-f]{4,}\*/\s+(@!?(U?P\w+)\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);", re.M)


def dependent_chain(sass: str, opcodes=SOFTMAX_OPCODES) -> int:
    """The longest chain of ``opcodes`` instructions in straight-line SASS of which each
    reads a register (``R`` or ``P``) that the one before it wrote: instructions that
    run one after another whatever the scheduler does, each waiting out the latency of
    the last. Other instructions (loads, address arithmetic) start no chain and carry
    none. A count of instructions, not of cycles."""
    depth, longest = {}, 0
    for m in _OPERANDS.finditer(sass):
        guard, mnemonic, operands = m.group(2), m.group(3), m.group(4)
        if mnemonic.split(".")[0] not in opcodes:
            continue
        registers = [re.findall(r"\b(?:R|P)\d+\b", x) for x in operands.split(",")]
        # a compare and a shuffle write a predicate and a register first; others, one
        written = 2 if mnemonic.startswith(("FSETP", "ISETP", "SHFL")) else 1
        sources = [r for x in registers[written:] for r in x] + ([guard] if guard else [])
        d = 1 + max((depth.get(r, 0) for r in sources), default=0)
        for r in (r for x in registers[:written] for r in x):
            depth[r] = d
        longest = max(longest, d)
    return longest


def sass_counts(sass: str) -> dict:
    """How many instructions of each opcode of :data:`OPCODES` the SASS has."""
    counts = collections.Counter(m.split(".")[0] for m in instructions(sass))
    return {op: n for op, n in sorted(counts.items()) if op in OPCODES}


def compile_kernel(kernel, signature: str, cc=(9, 0), workdir: str | None = None,
                   label: str | None = None) -> dict:
    """PTX -> cubin for one kernel and architecture; the resource report and SASS."""
    from numba import cuda
    from numba.cuda import dispatcher

    class _Target:  # device functions ask the current device for its compute capability
        compute_capability = cc

    dispatcher.get_current_device = _Target  # there is none here: answer for it
    py_func = kernel.py_func
    options = {k: v for k, v in getattr(kernel, "targetoptions", {}).items()
               if k in ("fastmath", "lineinfo", "debug")}
    ptx, _ = cuda.compile_ptx(py_func, signature, cc=cc, **options)
    arch = f"sm_{cc[0]}{cc[1]}"

    def assemble() -> dict:  # ptxas and cuobjdump, once a PTX text (:func:`_kept`)
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            ptx_path, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
            ptx_path.write_text(ptx)
            proc = subprocess.run([cuda_tool("ptxas"), f"-arch={arch}", "-v", str(ptx_path),
                                   "-o", str(cubin)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"ptxas failed for {py_func.__name__}: {proc.stderr}")
            sass = subprocess.run([cuda_tool("cuobjdump"), "-sass", str(cubin)],
                                  capture_output=True, text=True, check=True).stdout
        return dict(**_parse_ptxas(proc.stderr), sass=sass)

    assembled = _kept("ptx", assemble, ptx, arch)
    return dict(kernel=label or py_func.__name__, arch=arch, signature=signature,
                options=options, **{k: v for k, v in assembled.items() if k != "sass"},
                sass_counts=sass_counts(assembled["sass"]), sass=assembled["sass"])


def factory_label(factory, D: int, variant: dict) -> str:
    """A report's label for a kernel a factory built: ``name(D=64, key=value)``."""
    return f"{factory.__name__}(" + ", ".join(
        [f"D={D}"] + [f"{key}={val!r}" for key, val in variant.items()]) + ")"


def cold_local_memory(sass: str) -> bool:
    """Whether every local-memory access (STL, LDL) of a kernel lies in an out-of-line
    subroutine for a warp shuffle on a divergent warp (WARPSYNC, SHFL): the compiler's
    slow path for a warp that has split, which a converged warp never runs."""
    segments = re.split(r"RET\.REL[^\n]*\n", sass)
    return all("WARPSYNC" in seg and "SHFL" in seg and "HMMA" not in seg
               for seg in segments if re.search(r"\b(STL|LDL)\b", seg))


def cache_dir() -> Path:
    """Where compiled builds and reports are kept: ``_build`` in the repository (the
    tests and the book build share it), ``~/.cache/flashattention-from-scratch`` for
    an install without it."""
    root = Path(__file__).resolve().parent.parent
    return (root / "_build" if (root / "pyproject.toml").exists()  # the repository
            else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
            / "flashattention-from-scratch")  # installed without it


def compilers() -> str:
    """The compilers' packages and versions: a build depends on them as on its source."""
    from importlib.metadata import distributions

    return "\n".join(sorted(f"{d.metadata['Name']}={d.version}" for d in distributions()
                            if d.metadata["Name"] and d.metadata["Name"].lower().startswith(
                                ("numba", "cuda-bindings", "nvidia-cuda"))))


def _kept(kind: str, make, *made_of) -> dict:
    """What ``make()`` returns (a dict of JSON values), kept on disk under the hash of
    what it is made of and the compilers' versions: a build the tests, the compile
    reports and the book build all ask for is compiled once. Written whole, then
    renamed, so that no process sees half of one."""
    h = hashlib.sha256(kind.encode())
    for part in (*made_of, compilers()):
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    path = cache_dir() / "builds" / f"{kind}-{h.hexdigest()[:32]}.json"
    if path.exists():
        return json.loads(path.read_text())
    made = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    partial.write_text(json.dumps(made))
    os.replace(partial, path)
    return made


def nvrtc_cubin(source: str, options, arch: str = "sm_90") -> bytes:
    """CUDA C++ to machine code (a cubin) with NVRTC from pip; no GPU needed.
    ``options`` as CuPy gets them; the architecture is added here."""
    return nvrtc_compile(source, options, arch)[0]


def ptxas_notes(log: str) -> list[str]:
    """The performance notes in a compiler log: ptxas's numbered ones (C7xxx), such as
    a ``wgmma`` wait it put in where it could not tell that a multiply's registers were
    free (C7517), which serializes multiplies the source meant to overlap."""
    return [line.split("info    : ", 1)[-1].strip() for line in log.splitlines()
            if re.search(r"\(C7\d{3}\)", line)]


def nvrtc_compile(source: str, options, arch: str = "sm_90") -> tuple[bytes, str]:
    """:func:`nvrtc_cubin`'s cubin and the compiler's log (ptxas's notes among it),
    each build compiled once (:func:`_kept`)."""
    import base64

    def build() -> dict:
        cubin, log = _nvrtc_build(source, options, arch)
        return {"cubin": base64.b64encode(cubin).decode(), "log": log}

    kept = _kept("nvrtc", build, source, *options, arch)
    return base64.b64decode(kept["cubin"]), kept["log"]


def _nvrtc_build(source: str, options, arch: str) -> tuple[bytes, str]:
    from cuda.bindings import nvrtc

    def ok(result, *values):
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC: {nvrtc.nvrtcGetErrorString(result)[1].decode()}")
        return values[0] if len(values) == 1 else values or None

    prog = ok(*nvrtc.nvrtcCreateProgram(source.encode(), b"attention.cu", 0, [], []))
    try:
        opts = [o.encode() for o in (*options, f"--gpu-architecture={arch}")]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        # NVRTC writes into the buffer it is given: a bytearray, never bytes. A one-byte
        # b" " * 1 is CPython's shared b" ", and an empty log (a lone NUL) written into it
        # made every b" " in the process b"\x00", and Python 3.12's parser then dropped the
        # spaces of f-strings compiled later ("D=64gain").
        log = bytearray(ok(*nvrtc.nvrtcGetProgramLogSize(prog)))
        ok(*nvrtc.nvrtcGetProgramLog(prog, log))
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC could not compile for {arch}:\n"
                               + log.decode(errors="replace").strip())
        cubin = bytearray(ok(*nvrtc.nvrtcGetCUBINSize(prog)))
        ok(*nvrtc.nvrtcGetCUBIN(prog, cubin))
        return bytes(cubin), log.decode(errors="replace").rstrip("\x00 ")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _parse_res_usage(text: str) -> dict:
    """cuobjdump -res-usage: registers, stack (local memory per thread) and shared memory
    of each function, and the largest of each over a module's functions (a chapter's
    build may hold several kernels)."""
    found = re.findall(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)",
                       text)
    if not found:
        raise RuntimeError(f"unexpected cuobjdump -res-usage output: {text[-500:]}")
    functions = {name: dict(registers=int(reg), stack_bytes=int(stack) + int(local),
                            shared_bytes=int(shared))
                 for name, reg, stack, shared, local in found}
    return dict(registers=max(f["registers"] for f in functions.values()),
                shared_bytes=max(f["shared_bytes"] for f in functions.values()),
                stack_bytes=max(f["stack_bytes"] for f in functions.values()),
                spill_stores=0, spill_loads=0, functions=functions)


def compile_cuda(source: str, options, arch: str, label: str,
                 workdir: str | None = None) -> dict:
    """NVRTC -> cubin for one kernel and architecture; the resource report, SASS and
    ptxas's performance notes. Local memory (stack) stands for spills: these kernels
    have no local arrays."""
    cubin, log = nvrtc_compile(source, options, arch)
    return dict(cubin_report(cubin, arch, label, options, workdir), ptxas_notes=ptxas_notes(log))


def cubin_report(cubin: bytes, arch: str, label: str, options=(),
                 workdir: str | None = None) -> dict:
    """The resource report and SASS of a compiled kernel (``cuobjdump``), each cubin's
    read once (:func:`_kept`)."""
    def read() -> dict:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            path = Path(tmp, "k.cubin")
            path.write_bytes(cubin)
            usage = subprocess.run([cuda_tool("cuobjdump"), "-res-usage", str(path)],
                                   capture_output=True, text=True, check=True).stdout
            sass = subprocess.run([cuda_tool("cuobjdump"), "-sass", str(path)],
                                  capture_output=True, text=True, check=True).stdout
        return dict(**_parse_res_usage(usage), sass=sass)

    read_once = _kept("cubin", read, cubin)
    return dict(kernel=label, arch=arch, signature="CUDA C++ (NVRTC)",
                options=[o for o in options if not o.startswith("-I")],
                **{k: v for k, v in read_once.items() if k != "sass"},
                sass_counts=sass_counts(read_once["sass"]), sass=read_once["sass"])


def _chapter_module(name: str):
    """The module generated from the chapter called ``name`` (``kernels.CHAPTERS``)."""
    import kernels

    number = {v: k for k, v in kernels.CHAPTERS.items()}.get(name)
    if number is None:
        raise ValueError(f"no chapter module {name!r}; the chapters: "
                         f"{', '.join(kernels.CHAPTERS.values())}")
    return kernels.chapter_module(number)


def _build(task: tuple) -> dict:
    """One build of a chapter's report: (chapter name, "cuda" or "numba", index, arch)."""
    module_name, kind, index, arch = task
    module = _chapter_module(module_name)
    if kind == "cuda":
        label, source, options, *_ = module.CUDA_COMPILE[index]
        return compile_cuda(source, options, arch, label)
    kernel, signature, *label = module.COMPILE_SIGNATURES[index]
    return compile_kernel(kernel, signature, arch, label=label[0] if label else None)


def _compile_module(module_name: str) -> list[dict]:
    """Every build of a chapter's report, in order, compiled by as many processes as the
    machine has cores (each build is one compiler run and its disassembly)."""
    from concurrent.futures import ProcessPoolExecutor

    module = _chapter_module(module_name)
    tasks = [(module_name, "cuda", i, arch)
             for i, (_, _, _, *archs) in enumerate(getattr(module, "CUDA_COMPILE", ()))
             for arch in build_archs(module_name, archs[0] if archs else module.ARCHS)]
    # (label, source, options[, archs])
    tasks += [(module_name, "numba", i, cc)  # (kernel, types[, label])
              for i in range(len(getattr(module, "COMPILE_SIGNATURES", ()))) for cc in ARCHS]
    if len(tasks) < 2 or (os.cpu_count() or 1) < 2:
        return [_build(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        return list(pool.map(_build, tasks))


def _report_key(module_name: str) -> str:
    """What a chapter's report depends on: the package's sources and the compilers'
    versions."""
    h = hashlib.sha256(module_name.encode())
    package = Path(__file__).resolve().parent  # the harness and the chapters (not exercises)
    for path in sorted(package.glob("*.py")) + sorted((package / "chapters").glob("*.py")):
        h.update(path.read_bytes())
    h.update(compilers().encode())
    return h.hexdigest()[:16]


#: the reports read last in this process, by file (a few: each holds every build's SASS)
_REPORTS: dict = {}
_REPORTS_KEPT = 3


def _remembered(path: Path, text: str) -> list[dict]:
    if len(_REPORTS) >= _REPORTS_KEPT:
        _REPORTS.pop(next(iter(_REPORTS)))
    return _REPORTS.setdefault(path, json.loads(text))


def report(module_name: str) -> list[dict]:
    """Compile every kernel of a chapter module, in a subprocess; one dict each.
    Kept in ``_build/compile-reports`` (the tests and the book build ask for the
    same reports; ``~/.cache/flashattention-from-scratch`` for an install without the
    repository), keyed by the package's sources and the compilers' versions; read
    once a process (the same list each call: not to be changed)."""
    root = Path(__file__).resolve().parent.parent
    cached = cache_dir() / "compile-reports" / f"{module_name}-{_report_key(module_name)}.json"
    if cached in _REPORTS:
        return _REPORTS[cached]
    if cached.exists():
        return _remembered(cached, cached.read_text())
    env = {**os.environ, "FA_BOOK_MODE": "compile", "NUMBA_ENABLE_CUDASIM": "0"}
    proc = subprocess.run([sys.executable, "-m", "kernels.compile_report", module_name,
                           "--json"], capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(f"compile report failed:\n{proc.stderr[-3000:]}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    # written whole, then renamed: a run stopped mid-write, or another process reading
    # the cache meanwhile, never leaves or sees half a report
    partial = cached.with_suffix(f".{os.getpid()}.part")
    partial.write_text(proc.stdout)
    os.replace(partial, cached)
    return _remembered(cached, proc.stdout)


def summary_table(rows: list[dict]) -> str:
    """The resource report as a Markdown table."""
    head = ("| kernel | arch | registers | shared (B) | stack (B) | spills (B) | "
            "instructions (static count) |\n|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        mix = ", ".join(f"{k} {v}" for k, v in r["sass_counts"].items())
        lines.append(f"| `{r['kernel']}` | {r['arch']} | {r['registers']} | "
                     f"{r['shared_bytes']} | {r['stack_bytes']} | "
                     f"{r['spill_stores'] + r['spill_loads']} | {mix} |")
    seen = sorted({op for r in rows for op in r["sass_counts"]})
    legend = "; ".join(f"`{op}`: {OPCODES[op]}" for op in seen)
    return "\n".join(lines) + (f"\n\n{legend}." if legend else "")


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="compile a chapter's kernels and report")
    ap.add_argument("module", help="a chapter's name, e.g. naive_attention")
    ap.add_argument("--json", action="store_true", help="print JSON (with SASS)")
    args = ap.parse_args(argv)
    from .mode import MODE

    if MODE == "sim":
        print("set FA_BOOK_MODE=compile (the simulator cannot compile)", file=sys.stderr)
        return 2
    rows = _compile_module(args.module)
    print(json.dumps(rows) if args.json else summary_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
