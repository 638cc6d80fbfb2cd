"""The helpers the front page and chapter 10 read the recorded results with, and their
figures: on made-up records where the answer is known, and on the committed results."""

import matplotlib
import pytest

matplotlib.use("Agg")

from kernels import gpus, plots, results  # noqa: E402
from kernels.bench import STANDARD_SUITE, Shape  # noqa: E402


def _record(kernel, shape, ms, status="ok", **extra):
    return dict(kernel=kernel, B=shape.B, H=shape.H, S_q=shape.S_q, S_k=shape.S_k, D=shape.D,
                causal=shape.causal, dtype="float16", status=status, median_ms=ms,
                flops=shape.flops, tflops=shape.flops / ms / 1e9, **extra)


SHORT, LONG = Shape(32, 32, 512, 512, 64), Shape(2, 32, 8192, 8192, 64)
RECORDS = [_record("mine", SHORT, 2.0, sdpa_default_ms=1.0, sdpa_flash_ms=3.0),
           _record("mine", LONG, 1.0, sdpa_default_ms=1.5, sdpa_flash_ms=2.0),
           _record("peer", SHORT, 4.0), _record("peer", LONG, 0.5, status="failed")]


def test_a_peer_is_timed_beside_the_kernel_or_from_its_own_record():
    assert results.peer_ms(RECORDS, "mine", "sdpa_default", SHORT) == 1.0
    assert results.peer_ms(RECORDS, "mine", "peer", SHORT) == 4.0
    assert results.peer_ms(RECORDS, "mine", "peer", LONG) is None  # its record failed
    assert results.peer_ms(RECORDS, "peer", "sdpa_default", SHORT) is None  # none beside it
    assert results.versus(RECORDS, "mine", "sdpa_default", SHORT) == 0.5  # half its speed
    assert results.versus(RECORDS, "mine", "sdpa_flash", LONG) == 2.0
    assert results.versus(RECORDS, "mine", "peer", LONG) is None


def test_versus_rows_give_each_peers_tflops_and_the_kernels_speed_against_it():
    rows = results.versus_rows(RECORDS, "mine", [SHORT, LONG, Shape(1, 1, 64, 64, 64)],
                               ["sdpa_default", "peer"], {"sdpa_default": "cuDNN"})
    assert [r["shape"] for r in rows] == [SHORT.label(), LONG.label()]  # untimed: left out
    assert rows[0]["speed vs cuDNN"] == "0.50x" and rows[1]["speed vs cuDNN"] == "1.50x"
    assert rows[0]["cuDNN TFLOPS"] == f"{SHORT.flops / 1.0 / 1e9:.0f}"
    assert rows[0]["speed vs peer"] == "2.00x" and rows[1]["speed vs peer"] == ""


def test_standing_says_where_the_kernel_wins_and_loses():
    st = results.standing(RECORDS, "mine", "sdpa_default", [SHORT, LONG])
    assert st["faster"] == [LONG] and st["slower"] == [SHORT]
    assert st["worst"] == (SHORT, 0.5) and st["best"] == (LONG, 1.5)
    line = results.standing_line(RECORDS, "mine", "sdpa_default", [SHORT, LONG], "cuDNN")
    assert "faster at 1 of 2 shapes (every one with S >= 8192)" in line
    assert "0.50x that of cuDNN at " + SHORT.label() in line
    assert "(all of them)" in results.standing_line(RECORDS, "mine", "sdpa_flash", [SHORT, LONG])
    assert "not timed" in results.standing_line(RECORDS, "peer", "sdpa_flash", [SHORT])


def _provenance(commit):
    return dict(gpu="NVIDIA H200", compute_capability="9.0", driver="1", cuda_runtime="13.0",
                date="2026-11-24T00:00:00", torch="2", cudnn="9", numba="0", numba_cuda="0",
                cupy="14", git_commit=commit * 10)


def test_provenance_lines_name_each_run_once_with_its_chapters():
    data = dict(provenance=_provenance("a"),
                merged_runs=[dict(chapters=[5, 7], provenance=_provenance("b")),
                             dict(chapters=[6], provenance=_provenance("c"))])
    lines = results.provenance_lines(data, [1, 2, 5, 6, 7])
    assert [line.split(":")[0] for line in lines] == ["Chapters 1, 2", "Chapters 5, 7", "Chapter 6"]
    assert "commit bbbbbbbbbb" in lines[1] and "commit cccccccccc" in lines[2]


def test_sdpa_default_is_named_by_the_kernel_the_counters_saw():
    def counted(kernel_name):
        launch = {"kernel": kernel_name}
        return {"measurements": {"x": {"counters": [
            {"kernels": {"sdpa_default": {"status": "ok", "launches": [launch]}}}]}}}

    assert results.sdpa_default_backend(counted("cudnn_generated_sdpa_flash_fprop")) == "cuDNN"
    assert results.sdpa_default_backend(counted("flash_fwd_kernel")) == "FlashAttention-2"
    assert results.sdpa_default_backend({}) is None
    assert results.peer_labels({})["sdpa_default"] == "SDPA default"
    assert results.peer_labels(counted("cudnn_x"))["sdpa_default"] == "SDPA default (cuDNN)"


def test_missing_measurements_are_listed_only_when_asked(monkeypatch):
    import kernels

    class Measured:
        @staticmethod
        def gpu_measurements():
            return {}

    monkeypatch.setattr(kernels, "measuring_modules", lambda: {"models": Measured})
    assert results.stale_measurements({}) == ["models: measurements not recorded"]
    assert results.stale_measurements({}, missing=False) == []
    changed = {"measurements": {"models": {"source_hash": "old"}}}
    assert results.stale_measurements(changed, missing=False)[0].startswith("models's")


