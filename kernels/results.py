"""Recorded GPU results: where they live, what they say, whether they are fresh.

``results/<gpu>.json`` holds one run of ``python -m kernels.record`` on a GPU:
its provenance (GPU, driver, library versions, date, git commit), the chip's
measured ceilings, and one record per kernel and shape. Each kernel record
carries a hash of the kernel's source; :func:`stale` lists the records whose
kernel has changed since, and a test fails while any is.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from pathlib import Path

from .mode import device_name

ROOT = Path(__file__).resolve().parent.parent
#: the repository's results/, or, installed without the repository, the copy that
#: travels in the package (kernels/recorded, see pyproject.toml)
RESULTS_DIR = (ROOT / "results" if (ROOT / "pyproject.toml").is_file()
               else Path(__file__).parent / "recorded")


def _py_func(obj):
    """The Python function behind a Numba kernel (GPU or simulator) or a function."""
    fn = getattr(obj, "py_func", None) or getattr(obj, "fn", None) or obj
    if callable(fn):
        fn = inspect.unwrap(fn)  # a cached kernel factory
    return fn if inspect.isfunction(fn) else None


def _in_chapter_module(f) -> bool:
    from . import CHAPTERS, chapter_module_name

    return f.__module__ in {chapter_module_name(n) for n in CHAPTERS}


def source_hash(fn) -> str:
    """sha256 of a kernel's source and of every function, kernel or kernel
    factory of a chapter module that it calls, followed recursively, with the
    CUDA C++ sources (module-level strings) those functions name, and the
    settings a chapter module lists in ``HASHED_SETTINGS`` (the harness it calls
    is left out: its changes do not change what a kernel computes)."""
    seen, parts, todo = set(), [], [fn]
    while todo:
        f = _py_func(todo.pop())
        if f is None or f in seen:
            continue
        seen.add(f)
        parts.append(inspect.getsource(f))
        names = list(f.__code__.co_names) + list(f.__code__.co_freevars)
        for const in f.__code__.co_consts:  # functions defined inside a factory
            if inspect.iscode(const):
                names += list(const.co_names)
        for name in names:
            obj = f.__globals__.get(name)
            g = _py_func(obj) if obj is not None else None
            if g is not None and _in_chapter_module(g):
                todo.append(obj)
            elif _in_chapter_module(f) and (name, id(obj)) not in seen and (
                    isinstance(obj, str)
                    or name in f.__globals__.get("HASHED_SETTINGS", ())):
                seen.add((name, id(obj)))
                parts.append(f"{name} = {obj!r}")
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:16]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stale_measurements(results: dict) -> list[str]:
    """Chapters' recorded measurements whose code (the chapter's ``measured_sources()``)
    changed after they were recorded."""
    from . import measuring_modules

    out = []
    for name, module in measuring_modules().items():
        if not hasattr(module, "measured_sources"):
            continue
        recorded = results.get("measurements", {}).get(name)
        now = text_hash(module.measured_sources())
        if recorded is None:
            out.append(f"{name}: measurements not recorded")
        elif recorded.get("source_hash") != now:
            out.append(f"{name}'s measurements: recorded {recorded.get('source_hash')}, "
                       f"code now {now}")
    return out


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def results_files() -> list[Path]:
    return sorted(RESULTS_DIR.glob("*.json"))


def load(path: Path | None = None, gpu: str | None = None) -> dict | None:
    """One results file; by default the one recorded on ``gpu`` (the GPU at hand,
    where there is one) if there is such a file, else the most recently recorded one
    (None if none). Every chapter prints the provenance of what it shows."""
    if path is None:
        runs = [json.loads(p.read_text()) for p in results_files()]
        if not runs:
            return None
        gpu = gpu or device_name()
        mine = [r for r in runs if gpu and gpu_slug(r["provenance"]["gpu"]) == gpu_slug(gpu)]
        return max(mine or runs, key=lambda r: r["provenance"]["date"])
    return json.loads(Path(path).read_text())


def save(results: dict, path: str | Path | None = None) -> Path:
    """Write a results file; by default ``results/<gpu>.json``."""
    if path is None:
        RESULTS_DIR.mkdir(exist_ok=True)
        path = RESULTS_DIR / f"{gpu_slug(results['provenance']['gpu'])}.json"
    path = Path(path)
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return path


def stale(results: dict) -> list[str]:
    """Kernel records whose kernel's source no longer matches the recorded hash."""
    from . import all_kernels

    current = {name: source_hash(fn) for _, name, fn in all_kernels()}
    out = []
    for rec in results["records"]:
        if rec["kernel"].startswith("sdpa_"):
            continue
        now = current.get(rec["kernel"])
        if now is None:
            out.append(f"{rec['kernel']}: no such kernel any more")
        elif now != rec.get("source_hash"):
            out.append(f"{rec['kernel']}: recorded {rec.get('source_hash')}, source now {now}")
    return sorted(set(out))


