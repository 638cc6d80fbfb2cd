"""The helpers chapters read recorded results with."""

import pytest

from kernels import results


def test_speedup_needs_both_kernels_timed_on_the_shape():
    from kernels.bench import Shape

    shape, other = Shape(1, 2, 64, 64, 16), Shape(1, 2, 64, 64, 16, causal=True)
    base = dict(B=1, H=2, S_q=64, S_k=64, D=16, causal=False)
    records = [dict(base, kernel="slow", status="ok", median_ms=6.0),
               dict(base, kernel="fast", status="ok", median_ms=2.0),
               dict(base, kernel="failed", status="failed")]
    assert results.speedup(records, "slow", "fast", shape) == 3.0
    assert results.speedup(records, "fast", "slow", shape) == 1 / 3
    assert results.speedup(records, "slow", "failed", shape) is None
    assert results.speedup(records, "slow", "fast", other) is None


def test_load_prefers_the_gpu_at_hand_then_the_books_then_the_newest(tmp_path, monkeypatch):
    import json

    def write(gpu, date):
        (tmp_path / f"{results.gpu_slug(gpu)}.json").write_text(
            json.dumps({"provenance": {"gpu": gpu, "date": date}}))

    write("NVIDIA H200", "2026-11-20")
    write("NVIDIA H100 80GB HBM3", "2026-11-23")
    write("NVIDIA A100-SXM4-80GB", "2026-11-22")
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    assert results.load(gpu="NVIDIA H100 80GB HBM3")["provenance"]["gpu"].startswith("NVIDIA H100")
    assert results.load(gpu="NVIDIA L4")["provenance"]["gpu"] == "NVIDIA H100 80GB HBM3"  # newest
    monkeypatch.setattr(results, "device_name", lambda: None)
    assert results.BOOK_GPU == "NVIDIA H200"
    assert results.load()["provenance"]["gpu"] == "NVIDIA H200"  # the book's, though older
    (tmp_path / "nvidia-h200.json").unlink()
    assert results.load()["provenance"]["gpu"] == "NVIDIA H100 80GB HBM3"


def test_a_recording_takes_the_test_summary_from_a_saved_gpu_run(tmp_path):
    from kernels.record import tests_from_log

    log = tmp_path / "pytest.log"
    log.write_text("....  [100%]\n=== warnings summary ===\n1253 passed, 123 skipped in 243.29s\n")
    assert tests_from_log(log) == dict(summary="1253 passed, 123 skipped in 243.29s", returncode=0,
                                       note="run by an earlier call on the same commit (pytest.log)")
    log.write_text("F.\n==== 1 failed, 12 passed in 3.0s ====\n")
    assert tests_from_log(log)["returncode"] == 1  # and a recording then stops
    log.write_text("collecting ...\n")
    with pytest.raises(ValueError, match="no pytest summary"):
        tests_from_log(log)


def test_a_merge_drops_every_old_record_of_the_chapters_it_records():
    """A kernel a chapter no longer has leaves no record behind (it would be stale)."""
    from kernels.record import recorded_elsewhere

    old = [dict(kernel="gone", chapter=7), dict(kernel="kept", chapter=6),
           dict(kernel="renamed", chapter=8), dict(kernel="sdpa_default", chapter=0)]
    assert recorded_elsewhere(old, [7, 8], {"kept"}) == [dict(kernel="sdpa_default", chapter=0)]
    assert recorded_elsewhere(old, [7], set()) == old[1:]


