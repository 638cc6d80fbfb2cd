"""One GPU call: why the lean call is further ahead of cuDNN at (2, 16, 8192, 128) than at
(1, 16, 16384, 128), the same 1,376 items of 192 rows (10.4 waves on 132 SMs), twice the
keys an item (their times are the recording's at the same commit). Nsight Compute on the
chapter's kernel, the counter's items and SDPA's default at each shape, with the GPU's
own clocks (no clock control): time, SM clock, DRAM bytes, L2 hit rate, tensor pipe busy."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time

from kernels.bench import Shape

out = os.environ.get("OUT", ".")
start = time.time()
shapes = [Shape(2, 16, 8192, 8192, 128), Shape(1, 16, 16384, 16384, 128)]
names = ["hopper_attention", "hopper_dynamic_items"]

METRICS = ["gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
           "dram__bytes_read.sum", "lts__t_sector_hit_rate.pct",
           "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"]
found = {}
for shape in shapes:
    for name in names + ["sdpa_default"]:
        cmd = [shutil.which("ncu") or "/usr/local/cuda/bin/ncu", "--csv", "--clock-control", "none", "--profile-from-start", "off",
               "--metrics", ",".join(METRICS), sys.executable, "-m", "kernels.record",
               "--profile-target", name, "--profile-shape", json.dumps(shape.as_dict())]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "FA_BOOK_MODE": "gpu"}, timeout=120)
        rows = list(csv.DictReader(io.StringIO("\n".join(
            l for l in proc.stdout.splitlines() if l.startswith('"')))))
        values = {}
        for r in rows:
            values.setdefault(r["ID"], {})[r["Metric Name"]] = (r["Metric Value"], r["Metric Unit"])
        found[f"{shape.label()} {name}"] = values or (proc.stdout + proc.stderr)[-600:]
        print(f"[{time.time() - start:4.0f} s] {shape.label():24s} {name}: "
              + "; ".join(f"{m.split('.')[0]} {v[0]} {v[1]}" for vals in values.values()
                          for m, v in vals.items()), flush=True)
        json.dump(found, open(f"{out}/ncu.json", "w"), indent=1)
