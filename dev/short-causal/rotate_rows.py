"""One GPU call: the counter's items (hopper_dynamic_items), which take an item's 64-row
slices in turn, beside chapter 7's what-if that takes them in a fixed order, and SDPA's
default.

Why: with 192-row items and 128-key tiles, the causal diagonal gives an item's three
64-row slices different numbers of tiles (at S = 512, counted from the last row: 0, 1, 1;
2, 2, 3; 3, 4, 4), and in a fixed order the same consumer always takes the last slice,
the heaviest, and ends each item last, its epilogue after everyone's. Taking them in
turn (consumer w the (w - k) mod 3-th slice of its block's k-th item) gives the heaviest
slice to the consumer that took the lightest, done first.

The logs are from the script's earlier forms on branch rotate-rows, whose kernel then
also had a second Q slot (Q_SLOTS, since taken out: it gained 0.3-0.6% more at the
causal shapes and lost 1% at (32, 32, 512, 64)): rotate_rows.log and .json at 06f4549
(dyn_rotate: (w + k) mod 3), rotate_back.log and .json at dcf53c5 (dyn_rotate_back:
(w - k) mod 3, the form chapter 7 took). Each path checked at odd shapes first, then
timed in turns (chapter 7's timed_beside), fp16, twice."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside, check_at, rounds  # noqa: E402
from kernels.bench import Shape  # noqa: E402
from kernels.chapters import ch07_hopper_attention as ch  # noqa: E402

fixed = ch.what_if_kernel("slices in a fixed order")
check_at({"slices in a fixed order": fixed, "hopper_dynamic_items": ch.KERNELS["hopper_dynamic_items"]},
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
rounds(shapes, beside(lambda shape: {"fixed": fixed,
                                     "in turn": ch.KERNELS["hopper_dynamic_items"]}),
       "rotate_rows_now.json")
