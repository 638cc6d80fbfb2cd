"""Why the Llama-shaped decoder's fp16, batch-1 generation is slow in the record (an
experiment; nothing to land). Recorded at 7eff9bd on an H200, a token cost both paths
6-7 ms in fp16 at batch 1 and 2.9-3.3 ms in every other case (bf16 batch 1, both dtypes
at batch 4); the record before had 4.9-5.3 ms against 3.1. Here the same measurement
(kernels.llama.generation_measurements) runs in the record's order and then again, and
one pass per case is timed step by step: host time a step, and the device's busy time
a step from torch's profiler (kernels only), so that the host's share shows."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiment import log  # noqa: E402


def cpu_mhz():
    with open("/proc/cpuinfo") as f:
        mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    return f"{statistics.median(mhz):.0f} MHz median of {len(mhz)} cores" if mhz else "?"


def stepped(model, tokens, steps, attend):
    """One greedy pass with each step's host time, and the device's kernel time over the
    pass from torch's profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cache = model.cache(tokens.shape[0])
    with torch.no_grad():
        logits = model(tokens, attend, cache)[:, -1]
        torch.cuda.synchronize()
        host = []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                t = time.perf_counter()
                logits = model(logits.argmax(-1, keepdim=True), attend, cache)[:, -1]
                host.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
    device_us = sum(e.self_device_time_total for e in prof.key_averages())
    return statistics.median(host), max(host), device_us / 1e3 / steps


def main():
    import torch

    from kernels import llama

    sizes = llama.FULL
    order = [("float16", 1), ("float16", 4), ("bfloat16", 1), ("bfloat16", 4),
             ("float16", 1), ("float16", 1)]
    models = {}
    for dtype, batch in order:
        if dtype not in models:
            models[dtype] = llama.llama_shaped(dtype=getattr(torch, dtype))
            log(f"built {dtype}; {cpu_mhz()}")
        model = models[dtype]
        out = llama.generation_measurements(model, batch, sizes["prompt"], sizes["steps"])
        log(f"{dtype} batch {batch}: per token " + ", ".join(
            f"{p} {ms:.3f}" for p, ms in out["per_token_ms"].items()) + " ms; first pass "
            + ", ".join(f"{p} {ms:.3f}" for p, ms in out["first_pass_per_token_ms"].items())
            + f" ms; {cpu_mhz()}")
        tokens = torch.randint(0, model.config["vocab"], (batch, sizes["prompt"]), device="cuda")
        for name, attend in llama.PATHS.items():
            med, worst, dev = stepped(model, tokens, sizes["steps"], attend)
            log(f"  stepped {name}: host a step median {med:.3f} ms, max {worst:.3f}; "
                f"device kernels a step {dev:.3f} ms")


if __name__ == "__main__":
    main()
