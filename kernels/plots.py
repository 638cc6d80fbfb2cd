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


# ---- conceptual diagrams: one idea each, drawn where a chapter first explains it ----

_FONT = 9  #: the conceptual diagrams' text, in points: readable at the page's width


def _canvas(width, height, figsize):
    """A figure with one axes of ``width`` x ``height`` data units, no axis drawn."""
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def _label(ax, x, y, text, size=_FONT, **kw):
    ax.text(x, y, text, fontsize=size, **{"ha": "center", "va": "center", **kw})


def memory_hierarchy():
    """Chapter 0's memory hierarchy with an H100's (SXM) sizes: each SM's registers and
    shared memory (``kernels.gpus``, compute capability 9.0), the L2 all SMs share and
    the HBM every byte comes from (NVIDIA's datasheet, as chapter 0's table has them)."""
    from .gpus import MULTIPROCESSORS, READER_GPUS

    sm = MULTIPROCESSORS[(9, 0)]
    block_kb = next(g.shared_optin for g in READER_GPUS if g.compute_capability == (9, 0))
    sms, l2_mb, hbm, hbm_tb_s = 132, 50, "80 GB HBM3", 3.35  # chapter 0's DATASHEET
    fig, ax = _canvas(24, 10, (9, 3.6))
    for s, name in enumerate(("SM 0", "SM 1", f"... SM {sms - 1}")):
        x0 = 0.2 + s * 3.9
        _box(ax, x0, 4.6, 3.6, 5.0, color="#f3f3f3")
        _label(ax, x0 + 1.8, 9.2, name)
        _box(ax, x0 + 0.25, 6.75, 3.1, 1.9, color="#c7e9c0")
        _label(ax, x0 + 1.8, 7.7, "registers")
        _box(ax, x0 + 0.25, 4.85, 3.1, 1.65, color="#9ecae1")
        _label(ax, x0 + 1.8, 5.67, "shared / L1")
    _box(ax, 0.2, 2.5, 11.4, 1.6, color="#fdd0a2")
    _label(ax, 5.9, 3.3, "L2 cache")
    _box(ax, 0.2, 0.2, 11.4, 1.8, color="#fcbba1")
    _label(ax, 5.9, 1.1, "global memory (HBM)")
    notes = [
        (7.7, f"{sm.registers:,} x 4 B = {sm.registers * 4 // 1024} KB an SM; at most "
              f"{sm.registers_a_thread}\na thread; each thread's own, no cost to read"),
        (5.67, f"up to {sm.shared // 1024} KB an SM ({block_kb // 1024} KB a block); "
               "one block's;\n32 banks x 4 B: 128 B a clock"),
        (3.3, f"{l2_mb} MB, shared by all {sms} SMs;\nevery global read passes through it"),
        (1.1, f"{hbm} at {hbm_tb_s} TB/s;\nhundreds of clocks away"),
    ]
    for y, text in notes:
        ax.text(12.1, y, text, fontsize=_FONT, va="center")
    _arrow(ax, (23.6, 9.0), (23.6, 0.6))
    ax.text(23.3, 4.8, "larger, slower", rotation=90, fontsize=_FONT, va="center",
            ha="center")
    ax.set_title("an H100 (SXM): the memory hierarchy, fastest and smallest at the top",
                 fontsize=10)
    fig.tight_layout()
    return fig


#: a row of scores whose maximum grows in the first, second and fourth tile of three
ONLINE_SOFTMAX_SCORES = (0.5, 1.0, 0.2, 2.0, 1.5, 0.3, 1.1, 0.7, 1.2, 0.4, 2.6, 1.9)