def test_a_merged_recording_keeps_its_timings_when_its_measurements_do_not_finish(
        tmp_path, monkeypatch):
    """A call past its time limit, killed in a chapter's measurements, leaves the file
    with the chapter's new timings merged in, the old file's other records and runs kept;
    a recording that finishes merges into the old file once."""
    import json

    from kernels import record

    name = next(n for c, n, _ in record.all_kernels() if c == 7)
    old = {"provenance": {"gpu": "G"}, "tests": {}, "ceilings": {}, "seconds": 1,
           "profile": {}, "merged_runs": [],
           "records": [dict(kernel=name, chapter=7, status="ok", tflops=1.0),
                       dict(kernel="kept", chapter=6, status="ok", tflops=2.0)]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(old))
    monkeypatch.setattr(record, "MODE", "gpu")
    monkeypatch.setattr(record, "provenance", lambda: {"gpu": "G", "driver": "d"})
    monkeypatch.setattr(record, "ceilings", lambda: {"copy_tb_s": 1.0, "matmul_tflops": 1.0})
    monkeypatch.setattr(record, "run_suite", lambda kernels, shapes, **kw: [
        dict(kernel=name, chapter=7, status="ok", tflops=3.0, causal=False, B=1, H=1, S_q=1,
             D=64, median_ms=1.0)])

    def killed(chapters, only=None):
        raise KeyboardInterrupt  # as a call's time limit stops it

    monkeypatch.setattr(record, "measurements", killed)
    argv = ["--chapters", "7", "--merge", str(path), "--out", str(path), "--skip-tests",
            "--no-profile"]
    with pytest.raises(KeyboardInterrupt):
        record.main(argv)
    saved = json.loads(path.read_text())
    assert {(r["kernel"], r["tflops"]) for r in saved["records"]} == {(name, 3.0), ("kept", 2.0)}
    assert len(saved["merged_runs"]) == 1
    monkeypatch.setattr(record, "measurements", lambda chapters, only=None: {})
    path.write_text(json.dumps(old))
    assert record.main(argv) == 0
    assert len(json.loads(path.read_text())["merged_runs"]) == 1


def test_a_recording_split_by_head_dim_keeps_each_calls_records(tmp_path, monkeypatch):
    """Two calls, --head-dims 64 then 128: each times its head dim's shapes alone and
    replaces only its head dim's records; the file ends with both, each naming its run,
    and the records of other chapters as they were."""
    import json

    from kernels import record

    name = next(n for c, n, _ in record.all_kernels() if c == 7)
    old = {"provenance": {"gpu": "G"}, "tests": {}, "ceilings": {}, "seconds": 1,
           "profile": {}, "merged_runs": [],
           "records": [dict(kernel=name, chapter=7, status="ok", tflops=1.0, D=64),
                       dict(kernel=name, chapter=7, status="ok", tflops=1.0, D=128),
                       dict(kernel="kept", chapter=6, status="ok", tflops=2.0, D=64)]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(old))
    monkeypatch.setattr(record, "MODE", "gpu")
    monkeypatch.setattr(record, "provenance", lambda: {"gpu": "G", "driver": "d"})
    monkeypatch.setattr(record, "ceilings", lambda: {"copy_tb_s": 1.0, "matmul_tflops": 1.0})
    monkeypatch.setattr(record, "measurements", lambda chapters, only=None: {})
    timed = []

    def suite(kernels, shapes, **kw):
        timed.append({s.D for s in shapes})
        return [dict(kernel=name, chapter=7, status="ok", tflops=float(s.D), causal=False,
                     B=1, H=1, S_q=1, D=s.D, median_ms=1.0) for s in shapes[:1]]

    monkeypatch.setattr(record, "run_suite", suite)
    common = ["--chapters", "7", "--merge", str(path), "--out", str(path), "--skip-tests",
              "--no-profile"]
    assert record.main(common + ["--head-dims", "64"]) == 0
    assert record.main(common + ["--head-dims", "128"]) == 0
    assert timed == [{64}, {128}]
    saved = json.loads(path.read_text())
    assert sorted((r["kernel"], r["D"], r["tflops"], r.get("merged_run")) for r in saved["records"]) \
        == sorted([(name, 64, 64.0, 0), (name, 128, 128.0, 1), ("kept", 64, 2.0, None)])
    assert [run["head_dims"] for run in saved["merged_runs"]] == [[64], [128]]
    with pytest.raises(SystemExit):  # the other head dims' records must come from a file
        record.main(["--chapters", "7", "--head-dims", "64", "--skip-tests"])


