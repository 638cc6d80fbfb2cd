"""One GPU call: does a short last split end the tensor-core decoding kernel's wave sooner?

At the suite's grouped decoding shapes (32 query heads, 8 key/value heads of 128, one
query row a head, a (B, S_k, 8, 128) cache read through views, as kernels.layouts
measures them), chapter 8's split_keys_mma_attention launched three ways, built once and
launched directly (no host work between launches):

- "whole splits": split_plan's one-wave splits with no short last split (the what-if);
- "short last, tail +N": the short last split planned with TAIL_START_STEPS = N;
- "lean call" (kernels.launch.attention, TAIL_START_STEPS as committed) and SDPA's
  default (enable_gqa=True), timed in the same turns.

Each path is checked against the float64 reference (output poisoned with NaN first) and
timed only if it passed (experiment.decoding_checked_and_timed). Writes $OUT/probe.json.
It runs on the branch's kernels (TAIL_START_STEPS, ``short_last``) with main's
dev/experiment.py, whose decoding helpers came after the branch."""
import dataclasses
import json
import os
import sys

import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import (decoding_checked_and_timed, decoding_line,  # noqa: E402
                        grouped_decoding_call, log, split_launch)

from kernels import gpus, launch, layouts  # noqa: E402
from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(B, S_k, "float16") for S_k in layouts.GQA_LENGTHS for B in layouts.GQA_BATCHES]
SHAPES += [(16, 8192, "bfloat16"), (4, 131072, "bfloat16")]
TAILS = (0, 1, 2, 4)
gpu = gpus.current()
committed_tail = ch08.TAIL_START_STEPS
found = dict(gpu=gpu.name, multiprocessors=gpu.multiprocessors, rows=[])

for B, S_k, dtype in SHAPES:
    q, k, v, out, kv_bytes, a, base = grouped_decoding_call(B, S_k, dtype, gpu)
    plans, launches = {}, {}

    def build(name, kernel):
        """The split kernel's launch as planned now (split_launches reads
        TAIL_START_STEPS), skipped where an earlier plan is the same."""
        plan, fn, scratch = split_launch(a, gpu, kernel, S_k)
        if plan not in plans.values():
            plans[name], launches[name] = plan, (fn, scratch)

    build("whole splits", dataclasses.replace(base, short_last=False))
    for tail in TAILS:
        ch08.TAIL_START_STEPS = tail
        build(f"short last, tail +{tail}", base)
    ch08.TAIL_START_STEPS = committed_tail

    paths = {name: fn for name, (fn, _) in launches.items()}
    paths["lean call"] = lambda: launch.attention(q, k, v, out=out)
    paths["SDPA default"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    plans["lean call"] = launch.plan_for(q, k, v).split["for_keys"](S_k)[2:]
    timed = decoding_checked_and_timed(paths, q, k, v, out, dtype)
    found["rows"].append(dict(B=B, S_k=S_k, dtype=dtype, kv_bytes=kv_bytes, plans=plans,
                              **timed))
    log(decoding_line(B, S_k, dtype, timed["us"], plans, timed["failed"]))
    with open(os.path.join(os.environ.get("OUT", "."), "probe.json"), "w") as f:
        json.dump(found, f, indent=1, default=str)
