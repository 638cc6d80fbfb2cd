"""Chapter 7's persistent kernel's barrier protocol, modelled in Python and run in many
orders, without a GPU: the producer's and each consumer's waits, arrivals and copies in
the order the CUDA C++ issues them (KERNEL_SOURCE's loops), mbarriers with parities that
name a phase only up to a lap, and copies that land whenever they like. Each run checks
that no wait returns while its slot holds another tile (or one not landed), that no copy
overwrites a tile a consumer has not freed, and that every run ends (no deadlock): with
and without EARLY_SCORES (the next item's first scores issued before the epilogue),
over items whose consumers compute different numbers of tiles (OWN_KEYS), none among them;
and with DYNAMIC_ITEMS (the consumers read each item's number once its Q has landed, and
leave on -1, which the producer writes and arrives for with no copy).

The model follows the source by hand: a change to the kernel's order of waits and
arrivals is to be made here too."""

import random

import pytest

from kernels.chapters.ch07_hopper_attention import CONFIGS
from kernels.exercises.ch07 import Barrier  # exercise 7.2's model of an mbarrier

CONSUMERS = 3
STAGES = CONFIGS["hopper_attention"].stages


class Ring:
    """A block's shared state: Q's buffer and the K and V rings, each with its full and
    free barriers (free: one arrival a consumer, standing for its four warps)."""

    def __init__(self):
        self.q_full, self.q_free = Barrier(1), Barrier(CONSUMERS)
        self.full = {kv: [Barrier(1) for _ in range(STAGES)] for kv in "kv"}
        self.free = {kv: [Barrier(CONSUMERS) for _ in range(STAGES)] for kv in "kv"}
        self.held = {kv: [None] * STAGES for kv in "kv"}  # (tile, landed)
        self.q = None  # (item, landed)
        self.freed = {kv: [0] * CONSUMERS for kv in "kv"}  # tiles each consumer freed
        self.q_freed = [0] * CONSUMERS  # items whose Q each consumer is done with
        self.in_flight = []  # copies issued, not landed: (what, slot)
        self.taken = None  # (DYNAMIC_ITEMS) the item number in shared memory
        self.taken_read = [0] * CONSUMERS  # item numbers each consumer has read