def online_softmax_diagram(scores=ONLINE_SOFTMAX_SCORES, key_tile=3):
    """The online softmax on one row: its ``scores`` arrive ``key_tile`` at a time; after
    each tile the running maximum m, and, where m grew, the factor exp(m_old - m_new)
    that rescales the running sum l and the accumulator acc."""
    import math

    import numpy as np

    n = len(scores)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 3.6), sharex=True,
                                      height_ratios=[1.5, 1.2])
    colors = ("#9ecae1", "#c7e9c0")
    m, l = -math.inf, 0.0
    for t, start in enumerate(range(0, n, key_tile)):
        tile = scores[start:start + key_tile]
        end = start + len(tile)
        top.axvspan(start - 0.5, end - 0.5, color=colors[t % 2], alpha=0.35, lw=0)
        new = max(m, max(tile))
        factor = math.exp(m - new) if m > -math.inf else 0.0
        l = l * factor + sum(math.exp(s - new) for s in tile)
        top.plot([start - 0.5, end - 0.5], [new, new], color="#b22222", lw=2)
        if m == -math.inf:
            lines, color = (f"m: −∞ → {new:.1f}", "× exp(−∞) = 0", "(nothing yet)"), "#f3f3f3"
        elif new > m:
            lines, color = (f"m: {m:.1f} → {new:.1f}", f"× exp({m:.1f} − {new:.1f})",
                            f"= {factor:.2f}"), "#ffe0b3"
        else:
            lines, color = (f"m stays {m:.1f}", "× exp(0) = 1", "no rescale"), "#f3f3f3"
        bottom.add_patch(plt.Rectangle((start - 0.45, 0.05), len(tile) - 0.1, 0.9,
                                       facecolor=color, edgecolor="black", lw=0.8))
        bottom.text((start + end - 1) / 2, 0.5, "\n".join(lines + (f"l = {l:.2f}",)),
                    ha="center", va="center", fontsize=_FONT)
        m = new
    top.bar(np.arange(n), scores, width=0.6, color="#4c72b0", label="score $s_j$")
    top.plot([], [], color="#b22222", lw=2,
             label=f"running maximum m after the {'key' if key_tile == 1 else 'tile'}")
    top.set_ylim(0, max(scores) * 1.6)
    top.set_ylabel("score", fontsize=_FONT)
    top.legend(fontsize=_FONT, loc="upper left", ncol=2, frameon=False)
    top.tick_params(labelsize=_FONT)
    for side in ("top", "right"):
        top.spines[side].set_visible(False)
    bottom.set_ylim(0, 1)
    bottom.axis("off")
    bottom.set_xlim(-0.6, n - 0.4)
    what = "key" if key_tile == 1 else f"tile of {key_tile} keys"
    top.set_title(f"one row, a {what} at a time: where m grows, l and acc are "
                  "multiplied by exp(m_old − m_new)", fontsize=10)
    top.set_xticks(range(n), [f"k{j}" for j in range(n)], fontsize=_FONT)
    top.tick_params(axis="x", labelbottom=True)
    fig.tight_layout(h_pad=0.3)
    return fig


