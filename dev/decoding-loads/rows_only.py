"""One GPU call: the block's end writes only the rows it holds.

After its last tile each of the split kernel's eight warps writes its partial softmax of
all 16 rows of its m16n8k16 tile to shared memory (16 x D floats a warp: 64 KB at
D = 128), and store_merged reads back the first `rows` of them: 4 in grouped decoding
(Llama's four query heads a key/value head, one row each). Here a warp writes only the
rows store_merged reads. Beside the kernel as committed, the lean call and SDPA's
default; the 8k-key caches, where a step is shortest and its end weighs most, and two
larger ones. Writes $OUT/rows_only.json."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import decoding_probe  # noqa: E402

from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(1, 8192, "float16"), (4, 8192, "float16"), (16, 8192, "float16"),
          (16, 8192, "bfloat16"), (1, 32768, "float16"), (16, 32768, "float16")]

ALL_ROWS = "    if (t == 0) s_m[r] = m[h], s_l[r] = sum;\n"
OWN_ROWS = ("    if (g + 8 * h >= rows) continue;  // a row past the block's: never read\n"
            + ALL_ROWS)
if "if (g + 8 * h >= rows) continue;" in ch08.MMA_SOURCE:  # the kernel has it (0e57bb0)
    sys.exit("rows_only.py: chapter 8's kernel writes only its rows already; run from 5ac5139")


def variants(base, a, gpu):
    yield "as committed", base
    committed = ch08.MMA_SOURCE
    assert committed.count(ALL_ROWS) == 1
    ch08.MMA_SOURCE = committed.replace(ALL_ROWS, OWN_ROWS)
    try:
        yield "its rows only", ch08.mma_split_kernel(a, gpu)
    finally:
        ch08.MMA_SOURCE = committed


if __name__ == "__main__":
    decoding_probe(SHAPES, variants, "rows_only.json")
