"""Chapter 6's exercises: the lanes' ldmatrix addresses for K, a swizzle for rows of 64
bytes, what keeping Q in registers costs at D = 128, and a prediction of the kernel
against SDPA's FlashAttention-2 backend."""

from __future__ import annotations

import dataclasses

import kernels

from .. import gpus
from ..api import prepare
from ..compile_report import opcode_count
from ..chapters import ch06_mma_attention as ch06
from . import builds, exercise, verdict
from .cexpr import ExpressionError, parse
from .. import results
from ..bench import Shape
from .predictions import Band, Measured, prediction, recorded_gpu

# ---- 6.1: the ldmatrix addresses of K ------------------------------------------------

#: the lane's (row, column) that load_b_rows gives ldmatrix, in the chapter's source
K_ADDRESS = (r"(void load_b_rows\(.*?ldmatrix_x4\(b, ldmatrix_address\(tile, key0, col0, )"
             r"([^;]*?), ([^;]*?)(\)\);)")


def _ldmatrix_x4(address) -> dict:
    """{(lane, register): (row, column)} of the low half of each register that
    ldmatrix.x4 fills, given each lane's address (row, column) in a 16 x 16 block: lanes
    8i .. 8i + 7 give the rows of matrix i; register i of lane 4g + t receives row g of
    matrix i, elements 2t and 2t + 1."""
    out = {}
    for lane in range(32):
        for i in range(4):
            row, col = address[8 * i + lane // 4]
            out[lane, i] = (row, col + 2 * (lane % 4))
    return out


def _b_fragments_of_k() -> dict:
    """{(lane, register): (key, column)} of the low half of each register of the B
    operands that S = Q K^T multiplies, keys 0-15 of a 16 x 16 block of K: b0, b1 for
    keys 0-7, b2, b3 for keys 8-15. B is K^T: its element (k, n) is K[n][k]."""
    want = {}
    for col in range(0, 16, 2):  # B's row k: K's column; the register's low half
        for key in range(16):
            lane, register = ch06.fragment_owner("b", col, key % 8)
            want[lane, register + 2 * (key // 8)] = (key, col)
    return want


def _k_variant_source(row: str, col: str) -> str:
    return builds.substitute(ch06.SOURCE, K_ADDRESS,
                             lambda m: f"{m.group(1)}({row}), ({col}){m.group(4)}",
                             "load_b_rows's ldmatrix address")


def _variant_attention(source: str, name: str = "flash_attention_2"):
    """Step ``name`` of the chapter with its kernel compiled from ``source``."""
    def attention(q, k, v, causal=False, scale=None, out=None, lse=None, return_lse=False):
        a = prepare(q, k, v, causal=causal, scale=scale, out=out, kernel=f"{name} (yours)",
                    head_dims=ch06.HEAD_DIMS, dtypes=ch06.DTYPES, lse=lse,
                    return_lse=return_lse, pointers=True, strided=True, grouped=True)
        launch = ch06.launch_description(name, a, gpus.current())
        options = ch06.nvrtc_options(ch06.CONFIGS[name], a.D, a.dtype, a.scale < 0)
        fn = builds.gpu_kernel(source, options, "attention_kernel", launch.shared_bytes)
        dataclasses.replace(launch, function=fn)()
        return a.returned()
    return attention


@exercise("6.1", "The ldmatrix addresses of K", wrong_answers={
    "A's addresses (load_a): registers 1 and 2 swapped": ("lane % 16", "lane / 16 * 8"),
    "keys 8-15 in b0, b1": ("lane % 8 + (lane / 16 ^ 1) * 8", "lane / 8 % 2 * 8"),
    "columns not on a 16-byte boundary": ("lane % 8 + lane / 16 * 8", "lane / 8 % 2 * 4"),
})
def check_k_addresses(row: str, col: str):
    """``row`` and ``col``: C++ expressions of ``lane``, the row (key) and column of the
    16 x 16 block of K whose address lane ``lane`` gives ldmatrix.x4 in load_b_rows."""
    try:
        row_of, col_of = parse(row), parse(col)
        address = [(row_of(lane=lane), col_of(lane=lane)) for lane in range(32)]
    except ExpressionError as e:
        return verdict("6.1", [str(e)])
    for lane, (r, c) in enumerate(address):
        if not (0 <= r < 16 and c in (0, 8)):
            return verdict("6.1", [
                f"lane {lane} gives row {r}, column {c}: an address must lie in the 16 x 16 "
                "block, on a row's first or second 16 bytes (column 0 or 8): ldmatrix reads "
                "16 bytes a row, from a 16-byte boundary"])
    got, want = _ldmatrix_x4(address), _b_fragments_of_k()
    for (lane, i), (key, c) in sorted(want.items()):
        if got[lane, i] != (key, c):
            r, gc = got[lane, i]
            return verdict("6.1", [
                f"lane {lane}'s register b{i} would hold K[{r}][{gc}:{gc + 2}] (key {r}, "
                f"columns {gc}-{gc + 1}); mma.sync multiplies b{i} as keys "
                f"{8 * (i // 2)}-{8 * (i // 2) + 7}, and wants K[{key}][{c}:{c + 2}] there "
                f"(fragment_owner('b', {c}, {key % 8}) is ({lane}, {i % 2}))",
                "ldmatrix.x4: lanes 8i .. 8i + 7 give the rows of matrix i, and register i "
                "of lane 4g + t receives row g of matrix i, elements 2t and 2t + 1"])
    checked = ["every register of every lane holds the elements of K that mma.sync's B "
               "operand wants (b0, b1: keys 0-7; b2, b3: keys 8-15), by fragment_owner"]
    source = _k_variant_source(row, col)
    report, error = builds.try_build(
        source, ch06.nvrtc_options(ch06.CONFIGS["flash_attention_2"], 64), "sm_80")
    if report is None:
        return verdict("6.1", [f"NVRTC cannot compile the kernel with your expressions: {error}"])
    checked.append(f"flash_attention_2 with your addresses compiles for sm_80 (D = 64): "
                   f"{opcode_count(report['sass'], 'LDSM')} LDSM, {report['registers']} "
                   f"registers, {builds.local_memory(report)}")
    if kernels.MODE != "gpu":
        return verdict("6.1", [], checked + [builds.NO_GPU])
    problems, ran = builds.gpu_checks(_variant_attention(source))
    return verdict("6.1", problems, checked + ran)


# ---- 6.2: a swizzle for 64-byte rows --------------------------------------------------

_CHUNKS = 4  # 16-byte chunks of a row of 32 fp16 elements
_TILE_ROWS = 64


def _bank_group(row: int, place: int) -> int:
    """The group of 4 banks (0-7) that chunk place ``place`` of row ``row`` lies in, in a
    dense tile of 64-byte rows: two rows a 128-byte line of the 32 banks."""
    return (row * _CHUNKS + place) % 8


@exercise("6.2", "A swizzle for rows of 64 bytes", wrong_answers={
    "the chapter's swizzle, made for 128-byte rows": lambda row, chunk: chunk ^ (row & 7),
    "XOR with the row's low two bits": lambda row, chunk: chunk ^ (row & 3),
    "XOR with one bit of the row": lambda row, chunk: chunk ^ ((row >> 1) & 1),
})
def check_swizzle_64_byte_rows(swizzled_chunk):
    """``swizzled_chunk(row, chunk)``: where, among the 4 16-byte chunks of row ``row``
    of a tile of 32-element (64-byte) rows, chunk ``chunk`` is stored."""
    places = {}
    for row in range(_TILE_ROWS):
        for chunk in range(_CHUNKS):
            p = swizzled_chunk(row, chunk)
            if not isinstance(p, int) or isinstance(p, bool):
                return verdict("6.2", [f"swizzled_chunk({row}, {chunk}) returned {p!r}: give "
                                       "the chunk's place in its row, an int from 0 to 3"])
            if not 0 <= p < _CHUNKS:
                return verdict("6.2", [
                    f"row {row}'s chunk {chunk} would be stored at chunk {p}, past the row's "
                    f"{_CHUNKS} chunks (its 64 bytes): it would overwrite another row"])
            places[row, chunk] = p
        seen = {}
        for chunk in range(_CHUNKS):
            p = places[row, chunk]
            if p in seen:
                return verdict("6.2", [f"row {row}: chunks {seen[p]} and {chunk} would both be "
                                       f"stored at chunk {p}: one overwrites the other"])
            seen[p] = chunk
    for row0 in range(0, _TILE_ROWS, 8):  # one ldmatrix matrix: 8 rows at one column
        for chunk in range(_CHUNKS):
            groups = {}
            for row in range(row0, row0 + 8):
                groups.setdefault(_bank_group(row, places[row, chunk]), []).append(row)
            group, rows = max(groups.items(), key=lambda kv: len(kv[1]))
            if len(rows) > 1:
                return verdict("6.2", [
                    f"an ldmatrix matrix of rows {row0}-{row0 + 7} at columns "
                    f"{8 * chunk}-{8 * chunk + 7} finds rows {', '.join(map(str, rows))} in "
                    f"bank group {group} (banks {4 * group}-{4 * group + 3}): a "
                    f"{len(rows)}-way conflict, {len(rows)} passes where one would do",
                    "a row is 64 bytes: rows 2j and 2j + 1 share a 128-byte line of the 32 "
                    "banks, row 2j + 1 in its upper half"])
    return verdict("6.2", [], [
        f"rows 0-{_TILE_ROWS - 1}: each row's 4 chunks stored at 4 different places of the "
        "row (no chunk overwrites another, and 8 threads copying 16 bytes each, two rows, "
        "write 8 different bank groups)",
        "every 8 x 8 ldmatrix matrix (8 rows from a multiple of 8, at one column) finds its "
        "8 rows in 8 different bank groups: one pass each"])


# ---- 6.3: Q in registers at D = 128 ---------------------------------------------------

def _arrays_at_d128() -> dict:
    """32-bit registers a thread holds for O, Q and S in flash_attention_2's D = 128
    shape, were Q kept in registers: from the chapter's fragments (a 16 x 8 fp32
    accumulator is 4 registers a lane, a 16 x 16 A operand of 16-bit pairs 4 too)."""
    c, D = ch06.STEPS["flash_attention_2"].at(128), 128
    keys = c.subtile_keys or c.keys
    return {"O": c.row_tiles * (D // 8) * 4, "Q": c.row_tiles * (D // 16) * 4,
            "S": c.row_tiles * (keys // 8) * 4}


def _q_in_registers():
    main = ch06.STEPS["flash_attention_2"]
    return dataclasses.replace(main, at_d128=tuple(
        (k, v) for k, v in main.at_d128 if k != "q_registers") + (("q_registers", True),))


_WHAT = {"O": "the O accumulators of the warp's rows, 128 fp32 columns",
         "Q": "Q's A fragments of the warp's rows, 128 16-bit columns, kept for the whole kernel",
         "S": "the scores of one key tile, fp32"}


@exercise("6.3", "What keeping Q in registers costs at D = 128", wrong_answers={
    "O for 16 rows a warp": {"O": 64, "Q": 64, "S": 64, "spills": True},
    "Q counted as fp32": {"O": 128, "Q": 128, "S": 64, "spills": True},
    "the right counts, but the wrong prediction": {"O": 128, "Q": 64, "S": 64, "spills": False},
})
def check_q_registers(answer: dict):
    """``answer``: {"O": n, "Q": n, "S": n, "spills": bool}: the registers a thread of
    flash_attention_2 at D = 128 (32 rows a warp, 64 keys a tile) holds for each array
    if Q were kept in registers, and whether that build keeps values in local memory."""
    if not isinstance(answer, dict) or set(answer) != {"O", "Q", "S", "spills"}:
        return verdict("6.3", ['give a dict with the keys "O", "Q", "S" and "spills"'])
    want = _arrays_at_d128()
    c = ch06.STEPS["flash_attention_2"].at(128)
    for name in ("O", "Q", "S"):
        if not isinstance(answer[name], int) or isinstance(answer[name], bool):
            return verdict("6.3", [f"{name}: give the registers a thread holds for it, an int "
                                   f"(got {answer[name]!r})"])
        if answer[name] != want[name]:
            return verdict("6.3", [
                f"{name}: you say {answer[name]!r} registers a thread; {_WHAT[name]}, for "
                f"{16 * c.row_tiles} rows a warp, are {want[name]} (each lane holds 1/32 of "
                "a warp's tiles: a 16 x 8 fp32 accumulator is 4 registers a lane, a 16 x 16 "
                "fp16 A operand 4 too)"])
    q_reg = _q_in_registers()
    report = builds.build(ch06.SOURCE, ch06.nvrtc_options(q_reg, 128), "sm_90")
    main = builds.build(ch06.SOURCE, ch06.nvrtc_options(ch06.STEPS["flash_attention_2"], 128),
                        "sm_90")
    spills = report["stack_bytes"] > 0
    found = (f"NVRTC for sm_90 with Q in registers: {report['registers']} registers, "
             f"{builds.local_memory(report)}; the chapter's kernel, Q re-read from shared "
             f"memory: {main['registers']} registers, {builds.local_memory(main)}")
    if not isinstance(answer["spills"], bool) or answer["spills"] != spills:
        return verdict("6.3", [f"you predict spills={answer['spills']!r}; {found}"])
    total = sum(want.values())
    return verdict("6.3", [], [
        f"O {want['O']} + Q {want['Q']} + S {want['S']} = {total} registers a thread for the "
        "three arrays alone, of the 255 a thread may have", found])


# ---- 6.4: predict the measurement ------------------------------------------------------

#: a suite shape at D = 128 (the chapter's text discusses D = 64)
PEER_SHAPE = Shape(4, 16, 4096, 4096, 128)


def against_sdpa_flash(recorded: dict) -> Measured | None:
    """How many times faster flash_attention_2 ran than SDPA's FlashAttention-2 backend
    timed beside it, in turns, at PEER_SHAPE."""
    r = results.timed(recorded["records"], "flash_attention_2", PEER_SHAPE)
    if r is None or not r.get("sdpa_flash_ms"):
        return None
    return Measured(r["sdpa_flash_ms"] / r["median_ms"], recorded_gpu(recorded, 6),
                    f"flash_attention_2 {r['median_ms']:.3g} ms, SDPA's FlashAttention-2 "
                    f"backend {r['sdpa_flash_ms']:.3g} ms beside it, at {PEER_SHAPE.label()}")


check_peer_prediction = prediction(
    "6.4", "Predict: the chapter's kernel against FlashAttention-2 itself",
    measure=against_sdpa_flash, band=Band(0.2),
    wrong_answers={"a third of its speed: a library kernel must be faster": 0.3,
                   "three times faster": 3.0})
