"""One GPU call: where FlashAttention-4's Hopper forward gains on the lean call at long
sequences (chapter 10's recorded comparison: up to about 10% at S = 16384, D = 64,
causal), counted by Nsight Compute beside a short shape where the lean call leads.

`python dev/fa4-long/probe.py` runs ncu once for each (shape, path), with chapter 7's
counters (COUNTERS, STALLS, LAUNCH_COUNTERS: the ones its recorded comparison with cuDNN
uses, at ncu's default locked clocks); each ncu run starts this script again with
`--target PATH --shape JSON`, which calls the path twice (the first compiles) and
profiles the second. Writes $OUT/counters.json; prints a line a launch."""
import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time

PATHS = ("lean call", "FlashAttention-4", "SDPA default")


def run_target(path: str, shape: dict) -> None:
    import torch
    import torch.nn.functional as F
    from numba import cuda

    from kernels import flash_attention_4, launch
    from kernels.check import fresh_inputs

    q, k, v, _ = fresh_inputs(shape["B"], shape["H"], shape["S_q"], shape["S_k"], shape["D"],
                              "float16")
    causal = shape["causal"]
    if path == "FlashAttention-4":
        fa4 = flash_attention_4.flash_attn_func()
        q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        call = lambda: fa4(q4, k4, v4, causal=causal)  # noqa: E731
    elif path == "lean call":
        out = torch.empty_like(q)
        call = lambda: launch.attention(q, k, v, causal=causal, out=out)  # noqa: E731
    else:
        call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    call()
    torch.cuda.synchronize()
    cuda.profile_start()
    call()
    torch.cuda.synchronize()
    cuda.profile_stop()


def main() -> None:
    from kernels.bench import Shape
    from kernels.chapters.ch07_hopper_attention import COUNTERS, LAUNCH_COUNTERS, STALLS
    from kernels import launch, gpus

    metrics = list(COUNTERS) + list(STALLS) + list(LAUNCH_COUNTERS) + [
        "launch__shared_mem_per_block_dynamic", "sm__cycles_elapsed.avg.per_second"]
    shapes = [Shape(1, 32, 16384, 16384, 64, causal=True), Shape(2, 32, 8192, 8192, 64),
              Shape(1, 16, 16384, 16384, 128), Shape(32, 32, 512, 512, 64, causal=True)]
    out_dir, start, found = os.environ.get("OUT", "."), time.time(), []
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    gpu = gpus.current()
    for shape in shapes:
        form = launch.rows_kernel(gpu, shape.B * shape.H, shape.S_q, shape.D, shape.S_k,
                                  shape.causal)
        for path in PATHS:
            cmd = [ncu, "--csv", "--profile-from-start", "off", "--metrics", ",".join(metrics),
                   sys.executable, __file__, "--target", path, "--shape",
                   json.dumps(shape.as_dict())]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "FA_BOOK_MODE": "gpu"})
            rows = list(csv.DictReader(io.StringIO("\n".join(
                l for l in proc.stdout.splitlines() if l.startswith('"')))))
            launches = {}
            for r in rows:
                key = (r["ID"], r["Kernel Name"][:60])
                launches.setdefault(key, {})[r["Metric Name"]] = (r["Metric Value"], r["Metric Unit"])
            found.append(dict(shape=shape.as_dict(), path=path,
                              form=form if path == "lean call" else None,
                              launches=[dict(id=k[0], kernel=k[1], metrics=m)
                                        for k, m in launches.items()],
                              log=None if rows else (proc.stdout + proc.stderr)[-1500:]))
            for (lid, name), m in launches.items():
                print(f"[{time.time() - start:4.0f} s] {shape.label()} {path} "
                      f"{form if path == 'lean call' else ''} {name}: " + "; ".join(
                          f"{COUNTERS.get(n) or STALLS.get(n) or LAUNCH_COUNTERS.get(n) or n} "
                          f"{v[0]}" for n, v in m.items()), flush=True)
            if not rows:
                print(f"[{time.time() - start:4.0f} s] {shape.label()} {path}: no counters\n"
                      + (proc.stdout + proc.stderr)[-800:], flush=True)
            json.dump(found, open(f"{out_dir}/counters.json", "w"), indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--target")
    parser.add_argument("--shape")
    args = parser.parse_args()
    if args.target:
        run_target(args.target, json.loads(args.shape))
    else:
        main()
