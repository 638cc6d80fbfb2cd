"""One GPU call: chapter 7's kernel with each of its three consumers overlapping one
tile's softmax with the next tile's Q K^T (FlashAttention-4's Hopper forward at D = 64:
192 x 128 tiles, P from registers, the overlap within a warpgroup, no ping-pong),
beside the forms the lean call takes at D = 64 (hopper_attention; hopper_dynamic_items),
each checked at odd shapes, then timed in turns with SDPA's default (chapter 7's
timed_beside), fp16, at the suite's D = 64 shapes, twice. Registers: three_overlap_registers.py (no
spills at D = 64; at D = 128 the overlap spills with three consumers)."""
import dataclasses
import json
import os
import time

from kernels.api import kernel_function
from kernels.bench import STANDARD_SUITE
from kernels.check import check_attention
from kernels.chapters import ch07_hopper_attention as ch

VARIANTS = {
    "three_overlap": dataclasses.replace(ch.CONFIGS["hopper_attention"], own_keys=False,
                                         overlap=True),
    "three_overlap_items": dataclasses.replace(ch.CONFIGS["hopper_dynamic_items"],
                                               own_keys=False, overlap=True),
}
for name, cfg in VARIANTS.items():
    ch.CONFIGS[name] = cfg
    ch.KERNELS[name] = kernel_function(name, f"Experiment: {name}.", ch.launch_hopper)
start = time.time()


def log(text):
    print(f"[{time.time() - start:4.0f} s] {text}", flush=True)


for name in VARIANTS:
    for B, H, S_q, S_k, causal, dtype in [(1, 25, 1200, 1200, True, "float16"),
                                          (2, 70, 333, 333, False, "bfloat16"),
                                          (1, 3, 300, 129, True, "float16"),
                                          (1, 3, 129, 300, True, "float16"),
                                          (2, 300, 129, 129, True, "float16"),
                                          (1, 2, 4000, 4000, False, "float16")]:
        c = check_attention(ch.KERNELS[name], B, H, S_q, S_k, 64, causal, lse=True,
                            dtype=dtype, raise_on_fail=False)
        log(f"check {name} {B},{H},{S_q},{S_k},64,{causal},{dtype}: {c.summary()}")
        if not c.ok:
            raise SystemExit("a check failed: nothing timed")
rows = []
for rep in range(2):
    for shape in [s for s in STANDARD_SUITE if s.D == 64]:
        contenders = {n: ch.KERNELS[n] for n in ("hopper_attention", "hopper_dynamic_items",
                                                  "three_overlap", "three_overlap_items")}
        row = ch.timed_beside(contenders, shape)
        row["rep"] = rep
        rows.append(row)
        tf = row.get("tflops", {})
        log(f"{shape.label():28s} {row['status']} " + (" ".join(
            f"{n}={v:.0f}({v / tf['SDPA default']:.3f})" for n, v in tf.items())
            if tf else row.get("note", "")))
        json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "three_overlap.json"), "w"),
                  indent=1)
