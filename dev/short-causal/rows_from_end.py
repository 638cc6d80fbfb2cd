"""One GPU call: the counter's items (hopper_dynamic_items) with a head's row blocks
counted from its last row rather than its first, so that the block a 192-row grid
leaves short is the head's first (the lightest with the causal mask) instead of its
last (the heaviest, walked by one or two consumers while the rest wait). A consumer's
rows before the first are padding: TMA reads them as zeros, and it stores none of
them. Checked at odd shapes (S_q against S_k both ways, bf16, tiny), then timed in turns beside the kernel and SDPA's default (timed_beside), fp16, twice."""
import json
import os
import time

from kernels.bench import Shape
from kernels.check import check_attention
from kernels.chapters import ch07_hopper_attention as ch

#: whole consumers' rows of the padding go before the first row (a TMA store at a row
#: before the first is an illegal instruction, where a load reads zeros): what is left of
#: it, under 64 rows, stays after the last, as in the kernel
SHIFT = "it.row0 - (row_blocks * ROWS - S_q) / 64 * 64;  // counted from the last row\n"
ch.WHAT_IFS["rows from the end"] = ch.WhatIf("hopper_dynamic_items", (
    ("\n        const int block_row0 = it.row0;\n", "\n        const int block_row0 = " + SHIFT),
    ("\n    const int block_row0 = it.row0;\n", "\n    const int block_row0 = " + SHIFT),
    ("  if (row0 >= S_q) return 0;", "  if (row0 >= S_q || row0 + rows <= 0) return 0;"),
    ("    for (int b = 0; b < BOXES; b++) tma_store(map",
     "    for (int b = 0; b < BOXES && wg_row0 >= 0; b++) tma_store(map"),
    ("    if (t == 0 && wg_row0 + r < S_q)", "    if (t == 0 && wg_row0 + r < S_q && wg_row0 + r >= 0)"),
))
#: the same, with the consumers reading the shifted first row from shared memory, where
#: the producer leaves it beside the item's number: computed by the consumers, the shift
#: is one more register held across the loop, and at D = 128 ptxas spills 64 bytes
ch.WHAT_IFS["rows from the end, row from the producer"] = ch.WhatIf("hopper_dynamic_items", (
    ("  __shared__ volatile int taken;", "  __shared__ volatile int taken, taken_row0;"),
    ("        taken = item;  // the arrive", "        taken = item, taken_row0 = block_row0;  // the arrive"),
    ("\n        const int block_row0 = it.row0;\n", "\n        const int block_row0 = " + SHIFT),
    ("\n    const int block_row0 = it.row0;\n", "\n    const int block_row0 = taken_row0;\n"),
) + ch.WHAT_IFS["rows from the end"].changes[2:])
start = time.time()


def log(text):
    print(f"[{time.time() - start:4.0f} s] {text}", flush=True)


base = ch.KERNELS["hopper_dynamic_items"]
from_end = ch.what_if_kernel("rows from the end")
from_producer = ch.what_if_kernel("rows from the end, row from the producer")
for B, H, S_q, S_k, D, causal, dtype in [
        (1, 25, 1200, 1200, 64, True, "float16"), (3, 40, 777, 777, 128, True, "bfloat16"),
        (2, 70, 333, 333, 64, False, "float16"), (1, 2, 100, 100, 128, True, "float16"),
        (2, 300, 129, 129, 64, True, "float16"), (2, 9, 300, 700, 64, True, "float16"),
        (2, 9, 700, 300, 128, True, "float16"), (1, 3, 1, 1, 64, True, "float16"),
        (1, 5, 1000, 1000, 128, False, "bfloat16"), (1, 25, 1200, 1200, 64, True, "float16")]:
    for fn in (from_end, from_producer):
        c = check_attention(fn, B, H, S_q, S_k, D, causal, lse=True, dtype=dtype,
                            raise_on_fail=False)
        log(f"check {B},{H},{S_q},{S_k},{D},{causal},{dtype}: {c.summary()}")
        if not c.ok:
            raise SystemExit("a check failed: nothing timed")
shapes = [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(4, 32, 4096, 4096, 64, True),
          Shape(1, 32, 16384, 16384, 64, True),
          Shape(32, 16, 512, 512, 128, True), Shape(16, 16, 1024, 1024, 128, True),
          Shape(4, 16, 4096, 4096, 128, True), Shape(1, 16, 16384, 16384, 128, True),
          Shape(32, 32, 512, 512, 64), Shape(8, 16, 2048, 2048, 128, True)]
rows = []
for rep in range(2):
    for shape in shapes:
        row = ch.timed_beside({"items": base, "from the end": from_end,
                               "from the producer": from_producer}, shape)
        row["rep"] = rep
        rows.append(row)
        tf = row.get("tflops", {})
        log(f"{shape.label():30s} {row['status']} " + (
            " ".join(f"{n}={v:.0f}" for n, v in tf.items())
            + " | over items: " + " ".join(
                f"{n} {tf[n] / tf['items']:.3f}" for n in ("from the end", "from the producer"))
            + " | over SDPA: " + " ".join(f"{n} {tf[n] / tf['SDPA default']:.3f}" for n in tf)
            if tf else row.get("note", "")))
for fn in (from_end, from_producer):
    c = check_attention(fn, 4, 16, 1000, 1000, 128, True, lse=True, raise_on_fail=False)
    log(f"check after the timings: {c.summary()}")
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "rows_from_end.json"), "w"),
          indent=1)
