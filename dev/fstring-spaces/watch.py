"""When, in a chapter's run, does an f-string start losing its spaces?

Runs a chapter's code cells (tools/run_chapter.py) and, before the first and after each
one, evaluates sentinels: f-strings of the shapes that lost a space on the GPU machine,
some compiled once at the start, some compiled afresh each time, one in a module
imported afresh, and ``kernels.tables._head``, the package's own (it printed
"D=64gain"). The run stops at the first cell after which a sentinel reads otherwise,
and the sentinels' bytecode and constants are printed.
  python3 dev/fstring-spaces/watch.py book/07_hopper_attention.md
"""
import dis
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import run_chapter  # noqa: E402  (matplotlib's Agg backend, the IPython stand-in, CELL)

SENTINELS = {  # name: (source, what it must read)
    "two fields, a space between": ('f"{a} {b}"', "D=64 gain"),
    "a field, a space, a string after": ('(f"at {n} "\n f"calls of few heads")',
                                         "at 15 calls of few heads"),
    "a field, a space, then words": ('(f"faster at {n} "\n f"of {n}")', "faster at 15 of 15"),
    "a field, a space, a plain string after": ('(f"at {n} "\n "shapes; over")',
                                               "at 15 shapes; over"),
    "a space inside the string": ('f"at {n} calls"', "at 15 calls"),
}
VALUES = dict(a="D=64", b="gain", n=15)


def compiled():
    return {name: compile(src, name, "eval") for name, (src, _) in SENTINELS.items()}


AT_START = compiled()


def imported_afresh(check: int) -> str:
    """``f"{a} {b}"`` from a module file imported now (the import's own path: the file
    tokenizer, a .pyc written), under a new name each time."""
    import importlib.util
    import tempfile

    path = Path(tempfile.mkdtemp()) / f"sentinel_{check}.py"
    path.write_text('def head(a, b):\n    return f"{a} {b}"\n')
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.head("D=64", "gain")


CHECKS = [0]


def wrong(when: str) -> list[str]:
    from kernels import tables

    CHECKS[0] += 1
    out = []
    got = imported_afresh(CHECKS[0])
    if got != "D=64 gain":
        out.append(f"{when}: a module imported now: {got!r}")
    for label, codes in (("compiled at the start", AT_START), ("compiled now", compiled())):
        for name, code in codes.items():
            got = eval(code, {}, dict(VALUES))
            if got != SENTINELS[name][1]:
                out.append(f"{when}: {name}, {label}: {got!r}")
    got = tables._head("D=64", "gain")
    if got != "D=64 gain":
        out.append(f"{when}: kernels.tables._head: {got!r}")
    return out


def raw(text: str) -> str:
    """The first 48 bytes of ``text``'s object in memory, in hex (CPython 3.12: reference
    count, type, length, hash, state, then the characters of a compact ASCII string)."""
    import ctypes

    return ctypes.string_at(id(text), 48).hex(" ", 8)


def main(path: str) -> int:
    run_chapter.stand_in_ipython()
    seen = wrong("at the start")
    for lib in ("numpy", "torch", "cupy", "numba.cuda"):
        try:
            __import__(lib)
        except ImportError:
            print(f"{lib}: not installed here")
            continue
        seen = seen or wrong(f"after import {lib}")

    def after_cell(i, code):
        seen.extend(wrong(f"after cell {i} ({code.strip().splitlines()[0][:60]!r})"))
        print(f"=== sentinels {'WRONG' if seen else 'right'} after cell {i}", flush=True)
        return bool(seen)

    if not seen:
        run_chapter.run(path, after_cell)
    for line in seen:
        print(line)
    if seen:
        from kernels import tables

        dis.dis(tables._head)
        for name, code in AT_START.items():
            print(name, [(c, len(c), raw(c)) for c in code.co_consts if isinstance(c, str)])
            dis.dis(code)
        space = chr(32)  # the interpreter's one-character string for a space
        print(f"chr(32): len {len(space)}, {raw(space)}; 'a' + chr(32) + 'b' = "
              f"{'a' + space + 'b'!r}; chr(32).join('ab') = {space.join('ab')!r}")
    print(f"{len(seen)} sentinels wrong" if seen else "every sentinel right to the end")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