def chapter_run(results: dict, chapter: int | None = None) -> dict:
    """The run that recorded ``chapter`` (its provenance, tests, ceilings): the last
    merged run that holds it, else the file's own run."""
    run = results
    for merged in results.get("merged_runs", []):
        if chapter in merged["chapters"]:
            run = merged
    return run


def provenance_line(results: dict, chapter: int | None = None) -> str:
    """One sentence naming what produced a results file (or, with ``chapter``,
    the run that recorded that chapter, when it was merged in later)."""
    p = chapter_run(results, chapter)["provenance"]
    return (f"Recorded on an {p['gpu']} (compute capability {p['compute_capability']}, "
            f"driver {p['driver']}, CUDA runtime {p['cuda_runtime']}) on {p['date'][:10]} "
            f"with torch {p['torch']}, cuDNN {p['cudnn']}, numba {p['numba']}, "
            f"numba-cuda {p['numba_cuda']}, CuPy {p['cupy']}; commit {p['git_commit'][:10]}.")


def sdpa_tflops(record: dict, backend: str) -> float | None:
    """TFLOPS of SDPA's ``backend`` ("flash" or "default") on a kernel record's shape,
    from the time measured beside that kernel in its run (None if none was)."""
    ms = record.get(f"sdpa_{backend}_ms")
    return record["flops"] / ms / 1e9 if ms else None


def shape_label(B, H, S_q, S_k, D, causal=False) -> str:
    """A shape as the book writes it: "B=1 H=8 S=512 D=64", "S_q=1 S_k=8192" where
    they differ, "causal" where it is."""
    s = f"S={S_q}" if S_q == S_k else f"S_q={S_q} S_k={S_k}"
    return f"B={B} H={H} {s} D={D}" + (" causal" if causal else "")


