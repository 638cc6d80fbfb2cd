"""The lean call (kernels.launch): the checks it keeps, the caller's stream, the
torch custom op under torch.compile and in a CUDA graph."""

import numpy as np
import pytest

from conftest import gpu_only, sim_only
from kernels import bench, gpus, launch
from kernels.check import TOLERANCES, check_attention, random_inputs
from kernels.reference import reference_attention


def test_chooses_the_books_fastest_kernel_for_each_gpu():
    assert gpus.fastest((9, 0)) == (7, "hopper_attention")
    assert gpus.fastest((8, 9)) == (6, "flash_attention_2")
    assert gpus.fastest((8, 0)) == (6, "flash_attention_2")
    # a T4 has no cp.async, which tensor_core_attention copies with
    assert gpus.fastest((7, 5)) == (5, "wmma_copy16")
    assert gpus.fastest((7, 0))[0] == 5 and gpus.fastest((6, 1)) == (4, "shared_memory_attention")


def test_refuses_numpy_arrays_by_name():
    q, k, v, _ = random_inputs(1, 1, 4, 4, 64)
    with pytest.raises(TypeError, match="torch.Tensor or a cupy.ndarray"):
        launch.attention(q, k, v)


@gpu_only
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 8, 512, 512, 64, False), (2, 3, 257, 257, 128, True),
                                   (1, 4, 300, 129, 64, True), (1, 2, 1, 1000, 128, False),
                                   (3, 5, 8, 777, 128, True), (1, 3, 7, 5, 64, True)])
def test_matches_the_reference(shape, dtype):
    for _ in range(2):  # the second call takes the plan the first made
        assert check_attention(launch.attention, *shape, dtype=dtype).ok


@gpu_only
def test_checks_a_plan_cannot_promise_run_on_every_call():
    import torch

    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    launch.attention(q, k, v)
    wide = torch.randn(1, 2, 128, 128, device="cuda", dtype=torch.float16)
    # the same shape and dtype as the planned k, other strides: a plan of its own
    got = launch.attention(q, wide[..., :64], v)
    want = launch.attention(q, wide[..., :64].contiguous(), v)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="k has stride 2 along D"):
        launch.attention(q, wide[..., ::2], v)
    offset = torch.randn(1 * 2 * 128 * 64 + 4, device="cuda", dtype=torch.float16)[4:]
    with pytest.raises(ValueError, match="16-byte|16 bytes"):
        launch.attention(q, offset.view(1, 2, 128, 64), v)
    with pytest.raises(ValueError, match="head dim D=48"):
        launch.attention(*(x[..., :48].contiguous() for x in (q, k, v)))


@gpu_only
def test_runs_on_the_callers_stream():
    """q is written on a side stream after a long wait there; the call, queued on the
    same stream, must see it (on any other stream it would read q before the copy)."""
    import torch

    from kernels.reference import reference_attention

    src = [torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.float16) for _ in range(3)]
    q, k, v = (torch.zeros_like(x) for x in src)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # about 25 ms of spinning on the side stream
        for x, s in zip((q, k, v), src):
            x.copy_(s)
        out = launch.attention(q, k, v, causal=True)
    side.synchronize()
    ref, _ = reference_attention(*(x.cpu().numpy() for x in src), causal=True)
    got = out.float().cpu().numpy()
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@gpu_only
def test_cupy_arrays_run_on_cupys_current_stream():
    import cupy

    q, k, v, _ = random_inputs(1, 4, 200, 333, 64)
    dq, dk, dv = (cupy.asarray(x) for x in (q, k, v))
    with cupy.cuda.Stream(non_blocking=True) as s:
        out = launch.attention(dq, dk, dv)
        s.synchronize()
    from kernels.reference import reference_attention

    ref, _ = reference_attention(q, k, v)
    got = cupy.asnumpy(out).astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@gpu_only
