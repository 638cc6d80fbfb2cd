"""One GPU call: is what the evict-first copies gain on small caches (probe.py) the L2
flush's dirty lines?

kernels.bench flushes L2 before every timed call by copying 256 MB, which leaves L2 full
of lines written by the copy: a kernel that reads after it has them written back to DRAM
as its own lines take their place. Here chapter 8's split kernel as committed, with
probe.py's evict-first copies and two deep, the lean call and SDPA's default are timed at
five grouped decoding shapes twice: after that flush, and after one that only reads
256 MB (kernels.bench.flush_l2_clean), which leaves L2 holding clean lines. (The run in
flush.log read them with a sum in torch, before flush_l2_clean existed.) Writes
$OUT/dirty.json and $OUT/clean.json."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiment import decoding_probe, log  # noqa: E402
from probe import COPIES, variants as probe_variants  # noqa: E402

from kernels import bench  # noqa: E402

SHAPES = [(1, 8192, "float16"), (4, 8192, "float16"), (1, 32768, "float16"),
          (16, 8192, "float16"), (16, 32768, "float16")]
KEPT = ("as committed", "two deep", "evict first")
assert set(KEPT) - {"as committed", "two deep"} <= set(COPIES)


def variants(base, a, gpu):
    for name, kernel in probe_variants(base, a, gpu):
        if name in KEPT:
            yield name, kernel


log("after the harness's flush (a 256 MB copy: L2 left dirty)")
decoding_probe(SHAPES, variants, "dirty.json")
log("after a flush that only reads 256 MB (L2 left clean)")
decoding_probe(SHAPES, variants, "clean.json", flush=bench.flush_l2_clean)
