"""The book's targets for the lean call, read from a recorded run (chapter 10 sets every
recorded GPU's side by side): its forward over the standard suite, the form of chapter 7's
kernel it takes at each shape against SDPA's default and against the book's fastest
kernel, in fp16 and bf16, and its decoding through chapter 8's measurements."""

from __future__ import annotations

from . import results
from .bench import Shape
from .launch import forms


def lean_call_form(records, shape, dtype: str = "float16") -> str | None:
    """The form of chapter 7's kernel the lean call runs at a suite shape in ``dtype``,
    on the GPU that recorded ``records``: of the forms it chooses among there
    (``launch.forms``), the one recorded fastest there in ``dtype`` (in fp16, for a form
    recorded in fp16 only).
    That is :func:`kernels.launch.rows_kernel`'s choice at a recorded shape on that GPU
    (tests/test_targets.py checks the two agree on every recorded run). None where no
    form was recorded there."""
    rates = {name: r["tflops"] for name in forms(shape.D, shape.causal)
             if (r := results.timed(records, name, shape, dtype))}
    return max(rates, key=rates.get) if rates else None


#: the lean call's forward targets over the standard suite: (what, which shapes, measure,
#: at least), each measure a ratio taken at one shape and dtype (:func:`forward_targets`)
FORWARD_TARGETS = (
    ("at least SDPA default's speed, S >= 1024", lambda s: s.S_q >= 1024, "vs SDPA default", 1.0),
    ("at least 1.05x SDPA default's, D = 128, S >= 4096",
     lambda s: s.D == 128 and s.S_q >= 4096, "vs SDPA default", 1.05),
    ("no slower than SDPA default, S <= 512", lambda s: s.S_q <= 512, "vs SDPA default", 1.0),
    ("within 3% of the book's fastest kernel", lambda s: True, "of the fastest", 0.97),
    ("bf16 within 5% of fp16", lambda s: True, "bf16 / fp16", 0.95),
)


def forward_measures(run: dict, shape, dtype: str) -> dict[str, float]:
    """What :data:`FORWARD_TARGETS` measure at one suite shape in one run: the lean call's
    form in ``dtype`` (:func:`lean_call_form`) against SDPA's default timed beside it in
    the same dtype ("vs SDPA default": its time over the form's), its TFLOPS over the
    fastest of the book's kernels recorded there in ``dtype`` ("of the fastest"; peers
    left out), and the lean call's bf16 TFLOPS over its fp16, each dtype's form its own
    ("bf16 / fp16"). Empty where the form was not timed."""
    mine = lean_call_record(run, shape, dtype)
    if mine is None:
        return {}
    out = {"of the fastest": mine["tflops"] / fastest_kernel(run, shape, dtype)["tflops"]}
    if mine.get("sdpa_default_ms"):
        out["vs SDPA default"] = mine["sdpa_default_ms"] / mine["median_ms"]
    other = lean_call_record(run, shape, "bfloat16" if dtype == "float16" else "float16")
    if other:
        out["bf16 / fp16"] = (mine["tflops"] / other["tflops"] if dtype == "bfloat16"
                              else other["tflops"] / mine["tflops"])
    return out


def lean_call_record(run: dict, shape, dtype: str) -> dict | None:
    """The record of the lean call's form (:func:`lean_call_form`) at one suite shape in
    ``dtype``, in one run; None where it was not timed or failed its check."""
    records = run["records"]
    form = lean_call_form(records, shape, dtype)
    r = results.find(records, form, shape, dtype) if form else None
    return r if r and r["status"] == "ok" else None


def ratio_over_rounds(record: dict) -> tuple[float, float]:
    """SDPA's default's time over a kernel's slowest round and over its fastest, from a
    record timed in turns (its ``min_ms`` and ``max_ms``: its rounds' medians): how far
    its "vs SDPA default" moves with the kernel's own spread in that run."""
    return (record["sdpa_default_ms"] / record["max_ms"],
            record["sdpa_default_ms"] / record["min_ms"])


def fastest_kernel(run: dict, shape, dtype: str) -> dict | None:
    """The record of the fastest of the book's kernels at one suite shape in ``dtype``,
    in one run (peers and SDPA left out); None where none was timed there."""
    peers = set(results.peer_labels(run))
    timed = [r for r in results.records_at(run["records"], shape, dtype)
             if r["status"] == "ok" and r["kernel"] not in peers
             and not r["kernel"].startswith("sdpa_")]
    return max(timed, key=lambda r: r["tflops"]) if timed else None