def test_custom_op_under_torch_compile_and_in_a_cuda_graph():
    import torch

    op = launch.register_torch_op()
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def block(q, k, v):
        return op(q * 1.0, k, v, True, None) + 0.0

    compiled = torch.compile(block, fullgraph=True)
    assert torch.allclose(compiled(q, k, v), ref, atol=2e-3, rtol=0)

    static = [x.clone() for x in (q, k, v)]
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (plans, compilation) outside the capture
        block(*static)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = block(*static)
    fresh = [torch.randn_like(x) for x in (q, k, v)]
    for x, f in zip(static, fresh):
        x.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    want = torch.nn.functional.scaled_dot_product_attention(*fresh, is_causal=True)
    assert torch.allclose(captured, want, atol=2e-3, rtol=0)


@sim_only
def test_refuses_to_run_without_a_gpu():
    pytest.importorskip("torch")
    import torch

    q = torch.zeros(1, 1, 4, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="GPU only"):
        launch.attention(q, q, q)


#: fp16 TFLOPS of chapter 7's forms at the suite's shapes, {(D, S, causal): TFLOPS}, as an
#: H200 measured them in a development run (the two-consumer form at S = 4096 only)
RATES = {
    "hopper_attention": {
        (64, 512, False): 348, (64, 1024, False): 405, (64, 2048, False): 487,
        (64, 4096, False): 514, (64, 8192, False): 511, (64, 16384, False): 510,
        (128, 512, False): 406, (128, 1024, False): 494, (128, 2048, False): 621,
        (128, 4096, False): 667, (128, 8192, False): 675, (128, 16384, False): 633,
        (64, 512, True): 184, (64, 1024, True): 268, (64, 2048, True): 364,
        (64, 4096, True): 434, (64, 8192, True): 490, (64, 16384, True): 501,
        (128, 512, True): 247, (128, 1024, True): 356, (128, 2048, True): 488,
        (128, 4096, True): 577, (128, 8192, True): 638, (128, 16384, True): 646},
    "hopper_two_consumers": {(64, 4096, False): 407, (128, 4096, False): 559},
    "hopper_overlap": {
        (64, 512, False): 344, (64, 1024, False): 406, (64, 2048, False): 443,
        (64, 4096, False): 461, (64, 8192, False): 461, (64, 16384, False): 449,
        (128, 512, False): 444, (128, 1024, False): 549, (128, 2048, False): 625,
        (128, 4096, False): 664, (128, 8192, False): 667, (128, 16384, False): 638,
        (64, 512, True): 167, (64, 1024, True): 249, (64, 2048, True): 328,
        (64, 4096, True): 395, (64, 8192, True): 436, (64, 16384, True): 444,
        (128, 512, True): 242, (128, 1024, True): 362, (128, 2048, True): 480,
        (128, 4096, True): 573, (128, 8192, True): 631, (128, 16384, True): 685},
    "hopper_causal_persistent": {
        (64, 512, True): 224, (64, 1024, True): 301, (64, 2048, True): 394,
        (64, 4096, True): 440, (64, 8192, True): 497, (64, 16384, True): 494,
        (128, 512, True): 258, (128, 1024, True): 352, (128, 2048, True): 480,
        (128, 4096, True): 560, (128, 8192, True): 626, (128, 16384, True): 597}}
#: and forms made up to be fastest at a shape or two, to be chosen there
MADE_UP = {"hopper_early_scores": {(64, 512, False): 380, (64, 1024, False): 300},
           "hopper_causal_early_scores": {(64, 512, True): 240, (64, 1024, True): 250}}


def recorded(rates):
    """``launch.recorded_tflops`` from a table of rates; 1.0 where a form has none there,
    as where nothing is recorded."""
    return lambda kernel, shape, dtype="float16": rates.get(kernel, {}).get(
        (shape.D, shape.S_k, shape.causal), 1.0)


