"""The timing tables the chapters show, from records: recorded, or measured live.

Chapters 5-7 show the same few tables of their kernels' timings: each step at the
chapter's shapes, each step against the one it builds on, the chapter's kernel over the
standard suite against SDPA, every chapter's kernel over S (the book's scoreboard), and,
on a GPU, what was measured there beside what the recorded run measured. Each function
here builds one of them as rows (dicts) for :func:`kernels.results.table`, so that a
chapter keeps the one call and the reading of it.
"""

from __future__ import annotations

from .bench import SWEEP_S, Shape
from .results import find, sdpa_tflops, source_hash, table


def tflops_of(records, kernel: str, shape: Shape, dtype: str = "float16") -> float | None:
    """TFLOPS of ``kernel`` on ``shape`` in ``dtype`` (None unless it was timed there)."""
    r = find(records, kernel, shape, dtype=dtype)
    return r.get("tflops") if r and r["status"] == "ok" else None


def of_sdpa(records, kernel: str, shape: Shape, backend: str,
            dtype: str = "float16") -> float | None:
    """How fast ``kernel`` ran on ``shape`` in ``dtype`` against SDPA's ``backend``
    ("flash" or "default") timed beside it in the same run and the same dtype: SDPA's
    time over the kernel's. (Records that do not say SDPA's dtype had it in fp16.)"""
    r = find(records, kernel, shape, dtype=dtype)
    ok = (r and r["status"] == "ok" and r.get("median_ms") and r.get(f"sdpa_{backend}_ms")
          and r.get("sdpa_dtype", "float16") == dtype)
    return r[f"sdpa_{backend}_ms"] / r["median_ms"] if ok else None


def fmt(x, spec: str) -> str:
    """``x`` formatted, or blank where there is no value."""
    return "" if x is None else format(x, spec)


def _head(label: str, what: str) -> str:
    """A column's heading: what it holds, after the label of its shape where there is one."""
    return f"{label} {what}" if label else what


def step_rows(records, kernels, shapes: dict, *, sdpa: str = "flash", labels=None) -> list[dict]:
    """One row a kernel: its TFLOPS on each of ``shapes`` ({label: Shape}) and its speed
    against SDPA's ``sdpa`` backend timed beside it. ``labels``: {kernel: what it is},
    a column after the kernel's name, for the kernels that have one."""
    rows = []
    for name in kernels:
        row = {"kernel": name}
        if labels is not None:
            row["step"] = labels.get(name, "")
        row.update({_head(label, "TFLOPS"): fmt(tflops_of(records, name, shape), ".0f")
                    for label, shape in shapes.items()})
        row.update({_head(label, f"of SDPA {sdpa}"): fmt(of_sdpa(records, name, shape, sdpa),
                                                         ".0%")
                    for label, shape in shapes.items()})
        rows.append(row)
    return rows


def gain_rows(records, builds_on: dict, shapes: dict) -> list[dict]:
    """One row a step (``builds_on``: {step: the step it edits}): how much faster it ran
    than the step it edits on each of ``shapes`` ({label: Shape}), in the same run."""
    def gain(name, base, shape):
        new, old = tflops_of(records, name, shape), tflops_of(records, base, shape)
        return new / old - 1 if new and old else None

    return [{"step": name, "builds on": base,
             **{_head(label, "gain"): fmt(gain(name, base, shape), "+.1%")
                for label, shape in shapes.items()}}
            for name, base in builds_on.items()]


def suite_rows(records, kernel: str, shapes, *, peers=None, goal=None) -> list[dict]:
    """One row a shape ``kernel`` was timed on in fp16: its TFLOPS, in bf16 where timed
    (and the ratio, and its speed against SDPA's default in bf16), the TFLOPS of
    ``peers`` ({column: kernel}) on the shape, SDPA's two backends timed beside it, and
    its speed against each. ``goal(shape, of_flash, of_default)``: the text of a last
    column, "goal", where a chapter sets one."""
    rows = []
    for shape in shapes:
        fp16 = tflops_of(records, kernel, shape)
        if fp16 is None:
            continue
        bf16 = tflops_of(records, kernel, shape, "bfloat16")
        mine = find(records, kernel, shape)
        flash, default = (of_sdpa(records, kernel, shape, b) for b in ("flash", "default"))
        row = {"shape": shape.label(), "TFLOPS": f"{fp16:.0f}", "bf16": fmt(bf16, ".0f"),
               "bf16 / fp16": fmt(bf16 and bf16 / fp16, ".0%"),
               "bf16 of default": fmt(of_sdpa(records, kernel, shape, "default", "bfloat16"),
                                      ".0%")}
        row.update({column: fmt(tflops_of(records, name, shape), ".0f")
                    for column, name in (peers or {}).items()})
        row.update({"SDPA flash": fmt(sdpa_tflops(mine, "flash"), ".0f"),
                    "SDPA default": fmt(sdpa_tflops(mine, "default"), ".0f"),
                    "of flash": fmt(flash, ".0%"), "of default": fmt(default, ".0%")})
        if goal is not None:
            row["goal"] = goal(shape, flash, default)
        rows.append(row)
    return rows