def test_side_by_side_puts_each_runs_values_next_to_each_other():
    runs = {"H100 (this GPU)": [dict(shape="a", ms=1.0, other=9), dict(shape="b", ms=2.0)],
            "H200 (recorded)": [dict(shape="b", ms=3.0), dict(shape="c", ms=4.0)]}
    rows = results.side_by_side(runs, "shape", ["ms"])
    assert rows == [{"shape": "a", "ms on H100 (this GPU)": 1.0, "ms on H200 (recorded)": None},
                    {"shape": "b", "ms on H100 (this GPU)": 2.0, "ms on H200 (recorded)": 3.0},
                    {"shape": "c", "ms on H100 (this GPU)": None, "ms on H200 (recorded)": 4.0}]
    two = results.side_by_side({"x": [dict(B=1, S=2, t=5)]}, ["B", "S"], ["t"])
    assert two == [{"B": 1, "S": 2, "t on x": 5}]
    assert "|  |" in results.table(rows, list(rows[0]))  # a run without the row: blank


def test_show_table_prints_every_column_without_a_notebook(capsys):
    results.show_table([dict(a=1), dict(a=2, b="x")])
    assert capsys.readouterr().out.splitlines() == ["| a | b |", "|---|---|", "| 1 |  |", "| 2 | x |"]
    results.show_table([])
    assert capsys.readouterr().out == "(nothing to show)\n"
    results.show("**bold**")
    assert capsys.readouterr().out == "**bold**\n"


def test_value_ranges_and_counts_in_words():
    assert results.value_range([0.983, 0.9521, 0.97]) == "0.952-0.983x"
    assert results.value_range([0.9791, 0.9789]) == "0.979x"
    assert results.value_range([0.93, 0.925], ".0%", "") == "92%-93%"
    assert results.counted(1, "shape") == "1 shape"
    assert results.counted(4, "shape and dtype", "shapes and dtypes") == "4 shapes and dtypes"


def test_faster_or_slower_in_words():
    assert results.faster_or_slower(1.0, 2.0) == "2.00x faster"
    assert results.faster_or_slower(3.0, 2.0) == "1.50x slower"
    assert results.faster_or_slower(1.01, 1.0) == "as fast"
    assert results.faster_or_slower(1.0, 1.25, compared_with="SDPA") == "1.25x faster than SDPA"
    assert results.faster_or_slower(1.0, 1.0, compared_with="SDPA") == "as fast as SDPA"


def test_labels_name_the_gpu_and_the_run():
    assert results.short_gpu_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"
    assert results.short_gpu_name("Tesla T4") == "T4"
    data = {"provenance": {"gpu": "NVIDIA H200"},
            "merged_runs": [{"chapters": [8], "provenance": {"gpu": "NVIDIA H100 80GB HBM3"}}]}
    assert results.recorded_label(data) == "H200 (recorded)"
    assert results.recorded_label(data, 8) == "H100 80GB HBM3 (recorded)"


def test_a_recording_gives_a_measuring_module_a_progress_line_printer(monkeypatch, capsys):
    """gpu_measurements(progress=...) is handed one; a module's without it is called as
    before."""
    import types

    from kernels import record

    def with_progress(progress=None):
        progress("stage one")
        return {"value": 1}

    modules = {"new": types.SimpleNamespace(gpu_measurements=with_progress),
               "old": types.SimpleNamespace(gpu_measurements=lambda: {"value": 2})}
    monkeypatch.setattr(record, "measuring_modules", lambda chapters: modules)
    measured = record.measurements([8])
    assert all(len(m.pop("source_hash")) == 16 for m in measured.values())  # each guarded
    assert measured == {"new": {"value": 1}, "old": {"value": 2}}
    assert "  stage one\n" in capsys.readouterr().out
    assert record.measurements([8], only=["old"])["old"]["value"] == 2
    with pytest.raises(ValueError, match="no measurements named .'missing'."):
        record.measurements([8], only=["missing"])


def test_the_gpu_suite_runs_in_xdist_workers_where_xdist_is_installed(monkeypatch):
    import importlib.util

    from kernels import record

    found = {"xdist": object()}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: found.get(name))
    monkeypatch.setattr(record.os, "cpu_count", lambda: 16)
    command = record.pytest_command()
    assert command[command.index("-n") + 1] == str(record.TEST_WORKERS)
    assert command[-3:] == ["-m", "not recorded_results", "tests"]
    monkeypatch.setattr(record.os, "cpu_count", lambda: 4)
    command = record.pytest_command()
    assert command[command.index("-n") + 1] == "4"
    found.clear()  # no xdist: one process
    assert "-n" not in record.pytest_command()


