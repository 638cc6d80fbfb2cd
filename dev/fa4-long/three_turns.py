"""FlashAttention-4's Hopper forward at D = 64, as chapter 7's switches and a few lines:
three consumers of 64 rows, each overlapping tile t's softmax with tile t + 1's Q K^T
and tile t's P V (OVERLAP), every consumer walking the block's tiles (no OWN_KEYS), and
the three taking turns to issue their multiplies, round robin (FlashAttention-4's
"warp scheduler barrier": chapter 7's ping-pong, from two consumers to three). The
source_stalls.py run found chapter 7's consumers stalled at `wgmma.wait_group` for 14%
of their samples, and three_overlap.py (the overlap without the turns) gained 0-2%.

Variants (chapter 7's WhatIf: a kernel's source with lines replaced):
  three_turns              the overlap and the round-robin turns
  three_turns_late_rescale and O's rescale by tile t's factors after P V (t - 1) has
                           landed, outside the turn (FlashAttention-4's order), where
                           chapter 7 rescales inside the turn, before issuing P V (t)
  overlap_late_rescale     hopper_overlap (two consumers, ping-pong, the overlap; what
                           FlashAttention-4 runs at D = 128) with the late rescale

`python dev/fa4-long/three_turns.py --registers` (no GPU): registers and spills.
On the GPU: each checked at odd shapes, then timed in turns with the lean call's forms,
SDPA's default and (where flash_attn.cute imports) FlashAttention-4 on its own layout,
fp16, twice. Writes $OUT/three_turns.json."""
import dataclasses
import functools
import json
import os
import sys
import time

from kernels.chapters import ch07_hopper_attention as ch

TURNS = (
    ('static_assert(!PINGPONG || CONSUMERS == 2, "ping-pong takes two consumer warpgroups");',
     'static_assert(!PINGPONG || CONSUMERS >= 2, "turns take two consumer warpgroups or more");'),
    ("  if (warpgroup == 1) barrier_arrive(1, 256);  // warpgroup 0 multiplies first",
     "  if (warpgroup == CONSUMERS - 1) barrier_arrive(1, 256);  // warpgroup 0 multiplies first"),
    ("#define TURN_END barrier_arrive(2 - warpgroup, 256)",
     "#define TURN_END barrier_arrive(1 + (warpgroup + 1) % CONSUMERS, 256)"),
    ("wg_row0, head, S_q, warp, lane, 3 + warpgroup);",  # turns take barriers 1-3
     "wg_row0, head, S_q, warp, lane, 4 + warpgroup);"),
)
LATE_RESCALE = (
    ("      issue_scores(s, q, sh.k_tile(r));  // tile t's scores ...\n"
     "      rescale(o_acc, alpha);\n",
     "      issue_scores(s, q, sh.k_tile(r));  // tile t's scores ...\n"),
    ("      release(sh.v_free(r - 1));\n      to_operand(p, s);\n",
     "      release(sh.v_free(r - 1));\n      rescale(o_acc, alpha);  // for P V (t), O at rest\n"
     "      to_operand(p, s);\n"),
    ("      TURN_BEGIN;\n      rescale(o_acc, alpha);\n      mbarrier_wait(sh.v_full(r), lap(r));\n",
     "      TURN_BEGIN;\n      mbarrier_wait(sh.v_full(r), lap(r));\n"),
)
# the base (compiled for the launch's description before the what-if's code replaces it)
# must compile: the assert, relaxed, in every kernel's source (it only guards a switch)
ch.CONFIG_SOURCE = ch.CONFIG_SOURCE.replace(*TURNS[0])
TURNS = TURNS[1:]
ch.CONFIGS["three_turns_base"] = dataclasses.replace(
    ch.CONFIGS["hopper_attention"], own_keys=False, overlap=True, pingpong=True)
ch.WHAT_IFS["three_turns"] = ch.WhatIf("three_turns_base", TURNS)
ch.WHAT_IFS["three_turns_late_rescale"] = ch.WhatIf("three_turns_base", TURNS + LATE_RESCALE)
ch.WHAT_IFS["overlap_late_rescale"] = ch.WhatIf("hopper_overlap", LATE_RESCALE)
VARIANTS = {64: ("three_turns", "three_turns_late_rescale", "overlap_late_rescale"),
            128: ("overlap_late_rescale",)}

