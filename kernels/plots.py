"""The book's figures, drawn from results records (recorded or live)."""

from __future__ import annotations

import matplotlib.pyplot as plt

SDPA_STYLE = {"sdpa_default": dict(color="black", ls="--"),
              "sdpa_flash": dict(color="grey", ls=":")}


def over_s(records, kernels, *, B=16, H=16, D=64, causal=False, metric="tflops",
           title=None, ax=None):
    """One line per kernel (and SDPA) over sequence length, at fixed B, H, D."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for name in list(kernels) + ["sdpa_default", "sdpa_flash"]:
        rows = sorted((r for r in records if r["kernel"] == name and r["status"] == "ok"
                       and r["B"] == B and r["H"] == H and r["D"] == D
                       and r["causal"] == causal and r["S_q"] == r["S_k"]),
                      key=lambda r: r["S_q"])
        if not rows:
            continue
        ax.plot([r["S_q"] for r in rows], [r[metric] for r in rows], marker="o",
                label=name.replace("_", " "), **SDPA_STYLE.get(name, {}))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel({"tflops": "TFLOPS", "median_ms": "time (ms)"}.get(metric, metric))
    ax.set_title(title or f"B={B}, H={H}, D={D}" + (", causal" if causal else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def roofline(ceilings, series=None, *, ax=None, title=None):
    """Attainable TFLOPS against arithmetic intensity (FLOP per byte of DRAM).

    ``ceilings``: the recorded ``copy_tb_s`` and ``matmul_tflops`` (tensor cores),
    plus the fp32 CUDA-core peak ``fp32_tflops`` if given. ``series``: {name:
    [(intensity, tflops), ...]} to place on it.
    """
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    bw = ceilings["copy_tb_s"]  # TB/s = TFLOP/s per (FLOP/B)
    x = np.logspace(-1, 4, 200)
    for peak, label, style in ((ceilings.get("matmul_tflops"), "tensor cores (fp16 matmul, measured)", "-"),
                               (ceilings.get("fp32_tflops"), "CUDA cores fp32 (datasheet)", "-.")):
        if peak:
            ax.plot(x, np.minimum(peak, bw * x), ls=style, label=f"{label}: {peak:.0f}")
    for name, points in (series or {}).items():
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte, fused minimum)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(title or f"roofline: {bw:.2f} TB/s measured copy bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax
