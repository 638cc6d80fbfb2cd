"""One GPU call: how much of the cache should each block have in flight?

probe.py found the split kernel two deep (8 warps, 128-key tiles: 128 KB of K and V in
flight or landed a block) reading the largest caches up to 1% faster than three deep
(192 KB), and slower on the small ones; SDPA's default, the faster there, reads with
less in flight still. Here chapter 8's split kernel as committed, two deep, and with
four warps and 64-key tiles two, three and four deep (64, 96 and 128 KB; the smaller
ones fit two or three blocks an SM, and the plan gives each SM that many), the lean
call and SDPA's default, at grouped decoding shapes from 34 MB to 2 GB of K and V.
Writes $OUT/depth.json."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import configured_variants, decoding_probe  # noqa: E402

from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(1, 8192, "float16"), (16, 8192, "float16"), (4, 32768, "float16"),
          (16, 32768, "float16"), (4, 131072, "float16"), (16, 131072, "float16")]
FOUR_WARPS = {f"4 warps, 64 keys, {n} deep": dataclasses.replace(ch08.MMA_SMALL_CONFIG, stages=n)
              for n in (2, 3, 4)}


decoding_probe(SHAPES, configured_variants({"two deep": ch08.MMA_TWO_DEEP_CONFIG, **FOUR_WARPS}),
               "depth.json")