def lap(r: int) -> int:
    return (r // STAGES) & 1


def producer(ring: Ring, items, dynamic: bool = False):
    """The producer's loop: Q once the last item's is free, then each tile's K and V once
    their slots are free; with ``dynamic``, the item's number written before Q's copy,
    and after the last item -1, with an arrive on Q's barrier and no copy."""
    r = 0
    for k, (tiles, _) in enumerate(items):
        if k > 0:
            yield ("wait", ring.q_free, (k - 1) & 1)
        if min(ring.q_freed) < k:
            raise AssertionError(f"Q of item {k} copied while a consumer still reads item {k - 1}'s")
        if dynamic:
            write_taken(ring, k)
        ring.q = (k, False)
        ring.in_flight.append(("q", None))
        for t in range(tiles):
            for kv in "kv":
                if r >= STAGES:
                    yield ("wait", ring.free[kv][r % STAGES], lap(r) ^ 1)
                    behind = [c for c in range(CONSUMERS) if ring.freed[kv][c] <= r - STAGES]
                    if behind:
                        raise AssertionError(f"{kv.upper()} tile {r} copied over tile "
                                             f"{r - STAGES}, which consumer {behind[0]} had "
                                             "not freed")
                ring.held[kv][r % STAGES] = (r, False)
                ring.in_flight.append((kv, r % STAGES))
            r += 1
    if dynamic:  # no next item
        if items:
            yield ("wait", ring.q_free, (len(items) - 1) & 1)
        write_taken(ring, -1)
        ring.q_full.arrive()


def write_taken(ring: Ring, number: int) -> None:
    """The producer writes the next item's number (-1: none) over the last one's."""
    if ring.taken is not None and min(ring.taken_read) <= ring.taken:
        raise AssertionError(f"item number {number} written over {ring.taken}, which a "
                             "consumer had not read")
    ring.taken = number


def consumer(ring: Ring, items, w: int, early: bool, dynamic: bool = False):
    """Consumer w's loop as the kernel writes it (the non-overlap path, own keys: it
    computes my_tiles of the block's tiles and frees the rest), with EARLY_SCORES's
    order where ``early``; with ``dynamic``, each item's number read once its Q has
    landed, until it reads -1."""

    def wait_tile(kv, r):
        yield ("wait", ring.full[kv][r % STAGES], lap(r))
        if ring.held[kv][r % STAGES] != (r, True):
            raise AssertionError(f"consumer {w}'s wait for {kv.upper()} tile {r} returned "
                                 f"while its slot held {ring.held[kv][r % STAGES]}")

    def wait_q(k):
        yield ("wait", ring.q_full, k & 1)
        if ring.q != (k, True):
            raise AssertionError(f"consumer {w}'s wait for Q of item {k} returned while "
                                 f"the buffer held {ring.q}")

    def free(kv, r):
        ring.free[kv][r % STAGES].arrive()
        ring.freed[kv][w] = r + 1

    def free_skipped(base, tiles, mine):
        for t in range(mine, tiles):
            yield from wait_tile("k", base + t)
            free("k", base + t)
            yield from wait_tile("v", base + t)
            free("v", base + t)

    def release_q(k):
        ring.q_free.arrive()
        ring.q_freed[w] = k + 1

    def scores(k, r):  # Q K^T reads item k's Q and tile r's K
        if ring.q != (k, True) or ring.held["k"][r % STAGES] != (r, True):
            raise AssertionError(f"consumer {w}'s scores of tile {r} read Q {ring.q} and "
                                 f"K {ring.held['k'][r % STAGES]}")

    def item_at(k):  # (dynamic) the k-th item's number, -1 for none
        yield ("wait", ring.q_full, k & 1)
        if ring.taken not in (k, -1) or (ring.taken == -1) != (k == len(items)):
            raise AssertionError(f"consumer {w} read item number {ring.taken} for its "
                                 f"item {k} of {len(items)}")
        ring.taken_read[w] = k + 1
        return ring.taken

    base, issued = 0, False
    for k in range(len(items) + dynamic):
        if dynamic and (yield from item_at(k)) == -1:
            return
        tiles, mine_all = items[k]
        mine = mine_all[w]
        yield from wait_q(k)  # (a second wait for a phase that completed returns at once)
        for t in range(mine):
            r = base + t
            yield from wait_tile("k", r)
            if t > 0 or not issued:
                scores(k, r)
            free("k", r)
            if t == mine - 1:
                release_q(k)
            yield from wait_tile("v", r)
            free("v", r)
        if mine == 0:
            release_q(k)
        if early:
            yield from free_skipped(base, tiles, mine)
            issued = False
            if k + 1 < len(items) and items[k + 1][1][w] > 0:
                yield from wait_q(k + 1)
                yield from wait_tile("k", base + tiles)
                scores(k + 1, base + tiles)
                issued = True
        yield ("epilogue", None, None)
        if not early:
            yield from free_skipped(base, tiles, mine)
        base += tiles


def run(items, early: bool, seed: int, consumer_loop=consumer, dynamic=False) -> None:
    """One run in an order the seed picks; raises AssertionError on what goes wrong."""
    ring, rng = Ring(), random.Random(seed)
    threads = {"producer": producer(ring, items, dynamic)}
    threads.update({f"consumer {w}": consumer_loop(ring, items, w, early, dynamic)
                    for w in range(CONSUMERS)})
    blocked = {name: None for name in threads}  # the wait a thread is at, if any
    while threads or ring.in_flight:
        runnable = [name for name, at in blocked.items()
                    if name in threads and (at is None or at[0].passes(at[1]))]
        moves = [("run", name) for name in runnable]
        moves += [("land", i) for i in range(len(ring.in_flight))]
        if not moves:
            raise AssertionError("deadlock: " + ", ".join(
                f"{name} waits for parity {at[1]}" for name, at in blocked.items()
                if name in threads and at))
        kind, who = rng.choice(moves)
        if kind == "land":
            what, slot = ring.in_flight.pop(who)
            if what == "q":
                ring.q = (ring.q[0], True)
                ring.q_full.arrive()
            else:
                ring.held[what][slot] = (ring.held[what][slot][0], True)
                ring.full[what][slot].arrive()
            continue
        try:
            op, bar, parity = next(threads[who])
            blocked[who] = (bar, parity) if op == "wait" else None
        except StopIteration:
            del threads[who]


def block_items(tile_counts):
    """A persistent block's items: (the block's tiles, each consumer's)."""
    return [(max(mine), tuple(mine)) for mine in tile_counts]


#: items a block may take in turn: every consumer the same tiles (not causal), fewer for
#: the first consumers (causal), none for the last (rows past S_q), one tile, and none
#: for every consumer of an item
ITEM_SETS = {
    "equal": block_items([(3, 3, 3), (3, 3, 3), (2, 2, 2), (5, 5, 5)]),
    "causal": block_items([(2, 3, 4), (1, 1, 2), (4, 5, 5), (2, 2, 3)]),
    "ragged": block_items([(4, 4, 0), (1, 1, 1), (3, 3, 3), (2, 2, 0), (1, 1, 1)]),
    "empty items": block_items([(2, 2, 2), (0, 0, 0), (1, 0, 0), (3, 3, 3)]),
}


@pytest.mark.parametrize("early", [False, True], ids=["epilogue first", "early scores"])
@pytest.mark.parametrize("items", list(ITEM_SETS), ids=list(ITEM_SETS))
def test_the_persistent_protocol_in_many_orders(items, early):
    for seed in range(500):
        run(ITEM_SETS[items], early, seed)


@pytest.mark.parametrize("items", list(ITEM_SETS), ids=list(ITEM_SETS))
def test_items_from_a_counter_in_many_orders(items):
    """DYNAMIC_ITEMS: the consumers learn each item from the producer, and leave."""
    for seed in range(500):
        run(ITEM_SETS[items], False, seed, dynamic=True)


def test_the_model_finds_an_item_number_written_before_it_was_read():
    """Were the producer to write the next item's number before Q's free barrier says
    every consumer is done with the last item, a consumer could read the wrong one."""

    def hasty(ring, items, dynamic):
        for k, (tiles, _) in enumerate(items):
            write_taken(ring, k)
            yield ("wait", ring.q_free, (k - 1) & 1) if k else ("run", None, None)
            ring.q = (k, False)
            ring.in_flight.append(("q", None))
        write_taken(ring, -1)

    ring = Ring()
    writes = hasty(ring, ITEM_SETS["equal"], True)
    next(writes)  # item 0's number, then item 1's before any consumer read item 0's
    with pytest.raises(AssertionError, match="not read"):
        next(writes)


def test_the_model_finds_a_consumer_that_waits_for_its_next_tile_before_freeing():
    """The order EARLY_SCORES must keep: a consumer that skipped tiles frees them before
    it waits for the next item's first tile, whose slot may be one of theirs. Waiting
    first deadlocks, and the model says so."""

    def eager(ring, items, w, early, dynamic):  # the next tile first, the skipped ones after
        base = 0
        for k, (tiles, mine_all) in enumerate(items):
            mine = mine_all[w]
            yield ("wait", ring.q_full, k & 1)
            for t in range(mine):
                for kv in "kv":
                    r = base + t
                    yield ("wait", ring.full[kv][r % STAGES], lap(r))
                    ring.free[kv][r % STAGES].arrive()
                    ring.freed[kv][w] = r + 1
                if t == mine - 1:
                    ring.q_free.arrive()
                    ring.q_freed[w] = k + 1
            if mine == 0:
                ring.q_free.arrive()
                ring.q_freed[w] = k + 1
            if k + 1 < len(items):
                yield ("wait", ring.full["k"][(base + tiles) % STAGES], lap(base + tiles))
            for t in range(mine, tiles):
                for kv in "kv":
                    r = base + t
                    yield ("wait", ring.full[kv][r % STAGES], lap(r))
                    ring.free[kv][r % STAGES].arrive()
                    ring.freed[kv][w] = r + 1
            base += tiles

    items = block_items([(1, 3, 3), (3, 3, 3)])
    for seed in range(20):
        with pytest.raises(AssertionError, match="deadlock"):
            run(items, True, seed, consumer_loop=eager)
