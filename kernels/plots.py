"""The book's figures, drawn from results records (recorded or live)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .results import sdpa_tflops, smooth

SDPA_STYLE = {"sdpa_default": dict(color="black", ls="--"),
              "sdpa_flash": dict(color="grey", ls=":")}


def over_s(records, kernels, *, B=16, H=16, D=64, causal=False, metric="tflops",
           title=None, ax=None, sdpa_from=None, shapes=None, labels=None, styles=None,
           legend=True):
    """One line per kernel (and SDPA) over sequence length, at fixed B, H, D.
    ``sdpa_from``: a kernel whose records carry SDPA's times measured beside it in the
    same run (``sdpa_<backend>_ms``); SDPA is drawn from those instead of its own records.
    ``shapes``: the shapes to draw instead of those of B, H, D and ``causal`` (a panel of
    the standard suite, whose B changes with S). ``labels``, ``styles``: a line's legend
    text and matplotlib style by kernel name."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    labels, styles = labels or {}, {**SDPA_STYLE, **(styles or {})}
    if shapes is None:
        wanted = None
    else:
        wanted = {(s.B, s.H, s.S_q, s.S_k, s.D, s.causal) for s in shapes}

    def drawn(r):
        if wanted is not None:
            return (r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"]) in wanted
        return (r["B"] == B and r["H"] == H and r["D"] == D and r["causal"] == causal
                and r["S_q"] == r["S_k"])

    def at(name):
        return sorted((r for r in records if r["kernel"] == name and r["status"] == "ok"
                       and r.get("dtype", "float16") == "float16" and drawn(r)),
                      key=lambda r: r["S_q"])

    for name in list(kernels) + ["sdpa_default", "sdpa_flash"]:
        rows = at(name)
        value = lambda r: r[metric]  # noqa: E731
        if sdpa_from and name.startswith("sdpa_"):
            backend = name[len("sdpa_"):]
            rows = [r for r in at(sdpa_from) if r.get(f"{name}_ms")]
            value = lambda r: (sdpa_tflops(r, backend) if metric == "tflops"  # noqa: E731
                               else r[f"{name}_ms"])
        if not rows:
            continue
        ax.plot([r["S_q"] for r in rows], [value(r) for r in rows], marker="o",
                label=labels.get(name, name.replace("_", " ")), **styles.get(name, {}))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel({"tflops": "TFLOPS", "median_ms": "time (ms)"}.get(metric, metric))
    ax.set_title(title or f"B={B}, H={H}, D={D}" + (", causal" if causal else ""))
    ax.grid(True, which="both", alpha=0.3)
    if legend:
        ax.legend(fontsize=8)
    return ax


def standard_suite(records, kernels, *, sdpa_from=None, labels=None, styles=None,
                   ceiling=None, title=None, log=True, height=8):
    """The standard suite (``kernels.bench.STANDARD_SUITE``) in four panels, D = 64 and
    128, not causal and causal: each kernel's fp16 TFLOPS over S (B = 16384 / S,
    H = 2048 / D), one legend for all; TFLOPS on a log scale, or with ``log=False`` a
    linear one from 0. ``ceiling``: a TFLOPS line to draw across every panel (the
    measured fp16 matmul rate); ``height``: the figure's, in inches (11 wide); the other
    arguments as :func:`over_s`'s."""
    from .bench import STANDARD_SUITE

    fig, axes = plt.subplots(2, 2, figsize=(11, height), sharex=True, sharey=True)
    handles = {}
    for ax, (causal, D) in zip(axes.flat, [(False, 64), (False, 128), (True, 64), (True, 128)]):
        shapes = [s for s in STANDARD_SUITE if s.D == D and s.causal == causal]
        over_s(records, kernels, shapes=shapes, sdpa_from=sdpa_from, labels=labels,
               styles=styles, ax=ax, legend=False,
               title=f"D={D}, H={2048 // D}" + (", causal" if causal else ""))
        if ceiling:
            ax.axhline(ceiling, color="#b22222", lw=0.9, ls="-.",
                       label=f"fp16 matmul, measured: {ceiling:.0f} TFLOPS")
        lengths = sorted({s.S_q for s in shapes})
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("sequence length S (B = 16384 / S)" if causal else "")
        ax.set_ylabel("TFLOPS (fp16)" if D == 64 else "")
        if not log:
            ax.set_yscale("linear")
            ax.set_ylim(0, None)
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    for ax in axes.flat:  # the x ticks are the suite's S, not powers of two
        ax.xaxis.set_minor_locator(plt.NullLocator())
    rows = (len(handles) + 2) // 3
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=8)
    fig.suptitle(title or "the standard suite", fontsize=11)
    fig.tight_layout(rect=(0, (0.1 + 0.21 * rows) / height, 1, 1 - 0.16 / height))
    return fig