def test_at_a_recorded_shape_the_fastest_there_is_chosen(monkeypatch):
    """At each of the suite's shapes the model's cost is the recorded time: the lean call
    takes the kernel recorded fastest there, and a causal call may take the causal grid."""
    from kernels.bench import STANDARD_SUITE

    rates = {**RATES, **MADE_UP}
    monkeypatch.setattr(launch, "recorded_tflops", recorded(rates))
    h200 = gpus.Gpu("H200", (9, 0), 227 * 1024, 132)
    for s in STANDARD_SUITE:
        fastest = max((name for name in rates if (s.D, s.S_k, s.causal) in rates[name]),
                      key=lambda name: rates[name][s.D, s.S_k, s.causal])
        assert launch.rows_kernel(h200, s.B * s.H, s.S_q, s.D, s.S_k, s.causal) == \
            (7, fastest), s
    assert launch.rows_kernel(h200, 512, 512, 64, causal=True)[1] == "hopper_causal_early_scores"
    assert launch.rows_kernel(h200, 1024, 512, 64)[1] == "hopper_early_scores"
    assert launch.rows_kernel(h200, 512, 4096, 64, causal=True)[1] != "hopper_causal_early_scores"
    # beyond D = 64 an early-scores form is its base kernel: never chosen, however fast
    monkeypatch.setattr(launch, "recorded_tflops", recorded(
        {**rates, "hopper_early_scores": {(128, 512, False): 999},
         "hopper_causal_early_scores": {(128, 512, True): 999}}))
    assert launch.rows_kernel(h200, 1024, 512, 128)[1] != "hopper_early_scores"
    assert launch.rows_kernel(h200, 512, 512, 128, causal=True)[1] != "hopper_causal_early_scores"
    monkeypatch.setattr(launch, "recorded_tflops", recorded(rates))
    # the causal grid is chosen for causal calls only, at the head dims it takes
    assert launch.rows_kernel(h200, 1024, 512, 64)[1] != "hopper_causal_persistent"
    assert launch.rows_kernel(h200, 1024, 512, 96, causal=True)[1] != \
        "hopper_causal_persistent"
    # a head dim no kernel takes: a kernel whose refusal names it (the GPU tests)
    assert launch.rows_kernel(h200, 2, 128, 48, causal=True)[1] in launch.ROW_BLOCK_CHOICES


def test_row_blocks_follow_the_grid_and_the_key_tiles(monkeypatch):
    """Between recorded shapes: 192-row blocks where they fill the GPU and the key tiles
    come out whole; 128-row blocks where the larger blocks would leave multiprocessors
    idle, a short last wave, or rows past the end of a short sequence."""
    monkeypatch.setattr(launch, "recorded_tflops", recorded(RATES))
    h200 = gpus.Gpu("H200", (9, 0), 227 * 1024, 132)
    assert launch.rows_kernel(h200, 8, 512, 64) == (7, "hopper_overlap")  # 24 blocks
    assert launch.rows_kernel(h200, 200, 2048, 64) == (7, "hopper_attention")
    assert launch.rows_kernel(h200, 48, 4096, 128) == (7, "hopper_attention")
    # 1024 rows: six blocks of 192 hold 1152, eight of 128 hold them whole
    assert launch.rows_kernel(h200, 200, 1024, 128) == (7, "hopper_overlap")
    assert launch.rows_kernel(h200, 64, 4096, 128, S_k=1024) == (7, "hopper_overlap")
    assert launch.rate_shape(128, 1400, False).S_k == 1024
    assert launch.rate_shape(96, 1500, True).S_k == 2048  # as near: the longer
    assert launch.padded_work("hopper_attention", 132, 256, 1024, 1024, 128) == 12 * 192 * 1024
    assert launch.padded_work("hopper_overlap", 132, 256, 1024, 1024, 128) == 16 * 128 * 1024
    assert launch.rows_kernel(gpus.Gpu("A100", (8, 0), 163 * 1024, 108), 8, 512, 64) == \
        (6, "flash_attention_2")


