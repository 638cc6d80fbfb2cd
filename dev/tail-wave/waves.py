"""Does the persistent grid's last, partial wave cost what its share says? Chapter 7's
kernel at D = 128 and S = 16384 runs 1,376 items of 192 rows on the H200's 132
multiprocessors: 10.42 waves, so a block that takes 11 items works while the others,
done after 10, wait. If the items cost the same, a run's speed goes with
waves / ceil(waves): 0.947 there, 0.994 at 1,312 items (S = 15744).

On the GPU: the lean call's non-causal forms at D = 128 (and D = 64) over sequence
lengths whose item counts fill the last wave to different depths, each checked at its
shape and timed in turns with SDPA's default (chapter 7's timed_beside), fp16, twice.
Writes $OUT/waves.json. No GPU: the waves each shape makes."""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside, log, rounds  # noqa: E402

from kernels.bench import Shape  # noqa: E402

MULTIPROCESSORS, ROWS = 132, 192
SHAPES = [Shape(1, 16, S, S, 128) for S in (15744, 16128, 16384, 16896, 17280)] + \
         [Shape(2, 32, S, S, 64) for S in (7872, 8064, 8192, 8448)]


def waves(shape) -> float:
    return shape.B * shape.H * math.ceil(shape.S_q / ROWS) / MULTIPROCESSORS


for s in SHAPES:
    w = waves(s)
    log(f"{s.label():28s} {w:5.2f} waves, waves / ceil: {w / math.ceil(w):.3f}")
if "--waves" in sys.argv:
    raise SystemExit

from kernels.chapters import ch07_hopper_attention as ch  # noqa: E402

rounds(SHAPES, beside(lambda shape: {name: ch.KERNELS[name] for name in
                                     ("hopper_attention", "hopper_dynamic_items")}),
       "waves.json")
