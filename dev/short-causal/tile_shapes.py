"""One GPU call: the counter's items (hopper_dynamic_items) beside forms of it with other
tile shapes (variants.py) and without its epilogue (the what-if, timed only), checked at
odd shapes first, then timed in turns with SDPA's default (chapter 7's timed_beside),
fp16, twice over the shapes where it trails cuDNN and two where it leads."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import variants  # noqa: E402
from experiment import beside, check_at, rounds  # noqa: E402
from kernels.bench import Shape  # noqa: E402
from kernels.chapters import ch07_hopper_attention as ch  # noqa: E402

ch.WHAT_IFS["dyn no epilogue"] = ch.WhatIf("hopper_dynamic_items", ch.NO_EPILOGUE,
                                           timed_only=True)
names = [n for n in sys.argv[1:] if n in variants.VARIANTS] or list(variants.VARIANTS)


def fits(name, D):
    return ch.shared_bytes(ch.CONFIGS[name], D) <= 227 * 1024


for name in names:
    check_at({name: ch.KERNELS[name]},
             [(B, H, S, S, D, causal, dtype) for B, H, S, D, causal, dtype in [
                 (1, 25, 1200, 64, True, "float16"), (3, 40, 777, 128, True, "bfloat16"),
                 (2, 70, 333, 64, False, "float16"), (1, 2, 100, 128, True, "float16"),
                 (2, 300, 129, 64, True, "float16")] if fits(name, D)])
shapes = [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(32, 32, 512, 512, 64),
          Shape(32, 16, 512, 512, 128, True), Shape(16, 16, 1024, 1024, 128, True)]


def contenders(shape):
    found = {"dyn": ch.KERNELS["hopper_dynamic_items"]}
    found.update({n: ch.KERNELS[n] for n in names if fits(n, shape.D) and ch.CONFIGS[n].at(shape.D)
                  != ch.CONFIGS["hopper_dynamic_items"].at(shape.D)})
    found["no epilogue"] = ch.what_if_kernel("dyn no epilogue")
    return found


rounds(shapes, beside(contenders, unchecked=("no epilogue",)), "tile_shapes.json")
