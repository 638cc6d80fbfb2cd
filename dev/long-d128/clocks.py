"""One GPU call: the SM clock and power while (2, 16, 8192, 128) and (1, 16, 16384, 128)
are timed as the recording times them (the chapter's kernel, the counter's items and
SDPA's default in turns; not checked here: the recording checked them at these shapes,
at the same commit). nvidia-smi samples every 50 ms into $OUT/smi.csv; each timing's
start and end are printed on the same clock."""
import os
import subprocess
import time

from kernels.bench import Shape
from kernels.chapters import ch07_hopper_attention as ch

out = os.environ.get("OUT", ".")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                        "--format=csv,noheader", "-lms", "50"], stdout=open(f"{out}/smi.csv", "w"))
names = ["hopper_attention", "hopper_dynamic_items"]
try:
    for _ in range(2):
        for shape in [Shape(2, 16, 8192, 8192, 128), Shape(1, 16, 16384, 16384, 128)]:
            t0 = time.strftime("%H:%M:%S")
            row = ch.timed_beside({n: ch.KERNELS[n] for n in names}, shape, unchecked=names)
            print(f"{t0}-{time.strftime('%H:%M:%S')} {shape.label():24s} " + " ".join(
                f"{n} {v:.0f}" for n, v in row["tflops"].items()), flush=True)
finally:
    smi.terminate()
