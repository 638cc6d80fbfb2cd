"""Strides and grouped-query attention, on a GPU: the kernels of chapters 6-8 and the
lean call read q, k and v where they lie (contiguous, views of (B, S, H, D) storage, k
and v as views of a longer cache) with 1, 4 or 8 query heads a key/value head, or one
key/value head for all (MQA), and write into an ``out`` of its own layout; each output
(poisoned first) and logsumexp is checked against the float64 reference at odd shapes:
S_q != S_k, causal bottom-right, rows that see no key, fp16 and bf16. The refusals that
need device addresses are here too; those that do not are in test_api.py."""

import pytest

from conftest import ON_GPU
import kernels
from kernels.check import (POISON_BITS, TOLERANCES, compare, compare_lse, poisoned_device,
                           to_host)
from kernels.reference import reference_attention

if not ON_GPU:  # every test here needs a GPU: skip the module once, not case by case
    pytest.skip("needs a GPU", allow_module_level=True)

H = 16
GROUPS = {"own heads": 1, "groups of 4": 4, "groups of 8": 8, "MQA": H}
LAYOUTS = ("contiguous", "(B, S, H, D) views", "cache views")
#: the steps' head dims, and those of Phi-3 (96) and Gemma (256), which chapters 6, 7 and
#: 8's kernels and the lean call take
HEAD_DIMS = (64, 96, 128, 256)
ROWS_SHAPES = [(2, 77, 130, True), (1, 200, 37, True), (2, 128, 128, False)]
DECODING_SHAPES = [(2, 1, 1000, True), (1, 3, 777, True), (3, 2, 4096, False)]


def _torch():
    import torch

    return torch


def _kernel(name):
    if name == "lean call":
        from kernels import launch

        return launch.attention, False
    chapter = {"flash_attention_2": 6, "hopper_attention": 7, "hopper_two_consumers": 7,
               "split_keys_attention": 8, "split_keys_mma_attention": 8}[name]
    module = kernels.chapter_module(chapter)
    gpu = kernels.gpus.current()
    if chapter == 7 and gpu.compute_capability != (9, 0):
        pytest.skip(f"{name} needs sm_90")
    return module.KERNELS[name], True


def _array(shape, layout, dtype, spare=0):
    """A (B, H, S, D) array of random values in ``layout``: contiguous, a view of (B, S,
    H, D) storage, or rows ``spare`` to ``spare + S`` of a longer (B, S + 2 spare, H, D)
    cache (the layout a generation loop's cache has)."""
    torch = _torch()
    B, heads, S, D = shape
    draw = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float32).to(dtype)  # noqa: E731
    if layout == "contiguous":
        return draw(B, heads, S, D)
    if layout == "(B, S, H, D) views":
        return draw(B, S, heads, D).transpose(1, 2)
    return draw(B, S + 2 * spare, heads, D)[:, spare:spare + S].transpose(1, 2)


def _poisoned_like(x, layout):
    """An output array of x's shape in ``layout``, every element the poison pattern."""
    torch = _torch()
    B, heads, S, D = x.shape
    bits = POISON_BITS[kernels.api.dtype_name(x.dtype)][1]
    if layout == "contiguous":
        storage = torch.full((B, heads, S, D), bits, dtype=torch.int16, device="cuda")
        return storage.view(x.dtype)
    storage = torch.full((B, S, heads, D), bits, dtype=torch.int16, device="cuda")
    return storage.view(x.dtype).transpose(1, 2)