def test_the_rate_of_a_call_of_few_heads_is_read_where_few_heads_were_recorded():
    """rate_shape by keys and heads: a suite shape stands for itself; a causal call of
    few heads takes the nearest of kernels.bench.FEW_HEADS_SHAPES; a call that is not
    causal, or one given no heads, a suite shape."""
    from kernels.bench import FEW_HEADS_SHAPES, STANDARD_SUITE, Shape

    assert not set(FEW_HEADS_SHAPES) & set(STANDARD_SUITE + bench.JOURNEY_SHAPES + bench.SWEEP_S)
    for s in STANDARD_SUITE:
        assert launch.rate_shape(s.D, s.S_k, s.causal, s.B * s.H) == s
    for s in FEW_HEADS_SHAPES:
        assert launch.rate_shape(s.D, s.S_k, True, s.B * s.H) == s
    assert launch.rate_shape(64, 1024, True, 48) == Shape(3, 16, 1024, 1024, 64, True)
    assert launch.rate_shape(128, 2000, True, 32) in FEW_HEADS_SHAPES
    assert launch.rate_shape(64, 1024, False, 48) in STANDARD_SUITE
    assert launch.rate_shape(64, 1024, True) in STANDARD_SUITE


def test_a_causal_call_is_priced_as_its_form_hands_out_its_items():
    """scheduled_work: in one wave, the heaviest item (all its key tiles); past
    WAVES_SCHEDULED waves, the work shared out evenly; row blocks counted from the last
    row (the counter's items) walk fewer tiles than from the first."""
    unit = 192 * 128  # the chapter's rows a block, keys a tile
    # 12 heads of 1024 rows: 72 items on 132 multiprocessors, the heaviest 8 tiles
    assert launch.scheduled_work("hopper_causal_persistent", 132, 12, 1024, 1024, 64) == 8 * unit
    # 1024 heads: balanced; from the first row the blocks end at rows 1024, 960, 768, 576,
    # 384, 192 (8 + 8 + 6 + 5 + 3 + 2 tiles), from the last at 1024, 832, ... 64 (27)
    assert launch.scheduled_work("hopper_causal_persistent", 132, 1024, 1024, 1024, 64) == \
        32 * 1024 / 132 * unit
    assert launch.scheduled_work("hopper_dynamic_items", 132, 1024, 1024, 1024, 64) == \
        27 * 1024 / 132 * unit
    # 24 heads, 144 items: the causal grid deals the lightest last (8 + 2 tiles at most)
    assert launch.scheduled_work("hopper_causal_persistent", 132, 24, 1024, 1024, 64) == 10 * unit
    assert launch.form_work("hopper_overlap", 132, 256, 1024, 1024, 128, False) == \
        launch.padded_work("hopper_overlap", 132, 256, 1024, 1024, 128)


def test_a_form_without_a_record_is_not_chosen(monkeypatch):
    monkeypatch.setattr(launch, "recorded_tflops", recorded({**RATES, "hopper_overlap": {}}))
    h200 = gpus.Gpu("H200", (9, 0), 227 * 1024, 132)
    # 8 heads of 4096 rows: 176 blocks of 192 rows or 256 of 128, two waves either way
    assert launch.rows_kernel(h200, 8, 4096, 64) == (7, "hopper_two_consumers")
    assert launch.rows_kernel(h200, 256, 1024, 128) == (7, "hopper_attention")


def test_wide_head_dims_go_to_chapter_7_on_hopper_and_6_before():
    """D = 96 and 256: chapter 7's kernel on sm_90 (two consumers at D = 256, whose O
    takes 128 registers a thread), chapter 6's on sm_80; the chapters' other steps
    refuse them by name."""
    from kernels.chapters import ch06_mma_attention as ch06
    from kernels.chapters import ch07_hopper_attention as ch07

    h200, a100 = gpus.Gpu("H200", (9, 0), 227 * 1024, 132), gpus.Gpu("A100", (8, 0), 163 * 1024, 108)
    for D in (96, 256):
        chapter, name = launch.rows_kernel(h200, 64, 4096, D)
        assert chapter == 7 and name in ch07.WIDE_KERNELS
        assert ch07.refusal(name, D, *h200.limits()) is None
        assert ch07.CONFIGS[name].at(D).consumers == (2 if D == 256 else 3)
        assert launch.rows_kernel(a100, 64, 4096, D) == (6, "flash_attention_2")
        assert ch06.refusal("flash_attention_2", D, *a100.limits()) is None
    why = ch06.refusal("mma_cp_async", 96, *h200.limits())
    assert "mma_cp_async takes head dims 64, 128, not D=96" in why and "flash_attention_2" in why
    why = ch07.refusal("own_keys", 256, *h200.limits())
    assert "own_keys takes head dims 64, 128, not D=256" in why and "hopper_attention" in why


