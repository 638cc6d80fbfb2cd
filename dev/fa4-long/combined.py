"""One GPU call: FlashAttention-4's D = 64 differences together in chapter 7's kernel.
Alone, each was recorded (chapter 7's what-ifs, H200, 68534b2) or timed here without a
gain: the schedule (overlap + three consumers' turns) 0.93-0.99x, the descriptors by
addition 0.99-1.01x, the short chains (hopper_short_chains) a few percent slower, the
rescale after P V (three_turns.py) level. FlashAttention-4 has all of them at once (and
its tensor pipe busier, its warps waiting on the special-function unit, not on their
multiplies: source_stalls.py). Variants (chapter 7's WhatIf, switches and lines):
  all          schedule + descriptors + short chains + late rescale
  all_in_turn  schedule + descriptors + short chains (the rescale in the turn)
  chains_adds  the chapter's schedule + descriptors + short chains
`--registers` (no GPU): registers and local memory. On the GPU: checked at odd shapes,
then timed in turns beside hopper_attention and SDPA's default (timed_beside), fp16,
twice. Writes $OUT/combined.json."""
import os
import sys

from kernels.chapters import ch07_hopper_attention as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder's scripts
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside, check_at, rounds  # noqa: E402
from suspend_hint import HINT  # noqa: E402
from three_turns import LATE_RESCALE  # noqa: E402

SCHEDULE = ch.WHAT_IFS["FlashAttention-4's schedule at D = 64"].switches
VARIANTS = {
    "all": ch.WhatIf("hopper_attention", ch.THREE_TURNS + ch.DESCRIPTORS_BY_ADDITION + LATE_RESCALE,
                     switches=SCHEDULE + (("short_chains", True),)),
    "all_in_turn": ch.WhatIf("hopper_attention", ch.THREE_TURNS + ch.DESCRIPTORS_BY_ADDITION,
                             switches=SCHEDULE + (("short_chains", True),)),
    "chains_adds": ch.WhatIf("hopper_attention", ch.DESCRIPTORS_BY_ADDITION,
                             switches=(("short_chains", True),)),
}
#: the mbarrier wait with CUTLASS's suspend-time hint (suspend_hint.py's): its retry
#: compiles to NANOSLEEP.SYNCS, as FlashAttention-4's producer's does, where chapter 7's
#: producer spins on try_wait (47M SYNCS and as many branches in "all" at
#: (2, 32, 8192, 64), against FlashAttention-4's 11M, all on the producer's SMSP)
VARIANTS["all+hint"] = ch.WhatIf("hopper_attention", VARIANTS["all"].changes + HINT,
                                 switches=VARIANTS["all"].switches)
VARIANTS["hint"] = ch.WhatIf("hopper_attention", HINT)
TIMED = ("all", "all+hint", "hint")
ch.WHAT_IFS.update(VARIANTS)

if __name__ == "__main__" and "--registers" in sys.argv:
    from kernels.compile_report import compile_cuda

    for name, w in VARIANTS.items():
        r = compile_cuda(ch.what_if_source(name, 64), ch.nvrtc_options(w.config(), 64),
                         "sm_90a", name)
        print(f"{name:12s} registers {r['registers']} stack {r['stack_bytes']} {r['ptxas_notes']}")
    raise SystemExit

if __name__ == "__main__":
    from kernels.bench import Shape

    fns = {name: ch.what_if_kernel(name) for name in TIMED}
    check_at(fns, [(1, 3, 300, 129, 64, True, "float16"), (1, 3, 129, 300, 64, True, "bfloat16"),
                   (2, 70, 333, 333, 64, False, "float16"), (1, 2, 4000, 4000, 64, False, "float16")])
    rounds([Shape(2, 32, 8192, 8192, 64), Shape(16, 16, 2048, 2048, 64),
            Shape(4, 32, 4096, 4096, 64), Shape(1, 32, 16384, 16384, 64, True)],
           beside(lambda shape: {"hopper_attention": ch.KERNELS["hopper_attention"], **fns}),
           "combined.json", relative_to="hopper_attention")