MODELS = {
    "host_calls": {"lean call": {"back_to_back_us": 10.0}, "SDPA default": {"back_to_back_us": 20.0}},
    "small_shapes": [{"shape": "B=1 H=8 S=512 D=64",
                      "us": {"lean call": 12.0, "SDPA default": 10.0, "SDPA flash": 15.0}}],
    "model": {"forward": [{"batch": 4, "S": 1024, "ms": {"book graphed": 6.0, "sdpa graphed": 5.0}}],
              "generation": {"batch": 4, "prompt": 128, "prefill_ms": {"book": 6.0, "sdpa": 4.0},
                             "per_token_ms": {"book": 3.0, "sdpa": 4.0},
                             "device_per_token_ms": {"book": 1.1, "sdpa": 1.0}}}}


def test_model_rows_set_the_book_beside_sdpa():
    rows = results.model_rows(MODELS)
    assert [r["book / SDPA"] for r in rows] == ["0.50", "1.20", "1.20", "1.50", "0.75", "1.10"]
    assert "against SDPA default, the faster" in rows[1]["what"]
    assert rows[0]["book"] == "10.0 µs" and rows[2]["SDPA"] == "5.00 ms"
    assert results.model_rows(None) == [] and results.model_rows({}) == []


def test_model_rows_read_the_recorded_measurements():
    data = results.load()
    measured = data["measurements"].get("models") or data["measurements"].get("in_a_real_model")
    if measured is None:
        pytest.skip("chapter 8's measurements are not in the committed results")
    rows = results.model_rows(measured)
    assert len(rows) == 1 + len(measured["small_shapes"]) + len(measured["model"]["forward"]) + 3


def test_chapter_support_counts_the_steps_each_gpu_runs():
    def refusal(name, D, cc, shared, gpu):
        return "needs wgmma" if name == "late" and cc < (9, 0) else None

    support = gpus.chapter_support({"early": None, "late": None}, refusal)
    assert support["H100 / H200"] == "all 2 steps"
    assert support["A100"] == "1 of 2 steps (no: wgmma)"
    none = gpus.chapter_support({"late": None}, refusal)
    assert none["Tesla T4"] == "no: wgmma"


def test_over_s_draws_the_shapes_it_is_given():
    shapes = [s for s in STANDARD_SUITE if s.D == 64 and not s.causal][:2]
    records = [_record("k", shapes[0], 2.0), _record("k", shapes[1], 1.0),
               _record("k", Shape(16, 16, 1024, 1024, 64), 1.0)]  # not asked for
    ax = plots.over_s(records, ["k"], shapes=shapes, labels={"k": "my kernel"})
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [s.S_q for s in shapes]
    assert list(line.get_ydata()) == [shapes[0].flops / 2e9, shapes[1].flops / 1e9]
    assert line.get_label() == "my kernel"


@pytest.mark.parametrize("last_only", [False, True])
def test_the_front_page_figures_on_the_committed_results(last_only):
    data = results.load()
    chapters = {6: "flash_attention_2", 7: "hopper_attention"}
    fig = plots.chapters_on_suite(data["records"], chapters, ceiling=700.0, last_only=last_only,
                                  labels={"hopper_attention": "final"}, title="on a GPU")
    axes = fig.axes
    assert len(axes) == 4 and fig._suptitle.get_text() == "on a GPU"
    assert [ax.get_yscale() for ax in axes] == ["linear" if last_only else "log"] * 4
    for ax, (causal, D) in zip(axes, [(False, 64), (False, 128), (True, 64), (True, 128)]):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert ("flash attention 2" in lines) != last_only and "triton attention" in lines
        final = lines["final"]
        suite = [s for s in STANDARD_SUITE if s.D == D and s.causal == causal]
        want = [results.find(data["records"], "hopper_attention", s) for s in suite]
        assert list(final.get_ydata()) == [r["tflops"] for r in want]
        sdpa = lines["sdpa default"]  # timed beside the final kernel, in its run
        assert list(sdpa.get_ydata()) == [results.sdpa_tflops(r, "default") for r in want]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "final" in legend and any(t.startswith("fp16 matmul, measured: 700") for t in legend)


def test_a_chapters_provenance_says_how_its_kernels_were_timed():
    data = dict(provenance=_provenance("a"), records=[
        dict(kernel="k5", chapter=5, status="ok", timed="in turns"),
        dict(kernel="k5", chapter=5, status="skipped"),
        dict(kernel="k6", chapter=6, status="ok")])
    assert results.provenance_line(data, 5).endswith("timed in turns with SDPA's backends.")
    assert results.provenance_line(data, 6).endswith("made minutes apart.")
    assert results.provenance_line(data, 7) == results.provenance_line(data)
    shape = dict(B=1, H=2, S_q=64, S_k=64, D=64, causal=False, dtype="float16")
    data["records"] = [dict(kernel="k5", chapter=5, status="ok", timed="in turns", **shape),
                       dict(kernel="k5", chapter=5, status="ok", timed="on its own",
                            **dict(shape, S_q=128, S_k=128))]
    assert results.provenance_line(data, 5).endswith(
        "in turns with SDPA's backends, but at 1 shape and dtype, where a call failed in "
        "turns, each on its own.")
