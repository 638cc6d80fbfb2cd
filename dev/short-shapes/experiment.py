"""One GPU call (dev/short-shapes/PLAN.md): how cuDNN's kernel (SDPA's default) is
launched at the suite's shortest shapes, where the lean call trails it most, beside the
lean call's form there: Nsight Compute's launch statistics (grid, block, registers,
shared memory, the blocks a multiprocessor holds, waves), achieved occupancy, how busy
the tensor pipe and DRAM were. fp16. Metric names are tried together first, then in
groups, so that one the installed ncu lacks costs only its group."""
import json, os, time

from kernels.bench import Shape
from kernels.record import ncu_counts

GROUPS = {
    "launch": ["launch__grid_size", "launch__block_size", "launch__registers_per_thread",
               "launch__shared_mem_per_block_dynamic", "launch__shared_mem_per_block_static",
               "launch__waves_per_multiprocessor", "launch__occupancy_limit_registers",
               "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
               "launch__occupancy_limit_blocks"],
    "busy": ["gpu__time_duration.sum", "smsp__inst_executed.sum",
             "sm__warps_active.avg.pct_of_peak_sustained_active",
             "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
             "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"],
    "memory": ["dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum",
               "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct"],
}
# the lean call's form at each shape (results/*.json, both GPUs) and cuDNN's
CASES = [(Shape(32, 32, 512, 512, 64, True), "hopper_causal_persistent"),
         (Shape(32, 32, 512, 512, 64, False), "hopper_attention"),
         (Shape(32, 16, 512, 512, 128, True), "hopper_attention"),
         (Shape(16, 32, 1024, 1024, 64, True), "hopper_causal_persistent"),
         (Shape(8, 32, 2048, 2048, 64, True), "hopper_causal_persistent")]

start, out = time.time(), []
metrics = [m for g in GROUPS.values() for m in g]
probe = ncu_counts(["sdpa_default"], CASES[0][0], metrics)
if probe["kernels"]["sdpa_default"]["status"] != "ok":
    print("all together failed:", probe["kernels"]["sdpa_default"].get("log", "")[-600:])
    good = []
    for name, group in GROUPS.items():
        r = ncu_counts(["sdpa_default"], CASES[0][0], group)
        ok = r["kernels"]["sdpa_default"]["status"] == "ok"
        print(f"group {name}: {'ok' if ok else r['kernels']['sdpa_default'].get('log', '')[-400:]}")
        good += group if ok else []
    metrics = good
for shape, form in CASES:
    r = ncu_counts([form, "sdpa_default"], shape, metrics)
    out.append(r)
    for name, k in r["kernels"].items():
        if k["status"] != "ok":
            print(f"[{time.time() - start:4.0f} s] {shape.label()} {name}: {k['status']} {k.get('log', '')[-300:]}")
            continue
        for launch in k["launches"]:
            short = {m.split("__")[1].split(".avg")[0][:28]: v for m, v in launch.items()
                     if m not in ("id", "kernel")}
            print(f"[{time.time() - start:4.0f} s] {shape.label()} {name} {launch['kernel'][:90]}")
            print("    " + "  ".join(f"{m}={v:.4g}" if isinstance(v, float) else f"{m}={v}"
                                     for m, v in short.items()), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "launches.json"), "w"), indent=1)