def _blackwell(capability, multiprocessors=0):
    """The reader GPU of this Blackwell capability, with this many multiprocessors."""
    import dataclasses

    gpu = next(g for g in gpus.READER_GPUS if g.compute_capability == capability)
    return dataclasses.replace(gpu, multiprocessors=multiprocessors)


@pytest.mark.parametrize("capability", [(10, 0), (12, 0)], ids=["sm_100", "sm_120"])
def test_blackwell_prefill_goes_to_chapter_6_with_no_record_to_read(capability, monkeypatch):
    """A B200 (sm_100) and an RTX 50 (sm_120) have no wgmma: more than MAX_ROWS query
    rows go to chapter 6's flash_attention_2 at every head dim, causal or not, with or
    without a count of multiprocessors; the recorded rates that price chapter 7's forms
    on sm_90 (none exist for these GPUs) are never asked for."""
    from kernels.chapters import ch06_mma_attention as ch06

    def no_record(*args, **kwargs):
        raise AssertionError("rows_kernel asked for a recorded rate")

    monkeypatch.setattr(launch, "recorded_tflops", no_record)
    monkeypatch.setattr(launch, "recorded_rate", no_record)
    for sms in (0, 148, 170):
        gpu = _blackwell(capability, sms)
        for heads, S_q, D, S_k, causal in [(8, 512, 64, None, False), (200, 2048, 64, None, True),
                                           (48, 4096, 128, None, False),
                                           (64, 4096, 96, 1024, True), (16, 1024, 256, None, False),
                                           (2, 128, 48, None, True)]:
            assert launch.rows_kernel(gpu, heads, S_q, D, S_k, causal) == (6, "flash_attention_2")
        for D in ch06.head_dims("flash_attention_2"):  # and it runs there at each of them
            assert ch06.refusal("flash_attention_2", D, *gpu.limits()) is None


def test_blackwell_decodes_on_the_tensor_cores_where_a_block_fits():
    """Decoding: chapter 8's tensor-core kernel where a block holds several query rows
    (grouped heads), at every head dim on a B200, whose 227 KB a block take the wide
    tiles at D = 96 and 256 as on sm_90; on an RTX 50, whose 99 KB do not hold D = 256's
    tiles, the split-keys kernel on CUDA cores there, and the smaller tiles at D = 128.
    One row a head and a short cache: the CUDA-core kernel on both."""
    from types import SimpleNamespace

    from kernels.chapters import ch08_in_a_real_model as ch08

    b200, rtx50 = _blackwell((10, 0), 148), _blackwell((12, 0), 170)
    hopper = next(g for g in gpus.READER_GPUS if g.compute_capability == (9, 0))
    for D in ch08.HEAD_DIMS:
        grouped = SimpleNamespace(D=D, S_q=1, group=4, dtype="float16", B=4, H_kv=8, S_k=4096)
        one_row = SimpleNamespace(**{**vars(grouped), "group": 1})
        assert ch08.decoding_kernel(grouped, b200) == "split_keys_mma_attention"
        assert ch08.decoding_kernel(grouped, rtx50) == (
            "split_keys_attention" if D == 256 else "split_keys_mma_attention")
        assert ch08.decoding_kernel(one_row, b200) == ch08.decoding_kernel(one_row, rtx50) == \
            "split_keys_attention"
        assert ch08.mma_config(D, b200.shared_optin) is ch08.mma_config(D, hopper.shared_optin)
    assert ch08.mma_config(128, rtx50.shared_optin) is ch08.MMA_SMALL_CONFIG
    assert "shared memory" in ch08.mma_refusal(256, 1, *rtx50.limits())
    long_cache = SimpleNamespace(D=128, S_q=1, group=1, dtype="bfloat16", B=4, H_kv=8, S_k=65536)
    assert ch08.decoding_kernel(long_cache, rtx50) == "split_keys_mma_attention"


