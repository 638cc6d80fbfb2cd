"""The training comparison of kernels.training.

Without torch: the copy task (deterministic, its second half a copy of its first), the
smoothing, and the agreement's verdict on made-up curves, one of them off by more than
the seeds' spread. With torch on the CPU: the training loop runs, is deterministic for
its seeds, and learns. On a GPU: the SDPA path learns at a tiny size, the book's path
trains and its losses track SDPA's from the same weights, and the plot draws a record."""

import numpy as np
import pytest

from conftest import gpu_only
from kernels.training import agreement, copy_task, first_step_below, smooth

#: a few steps of the real width (768, 12 heads of 64) at a tiny depth and length
TINY = dict(batch=8, length=64, period=32, layers=2, vocab=64, warmup=5)


def test_copy_task_is_deterministic_for_a_seed():
    a = copy_task(3, 16, 50, seed=7)
    assert a.shape == (3, 17) and a.dtype == np.int64
    assert np.array_equal(a, copy_task(3, 16, 50, seed=7))
    assert not np.array_equal(a, copy_task(3, 16, 50, seed=8))
    assert np.array_equal(copy_task(2, 8, 9, seed=(1, 5)), copy_task(2, 8, 9, seed=(1, 5)))
    assert not np.array_equal(copy_task(2, 8, 9, seed=(1, 5)), copy_task(2, 8, 9, seed=(1, 6)))


def test_copy_task_repeats_its_first_half():
    tokens = copy_task(4, 64, 1000, seed=0)
    half = 32
    assert np.array_equal(tokens[:, half:2 * half], tokens[:, :half])
    assert np.array_equal(tokens[:, -1], tokens[:, 0])  # the last target continues the copy
    # the next token of every scored position is the one half a row back
    for t in range(half, 64):
        assert np.array_equal(tokens[:, t + 1], tokens[:, t + 1 - half])
    assert tokens.min() >= 0 and tokens.max() < 1000
    assert len(np.unique(tokens[:, :half])) > half  # random, not a constant prefix


def test_copy_task_repeats_a_shorter_prefix_to_fill_the_row():
    tokens = copy_task(2, 21, 1000, seed=3, period=5)
    assert tokens.shape == (2, 22)
    for t in range(5, 22):
        assert np.array_equal(tokens[:, t], tokens[:, t - 5])
    assert not np.array_equal(tokens[:, 1], tokens[:, 0])


def test_copy_task_refuses_a_period_that_leaves_nothing_to_copy():
    for period in (0, 8, 9):
        with pytest.raises(ValueError, match="nothing to copy"):
            copy_task(1, 8, 10, seed=0, period=period)


def test_smooth_is_a_moving_average():
    np.testing.assert_allclose(smooth([1, 2, 3, 4, 5], 2), [1.5, 2.5, 3.5, 4.5])
    np.testing.assert_allclose(smooth([1, 2, 3, 4, 5], 5), [3.0])
    np.testing.assert_allclose(smooth([4, 0, 4, 0], 1), [4, 0, 4, 0])
    noisy = 1 + 0.5 * (-1) ** np.arange(100)  # alternating 0.5 and 1.5
    np.testing.assert_allclose(smooth(noisy, 10), np.ones(91))
    with pytest.raises(ValueError):
        smooth([1, 2, 3], 4)


def _curves(steps=200):
    """SDPA's loss curve falling from 6 to near 0, SDPA's from another seed (its drop 8
    steps later), and a copy of the first with small noise: a book's that agrees."""
    step = np.arange(steps)
    sdpa = 6 / (1 + np.exp((step - 60) / 8)) + 0.05
    other = 6 / (1 + np.exp((step - 68) / 8)) + 0.05
    book = sdpa + 0.02 * np.random.default_rng(0).standard_normal(steps)
    return book, sdpa, other


def test_agreement_within_the_seed_spread():
    book, sdpa, other = _curves()
    result = agreement(book, sdpa, other, window=10, skip=5)
    assert result["within"] is True
    assert result["book_vs_sdpa"] < 0.05 < 0.5 < result["seed_spread"]
    assert result["window"] == 10 and result["skip"] == 5
    assert result["final"]["sdpa"] == pytest.approx(0.05, abs=1e-3)


def test_agreement_outside_the_seed_spread():
    """A book's curve whose drop comes 20 steps after SDPA's: further from SDPA's than
    the other seed's (8 steps), so not within."""
    _, sdpa, other = _curves()
    step = np.arange(len(sdpa))
    late = 6 / (1 + np.exp((step - 80) / 8)) + 0.05
    result = agreement(late, sdpa, other, window=10, skip=5)
    assert result["within"] is False
    assert result["book_vs_sdpa"] > result["seed_spread"] > 0
    # a constant offset larger than the spread, late in training, is caught too
    stuck = sdpa + np.where(np.arange(len(sdpa)) > 150, 2.0, 0.0)
    assert agreement(stuck, sdpa, other, window=10, skip=5)["within"] is False


