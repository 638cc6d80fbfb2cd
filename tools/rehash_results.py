"""Re-derive the recorded results' hashes after a change to how kernels.results hashes.

A kernel record's ``source_hash`` names the code that produced it, and a chapter's
recorded measurements carry the hash of its ``measured_sources()`` (which holds the
hashes of the kernels it measures). When the hashing itself changes (what it covers,
not the kernels), each hash is computed again from the code of the commit that recorded
it: in a worktree of that commit, the commit's own hashing must give the stored hash
(the record is that commit's code), and this checkout's ``kernels.results.source_hash``,
run on that commit's code, gives the hash that replaces it. A record whose commit gives
another hash is left as it is and listed. What is then stale under the new hashing,
``kernels.results.stale`` says, as always: a record is fresh only if the code that
recorded it hashes as today's code does.

    .venv/bin/python tools/rehash_results.py results/*.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: run in a worktree of a recorded commit, given this checkout's hashing functions as
#: text (hashing_source): that commit's hashes, by its own hashing and by these, as JSON
AT_COMMIT = r"""
import dataclasses, hashlib, inspect, json, sys
import numpy as np
import kernels
import kernels.results as old
new = {"__name__": "kernels._rehash", "__package__": "kernels", "dataclasses": dataclasses,
       "hashlib": hashlib, "inspect": inspect, "np": np,
       # what a chapter module is, and a kernel's Python function, as that commit says
       "_py_func": old._py_func, "_in_chapter_module": old._in_chapter_module}
exec(sys.argv[1], new)
out = {"kernels": {name: [old.source_hash(fn), new["source_hash"](fn)]
                   for _, name, fn in kernels.all_kernels()}, "measurements": {}}
for name, module in getattr(kernels, "measuring_modules", dict)().items():
    if hasattr(module, "measured_sources"):
        before = old.text_hash(module.measured_sources())
        kept, old.source_hash = old.source_hash, new["source_hash"]  # what they read
        try:
            out["measurements"][name] = [before, old.text_hash(module.measured_sources())]
        finally:
            old.source_hash = kept
print(json.dumps(out))
"""


def hashing_source() -> str:
    """This checkout's hashing of a kernel, as source text to run in an older package."""
    import inspect

    from kernels import results

    return "\n\n".join(inspect.getsource(f) for f in (results.setting_text, results.source_hash))


def hashes_at(commit: str, workdir: Path) -> dict:
    """{"kernels": {name: [old, new]}, "measurements": {name: [old, new]}} at ``commit``."""
    tree = workdir / commit
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree),
                    commit], check=True)
    try:
        proc = subprocess.run([sys.executable, "-c", AT_COMMIT, hashing_source()], cwd=tree,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(tree), "FA_BOOK_MODE": "sim"})
        if proc.returncode != 0:
            raise RuntimeError(f"{commit}: {proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=True)


def commits_of(data: dict) -> tuple[dict, dict]:
    """The commit that recorded each record (by its index) and each measurement."""
    from kernels import CHAPTERS, MEASURED_BY
    from kernels.results import chapter_run

    def commit(run):
        return run["provenance"]["git_commit"]

    runs = data.get("merged_runs", [])
    records = {i: commit(runs[r["merged_run"]] if "merged_run" in r else data)
               for i, r in enumerate(data["records"]) if not r["kernel"].startswith("sdpa_")}
    chapter_of = {name: chapter for chapter, name in CHAPTERS.items()}
    chapter_of.update({name: chapter for chapter, names in MEASURED_BY.items() for name in names})
    measurements = {}
    for name, m in data.get("measurements", {}).items():
        if not isinstance(m, dict) or "source_hash" not in m:
            continue
        own = m.get("provenance", {}).get("git_commit")
        measurements[name] = own or commit(chapter_run(data, chapter_of.get(name)))
    return records, measurements


def rehash(path: Path, workdir: Path, cache: dict) -> list[str]:
    """Re-derive the hashes of one results file in place; what could not be, as lines."""
    data = json.loads(path.read_text())
    records, measurements = commits_of(data)
    for commit in sorted(set(records.values()) | set(measurements.values())):
        if commit not in cache:
            print(f"  hashing the code of {commit[:10]} ...", flush=True)
            cache[commit] = hashes_at(commit, workdir)
    left = []
    for i, commit in records.items():
        r = data["records"][i]
        old, new = cache[commit]["kernels"].get(r["kernel"], (None, None))
        if old == r.get("source_hash"):
            r["source_hash"] = new
        elif new != r.get("source_hash"):
            left.append(f"{path.name}: {r['kernel']}: recorded {r.get('source_hash')}, "
                        f"its commit {commit[:10]} hashes it {old}")
    for name, commit in measurements.items():
        m = data["measurements"][name]
        old, new = cache[commit]["measurements"].get(name, (None, None))
        if old == m["source_hash"]:
            m["source_hash"] = new
        elif new != m["source_hash"]:
            left.append(f"{path.name}: {name}'s measurements: recorded {m['source_hash']}, "
                        f"its commit {commit[:10]} hashes them {old}")
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return sorted(set(left))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    cache: dict = {}
    left = []
    with tempfile.TemporaryDirectory() as workdir:
        for path in args.files:
            print(f"{path}:", flush=True)
            left += rehash(path, Path(workdir), cache)
    for line in left:
        print("not re-derived:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
