"""One GPU call: do the tensor-core decoding kernel's copies read the cache faster with an
L2 prefetch size or an evict-first policy, or two deep instead of three?

At the grouped decoding shapes (32 query heads, 8 key/value heads of 128, one query row a
head, as kernels.layouts measures them), chapter 8's split_keys_mma_attention as
committed (three tiles deep at D = 128), two deep (MMA_TWO_DEEP_CONFIG), and with its
16-byte cp.async copies of K and V changed: each asking L2 to fetch the whole 256-byte
run it falls in (the `.L2::256B` prefetch size; a row of K is 256 bytes at D = 128), each
marked evict-first in L2 (a cache policy from `createpolicy`: a streamed cache's lines
are the first L2 gives up), and both. The lean call and SDPA's default (enable_gqa=True)
are timed in the same turns. Each path is checked against the float64 reference first
and timed only if it passed (experiment.decoding_probe). Writes $OUT/probe.json."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import decoding_probe  # noqa: E402

from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(B, S_k, "float16") for S_k in (8192, 32768, 131072) for B in (1, 4, 16)] + [
    (1, 8192, "bfloat16"), (16, 32768, "bfloat16")]

COPY = ('  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" ::"r"(shared), '
        '"l"(global),\n               "r"(src_bytes));\n')
EVICT_FIRST = '''  unsigned long long policy;  // the same every call: the compiler hoists it
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\\n" : "=l"(policy));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint{prefetch} [%0], [%1], 16, %2, %3;\\n"
               ::"r"(shared), "l"(global), "r"(src_bytes), "l"(policy));
'''
COPIES = {
    "prefetch 256B": COPY.replace("global [%0]", "global.L2::256B [%0]"),
    "evict first": EVICT_FIRST.replace("{prefetch}", ""),
    "evict first, prefetch 256B": EVICT_FIRST.replace("{prefetch}", ".L2::256B"),
}


def variants(base, a, gpu):
    """The kernel as committed, two deep, and with each of COPIES' copy functions
    (mma_split_kernel compiles ch08.MMA_SOURCE, set for the one call)."""
    yield "as committed", base
    yield "two deep", ch08.mma_split_kernel(a, gpu, ch08.MMA_TWO_DEEP_CONFIG)
    committed = ch08.MMA_SOURCE
    assert committed.count(COPY) == 1, "the copy function has changed"
    for name, copy in COPIES.items():
        ch08.MMA_SOURCE = committed.replace(COPY, copy)
        try:
            kernel = ch08.mma_split_kernel(a, gpu)
        finally:
            ch08.MMA_SOURCE = committed
        yield name, kernel


if __name__ == "__main__":
    decoding_probe(SHAPES, variants)
