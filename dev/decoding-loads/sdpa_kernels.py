"""One GPU call: which kernels does SDPA's default launch for grouped decoding, with what
grid, block, registers and shared memory? (torch.profiler's trace, at the shapes of
kernels.layouts' grouped decoding.) Writes $OUT/sdpa_kernels.json."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from experiment import log  # noqa: E402

from kernels import layouts  # noqa: E402

found = []
for B, S_k in ((1, 8192), (16, 8192), (16, 32768), (4, 131072)):
    q, k, v, _ = layouts.decoding_case(B, *layouts.GQA_HEADS[:2], S_k, layouts.GQA_HEADS[2],
                                       "float16")
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
    path = f"/tmp/trace_{B}_{S_k}.json"
    prof.export_chrome_trace(path)
    kernels = [dict(name=e["name"][:160], us=e.get("dur"),
                    **{key: e.get("args", {}).get(key) for key in (
                        "grid", "block", "registers per thread", "shared memory",
                        "blocks per SM", "warps per SM", "est. achieved occupancy %")})
               for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
    found.append(dict(B=B, S_k=S_k, kernels=kernels))
    for kernel in kernels:
        log(f"B={B} S_k={S_k}: {kernel}")
with open(os.path.join(os.environ.get("OUT", "."), "sdpa_kernels.json"), "w") as f:
    json.dump(found, f, indent=1)