if "--registers" in sys.argv:
    from kernels.compile_report import compile_cuda

    for D, names in VARIANTS.items():
        rows = [(n, ch.source(ch.CONFIGS[n], D), ch.CONFIGS[n])
                for n in ("hopper_attention", "hopper_overlap")]
        rows += [(n, ch.what_if_source(n, D), ch.CONFIGS[ch.WHAT_IFS[n].kernel]) for n in names]
        for name, src, cfg in rows:
            r = compile_cuda(src, ch.nvrtc_options(cfg, D, "float16"), "sm_90a", name)
            print(D, f"{name:26s}", r["registers"], r["stack_bytes"], r.get("spill_bytes"),
                  r["ptxas_notes"], {k: r["sass_counts"].get(k) for k in ("BAR", "SYNCS", "HGMMA")}
                  if isinstance(r.get("sass_counts"), dict) else "")
    raise SystemExit

import torch  # noqa: E402

from kernels.bench import Shape, device_inputs, tflops, time_alternating  # noqa: E402
from kernels.check import check_attention  # noqa: E402
from kernels.flash_attention_4 import flash_attn_func  # noqa: E402
from kernels.reference import sdpa  # noqa: E402

start = time.time()


def log(text):
    print(f"[{time.time() - start:4.0f} s] {text}", flush=True)


fns = {n: ch.what_if_kernel(n) for n in ("three_turns", "three_turns_late_rescale",
                                         "overlap_late_rescale")}
for name, fn in fns.items():
    for D in (64, 128) if name == "overlap_late_rescale" else (64,):
        for B, H, S_q, S_k, causal, dtype in [(1, 25, 1200, 1200, True, "float16"),
                                              (2, 70, 333, 333, False, "bfloat16"),
                                              (1, 3, 300, 129, True, "float16"),
                                              (1, 3, 129, 300, True, "float16"),
                                              (2, 300, 129, 129, True, "float16"),
                                              (1, 2, 4000, 4000, False, "float16")]:
            c = check_attention(fn, B, H, S_q, S_k, D, causal, lse=True, dtype=dtype,
                                raise_on_fail=False)
            log(f"check {name} {B},{H},{S_q},{S_k},{D},{causal},{dtype}: {c.summary()}")
            if not c.ok:
                raise SystemExit("a check failed: nothing timed")
fa4 = flash_attn_func()
log(f"FlashAttention-4: {'imported' if fa4 else 'not installed'}")
shapes = [Shape(2, 32, 8192, 8192, 64), Shape(1, 32, 16384, 16384, 64, True),
          Shape(4, 32, 4096, 4096, 64), Shape(16, 16, 2048, 2048, 64),
          Shape(2, 32, 8192, 8192, 64, True), Shape(4, 32, 4096, 4096, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(16, 32, 1024, 1024, 64),
          Shape(1, 16, 16384, 16384, 128), Shape(2, 16, 8192, 8192, 128),
          Shape(1, 16, 16384, 16384, 128, True), Shape(4, 16, 4096, 4096, 128, True)]
rows = []
for rep in range(2):
    for shape in shapes:
        names = ["hopper_attention", "hopper_dynamic_items", "hopper_overlap"]
        calls = {}
        for n in names:
            q, k, v, out = device_inputs(shape)
            calls[n] = functools.partial(ch.KERNELS[n], q, k, v, causal=shape.causal, out=out)
        for n in VARIANTS[shape.D]:
            q, k, v, out = device_inputs(shape)
            calls[n] = functools.partial(fns[n], q, k, v, causal=shape.causal, out=out)
        q, k, v, _ = device_inputs(shape)
        calls["SDPA default"] = functools.partial(sdpa, q, k, v, shape.causal, None, "default")
        if fa4 is not None:
            q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in device_inputs(shape)[:3])
            calls["FlashAttention-4"] = functools.partial(fa4, q4, k4, v4, causal=shape.causal)
        times = time_alternating(calls)
        tf = {n: tflops(shape, t.median_ms) for n, t in times.items()}
        rows.append(dict(shape=shape.as_dict(), rep=rep, tflops=tf))
        log(f"{shape.label():28s} " + " ".join(
            f"{n}={v:.0f}({v / tf['SDPA default']:.3f})" for n, v in tf.items()))
        json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "three_turns.json"), "w"),
                  indent=1)
