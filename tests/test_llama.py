"""The Llama-3-8B-shaped decoder of kernels.llama, made tiny, on the CPU: its forward
through SDPA's grouped-query attention against a float64 reference, the views its
attention is given (of the projections and of the cache, never copies), generation
from its cache against one forward over the whole sequence, its RoPE against Hugging
Face's, its refusals, and that a wrong grouping of query heads over key/value heads
shows in the logits."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import gpu_only

torch = pytest.importorskip("torch")

from kernels.llama import llama_shaped, sdpa_gqa_attend  # noqa: E402

TINY = dict(layers=2, heads=4, kv_heads=2, head_dim=16, width=64, ffn=128, vocab=97,
            context=64, device="cpu", dtype=torch.float32)


def reference_attend(q, k, v, spread="repeat_interleave"):
    """Causal grouped-query attention in float64, the mask aligned bottom-right. k's and
    v's heads are spread over q's explicitly: ``repeat_interleave`` (query head h reads
    key/value head h // group, as Llama does) or ``repeat`` (h % kv_heads: a wrong
    grouping, to show that the tests would notice one)."""
    group = q.shape[1] // k.shape[1]
    if spread == "repeat_interleave":
        k, v = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    else:
        k, v = (x.double().repeat(1, group, 1, 1) for x in (k, v))
    S_q, S_k = q.shape[2], k.shape[2]
    scores = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    allowed = torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q)  # key j <= i + S_k - S_q
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).to(q.dtype)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def tokens(batch, S, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab"], (batch, S), generator=generator)


@pytest.fixture(scope="module")
def model():
    return llama_shaped(**TINY)


def test_the_forward_through_sdpa_matches_a_float64_reference(model):
    x = tokens(2, 11)
    with torch.no_grad():
        got, want = model(x, sdpa_gqa_attend), model(x, reference_attend)
    assert got.shape == (2, 11, TINY["vocab"])
    assert rel(got, want) < 1e-5


def test_a_wrong_grouping_of_heads_changes_the_logits(model):
    """The comparison above would catch an attend that spread key/value heads over the
    query heads the wrong way: it changes the logits far beyond the tolerance."""
    x = tokens(2, 11)
    with torch.no_grad():
        right = model(x, reference_attend)
        wrong = model(x, lambda q, k, v: reference_attend(q, k, v, spread="repeat"))
    assert rel(wrong, right) > 1e-2
    q, k, v = torch.randn(1, 4, 7, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    assert rel(sdpa_gqa_attend(q, k, v), reference_attend(q, k, v)) < 1e-6
    assert rel(reference_attend(q, k, v, spread="repeat"), reference_attend(q, k, v)) > 0.1


def test_attention_gets_views_of_the_projections_and_of_the_cache(model):
    B, S, context = 2, 5, TINY["context"]
    H, H_kv, D = TINY["heads"], TINY["kv_heads"], TINY["head_dim"]
    seen = []

    def attend(q, k, v):
        seen.append(dict(q=q.shape, q_contiguous=q.is_contiguous(), k=k.shape, k_stride=k.stride(),
                         v_stride=v.stride(), k_at=k.data_ptr(), v_at=v.data_ptr()))
        return sdpa_gqa_attend(q, k, v)

    with torch.no_grad():
        model(tokens(B, S), attend)
        cache = model.cache(B)
        model(tokens(B, S), attend, cache)
        model(tokens(B, 1), attend, cache)
    layers = TINY["layers"]
    assert len(seen) == 3 * layers
    for call in seen[:layers]:  # no cache: views of the projections' (B, S, H, D)
        assert call["q"] == (B, H, S, D) and not call["q_contiguous"]
        assert call["k"] == (B, H_kv, S, D)
        assert call["k_stride"] == call["v_stride"] == (S * H_kv * D, D, H_kv * D, 1)
    for i, call in enumerate(seen[layers:]):  # views of the (B, context, H_kv, D) cache
        S_q = S if i < layers else 1
        assert call["q"] == (B, H, S_q, D) and call["q_contiguous"] == (S_q == 1)
        assert call["k"] == (B, H_kv, S + (i >= layers), D)
        assert call["k_stride"] == call["v_stride"] == (context * H_kv * D, D, H_kv * D, 1)
        assert call["k_at"] == cache.k[i % layers].data_ptr()
        assert call["v_at"] == cache.v[i % layers].data_ptr()


def test_rope_is_hugging_faces_at_the_positions_after_the_cache(model):
    """Layer 0's q and k, as its attend gets them after a 3-token prefill: the rotate-half
    RoPE of Hugging Face's Llama (theta 500000) at positions 3 and 4, written out here."""
    x, H, H_kv, D = tokens(1, 5), TINY["heads"], TINY["kv_heads"], TINY["head_dim"]
    given = []

    def attend(q, k, v):
        given.append((q, k))
        return reference_attend(q, k, v)

    with torch.no_grad():
        cache = model.cache(1)
        model(x[:, :3], reference_attend, cache)
        model(x[:, 3:], attend, cache)
        block = model.blocks[0]
        h = block.attention_norm(model.embed(x[:, 3:]))
        q, k = block.q(h).view(1, 2, H, D).double(), block.k(h).view(1, 2, H_kv, D).double()
    frequencies = 1 / 500000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(3, 5, dtype=torch.float64)[:, None] * frequencies
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # (S, 1, D)

    def rope(x):
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()

    got_q, got_k = given[0]
    assert rel(got_q, rope(q).transpose(1, 2)) < 1e-6
    assert rel(got_k[:, :, 3:], rope(k).transpose(1, 2)) < 1e-6


