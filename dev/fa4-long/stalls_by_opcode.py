"""No GPU: the warp-stall samples of source_stalls.py and combined_stalls.py (Nsight
Compute's source page, SASS, in stalls/*.csv.gz), summed by opcode, side by side:
`python dev/fa4-long/stalls_by_opcode.py lean_call_2_32_8192_64 FlashAttention-4_2_32_8192_64`.
A sample is a warp seen at an instruction, issuing or stalled there, so a column's samples
are where that kernel's warps spend their time; `inst` is instructions executed
(millions); the stall columns are the reasons the samples give."""
import collections
import csv
import gzip
import os
import re
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stalls")
REASONS = ("wait", "barrier", "dispatch", "mio", "long_sb")


def by_opcode(name: str) -> dict:
    lines = gzip.open(os.path.join(HERE, name + ".csv.gz"), "rt").read().splitlines()
    rows = csv.DictReader(lines[next(i for i, l in enumerate(lines) if l.startswith('"Address"')):])
    found = collections.defaultdict(collections.Counter)
    for r in rows:
        source = re.sub(r"^@!?U?P\w+\s+", "", r["Source"].strip())
        op = found[source.split()[0].split(".")[0] if source else "?"]
        op["samples"] += int(r["Warp Stall Sampling (All Samples)"] or 0)
        op["inst"] += int(r["Instructions Executed"] or 0)
        for reason in REASONS:
            op[reason] += int(r["stall_" + reason] or 0)
    return found


runs = {name: by_opcode(name) for name in sys.argv[1:]}
for name, ops in runs.items():
    print(f"{name}: {sum(o['samples'] for o in ops.values())} samples, "
          f"{sum(o['inst'] for o in ops.values()) / 1e6:.0f}M instructions")
print(f"{'opcode':10s}" + "".join(f" | {'samples':>7s} {'inst':>6s} " + " ".join(
    f"{r[:6]:>6s}" for r in REASONS) for _ in runs))
opcodes = sorted(set().union(*runs.values()), key=lambda o: -max(r[o]["samples"] for r in runs.values()))
for op in opcodes[:24]:
    print(f"{op:10s}" + "".join(f" | {r[op]['samples']:7d} {r[op]['inst'] / 1e6:6.1f} " + " ".join(
        f"{r[op][reason]:6d}" for reason in REASONS) for r in runs.values()))
