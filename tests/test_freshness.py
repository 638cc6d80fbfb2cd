"""Freshness by meaning, per kernel: on a copy of the package, an edit that changes no
instruction (a docstring, a comment) makes no record stale; a changed setting or a
line inside one step's ``#if`` makes exactly the records of the kernels that use it
stale, and the measurements that declare those kernels."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: run in the copy: the kernels and measurements stale against the committed results
STALE = r"""
import json
from kernels import results
data = results.load(results.results_files()[0])
kernels = {kernel for _, kernel, _ in results.stale_records(data)}
print(json.dumps({"kernels": sorted(kernels),
                  "records": sum(r["kernel"] in kernels for r in data["records"]),
                  "measurements": sorted(results.stale_measured(data, missing=False))}))
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of what the hashes read: the package, the results, pyproject.toml."""
    copy = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "kernels", copy / "kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "results", copy / "results")
    shutil.copy(ROOT / "pyproject.toml", copy)
    return copy


def stale_after(tree: Path, path: str, old: str, new: str, after: str = "") -> dict:
    """What is stale once ``old`` (the first after ``after``) reads ``new`` in the copy's
    ``path``; the file is put back after."""
    file = tree / path
    text = file.read_text()
    start = text.index(after)
    at = text.index(old, start)
    file.write_text(text[:at] + new + text[at + len(old):])
    try:
        proc = subprocess.run([sys.executable, "-c", STALE], cwd=tree, capture_output=True,
                              text=True, env={"PYTHONPATH": str(tree), "FA_BOOK_MODE": "sim",
                                              "PATH": "/usr/bin:/bin"})
    finally:
        file.write_text(text)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


NOTHING = {"kernels": [], "records": 0, "measurements": []}
CH06, CH07 = "kernels/chapters/ch06_mma_attention.py", "kernels/chapters/ch07_hopper_attention.py"
CH09 = "kernels/chapters/ch09_backward_pass.py"


@pytest.mark.parametrize("path, old, new, after", [
    (CH07, "One step of the chapter", "One step of this chapter", "class HopperConfig"),
    (CH06, "What NVRTC is given", "What NVRTC is handed", "def nvrtc_options"),
    (CH07, "// the parity of the phase", "// the phase's parity", "KERNEL_SOURCE = r"),
    (CH06, "// Each PTX instruction the kernel uses", "// Each PTX instruction used",
     "PTX_SOURCE = r"),
    (CH09, "one warp a row, in fp32", "a warp a row, in fp32", "BACKWARD_SOURCE = r"),
    ("kernels/launch.py", "spends\na few microseconds", "spends\nsome microseconds", ""),
    ("kernels/launch.py", "# a tensor that requires a gradient", "# a tensor requiring a gradient",
     "def _plan"),
], ids=["ch7 docstring", "ch6 docstring", "ch7 CUDA comment", "ch6 PTX comment",
        "ch9 CUDA comment", "launch docstring", "launch comment"])
def test_words_make_nothing_stale(tree, path, old, new, after):
    assert stale_after(tree, path, old, new, after) == NOTHING


def test_a_setting_one_kernel_uses_makes_its_records_alone_stale(tree):
    """Chapter 4's fp32 tiles at D = 128 are shared_memory_fp32_tiles' alone; the
    chapter's counters, which count that kernel, go stale with it."""
    stale = stale_after(tree, "kernels/chapters/ch04_shared_memory.py",
                        "128: ThreadTiles(32, 16, 2, 8)", "128: ThreadTiles(32, 16, 2, 4)")
    assert stale["kernels"] == ["shared_memory_fp32_tiles"]
    assert stale["measurements"] == ["shared_memory"]


def test_a_line_inside_one_steps_if_makes_that_steps_records_alone_stale(tree):
    """A line inside ``#if DYNAMIC_ITEMS``: the steps built with the switch on, and the
    measurements that declare them (chapter 7's, and the lean call's, where it
    launches them)."""
    from kernels import measuring_modules
    from kernels.chapters import ch07_hopper_attention as ch07

    stale = stale_after(tree, CH07, "#if DYNAMIC_ITEMS\n",
                        "#if DYNAMIC_ITEMS\n  __shared__ volatile int edited;\n",
                        "KERNEL_SOURCE = r")
    steps = sorted(n for n, cfg in ch07.CONFIGS.items() if cfg.dynamic_items)
    assert stale["kernels"] == steps and "hopper_dynamic_items" in steps
    assert len(steps) < len(ch07.CONFIGS) // 2
    stepped = {id(ch07.KERNELS[n]) for n in steps}
    declaring = sorted(name for name, module in measuring_modules().items()
                       if stepped & {id(x) for x in getattr(module, "MEASURES", ())})
    assert stale["measurements"] == declaring and "hopper_attention" in declaring


def test_the_normal_form_of_python_is_text_not_tokens():
    """Comments and docstrings go by their positions; what is left is the source's own
    text, so Python 3.11 to 3.13 hash alike (kernels.results.code_text)."""
    from kernels.results import code_text
    from kernels.chapters import ch07_hopper_attention as ch07

    text = code_text(ch07.HopperConfig)
    assert "One step of the chapter" not in text and "# keys a K/V tile" not in text
    assert "block_n: int = 128" in text
    assert not re.search(r"\s$", text, re.M)
