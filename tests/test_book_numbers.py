"""No measured number is typed into the book's prose.

A measurement in the text (a rate, a time, a ratio, a share, a register count the
compiler chose) is glued from the cell that computes it from the recorded results or the
compile report (``kernels.markdown.glue`` and the ``{glue:text}`` role), or printed by a
cell, so that a new recording cannot leave the text saying what the records no longer
say. The scan below finds numbers with a measurement's unit in the prose of every page
(outside code cells, code blocks, inline code, math and glue roles); what it finds must
be one of :data:`ALLOWED`, each with the reason it is not a measurement of this book's
runs: a datasheet fact, a setting of the harness, a target or a checker's tolerance set
before measuring, or a figure quoted from elsewhere and said to be so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parent.parent / "book"

#: a number with a measurement's unit: a rate, a bandwidth, a time, a ratio ("1.59x",
#: "2x faster"), a share ("24%"), or what the compiler reports (registers, stack, spills)
NUMBER = r"(?<![\w.,])\d+(?:,\d{3})*(?:\.\d+)?"
MEASURED = re.compile(
    rf"{NUMBER}(?:-{NUMBER})?\s*(?:TFLOPS|TFLOP/s|GFLOPS|TB/s|GB/s|µs|us|ms)(?![\w/])"
    rf"|{NUMBER}x(?: (?:faster|slower)\b|(?!\w))"
    rf"|{NUMBER}(?:-{NUMBER})?\s*%"
    rf"|{NUMBER} (?:fp32 )?registers\b|{NUMBER} bytes of stack\b|{NUMBER} spilled bytes\b")

#: (page, phrase, reason): numbers the scan finds that are not this book's measurements.
#: The phrase is matched in the page's prose with its whitespace collapsed, and removed
#: before the scan; every entry must still be found (a stale one fails the test).
ALLOWED = [
    # the earlier attempt the book retells: its own figures, on an L4 and an H100, quoted
    # as such in "The journey in brief" (chapter 0), not measured by this book
    ("00_introduction.md", "| PyTorch SDPA (L4) | 45-47 us |", "the earlier attempt's figure"),
    ("00_introduction.md", "(L4) | 2870 us, correct |", "the earlier attempt's figure"),
    ("00_introduction.md", "(L4) | 5259 us |", "the earlier attempt's figure"),
    ("00_introduction.md", "(L4) | 620 us, but NaN |", "the earlier attempt's figure"),
    ("00_introduction.md", "(H100) | 0.45 TFLOPS |", "the earlier attempt's figure"),
    ("00_introduction.md", "(H100) | 6.42 TFLOPS |", "the earlier attempt's figure"),
    ("00_introduction.md", "(L4) | 306 us, wrong |", "the earlier attempt's figure"),
    ("00_introduction.md", "the first version spilled 4160 bytes of stack",
     "the earlier attempt's compiler report"),
    ("00_the_gpu.md", "chapter 0's story of the 4160 spilled bytes",
     "the earlier attempt's compiler report"),
    ("01_naive_attention.md", "(2870 us at S = 512 on an L4", "the earlier attempt's figure"),
    ("02_loop_inversion.md", "(5259 us at S = 512 on an L4)", "the earlier attempt's figure"),
    ("02_loop_inversion.md", "The journey measured 8.5x", "the earlier attempt's figure"),
    ("02_loop_inversion.md", "The journey's 8.5x on an L4", "the earlier attempt's figure"),
    # a paper's figures, cited as the paper's
    ("09_backward_pass.md", "paper reports 316-561 TFLOPS", "FlashAttention-3's paper"),
    # the harness's settings (kernels.bench), not results
    ("00_introduction.md", "repeated for 50 ms", "kernels.bench.SPIN_UP_S, a setting"),
    ("08_in_a_real_model.md", "after a 25 ms sleep", "a test's setting"),
    # datasheet facts
    ("05_tensor_cores.md", "the CUDA cores' 67 TFLOPS", "the H100's datasheet fp32 peak"),
    ("00_the_gpu.md", "An SM has 65,536 registers", "the register file, a datasheet fact"),
    ("00_the_gpu.md", "the 65,536 registers over what", "the register file, a datasheet fact"),
    # a threshold: the ridge point is where the ratio printed above the figure passes 1
    ("00_introduction.md", "above 1x in the line printed", "a ratio of one, not a measurement"),
    # what the chip allows, and what a kernel's own settings give it (setmaxnreg, the
    # accumulators' size): arithmetic, not what the compiler chose
    ("04_shared_memory.md", "would need 64 registers more", "8 x 16 fp32 values, arithmetic"),
    ("06_mma_attention.md", "is 128 fp32 registers a thread", "D = 256 accumulators, arithmetic"),
    ("06_mma_attention.md", "in 128 fp32 registers a thread", "D = 128 accumulators, arithmetic"),
    ("06_mma_attention.md", "fit in the 255 registers a thread", "the hardware's limit"),
    ("04_shared_memory.md", "all but a few of the 255 registers a thread", "the hardware's limit"),
    ("05_tensor_cores.md", "the limit of 255 registers", "the hardware's limit"),
    ("06_mma_attention.md", "column: 255 registers a thread leave room", "the hardware's limit"),
    ("07_hopper_attention.md", "gives the producer 24 registers a thread and the consumers 240",
     "setmaxnreg's budgets, settings"),
    ("hopper_tuning_notes.md", "and the 240 registers a thread of two consumers",
     "setmaxnreg's budget, a setting"),
    ("06_mma_attention.md", "close to the 255 registers a thread", "the hardware's limit"),
    ("07_hopper_attention.md", "has 64 fp32 registers a thread", "accumulators, arithmetic"),
    ("07_hopper_attention.md", "are 128 fp32 registers a thread", "accumulators, arithmetic"),
    ("07_hopper_attention.md", "in the 160 registers a thread", "setmaxnreg's budget, a setting"),
    ("07_hopper_attention.md", "a thread has 160 registers", "setmaxnreg's budget, a setting"),
    ("08_in_a_real_model.md", "'s 128 registers a thread, with 80-key", "accumulators, arithmetic"),
    ("09_backward_pass.md", "kernel's 255 registers a thread", "the hardware's limit"),
    ("10_where_it_stands.md", "consumers of 160 registers each", "setmaxnreg's budget, a setting"),
    ("hopper_tuning_notes.md", "where its 160 registers are all in use",
     "setmaxnreg's budget, a setting"),
    ("hopper_tuning_notes.md", "with 240 registers each", "setmaxnreg's budget, a setting"),
    # the exercises' checkers: how close a reader's prediction must come (kernels.exercises)
    ("01_naive_attention.md", "whether it is within 30% of the recorded", "a checker's tolerance"),
    ("02_loop_inversion.md", "whether it is within 25% of the", "a checker's tolerance"),
    ("03_tiled_online_softmax.md", "within 20% of the recorded ratio", "a checker's tolerance"),
    ("04_shared_memory.md", "whether it is within 30%", "a checker's tolerance"),
    ("05_tensor_cores.md", "whether your prediction is within 30%", "a checker's tolerance"),
    ("06_mma_attention.md", "whether your prediction is within 20%", "a checker's tolerance"),
    ("07_hopper_attention.md", "is within 30% of the recorded ratio", "a checker's tolerance"),
    ("08_in_a_real_model.md", "whether it is within 25% of the recorded", "a checker's tolerance"),
    ("09_backward_pass.md", "whether your prediction is within 30%", "a checker's tolerance"),
    # targets, set before measuring (kernels.targets, the chapters' goals)
    ("04_shared_memory.md", "The chapter's target was 40 TFLOPS at B = 16, H = 16, S = 2048, "
     "D = 64, about 60% of the fp32 peak", "chapter 4's goal: 40 of the 67 TFLOPS fp32 peak"),
    ("04_shared_memory.md", "60% of the peak means an FFMA on 60% of every scheduler's cycles",
     "the reasoning about chapter 4's goal"),
    ("06_mma_attention.md", "at least 300 TFLOPS at the journey's shape; bf16 within 10% of "
     "fp16", "chapter 6's goal"),
    ("hopper_tuning_notes.md", "at least 0.9x of it", "chapter 7's goal"),
    ("09_backward_pass.md", "goal of 0.8x cuDNN's speed", "chapter 9's goal"),
    ("10_where_it_stands.md", "at least 1.05x of it", "kernels.targets.FORWARD_TARGETS"),
    ("10_where_it_stands.md", "within 3% of the fastest", "kernels.targets.FORWARD_TARGETS"),
    ("10_where_it_stands.md", "bf16 within 5% of fp16. Its", "kernels.targets.FORWARD_TARGETS"),
    ("10_where_it_stands.md", "at least 90% of the copy ceiling", "kernels.targets, decoding"),
    ("10_where_it_stands.md", "and bf16 within 5% of fp16. Every", "kernels.targets, decoding"),
    ("10_where_it_stands.md", "the lean call is 5% ahead of cuDNN wherever the table says so",
     "the 1.05x target restated"),
    ("10_where_it_stands.md", "about 90% of the copy ceiling or more wherever",
     "the decoding target restated (the table gives the measured worst)"),
]


def prose(text: str) -> list[tuple[int, str]]:
    """The prose of a MyST page, paragraph by paragraph: (first line, text with its
    whitespace collapsed), without the front matter, code cells and code blocks (any
    fence of backticks or tildes), inline code, glue roles, math or link targets."""
    lines = text.splitlines()
    start = 0
    if lines and lines[0].strip() == "---":  # front matter
        start = next(i for i in range(1, len(lines)) if lines[i].strip() == "---") + 1
    paragraphs, current, first, fence = [], [], 0, None
    for n in range(start, len(lines)):
        stripped = lines[n].strip()
        opening = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is not None:
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = None
            continue
        if opening:
            fence = opening.group(1)
        if opening or not stripped:
            if current:
                paragraphs.append((first, " ".join(current)))
            current = []
            continue
        if not current:
            first = n + 1
        current.append(stripped)
    if current:
        paragraphs.append((first, " ".join(current)))
    return [(line, _words(paragraph)) for line, paragraph in paragraphs]


def _words(paragraph: str) -> str:
    paragraph = re.sub(r"\{[\w:-]+\}`[^`]*`", "", paragraph)  # roles: glue, ref, ...
    paragraph = re.sub(r"`[^`]*`", "", paragraph)  # inline code
    paragraph = re.sub(r"\$\$?[^$]*\$\$?", "", paragraph)  # math
    paragraph = re.sub(r"\]\([^)]*\)", "]", paragraph)  # link targets
    return re.sub(r"\s+", " ", paragraph).strip()


def typed_measurements(text: str, allowed: list[str] = ()) -> tuple[list[str], set[str]]:
    """Numbers with a measurement's unit in a page's prose, as ``line: match: context``,
    once the ``allowed`` phrases are taken out; and the allowed phrases found."""
    found, used = [], set()
    for line, paragraph in prose(text):
        for phrase in allowed:
            if phrase in paragraph:
                used.add(phrase)
                paragraph = paragraph.replace(phrase, " ")
        for m in MEASURED.finditer(paragraph):
            context = paragraph[max(0, m.start() - 60):m.end() + 30]
            found.append(f"{line}: {m.group(0)!r}: ...{context}...")
    return found, used


SYNTHETIC = """---
jupytext: {}
---