def target_row(target: str, dtype: str, at_least: float, measured: dict) -> dict | None:
    """A target's row (:func:`forward_targets`, :func:`decoding_targets`) from its
    ``measured`` ratios, {shape's label: ratio}: how many reached ``at_least`` ("met",
    "of"), the worst ("worst": its ratio, "at": its label) and those short of it
    ("short": {label: ratio}). None if nothing was."""
    if not measured:
        return None
    worst = min(measured, key=measured.get)
    short = {label: v for label, v in measured.items() if v < at_least}
    return {"target": target, "dtype": dtype, "at least": at_least,
            "met": len(measured) - len(short), "of": len(measured),
            "worst": measured[worst], "at": worst, "short": short}


def forward_targets(run: dict, shapes) -> list[dict]:
    """:data:`FORWARD_TARGETS` in one run over ``shapes`` (:func:`target_row`), a row a
    target and dtype; "bf16 / fp16" is one row, whose dtype reads "both"."""
    rows = []
    for what, applies, measure, at_least in FORWARD_TARGETS:
        both = measure == "bf16 / fp16"
        for dtype in ("bfloat16",) if both else ("float16", "bfloat16"):
            measured = {s.label(): m[measure] for s in shapes if applies(s)
                        and measure in (m := forward_measures(run, s, dtype))}
            rows.append(target_row(what, "both" if both else dtype, at_least, measured))
    return [r for r in rows if r]


def decoding_targets(run: dict) -> list[dict]:
    """The lean call's decoding targets in one run (:func:`target_row`), from chapter 8's
    grouped-query decoding (``measurements["layouts"]["gqa_decoding"]``: one query row a
    head against a cache, through the lean call, SDPA's default timed beside it): no
    slower than SDPA's default; at least 90% of the copy ceiling where K and V hold 0.5 GB
    or more; bf16's time within 5% of fp16's. None where it was not measured."""
    measured = run.get("measurements", {}).get("layouts", {}).get("gqa_decoding", [])

    def label(r):
        return f"B={r['B']} H={r['H']} H_kv={r['H_kv']} S_k={r['S_k']} D={r['D']}"

    rows, lean = [], {}  # lean: (label, dtype) -> the lean call's time
    for r in measured:
        if "lean call" in r["us"]:
            lean[label(r), r["dtype"]] = r["us"]["lean call"]
    for dtype in ("float16", "bfloat16"):
        mine = [r for r in measured if r["dtype"] == dtype and "lean call" in r["us"]]
        rows.append(target_row(
            "decoding: no slower than SDPA default", dtype, 1.0,
            {label(r): r["us"]["SDPA default"] / r["us"]["lean call"] for r in mine
             if "SDPA default" in r["us"]}))
        rows.append(target_row(
            "decoding, 0.5 GB of K and V or more: 90% of the copy ceiling", dtype, 0.9,
            {label(r): r["of_copy"]["lean call"] for r in mine if r["kv_bytes"] >= 0.5e9}))
    rows.append(target_row(
        "decoding: bf16 within 5% of fp16", "both", 0.95,
        {shape: lean[shape, "float16"] / us for (shape, dtype), us in lean.items()
         if dtype == "bfloat16" and (shape, "float16") in lean}))
    return [r for r in rows if r]


def against_flash_attention_4(run: dict) -> list[dict]:
    """The lean call against FlashAttention-4's Hopper kernel in one run
    (``measurements["flash_attention_4"]``: both timed in turns with SDPA's default at
    the suite's shapes, :mod:`kernels.flash_attention_4`): a :func:`target_row` a dtype,
    "at least FlashAttention-4's speed", of the lean call's TFLOPS over FlashAttention-4's.
    Empty where it was not measured, or a path failed its check at every shape."""
    measured = run.get("measurements", {}).get("flash_attention_4", {})
    rows = []
    for dtype in ("float16", "bfloat16"):
        ratios = {}
        for r in measured.get("rows", []):
            t = r["tflops"]
            if r["dtype"] == dtype and t.get("lean call") and t.get("FlashAttention-4"):
                ratios[Shape(**r["shape"]).label()] = t["lean call"] / t["FlashAttention-4"]
        rows.append(target_row("at least FlashAttention-4's speed", dtype, 1.0, ratios))
    return [r for r in rows if r]


def flash_attention_4_line(row: dict) -> str:
    """One :func:`against_flash_attention_4` row as the front page and chapter 10 print it."""
    return (f"{row['dtype']}: the lean call at least FlashAttention-4's speed at {row['met']} "
            f"of {row['of']} shapes; the worst {row['worst']:.3f} at {row['at']}")
