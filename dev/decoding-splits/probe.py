"""One GPU call: how many splits should the tensor-core decoding kernel cut a short cache into?

At the grouped decoding shapes where the lean call trails SDPA's default by the most (32
query heads, 8 key/value heads of 128, one query row a head, small caches, as
kernels.layouts measures them), chapter 8's split_keys_mma_attention launched with its
splits planned for 1 to 6 blocks an SM (one wave each: ``blocks_per_sm``), and with
splits of 128 keys allowed (MIN_SPLIT_KEYS), each built once and launched directly;
the lean call and SDPA's default (enable_gqa=True) timed in the same turns. Each path is
checked against the float64 reference first and timed only if it passed
(experiment.decoding_probe). Writes $OUT/probe.json."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import decoding_probe  # noqa: E402

from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(1, 8192, "float16"), (1, 8192, "bfloat16"), (4, 8192, "float16"),
          (1, 32768, "float16"), (16, 8192, "float16")]
BLOCKS = (1, 2, 3, 4, 6)


def variants(base, *_):
    """The kernel as committed, then planned for BLOCKS blocks an SM with splits of at
    least the committed MIN_SPLIT_KEYS and of at least 128 keys (split_plan reads it)."""
    committed_min = ch08.MIN_SPLIT_KEYS
    yield f"as committed ({base.blocks_per_sm} an SM)", base
    for min_keys in (committed_min, 128):
        ch08.MIN_SPLIT_KEYS = min_keys
        for n in BLOCKS:
            yield f"{n} an SM, >= {min_keys} keys", dataclasses.replace(base, blocks_per_sm=n)
    ch08.MIN_SPLIT_KEYS = committed_min


decoding_probe(SHAPES, variants)
