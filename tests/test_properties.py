"""The lean call at drawn shapes and layouts: every call either matches float64 or is
refused by name before launch.

Each case draws a shape (batch, heads, a group of query heads a key/value head serves,
query rows from one token to several blocks, keys, head dim), a dtype, causal or not, a
scale, and a layout for each of q, k and v: contiguous, a view of (B, S, H, D) storage, the
first rows of a longer cache, rows padded wider than D, and layouts the call must refuse (a
start off the 16-byte grid, a batch or K and V's heads expanded with stride 0, D elements
not contiguous). Some
calls bring their own ``out``; some ask for gradients, compared with float64 autograd
through the same views.

The draws are seeded: ``FA_PROPERTY_SEED`` and ``FA_PROPERTY_CASES`` (default 40 cases)
choose them, so a failure names the seed and case that reproduce it. The GPU run script
runs 2,000.
"""

import math
import os
from dataclasses import dataclass, field

import numpy as np
import pytest

from conftest import gpu_only

CASES = int(os.environ.get("FA_PROPERTY_CASES", "40"))
SEED = int(os.environ.get("FA_PROPERTY_SEED", "20261207"))

#: layouts the call reads, and those it refuses with the message that names them
READ = ("contiguous", "bshd", "cache", "wide_rows")
REFUSED = {"misaligned": "16-byte|16 bytes", "expanded_batch": "batch stride 0",
           "strided_d": "along D", "expanded_heads": "head stride 0"}
#: head dims the backward takes (the forward takes 96 and 256 too)
BACKWARD_HEAD_DIMS = (64, 128)


@dataclass
class Case:
    B: int
    H_kv: int
    group: int
    S_q: int
    S_k: int
    D: int
    dtype: str
    causal: bool
    scale: float | None
    layouts: dict  # "q", "k", "v" -> a layout of READ or REFUSED
    out: str | None  # None, "contiguous" or "bshd": the caller's out
    gradient: bool
    seed: int
    index: int  # the case's place in its seeded draw
    extra: dict = field(default_factory=dict)  # per-array padding and offsets

    @property
    def H(self) -> int:
        return self.H_kv * self.group

    @property
    def refusal(self) -> str | None:
        """The message the call must be refused with, if any layout is one it refuses (the
        first the call meets: q's, then k's, then v's)."""
        return next((REFUSED[x] for x in self.layouts.values() if x in REFUSED), None)

    def label(self) -> str:
        return (f"B={self.B} H={self.H} H_kv={self.H_kv} S_q={self.S_q} S_k={self.S_k} "
                f"D={self.D} {self.dtype} causal={self.causal} scale={self.scale} "
                f"layouts={self.layouts} out={self.out} gradient={self.gradient} "
                f"(FA_PROPERTY_SEED={self.seed}, case {self.index})")


def draw_case(rng: np.random.Generator, seed: int, index: int) -> Case:
    """One drawn case: mostly layouts the call reads, and in about one case in four one
    layout it refuses (one at most, so that the refusal the case expects is the one the
    call meets)."""
    B = int(rng.integers(1, 4))
    H_kv = int(rng.choice([1, 2, 3]))
    group = int(rng.choice([1, 2, 4]))
    S_q = int(rng.choice([int(rng.integers(1, 9)), int(rng.integers(9, 700))]))
    S_k = int(rng.integers(1, 800))
    D = int(rng.choice([64, 96, 128, 256]))
    layouts = {name: str(rng.choice(READ)) for name in ("q", "k", "v")}
    if H_kv > 1 and rng.random() < 0.15:
        layouts["k"] = layouts["v"] = "expanded_heads"
    if rng.random() < 0.17 and layouts["k"] != "expanded_heads":
        bad = str(rng.choice([x for x in REFUSED if x != "expanded_heads"]))
        if bad == "expanded_batch" and B == 1:
            B = 2
        layouts[str(rng.choice(["q", "k", "v"]))] = bad
    scale = None if rng.random() < 0.6 else float(rng.choice([-1, 1]) * rng.uniform(0.03, 0.3))
    return Case(B=B, H_kv=H_kv, group=group, S_q=S_q, S_k=S_k, D=D,
                dtype=str(rng.choice(["float16", "bfloat16"])), causal=bool(rng.random() < 0.5),
                scale=scale, layouts=layouts,
                out=None if rng.random() < 0.7 else str(rng.choice(["contiguous", "bshd"])),
                gradient=bool(rng.random() < 0.25), seed=seed, index=index,
                extra={name: dict(rows=int(rng.integers(0, 40)), pad=8 * int(rng.integers(1, 5)),
                                  offset=int(rng.integers(1, 8))) for name in ("q", "k", "v")})