@gpu_only
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decoding_reads_a_longer_cache_in_place(dtype):
    """One query row a head against the first t rows of a (B, H, L, D) cache: k and v
    are views, their heads L * D elements apart."""
    import torch

    dt = getattr(torch, dtype)
    B, H, L, D = 2, 12, 4096, 64
    k_cache = torch.randn(B, H, L, D, device="cuda", dtype=dt)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(B, H, 1, D, device="cuda", dtype=dt)
    for t in (1, 17, 1000, 4096):
        k, v = k_cache[:, :, :t], v_cache[:, :, :t]
        out = launch.attention(q, k, v)
        ref, _ = reference_attention(*(x.float() for x in (q, k, v)))
        assert launch.plan_for(q, k, v).kernel == "chapter 8's split_keys_attention"
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCES[dtype].rel, (t, err)


@gpu_only
def test_a_decoding_loop_moves_to_the_tensor_cores_as_its_cache_grows():
    """One row a head, no groups: the CUDA-core kernel on a short cache, the tensor-core
    one from ONE_ROW_TENSOR_CORE_BYTES of K and V (S_k = 16384 here), back on a short
    one; one plan throughout, every answer checked."""
    import torch

    from kernels.chapters.ch08_in_a_real_model import ONE_ROW_TENSOR_CORE_BYTES

    B, H, L, D = 1, 32, 20000, 128
    assert 2 * B * H * 16384 * D * 2 == ONE_ROW_TENSOR_CORE_BYTES
    k_cache = torch.randn(B, H, L, D, device="cuda", dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    plan = None
    for t, kernel in ((1000, "split_keys_attention"), (16383, "split_keys_attention"),
                      (16384, "split_keys_mma_attention"), (L, "split_keys_mma_attention"),
                      (1000, "split_keys_attention")):
        k, v = k_cache[:, :, :t], v_cache[:, :, :t]
        out = torch.full_like(q, float("nan"))
        launch.attention(q, k, v, out=out)
        assert plan in (None, launch.plan_for(q, k, v))
        plan = launch.plan_for(q, k, v)
        assert plan.kernel == f"chapter 8's {kernel}", t
        ref, _ = reference_attention(*(x.float() for x in (q, k, v)))
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCES["float16"].rel, (t, err)


@gpu_only
@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("out_heads_inner", [True, False])
def test_an_out_laid_out_unlike_q_gets_the_answer(D, out_heads_inner):
    """A caller's ``out`` in another layout than q's (one (B, S, H, D) and the other
    (B, H, S, D) underneath): the answer lands in it, whatever the form stores O with
    (chapter 7's TMA store writes as its tensor map, made in q's layout, says)."""
    import torch

    B, H, S = 2, 3, 200
    bshd = lambda: torch.randn(B, S, H, D, device="cuda", dtype=torch.float16).transpose(1, 2)
    bhsd = lambda: torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)
    q, k, v = (bhsd() if out_heads_inner else bshd() for _ in range(3))
    out = (bshd() if out_heads_inner else bhsd()).fill_(float("nan"))
    assert out.stride() != q.stride()
    for causal in (False, True):
        assert launch.attention(q, k, v, causal=causal, out=out) is out
        ref, _ = reference_attention(*(x.float() for x in (q, k, v)), causal=causal)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < TOLERANCES["float16"].rel, (launch.plan_for(q, k, v, causal).kernel, err)


@gpu_only
def test_decoding_takes_any_head_spacing_and_refuses_mismatched_k_v():
    """Heads laid out batch-inner (any strides whose rows are contiguous) are read where
    they lie; k and v of different shapes are refused by name."""
    import torch

    q = torch.randn(2, 3, 1, 64, device="cuda", dtype=torch.float16)
    heads_outer = torch.randn(3, 2, 100, 64, device="cuda", dtype=torch.float16).transpose(0, 1)
    out = launch.attention(q, heads_outer, heads_outer)
    ref, _ = reference_attention(*(x.float() for x in (q, heads_outer, heads_outer)))
    assert ((out.double() - ref).norm() / ref.norm()).item() < TOLERANCES["float16"].rel
    with pytest.raises(ValueError, match=r"\(B, H_kv, S_k, D\)"):
        launch.attention(q, torch.randn(2, 3, 100, 64, device="cuda", dtype=torch.float16),
                         torch.randn(2, 3, 99, 64, device="cuda", dtype=torch.float16))


