"""One GPU call: the counter's items with a second Q slot and rotated slices
(rotate_variants.py) beside the counter's items (hopper_dynamic_items) and SDPA's
default.

Why: with 192-row items and 128-key tiles, the causal diagonal gives an item's three
64-row slices different numbers of tiles (at S = 512, counted from the last row: 0, 1, 1;
2, 2, 3; 3, 4, 4), and the same consumer always takes the last slice, the heaviest. The
others wait for it at every item: the next Q is copied only once every consumer has read
this one. A second Q slot lets a consumer that is done start the next item; taking the
slices in turn (consumer w the (w + k) % 3-th slice of its block's k-th item) spreads the
heavy slices over the three, so that the one behind at an item is ahead at the next.

Each checked at odd shapes first (many one-block heads, so that blocks take many items;
S_q != S_k both ways; bf16; D = 128, where the variants are the counter's items), then
timed in turns (chapter 7's timed_beside), fp16, twice."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rotate_variants  # noqa: E402
from experiment import beside, check_at, rounds  # noqa: E402
from kernels.bench import Shape  # noqa: E402
from kernels.chapters import ch07_hopper_attention as ch  # noqa: E402

names = [n for n in sys.argv[1:] if n in rotate_variants.VARIANTS] or list(rotate_variants.VARIANTS)
check_at({name: ch.KERNELS[name] for name in names + ["hopper_dynamic_items"]},
         [(B, H, S_q, S_k, D, causal, dtype) for B, H, S_q, S_k, D, causal, dtype in [
             (1, 25, 1200, 1200, 64, True, "float16"), (2, 300, 129, 129, 64, True, "float16"),
             (2, 70, 333, 333, 64, False, "bfloat16"), (1, 3, 300, 129, 64, True, "bfloat16"),
             (1, 3, 129, 300, 64, True, "float16"), (4, 33, 512, 512, 64, True, "float16"),
             (1, 1, 100, 100, 64, True, "float16"), (3, 40, 777, 777, 128, True, "bfloat16"),
             (2, 9, 1000, 1000, 128, False, "float16")]])
shapes = [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(4, 32, 4096, 4096, 64, True),
          Shape(32, 16, 512, 512, 128, True), Shape(16, 16, 1024, 1024, 128, True),
          Shape(32, 32, 512, 512, 64)]
rounds(shapes, beside(lambda shape: {"dyn": ch.KERNELS["hopper_dynamic_items"],
                                     **{n: ch.KERNELS[n] for n in names}}),
       "rotate_rows.json")