def _check(name, B, S_q, S_k, D, causal, layout, group, dtype):
    torch = _torch()
    attention, has_lse = _kernel(name)
    dtype = getattr(torch, dtype)
    q = _array((B, H, S_q, D), "contiguous" if layout == "contiguous" else
               "(B, S, H, D) views", dtype)
    k, v = (_array((B, H // group, S_k, D), layout, dtype, spare=5) for _ in range(2))
    out = _poisoned_like(q, layout)
    kw = {}
    if has_lse:
        kw["lse"] = poisoned_device((B, H, S_q), "float32")
    attention(q, k, v, causal=causal, out=out, **kw)
    torch.cuda.synchronize()
    ref, ref_lse = reference_attention(q.double(), k.double(), v.double(), causal)
    errors = compare(to_host(out.contiguous()), ref.cpu().numpy(),
                     TOLERANCES[kernels.api.dtype_name(dtype)], dtype)
    tol = TOLERANCES[kernels.api.dtype_name(dtype)]
    what = f"{name} {layout} group {group} B={B} S_q={S_q} S_k={S_k} D={D} causal={causal}"
    assert errors["unwritten"] == 0 and errors["nonfinite"] == 0, (what, errors)
    assert errors["rel_err"] <= tol.rel and errors["max_abs_err"] <= tol.max_abs, (what, errors)
    if has_lse:
        lse = compare_lse(to_host(kw["lse"]), ref_lse.cpu().numpy())
        assert lse["lse_unwritten"] == 0 and lse["lse_wrong_empty"] == 0, (what, lse)
        assert lse["lse_err"] <= kernels.check.LSE_TOLERANCE, (what, lse)


def _cases(shapes):
    return [pytest.param(*shape, D, layout, group, dtype,
                         id=f"{layout}-{label}-{'x'.join(map(str, shape[:3]))}"
                            f"{'-causal' if shape[3] else ''}-D{D}-{dtype}")
            for shape in shapes for D in HEAD_DIMS for layout in LAYOUTS
            for label, group in GROUPS.items() for dtype in ("float16", "bfloat16")]


@pytest.mark.parametrize("name", ["flash_attention_2", "hopper_attention",
                                  "hopper_two_consumers", "lean call"])
@pytest.mark.parametrize("B,S_q,S_k,causal,D,layout,group,dtype", _cases(ROWS_SHAPES))
def test_rows_kernels(name, B, S_q, S_k, causal, D, layout, group, dtype):
    _check(name, B, S_q, S_k, D, causal, layout, group, dtype)


@pytest.mark.parametrize("name", ["split_keys_attention", "split_keys_mma_attention", "lean call"])
@pytest.mark.parametrize("B,S_q,S_k,causal,D,layout,group,dtype", _cases(DECODING_SHAPES))
def test_decoding(name, B, S_q, S_k, causal, D, layout, group, dtype):
    _check(name, B, S_q, S_k, D, causal, layout, group, dtype)


def test_lean_call_keeps_plans_of_different_layouts_apart():
    """Calls of one shape but different strides (a prefill's views of the projection,
    then the cache's) each get the right answer, in any order, and a decoding loop's
    growing cache views too."""
    torch = _torch()
    from kernels import launch

    B, S, D = 2, 300, 64
    q = _array((B, H, S, D), "(B, S, H, D) views", torch.float16)
    pairs = [tuple(_array((B, 4, S, D), layout, torch.float16, spare=7) for _ in range(2))
             for layout in LAYOUTS]
    for k, v in pairs + pairs[::-1]:
        got = launch.attention(q, k, v, causal=True)
        ref, _ = reference_attention(q.double(), k.double(), v.double(), True)
        assert ((got.double() - ref).norm() / ref.norm()).item() < 2e-3
        assert got.stride() == q.stride()  # q's layout
    cache = torch.randn(B, 64, 4, D, device="cuda", dtype=torch.float16)
    for S_k in (1, 2, 17, 64):
        step_q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
        kv = cache[:, :S_k].transpose(1, 2)
        got = launch.attention(step_q, kv, kv, causal=True)
        ref, _ = reference_attention(step_q.double(), kv.double(), kv.double(), True)
        assert ((got.double() - ref).norm() / ref.norm()).item() < 2e-3, S_k


@pytest.mark.parametrize("name", ["flash_attention_2", "hopper_attention",
                                  "split_keys_attention", "split_keys_mma_attention", "lean call"])
def test_refusals_that_need_addresses(name):
    torch = _torch()
    attention, _ = _kernel(name)
    S_q = 1 if name.startswith("split_keys") else 64
    q = torch.randn(1, 4, S_q, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 2, 96, 64, device="cuda", dtype=torch.float16)
    shifted = torch.randn(1 * 2 * 96 * 64 + 4, device="cuda", dtype=torch.float16)[4:]
    misaligned = shifted.view(1, 2, 96, 64)  # starts 8 bytes into its storage
    with pytest.raises(ValueError, match="k starts at an address that is not a multiple "
                                         "of 16 bytes|k, v and out must start on 16-byte"):
        attention(q, misaligned, k)
    with pytest.raises(ValueError, match="out overlaps q"):
        attention(q, k, k, out=q)
    with pytest.raises(ValueError, match="H must be a multiple of H_kv"):
        attention(q, k[:, :1].expand(1, 3, 96, 64), k[:, :1].expand(1, 3, 96, 64))


def test_chapter_6_refuses_v_rows_spaced_unlike_k():
    torch = _torch()
    module = kernels.chapter_module(6)
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 2, 96, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 96, 2, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
    with pytest.raises(ValueError, match="v has row stride 128 and k 64"):
        module.KERNELS["flash_attention_2"](q, k, v)



def test_measurements_check_before_they_time():
    """kernels.layouts at small sizes: strided and contiguous outputs agree, every path
    of the GQA decoding passes the float64 check, and only then is it timed (the lean
    call and SDPA's default after each flush)."""
    from kernels import layouts
    from kernels.bench import Shape

    strided = layouts.strided_measurements([Shape(1, 4, 300, 300, 64, causal=True)], "bfloat16")
    assert strided[0]["same_output"] and strided[0]["ms"]["strided"] > 0
    (row,) = layouts.gqa_decoding_measurements((1000,), (2,), "float16", copy_tb_s=4.0)
    tol = TOLERANCES["float16"].rel
    assert all(row["rel_err"][path] <= tol for path in row["rel_err"])
    assert set(row["us"]) == {"lean call", "SDPA default", "separate combine",
                              "lean call, L2 clean", "SDPA default, L2 clean"}
    assert 0 < row["of_copy"]["lean call"]
    # the reference itself: a wrong grouping of heads is far off
    from kernels import launch

    torch = _torch()
    q = torch.randn(1, 4, 1, 64, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 2, 50, 64, device="cuda", dtype=torch.float16) for _ in "kv")
    out = launch.attention(q, k, v)
    assert layouts.reference_error(out, q, k, v)["rel_err"] <= tol
    swapped = out[:, [2, 3, 0, 1]]
    assert layouts.reference_error(swapped, q, k, v)["rel_err"] > 0.1


def test_a_path_that_writes_nothing_is_neither_passed_nor_timed():
    """kernels.layouts.checked_then_timed poisons each output before its check: a path
    that only allocates its output, after the lean call has written a right one, and a
    path that leaves ``out`` as it found it both fail the check and go untimed."""
    from kernels import launch, layouts

    torch = _torch()
    q, k, v, _ = layouts.decoding_case(2, 8, 2, 1000, 128, "float16")
    us, errors = layouts.checked_then_timed(
        {"lean call": lambda: launch.attention(q, k, v),
         "allocates only": lambda: torch.empty_like(q)}, q, k, v, "float16")
    assert set(us) == {"lean call"} and set(errors) == {"lean call", "allocates only"}
    assert not errors["allocates only"]["rel_err"] <= TOLERANCES["float16"].rel
    out = torch.empty_like(q)
    us, errors = layouts.checked_then_timed(
        {"lean call": lambda: launch.attention(q, k, v, out=out), "writes nothing": lambda: None},
        q, k, v, "float16", out=out)
    assert set(us) == {"lean call"} and set(errors) == {"lean call", "writes nothing"}


def test_wide_head_dims_are_checked_then_timed_against_sdpa_in_their_dtype():
    """kernels.layouts' head-dim measurements at small sizes: the lean call passes its
    full-size check before it is timed (chapter 7's kernel on Hopper, chapter 6's
    before), SDPA is timed in the row's dtype, and decoding rows carry every path's
    errors."""
    from kernels import layouts
    from kernels.bench import Shape

    (row,) = layouts.head_dim_measurements([Shape(1, 4, 300, 300, 96, causal=True)], "bfloat16")
    assert row["status"] == "ok" and row["rel_err"] <= TOLERANCES["bfloat16"].rel
    hopper = kernels.gpus.current().compute_capability == (9, 0)
    assert row["kernel"].startswith("chapter 7's hopper_" if hopper
                                    else "chapter 6's flash_attention_2"), row["kernel"]
    assert row["tflops"]["lean call"] > 0 and row["tflops"]["SDPA flash"] > 0
    rows = layouts.wide_decoding_measurements([(1, 4, 2, 700)], "float16")
    assert [r["D"] for r in rows] == list(layouts.WIDE_HEAD_DIMS)
    for r in rows:
        assert set(r["us"]) == {"lean call", "SDPA default", "SDPA flash"}, r
        assert max(r["rel_err"].values()) <= TOLERANCES["float16"].rel, r