def chapters_on_suite(records, chapters: dict, *, peers=("triton_attention",),
                      labels=None, ceiling=None, title=None, last_only=False, height=8):
    """Every chapter's kernel (``chapters``: {chapter: kernel}), ``peers`` and SDPA's
    two backends over the standard suite (:func:`standard_suite`), SDPA taken from the
    times measured beside the last chapter's kernel in its run. The chapters' lines
    shade from light to dark on a log scale, the last chapter's kernel bold; with
    ``last_only``, only that kernel, the peers and SDPA, on a linear scale; ``height`` as
    :func:`standard_suite`'s."""
    import matplotlib as mpl

    order = sorted(chapters)
    final = chapters[order[-1]]
    shades = mpl.colormaps["Blues"]
    styles = {chapters[c]: dict(color=shades(0.3 + 0.6 * i / max(1, len(order) - 2)), lw=1.2)
              for i, c in enumerate(order[:-1])}
    styles[final] = dict(color="#d62728", lw=2.6)
    for i, peer in enumerate(peers):
        styles[peer] = dict(color=("#ff7f0e", "#2ca02c", "#9467bd")[i % 3], ls="-.", lw=1.4)
    drawn = [final] if last_only else [chapters[c] for c in order]
    return standard_suite(records, drawn + list(peers), sdpa_from=final, labels=labels,
                          styles=styles, ceiling=ceiling, title=title, log=not last_only,
                          height=height)


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


def _box(ax, x, y, w, h, label=None, color="#dddddd", **kw):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=0.8, **kw))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=8)


def _arrow(ax, start, end, text=None, color="black"):
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle="->", color=color, lw=1.2))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.25, text,
                ha="center", fontsize=7, color=color)


def loop_inversion_diagram():
    """Chapter 2's two loop orders: every row walks all of K and V from global
    memory, or a block stages one K/V tile in shared memory for all its rows."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, inverted in zip(axes, (False, True)):
        ax.set_xlim(0, 12)
        ax.set_ylim(0, 8)
        ax.axis("off")
        # global memory: Q rows of the block, and K, V split in tiles
        _box(ax, 0.2, 1.0, 1.4, 6, None, "#f3f3f3")
        ax.text(0.9, 7.3, "Q block\n(32 rows)", ha="center", fontsize=8)
        for r in range(8):
            _box(ax, 0.3, 6.2 - 0.65 * r, 1.2, 0.5, f"row {r}" if r < 7 else "...",
                 "#cfe2ff" if r == 2 else "#eeeeee")
        for n, x in enumerate((3.0, 5.0)):
            ax.text(x + 0.7, 7.3, "K" if n == 0 else "V", ha="center", fontsize=9)
            for tile in range(4):
                _box(ax, x, 6.0 - 1.5 * tile, 1.4, 1.3, f"tile {tile}",
                     "#ffe0b3" if (inverted and tile == 1) else "#eeeeee")
        if not inverted:
            for x in (3.0, 5.0):
                _arrow(ax, (x, 6.6 - 1.5 * 1), (1.5, 4.95), color="#1f5fbf")
            ax.text(6, 0.3, "for row: for key: load k, v (global)\n"
                    "each row's lanes load all of K and V", ha="center", fontsize=8)
            ax.set_title("per_row_kv: rows outside, keys inside", fontsize=10)
        else:
            _box(ax, 8.2, 3.3, 3.2, 2.2, "shared memory\nK, V tile (fp32)", "#ffe0b3")
            _arrow(ax, (4.4, 4.65), (8.2, 4.6), "stage once")
            _arrow(ax, (6.4, 4.65), (8.2, 4.3))
            for r in range(3):
                _arrow(ax, (8.4, 3.3), (1.5, 6.45 - 0.65 * r), color="#1f5fbf")
            ax.text(6, 0.3, "for tile: stage K, V tile; for row (in parallel): for key\n"
                    "each tile loaded once per block, read by all 32 rows",
                    ha="center", fontsize=8)
            ax.set_title("loop_inverted: tiles outside, rows inside", fontsize=10)
    fig.tight_layout()
    return fig


def tile_diagram(rows=32, key_tile=16, n_row_blocks=4, n_key_tiles=8):
    """Chapter 3's tiling of the score matrix: Br x Bc tiles, the causal diagonal,
    and the tiles a block skips because every score in them is masked."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.set_xlim(-0.5, n_key_tiles + 3.5)
    ax.set_ylim(n_row_blocks + 0.8, -0.8)
    ax.axis("off")
    for rb in range(n_row_blocks):
        for kt in range(n_key_tiles):
            # causal, square: a tile is wholly masked when its first key is past the
            # block's last row (tiles are key_tile wide, blocks rows tall)
            first_key, last_row = kt * key_tile, (rb + 1) * rows - 1
            masked = first_key > last_row * (n_key_tiles * key_tile) / (n_row_blocks * rows)
            color = "#f3f3f3" if masked else ("#ffe0b3" if rb == 1 else "#dddddd")
            _box(ax, kt, rb, 0.95, 0.95, "skip" if masked and rb == 1 else None, color)
    ax.plot([0, n_key_tiles], [0, n_row_blocks], color="#b22222", lw=1.2)
    ax.text(n_key_tiles + 0.2, 1.5, f"block 1: {rows} query rows (Br)\nvisits its tiles\n"
            f"of {key_tile} keys (Bc) left\nto right; above the\ndiagonal (red) the\n"
            "causal mask hides\nevery score: skipped", fontsize=7.5, va="center")
    ax.set_title("scores S = Q K^T in Br x Bc tiles (causal)", fontsize=10)
    fig.tight_layout()
    return fig


