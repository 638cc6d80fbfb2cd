"""Nsight Compute's counters of named kernels at one shape, side by side: the time, the
bytes at each level, the instructions and the warp stalls a chapter records
(kernels.record.METRICS), one launch at a time under ncu's locked clocks.

    python benchmarks/counters.py hopper_attention sdpa_default --shape 2,32,8192,8192,64
    python benchmarks/counters.py hopper_dynamic_items --shape 32,32,512,512,64 --causal

A name is a kernel of the book (kernels.all_kernels) or ``sdpa_<backend>`` (PyTorch's
SDPA with that backend: ``sdpa_default``, ``sdpa_flash``). Needs a GPU and ``ncu``;
without ``ncu`` it says so and counts nothing."""
import argparse
import json

from kernels import all_kernels
from kernels.bench import Shape
from kernels.record import METRICS, ncu_counts

#: the launch's duration first, then what kernels.record counts for every kernel
COUNTERS = ("gpu__time_duration.sum",) + METRICS
#: a shape every kernel of the book takes, for a quick look (and the CI's smoke test)
TINY = Shape(1, 1, 128, 128, 64)


def known(name: str) -> bool:
    return name.startswith("sdpa_") or name in {n for _, n, _ in all_kernels()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="+", help="kernel names, or sdpa_<backend>")
    ap.add_argument("--shape", help="B,H,S_q,S_k,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tiny", action="store_true", help=f"at {TINY.label()}")
    ap.add_argument("--json", help="write the counts here as well")
    args = ap.parse_args(argv)
    unknown = [n for n in args.kernels if not known(n)]
    if unknown:
        ap.error(f"no such kernel: {', '.join(unknown)}")
    if args.tiny == bool(args.shape):
        ap.error("give --shape or --tiny")
    shape = TINY if args.tiny else Shape(*map(int, args.shape.split(",")), args.causal)
    counts = ncu_counts(args.kernels, shape, COUNTERS)
    print(shape.label())
    for name, found in counts.get("kernels", {}).items():
        for launch in found.get("launches", []):
            print(f"{name} / {launch['kernel']}: " + ", ".join(
                f"{m} {launch.get(m)}" for m in COUNTERS))
        if found["status"] != "ok":
            print(f"{name}: {found['status']}\n{found['log']}")
    if "status" in counts:
        print(counts["status"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(counts, f, indent=1)
    return counts


if __name__ == "__main__":
    main()
