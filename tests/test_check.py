"""The harness itself: reference, check, poison, timing rules."""

import numpy as np
import pytest

from conftest import ON_GPU, gpu_only, sim_only
from kernels.bench import Shape, attention_flops, benchmark_kernel, min_bytes, predicted_s
from kernels.check import (POISON_BITS, TOLERANCES, AttentionMismatch, bfloat16_to_float,
                           check_attention, check_inline, compare, poisoned, random_inputs,
                           to_device, to_host)
from kernels.reference import reference_attention


def explicit(q, k, v, causal, scale):
    """Attention written out with a dense mask, one head at a time."""
    B, H, S_q, D = q.shape
    S_k = k.shape[2]
    out = np.zeros((B, H, S_q, D))
    lse = np.full((B, H, S_q), -np.inf)
    for b in range(B):
        for h in range(H):
            s = q[b, h].astype(np.float64) @ k[b, h].astype(np.float64).T * scale
            if causal:
                i, j = np.indices((S_q, S_k))
                s[j > i + (S_k - S_q)] = -np.inf
            for r in range(S_q):
                if np.isneginf(s[r]).all():
                    continue
                m = s[r].max()
                p = np.exp(s[r] - m)
                out[b, h, r] = p @ v[b, h].astype(np.float64) / p.sum()
                lse[b, h, r] = m + np.log(p.sum())
    return out, lse


@pytest.mark.parametrize("S_q,S_k,causal", [(7, 7, False), (7, 7, True), (9, 4, True),
                                            (4, 9, True), (1, 1, True), (5, 3, False)])
def test_reference_matches_explicit(S_q, S_k, causal):
    q, k, v, _ = random_inputs(2, 3, S_q, S_k, 8)
    out, lse = reference_attention(q, k, v, causal, 0.37)
    want_out, want_lse = explicit(q, k, v, causal, 0.37)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_reference_bottom_right_alignment_and_empty_rows():
    q, k, v, _ = random_inputs(1, 1, 6, 3, 4)
    out, lse = reference_attention(q, k, v, causal=True)
    # rows 0..2 see no key (i + (3 - 6) < 0), row 3 sees key 0 only, row 5 sees all
    assert np.all(out[0, 0, :3] == 0) and np.all(np.isneginf(lse[0, 0, :3]))
    np.testing.assert_allclose(out[0, 0, 3], v[0, 0, 0].astype(np.float64), rtol=1e-12)


def test_reference_in_blocks_equals_whole(monkeypatch):
    import kernels.reference as ref

    q, k, v, _ = random_inputs(1, 2, 50, 40, 8)
    whole = ref.reference_attention(q, k, v, True)
    monkeypatch.setattr(ref, "_BLOCK_ELEMS", 40 * 7)  # 7 rows a block
    blocked = ref.reference_attention(q, k, v, True)
    np.testing.assert_allclose(whole[0], blocked[0], rtol=1e-13, atol=1e-15)


def test_large_logits_stay_finite():
    q, k, v, _ = random_inputs(1, 1, 16, 16, 64, std=8.0)  # logits in the hundreds
    out, lse = reference_attention(q, k, v)
    assert np.isfinite(out).all() and np.isfinite(lse).all() and np.abs(lse).max() > 100


def test_poison_is_a_nan_arithmetic_never_makes():
    for dtype, (utype, bits) in POISON_BITS.items():
        if dtype == "bfloat16":  # no NumPy type: its bits as float32 are a quiet NaN too
            assert np.isnan(bfloat16_to_float(np.array([bits], np.uint16))).all()
            assert bits & 0x7FC0 == 0x7FC0 and bits != 0x7FC0  # quiet, with a payload
            continue
        p = poisoned((3,), dtype)
        assert np.isnan(p).all() and (p.view(utype) == bits).all()
        with np.errstate(invalid="ignore"):
            made = np.array([np.inf], dtype) - np.array([np.inf], dtype)
        assert made.view(utype)[0] != bits


def test_compare_counts_unwritten_and_nonfinite():
    q, k, v, _ = random_inputs(1, 1, 4, 4, 8)
    ref, _ = reference_attention(q, k, v)
    got = ref.astype(np.float16)
    got[0, 0, 1] = poisoned((8,), np.float16)
    got[0, 0, 2, 3] = np.inf
    got[0, 0, 3, 0] = np.nan
    e = compare(got, ref, TOLERANCES["float16"], np.float16)
    assert e["unwritten"] == 8 and e["nonfinite"] == 2 and e["rel_err"] == np.inf


