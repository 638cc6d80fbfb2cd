"""Scratch: decoding kernel settings at small caches (not committed)."""
import dataclasses
import torch, torch.nn.functional as F
from kernels import gpus, launch
from kernels.api import prepare_cuda
from kernels.bench import time_alternating
from kernels.layouts import decoding_case
from kernels.chapters import ch08_in_a_real_model as c8

gpu = gpus.current()
CFGS = {"now": c8.MMA_CONFIG,
        "new": dataclasses.replace(c8.MMA_SMALL_CONFIG, stages=4, at_d256=(("stages", 3),))}
def paths(q, k, v, wide):
    a = prepare_cuda(q, k, v, causal=False, scale=None, out=None, lse=None, return_lse=False,
                     kernel="x", head_dims=c8.HEAD_DIMS, dtypes=c8.DTYPES, strided=True)
    out = {"lean": lambda: launch.attention(q, k, v),
           "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
    for name, cfg in CFGS.items():
        if wide and cfg.at(q.shape[-1]) is None: continue
        try:
            kern = c8.mma_split_kernel(a, gpu, cfg)
        except Exception as e:
            print(name, "fails", e); continue
        out[name] = (lambda kern=kern: c8.run_split(a, gpu, kern))
    if wide:
        kern = c8.split_keys_kernel(a, gpu)
        out["cuda_cores"] = lambda: c8.run_split(a, gpu, kern)
    return out, a
cases = [(B, 32, 8, S_k, 128) for S_k in (8192, 32768, 131072) for B in (1, 4, 16)] + [(1, 32, 1, 8192, 128), (4, 32, 1, 32768, 128)] + \
        [(B, 32, 32, S_k, D) for D in (64, 128, 96, 256) for B, S_k in ((1, 32768), (8, 8192), (1, 4096))]
for B, H, H_kv, S_k, D in cases:
    q, k, v, nbytes = decoding_case(B, H, H_kv, S_k, D, "float16")
    fns, a = paths(q, k, v, H == H_kv)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
    for name, f in fns.items():
        if name in ("lean", "sdpa"): continue
        f(); torch.cuda.synchronize(); o = torch.as_tensor(a.returned(), device="cuda").float()
        err = ((o - ref).norm() / ref.norm()).item()
        if err > 1e-2: print("WRONG", name, err)
    t = time_alternating(fns, rounds=4)
    print(B, H, H_kv, S_k, D, f"{nbytes/1e6:.0f}MB", {n: round(x.median_ms * 1e3, 1) for n, x in t.items()}, flush=True)
