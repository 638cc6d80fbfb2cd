"""Chapter 8: the split-keys decoding kernels and the GPT-2-small-shaped decoder.

Without a GPU: the split plan, the refusals, the lean call's choice of decoding kernel,
and what the compiler makes of the kernels. On a GPU: both kernels against the reference on ragged decoding shapes (fp16 and bf16,
with the logsumexp), and a small decoder whose logits through the book's kernels match
SDPA's, in a forward pass and step by step from a cache."""

import pytest

from conftest import gpu_only
from kernels import bench, gpus
from kernels.check import check_attention
from kernels.chapters.ch08_in_a_real_model import (BLOCKS_PER_SM, DTYPES, HEAD_DIMS, KERNELS,
                                                   MAX_ROWS, MIN_SPLIT_KEYS, MMA_CONFIG,
                                                   MMA_ROWS, MMA_SMALL_CONFIG, MMA_WIDE_CONFIG,
                                                   ONE_ROW_TENSOR_CORE_BYTES, decoding_kernel,
                                                   heads_a_block, mma_config, mma_refusal,
                                                   mma_shared_bytes, refusal, rows_compiled,
                                                   split_keys_attention, split_plan)


@pytest.mark.parametrize("heads", [1, 12, 32, 128, 4096])
@pytest.mark.parametrize("S_k", [1, 63, 256, 1000, 8192, 32768])
def test_splits_cover_every_key_once(heads, S_k):
    splits, keys = split_plan(heads, S_k, 132)
    assert keys % 64 == 0 and splits >= 1
    assert (splits - 1) * keys < S_k <= splits * keys  # no split is empty
    if splits > 1:
        assert keys >= MIN_SPLIT_KEYS - 64
    assert heads * splits <= max(heads, BLOCKS_PER_SM * 132 + heads)


def test_enough_blocks_for_the_gpu_when_there_are_keys_enough():
    splits, _ = split_plan(32, 8192, 132)
    assert 32 * splits >= BLOCKS_PER_SM * 132 * 0.9


