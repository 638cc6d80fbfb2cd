"""Chapter 7's wgmma descriptors by addition (what FlashAttention-4's SASS does): the
source_stalls.py run showed the lean call building each of its 12 wgmmas' shared-memory
descriptors a tile from the address (add, mask, shift, two moves of the constant high
word: five or six uniform-datapath instructions a wgmma), where FlashAttention-4 adds a
constant to a descriptor made once (one 64-bit uniform add). A k-step's descriptor is the
tile's plus its byte offset / 16: the address field (bits 0-13, the address / 16) does
not carry while the tile lies in shared memory (under 256 KB), so the two are equal.

What-ifs on the lean call's forms (hopper_attention, hopper_dynamic_items):
`--sass` (no GPU): the SASS's uniform-datapath instructions and registers, before and
after. On the GPU: each checked at odd shapes (both head dims, both dtypes), then timed
in turns beside its kernel, SDPA's default and FlashAttention-4 (where it imports),
fp16, twice. Writes $OUT/descriptor_adds.json.

descriptor_adds.log and .json came from this script's first form (8f192fa), which named
the tile's descriptors once in a local variable; chapter 7's what-if "wgmma descriptors
by addition" (recorded since) writes the same sums in the wgmma calls, and the script now
builds on it (the same counts of instructions: 39 uniform ones fewer at D = 64)."""
import os
import sys

from kernels.chapters import ch07_hopper_attention as ch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside_flash_attention_4, check_at, rounds  # noqa: E402

KERNELS = ("hopper_attention", "hopper_dynamic_items")
for kernel in KERNELS:
    ch.WHAT_IFS[f"adds, {kernel}"] = ch.WhatIf(kernel, ch.DESCRIPTORS_BY_ADDITION)

if "--sass" in sys.argv:
    from kernels.compile_report import compile_cuda, instructions

    for kernel in KERNELS:
        for D in (64, 128):
            cfg = ch.CONFIGS[kernel]
            for name, src in ((kernel, ch.source(cfg, D)),
                              (f"adds, {kernel}", ch.what_if_source(f"adds, {kernel}", D))):
                r = compile_cuda(src, ch.nvrtc_options(cfg, D, "float16"), "sm_90a", name)
                ops = instructions(r["sass"])
                print(D, f"{name:34s} regs {r['registers']} stack {r['stack_bytes']} "
                      f"instructions {len(ops)} uniform {sum(o.startswith('U') for o in ops)} "
                      f"notes {r['ptxas_notes']}")
    raise SystemExit

from kernels.bench import Shape  # noqa: E402

fns = {f"adds, {kernel}": ch.what_if_kernel(f"adds, {kernel}") for kernel in KERNELS}
check_at(fns, [(B, H, S_q, S_k, D, causal, dtype) for D in (64, 128)
               for B, H, S_q, S_k, causal, dtype in [
                   (1, 25, 1200, 1200, True, "float16"), (2, 70, 333, 333, False, "bfloat16"),
                   (1, 3, 300, 129, True, "float16"), (1, 3, 129, 300, True, "bfloat16"),
                   (1, 2, 4000, 4000, False, "float16")]])
rounds([Shape(2, 32, 8192, 8192, 64), Shape(1, 32, 16384, 16384, 64, True),
        Shape(4, 32, 4096, 4096, 64), Shape(16, 16, 2048, 2048, 64),
        Shape(4, 32, 4096, 4096, 64, True), Shape(8, 32, 2048, 2048, 64, True),
        Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
        Shape(1, 16, 16384, 16384, 128), Shape(2, 16, 8192, 8192, 128),
        Shape(4, 16, 4096, 4096, 128, True), Shape(16, 16, 1024, 1024, 128, True)],
       beside_flash_attention_4(lambda shape: {
           label: fn for kernel in KERNELS
           for label, fn in ((kernel, ch.KERNELS[kernel]), (f"adds, {kernel}", fns[f"adds, {kernel}"]))}),
       "descriptor_adds.json")
