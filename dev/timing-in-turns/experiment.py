"""One GPU call (dev/timing-in-turns/PLAN.md): why hopper_early_scores, which issues
nothing early on causal shapes (a block an item), was recorded faster than hopper_attention there. Beside both: the
chapter's kernel with a consumer's skipped tiles freed before its epilogue rather than
after (the one other change EARLY_SCORES makes to a causal block's order). Causal
shapes, fp16, D = 64 and 128 (timed_beside: each checked, then timed in turns)."""
import json, os, time

from kernels.bench import Shape
from kernels.chapters import ch07_hopper_attention as ch

AFTER = "#if OWN_KEYS && !EARLY_SCORES\n    free_skipped();\n#endif\n"
STORE = "#if TMA_STORE  // (named barriers 3, 4 and 5: one a consumer)"
# the chapter's what-if machinery: its kernel's source with lines replaced, in order
ch.WHAT_IFS["freed_first"] = ch.WhatIf("hopper_attention", ((AFTER, ""), (STORE, AFTER + STORE)))
freed = ch.what_if_kernel("freed_first")
K = {"hopper_attention": ch.KERNELS["hopper_attention"], "freed_first": freed,
     "hopper_early_scores": ch.KERNELS["hopper_early_scores"],
     "hopper_causal_persistent": ch.KERNELS["hopper_causal_persistent"]}
shapes = [Shape(4, 32, 4096, 4096, 64, True), Shape(2, 32, 8192, 8192, 64, True),
          Shape(1, 32, 16384, 16384, 64, True), Shape(4, 16, 4096, 4096, 128, True),
          Shape(2, 16, 8192, 8192, 128, True), Shape(1, 16, 16384, 16384, 128, True)]
rows, start = [], time.time()
for shape in shapes:
    names = [n for n in K if not (n == "hopper_early_scores" and shape.D != 64)]
    row = ch.timed_beside({n: K[n] for n in names}, shape)
    rows.append(row)
    tf = row.get("tflops", {})
    base = tf.get("hopper_attention")
    print(f"[{time.time() - start:4.0f} s] {shape.label():32s} {row['status']} base {base and round(base)} "
          f"SDPA {tf.get('SDPA default') and round(tf['SDPA default'])} | "
          + " ".join(f"{n}={tf[n] / base:.3f}" for n in names[1:] if n in tf) + row.get("note", ""),
          flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "causal_order.json"), "w"), indent=1)
