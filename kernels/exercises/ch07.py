"""Chapter 7's exercises: a wgmma shared-memory descriptor built bit by bit, the
mbarrier parities of a ring of slots, the widest key tile each block shape holds at
D = 128, and a prediction of what the Hopper kernel gains over chapter 6's."""

from __future__ import annotations

import dataclasses
import random
import re

from .. import gpus
from ..chapters import ch07_hopper_attention as ch07
from . import builds, exercise, verdict
from .cexpr import parse
from ..bench import Shape
from .predictions import Band, prediction, speedup

# ---- 7.1: the shared-memory descriptor ------------------------------------------------

#: the chapter's smem_descriptor, as its source has it: the expression it returns
_DESCRIPTOR = re.compile(r"u64 smem_descriptor\(u32 address, u32 leading\) \{\s*return (.*?);\s*\}",
                         re.S)
#: the descriptor's fields (PTX ISA, "Matrix Descriptor Format"): name, first bit, bits
FIELDS = (("start address >> 4", 0, 14), ("leading byte offset >> 4", 16, 14),
          ("stride byte offset >> 4", 32, 14), ("base offset", 49, 3), ("swizzle mode", 62, 2))


def chapter_descriptor():
    """The chapter's smem_descriptor(address, leading), read from its CUDA source and
    evaluated as the GPU would."""
    found = _DESCRIPTOR.findall(ch07.HOPPER_PTX_SOURCE)
    if len(found) != 1:
        raise RuntimeError("the chapter's smem_descriptor has changed shape: the exercise "
                           "needs updating")
    expression = parse(found[0])
    return lambda address, leading: expression(address=address, leading=leading)