def _bank_group(layout, row, D=64):
    """Chapter 4's model: the group of 4 banks (0-7) where the 16 bytes at column 0 of
    fp32 row ``row`` start, a row being D floats (+4 padded), chunk 0 of row r moved to
    chunk r % 8 when swizzled."""
    stride = D + 4 if layout == "padded" else D
    col = 4 * (row % min(8, D // 4)) if layout == "swizzled" else 0
    return (row * stride + col) % 32 // 4


def bank_conflicts(D=64):
    """Shared memory's 32 banks of 4 bytes, eight 4-bank groups of 16 bytes: where the 8
    lanes of a quarter-warp land when each reads 16 bytes at column 0 of its own key (a
    row of an fp32 tile, D floats), unpadded, padded by 16 bytes, and swizzled."""
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.4))
    colors = plt.get_cmap("tab10")
    for ax, layout in zip(axes, ("unpadded", "padded", "swizzled")):
        ax.set_xlim(-0.1, 8.1)
        ax.set_ylim(-1.3, 8.6)
        ax.axis("off")
        height = [0] * 8
        for key in range(8):
            g = _bank_group(layout, key, D)
            ax.add_patch(plt.Rectangle((g + 0.05, height[g] + 0.05), 0.9, 0.9,
                                       facecolor=colors(key), alpha=0.55, edgecolor="black",
                                       lw=0.6))
            _label(ax, g + 0.5, height[g] + 0.5, f"k{key}")
            height[g] += 1
        for g in range(8):
            ax.add_patch(plt.Rectangle((g, -0.05), 1, -0.6, facecolor="#dddddd",
                                       edgecolor="black", lw=0.6))
            _label(ax, g + 0.5, -0.35, f"{g}", size=_FONT)
        _label(ax, 4, -1.0, "bank group g: banks 4g to 4g + 3")
        passes = max(height)
        ax.set_title(f"{layout}: {passes} pass{'es' if passes > 1 else ''}", fontsize=10,
                     color="#b22222" if passes > 1 else "black")
    fig.suptitle(f"8 lanes read 16 B at column 0 of keys k0-k7 (fp32 rows of D = {D}): "
                 "lanes in the same bank group wait their turn", fontsize=10)
    fig.tight_layout()
    return fig