def test_rows_are_compiled_in_powers_of_two():
    assert [rows_compiled(s) for s in range(1, MAX_ROWS + 1)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_refusals_name_the_way_out():
    assert "kernels.launch.attention" in refusal(64, MAX_ROWS + 1, (9, 0), "H200")
    assert "use fp16" in refusal(64, 1, (7, 5), "Tesla T4", "bfloat16")
    for gpu in gpus.READER_GPUS:
        assert refusal(128, 1, gpu.compute_capability, gpu.name) is None


def test_the_tensor_core_kernel_refuses_what_it_cannot_run_and_names_the_other():
    assert "use split_keys_attention" in mma_refusal(128, 1, (7, 5), 64 * 1024, "Tesla T4")
    rtx = next(g for g in gpus.READER_GPUS if g.compute_capability == (8, 6))
    assert mma_shared_bytes(256) > rtx.shared_optin  # D = 256's tiles outgrow an sm_86 block
    assert "use split_keys_attention" in mma_refusal(256, 1, *rtx.limits())
    assert "at most 8 query rows" in mma_refusal(64, MAX_ROWS + 1, (9, 0), 227 * 1024, "H200")
    for gpu in gpus.READER_GPUS:
        if gpu.compute_capability >= (8, 0):
            assert mma_refusal(128, 1, *gpu.limits()) is None


def test_a_block_of_the_tensor_core_kernel_takes_a_whole_group_where_it_fits():
    assert heads_a_block(4, 1, MMA_ROWS) == 4 and heads_a_block(4, 1) == 4
    assert heads_a_block(8, 2, MMA_ROWS) == 8 and heads_a_block(8, 2) == 4
    assert heads_a_block(32, 1, MMA_ROWS) == 16 and heads_a_block(1, 8, MMA_ROWS) == 1


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("group,S_q", [(1, 1), (4, 1), (1, 4), (32, 1)])
@pytest.mark.parametrize("S_k", [4096, 65536])
def test_the_lean_call_decodes_on_tensor_cores_where_they_run_and_pay(D, group, S_q, S_k):
    """Many rows a block: tensor cores wherever they run; one row: only where K and V
    are ONE_ROW_TENSOR_CORE_BYTES or more (B = 4, 8 key/value heads: 16 MB to 1 GB)."""
    from types import SimpleNamespace

    call = SimpleNamespace(D=D, S_q=S_q, group=group, dtype="float16", B=4, H_kv=8, S_k=S_k)
    large = 2 * 4 * 8 * S_k * D * 2 >= ONE_ROW_TENSOR_CORE_BYTES
    assert large == (S_k == 65536)
    other = 4096 if large else 65536  # asked again as a cache grows (or a new one starts)
    for gpu in gpus.READER_GPUS:
        runs = mma_refusal(D, S_q, *gpu.limits()) is None
        want = ("split_keys_mma_attention" if runs and (group * S_q > 1 or large)
                else "split_keys_attention")
        assert decoding_kernel(call, gpu) == want
        assert decoding_kernel(SimpleNamespace(**{**vars(call), "S_k": other}), gpu, S_k) == want
        assert runs or gpu.compute_capability < (8, 0) or D == 256


def test_wide_head_dims_take_deeper_64_key_tiles():
    h200 = 227 * 1024
    assert mma_config(96, h200) is MMA_WIDE_CONFIG and mma_config(256, h200) is MMA_WIDE_CONFIG
    assert mma_config(128, h200) is MMA_CONFIG and mma_config(64, h200) is MMA_CONFIG
    assert mma_shared_bytes(128, MMA_CONFIG) == 128 * 1024  # two 128-key tiles deep
    assert mma_shared_bytes(64, MMA_CONFIG) == 64 * 1024
    a100, rtx_4090 = 163 * 1024, 99 * 1024
    assert mma_config(128, a100) is MMA_CONFIG and mma_config(64, a100) is MMA_CONFIG
    assert mma_config(128, rtx_4090) is MMA_SMALL_CONFIG
    assert mma_shared_bytes(96, MMA_WIDE_CONFIG) == 128 * 1024
    assert mma_shared_bytes(256, MMA_WIDE_CONFIG) == 192 * 1024
    assert mma_config(96, 99 * 1024) is MMA_SMALL_CONFIG


def test_the_decoding_shapes_are_timed_only_where_asked():
    assert set(bench.SHAPE_SETS["decoding"]) == set(bench.DECODING_SHAPES)
    assert all(s.S_q <= MAX_ROWS for s in bench.DECODING_SHAPES)
    assert not set(bench.DECODING_SHAPES) & set(bench.STANDARD_SUITE + bench.JOURNEY_SHAPES)


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 32, 1, 8192, 128, False), (2, 16, 4, 1000, 64, True),
                                   (1, 1, 1, 1, 64, False), (3, 5, 8, 777, 128, True),
                                   (1, 3, 7, 5, 64, True), (2, 2, 3, 70000, 64, False),
                                   (2, 3, 2, 300, 128, False)])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_matches_the_reference(name, shape, dtype):
    assert check_attention(KERNELS[name], *shape, dtype=dtype, lse=True).ok


@gpu_only
@pytest.mark.parametrize("shape", [(1, 32, 1, 8192, 128, False), (2, 16, 4, 1000, 64, True),
                                   (2, 2, 3, 70000, 64, False), (1, 3, 7, 5, 64, True)])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_combining_kernel_matches_the_reference_too(name, shape):
    """The kernels with ``fused_combine=False``: their splits combined by a second kernel."""
    def separate(q, k, v, **kw):
        return KERNELS[name](q, k, v, fused_combine=False, **kw)

    assert check_attention(separate, *shape, lse=True, name=f"{name}, separate combine").ok


