"""One GPU call: the split kernel with cuDNN's shape of block.

sdpa_kernels.py found SDPA's default decoding with cuDNN's kernel of 16 rows x 128 keys
x 128 columns on 4 warps (128 threads, 86 KB of shared memory, 183 registers), at batch
16 in the same 128 blocks as the lean call, one to an SM. Chapter 8's split kernel puts 8
warps on a 128-key tile, 16 keys each; here 4 warps take 32 keys each of the same tiles
(chapter 6's SUBTILE_KEYS), two and three deep, beside the kernel as committed (8 warps,
three deep) and two deep, the lean call and SDPA's default. Writes $OUT/warps.json."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import configured_variants, decoding_probe  # noqa: E402

from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(1, 8192, "float16"), (4, 8192, "float16"), (16, 8192, "float16"),
          (1, 32768, "float16"), (16, 32768, "float16"), (4, 131072, "float16"),
          (16, 131072, "float16"), (16, 32768, "bfloat16")]
FOUR_WARPS = {f"4 warps of 32 keys, {n} deep": dataclasses.replace(
    ch08.MMA_CONFIG, warps=4, subtile_keys=32, at_d128=(("stages", n),)) for n in (2, 3)}


decoding_probe(SHAPES, configured_variants({"two deep": ch08.MMA_TWO_DEEP_CONFIG, **FOUR_WARPS}),
               "warps.json")
