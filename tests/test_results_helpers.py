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


def test_load_prefers_the_gpu_at_hand_then_the_newest(tmp_path, monkeypatch):
    import json

    for gpu, date in (("NVIDIA H100 80GB HBM3", "2026-11-20"), ("NVIDIA H200", "2026-11-23")):
        (tmp_path / f"{results.gpu_slug(gpu)}.json").write_text(
            json.dumps({"provenance": {"gpu": gpu, "date": date}}))
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    assert results.load(gpu="NVIDIA H100 80GB HBM3")["provenance"]["gpu"].startswith("NVIDIA H100")
    assert results.load(gpu="NVIDIA L4")["provenance"]["gpu"] == "NVIDIA H200"  # none of its own
    monkeypatch.setattr(results, "device_name", lambda: None)
    assert results.load()["provenance"]["gpu"] == "NVIDIA H200"


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