class _RecordingDriver:
    """The driver calls a Launch makes, recorded instead of made."""

    def __init__(self):
        self.replaced, self.launched = [], []

    def replace_address(self, tensor_map, address):
        tensor_map[0] = address  # where a real map keeps its address is the driver's business
        self.replaced.append(address)

    def launch(self, function, *args):
        self.launched.append(args)
        return 0


def test_a_launch_sets_addresses_and_re_points_its_tensor_maps_only_when_they_move(
        monkeypatch):
    """Without a GPU: a packed launch writes each call's addresses into the values that
    follow them, and asks the driver to re-point a tensor map only when its array has
    moved; every map sits on a 64-byte boundary, as the driver's CUtensorMap does."""
    import ctypes
    import types

    from kernels.api import KernelLaunch, Param

    driver = _RecordingDriver()
    monkeypatch.setattr(launch, "_DRIVER", [driver])
    made = []

    def k_map(address):  # how the chapter makes k's map at an address (once: at packing)
        made.append(address)
        return {"opaque": [address] + [7] * 15}

    description = KernelLaunch(
        types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0)), (4, 2), (128,), 1024,
        (Param("q", "u64", 1000, "q"), Param("k_map", "tensor_map", k_map(2000), "k", k_map),
         Param("S_k", "i32", 300)))
    packed = launch.Launch(description)
    assert ctypes.addressof(packed.params[1]) % 64 == 0 and list(packed.params[1])[1:] == [7] * 15
    packed.place({"q": 1100, "k": 2100})
    packed.place({"q": 1200, "k": 2100})
    packed.place({"q": 1200, "k": 2200})
    assert driver.replaced == [2100, 2200] and made == [2000]
    assert packed.params[0].value == 1200 and packed.params[1][0] == 2200
    packed(stream=5)
    assert driver.launched[0][:8] == (4, 2, 1, 128, 1, 1, 1024, 5)


@gpu_only
def test_a_plan_points_its_tensor_maps_at_each_calls_arrays():
    """Many layers of one shape share a plan; its tensor maps (chapter 7's kernel) are
    made once and pointed at each call's arrays, never encoded again, and every call
    reads its own arrays."""
    import torch

    from kernels.chapters import ch07_hopper_attention

    if gpus.current().compute_capability != (9, 0):
        pytest.skip("tensor maps: chapter 7's kernel, on sm_90")
    layers = [[torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.float16) for _ in range(3)]
              for _ in range(80)]  # more arrays than any cache of maps would keep
    launch.attention(*layers[0], causal=True)
    encoded = set(ch07_hopper_attention._MAPS)
    outs = [launch.attention(*x, causal=True) for x in layers]
    assert set(ch07_hopper_attention._MAPS) == encoded
    for i in (0, 41, 79):
        ref, _ = reference_attention(*(x.cpu().numpy() for x in layers[i]), causal=True)
        got = outs[i].float().cpu().numpy()
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOLERANCES["float16"].rel


@gpu_only
@pytest.mark.parametrize("S_q", [5, 300])  # chapter 8's split-keys plan, a row-block plan
def test_attention_with_lse_gives_a_logsumexp_later_calls_leave_alone(S_q):
    import torch

    q, k, v = (torch.randn(2, 4, S, 64, device="cuda", dtype=torch.float16)
               for S in (S_q, 700, 700))
    _, lse = launch.attention_with_lse(q, k, v, True, None)
    kept = lse.clone()
    launch.attention(torch.randn_like(q), k, v, causal=True)  # the same plan, its own buffer
    launch.attention_with_lse(torch.randn_like(q), k, v, True, None)
    assert torch.equal(lse, kept)
    _, want = reference_attention(q, k, v, causal=True)
    assert torch.allclose(lse.double(), want, atol=1e-3, rtol=0)


