"""kernels.tables: the chapters' timing tables, on made-up records and on the committed ones."""

import pytest

from kernels import tables
from kernels.bench import SWEEP_S, Shape

SHAPE, OTHER = Shape(16, 16, 2048, 2048, 64), Shape(4, 16, 4096, 4096, 128)


def record(kernel, shape=SHAPE, dtype="float16", ms=1.0, status="ok", sdpa=(2.0, 4.0)):
    """A record of ``kernel`` on ``shape``, with SDPA's flash and default times beside it."""
    r = dict(kernel=kernel, dtype=dtype, status=status, **shape.as_dict(), flops=shape.flops,
             sdpa_flash_ms=sdpa[0], sdpa_default_ms=sdpa[1])
    if status == "ok":
        r.update(median_ms=ms, tflops=shape.flops / ms / 1e9)
    return r


def test_step_rows_read_each_kernel_against_sdpa_beside_it():
    records = [record("a", ms=1.0), record("b", ms=4.0), record("c", status="failed")]
    rows = tables.step_rows(records, ["a", "b", "c"], {"": SHAPE}, labels={"a": "first"})
    assert [r["step"] for r in rows] == ["first", "", ""]
    assert [r["of SDPA flash"] for r in rows] == ["200%", "50%", ""]
    assert rows[2]["TFLOPS"] == ""  # a kernel that failed its check has no speed
    rows = tables.step_rows(records, ["a"], {"x": SHAPE}, sdpa="default")
    assert list(rows[0]) == ["kernel", "x TFLOPS", "x of SDPA default"]
    assert rows[0]["x of SDPA default"] == "400%"


def test_gains_are_against_the_step_built_on():
    records = [record("a", ms=2.0), record("b", ms=1.0), record("a", OTHER, ms=1.0)]
    rows = tables.gain_rows(records, {"b": "a"}, {"small": SHAPE, "large": OTHER})
    assert rows == [{"step": "b", "builds on": "a", "small gain": "+100.0%", "large gain": ""}]


def test_suite_rows_skip_untimed_shapes_and_apply_the_goal():
    records = [record("k", ms=1.0), record("k", dtype="bfloat16", ms=2.0), record("peer", ms=0.5),
               record("k", OTHER, status="failed")]
    rows = tables.suite_rows(records, "k", [SHAPE, OTHER], peers={"Peer": "peer"},
                             goal=lambda shape, flash, default: f"{flash:.1f} {default:.1f}")
    assert len(rows) == 1
    row = rows[0]
    assert row["bf16 / fp16"] == "50%" and row["of flash"] == "200%"
    assert float(row["Peer"]) == 2 * float(row["TFLOPS"])
    assert row["goal"] == "2.0 4.0"
    assert row["bf16 of default"] == ""  # a bf16 record whose SDPA ran in fp16: no ratio


def test_bf16_against_sdpa_only_where_sdpa_ran_in_bf16():
    bf16 = dict(record("k", dtype="bfloat16", ms=2.0, sdpa=(3.0, 5.0)), sdpa_dtype="bfloat16")
    records = [dict(record("k", ms=1.0), sdpa_dtype="float16"), bf16]
    row = tables.suite_rows(records, "k", [SHAPE])[0]
    assert row["bf16 of default"] == "250%" and row["of default"] == "400%"
    assert tables.of_sdpa(records, "k", SHAPE, "flash", "bfloat16") == 1.5
    assert tables.of_sdpa([dict(bf16, sdpa_dtype="float16")], "k", SHAPE, "flash",
                          "bfloat16") is None


def test_scoreboard_takes_sdpa_from_the_kernel_it_names():
    records = [record("k", ms=1.0, sdpa=(2.0, 4.0)), record("j", ms=1.0, sdpa=(9.0, 9.0))]
    board = tables.scoreboard(records, {5: "k", 6: "j"}, [SHAPE], sdpa_from="k")
    label = f"S={SHAPE.S_q}"
    assert [r["kernel"] for r in board] == ["k", "j", "sdpa_flash", "sdpa_default"]
    assert float(board[2][label]) == pytest.approx(SHAPE.flops / 2.0 / 1e9, rel=1e-3)
    assert float(board[3][label]) == pytest.approx(SHAPE.flops / 4.0 / 1e9, rel=1e-3)