def test_a_kernels_hash_follows_its_launch_into_the_chapters_cuda(monkeypatch):
    """A step made by the harness's kernel_function is hashed with the chapter's launch
    function it closes over, and the CUDA C++ that reaches: a changed source shows, a
    comment or a blank line added does not."""
    import kernels.chapters.ch07_hopper_attention as chapter
    from kernels.results import source_hash

    fn = chapter.KERNELS["hopper_attention"]
    before = source_hash(fn)
    monkeypatch.setattr(chapter, "KERNEL_SOURCE", chapter.KERNEL_SOURCE + "\n\n// edited")
    assert source_hash(fn) == before
    monkeypatch.setattr(chapter, "KERNEL_SOURCE", chapter.KERNEL_SOURCE + "\n__device__ int x;")
    assert source_hash(fn) != before


def test_a_kernels_hash_covers_its_configuration(monkeypatch):
    """A step's settings (its entry in the chapter's table of configurations, or a
    Numba chapter's tile sizes) change what it computes and how fast: a changed
    setting shows, as a changed source does."""
    import dataclasses

    import kernels.chapters.ch04_shared_memory as ch04
    import kernels.chapters.ch07_hopper_attention as ch07
    from kernels.results import source_hash

    fn = ch07.KERNELS["hopper_attention"]
    before = source_hash(fn)
    cfg = ch07.CONFIGS["hopper_attention"]
    narrower = dataclasses.replace(cfg, at_d128=(("block_n", cfg.at(128).block_n - 16),))
    monkeypatch.setitem(ch07.CONFIGS, "hopper_attention", narrower)
    assert source_hash(fn) != before
    monkeypatch.undo()
    assert source_hash(fn) == before
    name, numba_fn = next(iter(ch04.KERNELS.items()))
    before = source_hash(numba_fn)
    monkeypatch.setattr(ch04, "THREAD_TILES", {**ch04.THREAD_TILES, "added": (9, 9)})
    assert source_hash(numba_fn) != before, name


def test_a_kernels_hash_leaves_out_caches_and_reads_sets_in_order(monkeypatch):
    """What a launch caches (the tensor maps) is no setting, and a set's order, which
    changes from process to process, does not change a hash."""
    import kernels.chapters.ch07_hopper_attention as ch07
    from kernels.results import setting_text, source_hash

    fn = ch07.KERNELS["hopper_attention"]
    before = source_hash(fn)
    monkeypatch.setitem(ch07._MAPS, ("a", "cached", "map"), object())
    assert source_hash(fn) == before
    assert setting_text(frozenset({"b", "a", "c"}), set()) == "{'a', 'b', 'c'}"
    assert setting_text({"x": (1,), "y": [2.5, None]}, set()) == "{'x': (1,), 'y': [2.5, None]}"
    assert setting_text({"f": print}, set()) is None


