"""One GPU call: the lean call's warp stalls and instruction counts by SASS line (Nsight
Compute's source counters), at (2, 32, 8192, 64) and (1, 16, 16384, 128), fp16, where
FlashAttention-4 leads it (PLAN.md). Which lines spin in mbarrier waits (45.9M SYNCS
against FlashAttention-4's 9.3M) and whose warps they are: the producer's or the
consumers'. Each launch through probe.py's --target; the report is printed as the source
page (SASS) in CSV, written to $OUT/<shape>.csv, with a summary a launch."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time

from kernels.bench import Shape

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")
ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
out = os.environ.get("OUT", ".")
start = time.time()
paths = sys.argv[1:] or ["lean call"]
for shape in (Shape(2, 32, 8192, 8192, 64), Shape(1, 16, 16384, 16384, 128)):
    for path in paths:
        tag = f"{path.replace(' ', '_')}_{shape.B}_{shape.H}_{shape.S_q}_{shape.D}"
        rep = f"/tmp/{tag}"
        cmd = [ncu, "--profile-from-start", "off", "--section", "SourceCounters",
               "--section", "WarpStateStats", "--import-source", "no", "-f", "-o", rep,
               sys.executable, PROBE, "--target", path, "--shape", json.dumps(shape.as_dict())]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                              env={**os.environ, "FA_BOOK_MODE": "gpu"})
        print(f"[{time.time() - start:4.0f} s] {tag}: ncu rc={proc.returncode}", flush=True)
        if proc.returncode:
            print((proc.stdout + proc.stderr)[-2000:], flush=True)
            continue
        page = subprocess.run([ncu, "-i", rep + ".ncu-rep", "--page", "source", "--csv",
                               "--print-source", "sass"], capture_output=True, text=True)
        open(f"{out}/{tag}.csv", "w").write(page.stdout)
        if page.returncode or not page.stdout:
            print(page.stderr[-2000:], flush=True)
        details = subprocess.run([ncu, "-i", rep + ".ncu-rep", "--page", "details", "--csv"],
                                 capture_output=True, text=True)
        open(f"{out}/{tag}.details.csv", "w").write(details.stdout)
        lines = [l for l in page.stdout.splitlines() if l.startswith('"')]
        lines = lines[next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0):]
        rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
        print(f"  {len(rows)} SASS lines; columns: {list(rows[0]) if rows else None}", flush=True)
        if rows:
            key = next((c for c in rows[0] if "Sampling (All" in c), None)
            if key:
                rows.sort(key=lambda r: -float(r[key] or 0))
                for r in rows[:25]:
                    print("   ", r.get("Address") or r.get("# Address"), r[key],
                          r.get("Instructions Executed"), r.get("Source"), flush=True)