def test_agreement_smooths_before_it_compares():
    """Noise that averages out over the window is no disagreement; unsmoothed, its
    single steps would be further off than the seeds' spread."""
    _, sdpa, other = _curves()
    wobble = sdpa + 1.5 * (-1) ** np.arange(len(sdpa))  # +-1.5 on alternate steps
    assert np.abs(wobble - sdpa).max() > agreement(sdpa, sdpa, other)["seed_spread"]
    assert agreement(wobble, sdpa, other, window=10, skip=5)["within"] is True
    assert agreement(wobble, sdpa, other, window=1, skip=5)["within"] is False


def test_agreement_skips_the_first_steps():
    _, sdpa, other = _curves()
    first_off = sdpa.copy()
    first_off[:3] += 100.0  # wild first steps, then identical
    assert agreement(first_off, sdpa, other, window=5, skip=3)["book_vs_sdpa"] == 0.0
    assert agreement(first_off, sdpa, other, window=5, skip=0)["within"] is False


def test_agreement_until_compares_only_the_first_steps():
    """A book's curve that agrees for 60 steps, then drops 20 steps late: within the
    seeds' spread until step 40, not over the whole run."""
    _, sdpa, other = _curves()
    step = np.arange(len(sdpa))
    late = np.where(step < 60, sdpa, 6 / (1 + np.exp((step - 80) / 8)) + 0.05)
    early = agreement(late, sdpa, other, window=10, skip=5, until=40)
    assert early["within"] is True and early["book_vs_sdpa"] == 0.0 and early["until"] == 40
    assert agreement(late, sdpa, other, window=10, skip=5)["within"] is False
    # the last average compared is that of the window starting at step 39
    assert early["final"]["sdpa"] == pytest.approx(smooth(sdpa, 10)[39])


def test_first_step_below_counts_from_one_at_the_windows_end():
    losses = [6.0] * 10 + [0.0] * 10
    assert first_step_below(losses, 1.0, window=1) == 11
    assert first_step_below(losses, 1.0, window=4) == 14  # (6 + 0 + 0 + 0) / 4 > 1
    assert first_step_below(losses, 3.0, window=4) == 13  # (6 + 0 + 0 + 0) / 4; at 12, 3
    assert first_step_below(losses, -1.0) is None
    _, sdpa, other = _curves()
    assert first_step_below(sdpa, 1.0) < first_step_below(other, 1.0)


def test_agreement_measures_how_far_the_books_own_curve_moves_between_runs():
    book, sdpa, other = _curves()
    late = np.roll(book, 3)  # the same curve, its drop three steps later
    result = agreement(book, sdpa, other, window=10, skip=5, losses_book_again=late)
    assert result["book_repeat"] == pytest.approx(
        np.abs(smooth(late, 10)[5:] - smooth(book, 10)[5:]).max())
    assert 0.1 < result["book_repeat"] < result["seed_spread"]
    assert "book_repeat" not in agreement(book, sdpa, other)
    with pytest.raises(ValueError, match="steps"):
        agreement(book, sdpa, other, losses_book_again=late[:-1])


def test_agreement_refuses_curves_of_different_lengths():
    book, sdpa, other = _curves()
    with pytest.raises(ValueError, match="steps"):
        agreement(book[:-1], sdpa, other)
    with pytest.raises(ValueError, match="nothing left"):
        agreement(book[:20], sdpa[:20], other[:20], window=10, skip=11)


def test_training_on_the_cpu_is_deterministic_and_learns():
    """Two layers of the real width on 8 x 32 tokens, in fp32 on the CPU: the loss
    falls; the same seeds give the same losses (step i's batch does not depend on how
    many steps there are), another weights' seed other losses."""
    torch = pytest.importorskip("torch")
    from kernels.models import sdpa_attend
    from kernels.training import train

    torch.set_num_threads(min(4, torch.get_num_threads()))
    tiny = dict(batch=8, length=32, period=16, layers=2, vocab=64, warmup=5, device="cpu")
    run = train(sdpa_attend, steps=30, seed=0, data_seed=0, **tiny)
    losses = np.array(run["losses"])
    assert np.all(np.isfinite(losses)) and run["peak_memory_bytes"] is None
    assert losses[-5:].mean() < 0.25 * losses[:5].mean()
    assert train(sdpa_attend, steps=5, seed=0, data_seed=0, **tiny)["losses"] == run["losses"][:5]
    assert train(sdpa_attend, steps=5, seed=1, data_seed=0, **tiny)["losses"] != run["losses"][:5]


