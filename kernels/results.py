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

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "results"


def _py_func(obj):
    """The Python function behind a Numba kernel (GPU or simulator) or a function."""
    fn = getattr(obj, "py_func", None) or getattr(obj, "fn", None) or obj
    return fn if inspect.isfunction(fn) else None


def source_hash(fn) -> str:
    """sha256 of a kernel's source and of every function or kernel it calls
    from its own module, followed recursively."""
    seen, parts, todo = set(), [], [fn]
    module = inspect.getmodule(_py_func(fn))
    while todo:
        f = _py_func(todo.pop())
        if f is None or f in seen:
            continue
        seen.add(f)
        parts.append(inspect.getsource(f))
        for name in f.__code__.co_names:
            obj = getattr(module, name, None)
            if obj is not None and _py_func(obj) is not None \
                    and inspect.getmodule(_py_func(obj)) is module:
                todo.append(obj)
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:16]


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def results_files() -> list[Path]:
    return sorted(RESULTS_DIR.glob("*.json"))


def load(path: Path | None = None) -> dict | None:
    """One results file; by default the most recently recorded one (None if none)."""
    if path is None:
        runs = [json.loads(p.read_text()) for p in results_files()]
        if not runs:
            return None
        return max(runs, key=lambda r: r["provenance"]["date"])
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


def provenance_line(results: dict) -> str:
    """One sentence naming what produced a results file."""
    p = results["provenance"]
    return (f"Recorded on an {p['gpu']} (compute capability {p['compute_capability']}, "
            f"driver {p['driver']}, CUDA runtime {p['cuda_runtime']}) on {p['date'][:10]} "
            f"with torch {p['torch']}, cuDNN {p['cudnn']}, numba {p['numba']}, "
            f"numba-cuda {p['numba_cuda']}, CuPy {p['cupy']}; commit {p['git_commit'][:10]}.")


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
