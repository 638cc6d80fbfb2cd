"""Where the GPU machine's Python reads an f-string otherwise than this machine's.

Every f-string of the book's code cells and of the package, tools and tests is parsed,
and the literal parts of each are listed in order. `--write expected.json` writes them as
this machine's Python reads them. `--compare expected.json` reads them again and prints
every f-string whose parts differ. Run the comparison on the GPU machine, under its
Python.

No GPU is needed; the probe needs only the interpreter.
"""
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CELL = re.compile(r"```\{code-cell\} ipython3\n(?::tags: \[[^\]]*\]\n\n)?(.*?)```", re.S)


def sources():
    for md in sorted((ROOT / "book").glob("*.md")):
        for i, code in enumerate(CELL.findall(md.read_text())):
            if not code.lstrip().startswith("%%"):  # %%cuda cells are CUDA C++, not Python
                yield f"{md.relative_to(ROOT)}#cell{i}", code
    for folder in ("kernels", "tools", "tests"):
        for py in sorted((ROOT / folder).rglob("*.py")):
            yield str(py.relative_to(ROOT)), py.read_text()


def fstring_parts(code: str) -> list:
    """[line, [literal parts]] for each f-string, in the order ast.walk meets them."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.JoinedStr):
            out.append([node.lineno, [v.value for v in node.values if isinstance(v, ast.Constant)]])
    return out


#: the lines whose output lost a space on the GPU machine (chapter 7's and chapter 8's
#: live runs, 2026-11-29), with stand-in values, run as code: the parse above may agree
#: where what runs does not
CASES = {
    "ch07 few heads": 'led, rows = 8, [0] * 15\n'
                      'text = (f"at {led} of {len(rows)} "\n'
                      '        f"calls of few heads")',
    "ch07 ahead": 'ahead, over_best = [0] * 21, [0] * 24\n'
                  'text = (f"faster than both at {len(ahead)} of {len(over_best)} "\n'
                  '        "shapes; over the faster of the two:")',
    "ch07 stores": "usage = {'sass': ''}\n"
                   "def opcode_count(sass, op): return 1\n"
                   "text = (f\"memory a thread ({opcode_count(usage['sass'], 'STL')} stores and \"\n"
                   "        f\"{opcode_count(usage['sass'], 'LDL')} loads of it in the code)\")",
    "exercise 7.3": 'keys = 96\n'
                    'text = (f"{keys} keys fit, but {keys + 16} "\n'
                    '        f"do too")',
    "ch08 (printed right)": 'pairs = [0] * 4\n'
                            'text = (f"the time of SDPA\'s default over {len(pairs)} "\n'
                            '        f"shapes and dtypes, ")',
}


def run_cases() -> dict:
    out = {}
    for name, code in CASES.items():
        namespace = {}
        exec(compile(code, name, "exec"), namespace)
        out[name] = namespace["text"]
    return out


def read_all() -> dict:
    return {name: fstring_parts(code) for name, code in sources()} | {"cases": run_cases()}


if __name__ == "__main__":
    mode, path = sys.argv[1], Path(sys.argv[2])
    print(f"Python {sys.version.split()[0]}")
    if mode == "--write":
        path.write_text(json.dumps(read_all(), indent=0) + "\n")
        raise SystemExit
    expected, found = json.loads(path.read_text()), read_all()
    differ = []
    for case, want in expected.pop("cases").items():
        if found["cases"][case] != want:
            differ.append({"where": case, "expected": want, "found": found["cases"][case]})
    for name, parts in expected.items():
        for (line, want), got in zip(parts, found.get(name, [])):
            if want != got[1]:
                differ.append({"where": f"{name}:{line}", "expected": want, "found": got[1]})
    for d in differ:
        print(f"{d['where']}\n  expected {d['expected']}\n  found    {d['found']}")
    print(f"{len(differ)} f-strings read otherwise, of {sum(map(len, expected.values()))}")
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(json.dumps(differ, indent=1) + "\n")