def test_a_kernel_whose_two_dtypes_disagree_is_left_out_there_and_said_so():
    records = [record("k", ms=1.0), record("k", dtype="bfloat16", ms=4.0),
               record("k", OTHER, ms=1.0), record("k", OTHER, dtype="bfloat16", ms=1.2)]
    doubtful = tables.dtype_disagreements(records, ["k"], [SHAPE, OTHER])
    assert [(name, shape) for name, shape, *_ in doubtful] == [("k", SHAPE)]
    shown = tables.without(records, doubtful)
    assert tables.tflops_of(shown, "k", SHAPE) is None
    assert tables.tflops_of(shown, "k", SHAPE, "bfloat16") is None
    assert tables.tflops_of(shown, "k", OTHER) == tables.tflops_of(records, "k", OTHER)
    board = tables.scoreboard(shown, {7: "k"}, [SHAPE], sdpa_from="k")
    assert board[0][f"S={SHAPE.S_q}"] == "" and board[1][f"S={SHAPE.S_q}"] != ""  # SDPA kept
    note = tables.disagreement_note(doubtful)
    assert "k at " + SHAPE.label() in note and "1.5x" in note
    assert tables.disagreement_note([]) == ""


def test_live_beside_recorded_shows_only_records_of_the_code_as_it_is():
    import kernels
    from kernels.results import source_hash

    name = "flash_attention_2"
    now = source_hash(kernels.chapter_module(6).KERNELS[name])
    live = [record(name, ms=2.0, sdpa=(2.0, 2.0)), record("sdpa_default", ms=2.0),
            record(name, dtype="bfloat16", ms=2.0), record(name, OTHER, status="error")]
    recorded = {"provenance": {"gpu": "NVIDIA H200"},
                "records": [dict(record(name, ms=1.0), source_hash=now)]}
    text = tables.live_beside_recorded(live, recorded, chapter=6, here="H100 (this GPU)")
    head, _, row, bf16, failed = text.splitlines()
    assert "TFLOPS, H100 (this GPU)" in head and "TFLOPS, H200 (recorded)" in head
    assert "sdpa_default" not in text
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[3]) == pytest.approx(2 * float(cells[2]), rel=0.02)
    assert cells[4] == "100%" and cells[5] == "400%"
    assert "(bfloat16)" in bf16 and failed.split("|")[3].strip().startswith("error")
    recorded["records"][0]["source_hash"] = "changed since"
    text = tables.live_beside_recorded(live, recorded, chapter=6, here="H100 (this GPU)")
    cells = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    assert cells[3] == "" and cells[5] == ""  # a recorded figure of other code: not shown


def test_the_committed_scoreboard_has_every_chapters_kernel():
    import kernels
    from kernels.results import load

    records = load()["records"]
    chapters = {c: name for c, name in kernels.main_kernels().items() if c <= 7}
    board = tables.scoreboard(records, chapters, SWEEP_S, sdpa_from=chapters[7])
    assert [r["kernel"] for r in board] == list(chapters.values()) + ["sdpa_flash", "sdpa_default"]
    journey = f"S={SWEEP_S[-2].S_q}"
    assert all(row[journey] for row in board), board  # every kernel timed at S = 2048


def test_leave_out_finds_every_disagreement_of_the_kernels_asked_about():
    records = [record("k", ms=1.0), record("k", dtype="bfloat16", ms=4.0),
               record("j", ms=1.0), record("j", dtype="bfloat16", ms=4.0),
               record("k", OTHER, ms=1.0), record("k", OTHER, dtype="bfloat16", ms=1.1)]
    shown, note = tables.leave_out_disagreements(records, ["k"])
    assert tables.tflops_of(shown, "k", SHAPE) is None and tables.tflops_of(shown, "j", SHAPE)
    assert tables.tflops_of(shown, "k", OTHER) and "k at" in note and "j at" not in note
    shown, note = tables.leave_out_disagreements(records)  # every kernel timed in bf16
    assert tables.tflops_of(shown, "j", SHAPE) is None and "j at" in note
    assert tables.leave_out_disagreements(records[4:]) == (records[4:], "")
