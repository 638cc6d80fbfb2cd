"""One GPU call: combined.py's "all" (FlashAttention-4's D = 64 differences together in
chapter 7's kernel, level with it in time) sampled line by line by Nsight Compute at
(2, 32, 8192, 64), as source_stalls.py sampled the lean call and FlashAttention-4: do its
warps wait where FlashAttention-4's do (the special-function unit) or where the lean
call's do (their own multiplies)? `--target` runs the what-if twice and profiles the
second. Writes $OUT/all_2_32_8192_64.csv (the source page, SASS) and prints the stall
reasons' totals."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import combined  # noqa: E402  (registers the variants)

from kernels.bench import Shape  # noqa: E402

shape = Shape(2, 32, 8192, 8192, 64)
if "--target" in sys.argv:
    import torch
    from numba import cuda

    from kernels.bench import device_inputs

    fn = combined.ch.what_if_kernel(sys.argv[sys.argv.index("--target") + 1])
    q, k, v, out = device_inputs(shape)
    fn(q, k, v, causal=False, out=out)
    torch.cuda.synchronize()
    cuda.profile_start()
    fn(q, k, v, causal=False, out=out)
    torch.cuda.synchronize()
    cuda.profile_stop()
    raise SystemExit
ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
out = os.environ.get("OUT", ".")
for name in ("all",):
    rep = f"/tmp/{name}"
    proc = subprocess.run([ncu, "--profile-from-start", "off", "--section", "SourceCounters",
                           "--section", "WarpStateStats", "--import-source", "no", "-f", "-o",
                           rep, sys.executable, __file__, "--target", name],
                          capture_output=True, text=True, timeout=400,
                          env={**os.environ, "FA_BOOK_MODE": "gpu"})
    print(name, "ncu rc", proc.returncode, (proc.stdout + proc.stderr)[-1500:] if proc.returncode else "")
    page = subprocess.run([ncu, "-i", rep + ".ncu-rep", "--page", "source", "--csv",
                           "--print-source", "sass"], capture_output=True, text=True).stdout
    open(f"{out}/{name}_2_32_8192_64.csv", "w").write(page)
    lines = [l for l in page.splitlines() if l.startswith('"')]
    lines = lines[next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0):]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    totals = {c: sum(int(r[c] or 0) for r in rows) for c in rows[0]
              if c.startswith("stall_") and "Not Issued" not in c} if rows else {}
    print(json.dumps(dict(sorted(totals.items(), key=lambda x: -x[1])[:10])))
