"""One GPU call: how many splits should the tensor-core decoding kernel cut a short cache into?

At the grouped decoding shapes where the lean call trails SDPA's default by the most (32
query heads, 8 key/value heads of 128, one query row a head, small caches, as
kernels.layouts measures them), chapter 8's split_keys_mma_attention launched with its
splits planned for 1 to 6 blocks an SM (one wave each: ``blocks_per_sm``), and with
splits of 128 keys allowed (MIN_SPLIT_KEYS), each built once and launched directly;
the lean call and SDPA's default (enable_gqa=True) timed in the same turns.

Each path is checked against the float64 reference (output poisoned with NaN first) and
timed only if it passed; time_alternating. Writes $OUT/probe.json."""
import dataclasses
import json
import os
import time

import torch
import torch.nn.functional as F

from kernels import gpus, launch, layouts
from kernels.api import prepare_cuda
from kernels.bench import time_alternating
from kernels.chapters import ch08_in_a_real_model as ch08

out_dir = os.environ.get("OUT", ".")
start = time.time()
HEADS, KV_HEADS, D = layouts.GQA_HEADS
SHAPES = [(1, 8192, "float16"), (1, 8192, "bfloat16"), (4, 8192, "float16"),
          (1, 32768, "float16"), (16, 8192, "float16")]
BLOCKS = (1, 2, 3, 4, 6)
TOL = layouts.TOLERANCES
gpu = gpus.current()
committed_min = ch08.MIN_SPLIT_KEYS
found = dict(gpu=gpu.name, multiprocessors=gpu.multiprocessors, rows=[])

for B, S_k, dtype in SHAPES:
    t0 = time.time()
    q, k, v, kv_bytes = layouts.decoding_case(B, HEADS, KV_HEADS, S_k, D, dtype)
    out = torch.empty_like(q)
    a = prepare_cuda(q, k, v, causal=False, scale=None, out=out, lse=None, return_lse=False,
                     kernel="split_keys_mma_attention", head_dims=ch08.HEAD_DIMS,
                     dtypes=ch08.DTYPES, strided=True)
    base = ch08.mma_split_kernel(a, gpu)
    plans, launches = {}, {}

    def build(name, kernel):
        """The split kernel's launch as planned now, with its own scratch; skipped where
        an earlier plan is the same."""
        plan = ch08.split_planner(kernel, a, gpu)(S_k)
        if plan in plans.values():
            return
        plans[name] = plan
        scratch = (torch.empty(plan[0], B * HEADS, D, device="cuda", dtype=torch.float32),
                   torch.empty(plan[0], B * HEADS, device="cuda", dtype=torch.float32),
                   torch.zeros(ch08.blocks_a_split(a, kernel.rows), device="cuda",
                               dtype=torch.int32))
        launches[name] = (ch08.split_launches(a, gpu, kernel, *scratch)[0], scratch)

    build(f"as committed ({base.blocks_per_sm} an SM)", base)
    for min_keys in (committed_min, 128):
        ch08.MIN_SPLIT_KEYS = min_keys
        for n in BLOCKS:
            build(f"{n} an SM, >= {min_keys} keys", dataclasses.replace(base, blocks_per_sm=n))
    ch08.MIN_SPLIT_KEYS = committed_min

    paths = {name: (lambda fn=fn: fn()) for name, (fn, _) in launches.items()}
    paths["lean call"] = lambda: launch.attention(q, k, v, out=out)
    paths["SDPA default"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    errors, passed = {}, {}
    for name, path in paths.items():
        out.fill_(float("nan"))
        got = path()
        torch.cuda.synchronize()
        e = layouts.reference_error(out if got is None else got, q, k, v)
        errors[name] = e
        ok = e["rel_err"] <= TOL[dtype].rel and e["max_abs_err"] <= TOL[dtype].max_abs
        if ok:
            passed[name] = path
    times = {n: t.median_ms * 1e3 for n, t in time_alternating(passed).items()}
    lean_plan = launch.plan_for(q, k, v).split["for_keys"](S_k)[2:]
    row = dict(B=B, S_k=S_k, dtype=dtype, kv_bytes=kv_bytes, plans=plans,
               lean_plan=list(lean_plan), errors=errors, us=times,
               failed=[n for n in paths if n not in passed])
    found["rows"].append(row)
    sdpa = times.get("SDPA default")
    print(f"[{time.time() - start:4.0f} s] B={B:2d} S_k={S_k:6d} {dtype}: " + "; ".join(
        f"{n} {plans.get(n, lean_plan if n == 'lean call' else '')} {t:.1f} us"
        + (f" ({sdpa / t:.3f}x SDPA)" if sdpa else "") for n, t in times.items())
        + (f"; FAILED {row['failed']}" if row["failed"] else "") + f" [{time.time() - t0:.0f} s]",
        flush=True)
    json.dump(found, open(f"{out_dir}/probe.json", "w"), indent=1, default=str)
    del q, k, v, out, a, launches, paths
    torch.cuda.empty_cache()