def cases(n: int = CASES, seed: int = SEED):
    rng = np.random.default_rng(seed)
    return [draw_case(rng, seed, i) for i in range(n)]


def storage_and_view(torch, layout: str, shape: tuple, dtype, extra: dict, generator):
    """(the tensor the values live in, the (B, H, S, D) view of it the call is given)."""
    B, H, S, D = shape

    def randn(*size):
        return torch.randn(*size, device="cuda", dtype=dtype, generator=generator)

    if layout == "contiguous":
        base = randn(B, H, S, D)
        return base, base
    if layout == "bshd":
        base = randn(B, S, H, D)
        return base, base.transpose(1, 2)
    if layout == "cache":
        base = randn(B, H, S + extra["rows"], D)
        start = int(extra["rows"] // 2)
        return base, base[:, :, start:start + S]
    if layout == "wide_rows":
        base = randn(B, H, S, D + extra["pad"])
        return base, base[..., :D]
    if layout == "expanded_heads":
        base = randn(B, 1, S, D)
        return base, base.expand(B, H, S, D)
    if layout == "expanded_batch":
        base = randn(1, H, S, D)
        return base, base.expand(B, H, S, D)
    if layout == "strided_d":
        base = randn(B, H, S, 2 * D)
        return base, base[..., ::2]
    if layout == "misaligned":
        flat = randn(B * H * S * D + extra["offset"])
        return flat, flat[extra["offset"]:].view(B, H, S, D)
    raise ValueError(layout)


def float64_attention(torch, q, k, v, causal: bool, scale: float):
    """Attention in float64 torch ops (differentiable): grouped heads repeated, causal
    masks aligned bottom-right, a row that sees no key 0."""
    S_q, S_k = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    s = (q.double() @ k.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(S_q, device=q.device)[:, None]
        keys = torch.arange(S_k, device=q.device)[None, :]
        s = s.masked_fill(keys > rows + (S_k - S_q), -math.inf)
    m = s.amax(-1, keepdim=True).clamp_min(-1e300)  # a row of -inf: exp(-inf) = 0
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    return (p / torch.where(total == 0, torch.ones_like(total), total)) @ v


def run_case(case: Case) -> None:
    """Call the lean call on the case; raise AssertionError with the case's label where
    it neither matches float64 nor is refused as it must be."""
    import torch

    from kernels import launch
    from kernels.chapters.ch09_backward_pass import GRADIENT_TOLERANCE, gradient_errors
    from kernels.check import TOLERANCES

    dtype = getattr(torch, case.dtype)
    gen = torch.Generator(device="cuda").manual_seed(case.seed * 100_003 + case.index)
    shapes = {"q": (case.B, case.H, case.S_q, case.D),
              "k": (case.B, case.H_kv, case.S_k, case.D), "v": (case.B, case.H_kv, case.S_k, case.D)}
    if case.layouts["k"] == "expanded_heads":  # H_kv heads that are one in memory
        shapes["k"] = shapes["v"] = (case.B, case.H, case.S_k, case.D)
    bases, views = {}, {}
    for name in ("q", "k", "v"):
        bases[name], views[name] = storage_and_view(torch, case.layouts[name], shapes[name], dtype,
                                                    case.extra[name], gen)
    out = None
    if case.out == "contiguous":
        out = torch.full(shapes["q"], float("nan"), device="cuda", dtype=dtype)
    elif case.out == "bshd":
        out = torch.full((case.B, case.S_q, case.H, case.D), float("nan"), device="cuda",
                         dtype=dtype).transpose(1, 2)
    gradient = case.gradient and out is None
    if gradient:
        for name in bases:
            bases[name].requires_grad_()
        views = {name: storage_and_view_again(case, name, bases[name], shapes[name])
                 for name in bases}
    if case.refusal:
        with pytest.raises(ValueError, match=case.refusal):
            launch.attention(views["q"], views["k"], views["v"], causal=case.causal,
                             scale=case.scale, out=out)
        return
    got = launch.attention(views["q"], views["k"], views["v"], causal=case.causal,
                           scale=case.scale, out=out)
    if out is not None:
        assert got is out, case.label()
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.D)
    want = float64_attention(torch, views["q"], views["k"], views["v"], case.causal, scale)
    tol = TOLERANCES[case.dtype]
    got64 = got.detach().double()
    assert torch.isfinite(got64).all(), f"NaN or Inf in the output: {case.label()}"
    rel = float(torch.linalg.vector_norm(got64 - want) / torch.linalg.vector_norm(want).clamp_min(1e-300))
    worst = float((got64 - want).abs().max()) if want.numel() else 0.0
    assert rel <= tol.rel and worst <= tol.max_abs, (
        f"rel err {rel:.3g}, max err {worst:.3g}: {case.label()}")
    if not gradient:
        return
    dout = torch.randn(shapes["q"], device="cuda", dtype=dtype, generator=gen)
    if case.D not in BACKWARD_HEAD_DIMS:
        with pytest.raises(ValueError, match=f"D={case.D}"):
            got.backward(dout)
        return
    got.backward(dout)
    lean = [bases[name].grad.double() for name in ("q", "k", "v")]
    reference = {name: b.detach().double().requires_grad_() for name, b in bases.items()}
    again = {name: storage_and_view_again(case, name, reference[name], shapes[name])
             for name in reference}
    float64_attention(torch, again["q"], again["k"], again["v"], case.causal,
                      scale).backward(dout.double())
    errors = gradient_errors([g.cpu().numpy() for g in lean],
                             [reference[n].grad.cpu().numpy() for n in ("q", "k", "v")])
    assert all(e["rel_err"] <= GRADIENT_TOLERANCE[case.dtype] and not e["not_finite"]
               for e in errors.values()), f"{errors}: {case.label()}"


def storage_and_view_again(case: Case, name: str, base, shape: tuple):
    """The case's view of ``name`` taken again on ``base`` (a storage that now requires a
    gradient, or its float64 copy)."""
    B, H, S, D = shape
    layout, extra = case.layouts[name], case.extra[name]
    if layout == "contiguous":
        return base
    if layout == "bshd":
        return base.transpose(1, 2)
    if layout == "cache":
        start = int(extra["rows"] // 2)
        return base[:, :, start:start + S]
    if layout == "wide_rows":
        return base[..., :D]
    if layout in ("expanded_heads", "expanded_batch"):
        return base.expand(B, H, S, D)
    if layout == "strided_d":
        return base[..., ::2]
    return base[extra["offset"]:].view(B, H, S, D)


def test_the_draws_cover_every_layout_and_path():
    """Without a GPU: the seeded draws reach every layout, both the decoding and the
    row-block paths, every head dim and dtype, and refusals in a fair share of cases."""
    drawn = cases(500)
    layouts = {x for c in drawn for x in c.layouts.values()}
    assert layouts == set(READ) | set(REFUSED)
    assert {c.D for c in drawn} == {64, 96, 128, 256}
    assert {c.dtype for c in drawn} == {"float16", "bfloat16"}
    assert any(c.S_q <= 8 for c in drawn) and any(c.S_q > 8 for c in drawn)
    refused = sum(c.refusal is not None for c in drawn)
    assert 60 <= refused <= 200, refused
    assert any(c.gradient and c.refusal is None and c.out is None for c in drawn)
    assert cases(5) == cases(5)  # seeded: a failure's case can be drawn again


#: cases a test takes, so that a long run reports as it goes
CHUNK = 100


@gpu_only
@pytest.mark.parametrize("first", range(0, CASES, CHUNK))
def test_the_lean_call_matches_float64_or_refuses_by_name(first):
    failed = []  # every case of the chunk runs: the failures are listed together
    for case in cases()[first:first + CHUNK]:
        try:
            run_case(case)
        except (AssertionError, pytest.fail.Exception) as error:  # a wrong answer or refusal
            failed.append(str(error).splitlines()[0])
    assert not failed, f"{len(failed)} of {CHUNK} cases:\n" + "\n".join(failed)