@gpu_only
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_call_leaves_the_combines_counters_at_zero(name):
    """Calls one after another with other splits and row groups on one scratch: had a
    call's last block not set its counter back to zero, a later call's blocks would
    combine before every split was stored, or never."""
    for S_k, D in ((8192, 128), (300, 128), (70000, 128), (8192, 128), (8192, 128), (5000, 64)):
        assert check_attention(KERNELS[name], 1, 32, 1, S_k, D, lse=True).ok


@gpu_only
def test_refuses_many_rows():
    import torch

    q = torch.zeros(1, 1, MAX_ROWS + 1, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="at most 8 query rows"):
        split_keys_attention(q, q, q)


@gpu_only
def test_a_small_decoder_gives_sdpas_logits_forward_and_from_a_cache():
    import torch

    from kernels.models import book_attend, gpt2_small, sdpa_attend

    model = gpt2_small(layers=2, context=256, vocab=1000)
    tokens = torch.randint(0, 1000, (2, 200), device="cuda")

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    with torch.no_grad():
        assert rel(model(tokens, book_attend), model(tokens, sdpa_attend)) < 5e-3
        caches = {name: model.cache(2) for name in ("sdpa", "book")}
        prompt, steps = tokens[:, :100], tokens[:, 100:110]
        got = {name: [model(prompt, attend, caches[name])[:, -1]]
               for name, attend in (("sdpa", sdpa_attend), ("book", book_attend))}
        for i in range(steps.shape[1]):
            for name, attend in (("sdpa", sdpa_attend), ("book", book_attend)):
                got[name].append(model(steps[:, i:i + 1], attend, caches[name])[:, -1])
        for a, b in zip(got["book"], got["sdpa"]):
            assert rel(a, b) < 5e-3
        # the cache path gives what a full forward gives for the same tokens
        full = model(tokens[:, :110], sdpa_attend)[:, -1]
        assert rel(got["sdpa"][-1], full) < 5e-3


def test_the_chapter_measures_less_live_than_the_recording():
    from kernels import models

    assert set(models.QUICK_MODEL["batches"]) < set(models.MODEL_BATCHES)
    assert 0 < models.QUICK_MODEL["steps"] < models.GENERATED_TOKENS
    # the chapter reads the call's device time from the first small shape
    assert models.SMALL_SHAPES[0] == models.CALL_SHAPE
    # and compares one and four rows at B·H = 32, 8192 keys, D = 128
    for S_q in (1, 4):
        assert bench.Shape(1, 32, S_q, 8192, 128) in bench.DECODING_SHAPES


def test_the_measurements_hash_covers_every_measuring_function():
    import inspect

    from kernels import launch, models, results

    reached = results.measured_parts(models)
    for name in ("gpu_measurements", "call_measurements", "small_shape_measurements",
                 "model_measurements", "attention_alone", "_generation", "generate",
                 "greedy_pass", "generation_compared", "graphed_steps", "cuda_graph",
                 "step_device_ms"):
        assert results.code_text(getattr(models, name)) in reached, name
    assert results.code_text(launch.attention) in reached  # the lean call, down its path
    assert "progress" in inspect.signature(models.gpu_measurements).parameters
    assert "progress" in inspect.signature(models.gpu_measurements).parameters


def test_llamas_measurements_hash_covers_the_generation_it_borrows():
    """Llama's measurements generate and time through kernels.models' functions, down to
    the CUDA graph the device's time a token replays: its hash covers each of them."""
    from kernels import llama, models, results

    reached = results.measured_parts(llama)
    for name in ("generate", "greedy_pass", "generation_compared", "graphed_steps",
                 "cuda_graph", "step_device_ms", "checked_attention_times"):
        assert results.code_text(getattr(models, name)) in reached, name
    for attend in llama.PATHS.values():  # called through a table
        assert results.code_text(attend) in reached, attend.__name__