@gpu_only
def test_an_output_gradient_the_kernels_can_read_is_not_copied():
    import torch

    storage = torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16)
    for dout in (storage.transpose(1, 2), storage.transpose(1, 2).contiguous()):
        assert launch._aligned_dout(dout) is dout
    for dout in (torch.ones(1, 1, 1, 1, device="cuda").expand(2, 4, 300, 64),
                 storage.transpose(1, 2)[..., ::2]):
        copy = launch._aligned_dout(dout)
        assert copy.is_contiguous() and torch.equal(copy, dout)


@gpu_only
@pytest.mark.parametrize("S_q", [3, 300])  # chapter 8's split-keys plan, chapter 7's row blocks
def test_k_and_v_expanded_along_the_heads_are_refused_by_name(S_q):
    """``k1.expand(B, H, S, D)`` (stride 0 along the heads) is refused before launch,
    naming the one head to pass instead (chapter 7's tensor maps read such a view as a
    dense one); the one head gives the answer the expanded views mean."""
    import torch

    B, H, S_k, D = 2, 4, 333, 128
    q = torch.randn(B, H, S_q, D, device="cuda", dtype=torch.float16)
    k1, v1 = (torch.randn(B, 1, S_k, D, device="cuda", dtype=torch.float16) for _ in range(2))
    with pytest.raises(ValueError, match=r"k has head stride 0: its 4 heads are one in "
                                         r"memory \(an expanded view\); pass k\[:, :1\]"):
        launch.attention(q, k1.expand(B, H, S_k, D), v1.expand(B, H, S_k, D))
    want = reference_attention(q, k1.expand(B, H, S_k, D), v1.expand(B, H, S_k, D))[0]
    got = launch.attention(q, k1, v1).double()
    assert float((got - want).norm() / want.norm()) < TOLERANCES["float16"].rel


#: a model that calls the lean call, compiled whole in a process that has not used it
FRESH_PROCESS_COMPILE = """
import torch
from kernels import launch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, device="cuda", dtype=torch.float16)

    def forward(self, q, k, v):
        return self.proj(launch.attention(q, k, v, causal=True))

torch.manual_seed(0)
block = Block()
compiled = torch.compile(block, fullgraph=True)
q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16,
                       requires_grad=True) for _ in range(3))
out = compiled(q, k, v)
out.float().square().sum().backward()
grads = [x.grad.clone() for x in (q, k, v)]
for x in (q, k, v):
    x.grad = None
want = block.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
want.float().square().sum().backward()
assert torch.allclose(out, want, atol=2e-2, rtol=0), (out - want).abs().max()
for g, x in zip(grads, (q, k, v)):
    assert torch.allclose(g, x.grad, atol=5e-2, rtol=5e-2), (g - x.grad).abs().max()
print("compiled forward and backward agree with SDPA")
"""


@gpu_only
def test_a_model_that_calls_the_lean_call_compiles_whole_in_a_fresh_process():
    """torch.compile(fullgraph=True) of a module that calls ``launch.attention`` on
    tensors that need gradients, forward and backward, in a process where nothing
    registered the custom ops before (they are registered on import: Dynamo cannot
    register one inside the code it traces)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS_COMPILE], capture_output=True,
                          text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "agree with SDPA" in proc.stdout


@gpu_only
@pytest.mark.parametrize("differentiable", [False, True])
def test_the_custom_ops_pass_torch_library_opcheck(differentiable):
    """torch.library.opcheck: the schemas, the fake implementations' shapes, strides and
    dtypes against the real ones, and (with the backward) autograd's registration."""
    import torch

    op = launch.register_torch_op(differentiable=differentiable)
    q = torch.randn(1, 4, 200, 64, device="cuda", dtype=torch.float16,
                    requires_grad=differentiable)
    k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.float16,
                        requires_grad=differentiable) for _ in range(2))
    for causal in (False, True):
        torch.library.opcheck(op, (q, k, v, causal, None))