def test_random_inputs_are_fresh():
    a = random_inputs(1, 1, 4, 4, 8)
    b = random_inputs(1, 1, 4, 4, 8)
    assert a[3] != b[3] and not np.array_equal(a[0], b[0])
    c = random_inputs(1, 1, 4, 4, 8, seed=a[3])
    assert np.array_equal(a[0], c[0])


def _host_wrapper(fn):
    """A 'kernel' computed on the host from the reference, to test the check."""
    def attention(q, k, v, causal=False, scale=None, out=None):
        qh, kh, vh = (to_host(x) for x in (q, k, v))
        res = fn(qh, kh, vh, causal, scale).astype(np.float16)
        if ON_GPU:
            from numba import cuda
            target = cuda.as_cuda_array(out)
            full = target.copy_to_host()
            mask = ~np.isnan(res)  # NaN in res means 'leave unwritten'
            full[mask] = res[mask]
            target.copy_to_device(full)
        else:
            mask = ~np.isnan(res)
            out[mask] = res[mask]
        return out
    return attention


def _ref(q, k, v, causal, scale):
    return reference_attention(q, k, v, causal, scale)[0]


def test_check_passes_a_right_answer():
    check_attention(_host_wrapper(_ref), 1, 2, 5, 7, 16, True)


@pytest.mark.parametrize("bug,message", [
    ("unwritten", "never written"),
    ("nan", "NaN or Inf"),
    ("scale", "largest error"),
    ("causal", "largest error"),
])
def test_check_fails_with_a_readable_message(bug, message):
    def wrong(q, k, v, causal, scale):
        if bug == "scale":
            return reference_attention(q, k, v, causal, 1.0)[0]
        if bug == "causal":
            return reference_attention(q, k, v, not causal, scale)[0]
        out = reference_attention(q, k, v, causal, scale)[0]
        if bug == "unwritten":
            out[0, 0, -1] = np.nan  # the host wrapper leaves NaN elements unwritten
        else:
            out[0, 1, 2, 3] = np.inf
        return out

    with pytest.raises(AttentionMismatch, match=message) as info:
        check_attention(_host_wrapper(wrong), 1, 2, 6, 6, 16, True, name="buggy")
    assert "buggy B=1 H=2 S_q=6 S_k=6 D=16 causal: FAILED" in str(info.value)
    assert "seed=" in str(info.value)


def test_check_takes_given_inputs():
    q, k, v, _ = random_inputs(1, 2, 6, 9, 16)
    k[..., 0] = np.arange(9)  # inputs built for one path of a kernel
    inputs = to_device(q, k, v)
    assert check_attention(_host_wrapper(_ref), 1, 2, 6, 9, 16, True, inputs=inputs).seed is None
    with pytest.raises(AttentionMismatch, match=r"inputs: given"):
        check_attention(_host_wrapper(lambda q, k, v, c, s: _ref(q, k, v, c, 1.0)),
                        1, 2, 6, 9, 16, True, inputs=inputs)
    with pytest.raises(ValueError, match="inputs of shapes"):
        check_attention(_host_wrapper(_ref), 1, 2, 6, 6, 16, inputs=inputs)


def test_a_failing_kernel_is_not_timed():
    def wrong(q, k, v, causal, scale):
        return reference_attention(q, k, v, causal, 1.0)[0]
    rec = benchmark_kernel(_host_wrapper(wrong), Shape(1, 1, 8, 8, 16), name="buggy")
    assert rec["status"] == "failed" and "median_ms" not in rec


def test_flops_and_bytes():
    assert attention_flops(16, 16, 2048, 2048, 64) == 4 * 16 * 16 * 2048 * 2048 * 64
    assert attention_flops(1, 1, 10, 10, 8, causal=True) == 4 * 100 * 8 / 2
    assert min_bytes(1, 2, 3, 5, 8) == 2 * 2 * 8 * (2 * 3 + 2 * 5)
    assert Shape(1, 8, 512, 512, 64, True).label() == "B=1 H=8 S=512 D=64 causal"


