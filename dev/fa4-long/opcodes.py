"""One GPU call: the instruction mix, opcode by opcode, of the lean call, FlashAttention-4
and cuDNN at (2, 32, 8192, 64), fp16, where FlashAttention-4 is about 9% faster than the
lean call with 2-6% fewer instructions (PLAN.md): Nsight Compute's
sass__inst_executed_per_opcode (an instanced metric: one value an opcode), one launch
each, through probe.py's --target. Writes $OUT/opcodes.json; prints the opcodes that
differ most."""
import json
import os
import shutil
import subprocess
import sys

from kernels.bench import Shape

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")
shape = Shape(2, 32, 8192, 8192, 64)
ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
found = {}
for path in ("lean call", "FlashAttention-4", "SDPA default"):
    cmd = [ncu, "--profile-from-start", "off", "--metrics",
           "sass__inst_executed_per_opcode,smsp__inst_executed.sum",
           "--print-metric-instances", "details", sys.executable, PROBE, "--target", path,
           "--shape", json.dumps(shape.as_dict())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FA_BOOK_MODE": "gpu"})
    text = proc.stdout
    found[path] = text[-6000:]
    print(f"== {path}\n" + "\n".join(l for l in text.splitlines()
                                       if "sass__inst" in l or "inst_executed" in l)[:3000],
          flush=True)
    if "sass__inst" not in text:
        print((proc.stdout + proc.stderr)[-1500:], flush=True)
json.dump(found, open(os.path.join(os.environ.get("OUT", "."), "opcodes.json"), "w"), indent=1)