def test_step_times_take_turns_on_the_same_weights_and_leave_the_warm_up_out(monkeypatch):
    """Two paths stepped taking turns, the order reversed every other round; each path's
    model steps on its own weights (here: the same attention twice, so the same losses),
    and the first round is not counted."""
    torch = pytest.importorskip("torch")
    from kernels import training
    from kernels.models import sdpa_attend

    torch.set_num_threads(min(4, torch.get_num_threads()))
    order, losses = [], {}
    make = training.trainer

    def recording_trainer(attend, **kw):
        step = make(attend, **kw)
        name = "a" if "a" not in losses else "b"
        losses[name] = []

        def recorded(tokens):
            order.append(name)
            loss = step(tokens)
            losses[name].append(float(loss))
            return loss
        return recorded

    monkeypatch.setattr(training, "trainer", recording_trainer)
    tiny = dict(batch=4, length=32, period=16, layers=1, vocab=64, warmup=5, device="cpu")
    got, turns = training.step_times({"a": sdpa_attend, "b": sdpa_attend}, rounds=3,
                                     steps_a_turn=3, turn_warmup=1, **tiny, steps=300,
                                     data_seed=7)
    assert order == [*"aaabbb", *"bbbaaa", *"aaabbb"]
    assert losses["a"] == losses["b"]  # the same weights and batches on both
    assert set(got) == {"a", "b"} and all(ms > 0 for ms in got.values())
    assert [len(t) for t in turns.values()] == [2, 2]  # the first round is a warm-up


def test_the_measurements_hash_covers_the_capture_and_the_turns():
    """The graphed step is captured by kernels.models.cuda_graph and the eager steps
    take turns by kernels.bench.in_turns: training's hash covers both, and its own
    timing functions."""
    from kernels import bench, models, results, training

    reached = results.measured_parts(training)
    for fn in (models.cuda_graph, bench.in_turns, training.graphed_step_times,
               training.step_times, training.timed_steps):
        assert results.code_text(fn) in reached, fn.__name__


def test_initial_model_refuses_an_unknown_model_by_name():
    from kernels.training import initial_model

    with pytest.raises(ValueError, match="'gpt2' or 'llama', got 'mamba'"):
        initial_model("mamba", seed=0, layers=1, vocab=8, length=8, device="cpu")


#: the Llama-shaped model's pattern (four query heads sharing one key/value head,
#: D = 128, RoPE) at a width that runs in seconds
TINY_LLAMA = dict(heads=4, kv_heads=1, head_dim=128, width=256, ffn=512)


def test_the_llama_shaped_model_trains_on_the_cpu_deterministically(monkeypatch):
    """Two Llama-shaped layers on 8 x 32 tokens, fp32 on the CPU: finite losses that
    fall, the same for the same seeds."""
    torch = pytest.importorskip("torch")
    from kernels import training
    from kernels.llama import sdpa_gqa_attend

    torch.set_num_threads(min(4, torch.get_num_threads()))
    monkeypatch.setattr(training, "LLAMA", dict(training.LLAMA, **TINY_LLAMA))
    tiny = dict(model="llama", batch=8, length=32, period=16, layers=2, vocab=64, warmup=5,
                device="cpu", seed=0, data_seed=0)
    run = training.train(sdpa_gqa_attend, steps=30, **tiny)
    losses = np.array(run["losses"])
    assert np.all(np.isfinite(losses)) and losses[-5:].mean() < losses[:5].mean()
    assert training.train(sdpa_gqa_attend, steps=5, **tiny)["losses"] == run["losses"][:5]


@gpu_only
def test_book_path_trains_the_llama_shaped_model_and_tracks_sdpa(monkeypatch):
    """Grouped-query attention in training: the book's backward sums dK and dV over each
    group; from the same weights and batches its losses differ from SDPA's (with
    enable_gqa) only by rounding."""
    from kernels import training
    from kernels.llama import sdpa_gqa_attend

    monkeypatch.setattr(training, "LLAMA", dict(training.LLAMA, **TINY_LLAMA))
    tiny = dict(TINY, model="llama", steps=20, seed=0)
    book = np.array(training.train(training.book_llama_attend, **tiny)["losses"])
    sdpa = np.array(training.train(sdpa_gqa_attend, **tiny)["losses"])
    assert np.all(np.isfinite(book))
    np.testing.assert_allclose(book, sdpa, rtol=0.05, atol=0.05)
    assert book[-5:].mean() < book[:5].mean()


