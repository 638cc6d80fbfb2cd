"""One GPU call: the counter's items with the next item taken LATE (after the current
item's last copy is issued, as FlashAttention-3's producer does) against the branch's
early take (as the current item's copies begin), checked at odd shapes and twice in a
row, then timed in turns beside the chapter's kernel, the causal grid in sections and
SDPA's default (chapter 7's timed_beside), fp16."""
import json, os, time

from kernels.bench import Shape
from kernels.check import check_attention
from kernels.chapters import ch07_hopper_attention as ch

EARLY = "        const int next = stride + atomicAdd(item_counter, 1);\n"
AFTER_LOOP = "        ring += tiles;\n        item = next;\n"
ch.WHAT_IFS["late take"] = ch.WhatIf("hopper_dynamic_items", (
    (EARLY, "        int next;  // taken once the item's copies are issued\n"),
    (AFTER_LOOP, "        ring += tiles;\n        next = stride + atomicAdd(item_counter, 1);\n        item = next;\n")))
# the take before the last tile's V copy (FlashAttention-3's place)
LAST_V = "          copy_tile(sh.v_tile(r), sh.v_full(r), v_map, t, head);\n"
ch.WHAT_IFS["take before last V"] = ch.WhatIf("hopper_dynamic_items", (
    (EARLY, "        int next = -1;\n"),
    (LAST_V, "          if (t == tiles - 1) next = stride + atomicAdd(item_counter, 1);\n" + LAST_V)))

start = time.time()
early = ch.KERNELS["hopper_dynamic_items"]
late = ch.what_if_kernel("late take")
before_v = ch.what_if_kernel("take before last V")
for fn in (late, before_v):
    for B, H, S, D, causal, dtype in [(1, 25, 1200, 64, True, "float16"), (3, 40, 777, 128, True, "bfloat16"),
                                      (2, 70, 333, 64, False, "float16"), (1, 2, 100, 128, True, "float16"),
                                      (1, 25, 1200, 64, True, "float16"), (2, 300, 129, 64, True, "float16")]:
        c = check_attention(fn, B, H, S, S, D, causal, lse=True, dtype=dtype, raise_on_fail=False)
        print(f"[{time.time() - start:4.0f} s] check {B},{H},{S},{D},{causal},{dtype}: {c.summary()}", flush=True)
        if not c.ok:
            raise SystemExit("the check failed: nothing timed")
rows = []
shapes = [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(4, 16, 4096, 4096, 64, True),
          Shape(32, 16, 512, 512, 128, True), Shape(16, 16, 1024, 1024, 128, True),
          Shape(4, 16, 4096, 4096, 128, True), Shape(2, 16, 8192, 8192, 128, True),
          Shape(1, 16, 16384, 16384, 128, True),
          Shape(32, 32, 512, 512, 64), Shape(16, 16, 2048, 2048, 64), Shape(4, 16, 4096, 4096, 128),
          Shape(1, 16, 16384, 16384, 128)]
for rep in range(2):
    for shape in shapes:
        contenders = {"early": early, "late": late, "before last V": before_v,
                      "hopper_attention": ch.KERNELS["hopper_attention"]}
        if shape.causal:
            contenders["hopper_causal_persistent"] = ch.KERNELS["hopper_causal_persistent"]
        row = ch.timed_beside(contenders, shape)
        row["rep"] = rep
        rows.append(row)
        tf = row.get("tflops", {})
        print(f"[{time.time() - start:4.0f} s] {shape.label():30s} {row['status']} "
              + " ".join(f"{n}={v:.0f}" for n, v in tf.items())
              + (f" | late/early {tf['late'] / tf['early']:.3f}, beforeV/early {tf['before last V'] / tf['early']:.3f}"
                 f", late/SDPA {tf['late'] / tf['SDPA default']:.3f}" if tf else row.get("note", "")),
              flush=True)
c = check_attention(late, 4, 16, 1000, 1000, 128, True, lse=True, raise_on_fail=False)
print(f"[{time.time() - start:4.0f} s] check after the timings: {c.summary()}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "late_take.json"), "w"), indent=1)
