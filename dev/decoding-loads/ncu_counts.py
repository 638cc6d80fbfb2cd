"""One GPU call: Nsight Compute's DRAM, L2 and instruction counts of the lean call's
decoding kernel and cuDNN's (SDPA's default), one launch each, at batch 16 against 8k
and 32k keys (kernels.layouts' grouped decoding case, fp16).

`python dev/decoding-loads/ncu_counts.py` starts ncu on this script with `--target`,
which runs each path once between cudaProfilerStart and Stop; ncu's defaults hold
(clocks locked, caches flushed before each launch). Writes $OUT/ncu_counts.csv and
prints the counts a kernel."""
import csv
import io
import os
import shutil
import subprocess
import sys

METRICS = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sector_op_read_hit_rate.pct",
           "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",
           "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
           "smsp__inst_executed.sum", "sm__cycles_active.avg", "launch__grid_size",
           "launch__block_size", "launch__registers_per_thread"]
SHAPES = ((16, 8192), (16, 32768))


def target():
    import torch
    import torch.nn.functional as F

    from kernels import launch, layouts

    heads, kv_heads, D = layouts.GQA_HEADS
    for B, S_k in SHAPES:
        q, k, v, _ = layouts.decoding_case(B, heads, kv_heads, S_k, D, "float16")
        for _ in range(2):  # compiled, planned, warm
            launch.attention(q, k, v)
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        launch.attention(q, k, v)
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    if "--target" in sys.argv:
        target()
        sys.exit()
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    run = subprocess.run([ncu, "--csv", "--profile-from-start", "off", "--metrics",
                          ",".join(METRICS), sys.executable, __file__, "--target"],
                         capture_output=True, text=True)
    text = run.stdout[run.stdout.find('"ID"'):]
    with open(os.path.join(os.environ.get("OUT", "."), "ncu_counts.csv"), "w") as f:
        f.write(text)
    launches = {}
    for row in csv.DictReader(io.StringIO(text)):
        launches.setdefault((row["ID"], row["Kernel Name"][:60]), {})[row["Metric Name"]] = (
            row["Metric Value"], row["Metric Unit"])
    for (i, name), counts in launches.items():
        print(i, name)
        for metric in METRICS:
            value, unit = counts.get(metric, ("", ""))
            print(f"    {metric:58s} {value:>16s} {unit}")
    if run.returncode:
        print(run.stderr[-3000:])