def fragment_layout(owner, *, title=None):
    """The m16n8k16 operands of mma.sync as grids: each element labelled with the lane
    that holds it and coloured by that lane's register. ``owner(operand, row, col)``
    returns (lane, register)."""
    import matplotlib.colors as mcolors

    panels = [("a", 16, 16, "A (16 x 16, fp16/bf16): rows x k"),
              ("b", 16, 8, "B (16 x 8): k x n"),
              ("c", 16, 8, "C = D (16 x 8, fp32): rows x n")]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.6), width_ratios=[16, 8, 8])
    colors = ["#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6"]
    for ax, (operand, rows, cols, label) in zip(axes, panels):
        grid = [[owner(operand, r, c) for c in range(cols)] for r in range(rows)]
        regs = [[reg for _, reg in row] for row in grid]
        ax.imshow(regs, cmap=mcolors.ListedColormap(colors), vmin=-0.5, vmax=3.5)
        for r in range(rows):
            for c in range(cols):
                ax.text(c, r, str(grid[r][c][0]), ha="center", va="center", fontsize=6.5)
        ax.set_xticks(range(cols), [str(c) for c in range(cols)], fontsize=6)
        ax.set_yticks(range(rows), [str(r) for r in range(rows)], fontsize=6)
        ax.set_title(label, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors]
    fig.legend(handles, [f"register {i}" for i in range(4)], loc="lower center", ncol=4,
               fontsize=8)
    fig.suptitle(title or "mma.sync m16n8k16: the lane that holds each element", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


def warpgroup_timeline(consumers=2, tiles=4, *, overlap=False, ax=None, title=None):
    """The warp-specialised pipeline as designed: the producer's TMA copies and each
    consumer warpgroup's Q K^T, softmax and P V over a few K/V tiles. Durations are
    illustrative (a multiply twice a softmax). The consumers share the tensor cores, so
    no two multiplies overlap; a softmax overlaps whatever the other warpgroups
    multiply. ``overlap``: a warpgroup issues tile t + 1's Q K^T and tile t's P V
    together, and runs tile t + 1's softmax while its own P V is in flight."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * consumers))
    gemm, soft, copy = 2.0, 1.0, 1.5
    colors = {"QK": "#4c72b0", "PV": "#55a868", "softmax": "#dd8452", "TMA": "#8172b2"}
    # each consumer's program: ("mma", label) runs on the shared tensor cores, in order
    programs = []
    for _ in range(consumers):
        ops = []
        for t in range(tiles):
            if overlap:
                ops += [("mma", f"QK{t}")] + ([("mma", f"PV{t - 1}")] if t else [])
                ops += [("softmax", "softmax", True)]  # runs beside this warpgroup's P V
            else:
                ops += [("mma", f"QK{t}"), ("softmax", "softmax", False), ("mma", f"PV{t}")]
        if overlap:
            ops.append(("mma", f"PV{tiles - 1}"))
        programs.append(ops)
    now, tensor_free, last_mma = [0.0] * consumers, 0.0, [0.0] * consumers
    position = [0] * consumers
    while any(position[c] < len(programs[c]) for c in range(consumers)):
        c = min((c for c in range(consumers) if position[c] < len(programs[c])),
                key=lambda c: now[c])  # the warpgroup that is ready first goes next
        op = programs[c][position[c]]
        position[c] += 1
        y = consumers - c
        if op[0] == "mma":
            start = max(now[c], tensor_free)
            _box(ax, start, y, gemm, 0.6, op[1], colors[op[1][:2]])
            tensor_free = last_mma[c] = start + gemm
            if not (overlap and op[1].startswith("PV")):  # an overlapped P V is not waited for
                now[c] = start + gemm
        else:
            start = now[c]
            _box(ax, start, y + 0.1, soft, 0.4, "exp", colors["softmax"])
            now[c] = start + soft
            if overlap:  # the next issue waits for this warpgroup's P V too
                now[c] = max(now[c], last_mma[c])
    for t in range(tiles):
        _box(ax, t * copy, consumers + 1, copy * 0.9, 0.6, f"K{t} V{t}", colors["TMA"])
    ax.set_yticks([consumers + 1.3] + [consumers - c + 0.3 for c in range(consumers)])
    ax.set_yticklabels(["producer (TMA)"] + [f"consumer {c}" for c in range(consumers)])
    ax.set_xlim(0, max(now + [tensor_free, tiles * copy]) + 0.5)
    ax.set_ylim(0.8, consumers + 1.8)
    ax.set_xticks([])
    ax.set_xlabel("time (illustrative units)")
    ax.set_title(title or "")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def gqa_decoding(rows, *, copy_tb_s, ax=None, title=None):
    """Grouped-query decoding (``kernels.layouts``' rows): the rate at which each path
    reads K and V against the size of the cache, with the copy ceiling for scale; in
    fp16, where recorded, each path's rate after a flush that leaves L2 clean too."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    styles = {"lean call": dict(color="C0", marker="o"), "SDPA default": dict(color="black",
                                                                            marker="s", ls="--")}
    clean = {f"{path}, L2 clean": dict(style, ls=":", lw=1, alpha=0.7)
             for path, style in styles.items()}
    for dtype, fill in (("float16", None), ("bfloat16", "none")):
        for path, style in {**styles, **(clean if dtype == "float16" else {})}.items():
            points = sorted((r["kv_bytes"] / 1e9, r["of_copy"][path] * copy_tb_s)
                            for r in rows if r["dtype"] == dtype and path in r["of_copy"])
            if points:
                ax.plot(*zip(*points), label=f"{path}, {dtype}", markerfacecolor=fill,
                        **style)
    ax.axhline(copy_tb_s, color="grey", lw=1)
    ax.annotate(f"copy: {copy_tb_s:.2f} TB/s", (0.01, copy_tb_s), xycoords=("axes fraction",
                "data"), va="bottom", fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("K and V read (GB)")
    ax.set_ylabel("TB/s of K and V")
    ax.set_ylim(0, copy_tb_s * 1.1)
    ax.set_title(title or "grouped-query decoding: 32 query heads, 8 key/value heads, D = 128")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def training_curves(measurements, *, ax=None, title=None):
    """The loss of each run of a training comparison (``kernels.training.
    gpu_measurements()``'s record) against the step: the book's attention (twice) and
    SDPA's from the same weights, and SDPA's from other weights, each smoothed over the
    comparison's window (the mean of the window's steps, drawn at its last step)."""
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    window = measurements["agreement"]["window"]
    styles = {"book": dict(color="C0", lw=2), "book_again": dict(color="C1", lw=1),
              "sdpa": dict(color="black", ls="--"), "sdpa_seed_1": dict(color="grey", ls=":")}
    for name, style in styles.items():
        run = measurements["runs"].get(name)
        if run is None:  # a record from before the book's run was repeated
            continue
        label = (f"{'book' if name.startswith('book') else 'SDPA'}, seed {run['seed']}"
                 + (", again" if name == "book_again" else ""))
        losses = smooth(run["losses"], window)
        ax.plot(np.arange(window, len(run["losses"]) + 1), losses, label=label, **style)
    config = measurements["config"]
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss (mean of {window} steps)")
    ax.set_title(title or f"copy task: {config['layers']} layers, {config['batch']} x "
                          f"{config['length']} tokens a step, bf16")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def against_peers(rows, *, title=None):
    """The lean call's speed over FlashAttention-4's and over SDPA's default against S,
    one panel a head dim and mask, fp16 solid and bf16 dashed (``rows``:
    ``kernels.flash_attention_4.gpu_measurements()``'s); the line at 1 is level."""
    from .bench import Shape

    panels = sorted({(r["shape"]["D"], r["shape"]["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), sharey=True,
                             squeeze=False)
    for ax, (D, causal) in zip(axes[0], panels):
        for dtype, ls in (("float16", "-"), ("bfloat16", "--")):
            here = sorted((r for r in rows if r["dtype"] == dtype and r["shape"]["D"] == D
                           and r["shape"]["causal"] == causal), key=lambda r: r["shape"]["S_q"])
            for peer, color in (("FlashAttention-4", "C0"), ("SDPA default", "black")):
                points = [(Shape(**r["shape"]).S_q, r["tflops"]["lean call"] / r["tflops"][peer])
                          for r in here if r["tflops"].get("lean call") and r["tflops"].get(peer)]
                if points:
                    ax.plot(*zip(*points), ls=ls, marker="o", ms=3, color=color,
                            label=f"over {peer}, {'fp16' if dtype == 'float16' else 'bf16'}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("S")
        ax.set_title(f"D = {D}" + (", causal" if causal else ""), fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("the lean call's speed over the peer's")
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
