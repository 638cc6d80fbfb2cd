"""What the checkers of the CUDA C++ chapters' exercises share.

A reader's variant of a chapter's kernel (other switches, or a line of the source
changed) is compiled without a GPU by NVRTC from pip (:func:`build`, kept for the
session: a stub, its solution and the wrong answers often ask for the same build), and
its machine code read: registers, local memory, instruction counts. Where there is a
GPU, the same variant is compiled by CuPy (:func:`gpu_kernel`) and checked against the
float64 reference like every kernel of the book (:func:`gpu_checks`).
"""

from __future__ import annotations

import functools
import re

from ..compile_report import compile_cuda, opcode_count

#: what a checker says where it could not run the reader's kernel
NO_GPU = ("no GPU here: the kernel was compiled, not run; on a GPU this checker also runs "
          "it against the float64 reference")
#: small shapes that take a kernel down its ragged and causal paths, at both head dims
CHECK_SHAPES = [(1, 2, 77, 77, 64, False), (2, 3, 200, 130, 64, True),
                (1, 2, 130, 200, 128, True), (1, 1, 256, 256, 128, False)]


@functools.lru_cache(maxsize=64)
def build(source: str, options: tuple, arch: str) -> dict:
    """A kernel compiled by NVRTC for ``arch`` (no GPU needed): the compile report of
    :func:`kernels.compile_report.compile_cuda` (registers, ``stack_bytes``, SASS)."""
    return compile_cuda(source, tuple(options), arch, "exercise")


def try_build(source: str, options: tuple, arch: str) -> tuple[dict | None, str]:
    """(report, "") or, where NVRTC refuses the source, (None, its first lines)."""
    try:
        return build(source, tuple(options), arch), ""
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return None, " / ".join(lines[:4])


def local_memory(report: dict) -> str:
    """What a build keeps in local memory, in words."""
    if not report["stack_bytes"]:
        return "no local memory"
    sass = report["sass"]
    return (f"{report['stack_bytes']} bytes of local memory a thread ({opcode_count(sass, 'STL')} "
            f"stores and {opcode_count(sass, 'LDL')} loads of it in the code)")


def substitute(source: str, pattern: str, replacement, what: str) -> str:
    """``source`` with the one match of ``pattern`` replaced (a function of the match, or a
    string); raises if the chapter's source no longer has exactly one such place."""
    found = list(re.finditer(pattern, source, flags=re.S))
    if len(found) != 1:
        raise RuntimeError(f"the chapter's source has {len(found)} places for {what}, not one: "
                           "the exercise needs updating")
    m = found[0]
    text = replacement(m) if callable(replacement) else replacement
    return source[:m.start()] + text + source[m.end():]


@functools.lru_cache(maxsize=16)
def gpu_kernel(source: str, options: tuple, name: str, shared_bytes: int = 0):
    """The kernel ``name`` of ``source`` compiled by CuPy for the GPU at hand, allowed
    ``shared_bytes`` of dynamic shared memory."""
    import cupy

    fn = cupy.RawModule(code=source, options=tuple(options)).get_function(name)
    if shared_bytes > 48 * 1024:  # past the default, a kernel must ask for its shared memory
        fn.max_dynamic_shared_size_bytes = shared_bytes
    return fn


def gpu_checks(attention, shapes=CHECK_SHAPES, dtype="float16") -> tuple[list[str], list[str]]:
    """(problems, checked): ``attention`` against the float64 reference on each shape
    (B, H, S_q, S_k, D, causal), with the logsumexp; one line a shape."""
    from ..check import check_attention

    problems, checked = [], []
    for shape in shapes:
        result = check_attention(attention, *shape, dtype=dtype, lse=True, raise_on_fail=False)
        (checked if result.ok else problems).append("on this GPU: " + result.summary())
    return problems, checked