@gpu_only
def test_sdpa_path_learns_on_the_gpu():
    import torch

    from kernels.models import sdpa_attend
    from kernels.training import train

    run = train(sdpa_attend, steps=60, seed=0, **TINY)
    losses = np.array(run["losses"])
    assert len(losses) == 60 and np.all(np.isfinite(losses))
    assert losses[0] == pytest.approx(np.log(TINY["vocab"]), rel=0.2)  # near uniform at first
    assert losses[-5:].mean() < 0.25 * losses[:5].mean()
    assert run["step_ms"] > 0
    assert 0 < run["peak_memory_bytes"] < torch.cuda.get_device_properties(0).total_memory


@gpu_only
def test_book_gradients_are_as_accurate_as_sdpas():
    """One step of the tiny model from the same weights and batch: against fp32, the
    book's gradients are about as close as SDPA's, and close to SDPA's."""
    from kernels.models import book_attend, sdpa_attend
    from kernels.training import gradient_errors

    tiny = {k: v for k, v in TINY.items() if k != "warmup"}
    errors = gradient_errors({"sdpa": sdpa_attend, "book": book_attend}, **tiny)
    assert 0 < errors["sdpa"] < 0.05
    assert errors["book"] < 1.5 * errors["sdpa"] + 1e-3
    assert errors["book_vs_sdpa"] < 2 * errors["sdpa"] + 1e-3


@gpu_only
def test_book_path_trains_and_tracks_sdpa():
    """The same weights and batches on both paths, 20 steps: the losses differ only by
    rounding (bf16 attention computed two ways), which training has had little time to
    amplify."""
    from kernels.models import book_attend, sdpa_attend
    from kernels.training import train

    book = np.array(train(book_attend, steps=20, seed=0, **TINY)["losses"])
    sdpa = np.array(train(sdpa_attend, steps=20, seed=0, **TINY)["losses"])
    assert np.all(np.isfinite(book))
    np.testing.assert_allclose(book, sdpa, rtol=0.05, atol=0.05)
    assert book[-5:].mean() < book[:5].mean()


@gpu_only
def test_a_step_replayed_from_a_cuda_graph_trains_as_the_eager_step_does():
    """The book's training step captured whole in a CUDA graph (models.cuda_graph, as
    graphed_step_times captures it) and replayed on one batch gives the losses the eager
    step gives from the same weights (the learning rate held constant: a capture keeps
    its own); and graphed_step_times times both paths' replays."""
    from kernels.models import book_attend, cuda_graph, sdpa_attend
    from kernels.training import batches, graphed_step_times, trainer

    config = {k: v for k, v in TINY.items() if k != "batch"} | dict(warmup=1)
    tokens = batches(1, batch=TINY["batch"], length=config["length"], vocab=config["vocab"],
                     period=config["period"])[0]
    eager = trainer(book_attend, seed=0, capturable=True, **config)
    want = [eager(tokens).item() for _ in range(8)]
    step = trainer(book_attend, seed=0, capturable=True, **config)
    graph, loss = cuda_graph(lambda: step(tokens), warmup=3)
    got = []
    for _ in range(5):
        graph.replay()
        got.append(loss.item())
    np.testing.assert_allclose(got, want[3:], rtol=1e-2)
    assert got[-1] < got[0]
    times = graphed_step_times({"sdpa": sdpa_attend, "book": book_attend}, rounds=2, replays=3,
                               **TINY)
    assert set(times) == {"sdpa", "book"} and all(0 < t < 1e3 for t in times.values())


def test_training_curves_draws_a_record():
    """The three runs of a record, each smoothed over the record's window: one line
    each, at the window's last step (counted from 1)."""
    import matplotlib

    matplotlib.use("Agg")
    from kernels import plots

    book, sdpa, other = _curves(50)
    runs = {"sdpa": dict(seed=0, losses=list(sdpa)), "book": dict(seed=0, losses=list(book)),
            "sdpa_seed_1": dict(seed=1, losses=list(other))}
    record = dict(config=dict(TINY, steps=50), runs=runs,
                  agreement=agreement(book, sdpa, other, window=5, skip=2))
    ax = plots.training_curves(record)  # a record from before the book's run was repeated
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["book, seed 0", "SDPA, seed 0", "SDPA, seed 1"]
    assert list(lines[1].get_xdata()) == list(range(5, 51))
    np.testing.assert_allclose(lines[1].get_ydata(), smooth(sdpa, 5))
    matplotlib.pyplot.close(ax.figure)
    runs["book_again"] = dict(seed=0, losses=list(sdpa))
    ax = plots.training_curves(record)
    assert [line.get_label() for line in ax.get_lines()] == [
        "book, seed 0", "book, seed 0, again", "SDPA, seed 0", "SDPA, seed 1"]
    matplotlib.pyplot.close(ax.figure)