def descriptor_calls(name: str = "hopper_attention"):
    """(what, address, leading) of every descriptor the kernel ``name`` makes for one
    tile in each ring slot, at D = 64 and 128, with its tiles laid out as the kernel lays
    them out from a shared-memory address of 1024."""
    for D in ch07.HEAD_DIMS:
        c = ch07.CONFIGS[name].at(D)
        q_box, kv_box, boxes = 64 * c.consumers * 128, c.block_n * 128, D // 64
        q0 = 1024
        k0 = q0 + boxes * q_box
        v0 = k0 + c.stages * boxes * kv_box
        for warpgroup in range(c.consumers):
            q = q0 + 64 * warpgroup * 128
            for kk in range(D // 16):
                yield (f"D = {D}, Q of warpgroup {warpgroup}, k-step {kk}",
                       q + kk // 4 * q_box + 32 * (kk % 4), 0)
        for slot in range(c.stages):
            k, v = k0 + slot * boxes * kv_box, v0 + slot * boxes * kv_box
            for kk in range(D // 16):
                yield (f"D = {D}, K in slot {slot}, k-step {kk}",
                       k + kk // 4 * kv_box + 32 * (kk % 4), 0)
            for kk in range(c.block_n // 16):
                yield (f"D = {D}, V in slot {slot}, keys {16 * kk}-{16 * kk + 15}",
                       v + kk * 2048, kv_box)


def _field(value: int, first: int, bits: int) -> int:
    return value >> first & ((1 << bits) - 1)


@exercise("7.1", "A wgmma shared-memory descriptor, bit by bit", wrong_answers={
    "the address in bytes": lambda address, leading: (
        address | (leading >> 4) << 16 | (1024 >> 4) << 32 | 1 << 62),
    "the 8-row stride in bytes": lambda address, leading: (
        address >> 4 | (leading >> 4) << 16 | 1024 << 32 | 1 << 62),
    "swizzle mode 3 (that is the 32-byte swizzle)": lambda address, leading: (
        address >> 4 | (leading >> 4) << 16 | (1024 >> 4) << 32 | 3 << 62),
})
def check_descriptor(descriptor):
    """``descriptor(address, leading)``: the 64-bit descriptor of a tile TMA wrote with the
    128-byte swizzle at shared-memory ``address``, ``leading`` bytes between its 64-column
    boxes; checked against the chapter's smem_descriptor on every call the kernel makes."""
    chapter = chapter_descriptor()
    calls = list(descriptor_calls())
    for what, address, leading in calls:
        got, want = descriptor(address, leading), chapter(address, leading)
        if not isinstance(got, int) or isinstance(got, bool) or not 0 <= got < 1 << 64:
            return verdict("7.1", [f"{what}: descriptor({address:#x}, {leading}) returned "
                                   f"{got!r}: give a 64-bit unsigned int"])
        if got == want:
            continue
        for name, first, bits in FIELDS:
            mine, theirs = _field(got, first, bits), _field(want, first, bits)
            if mine != theirs:
                hint = ("; the descriptor counts 16-byte units: shift it right by 4"
                        if theirs and mine == theirs << 4 else
                        "; a field of this width cannot hold your value: shift it right by 4?"
                        if _field(got, first, 64 - first) != mine else "")
                return verdict("7.1", [
                    f"{what} (address {address:#x}, leading {leading}): bits {first}-"
                    f"{first + bits - 1} ({name}) hold {mine} in yours, {theirs} in the "
                    f"chapter's smem_descriptor{hint}"])
        return verdict("7.1", [f"{what} (address {address:#x}, leading {leading}): yours is "
                               f"{got:#018x}, the chapter's {want:#018x}: bits outside the "
                               "five fields differ (they must be 0)"])
    return verdict("7.1", [], [
        f"the same 64 bits as the chapter's smem_descriptor on all {len(calls)} descriptors "
        "hopper_attention makes for one tile in each ring slot at D = 64 and 128 (Q, K, "
        "and V with the distance between its 64-column boxes)"])


# ---- 7.2: the parities of a ring ------------------------------------------------------

class Barrier:
    """An mbarrier: it completes a phase when its count of arrivals is reached; a wait
    for parity p returns once the phase of parity p it names has completed, that is,
    while the number of completed phases is of the other parity."""

    def __init__(self, arrivals: int):
        self.arrivals, self.pending, self.phases = arrivals, arrivals, 0

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.phases, self.pending = self.phases + 1, self.arrivals

    def passes(self, parity: int) -> bool:
        return self.phases % 2 != parity


_CONSUMERS = 2
_SCHEDULES = ("copies land as late as they can", "the producer runs ahead",
              "the consumers run ahead") + tuple(f"random order {seed}" for seed in range(12))


def _run_ring(full_parity, free_parity, stages: int, tiles: int, schedule: str) -> str | None:
    """Run a producer, its copies and two consumers over ``tiles`` tiles through a ring of
    ``stages`` slots, each with a full and a free barrier, in the order ``schedule``
    picks; the first thing that goes wrong, in words, or None."""
    full = [Barrier(1) for _ in range(stages)]  # the producer's arrival, with the bytes
    free = [Barrier(_CONSUMERS) for _ in range(stages)]  # each consumer frees a slot
    held = [None] * stages  # (tile, landed) in each slot
    produced, in_flight = 0, []
    reading = [None] * _CONSUMERS  # the tile a consumer has waited for and not yet freed
    next_tile, freed = [0] * _CONSUMERS, [0] * _CONSUMERS
    rng = random.Random(schedule)
    while True:
        moves = []
        if produced < tiles:
            slot = produced % stages
            if produced < stages or free[slot].passes(free_parity(produced, stages)):
                moves.append(("produce", None))
        moves += [("land", i) for i in range(len(in_flight))]
        for c in range(_CONSUMERS):
            t = next_tile[c]
            if reading[c] is not None:
                moves.append(("free", c))
            elif t < tiles and full[t % stages].passes(full_parity(t, stages)):
                moves.append(("read", c))
        if not moves:
            if produced == tiles and not in_flight and min(next_tile) == tiles:
                return None
            return _deadlock(full, free, produced, next_tile, stages, tiles, full_parity,
                             free_parity)
        if schedule.startswith("copies land"):
            moves = [m for m in moves if m[0] != "land"] or moves
        elif schedule.startswith("the producer"):
            moves = [m for m in moves if m[0] == "produce"] or moves
        elif schedule.startswith("the consumers"):
            moves = [m for m in moves if m[0] in ("read", "free")] or moves
        kind, who = rng.choice(moves)
        if kind == "produce":
            t, slot = produced, produced % stages
            behind = [c for c in range(_CONSUMERS) if t >= stages and freed[c] <= t - stages]
            if behind:
                return (f"the producer's wait on slot {slot}'s free barrier (parity "
                        f"{free_parity(t, stages)}) returned, and it copied tile {t} into the "
                        f"slot while consumer {behind[0]} had not freed tile {t - stages} there")
            held[slot] = (t, False)
            in_flight.append(slot)
            produced += 1
        elif kind == "land":
            slot = in_flight.pop(who)
            held[slot] = (held[slot][0], True)
            full[slot].arrive()
        elif kind == "read":
            t = next_tile[who]
            slot = t % stages
            if held[slot] != (t, True):
                what = ("nothing yet" if held[slot] is None else f"tile {held[slot][0]}"
                        + ("" if held[slot][1] else ", its copy not landed"))
                return (f"consumer {who}'s wait on slot {slot}'s full barrier for tile {t} "
                        f"(parity {full_parity(t, stages)}) returned while the slot held "
                        f"{what}: it would compute on the wrong data")
            reading[who] = t
        else:
            t = reading[who]
            reading[who] = None
            free[t % stages].arrive()
            freed[who], next_tile[who] = t + 1, t + 1


def _phases(bar: Barrier) -> str:
    return f"{bar.phases} phase" + ("" if bar.phases == 1 else "s")


def _deadlock(full, free, produced, next_tile, stages, tiles, full_parity, free_parity) -> str:
    waits = []
    if produced < tiles:
        slot, bar = produced % stages, free[produced % stages]
        waits.append(f"the producer waits on slot {slot}'s free barrier for parity "
                     f"{free_parity(produced, stages)} to copy tile {produced}; the barrier has "
                     f"completed {_phases(bar)}, so the wait returns when phase "
                     f"{bar.phases} completes, when tile {slot + bar.phases * stages} is freed")
    for c, t in enumerate(next_tile):
        if t < tiles:
            slot, bar = t % stages, full[t % stages]
            waits.append(f"consumer {c} waits on slot {slot}'s full barrier for parity "
                         f"{full_parity(t, stages)} for tile {t}; the barrier has completed "
                         f"{_phases(bar)}, so the wait returns when tile "
                         f"{slot + bar.phases * stages} lands")
    return "deadlock: " + "; ".join(waits)


@exercise("7.2", "The phase parities of a ring of slots", wrong_answers={
    "the parity of the tile": (lambda t, stages: t % 2, lambda t, stages: (t // stages - 1) % 2),
    "the producer waits for the lap's own parity": (
        lambda t, stages: t // stages % 2, lambda t, stages: t // stages % 2),
    "the producer always waits for parity 1": (lambda t, stages: t // stages % 2,
                                               lambda t, stages: 1),
})
def check_ring_parities(full_parity, free_parity):
    """``full_parity(t, stages)``: the parity a consumer waits for on the full barrier of
    tile t's slot; ``free_parity(t, stages)``: the parity the producer waits for on the
    free barrier of that slot before copying tile t into it (t >= stages)."""
    for stages in range(1, 5):
        for t in range(4 * stages):
            for name, f in (("full_parity", full_parity), ("free_parity", free_parity)):
                if name == "free_parity" and t < stages:
                    continue
                p = f(t, stages)
                if p not in (0, 1) or isinstance(p, float):
                    return verdict("7.2", [f"{name}({t}, {stages}) returned {p!r}: a parity "
                                           "is 0 or 1"])
    for stages in range(1, 5):
        tiles = 3 * stages + 2  # three laps of the ring and a bit
        for schedule in _SCHEDULES:
            wrong = _run_ring(full_parity, free_parity, stages, tiles, schedule)
            if wrong:
                slots = f"{stages} slot" + ("s" if stages > 1 else "")
                return verdict("7.2", [f"a ring of {slots}, {tiles} tiles, {schedule}: {wrong}"])
    return verdict("7.2", [], [
        f"a producer, its copies (landing in any order) and {_CONSUMERS} consumers, through "
        f"rings of 1 to 4 slots over three laps and more, in {len(_SCHEDULES)} orders each: "
        "every consumer computes only on its tile, landed; the producer refills a slot only "
        "once every consumer has freed it; no deadlock"])


# ---- 7.3: the widest key tile at D = 128 ---------------------------------------------

_H100 = next(g for g in gpus.READER_GPUS if g.compute_capability == (9, 0))


#: the epilogues of the chapter's kernel: O stored from registers (steps 1 to 8) or
#: through shared memory and TMA (step 9 on)
_EPILOGUES = {"stores": False, "tma": True}


def _config(epilogue: str, keys: int):
    return dataclasses.replace(ch07.STEPS["hopper_attention"], tma_store=_EPILOGUES[epilogue],
                               at_d128=(("block_n", keys),))


def _fits(epilogue: str, keys: int) -> tuple[bool, str]:
    """Whether ``keys`` keys a tile fit the chapter's kernel at D = 128 with ``epilogue``
    (shared memory on an H100 or H200, and registers: no local memory), and what was
    found."""
    if keys % 16 or not 16 <= keys <= 256:
        return False, "a key tile is a multiple of 16 keys (P V takes 16 keys a wgmma), at most 256"
    cfg = _config(epilogue, keys)
    nbytes = ch07.shared_bytes(cfg, 128)
    if nbytes > _H100.shared_optin:
        return False, (f"{nbytes} bytes of shared memory, over the {_H100.shared_optin} a block "
                       f"may have on an {_H100.name}")
    report = builds.build(ch07.source(cfg, 128), ch07.nvrtc_options(cfg, 128), "sm_90a")
    if report["stack_bytes"]:
        return False, f"{nbytes} bytes of shared memory, and {builds.local_memory(report)}"
    return True, f"{nbytes} bytes of shared memory, {builds.local_memory(report)}"


@exercise("7.3", "The widest key tile at D = 128", wrong_answers={
    "128 keys with O stored from registers": {"stores": 128, "tma": 128},
    "the TMA epilogue held to the stores' width": {"stores": 112, "tma": 112},
    "the TMA epilogue past the shared memory": {"stores": 112, "tma": 144},
})
def check_widest_tiles(widest: dict):
    """``widest``: {epilogue: keys a tile}, the widest key tile (a multiple of 16) with
    which hopper_attention at D = 128 (three consumers, 160 registers a thread) has no
    local memory and fits an H100's shared memory, with O stored from registers
    ("stores") and through shared memory and TMA ("tma")."""
    if not isinstance(widest, dict) or set(widest) != set(_EPILOGUES):
        return verdict("7.3", ['give a dict {"stores": keys, "tma": keys}: the widest tile '
                               "with each epilogue"])
    checked = []
    for epilogue in _EPILOGUES:
        keys = widest[epilogue]
        if not isinstance(keys, int) or isinstance(keys, bool):
            return verdict("7.3", [f"{epilogue}: give the keys a tile, an int (got {keys!r})"])
        ok, found = _fits(epilogue, keys)
        if not ok:
            return verdict("7.3", [f"{epilogue}, {keys} keys a tile: {found}"])
        wider_ok, wider = _fits(epilogue, keys + 16)
        if wider_ok:
            return verdict("7.3", [f"{epilogue}: {keys} keys fit ({found}), but {keys + 16} "
                                   f"do too ({wider}): wider tiles mean fewer waits and "
                                   "barriers for the same keys"])
        checked.append(f"{epilogue}: {keys} keys a tile fit ({found}); {keys + 16} do not "
                       f"({wider})")
    return verdict("7.3", [], checked + [
        "checked without a GPU: NVRTC for sm_90a, and the shared memory the launcher asks "
        "for; the chapter's recorded run times the kernels it ships"])


# ---- 7.4: predict the measurement ------------------------------------------------------

#: a suite shape at D = 128, where chapters 6 and 7 were both timed
HOPPER_SHAPE = Shape(4, 16, 4096, 4096, 128)

check_hopper_prediction = prediction(
    "7.4", "Predict: what Hopper's machinery gains over FlashAttention-2",
    measure=speedup("flash_attention_2", "hopper_attention", HOPPER_SHAPE, 7),
    band=Band(0.3, side_of=1.0, sides=("slower than chapter 6's kernel",
                                       "faster than chapter 6's kernel")),
    wrong_answers={"no faster: the same algorithm": 1.0,
                   "the tensor cores' whole peak over chapter 6's rate": 5.0})
