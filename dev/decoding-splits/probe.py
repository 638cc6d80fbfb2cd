"""One GPU call: how many splits should the tensor-core decoding kernel cut a short cache into?

At the grouped decoding shapes where the lean call trails SDPA's default by the most (32
query heads, 8 key/value heads of 128, one query row a head, small caches, as
kernels.layouts measures them), chapter 8's split_keys_mma_attention launched with its
splits planned for 1 to 6 blocks an SM (one wave each: ``blocks_per_sm``), and with
splits of 128 keys allowed (MIN_SPLIT_KEYS), each built once and launched directly;
the lean call and SDPA's default (enable_gqa=True) timed in the same turns. Each path is
checked against the float64 reference first and timed only if it passed
(experiment.decoding_checked_and_timed). Writes $OUT/probe.json."""
import dataclasses
import json
import os
import sys

import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import (decoding_checked_and_timed, decoding_line,  # noqa: E402
                        grouped_decoding_call, log, split_launch)

from kernels import gpus, launch  # noqa: E402
from kernels.chapters import ch08_in_a_real_model as ch08  # noqa: E402

SHAPES = [(1, 8192, "float16"), (1, 8192, "bfloat16"), (4, 8192, "float16"),
          (1, 32768, "float16"), (16, 8192, "float16")]
BLOCKS = (1, 2, 3, 4, 6)
gpu = gpus.current()
committed_min = ch08.MIN_SPLIT_KEYS
found = dict(gpu=gpu.name, multiprocessors=gpu.multiprocessors, rows=[])

for B, S_k, dtype in SHAPES:
    q, k, v, out, kv_bytes, a, base = grouped_decoding_call(B, S_k, dtype, gpu)
    plans, launches = {}, {}

    def build(name, kernel):
        """The kernel's launch as planned now (split_plan reads MIN_SPLIT_KEYS), skipped
        where an earlier plan is the same."""
        plan, fn, scratch = split_launch(a, gpu, kernel, S_k)
        if plan not in plans.values():
            plans[name], launches[name] = plan, (fn, scratch)

    build(f"as committed ({base.blocks_per_sm} an SM)", base)
    for min_keys in (committed_min, 128):
        ch08.MIN_SPLIT_KEYS = min_keys
        for n in BLOCKS:
            build(f"{n} an SM, >= {min_keys} keys", dataclasses.replace(base, blocks_per_sm=n))
    ch08.MIN_SPLIT_KEYS = committed_min

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