def xor_swizzle(rows=8, chunks=8):
    """A tile of fp16 rows of 128 bytes (D = 64): eight 16-byte chunks a row, coloured by
    the chunk of the row they hold. Row-major, chunk c of every row sits at position c;
    swizzled, at c ^ (r % 8). Outlined: chunk 0 of rows 0-7, what one ldmatrix 8 x 8
    matrix reads at column 0."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    colors = plt.get_cmap("Set3")
    for ax, swizzled in zip(axes, (False, True)):
        ax.set_xlim(-1.3, chunks + 0.1)
        ax.set_ylim(rows + 1.3, -0.3)
        ax.axis("off")
        for r in range(rows):
            _label(ax, -0.65, r + 0.5, f"row {r}")
            for c in range(chunks):
                at = c ^ (r % 8) if swizzled else c
                read = c == 0
                ax.add_patch(plt.Rectangle((at, r), 1, 1, facecolor=colors(c % 12),
                                           edgecolor="black", lw=2.2 if read else 0.5,
                                           zorder=3 if read else 2))
                _label(ax, at + 0.5, r + 0.5, f"c{c}", weight="bold" if read else "normal")
        for p in range(chunks):
            _label(ax, p + 0.5, rows + 0.35, f"{p}")
        _label(ax, chunks / 2, rows + 1.0, "position = bank group: banks 4p to 4p + 3")
        ax.set_title("swizzled: chunk c of row r at c ^ (r % 8)" if swizzled
                     else "row-major: chunk c of every row at c", fontsize=10)
    fig.suptitle("chunk c0 of rows 0-7 (outlined): one bank group row-major, "
                 "eight different ones swizzled", fontsize=10)
    fig.tight_layout()
    return fig


def ldmatrix_diagram():
    """ldmatrix.x4 for mma.sync's A operand (chapter 6's load_a): lane l gives the
    address of row l % 16, columns 8 (l / 16) to + 7, of a 16 x 16 fp16 block; lanes
    8i to 8i + 7 so give the rows of matrix i, which lands in register i of every lane,
    lane 4g + t holding row g's elements 2t and 2t + 1."""
    fig, ax = _canvas(24, 12, (9, 3.9))
    colors = ("#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6")
    top, x0, half, cell_h = 10.6, 1.4, 3.4, 0.6
    for r in range(16):
        for h in range(2):
            _box(ax, x0 + h * half, top - (r + 1) * cell_h, half, cell_h,
                 color=colors[r // 8 + 2 * h])
            _label(ax, x0 + (h + 0.5) * half, top - (r + 0.5) * cell_h, f"lane {r + 16 * h}")
    for h in range(2):
        _label(ax, x0 + (h + 0.5) * half, top + 0.4, f"columns {8 * h}-{8 * h + 7}")
    for i, (r0, h) in enumerate(((0, 0), (8, 0), (0, 1), (8, 1))):
        x = x0 - 0.6 if h == 0 else x0 + 2 * half + 0.6
        _label(ax, x, top - (r0 + 4) * cell_h, f"m{i}", size=10, weight="bold")
    _label(ax, x0 + half, top + 1.05, "shared memory: a 16 x 16 fp16 block")
    _arrow(ax, (9.0, 5.8), (11.4, 5.8))
    _label(ax, 10.2, 6.5, "ldmatrix.x4")
    # matrix m_i as the lanes receive it: row g, elements 2t, 2t + 1 -> lane 4g + t
    mx, cw, ch = 12.2, 1.6, 1.2
    for g in range(8):
        _label(ax, mx - 0.4, top - (g + 0.5) * ch, f"{g}")
        for t in range(4):
            _box(ax, mx + t * cw, top - (g + 1) * ch, cw, ch, color="#eeeeee")
            _label(ax, mx + (t + 0.5) * cw, top - (g + 0.5) * ch, f"lane {4 * g + t}")
    for t in range(4):
        _label(ax, mx + (t + 0.5) * cw, top + 0.4, f"{2 * t}, {2 * t + 1}")
    _label(ax, mx + 2 * cw, top + 1.05, "matrix m_i, row g, elements")
    ax.text(mx + 4 * cw + 0.4, 5.8, "lanes 8i to 8i + 7\ngive the 8 row\naddresses of m_i;"
            "\nm_i lands in\nregister i of\nevery lane:\nlane 4g + t gets\nrow g, elements"
            "\n2t and 2t + 1", fontsize=_FONT, va="center")
    ax.set_title("ldmatrix.x4 for A: each lane gives one row's address and receives two "
                 "elements of each of four 8 x 8 matrices", fontsize=10)
    fig.tight_layout()
    return fig


def mbarrier_ring(stages=3, tiles=6):
    """Chapter 7's ring of ``stages`` slots for K/V tiles, each with a full barrier (TMA's
    bytes complete it) and a free barrier (the consumers arrive when done); tile t goes
    to slot t % stages, and its waits are for the parity of its lap, (t / stages) & 1."""
    fig, ax = _canvas(24, 10, (9, 3.6))
    _box(ax, 0.2, 4.3, 5.6, 5.0, color="#e6e0f3")
    ax.text(0.4, 8.9, "producer (TMA)\nfor each tile t:\n 1. t >= S: wait free[t % S],\n"
            "    parity of the lap before\n 2. expect its bytes on\n    full[t % S]\n"
            " 3. copy tile t into it",
            fontsize=_FONT, va="top")
    _box(ax, 18.2, 4.3, 5.6, 5.0, color="#dbe9d5")
    ax.text(18.4, 8.9, "consumers (wgmma)\nfor each tile t:\n 1. wait full[t % S],\n"
            "    parity (t / S) & 1\n 2. compute on it\n 3. arrive on\n    free[t % S]",
            fontsize=_FONT, va="top")
    width = 10.4 / stages
    for s in range(stages):
        x = 6.8 + s * width
        _box(ax, x, 5.4, width - 0.5, 2.6, color="#ffe0b3")
        _label(ax, x + (width - 0.5) / 2, 7.4, f"slot {s}")
        _box(ax, x + 0.2, 5.6, (width - 0.9) / 2, 1.0, color="#c6dbef")
        _label(ax, x + 0.2 + (width - 0.9) / 4, 6.1, f"full[{s}]")
        _box(ax, x + 0.2 + (width - 0.9) / 2 + 0.1, 5.6, (width - 0.9) / 2, 1.0,
             color="#e5f5e0")
        _label(ax, x + 0.3 + 3 * (width - 0.9) / 4, 6.1, f"free[{s}]")
    _arrow(ax, (5.8, 8.5), (6.8, 7.4))
    _label(ax, 8.9, 8.8, "TMA writes; full completes")
    _arrow(ax, (17.3, 7.4), (18.2, 8.5))
    _label(ax, 15.4, 8.8, "consumers read")
    ax.annotate("", xy=(5.8, 4.9), xytext=(18.2, 4.9),
                arrowprops=dict(arrowstyle="->", color="#1f5fbf", lw=1.2, ls="--",
                                connectionstyle="arc3,rad=-0.15"))
    _label(ax, 12.0, 3.35, "free completes: the slot may be refilled, one lap later",
           color="#1f5fbf")
    # tile -> slot and parity
    ax.text(0.3, 2.45, "tile t", fontsize=_FONT, va="center")
    ax.text(0.3, 1.5, "slot t % S", fontsize=_FONT, va="center")
    ax.text(0.3, 0.55, "parity (t / S) & 1", fontsize=_FONT, va="center")
    for t in range(tiles):
        x = 6.8 + t * (17.0 / tiles)
        lap = (t // stages) & 1
        for y, text in ((2.45, str(t)), (1.5, str(t % stages)), (0.55, str(lap))):
            _box(ax, x, y - 0.4, 17.0 / tiles - 0.2, 0.8,
                 color="#ffe0b3" if lap == 0 else "#fdd0a2")
            _label(ax, x + (17.0 / tiles - 0.2) / 2, y, text)
    ax.set_title(f"the mbarrier ring, S = {stages} slots: a slot's barriers complete "
                 "once a lap, so a wait names the lap's parity", fontsize=10)
    fig.tight_layout()
    return fig


def split_keys_diagram(lse=(2.1, 3.0, 1.4, 2.6)):
    """Chapter 8's split-keys decoding: one query row, its keys cut into len(lse)
    splits, each read by a block of its own into a partial output O_s and its logsumexp
    lse_s; a second kernel weighs them by exp(lse_s - lse), lse = log sum exp(lse_s)."""
    import math

    splits = len(lse)
    total = math.log(sum(math.exp(x) for x in lse))
    fig, ax = _canvas(24, 10, (9, 3.6))
    _box(ax, 0.2, 5.4, 2.2, 1.8, color="#cfe2ff")
    _label(ax, 1.3, 6.3, "q: one\nquery row")
    _label(ax, 1.3, 4.4, "given to\nevery block")
    width = 20.0 / splits
    colors = ("#9ecae1", "#c7e9c0", "#fdd0a2", "#dadaeb", "#fcbba1", "#e5f5e0")
    for s in range(splits):
        x = 3.0 + s * width
        w = width - 0.4
        _box(ax, x, 8.2, w, 1.3, color=colors[s % len(colors)])
        _label(ax, x + w / 2, 8.85, f"K, V: split {s}")
        _arrow(ax, (x + w / 2, 8.2), (x + w / 2, 7.2))
        _box(ax, x + 0.4, 5.4, w - 0.8, 1.8, color="#f3f3f3")
        _label(ax, x + w / 2, 6.3, f"block {s}:\nonline softmax")
        _arrow(ax, (x + w / 2, 5.4), (x + w / 2, 4.5))
        _box(ax, x + 0.4, 3.1, w - 0.8, 1.4, color=colors[s % len(colors)])
        _label(ax, x + w / 2, 3.8, f"O_{s},  lse_{s} = {lse[s]:.1f}")
        weight = math.exp(lse[s] - total)
        _label(ax, x + w / 2, 2.5, f"weight {weight:.2f}", color="#b22222")
        _arrow(ax, (x + w / 2, 2.2), (12.0 + (x + w / 2 - 12.0) * 0.3, 1.5))
    _box(ax, 5.0, 0.1, 14.0, 1.4, color="#ffe0b3")
    _label(ax, 12.0, 0.8, f"combine: lse = log Σ_s exp(lse_s) = {total:.2f},   "
           "O = Σ_s exp(lse_s − lse) O_s")
    ax.set_title(f"split-keys decoding: {splits} blocks share one row's keys, "
                 "then their partial answers are weighed", fontsize=10)
    fig.tight_layout()
    return fig


def backward_dataflow():
    """Chapter 9's backward for one block: it owns key tile j (K_j, V_j) and keeps dK_j,
    dV_j in registers while the query tiles i stream past; each step is one line of the
    derivation. dQ, a sum over key tiles, is left to a pass of its own."""
    fig, ax = _canvas(24, 10.6, (9, 3.9))
    inputs, recomputed, accumulated = "#cfe2ff", "#ffe0b3", "#c7e9c0"
    _box(ax, 0.2, 8.7, 5.4, 1.5, color=inputs)
    _label(ax, 2.9, 9.45, "before: δ = rowsum(dO ∘ O)\none number a query row")
    _box(ax, 0.2, 0.2, 23.6, 8.1, color="#fafafa")
    ax.text(0.4, 7.9, "for each key tile j (a block each): K_j, V_j loaded once; "
            "dK_j, dV_j start at 0 in registers", fontsize=_FONT, va="center")
    _box(ax, 0.6, 1.6, 17.6, 5.8, color="#f0f0f0")
    ax.text(0.8, 7.0, "for each query tile i: Q_i, dO_i, L_i, δ_i streamed in",
            fontsize=_FONT, va="center")
    steps = [  # (x, y, text, colour)
        (1.0, 4.9, "S = c Q_i K_jᵀ", recomputed),
        (5.4, 4.9, "P = exp(S − L_i)\n(recomputed)", recomputed),
        (9.8, 4.9, "dP = dO_i V_jᵀ", recomputed),
        (14.2, 4.9, "dS = P ∘ (dP − δ_i)", recomputed),
        (5.4, 2.0, "dV_j += Pᵀ dO_i", accumulated),
        (14.2, 2.0, "dK_j += c dSᵀ Q_i", accumulated),
    ]
    for x, y, text, color in steps:
        _box(ax, x, y, 3.8, 1.5, color=color)
        _label(ax, x + 1.9, y + 0.75, text)
    _arrow(ax, (4.8, 5.65), (5.4, 5.65))
    _arrow(ax, (13.6, 5.65), (14.2, 5.65))
    ax.plot([9.2, 9.2, 13.9, 13.9], [5.2, 4.4, 4.4, 4.9], color="black", lw=1.0)
    _arrow(ax, (13.9, 4.5), (14.2, 5.0))
    _arrow(ax, (7.3, 4.9), (7.3, 3.5))
    _arrow(ax, (16.1, 4.9), (16.1, 3.5))
    _box(ax, 18.8, 4.6, 4.8, 2.4, color="#fdd0a2")
    _label(ax, 21.2, 5.8, "dQ_i = c Σ_j dS K_j:\na sum over key tiles:\n"
           "a pass of its own, query\ntiles outside (or atomics)")
    _arrow(ax, (18.0, 5.65), (18.8, 5.65))
    _box(ax, 18.8, 0.5, 4.8, 1.9, color=accumulated)
    _label(ax, 21.2, 1.45, "after the last tile i:\nstore dK_j, dV_j once")
    _arrow(ax, (18.0, 2.75), (18.8, 1.6))
    for x, text, color in ((6.8, "inputs", inputs), (10.6, "recomputed a tile", recomputed),
                           (15.6, "accumulated in registers", accumulated)):
        _box(ax, x, 9.2, 0.6, 0.6, color=color)
        ax.text(x + 0.8, 9.5, text, fontsize=_FONT, va="center")
    ax.set_title("the backward, one block: key tiles outside, query tiles inside",
                 fontsize=10)
    fig.tight_layout()
    return fig
