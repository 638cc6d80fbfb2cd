"""The timing harness's alternating comparison, without a GPU: its rounds take turns in
an order reversed every other round, and each path gets the median of its rounds."""

from kernels import bench


def test_paths_timed_alternately_take_turns_and_report_the_median_round(monkeypatch):
    order, times = [], {"a": iter([5.0, 1.0, 3.0, 9.0]), "b": iter([2.0, 2.0, 4.0, 8.0])}

    def fake_time_gpu(fn, budget_s, min_reps, spin_up_s, flush):
        assert flush is bench.flush_l2_clean  # each path's every round, flushed as asked
        name = fn()
        order.append(name)
        t = next(times[name])
        return bench.Timing(t, t, t, 1)

    monkeypatch.setattr(bench, "time_gpu", fake_time_gpu)
    got = bench.time_alternating({"a": lambda: "a", "b": lambda: "b"}, rounds=4,
                                 flush=bench.flush_l2_clean)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert (got["a"].median_ms, got["a"].min_ms, got["a"].max_ms) == (4.0, 1.0, 9.0)
    assert (got["b"].median_ms, got["b"].reps) == (3.0, 4)
