"""One GPU call: the counter's items with their row blocks counted from the last row (the
step on branch rows-from-end-step), checked at odd shapes at every head dim they take,
both dtypes, S_q against S_k both ways, then timed in turns beside the what-if that
counts from the first row (the order before) and SDPA's default, fp16, once."""
import time

from kernels.bench import Shape
from kernels.check import check_attention
from kernels.chapters import ch07_hopper_attention as ch

start = time.time()
items = ch.KERNELS["hopper_dynamic_items"]
for B, H, S_q, S_k, D, causal, dtype in [
        (1, 25, 1200, 1200, 64, True, "float16"), (3, 40, 777, 777, 128, True, "bfloat16"),
        (2, 70, 333, 333, 64, False, "float16"), (2, 9, 300, 700, 64, True, "float16"),
        (2, 9, 700, 300, 128, True, "float16"), (1, 3, 1, 1, 64, True, "float16"),
        (2, 11, 640, 640, 96, True, "float16"), (1, 7, 1000, 1000, 256, True, "bfloat16"),
        (2, 5, 321, 321, 256, False, "float16"), (1, 5, 1000, 1000, 128, False, "bfloat16"),
        (2, 300, 129, 129, 64, True, "float16"), (1, 25, 1200, 1200, 64, True, "float16")]:
    c = check_attention(items, B, H, S_q, S_k, D, causal, lse=True, dtype=dtype,
                        raise_on_fail=False)
    print(f"[{time.time() - start:4.0f} s] check {c.summary()}", flush=True)
    if not c.ok:
        raise SystemExit("a check failed: nothing timed")
first = ch.what_if_kernel("row blocks counted from the first row")
for shape in [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
              Shape(32, 16, 512, 512, 128, True), Shape(16, 16, 1024, 1024, 128, True),
              Shape(4, 16, 4096, 4096, 128, True)]:
    row = ch.timed_beside({"from the last row": items, "from the first row": first}, shape)
    tf = row.get("tflops", {})
    print(f"[{time.time() - start:4.0f} s] {shape.label():30s} {row['status']} " + (" ".join(
        f"{n} {v:.0f}" for n, v in tf.items()) + f" | last / first "
        f"{tf['from the last row'] / tf['from the first row']:.3f}, last / SDPA "
        f"{tf['from the last row'] / tf['SDPA default']:.3f}" if tf else row.get("note", "")),
        flush=True)
