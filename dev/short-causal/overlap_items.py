"""One GPU call: FlashAttention-3's form for causal calls in chapter 7's kernel (two
consumers of 64 rows, 128-row items, step 4's overlap and the ping-pong turns, items
from the counter: variants.OVERLAP_VARIANTS) beside the counter's items
(hopper_dynamic_items) and SDPA's default. With 128-row items and 128-key tiles the
diagonal cuts both consumers' rows at the same tile, so no consumer waits on the other
within an item, where the counter's 192-row items leave one or two of three consumers
idle at an item's end (the heaviest walks up to a tile more). Each checked at odd shapes
first, then timed in turns (chapter 7's timed_beside), fp16, twice."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import variants  # noqa: E402
from experiment import beside, check_at, rounds  # noqa: E402
from kernels.bench import Shape  # noqa: E402
from kernels.chapters import ch07_hopper_attention as ch  # noqa: E402

names = list(variants.OVERLAP_VARIANTS)
check_at({name: ch.KERNELS[name] for name in names},
         [(B, H, S_q, S_k, D, causal, dtype) for B, H, S_q, S_k, D, causal, dtype in [
             (1, 25, 1200, 1200, 64, True, "float16"), (3, 40, 777, 777, 128, True, "bfloat16"),
             (2, 70, 333, 333, 64, False, "float16"), (1, 2, 100, 100, 128, True, "float16"),
             (2, 300, 129, 129, 64, True, "float16"), (1, 3, 300, 129, 64, True, "bfloat16"),
             (1, 3, 129, 300, 128, True, "float16"), (2, 9, 1000, 1000, 128, False, "bfloat16")]])
shapes = [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(4, 32, 4096, 4096, 64, True),
          Shape(32, 16, 512, 512, 128, True), Shape(16, 16, 1024, 1024, 128, True),
          Shape(8, 16, 2048, 2048, 128, True), Shape(32, 32, 512, 512, 64),
          Shape(16, 16, 1024, 1024, 128)]
rounds(shapes, beside(lambda shape: {"dyn": ch.KERNELS["hopper_dynamic_items"],
                                     **{n: ch.KERNELS[n] for n in names}}),
       "overlap_items.json")
