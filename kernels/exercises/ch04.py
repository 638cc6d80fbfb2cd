"""Chapter 4's exercises: the shared-memory wavefronts of a tile's row stride, a
swizzle that removes the bank conflicts without padding, and a prediction of the share
of the fp32 peak the chapter's kernel reaches.

The bank model is the hardware's: 32 banks of 4 bytes; a warp's 16-byte loads are
served 8 lanes (128 bytes) at a time, each group of 8 taking as many wavefronts as the
largest number of different 16-byte chunks that fall in the same 4 banks (lanes reading
the same chunk share it); 4-byte accesses are served 32 lanes at a time, taking as many
wavefronts as the largest number of different words in one bank. The access patterns
are those of chapter 4's kernel with fp32 tiles: a row group's 8 lanes read 8 different
keys at one column of K, and 8 consecutive chunks of one row of V; a warp stores 32
consecutive elements of a tile row when it copies a tile.
"""

from __future__ import annotations

import math
from collections import Counter

from kernels.chapters.ch04_shared_memory import LAYOUTS, tile_stride
from kernels.exercises import exercise, verdict
from kernels import results
from kernels.bench import FP32_PEAK_TFLOPS, Shape
from kernels.exercises.predictions import Band, Measured, prediction, recorded_gpu

LANES = 8  #: lanes of a row group: one quarter-warp of 16-byte loads
CHUNK = 4  #: floats in a 16-byte chunk
BANK_GROUPS = 8  #: 16-byte chunks across the 32 banks


