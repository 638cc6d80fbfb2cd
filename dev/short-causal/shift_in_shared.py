"""(Run with --sources only, no GPU: at D = 128 it spills as the what-if does.) One GPU
call: the row blocks counted from the last row (chapter 7's what-if) with the
shift kept in shared memory, written once as the kernel starts and read by producer
and consumers at each item (volatile: no register holds it across the loop), beside
the what-if (the consumers compute it) and the counter's items, checked first, timed in
turns with SDPA's default, fp16."""
import os
import sys
import time

from kernels.bench import Shape
from kernels.check import check_attention
from kernels.chapters import ch07_hopper_attention as ch

W = ch.WHAT_IFS["row blocks counted from the last row"]
IN_SHARED = " = it.row0 - row_shift;  // counted from the last row\n"
ch.WHAT_IFS["shift in shared memory"] = ch.WhatIf("hopper_dynamic_items", (
    ("    mbarrier_init_fence();\n",
     "    mbarrier_init_fence();\n    row_shift = (row_blocks * ROWS - S_q) / 64 * 64;\n"),
    ("  __shared__ volatile int taken;", "  __shared__ volatile int taken, row_shift;"),
    (ch.ROW_BLOCK_STARTS[0], ch.ROW_BLOCK_STARTS[0].split(" = ")[0] + IN_SHARED),
    (ch.ROW_BLOCK_STARTS[1], ch.ROW_BLOCK_STARTS[1].split(" = ")[0] + IN_SHARED)) + W.changes[2:])
start = time.time()


def log(text):
    print(f"[{time.time() - start:4.0f} s] {text}", flush=True)


if "--sources" in sys.argv:  # no GPU: the changed source, and what ptxas makes of it
    from kernels.compile_report import compile_cuda
    for D in (64, 128):
        src = ch.what_if_source("shift in shared memory", D)
        r = compile_cuda(src, ch.nvrtc_options(ch.CONFIGS["hopper_dynamic_items"], D), "sm_90a", "x")
        print(D, "stack", r["stack_bytes"], "notes", r["ptxas_notes"])
    raise SystemExit
kernels = {"items": ch.KERNELS["hopper_dynamic_items"],
           "computed": ch.what_if_kernel("row blocks counted from the last row"),
           "in shared": ch.what_if_kernel("shift in shared memory")}
for B, H, S_q, S_k, D, causal, dtype in [
        (1, 25, 1200, 1200, 64, True, "float16"), (3, 40, 777, 777, 128, True, "bfloat16"),
        (2, 70, 333, 333, 64, False, "float16"), (2, 9, 300, 700, 64, True, "float16"),
        (2, 9, 700, 300, 128, True, "float16"), (1, 3, 1, 1, 64, True, "float16")]:
    c = check_attention(kernels["in shared"], B, H, S_q, S_k, D, causal, lse=True,
                        dtype=dtype, raise_on_fail=False)
    log(f"check {c.summary()}")
    if not c.ok:
        raise SystemExit("a check failed: nothing timed")
for shape in [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
              Shape(4, 32, 4096, 4096, 64, True), Shape(32, 16, 512, 512, 128, True),
              Shape(16, 16, 1024, 1024, 128, True), Shape(4, 16, 4096, 4096, 128, True)]:
    row = ch.timed_beside(kernels, shape, unchecked=("computed",) if shape.D == 128 else ())
    tf = row.get("tflops", {})
    log(f"{shape.label():30s} {row['status']} " + (" ".join(
        f"{n} {v / tf['items']:.3f}" for n, v in tf.items()) if tf else row.get("note", "")))
