"""Re-derive the recorded results' hashes after a change to how kernels.results hashes.

A kernel record's ``source_hash`` names the code that produced it, and a chapter's
recorded measurements carry the hash of what its measuring module declares
(``kernels.results.measured_hash``). When the hashing itself changes (what it covers,
not the kernels), each stored hash is re-derived on this checkout's code, with no GPU
time: a record whose stored hash is what the hashing of ``--old`` (a git revision that
hashed the old way; by default the last one before ``measured_hash``) makes of today's
code was fresh before the change, and takes the hash this checkout's hashing makes of
the same code. A record already hashed as today is left as it is; any other is left as
it is and listed: stale before, stale after. A recorded measurement with no hash (from
before every measurement was guarded) takes today's only where ``--guard`` names it:
whoever names it has checked that its code has not changed since it was recorded.

    .venv/bin/python tools/rehash_results.py results/*.json

A change to the code a measurement walks that leaves what it runs on the GPU as it was
(a check on a path the measurement never takes) is carried by hand, reviewed, with the
reason kept in the results file:

    .venv/bin/python tools/rehash_results.py results/*.json --carry models \\
        --because "a branch taken only when out is laid out unlike q; no measurement passes such an out"
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import linecache
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def git(*args) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout


def last_old_revision() -> str:
    """The parent of the first commit whose kernels/results.py has ``measured_hash``."""
    first = git("log", "--format=%H", "--reverse", "-S", "def measured_hash",
                "--", "kernels/results.py").split()
    return git("rev-parse", f"{first[0]}^").strip() if first else "HEAD"


def function_at(rev: str, path: Path, name: str) -> str | None:
    """The source of module-level function ``name`` in ``path`` as of ``rev``."""
    try:
        text = git("show", f"{rev}:{path.relative_to(ROOT).as_posix()}")
    except subprocess.CalledProcessError:
        return None
    node = next((n for n in ast.parse(text).body
                 if isinstance(n, ast.FunctionDef) and n.name == name), None)
    return None if node is None else "\n".join(
        text.splitlines()[node.lineno - 1 - len(node.decorator_list):node.end_lineno])


def imports_at(rev: str, path: Path, package: str) -> dict:
    """The names the module-level imports of ``path`` bound as of ``rev``, where they
    still import today (an old function may use a name its module no longer imports)."""
    try:
        text = git("show", f"{rev}:{path.relative_to(ROOT).as_posix()}")
    except subprocess.CalledProcessError:
        return {}
    space: dict = {"__name__": f"{package}._old_imports", "__package__": package}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            try:
                exec(compile(ast.Module([node], []), "<imports>", "exec"), space)
            except ImportError:
                continue
    return {k: v for k, v in space.items() if not k.startswith("__")}


def old_hashing(rev: str) -> tuple:
    """(kernel hash, {measuring module's name: measurement hash}) of the hashing at
    ``rev``, run on this checkout's code: its kernels.results, and each measuring
    module's ``measured_sources`` (with kernels.launch's ``kernel_sources``) as ``rev``
    wrote them."""
    from kernels import launch, measuring_modules, results

    old = types.ModuleType("kernels._old_results")
    old.__package__, old.__file__ = "kernels", results.__file__
    sys.modules[old.__name__] = old
    exec(compile(git("show", f"{rev}:kernels/results.py"), f"{rev}:kernels/results.py",
                 "exec"), old.__dict__)
    old_launch = types.ModuleType("kernels.launch")  # as the old hashing read it
    old_launch.__dict__.update(vars(launch))
    chooser = function_at(rev, Path(launch.__file__), "kernel_sources")
    if chooser:  # the module with rev's kernel_sources in place of launched
        exec(chooser, old_launch.__dict__)
        text = Path(launch.__file__).read_text()
        node = next(n for n in ast.parse(text).body
                    if isinstance(n, ast.FunctionDef) and n.name == "launched")
        lines = text.splitlines(keepends=True)
        lines[node.lineno - 1:node.end_lineno] = [chooser + "\n"]
        old_launch.__file__ = f"<{rev}: kernels/launch.py>"
        linecache.cache[old_launch.__file__] = (None, None, lines, old_launch.__file__)
    measured = {}
    kept = results.source_hash
    results.source_hash = old.source_hash  # what the old measured_sources read
    try:
        for name, module in measuring_modules().items():
            text = function_at(rev, Path(module.__file__), "measured_sources")
            if text is None:
                continue
            space = {"inspect": inspect, **imports_at(rev, Path(module.__file__), module.__package__),
                     **vars(module), "launch": old_launch}
            exec(text, space)
            measured[name] = old.text_hash(space["measured_sources"]())
    finally:
        results.source_hash = kept
    return old.source_hash, measured


def rehash(path: Path, old_kernel_hash, old_measured: dict, guard=()) -> list[str]:
    """Re-derive the hashes of one results file in place; what could not be, as lines."""
    from kernels import all_kernels, measuring_modules
    from kernels.results import measured_hash, source_hash

    data = json.loads(path.read_text())
    fns = {name: fn for _, name, fn in all_kernels()}
    new = {name: source_hash(fn) for name, fn in fns.items()}
    old: dict = {}
    left = []
    for r in data["records"]:
        name, stored = r["kernel"], r.get("source_hash")
        if name.startswith("sdpa_") or name not in fns or stored == new[name]:
            continue
        if name not in old:
            old[name] = old_kernel_hash(fns[name])
        if stored == old[name]:
            r["source_hash"] = new[name]
        else:
            left.append(f"{path.name}: {name}: recorded {stored}, today's code hashed the "
                        f"old way {old[name]}")
    for name, module in measuring_modules().items():
        m = data.get("measurements", {}).get(name)
        if not isinstance(m, dict) or m.get("status") == "failed":
            continue
        now, stored = measured_hash(module), m.get("source_hash")
        if stored == now:
            continue
        if (stored is None and name in guard) or (stored is not None
                                                  and stored == old_measured.get(name)):
            m["source_hash"] = now
        else:
            left.append(f"{path.name}: {name}'s measurements: recorded {stored}, today's "
                        f"code hashed the old way {old_measured.get(name)}")
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return sorted(set(left))


def carry(path: Path, names, because: str) -> list[str]:
    """Give the named measurement sets of one results file today's hash, where a change
    to the code they walk leaves what they run on the GPU as it was (a host-side check
    on a path they never take, say): reviewed by whoever names them, and said in
    ``because``, which the set keeps under ``carried`` beside the hashes it went from
    and to. Returns the names it could not carry (none recorded, or failed)."""
    from kernels import measuring_modules
    from kernels.results import measured_hash

    if not because.strip():
        raise ValueError("carry: say why what the GPU runs is unchanged (--because)")
    data = json.loads(path.read_text())
    modules, missing = measuring_modules(), []
    for name in names:
        m = data.get("measurements", {}).get(name)
        if name not in modules or not isinstance(m, dict) or m.get("status") == "failed":
            missing.append(name)
            continue
        now = measured_hash(modules[name])
        if m.get("source_hash") != now:
            m.setdefault("carried", []).append(
                {"from": m.get("source_hash"), "to": now, "because": because.strip()})
            m["source_hash"] = now
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--old", help="a revision that hashed the old way (default: the last "
                                  "one before kernels.results.measured_hash)")
    ap.add_argument("--guard", nargs="*", default=(),
                    help="measurements recorded without a hash that take today's")
    ap.add_argument("--carry", nargs="+", metavar="NAME",
                    help="instead: measurement sets whose GPU work a change left as it was, "
                         "carried to today's hash (with --because)")
    ap.add_argument("--because", default="", help="why what the GPU runs is unchanged")
    args = ap.parse_args(argv)
    if args.carry:
        missing = [f"{path.name}: {name}" for path in args.files
                   for name in carry(path, args.carry, args.because)]
        for line in missing:
            print("not carried (not recorded there):", line)
        return 1 if missing else 0
    rev = args.old or last_old_revision()
    print(f"the old hashing: {rev[:10]}'s", flush=True)
    kernel_hash, measured = old_hashing(rev)
    left = []
    for path in args.files:
        print(f"{path}:", flush=True)
        left += rehash(path, kernel_hash, measured, args.guard)
    for line in left:
        print("not re-derived:", line)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
