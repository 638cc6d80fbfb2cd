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
import json
import os
import sys
import time

from kernels.chapters import ch07_hopper_attention as ch

LATE_RESCALE = (
    ("      issue_scores(s, q, sh.k_tile(r));  // tile t's scores ...\n"
     "      rescale(o_acc, alpha);\n",
     "      issue_scores(s, q, sh.k_tile(r));  // tile t's scores ...\n"),
    ("      release(sh.v_free(r - 1));\n      to_operand(p, s);\n",
     "      release(sh.v_free(r - 1));\n      rescale(o_acc, alpha);  // for P V (t), O at rest\n"
     "      to_operand(p, s);\n"),
    ("      TURN_BEGIN;\n      rescale(o_acc, alpha);\n      mbarrier_wait(sh.v_full(r), lap(r));\n",
     "      TURN_BEGIN;\n      mbarrier_wait(sh.v_full(r), lap(r));\n"),
)
SCHEDULE = (("own_keys", False), ("overlap", True), ("pingpong", True))
VARIANTS = {
    "all": ch.WhatIf("hopper_attention", ch.THREE_TURNS + ch.DESCRIPTORS_BY_ADDITION + LATE_RESCALE,
                     switches=SCHEDULE + (("short_chains", True),)),
    "all_in_turn": ch.WhatIf("hopper_attention", ch.THREE_TURNS + ch.DESCRIPTORS_BY_ADDITION,
                             switches=SCHEDULE + (("short_chains", True),)),
    "chains_adds": ch.WhatIf("hopper_attention", ch.DESCRIPTORS_BY_ADDITION,
                             switches=(("short_chains", True),)),
}
#: the mbarrier wait with CUTLASS's suspend-time hint (suspend_hint.py): its retry
#: compiles to NANOSLEEP.SYNCS, as FlashAttention-4's producer's does, where chapter 7's
#: producer spins on try_wait (47M SYNCS and as many branches in "all" at
#: (2, 32, 8192, 64), against FlashAttention-4's 11M, all on the producer's SMSP)
WAIT = next(line for line in ch.source(ch.CONFIGS["hopper_attention"], 64).splitlines()
            if "mbarrier.try_wait.parity" in line)
HINT = ((WAIT, WAIT.replace("%2;", "%2, 0x989680;")),)
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
    from kernels.bench import Shape  # noqa: E402
    from kernels.check import check_attention  # noqa: E402

    start = time.time()
    fns = {name: ch.what_if_kernel(name) for name in TIMED}
    for name, fn in fns.items():
        for B, H, S_q, S_k, causal, dtype in [(1, 3, 300, 129, True, "float16"),
                                              (1, 3, 129, 300, True, "bfloat16"),
                                              (2, 70, 333, 333, False, "float16"),
                                              (1, 2, 4000, 4000, False, "float16")]:
            c = check_attention(fn, B, H, S_q, S_k, 64, causal, lse=True, dtype=dtype,
                                raise_on_fail=False)
            print(f"[{time.time() - start:4.0f} s] check {name}: {c.summary()}", flush=True)
            if not c.ok:
                raise SystemExit("a check failed: nothing timed")
    rows = []
    for rep in range(2):
        for shape in (Shape(2, 32, 8192, 8192, 64), Shape(16, 16, 2048, 2048, 64),
                      Shape(4, 32, 4096, 4096, 64), Shape(1, 32, 16384, 16384, 64, True)):
            row = ch.timed_beside({"hopper_attention": ch.KERNELS["hopper_attention"], **fns}, shape)
            rows.append(dict(row, rep=rep))
            tf = row.get("tflops", {})
            print(f"[{time.time() - start:4.0f} s] {shape.label():28s} " + " ".join(
                f"{n}={v:.0f}({v / tf['hopper_attention']:.3f})" for n, v in tf.items()), flush=True)
            json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "combined.json"), "w"),
                      indent=1)
