"""One GPU call: chapter 7's kernel with each of its three consumers overlapping one
tile's softmax with the next tile's Q K^T (FlashAttention-4's Hopper forward at D = 64:
192 x 128 tiles, P from registers, the overlap within a warpgroup, no ping-pong),
beside the forms the lean call takes at D = 64 (hopper_attention; hopper_dynamic_items),
each checked at odd shapes, then timed in turns with SDPA's default (chapter 7's
timed_beside), fp16, at the suite's D = 64 shapes, twice. Registers: three_overlap_registers.py (no
spills at D = 64; at D = 128 the overlap spills with three consumers)."""
import dataclasses
import os
import sys

from kernels.api import kernel_function
from kernels.bench import STANDARD_SUITE
from kernels.chapters import ch07_hopper_attention as ch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside, check_at, rounds  # noqa: E402

VARIANTS = {
    "three_overlap": dataclasses.replace(ch.CONFIGS["hopper_attention"], own_keys=False,
                                         overlap=True),
    "three_overlap_items": dataclasses.replace(ch.CONFIGS["hopper_dynamic_items"],
                                               own_keys=False, overlap=True),
}
for name, cfg in VARIANTS.items():
    ch.CONFIGS[name] = cfg
    ch.KERNELS[name] = kernel_function(name, f"Experiment: {name}.", ch.launch_hopper)
check_at({name: ch.KERNELS[name] for name in VARIANTS},
         [(1, 25, 1200, 1200, 64, True, "float16"), (2, 70, 333, 333, 64, False, "bfloat16"),
          (1, 3, 300, 129, 64, True, "float16"), (1, 3, 129, 300, 64, True, "float16"),
          (2, 300, 129, 129, 64, True, "float16"), (1, 2, 4000, 4000, 64, False, "float16")])
rounds([s for s in STANDARD_SUITE if s.D == 64],
       beside(lambda shape: {n: ch.KERNELS[n] for n in ("hopper_attention", "hopper_dynamic_items",
                                                        "three_overlap", "three_overlap_items")}),
       "three_overlap.json")