# A page

The kernel reaches 312 TFLOPS, 1.59x SDPA's speed, and runs 2x faster
than before, at 81% of the peak with 168 registers.

```{code-cell} ipython3
print("512 TFLOPS", 1.25, "in 3 ms")
```

It takes {glue:text}`ms_taken` ms and `x = 2.5x` in code; $1.5x$ in math.

An allowed datasheet figure: the H100's 3.35 TB/s.
"""


def test_the_scan_finds_typed_measurements_in_prose_only():
    found, used = typed_measurements(SYNTHETIC, ["the H100's 3.35 TB/s"])
    assert [f.split(": ")[1] for f in found] == [
        "'312 TFLOPS'", "'1.59x'", "'2x faster'", "'81%'", "'168 registers'"]
    assert found[0].startswith("7: ")
    assert used == {"the H100's 3.35 TB/s"}
    found, _ = typed_measurements(SYNTHETIC)
    assert "'3.35 TB/s'" in found[-1]


def test_the_scan_reads_across_line_breaks_and_skips_nested_fences():
    text = "Before:\n\n````markdown\n```python\n9 ms\n```\n1 ms\n````\n\nIt ran in\n4.5\nms.\n"
    found, _ = typed_measurements(text)
    assert len(found) == 1 and "'4.5 ms'" in found[0]


PAGES = sorted(BOOK.glob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_measurement_is_typed_into_the_prose(page):
    allowed = [phrase for name, phrase, _ in ALLOWED if name == page.name]
    found, used = typed_measurements(page.read_text(), allowed)
    assert not found, (
        f"{page.name}: numbers typed into the prose that a new recording could make wrong; "
        "glue them from the records (kernels.markdown.glue and {glue:text}), or, where "
        "they are not this book's measurements, add them to ALLOWED with the reason:\n"
        + "\n".join(found))
    assert used == set(allowed), f"{page.name}: ALLOWED phrases not found: " + "; ".join(
        sorted(set(allowed) - used))


def test_every_allowed_phrase_names_a_page_and_a_reason():
    names = {p.name for p in PAGES}
    for page, phrase, reason in ALLOWED:
        assert page in names and phrase and reason, (page, phrase)
        assert MEASURED.search(phrase), f"{page}: {phrase!r} holds no number to allow"


GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([\w.-]+)(?::[^`]*)?`")
GLUE_CALL = re.compile(r"""\bglue\(\s*["']([\w.-]+)["']""")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_glued_number_is_computed_on_its_page(page):
    """A glue role reads a value glued on the same page (MyST-NB reads no other page's):
    each name the prose uses is glued by one of the page's cells, and each is used."""
    text = page.read_text()
    used, glued = set(GLUE_ROLE.findall(text)), set(GLUE_CALL.findall(text))
    assert used <= glued, f"{page.name}: glued nowhere on the page: {sorted(used - glued)}"
    assert glued <= used, f"{page.name}: glued but not used: {sorted(glued - used)}"


def test_the_allowed_targets_of_chapter_10_are_the_ones_checked():
    """The targets chapter 10 states in words (allowed above) are the thresholds
    ``kernels.targets`` checks the records against."""
    from kernels.targets import FORWARD_TARGETS

    stated = {1.05: "at least 1.05x of it", 0.97: "within 3% of the fastest",
              0.95: "bf16 within 5% of fp16"}
    assert set(stated) <= {at_least for *_, at_least in FORWARD_TARGETS}
    text = " ".join(p for _, p in prose((BOOK / "10_where_it_stands.md").read_text()))
    for phrase in stated.values():
        assert phrase in text, phrase


def test_a_missing_record_reads_as_not_recorded():
    """Where the run a page draws on lacks a record, its glued number says so instead of
    failing the page (a GPU's own run may hold fewer records than the book's)."""
    from kernels.markdown import NOT_RECORDED, glue

    assert glue("a_number", None) == NOT_RECORDED
    assert glue("a_number", "28") == "28"
