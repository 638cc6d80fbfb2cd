"""One GPU call: chapter 7's mbarrier wait with a suspend-time hint. opcodes.py counted the
lean call at (2, 32, 8192, 64) executing 45.9M SYNCS and 51.5M BRA against
FlashAttention-4's 9.3M and 7.2M, with the same arithmetic: its warps spin in
mbarrier_wait's loop of try_wait, selp and branch. CUTLASS's wait passes try_wait a
suspend-time hint (0x989680 ns), so that a waiting warp sleeps in the barrier rather than
coming back to issue. The what-if adds that hint, in hopper_attention and in the
counter's items; each checked at odd shapes, then timed in turns beside its kernel and
SDPA's default (chapter 7's timed_beside), fp16, twice. `--sass` (no GPU): the SASS of
the wait, with and without the hint."""
import os
import sys

from kernels.bench import Shape
from kernels.chapters import ch07_hopper_attention as ch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside, check_at, rounds  # noqa: E402

WAIT = next(line for line in ch.source(ch.CONFIGS["hopper_attention"], 64).splitlines()
            if "mbarrier.try_wait.parity" in line)
HINTED = WAIT.replace("%2;", "%2, 0x989680;")
HINT = ((WAIT, HINTED),)
for kernel in ("hopper_attention", "hopper_dynamic_items"):
    ch.WHAT_IFS[f"hint, {kernel}"] = ch.WhatIf(kernel, HINT)

if __name__ == "__main__" and "--sass" in sys.argv:
    from kernels.compile_report import compile_cuda

    for name, src in (("as committed", ch.source(ch.CONFIGS["hopper_attention"], 64)),
                      ("hint", ch.what_if_source("hint, hopper_attention", 64))):
        row = compile_cuda(src, ch.nvrtc_options(ch.CONFIGS["hopper_attention"], 64, "float16"),
                           "sm_90a", name)
        print(name, row["registers"], row["stack_bytes"], row["sass_counts"], row["ptxas_notes"])
    raise SystemExit

if __name__ == "__main__":
    check_at({f"hint, {k}": ch.what_if_kernel(f"hint, {k}")
              for k in ("hopper_attention", "hopper_dynamic_items")},
             [(1, 25, 1200, 1200, 64, True, "float16"), (2, 70, 333, 333, 128, False, "bfloat16"),
              (1, 3, 300, 129, 64, True, "float16"), (1, 3, 129, 300, 128, True, "float16")])


    def contenders(shape):
        kernels = {k: ch.KERNELS[k] for k in ("hopper_attention", "hopper_dynamic_items")}
        return {**kernels, **{f"hint, {k}": ch.what_if_kernel(f"hint, {k}") for k in kernels}}


    rounds([Shape(2, 32, 8192, 8192, 64), Shape(1, 32, 16384, 16384, 64, True),
            Shape(1, 16, 16384, 16384, 128), Shape(4, 16, 4096, 4096, 128, True),
            Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True)],
           beside(contenders), "suspend_hint.json")