def test_prediction_scales_with_flops():
    done = [dict(status="ok", D=64, causal=False, flops=1e9, median_ms=10.0)]
    assert predicted_s(done, Shape(1, 1, 2048, 2048, 64)) == pytest.approx(
        0.01 * Shape(1, 1, 2048, 2048, 64).flops / 1e9)
    assert predicted_s([], Shape(1, 1, 8, 8, 64)) is None


@sim_only
def test_timing_refuses_without_a_gpu():
    from kernels.bench import time_gpu

    with pytest.raises(RuntimeError, match="timing needs a GPU"):
        time_gpu(lambda: None)


@gpu_only
def test_a_passing_kernel_is_timed():
    from kernels.chapters.ch01_naive_attention import unfused_attention

    rec = benchmark_kernel(unfused_attention, Shape(2, 4, 256, 256, 64))
    assert rec["status"] == "ok" and 0 < rec["min_ms"] <= rec["median_ms"] <= rec["max_ms"]
    assert rec["tflops"] == pytest.approx(Shape(2, 4, 256, 256, 64).flops
                                          / (rec["median_ms"] * 1e-3) / 1e12)


@gpu_only
def test_torch_reference_matches_numpy():
    torch = pytest.importorskip("torch")
    q, k, v, _ = random_inputs(2, 2, 33, 47, 64)
    want = reference_attention(q, k, v, True)
    got = reference_attention(*(torch.from_numpy(x).cuda() for x in (q, k, v)), True)
    np.testing.assert_allclose(got[0].cpu().numpy(), want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1].cpu().numpy(), want[1], rtol=1e-10, atol=1e-12)


@gpu_only
@pytest.mark.parametrize("backend", ["default", "flash", "cudnn", "efficient", "math"])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backends_match_reference(backend, causal):
    """The SDPA the book times against computes the same function (square shapes:
    PyTorch aligns causal masks top-left, the book bottom-right)."""
    torch = pytest.importorskip("torch")
    from kernels.reference import sdpa

    q, k, v, _ = random_inputs(2, 4, 256, 256, 64)
    out = sdpa(*(torch.from_numpy(x).cuda() for x in (q, k, v)), causal, None, backend)
    ref, _ = reference_attention(q, k, v, causal)
    got = out.float().cpu().numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOLERANCES["float16"].rel


def test_check_inline_checks_a_kernel_where_it_runs(capsys):
    results = check_inline(_host_wrapper(_ref), ("float16",), shapes=[(1, 2, 5, 7, 16, True)])
    assert [r.ok for r in results] == [True]
    assert "B=1 H=2 S_q=5 S_k=7 D=16 causal: ok" in capsys.readouterr().out


def test_check_inline_raises_on_a_wrong_kernel():
    wrong = _host_wrapper(lambda q, k, v, causal, scale: _ref(q, k, v, causal, 1.0))
    with pytest.raises(AttentionMismatch):
        check_inline(wrong, shapes=[(1, 1, 6, 6, 16, False)])


@sim_only
def test_check_inline_says_what_checked_a_gpu_only_kernel(capsys):
    """A kernel whose chapter says RUNS_IN_SIMULATOR = False is not run here: the line
    says so, and that the recorded run checked it instead."""
    namespace = {"RUNS_IN_SIMULATOR": False}
    exec("def gpu_kernel(q, k, v, causal=False, scale=None, out=None):\n"
         "    raise AssertionError('ran')\n", namespace)
    assert check_inline(namespace["gpu_kernel"], ("float16", "bfloat16"),
                        note="The compile report is made here.") == []
    out = capsys.readouterr().out
    assert out.startswith("no GPU here: gpu_kernel runs on a GPU only. The recorded run checked it")
    assert out.rstrip().endswith("The compile report is made here.")


@sim_only
def test_check_inline_reads_a_cuda_chapters_word_through_its_steps(capsys):
    """A step of a CUDA C++ chapter is made by the harness (api.kernel_function): its
    chapter's RUNS_IN_SIMULATOR = False is still what check_inline goes by."""
    from kernels.chapters.ch05_tensor_cores import tensor_core_attention

    assert check_inline(tensor_core_attention, ("float16",)) == []
    assert "runs on a GPU only" in capsys.readouterr().out