def scoreboard(records, kernels: dict, shapes=SWEEP_S, *, sdpa_from: str) -> list[dict]:
    """The book's scoreboard: one row a kernel (``kernels``: {chapter: kernel}), its
    fp16 TFLOPS on each of ``shapes``, then SDPA's two backends as timed beside
    ``sdpa_from`` (a kernel's records carry the times of SDPA measured in its run)."""
    rows = [{"chapter": chapter, "kernel": name,
             **{f"S={s.S_q}": fmt(tflops_of(records, name, s), ".1f") for s in shapes}}
            for chapter, name in kernels.items()]
    for backend in ("flash", "default"):
        beside = {s: find(records, sdpa_from, s) for s in shapes}
        rows.append({"chapter": "", "kernel": f"sdpa_{backend}", **{
            f"S={s.S_q}": fmt(sdpa_tflops(r, backend) if r and r["status"] == "ok" else None,
                              ".1f") for s, r in beside.items()}})
    return rows


def dtype_disagreements(records, kernels=None, shapes=None, *,
                        factor: float = 1.5) -> list[tuple]:
    """(kernel, shape, fp16 TFLOPS, bf16 TFLOPS) where one kernel, timed in both 16-bit
    types on one shape in one run, ran more than ``factor`` times faster in one. The two
    are the same instructions on other bits: the record then does not say which of the
    two is the kernel's speed on that shape. ``kernels``, ``shapes``: where to look (by
    default every kernel and shape timed in bf16)."""
    bf16 = [r for r in records if r.get("dtype") == "bfloat16"]
    if kernels is None:
        kernels = sorted({r["kernel"] for r in bf16})
    if shapes is None:
        shapes = sorted({Shape(r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"])
                         for r in bf16}, key=lambda s: (s.D, s.causal, s.S_q, s.B))
    out = []
    for name in kernels:
        for shape in shapes:
            a, b = tflops_of(records, name, shape), tflops_of(records, name, shape, "bfloat16")
            if a and b and max(a, b) > factor * min(a, b):
                out.append((name, shape, a, b))
    return out


def disagreement_note(pairs, factor: float = 1.5) -> str:
    """One sentence on the (kernel, shape, fp16, bf16) ``pairs`` of
    :func:`dtype_disagreements`, for a table that leaves them out ("" if none)."""
    if not pairs:
        return ""
    each = "; ".join(f"{name} at {shape.label()}: {a:.0f} TFLOPS in fp16, {b:.0f} in bf16"
                     for name, shape, a, b in pairs)
    return (f"Left out: {each}. One kernel on either 16-bit type runs the same "
            f"instructions, and these timings, of one run, differ by more than {factor:g}x: "
            "the record does not say which is the kernel's speed there.")


def without(records, pairs) -> list[dict]:
    """``records`` with the timings of the (kernel, shape) ``pairs`` blanked in every
    dtype (their TFLOPS and times None, so tables and figures leave them out), and the
    times of SDPA measured beside them kept."""
    drop = {(name, (s.B, s.H, s.S_q, s.S_k, s.D, s.causal)) for name, s, *_ in pairs}
    blank = dict(tflops=None, median_ms=None, min_ms=None, max_ms=None,
                 note="left out: its fp16 and bf16 timings disagree")
    return [dict(r, **blank)
            if (r["kernel"], (r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"])) in drop
            else r for r in records]


def leave_out_disagreements(records, kernels=None, *,
                            factor: float = 1.5) -> tuple[list[dict], str]:
    """``records`` with the :func:`dtype_disagreements` of ``kernels`` (by default
    every kernel timed in bf16) left out (:func:`without`), and the sentence that says
    so ("" where there is none)."""
    pairs = dtype_disagreements(records, kernels, factor=factor)
    return without(records, pairs), disagreement_note(pairs, factor)


def live_beside_recorded(live, recorded: dict | None, chapter: int, *,
                         sdpa: str = "default", here: str | None = None) -> str:
    """What a chapter measured here (``live``: :func:`kernels.bench.run_suite`'s records)
    beside what the recorded run measured on the same shapes, as Markdown: each kernel's
    TFLOPS and its speed against SDPA's ``sdpa`` backend timed beside it. A recorded
    figure is shown only where the run timed the kernel as the package has it now (the
    source hash of :func:`kernels.results.stale`). ``here`` heads the live columns (by
    default :func:`kernels.gpus.live_label`, the GPU at hand)."""
    from . import all_kernels

    names = {r["kernel"] for r in live if not r["kernel"].startswith("sdpa_")}
    current = {name: source_hash(fn) for _, name, fn in all_kernels() if name in names}
    old = [r for r in (recorded or {}).get("records", [])
           if r["kernel"] in current and r.get("source_hash") == current[r["kernel"]]]
    from .gpus import live_label
    from .results import recorded_label

    here = here or live_label()
    there = recorded_label(recorded, chapter) if recorded else "recorded"
    rows = []
    for r in live:
        if r["kernel"] not in names:
            continue  # SDPA's own rows: each kernel's row carries SDPA's time beside it
        name, dtype = r["kernel"], r.get("dtype", "float16")
        shape = Shape(r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"])
        measured = (f"{r['tflops']:.0f}" if r["status"] == "ok"
                    else f"{r['status']}: {r.get('note', '')[:80]}".replace("|", "/"))
        fp16 = dtype == "float16"  # SDPA is timed in fp16
        rows.append({"kernel": name if fp16 else f"{name} ({dtype})", "shape": shape.label(),
                     f"TFLOPS, {here}": measured,
                     f"TFLOPS, {there}": fmt(tflops_of(old, name, shape, dtype), ".0f"),
                     f"of SDPA {sdpa}, {here}":
                         fmt(of_sdpa(live, name, shape, sdpa), ".0%") if fp16 else "",
                     f"of SDPA {sdpa}, {there}":
                         fmt(of_sdpa(old, name, shape, sdpa), ".0%") if fp16 else ""})
    return table(rows, list(rows[0])) if rows else "nothing was measured"