def _rehash_tool():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "tools" / "rehash_results.py"
    spec = importlib.util.spec_from_file_location("rehash_results", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rehashing_replaces_a_hash_only_where_the_old_hashing_gave_it(tmp_path):
    """tools/rehash_results.py: a record whose stored hash is what the old hashing makes
    of today's code takes today's hash; one already hashed as today is kept; any other is
    left, and said; a measurement recorded without a hash takes today's only when named."""
    import json

    from kernels import all_kernels, measuring_modules
    from kernels.results import measured_hash, source_hash

    tool = _rehash_tool()
    (_, k1, f1), (_, k2, f2), (_, k3, _) = list(all_kernels())[:3]
    data = {"records": [{"kernel": k1, "source_hash": "old1"},
                        {"kernel": k2, "source_hash": source_hash(f2)},
                        {"kernel": k3, "source_hash": "other"},
                        {"kernel": "sdpa_default", "source_hash": "none"}],
            "measurements": {"models": {"source_hash": "mold"}, "layouts": {},
                             "llama": {}}}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    old = {k1: "old1", k2: "old2", k3: "old3"}
    names = {id(fn): name for _, name, fn in all_kernels()}
    left = tool.rehash(path, lambda fn: old[names[id(fn)]], {"models": "mold"},
                       guard=("layouts",))
    out = json.loads(path.read_text())
    assert [r["source_hash"] for r in out["records"]] == [source_hash(f1), source_hash(f2),
                                                           "other", "none"]
    modules = measuring_modules()
    assert out["measurements"]["models"]["source_hash"] == measured_hash(modules["models"])
    assert out["measurements"]["layouts"]["source_hash"] == measured_hash(modules["layouts"])
    assert sorted(line.split(": ")[1] for line in left) == sorted([k3, "llama's measurements"])


def test_carrying_gives_only_the_named_sets_todays_hash_and_keeps_why(tmp_path):
    """tools/rehash_results.py --carry: each named measurement set takes today's hash,
    with the hash it had and the reason kept under ``carried``; other sets are left
    stale; a set not recorded is said; a carry without a reason is refused."""
    import json

    from kernels import measuring_modules
    from kernels.results import measured_hash

    tool = _rehash_tool()
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"measurements": {"models": {"source_hash": "m0"},
                                                 "layouts": {"source_hash": "l0"}}}))
    assert tool.main([str(path), "--carry", "models", "llama", "--because", "host only"]) == 1
    out = json.loads(path.read_text())["measurements"]
    now = measured_hash(measuring_modules()["models"])
    assert out["models"] == {"source_hash": now,
                             "carried": [{"from": "m0", "to": now, "because": "host only"}]}
    assert out["layouts"] == {"source_hash": "l0"}
    with pytest.raises(ValueError, match="--because"):
        tool.carry(path, ["layouts"], " ")


