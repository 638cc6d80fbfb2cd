"""One GPU call (dev/short-shapes/PLAN.md): the persistent causal grid
(hopper_causal_persistent) with its heads taken in sections of other sizes than the
50 MB of K and V it takes now (chapter 7's L2_SECTION_BYTES, read by section_heads at
each launch), at the suite's short causal shapes: each form checked, then timed in turns
beside SDPA's default (chapter 7's timed_beside), fp16; then Nsight Compute's DRAM bytes
and L2 hit rate of each form at two of them. `python3 sections.py profile MB B H S D`
is the profiled process."""
import csv, io, json, os, subprocess, sys, time

from kernels.bench import Shape
from kernels.chapters import ch07_hopper_attention as ch

MB = 2**20
SIZES = [50, 16, 8, 4]  # MB of K and V a section (50: what the chapter takes)


def with_section(mb):
    fn = ch.KERNELS["hopper_causal_persistent"]

    def call(*args, **kwargs):
        ch.L2_SECTION_BYTES = mb * MB
        try:
            return fn(*args, **kwargs)
        finally:
            ch.L2_SECTION_BYTES = 50 * MB
    return call


if sys.argv[1:2] == ["profile"]:
    from kernels import record
    mb, B, H, S, D = map(int, sys.argv[2:7])
    ch.L2_SECTION_BYTES = mb * MB if mb else 1 << 60  # 0: the chapter's kernel's order
    name = "hopper_causal_persistent" if mb else "hopper_attention"
    record.profile_target(name, Shape(B, H, S, S, D, True))
    sys.exit(0)

SHAPES = [Shape(32, 32, 512, 512, 64, True), Shape(16, 32, 1024, 1024, 64, True),
          Shape(8, 32, 2048, 2048, 64, True), Shape(32, 16, 512, 512, 128, True),
          Shape(16, 16, 1024, 1024, 128, True)]
start, rows = time.time(), []
for shape in SHAPES:
    contenders = {f"{mb} MB": with_section(mb) for mb in SIZES}
    contenders["all heads"] = ch.KERNELS["hopper_causal_all_heads"]
    contenders["hopper_attention"] = ch.KERNELS["hopper_attention"]
    heads = {mb: ch.section_heads(shape.B * shape.H, 1, shape.S_k, shape.D) for mb in SIZES
             if not setattr(ch, "L2_SECTION_BYTES", mb * MB)}
    ch.L2_SECTION_BYTES = 50 * MB
    row = ch.timed_beside(contenders, shape)
    row["heads_a_section"] = heads
    rows.append(row)
    tf = row.get("tflops", {})
    base = tf.get("50 MB")
    print(f"[{time.time() - start:4.0f} s] {shape.label():30s} {row['status']} 50 MB: "
          f"{base and round(base)} SDPA {tf.get('SDPA default') and round(tf['SDPA default'])} "
          f"heads a section {heads} | " + " ".join(f"{n}={v / base:.3f}" for n, v in tf.items()
                                                    if n != "50 MB") + row.get("note", ""),
          flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "sections.json"), "w"), indent=1)

METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct"
counts = []
for shape in SHAPES[:2] + SHAPES[3:4]:
    for mb in SIZES + [0]:
        proc = subprocess.run(["ncu", "--csv", "--profile-from-start", "off", "--metrics", METRICS,
                               sys.executable, __file__, "profile", str(mb), str(shape.B),
                               str(shape.H), str(shape.S_q), str(shape.D)],
                              capture_output=True, text=True, timeout=300)
        got = {r["Metric Name"]: r["Metric Value"] for r in csv.DictReader(io.StringIO(
            "\n".join(l for l in proc.stdout.splitlines() if l.startswith('"'))))
            if "attention_kernel" in r["Kernel Name"]}
        counts.append(dict(shape=shape.as_dict(), section_mb=mb, counts=got))
        print(f"[{time.time() - start:4.0f} s] ncu {shape.label():30s} "
              f"{'%d MB' % mb if mb else 'hopper_attention'}: {got or proc.stderr[-300:]}", flush=True)
json.dump(counts, open(os.path.join(os.environ.get("OUT", "."), "section_counts.json"), "w"), indent=1)