def wavefronts_16(offsets) -> int:
    """Wavefronts of one quarter-warp's 16-byte loads at these float offsets."""
    chunks = {o // CHUNK for o in offsets}  # lanes reading one chunk share it
    return max(Counter(c % BANK_GROUPS for c in chunks).values())


def wavefronts_4(offsets) -> int:
    """Wavefronts of one warp's 4-byte accesses at these float offsets."""
    return max(Counter(o % 32 for o in set(offsets)).values())


def _banks(offsets) -> str:
    return ", ".join(f"{o % 32}-{o % 32 + 3}" for o in offsets)


def k_read(stride: int) -> list[int]:
    """Float offsets of the 8 lanes reading keys 0..7 of a K tile at column 0."""
    return [x * stride for x in range(LANES)]


STRIDES = range(4, 264, 4)  #: row strides checked: 16-byte aligned, up to D = 256 + 4


@exercise("4.1", "Wavefronts of a row stride", wrong_answers={
    "conflicts only when the stride is a multiple of 32 floats":
        lambda stride: 8 if stride % 32 == 0 else 1,
    "gcd with 8 counted in floats, not 16-byte chunks": lambda stride: math.gcd(stride, 8),
    "32 banks of 16 bytes": lambda stride: math.gcd(stride // 4, 32),
})
def check_wavefronts(wavefronts):
    """``wavefronts(stride)``: wavefronts of the 8 lanes' 16-byte reads of keys 0..7,
    rows ``stride`` floats apart (a multiple of 4)."""
    for stride in STRIDES:
        want, got = wavefronts_16(k_read(stride)), wavefronts(stride)
        if got != want:
            return verdict("4.1", [
                f"rows {stride} floats apart: {want} wavefront{'s' if want > 1 else ''}, "
                f"yours {got}",
                f"the 8 lanes read keys 0-7 at float offsets {k_read(stride)}, in banks "
                f"{_banks(k_read(stride))}"])
    lines = [f"right for every stride from {STRIDES[0]} to {STRIDES[-1]} floats; chapter 3's "
             "and 4's K tiles:"]
    for D in (16, 32, 64, 128):
        lines.append(", ".join(f"D={D} {layout} (stride {tile_stride(D, layout)}): "
                               f"{wavefronts_16(k_read(tile_stride(D, layout)))}"
                               for layout in LAYOUTS if layout != "swizzled"))
    return verdict("4.1", [], lines)


ROWS = 32  #: rows of the K and V tiles (chapter 3's 32 keys a tile)
SWIZZLE_DIMS = (32, 64, 128)  #: head dims with at least 8 chunks a row


def _layout_problems(swizzle, D) -> list[str]:
    """Problems of ``swizzle`` as a layout of a ROWS x D fp32 tile: every element its
    own place in the tile's ROWS * D floats, and every 16-byte chunk kept whole."""
    seen = {}
    for r in range(ROWS):
        for d in range(D):
            o = swizzle(r, d, D)
            if not 0 <= o < ROWS * D:
                return [f"D={D}: element (r, d) = ({r}, {d}) at offset {o}, outside the "
                        f"tile's {ROWS * D} floats ({ROWS} rows of {D}): a swizzle moves "
                        "data within the tile, it takes no space"]
            if o in seen:
                return [f"D={D}: elements {seen[o]} and {(r, d)} are both at offset {o}"]
            seen[o] = (r, d)
        for c in range(0, D, CHUNK):
            chunk = [swizzle(r, c + e, D) for e in range(CHUNK)]
            if chunk[0] % CHUNK or chunk != list(range(chunk[0], chunk[0] + CHUNK)):
                return [f"D={D}: row {r}, elements {c}..{c + CHUNK - 1} are at offsets "
                        f"{chunk}: not one 16-byte chunk in order, so one 16-byte load "
                        "(LDS.128) cannot read them"]
    return []


def _conflict_problems(swizzle, D) -> list[str]:
    """Bank conflicts of the kernel's accesses to a tile laid out by ``swizzle``."""
    for r0 in range(0, ROWS, LANES):  # K: lanes x read keys r0 + x at column d0
        for d0 in range(0, D, CHUNK):
            offsets = [swizzle(r0 + x, d0, D) for x in range(LANES)]
            if (n := wavefronts_16(offsets)) > 1:
                return [f"D={D}: reading K for the scores, the 8 lanes read keys "
                        f"{r0}-{r0 + LANES - 1} at column {d0}, in banks {_banks(offsets)}: "
                        f"{n} wavefronts, not 1"]
    for r in range(ROWS):  # V: lanes x read chunks x (and x + 8, ...) of one row
        for c0 in range(0, D, LANES * CHUNK):
            offsets = [swizzle(r, c0 + CHUNK * x, D) for x in range(LANES)]
            if (n := wavefronts_16(offsets)) > 1:
                return [f"D={D}: reading V for O, the 8 lanes read row {r}, columns "
                        f"{c0}..{c0 + LANES * CHUNK - 1}, in banks {_banks(offsets)}: "
                        f"{n} wavefronts, not 1"]
    for first in range(0, ROWS * D, 32):  # the copy: a warp stores 32 elements in a row
        offsets = [swizzle(*divmod(item, D), D) for item in range(first, first + 32)]
        if (n := wavefronts_4(offsets)) > 1:
            r, d = divmod(first, D)
            return [f"D={D}: copying the tile, a warp stores row {r}, columns {d}..{d + 31}: "
                    f"{n} wavefronts, not 1"]
    return []


@exercise("4.2", "A swizzle instead of padding", wrong_answers={
    "XOR on the element, not the chunk": lambda r, d, D: r * D + (d ^ (r % 8)),
    "XOR with r % 4: half the conflicts left": lambda r, d, D:
        r * D + (((d // 4) ^ (r % 4)) * 4) + d % 4,
    "padding (D + 4 a row), not a swizzle": lambda r, d, D: r * (D + 4) + d,
})
def check_swizzle(swizzle):
    """``swizzle(r, d, D)``: the float offset of element (r, d) of an unpadded fp32
    tile of D floats a row."""
    for D in SWIZZLE_DIMS:
        problems = _layout_problems(swizzle, D) or _conflict_problems(swizzle, D)
        if problems:
            return verdict("4.2", problems)
    return verdict("4.2", [], [
        f"at D = {', '.join(str(D) for D in SWIZZLE_DIMS)}: every element in the tile's "
        f"{ROWS} x D floats, 16-byte chunks whole, and one wavefront for each read of K "
        "and of V and each store of the copy"])


# ---- 4.3: predict the measurement ------------------------------------------------------


#: a suite shape the chapter's timings table holds but its text does not discuss
PEAK_SHAPE = Shape(4, 32, 4096, 4096, 64)


def share_of_fp32_peak(recorded: dict) -> Measured | None:
    """The chapter's kernel's TFLOPS at PEAK_SHAPE over the fp32 CUDA-core peak."""
    r = results.timed(recorded["records"], "shared_memory_attention", PEAK_SHAPE)
    if r is None:
        return None
    return Measured(r["tflops"] / FP32_PEAK_TFLOPS, recorded_gpu(recorded, 4),
                    f"shared_memory_attention {r['tflops']:.1f} TFLOPS at {PEAK_SHAPE.label()}, "
                    f"of the {FP32_PEAK_TFLOPS:.0f} TFLOPS fp32 peak")


check_peak_prediction = prediction(
    "4.3", "Predict: the share of the fp32 peak", measure=share_of_fp32_peak, band=Band(0.3),
    unit="share",
    wrong_answers={"the peak itself: every issued instruction an FFMA": 0.95,
                   "a percentage, not a fraction": 42.0,
                   "a tenth: as if memory still limited it": 0.1})
