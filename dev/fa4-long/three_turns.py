"""FlashAttention-4's Hopper forward at D = 64, as chapter 7's switches and a few lines:
three consumers of 64 rows, each overlapping tile t's softmax with tile t + 1's Q K^T
and tile t's P V (OVERLAP), every consumer walking the block's tiles (no OWN_KEYS), and
the three taking turns to issue their multiplies, round robin (FlashAttention-4's
"warp scheduler barrier": chapter 7's ping-pong, from two consumers to three). The
source_stalls.py run found chapter 7's consumers stalled at `wgmma.wait_group` for 14%
of their samples, and three_overlap.py (the overlap without the turns) gained 0-2%.

Variants (chapter 7's WhatIf: a kernel's source with lines replaced, switches changed):
  three_turns              the overlap and the round-robin turns: chapter 7's what-if
                           "FlashAttention-4's schedule at D = 64", recorded since
  three_turns_late_rescale and O's rescale by tile t's factors after P V (t - 1) has
                           landed, outside the turn (FlashAttention-4's order), where
                           chapter 7 rescales inside the turn, before issuing P V (t)
  overlap_late_rescale     hopper_overlap (two consumers, ping-pong, the overlap; what
                           FlashAttention-4 runs at D = 128) with the late rescale

three_turns.log and .json came from this script's first form (94e65e6), whose turns
named their barriers from a register: 56 bytes of spills in the masked tiles' softmax,
none in the tiles the non-causal calls run. Chapter 7's what-if names them as immediates
and spills nothing; the script now builds on it.

`python dev/fa4-long/three_turns.py --registers` (no GPU): registers and spills.
On the GPU: each checked at odd shapes, then timed in turns with the lean call's forms,
SDPA's default and (where flash_attn.cute imports) FlashAttention-4 on its own layout,
fp16, twice. Writes $OUT/three_turns.json."""
import os
import sys

from kernels.chapters import ch07_hopper_attention as ch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import beside_flash_attention_4, check_at, rounds  # noqa: E402

SCHEDULE = ch.WHAT_IFS["FlashAttention-4's schedule at D = 64"]
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
ch.WHAT_IFS["three_turns"] = SCHEDULE
ch.WHAT_IFS["three_turns_late_rescale"] = ch.WhatIf(
    SCHEDULE.kernel, SCHEDULE.changes + LATE_RESCALE, switches=SCHEDULE.switches)
ch.WHAT_IFS["overlap_late_rescale"] = ch.WhatIf("hopper_overlap", LATE_RESCALE)
VARIANTS = {64: ("three_turns", "three_turns_late_rescale", "overlap_late_rescale"),
            128: ("overlap_late_rescale",)}

if __name__ == "__main__" and "--registers" in sys.argv:
    from kernels.compile_report import compile_cuda

    for D, names in VARIANTS.items():
        rows = [(n, ch.source(ch.CONFIGS[n], D), ch.CONFIGS[n])
                for n in ("hopper_attention", "hopper_overlap")]
        rows += [(n, ch.what_if_source(n, D), ch.WHAT_IFS[n].config()) for n in names]
        for name, src, cfg in rows:
            r = compile_cuda(src, ch.nvrtc_options(cfg, D, "float16"), "sm_90a", name)
            print(D, f"{name:26s}", r["registers"], r["stack_bytes"], r["ptxas_notes"],
                  {k: r["sass_counts"].get(k) for k in ("BAR", "SYNCS", "HGMMA")})
elif __name__ == "__main__":
    fns = {n: ch.what_if_kernel(n) for n in VARIANTS[64]}
    odd = [(1, 25, 1200, 1200, True, "float16"), (2, 70, 333, 333, False, "bfloat16"),
           (1, 3, 300, 129, True, "float16"), (1, 3, 129, 300, True, "float16"),
           (2, 300, 129, 129, True, "float16"), (1, 2, 4000, 4000, False, "float16")]
    for name, fn in fns.items():
        check_at({name: fn}, [(B, H, S_q, S_k, D, causal, dtype)
                              for D in (64, 128) if name in VARIANTS[D]
                              for B, H, S_q, S_k, causal, dtype in odd])
    from kernels.bench import Shape

    rounds([Shape(2, 32, 8192, 8192, 64), Shape(1, 32, 16384, 16384, 64, True),
            Shape(4, 32, 4096, 4096, 64), Shape(16, 16, 2048, 2048, 64),
            Shape(2, 32, 8192, 8192, 64, True), Shape(4, 32, 4096, 4096, 64, True),
            Shape(8, 32, 2048, 2048, 64, True), Shape(16, 32, 1024, 1024, 64),
            Shape(1, 16, 16384, 16384, 128), Shape(2, 16, 8192, 8192, 128),
            Shape(1, 16, 16384, 16384, 128, True), Shape(4, 16, 4096, 4096, 128, True)],
           beside_flash_attention_4(lambda shape: {
               **{n: ch.KERNELS[n] for n in ("hopper_attention", "hopper_dynamic_items",
                                             "hopper_overlap")},
               **{n: fns[n] for n in VARIANTS[shape.D]}}),
           "three_turns.json")
