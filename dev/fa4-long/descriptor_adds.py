"""Chapter 7's wgmma descriptors by addition (what FlashAttention-4's SASS does): the
source_stalls.py run showed the lean call building each of its 12 wgmmas' shared-memory
descriptors a tile from the address (add, mask, shift, two moves of the constant high
word: five or six uniform-datapath instructions a wgmma), where FlashAttention-4 adds a
constant to a descriptor made once (one 64-bit uniform add). A k-step's descriptor is the
tile's plus its byte offset / 16: the address field (bits 0-13, the address / 16) does
not carry while the tile lies in shared memory (under 256 KB), so the two are equal.

What-ifs on the lean call's forms (hopper_attention, hopper_dynamic_items):
`--sass` (no GPU): the SASS's uniform-datapath instructions and registers, before and
after. On the GPU: each checked at odd shapes (both head dims, both dtypes), then timed
in turns beside its kernel, SDPA's default and FlashAttention-4 (where it imports),
fp16, twice. Writes $OUT/descriptor_adds.json."""
import functools
import json
import os
import re
import sys
import time

from kernels.chapters import ch07_hopper_attention as ch

ADDS = (
    ("  wgmma_fence();\n#pragma unroll\n  for (int kk = 0; kk < D / 16; kk++)"
     "  // 16 columns of D: 32 bytes along a swizzled row\n"
     "    wgmma_ss(s, smem_descriptor(q + kk / 4 * Q_BOX + 32 * (kk % 4), 0),\n"
     "             smem_descriptor(k + kk / 4 * KV_BOX + 32 * (kk % 4), 0), kk > 0);\n",
     "  const u64 q_desc = smem_descriptor(q, 0), k_desc = smem_descriptor(k, 0);\n"
     "  wgmma_fence();\n#pragma unroll\n  for (int kk = 0; kk < D / 16; kk++)"
     "  // 16 columns of D: 32 bytes along a swizzled row\n"
     "    wgmma_ss(s, q_desc + (kk / 4 * Q_BOX + 32 * (kk % 4)) / 16,\n"
     "             k_desc + (kk / 4 * KV_BOX + 32 * (kk % 4)) / 16, kk > 0);\n"),
    ("  wgmma_fence();\n#pragma unroll\n"
     "  for (int kk = 0; kk < BN / 16; kk++) wgmma_rs(o, p[kk], smem_descriptor(v + kk * 2048, KV_BOX));\n",
     "  const u64 v_desc = smem_descriptor(v, KV_BOX);\n  wgmma_fence();\n#pragma unroll\n"
     "  for (int kk = 0; kk < BN / 16; kk++) wgmma_rs(o, p[kk], v_desc + kk * 2048 / 16);\n"),
)
KERNELS = ("hopper_attention", "hopper_dynamic_items")
for kernel in KERNELS:
    ch.WHAT_IFS[f"adds, {kernel}"] = ch.WhatIf(kernel, ADDS)

if "--sass" in sys.argv:
    from kernels.compile_report import compile_cuda

    for kernel in KERNELS:
        for D in (64, 128):
            cfg = ch.CONFIGS[kernel]
            for name, src in ((kernel, ch.source(cfg, D)),
                              (f"adds, {kernel}", ch.what_if_source(f"adds, {kernel}", D))):
                r = compile_cuda(src, ch.nvrtc_options(cfg, D, "float16"), "sm_90a", name)
                ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)",
                                                        r["sass"])]
                uniform = sum(o.startswith("U") for o in ops)
                print(D, f"{name:34s} regs {r['registers']} stack {r['stack_bytes']} "
                      f"instructions {len(ops)} uniform {uniform} notes {r['ptxas_notes']}")
    raise SystemExit

from kernels.bench import Shape, device_inputs, tflops, time_alternating  # noqa: E402
from kernels.check import check_attention  # noqa: E402
from kernels.flash_attention_4 import flash_attn_func  # noqa: E402
from kernels.reference import sdpa  # noqa: E402

start = time.time()


def log(text):
    print(f"[{time.time() - start:4.0f} s] {text}", flush=True)


fns = {n: ch.what_if_kernel(n) for n in ch.WHAT_IFS if n.startswith("adds, ")}
for name, fn in fns.items():
    for D in (64, 128):
        for B, H, S_q, S_k, causal, dtype in [(1, 25, 1200, 1200, True, "float16"),
                                              (2, 70, 333, 333, False, "bfloat16"),
                                              (1, 3, 300, 129, True, "float16"),
                                              (1, 3, 129, 300, True, "bfloat16"),
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
          Shape(4, 32, 4096, 4096, 64, True), Shape(8, 32, 2048, 2048, 64, True),
          Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(1, 16, 16384, 16384, 128), Shape(2, 16, 8192, 8192, 128),
          Shape(4, 16, 4096, 4096, 128, True), Shape(16, 16, 1024, 1024, 128, True)]
rows = []
for rep in range(2):
    for shape in shapes:
        calls = {}
        for n in KERNELS:
            for label, fn in ((n, ch.KERNELS[n]), (f"adds, {n}", fns[f"adds, {n}"])):
                q, k, v, out = device_inputs(shape)
                calls[label] = functools.partial(fn, q, k, v, causal=shape.causal, out=out)
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
        json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "descriptor_adds.json"), "w"),
                  indent=1)