def table(records, columns, headers=None) -> str:
    """Records as a Markdown table (for chapters' ``display(Markdown(...))``)."""
    headers = headers or columns
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in records:
        cells = []
        for c in columns:
            v = r.get(c) if isinstance(c, str) else c(r)
            if isinstance(v, float):
                v = f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
            cells.append("" if v is None else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def show(markdown: str) -> None:
    """Show Markdown: rendered in a notebook, printed as text anywhere else."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(markdown)
    else:
        display(Markdown(markdown))


def show_table(records, columns=None, headers=None) -> None:
    """Show records as a table (:func:`table`); by default every column any record
    has, in the order first seen."""
    records = list(records)
    if not records:
        print("(nothing to show)")
        return
    show(table(records, columns or list(dict.fromkeys(c for r in records for c in r)), headers))


def faster_or_slower(time: float, than: float, within: float = 0.02, *,
                     compared_with: str | None = None) -> str:
    """How a time compares with another, in words: "1.25x faster", "1.10x slower", or
    "as fast" where they are ``within`` that fraction of each other; with
    ``compared_with``, the comparison's other side too: "1.25x faster than SDPA",
    "as fast as SDPA"."""
    if abs(time - than) <= within * than:
        return "as fast" + (f" as {compared_with}" if compared_with else "")
    words = f"{than / time:.2f}x faster" if time < than else f"{time / than:.2f}x slower"
    return words + (f" than {compared_with}" if compared_with else "")


def beside(runs: dict, key, values) -> list[dict]:
    """Rows of several runs side by side: ``runs`` is {label: rows}; rows with equal
    ``key`` columns (a name or a list of names) become one row, in the order first
    seen, holding each of ``values`` once per run as ``"<value> on <label>"`` (empty
    where a run lacks the row)."""
    keys = [key] if isinstance(key, str) else list(key)
    merged: dict = {}
    for label, rows in runs.items():
        for row in rows:
            out = merged.setdefault(tuple(row[k] for k in keys), {k: row[k] for k in keys})
            for value in values:
                out[f"{value} on {label}"] = row.get(value)
    columns = keys + [f"{value} on {label}" for value in values for label in runs]
    return [{c: row.get(c) for c in columns} for row in merged.values()]


def recorded_label(results: dict, chapter: int | None = None) -> str:
    """The GPU of the run that recorded ``chapter``, short, to head its column beside
    a live one: "H200 (recorded)" (:func:`kernels.gpus.live_label` heads the other)."""
    return f"{short_gpu_name(chapter_run(results, chapter)['provenance']['gpu'])} (recorded)"


def short_gpu_name(name: str) -> str:
    """A GPU's name without its vendor: "NVIDIA H100 80GB HBM3" -> "H100 80GB HBM3"."""
    return re.sub(r"^(NVIDIA|Tesla)\s+", "", name).strip() or name


#: why warps did not issue, as Nsight Compute names the reasons
STALL_REASONS = {"long_scoreboard": "waiting for a global load",
                 "short_scoreboard": "waiting for shared memory or a special function",
                 "barrier": "waiting at a barrier",
                 "not_selected": "ready, another warp issued",
                 "wait": "fixed-latency dependency", "math_pipe_throttle": "its execution pipe busy",
                 "mio_throttle": "shared-memory queue full"}


def stall_counters(reasons) -> dict:
    """{metric: label} for Nsight Compute's average stall cycles per issued
    instruction, for each of ``reasons`` (keys of STALL_REASONS, or "gmma")."""
    labels = dict(STALL_REASONS, gmma="waiting for a wgmma to finish")
    return {f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": f"{r} ({labels[r]})"
            for r in reasons}


def largest_launch(counted: dict) -> dict:
    """The launch of a profiled kernel (``ncu_counts``' answer for one kernel) that
    executed the most instructions: the attention kernel, where a call launches more."""
    return max(counted["launches"], key=lambda x: x.get("smsp__inst_executed.sum") or 0)


def counter_rows(runs, labels: dict) -> list[dict]:
    """Nsight Compute's counts (``record.ncu_counts`` answers, one a shape) as table
    rows: one a shape and kernel, one column a counter of ``labels`` ({metric: label}).
    A kernel of several launches is read at its largest launch (most instructions)."""
    rows = []
    for run in runs:
        shape = shape_label(**run["shape"]) if "shape" in run else ""
        for name, k in run.get("kernels", {}).items():
            if k.get("status") != "ok" or not k["launches"]:
                rows.append({"shape": shape, "kernel": name, "status": k.get("status")})
                continue
            launch = largest_launch(k)
            row = {"shape": shape, "kernel": name}
            for metric, label in labels.items():
                v = launch.get(metric)
                if v is not None:  # a counter this launch lacks is left blank
                    row[label] = (f"{v:,.0f}" if metric.endswith(".sum") else
                                  f"{v:.2f}" if metric.endswith(".ratio") else f"{v:.0f}")
            rows.append(row)
    return rows


def find(records, kernel: str, shape, dtype: str = "float16") -> dict | None:
    """The record of ``kernel`` on ``shape`` (a :class:`kernels.bench.Shape`) in
    ``dtype``, if any."""
    key = (shape.B, shape.H, shape.S_q, shape.S_k, shape.D, shape.causal)
    return next((r for r in records if r["kernel"] == kernel
                 and r.get("dtype", "float16") == dtype and
                 (r["B"], r["H"], r["S_q"], r["S_k"], r["D"], r["causal"]) == key), None)


def speedup(records, slow: str, fast: str, shape) -> float | None:
    """How many times faster ``fast`` ran than ``slow`` on ``shape`` (None unless
    both were timed there)."""
    a, b = find(records, slow, shape), find(records, fast, shape)
    if a and b and a["status"] == b["status"] == "ok":
        return a["median_ms"] / b["median_ms"]
    return None


def timing_table(records, shapes, kernels, sdpa=("sdpa_default", "sdpa_flash")) -> str:
    """Markdown table of the kernels' and SDPA's records on the given shapes."""
    rows = [r for s in shapes for name in list(kernels) + list(sdpa)
            if (r := find(records, name, s)) is not None]

    def shape(r):
        s = f"{r['S_q']}" if r["S_q"] == r["S_k"] else f"{r['S_q']}/{r['S_k']}"
        return f"{r['B']}x{r['H']}x{s}x{r['D']}" + (" causal" if r["causal"] else "")

    cols = ["kernel", shape, "status", "median_ms", "tflops",
            lambda r: (f"{r['median_ms'] / r['sdpa_default_ms']:.1f}x"
                       if r.get("sdpa_default_ms") and r.get("median_ms") else ""),
            lambda r: f"{r['rel_err']:.1e}" if "rel_err" in r else ""]
    heads = ["kernel", "B x H x S x D", "status", "median ms", "TFLOPS",
             "time / SDPA default", "rel err"]
    return table(rows, cols, heads)