@gpu_only
def test_measurements_report_each_stage():
    import torch

    from kernels import launch, models

    lines = []
    call = models.call_measurements(progress=lines.append)
    assert call["host_calls"]["lean call"]["back_to_back_us"] > 0
    q = torch.zeros(models.CALL_SHAPE, device="cuda", dtype=torch.float16)
    assert call["api_kernel"] == launch.plan_for(q, q, q).kernel
    small = models.small_shape_measurements(progress=lines.append)
    assert len(lines) == 1 + len(models.SMALL_SHAPES)
    assert all(r["us"]["lean call"] > 0 and r["picked"] for r in small)
    alone = models.attention_alone(2, 300)  # checked against float64, then timed
    assert set(alone) == {"sdpa", "book"} and min(alone.values()) > 0


@gpu_only
def test_generation_reports_the_devices_time_a_token_beside_the_hosts():
    """kernels.models.generation_compared: the device's time a token (a pass's steps
    replayed from a CUDA graph) is positive, and within the host's time a token, since a
    step queued eagerly waits for both."""
    import torch

    from kernels import models

    model = models.gpt2_small(layers=2, context=512, vocab=1000)
    paths = {"sdpa": models.sdpa_attend, "book": models.book_attend}
    out = models.generation_compared(model, torch.randint(0, 1000, (2, 100), device="cuda"),
                                     8, paths)
    for path in paths:
        assert 0 < out["device_per_token_ms"][path] <= out["per_token_ms"][path] * 1.1


@gpu_only
def test_generation_steps_replayed_from_a_cuda_graph_are_the_eager_steps():
    """What kernels.models.step_device_ms times: a pass's steps on the book's path (the
    split-keys kernels through the lean call, a cache length a step) captured in one
    CUDA graph (kernels.models.graphed_steps). A replay, its outputs poisoned first,
    gives the eager steps' logits and leaves the cache as they did."""
    import torch

    from kernels import models

    model = models.gpt2_small(layers=2, context=512, vocab=1000)
    prompt = torch.randint(0, 1000, (2, 100), device="cuda")
    picks = [torch.randint(0, 1000, (2, 1), device="cuda") for _ in range(6)]
    with torch.no_grad():
        eager_cache = model.cache(2)
        model(prompt, models.book_attend, eager_cache)
        eager = torch.stack([model(t, models.book_attend, eager_cache)[:, -1] for t in picks])
        graph, logits, cache = models.graphed_steps(model, prompt, picks, models.book_attend)
        for x in (*logits, cache.k, cache.v):
            x.fill_(float("nan"))
        cache.length = 0
        model(prompt, models.book_attend, cache)  # the prompt's keys and values again
        graph.replay()
        torch.cuda.synchronize()
    replayed = torch.stack(logits)
    assert torch.isfinite(replayed).all()
    err = ((replayed - eager).double().norm() / eager.double().norm()).item()
    assert err < 1e-3, err
    end = prompt.shape[1] + len(picks)
    for mine, theirs in ((cache.k, eager_cache.k), (cache.v, eager_cache.v)):
        mine, theirs = (x[:, :, :, :end].double() for x in (mine, theirs))
        assert torch.isfinite(mine).all() and (mine - theirs).norm() <= 1e-3 * theirs.norm()


@gpu_only
def test_a_model_path_that_writes_nothing_fails_its_check():
    """kernels.models.checked_attention_times poisons the block a new output is likely
    to get and holds each path's output: a path that only allocates its output, after
    SDPA has written a right one, is refused before anything is timed."""
    import torch

    from kernels import models

    qkv = torch.randn(2, 300, 3, 4, 64, device="cuda", dtype=torch.float16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    with pytest.raises(RuntimeError, match="allocates only's attention"):
        models.checked_attention_times(q, k, v, {
            "sdpa": models.sdpa_attend,
            "allocates only": lambda q, k, v: torch.empty(q.shape, device="cuda",
                                                          dtype=q.dtype)})
