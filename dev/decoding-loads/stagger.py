"""One GPU call: K's and V's copies a half tile apart.

The split kernel copies a tile's K and V together, STAGES - 1 tiles ahead, and waits for
both before the tile's scores. Here each is its own cp.async group: a block waits for
K(t) alone before the scores, issues K(t + STAGES - 1), computes the scores and the
softmax, then waits for V(t) and issues V(t + STAGES - 1) before P V; two barriers a
tile in place of one (a warp with no keys in the last tile still meets both). Three and
two deep, beside the kernel as committed and two deep, the lean call and SDPA's default.
Writes $OUT/stagger.json."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import decoding_probe  # noqa: E402

from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(1, 8192, "float16"), (4, 8192, "float16"), (16, 8192, "float16"),
          (1, 32768, "float16"), (16, 32768, "float16"), (4, 131072, "float16"),
          (16, 131072, "float16"), (16, 8192, "bfloat16")]

PROLOGUE = (
    "    if (t < tiles) {\n"
    "      load_tile<KEYS>(k_tiles + t * KV_BYTES, k, key_begin + t * KEYS, key_end, k_strides.row);\n"
    "      load_tile<KEYS>(v_tiles + t * KV_BYTES, v, key_begin + t * KEYS, key_end, v_strides.row);\n"
    "    }\n"
    "    cp_async_commit();\n")
PROLOGUE_APART = (
    "    if (t < tiles)\n"
    "      load_tile<KEYS>(k_tiles + t * KV_BYTES, k, key_begin + t * KEYS, key_end, k_strides.row);\n"
    "    cp_async_commit();\n"
    "    if (t < tiles)\n"
    "      load_tile<KEYS>(v_tiles + t * KV_BYTES, v, key_begin + t * KEYS, key_end, v_strides.row);\n"
    "    cp_async_commit();\n")
LOOP_START = "  for (int t = 0; t < tiles; t++) {\n    cp_async_wait<STAGES - 2>();"
LOOP_END = "    accumulate_pv(o_acc, s, v_tiles + offset, lane);\n  }\n"
LOOP_APART = r"""  for (int t = 0; t < tiles; t++) {
    // groups so far: K(0), V(0), .. K(t + STAGES - 2), V(t + STAGES - 2)
    cp_async_wait<2 * STAGES - 3>();  // K(t) has landed (this thread's copies)
    __syncthreads();                  // everyone's; everyone is done with tile t - 1
    const int next = t + STAGES - 1, slot = next % STAGES, key0 = key_begin + next * KEYS;
    if (next < tiles) load_tile<KEYS>(k_tiles + slot * KV_BYTES, k, key0, key_end, k_strides.row);
    cp_async_commit();
    const int key = key_begin + t * KEYS + warp * SUBTILE_KEYS;  // this warp's keys
    const bool mine = key < key_end;
    const int offset = t % STAGES * KV_BYTES + warp * SUBTILE_KEYS * ROW_BYTES;
    float s[1][NT][4];
    if (mine) {
      scores(s, qf, nullptr, 0, k_tiles + offset, lane);
      if (key + SUBTILE_KEYS > key_end || (causal && key + SUBTILE_KEYS - 1 > last_key))
        mask_scores(s, key, key_end, S_q, last_key, causal, lane);
      softmax<false>(s, o_acc, m, l, key, 0, S_k, 0, causal, scale_log2, lane);
    }
    cp_async_wait<2 * STAGES - 3>();  // V(t) has landed
    __syncthreads();
    if (next < tiles) load_tile<KEYS>(v_tiles + slot * KV_BYTES, v, key0, key_end, v_strides.row);
    cp_async_commit();
    if (mine) accumulate_pv(o_acc, s, v_tiles + offset, lane);
  }
"""


def apart(source: str) -> str:
    """The split kernel's source with K's and V's copies in groups of their own."""
    assert source.count(PROLOGUE) == 1 and source.count(LOOP_START) == 1
    start = source.index(LOOP_START)
    end = source.index(LOOP_END, start) + len(LOOP_END)
    return source[:start].replace(PROLOGUE, PROLOGUE_APART) + LOOP_APART + source[end:]


def variants(base, a, gpu):
    yield "as committed", base
    yield "two deep", ch08.mma_split_kernel(a, gpu, ch08.MMA_TWO_DEEP_CONFIG)
    committed = ch08.MMA_SOURCE
    for name, cfg in (("K and V apart", None), ("K and V apart, two deep",
                                                 ch08.MMA_TWO_DEEP_CONFIG)):
        ch08.MMA_SOURCE = apart(committed)
        try:
            kernel = ch08.mma_split_kernel(a, gpu, cfg)
        finally:
            ch08.MMA_SOURCE = committed
        yield name, kernel


if __name__ == "__main__":
    decoding_probe(SHAPES, variants, "stagger.json")
