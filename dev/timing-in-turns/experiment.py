"""One GPU call (dev/timing-in-turns/PLAN.md): why hopper_early_scores, which issues nothing early on causal shapes
(a block an item), was recorded faster than hopper_attention there. Beside both: the
chapter's kernel with a consumer's skipped tiles freed before its epilogue rather than
after (the one other change EARLY_SCORES makes to a causal block's order). Causal
shapes, fp16, D = 64 and 128 (timed_beside: each checked, then timed in turns)."""
import dataclasses, functools, json, os, time

from kernels.api import kernel_function
from kernels.bench import Shape
from kernels.chapters import ch07_hopper_attention as ch

AFTER = "#if OWN_KEYS && !EARLY_SCORES\n    free_skipped();\n#endif\n"
STORE = "#if TMA_STORE  // (named barriers 3, 4 and 5: one a consumer)"


def freed_first(cfg, D):
    src = ch.source(cfg, D)
    assert src.count(AFTER) == 1 and src.count(STORE) == 1
    return src.replace(AFTER, "").replace(STORE, AFTER + STORE)


@functools.cache
def compiled(D, dtype, negative_scale):
    cfg = ch.CONFIGS["hopper_attention"]
    return ch.cupy_kernel(freed_first(cfg, D), cfg, D, dtype, negative_scale)


def launch(q, k, v, causal, scale, out, lse, return_lse, *, name):
    a = ch.prepare_hopper(q, k, v, causal, scale, out, lse, return_lse, "hopper_attention")
    described = ch.launch_description("hopper_attention", a, ch.gpus.current())
    dataclasses.replace(described, function=compiled(a.D, a.dtype, a.scale < 0))()
    return a.returned()


freed = kernel_function("freed_first", "freed_first", launch)
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
