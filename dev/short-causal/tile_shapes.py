"""One GPU call: the counter's items (hopper_dynamic_items) beside forms of it with other
tile shapes (variants.py) and without its epilogue (the what-if, timed only), checked at
odd shapes first, then timed in turns with SDPA's default (chapter 7's timed_beside),
fp16, twice over the shapes where it trails cuDNN and two where it leads."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import variants  # noqa: E402
from kernels.bench import Shape  # noqa: E402
from kernels.check import check_attention  # noqa: E402
from kernels.chapters import ch07_hopper_attention as ch  # noqa: E402

ch.WHAT_IFS["dyn no epilogue"] = ch.WhatIf("hopper_dynamic_items", ch.NO_EPILOGUE,
                                           timed_only=True)
start = time.time()
names = [n for n in sys.argv[1:] if n in variants.VARIANTS] or list(variants.VARIANTS)


def log(text):
    print(f"[{time.time() - start:4.0f} s] {text}", flush=True)


def fits(name, D):
    return ch.shared_bytes(ch.CONFIGS[name], D) <= 227 * 1024


for name in names:
    for B, H, S, D, causal, dtype in [(1, 25, 1200, 64, True, "float16"),
                                      (3, 40, 777, 128, True, "bfloat16"),
                                      (2, 70, 333, 64, False, "float16"),
                                      (1, 2, 100, 128, True, "float16"),
                                      (2, 300, 129, 64, True, "float16")]:
        if not fits(name, D):
            continue
        c = check_attention(ch.KERNELS[name], B, H, S, S, D, causal, lse=True, dtype=dtype,
                            raise_on_fail=False)
        log(f"check {name} {B},{H},{S},{D},{causal},{dtype}: {c.summary()}")
        if not c.ok:
            raise SystemExit("a check failed: nothing timed")
shapes = [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(32, 32, 512, 512, 64),
          Shape(32, 16, 512, 512, 128, True), Shape(16, 16, 1024, 1024, 128, True)]
rows = []
for rep in range(2):
    for shape in shapes:
        contenders = {"dyn": ch.KERNELS["hopper_dynamic_items"]}
        contenders.update({n: ch.KERNELS[n] for n in names if fits(n, shape.D)
                           and ch.CONFIGS[n].at(shape.D) != ch.CONFIGS["hopper_dynamic_items"].at(shape.D)})
        contenders["no epilogue"] = ch.what_if_kernel("dyn no epilogue")
        row = ch.timed_beside(contenders, shape, unchecked=("no epilogue",))
        row["rep"] = rep
        rows.append(row)
        tf = row.get("tflops", {})
        log(f"{shape.label():28s} {row['status']} " + (" ".join(
            f"{n}={v:.0f}({v / tf['SDPA default']:.3f})" for n, v in tf.items())
            if tf else row.get("note", "")))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "tile_shapes.json"), "w"),
          indent=1)
