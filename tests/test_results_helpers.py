"""The helpers chapters read recorded results with."""

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
