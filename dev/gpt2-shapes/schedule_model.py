"""A schedule-aware cost for the lean call's choice of form (no GPU; an experiment).

kernels.launch.rows_kernel prices a form by its padded work (whole waves of blocks, whole
key tiles, the causal mask ignored) over its rate at the nearest suite shape. Here the
work is a makespan instead: each item's key tiles under the mask (bottom-right aligned),
plus ``c`` tiles of fixed cost an item, scheduled as the form schedules them (a causal
persistent grid: heaviest row blocks of every head first, every stride-th item a block;
the counter's items and a block an item: the next item, head after head, to the first
multiprocessor free), calibrated at the same suite shape. It prints, at the probe's
shapes (probe.json, wider.json), the form each model picks and what the probe measured for it, and
whether the model keeps the recorded fastest form at every suite shape.

    .venv/bin/python dev/gpt2-shapes/schedule_model.py [c]
"""
import heapq
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from kernels import launch  # noqa: E402
from kernels.bench import STANDARD_SUITE, Shape  # noqa: E402
from kernels.chapters import ch07_hopper_attention as ch  # noqa: E402

MULTIPROCESSORS = 132  # the H200's and the H100 SXM's


def row_block_tiles(cfg, S_q, S_k, causal):
    """Key tiles each row block walks, from the head's heaviest (its last rows)."""
    rows = 64 * cfg.consumers
    blocks = math.ceil(S_q / rows)
    if not causal:
        return [math.ceil(S_k / cfg.block_n)] * blocks
    last_row = ((lambda r: S_q - r * rows) if cfg.dynamic_items  # rows counted from the end
                else (lambda r: min(S_q, (blocks - r) * rows)))
    return [math.ceil(min(S_k, last_row(r) + S_k - S_q) / cfg.block_n) for r in range(blocks)]


def makespan(name, shape, c=0.0):
    """The last multiprocessor's finish, in key tiles, under the form's schedule."""
    cfg = ch.CONFIGS[name].at(shape.D)
    heads = shape.B * shape.H
    tiles = row_block_tiles(cfg, shape.S_q, shape.S_k, shape.causal)
    items = len(tiles) * heads
    strided = (cfg.persistent and not cfg.dynamic_items and items > MULTIPROCESSORS
               and (cfg.causal_persistent or not shape.causal))
    if strided:
        order = ([t for t in tiles for _ in range(heads)] if cfg.causal_persistent
                 and shape.causal else [t for _ in range(heads) for t in tiles])
        loads = [0.0] * MULTIPROCESSORS
        for i, t in enumerate(order):
            loads[i % MULTIPROCESSORS] += t + c
        return max(loads)
    free = [0.0] * min(MULTIPROCESSORS, items)
    for t in (t for _ in range(heads) for t in tiles):
        heapq.heappush(free, heapq.heappop(free) + t + c)
    return max(free)


def cost_s(name, shape, c=0.0):
    """Seconds: the makespan over the form's rate at the nearest suite shape."""
    suite = launch.rate_shape(shape.D, shape.S_k, shape.causal)
    seconds = suite.flops / (launch.recorded_tflops(name, suite) * 1e12)
    return seconds * makespan(name, shape, c) / makespan(name, suite, c)


def main(c):
    here = os.path.dirname(os.path.abspath(__file__))
    probe = [row for name in ("probe.json", "wider.json")
             for row in json.load(open(os.path.join(here, name)))]
    seen = set()
    for row in probe:
        shape, measured = Shape(**row["shape"]), row["tflops"]
        if shape in seen:
            continue
        seen.add(shape)
        forms = launch.forms(shape.D, shape.causal)
        best = max(forms, key=measured.get)
        picked = min(forms, key=lambda n: cost_s(n, shape, c))
        sdpa = measured["SDPA default"]
        print(f"{shape.label():28s} lean call {measured['lean call'] / sdpa:.3f}; "
              f"the model picks {picked} {measured[picked] / sdpa:.3f}; "
              f"fastest {best} {measured[best] / sdpa:.3f} (over SDPA's default)")
    differs = [s.label() for s in STANDARD_SUITE if min(
        launch.forms(s.D, s.causal), key=lambda n: cost_s(n, s, c)) != max(
        launch.forms(s.D, s.causal), key=lambda n: launch.recorded_tflops(n, s))]
    print(f"suite shapes where the model's pick is not the recorded fastest: {differs or 'none'}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)