def test_the_old_hashing_of_the_last_old_revision_runs_on_todays_code():
    """The tool reads the old hashing from git and runs it here: today's kernels hash
    as a string of 16 hex digits, and each measuring module that had measured_sources
    then gives a hash."""
    import subprocess

    tool = _rehash_tool()
    head = subprocess.run(["git", "-C", str(tool.ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("needs a git checkout")
    from kernels import all_kernels

    kernel_hash, measured = tool.old_hashing(tool.last_old_revision())
    _, _, fn = next(iter(all_kernels()))
    assert len(kernel_hash(fn)) == 16
    assert {"models", "layouts", "hopper_attention"} <= set(measured)


def _fake_suite(monkeypatch, times, failing=()):
    """run_suite without a GPU: every kernel passes its check but those in ``failing``;
    each group timed in turns is appended to ``times`` as (S_q, dtype, names), and each
    path takes ``ms(name, S_q, dtype)``."""
    from kernels import bench
    from kernels.bench import Timing

    def ms(name, S_q, dtype):
        return {"float16": 1.0, "bfloat16": 2.0}[dtype] * S_q / 64 * (
            2.0 if name == "fp16_only" else 1.0)

    def fake_check(fn, shape, name, dtype):
        status = "failed" if name in failing else "ok"
        return dict(kernel=name, **shape.as_dict(), dtype=dtype, flops=shape.flops,
                    status=status, rel_err=0.0)

    def fake_sdpa_calls(shape, backends, dtype):
        return {b: ("sdpa", b) for b in backends}, {}

    current = [None, None]  # the shape's S_q and the dtype being timed

    def fake_inputs(shape, dtype="float16"):
        current[:] = [shape.S_q, dtype]
        return None, None, None, None

    def fake_alternating(fns, rounds, budget_s, min_reps):
        label = {n: n if isinstance(n, str) else f"sdpa_{n[1]}" for n in fns}  # ("sdpa", b)
        times.append((*current, sorted(label.values())))
        return {n: Timing(*[ms(label[n], *current)] * 3, rounds) for n in fns}

    monkeypatch.setattr(bench, "_check_kernel", fake_check)
    monkeypatch.setattr(bench, "_sdpa_calls", fake_sdpa_calls)
    monkeypatch.setattr(bench, "time_alternating", fake_alternating)
    monkeypatch.setattr(bench, "device_inputs", fake_inputs)
    return bench


def test_the_suite_times_a_shapes_kernels_and_sdpa_in_turns_in_each_dtype(monkeypatch):
    """Each shape's kernels are timed in turns with SDPA's backends, dtype by dtype, and
    each record carries SDPA's times in its own dtype; SDPA is timed in bf16 only where a
    kernel is, and its rows say their dtype. A kernel that failed its check is not timed."""
    from kernels.bench import Shape

    times = []
    bench = _fake_suite(monkeypatch, times)
    small, large = Shape(1, 2, 64, 64, 64), Shape(1, 2, 128, 128, 64)
    kernels = [(5, "both", lambda *a, **k: None), (6, "fp16_only", lambda *a, **k: None)]
    bench.run_suite(kernels, [large, small], progress=lambda line: None,
                    dtypes={"both": ("float16", "bfloat16")}, shape_sets={"both": "journey"})
    sdpa = ["sdpa_default", "sdpa_flash"]
    assert times == [(64, "float16", sorted(["fp16_only", *sdpa])),
                     (128, "float16", sorted(["fp16_only", *sdpa]))]  # no bf16 kernel timed
    monkeypatch.setattr(bench, "SHAPE_SETS", {"journey": [large]})
    times.clear()
    records = bench.run_suite(kernels, [small, large], progress=lambda line: None,
                              dtypes={"both": ("float16", "bfloat16")},
                              shape_sets={"both": "journey"})
    assert times == [(64, "float16", sorted(["fp16_only", *sdpa])),
                     (128, "float16", sorted(["both", "fp16_only", *sdpa])),
                     (128, "bfloat16", sorted(["both", *sdpa]))]
    mine = {(r["kernel"], r["S_q"], r["dtype"]): r for r in records}
    assert mine["both", 128, "bfloat16"]["sdpa_default_ms"] == 4.0
    assert mine["both", 128, "bfloat16"]["median_ms"] == 4.0
    assert mine["both", 128, "float16"]["sdpa_flash_ms"] == 2.0
    assert mine["fp16_only", 64, "float16"]["sdpa_default_ms"] == 1.0
    assert mine["fp16_only", 64, "float16"]["median_ms"] == 2.0
    assert mine["fp16_only", 64, "float16"]["tflops"] == bench.tflops(small, 2.0)
    assert mine["sdpa_default", 128, "bfloat16"]["median_ms"] == 4.0
    assert ("sdpa_default", 64, "bfloat16") not in mine
    assert all(r["timed"] == "in turns" and r["reps"] == bench.SUITE_ROUNDS for r in records)
    assert [(r["kernel"], r["S_q"], r["dtype"]) for r in records if r["chapter"]] == [
        ("both", 128, "float16"), ("both", 128, "bfloat16"),
        ("fp16_only", 64, "float16"), ("fp16_only", 128, "float16")]  # kernel by kernel


def test_shapes_on_request_go_to_the_kernels_that_ask_for_them(monkeypatch):
    """kernels.bench.ON_REQUEST_SHAPES (decoding, causal calls of few heads) are timed
    only for a kernel whose shape set is one of them or that asks for one as well
    (``also_shape_sets``); a kernel with its own set takes the asked set beside it."""
    from kernels.bench import FEW_HEADS_SHAPES, Shape

    times = []
    bench = _fake_suite(monkeypatch, times)
    suite, few = Shape(1, 2, 64, 64, 64), FEW_HEADS_SHAPES[0]
    monkeypatch.setattr(bench, "SHAPE_SETS", {**bench.SHAPE_SETS, "journey": [suite]})
    kernels = [(7, name, lambda *a, **k: None) for name in ("plain", "asks", "own_set")]
    bench.run_suite(kernels, [suite, few], progress=lambda line: None, limit_s=1e9,
                    shape_sets={"own_set": "journey"},
                    also_shape_sets={"asks": "few_heads", "own_set": "few_heads"})
    timed = {shape: names for shape, _, names in times}
    sdpa = ["sdpa_default", "sdpa_flash"]
    assert timed[suite.S_q] == sorted(["asks", "own_set", "plain", *sdpa])
    assert timed[few.S_q] == sorted(["asks", "own_set", *sdpa])


def test_a_shape_set_recorded_alone_keeps_the_records_at_other_shapes():
    """record.merge with a shape set replaces its chapters' records at that set's shapes
    only, and its run does not stand for the chapter's (results.chapter_run)."""
    from kernels import record
    from kernels.bench import FEW_HEADS_SHAPES, STANDARD_SUITE

    def rec(shape, tflops):
        return dict(kernel="hopper_attention", chapter=7, status="ok", tflops=tflops,
                    **shape.as_dict())

    suite, few = STANDARD_SUITE[0], FEW_HEADS_SHAPES[0]
    base = {"records": [rec(suite, 1.0), rec(few, 1.0)], "merged_runs": [],
            "provenance": {"git_commit": "base"}, "profile": {}}
    run = dict(records=[rec(few, 2.0)], measurements={}, profile=dict(status="skipped"),
               provenance={"git_commit": "set"}, tests={}, ceilings={}, seconds=1)
    merged = record.merge(base, run, [7], shape_set="few_heads")
    assert sorted((record.record_shape(r) == few, r["tflops"]) for r in merged["records"]) == [
        (False, 1.0), (True, 2.0)]
    assert merged["merged_runs"][0]["shape_set"] == "few_heads"
    assert results.chapter_run(merged, 7)["provenance"]["git_commit"] == "base"


def test_the_suite_never_times_a_kernel_that_failed_its_check(monkeypatch):
    from kernels.bench import Shape

    times = []
    bench = _fake_suite(monkeypatch, times, failing={"wrong"})
    kernels = [(5, "right", lambda *a, **k: None), (5, "wrong", lambda *a, **k: None)]
    records = bench.run_suite(kernels, [Shape(1, 2, 64, 64, 64)], progress=lambda line: None)
    assert times == [(64, "float16", ["right", "sdpa_default", "sdpa_flash"])]
    wrong = next(r for r in records if r["kernel"] == "wrong")
    assert wrong["status"] == "failed" and "median_ms" not in wrong and "timed" not in wrong


def test_a_bf16_record_beside_sdpa_in_fp16_is_stale():
    from kernels import all_kernels

    _, name, fn = next(iter(all_kernels()))
    rec = dict(kernel=name, source_hash=results.source_hash(fn), dtype="bfloat16",
               sdpa_default_ms=1.0)
    assert results.stale({"records": [rec]}) == [
        f"{name} in bfloat16: SDPA beside it timed in float16"]
    assert results.stale({"records": [dict(rec, sdpa_dtype="bfloat16")]}) == []
    assert results.stale({"records": [dict(rec, dtype="float16")]}) == []  # fp16: as ever


def test_the_backwards_speed_and_training_as_sentences():
    timings = [dict(book="wgmma", ms=dict(wgmma=1.0, flash=1.5, cudnn=0.8)),
               dict(book="separate_dq", ms=dict(separate_dq=2.0, flash=2.2, cudnn=None)),
               dict(book="wgmma", ms=dict(wgmma=1.0, flash=0.9, cudnn=0.7))]
    assert results.backward_speed_lines(dict(timings=timings)) == [
        "speed / SDPA's FlashAttention-2 backward: 0.90-1.50x (median 1.10x), no slower at 2 "
        "of 3 shapes",
        "speed / SDPA's cuDNN backward: 0.70-0.80x (median 0.75x), no slower at 0 of 2 shapes"]
    for r in timings:
        r["shape"] = [1, 1, 1024, 128 if r["book"] == "wgmma" else 64, False]
    assert results.backward_speed_lines(dict(timings=timings), 128, at_least=0.8,
                                        peers=("cudnn",)) == [
        "speed / SDPA's cuDNN backward at D = 128: 0.70-0.80x (median 0.75x), at least 0.8x "
        "at 1 of 2 shapes"]
    m = dict(config=dict(steps=300), step_ms=dict(book=21.0, sdpa=20.0),
             agreement=dict(within=False, book_vs_sdpa=0.3, seed_spread=0.2))
    assert results.training_line("GPT-2-shaped", m) == (
        "GPT-2-shaped, 300 steps: the book's loss curve outside the spread of SDPA's from "
        "two initialisations (the smoothed curves' largest gap: 0.300 from SDPA's from the "
        "same weights, against 0.200 between SDPA's from the two); a step, the two paths "
        "taking turns, 21.0 ms against SDPA's 20.0")
    m["graphed_ms"] = dict(book=17.9, sdpa=18.25)
    assert results.training_line("GPT-2-shaped", m).endswith(
        "21.0 ms against SDPA's 20.0; in a CUDA graph, 17.90 ms against 18.25")
    m["runs"] = dict(book=dict(learned_at=54), sdpa=dict(learned_at=55),
                     sdpa_seed_1=dict(learned_at=53))
    assert "SDPA's from the two); a step" in results.training_line("GPT-2-shaped", m)
    assert "SDPA's from the two); the loss below 1.0 from step 54, SDPA's from " \
        "55, from other weights 53; a step" in results.training_line("GPT-2-shaped", m, 1.0)


def test_a_shape_whose_turns_fail_times_each_path_on_its_own_and_says_so(monkeypatch):
    """One call that raises inside the turns loses only its own record: the others are
    timed each on its own, and their records say so."""
    from kernels.bench import Shape

    times = []
    bench = _fake_suite(monkeypatch, times)
    in_turns = bench.time_alternating

    def failing_together(fns, **kw):
        if len(fns) > 1 or "broken" in fns:
            raise RuntimeError("launch failed")
        return in_turns(fns, **kw)

    monkeypatch.setattr(bench, "time_alternating", failing_together)
    kernels = [(5, "fine", lambda *a, **k: None), (5, "broken", lambda *a, **k: None)]
    records = bench.run_suite(kernels, [Shape(1, 2, 64, 64, 64)], progress=lambda line: None)
    mine = {r["kernel"]: r for r in records}
    assert mine["fine"]["status"] == "ok" and mine["fine"]["timed"] == "on its own"
    assert mine["sdpa_default"]["timed"] == "on its own"
    assert mine["broken"]["status"] == "error" and "launch failed" in mine["broken"]["note"]


def test_a_timed_record_is_read_in_the_calls_dtype_else_in_fp16():
    from kernels.bench import Shape

    shape = Shape(1, 2, 256, 256, 64)
    at = dict(B=1, H=2, S_q=256, S_k=256, D=64, causal=False)
    records = [dict(kernel="both", dtype="float16", status="ok", tflops=1.0, **at),
               dict(kernel="both", dtype="bfloat16", status="ok", tflops=2.0, **at),
               dict(kernel="fp16 only", dtype="float16", status="ok", tflops=3.0, **at),
               dict(kernel="skipped", dtype="bfloat16", status="skipped", **at)]
    assert results.timed(records, "both", shape, "bfloat16")["tflops"] == 2.0
    assert results.timed(records, "both", shape)["tflops"] == 1.0
    assert results.timed(records, "fp16 only", shape, "bfloat16")["tflops"] == 3.0
    assert results.timed(records, "skipped", shape, "bfloat16") is None
    assert results.timed(records, "none", shape) is None


def test_kernels_recorded_alone_keep_their_chapters_other_records():
    """record.merge with ``kernels`` replaces those kernels' records only; the chapter's
    other kernels keep theirs, and the run does not stand for the chapter's
    (results.chapter_run), while each new record names it."""
    from kernels import record
    from kernels.bench import STANDARD_SUITE

    def rec(kernel, tflops):
        return dict(kernel=kernel, chapter=7, status="ok", tflops=tflops,
                    **STANDARD_SUITE[0].as_dict())

    base = {"records": [rec("hopper_attention", 1.0), rec("hopper_dynamic_items", 1.0)],
            "merged_runs": [], "provenance": {"git_commit": "base"}, "profile": {}}
    run = dict(records=[rec("hopper_dynamic_items", 2.0)], measurements={},
               profile=dict(status="skipped"), provenance={"git_commit": "one"}, tests={},
               ceilings={}, seconds=1)
    merged = record.merge(base, run, [7], kernels=["hopper_dynamic_items"])
    assert sorted((r["kernel"], r["tflops"]) for r in merged["records"]) == [
        ("hopper_attention", 1.0), ("hopper_dynamic_items", 2.0)]
    assert merged["merged_runs"][0]["kernels"] == ["hopper_dynamic_items"]
    assert results.chapter_run(merged, 7)["provenance"]["git_commit"] == "base"
    assert next(r for r in merged["records"] if r["tflops"] == 2.0)["merged_run"] == 0