def test_generation_from_the_cache_gives_the_whole_forwards_logits(model):
    """A prefill of 5 tokens and 3 steps of one token, and a prefill of 5 and a chunk of
    3 (its mask bottom-right), against one forward over all 8 tokens: at every position."""
    x = tokens(2, 8)
    with torch.no_grad():
        whole = model(x, sdpa_gqa_attend)
        cache = model.cache(2)
        steps = [model(x[:, :5], sdpa_gqa_attend, cache)]
        steps += [model(x[:, i:i + 1], sdpa_gqa_attend, cache) for i in range(5, 8)]
        assert cache.length == 8
        chunked_cache = model.cache(2)
        chunks = [model(x[:, :5], reference_attend, chunked_cache),
                  model(x[:, 5:], reference_attend, chunked_cache)]
    assert rel(torch.cat(steps, dim=1)[:, -1], whole[:, -1]) < 1e-5
    assert rel(torch.cat(steps, dim=1), whole) < 1e-5
    assert rel(torch.cat(chunks, dim=1), whole) < 1e-5


def test_refuses_to_run_past_the_context(model):
    context = TINY["context"]
    with torch.no_grad():
        with pytest.raises(ValueError, match="context"):
            model(tokens(1, context + 1), sdpa_gqa_attend)
        cache = model.cache(1)
        model(tokens(1, context - 4), sdpa_gqa_attend, cache)
        with pytest.raises(ValueError, match="context"):
            model(tokens(1, 5), reference_attend, cache)
        assert cache.length == context - 4  # refused before anything was written
        model(tokens(1, 4), reference_attend, cache)  # up to the context exactly: fine
    assert cache.length == context


def test_sdpa_refuses_queries_neither_all_the_keys_nor_one():
    q, kv = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="S_q"):
        sdpa_gqa_attend(q, kv, kv)


def test_the_same_seed_gives_the_same_weights_at_any_dtype(model):
    other = llama_shaped(**{**TINY, "dtype": torch.float64})
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b.float()), name
    assert not torch.equal(llama_shaped(**{**TINY, "seed": 1}).head.weight, model.head.weight)


def test_the_module_imports_without_torch():
    """A machine without torch (the book's CPU build) still imports it, as it does the
    package: torch is imported inside the functions that use it."""
    code = ("import sys; sys.modules['torch'] = None; import kernels.llama as m; "
            "assert m.gpu_measurements in m.MEASURES")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


@gpu_only
def test_one_layers_attention_is_checked_then_timed():
    from kernels import llama

    us = llama.attention_alone(dict(heads=8, kv_heads=2, head_dim=128, dtype="bfloat16"), 300)
    assert set(us) == {"sdpa", "book"} and min(us.values()) > 0
