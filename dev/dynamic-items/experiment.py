"""One GPU call (dev/dynamic-items/PLAN.md): the persistent grid with its items handed
out by a counter as blocks free up (hopper_dynamic_items, branch dynamic-items), checked
at odd shapes and twice in a row (the counters set back to zero), then timed in turns
beside the causal grid in sections, the chapter's kernel and SDPA's default
(chapter 7's timed_beside), fp16."""
import json, os, time

from kernels.bench import Shape
from kernels.check import check_attention
from kernels.chapters import ch07_hopper_attention as ch

start = time.time()
dynamic = ch.KERNELS["hopper_dynamic_items"]
for B, H, S, D, causal, dtype in [(1, 25, 1200, 64, True, "float16"), (3, 40, 777, 128, True, "bfloat16"),
                                  (2, 70, 333, 64, False, "float16"), (1, 2, 100, 128, True, "float16"),
                                  (1, 25, 1200, 64, True, "float16")]:
    c = check_attention(dynamic, B, H, S, S, D, causal, lse=True, dtype=dtype, raise_on_fail=False)
    print(f"[{time.time() - start:4.0f} s] check {B},{H},{S},{D},{causal},{dtype}: {c.summary()}", flush=True)
    if not c.ok:
        raise SystemExit("the check failed: nothing timed")
rows = []
for shape in [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
              Shape(8, 32, 2048, 2048, 64, True), Shape(32, 16, 512, 512, 128, True),
              Shape(16, 16, 1024, 1024, 128, True), Shape(4, 16, 4096, 4096, 128, True),
              Shape(32, 32, 512, 512, 64), Shape(4, 16, 4096, 4096, 128)]:
    contenders = {"dynamic": dynamic, "hopper_attention": ch.KERNELS["hopper_attention"]}
    if shape.causal:
        contenders["hopper_causal_persistent"] = ch.KERNELS["hopper_causal_persistent"]
    row = ch.timed_beside(contenders, shape)
    rows.append(row)
    tf = row.get("tflops", {})
    print(f"[{time.time() - start:4.0f} s] {shape.label():30s} {row['status']} "
          + " ".join(f"{n}={v:.0f}" for n, v in tf.items())
          + (f" | dynamic over the best of the book's: {tf['dynamic'] / max(v for n, v in tf.items() if n not in ('dynamic', 'SDPA default')):.3f}"
             f", over SDPA: {tf['dynamic'] / tf['SDPA default']:.3f}" if tf else row.get("note", "")),
          flush=True)
c = check_attention(dynamic, 4, 16, 1000, 1000, 128, True, lse=True, raise_on_fail=False)
print(f"[{time.time() - start:4.0f} s] check after the timings: {c.summary()}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "dynamic.json"), "w"), indent=1)
