"""The models of chapter 8, on the lean call, and what chapter 8 measures of them.

``gpt2_small()`` is a GPT-2-small-shaped decoder with random weights whose attention
is a function passed in: ``sdpa_attend`` (PyTorch's), ``book_attend`` (the book's
kernels through :func:`kernels.launch.attention`) or ``sdpa_with_copies_attend``
(SDPA given what the book's kernels are given). ``gpu_measurements()`` is what
``python -m kernels.record`` runs on a GPU for chapter 8, and what the chapter runs live
there: the lean call's host time, the small shapes' choice of kernel, the model's
forward, eager and graphed, and a generation loop with a key/value cache.

This module is hand-written and sits above the lean call (which launches the chapters'
kernels): the chapters' modules never import it.
"""

from __future__ import annotations

import inspect

from . import launch
from .bench import host_call_times, host_time_alone, time_gpu
from .chapters.ch07_hopper_attention import KERNELS as HOPPER
from .launch import MAX_ROWS
from .reference import sdpa


def gpt2_small(*, layers=12, heads=12, width=768, vocab=50257, context=1024,
               device="cuda", dtype=None, seed=0):
    """A GPT-2-small-shaped decoder with random weights: ``model(tokens, attend,
    cache=None)`` gives the logits; ``attend(q, k, v)`` is causal attention of (B, H,
    S, D) views, bottom-right aligned; ``cache`` (from ``model.cache(B)``) holds each
    layer's keys and values for generation."""
    import torch
    from torch import nn

    class Cache:
        def __init__(self, batch):
            shape = (layers, batch, heads, context, width // heads)
            self.k = torch.empty(shape, device=device, dtype=dtype)
            self.v = torch.empty_like(self.k)
            self.length = 0

        def append(self, layer, k, v):
            """Write this step's keys and values; the views of all so far."""
            end = self.length + k.shape[2]
            self.k[layer, :, :, self.length:end] = k
            self.v[layer, :, :, self.length:end] = v
            return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x, attend, cache, layer):
            B, S, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, heads, -1).permute(2, 0, 3, 1, 4)
            if cache is not None:
                k, v = cache.append(layer, k, v)
            a = attend(q, k, v).transpose(1, 2).reshape(B, S, width)
            x = x + self.out(a)
            return x + self.proj(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)

        def forward(self, tokens, attend, cache=None):
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
            x = self.embed(tokens) + self.position(positions)
            for i, block in enumerate(self.blocks):
                x = block(x, attend, cache, i)
            if cache is not None:
                cache.length += tokens.shape[1]
            return self.ln(x) @ self.embed.weight.T  # weights tied, as in GPT-2

        def cache(self, batch):
            return Cache(batch)

    torch.manual_seed(seed)
    dtype = dtype or torch.float16
    return Decoder().to(device=device, dtype=dtype).eval()


def sdpa_attend(q, k, v):
    """SDPA's causal attention; PyTorch aligns its mask top-left, which is the book's
    bottom-right where S_q = S_k, and one query row sees every key either way."""
    import torch

    causal = q.shape[2] == k.shape[2]
    if not causal and q.shape[2] != 1:
        raise ValueError("sdpa_attend: S_q must be S_k (prefill) or 1 (decoding)")
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def book_attend(q, k, v):
    """The book's kernels through the lean call: q, k and v made contiguous, except a
    decoding step's k and v, which the split-keys kernel reads in the cache. (Eager
    code and CUDA graphs call it directly; torch.compile needs the custom op,
    ``launch.register_torch_op()``, which costs tens of microseconds a call eagerly.)"""
    if q.shape[2] > MAX_ROWS:
        k, v = k.contiguous(), v.contiguous()
    return launch.attention(q.contiguous(), k, v, causal=True)


def sdpa_with_copies_attend(q, k, v):
    """SDPA given what the book's kernels are given, and giving back what they give:
    contiguous q, k and v, and a contiguous (B, H, S, D) output. The difference between
    this and SDPA is the copies' cost; between this and the book's, the kernels'."""
    return sdpa_attend(q.contiguous(), k.contiguous(), v.contiguous()).contiguous()


SMALL_SHAPES = [(1, 8, 512, 64), (1, 8, 1024, 64), (1, 16, 512, 128), (2, 8, 2048, 64),
                (4, 16, 512, 64), (1, 32, 1024, 128)]
MODEL_BATCHES = (1, 4, 8)


def measured_sources() -> str:
    """What chapter 8's measurements depend on beyond its kernel: the lean call and
    the model (kernels.results.stale_measurements compares their hash)."""
    return "".join(inspect.getsource(x) for x in (
        launch, gpt2_small, sdpa_attend, book_attend, sdpa_with_copies_attend,
        gpu_measurements, model_measurements, _graphed, _generation, _generate))


def gpu_measurements() -> dict:
    """The lean call's host time and its parts, the small shapes' choice, and the
    model, eager and graphed, with a generation loop."""
    import torch

    sdpa_fn = torch.nn.functional.scaled_dot_product_attention
    out = {}
    q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    calls = {"lean call": lambda: launch.attention(q, k, v),
             "SDPA default": lambda: sdpa_fn(q, k, v),
             "SDPA flash": lambda: sdpa(q, k, v, False, None, "flash"),
             "chapter 7's API": lambda: HOPPER["hopper_attention"](q, k, v)}
    out["host_calls"] = {name: host_call_times(call) for name, call in calls.items()}
    plan = launch.plan_for(q, k, v)
    stream = torch.cuda.current_stream().cuda_stream
    raw_stream = launch.torch_functions()[0]  # what a call asks for its stream
    out["call_breakdown"] = {
        "plan lookup": host_time_alone(lambda: launch.plan_for(q, k, v)),
        "output (torch.empty_like)": host_time_alone(lambda: torch.empty_like(q)),
        "stream": host_time_alone(lambda: raw_stream(0)),
        "cuLaunchKernel": host_time_alone(lambda: plan.launch(stream)),
        "whole call": host_time_alone(lambda: launch.attention(q, k, v))}
    small = []
    for B, H, S, D in SMALL_SHAPES:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
        us = {name: time_gpu(lambda: HOPPER[name](q, k, v)).median_ms * 1e3
              for name in launch.ROW_BLOCK_CHOICES}
        us["lean call"] = time_gpu(lambda: launch.attention(q, k, v)).median_ms * 1e3
        for backend in ("default", "flash"):
            us[f"SDPA {backend}"] = time_gpu(lambda: sdpa(q, k, v, False, None, backend)).median_ms * 1e3
        small.append(dict(shape=f"B={B} H={H} S={S} D={D}", us=us,
                          picked=launch.plan_for(q, k, v).kernel))
    out["small_shapes"] = small
    out["model"] = model_measurements()
    return out


def model_measurements(batches=MODEL_BATCHES, S=1024, prompt=128, steps=64) -> dict:
    import torch

    model = gpt2_small()
    reference = gpt2_small(dtype=torch.float32)  # the same weights (the same seed), fp32
    paths = {"sdpa": sdpa_attend, "book": book_attend, "sdpa with copies": sdpa_with_copies_attend}
    forward = []
    for batch in batches:
        tokens = torch.randint(0, 50257, (batch, S), device="cuda")
        with torch.no_grad():
            want = reference(tokens, sdpa_attend).double()
            row = dict(batch=batch, S=S, ms={}, rel_err={})
            for name, attend in paths.items():
                got = model(tokens, attend).double()
                row["rel_err"][name] = ((got - want).norm() / want.norm()).item()
                row["ms"][f"{name} eager"] = time_gpu(lambda: model(tokens, attend)).median_ms
                graph, _ = _graphed(lambda: model(tokens, attend))
                row["ms"][f"{name} graphed"] = time_gpu(graph.replay).median_ms
                del graph
        forward.append(row)
    del reference
    return dict(forward=forward, generation=_generation(model, prompt, steps))


def _graphed(fn):
    """A CUDA graph of ``fn()`` (warmed up on a side stream first, as torch asks)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def _generation(model, prompt, steps, batch=4) -> dict:
    """Greedy generation with a cache, twice: SDPA's path chooses the tokens; the book's
    path is fed the same ones, so that the logits of every step can be compared. The
    first pass meets every cache length for the first time; the second, timed, again."""
    first = _generate(model, prompt, steps, batch)
    again = _generate(model, prompt, steps, batch, first["tokens"])
    errors = ((again["logits"]["book"] - again["logits"]["sdpa"]).norm(dim=(1, 2))
              / again["logits"]["sdpa"].norm(dim=(1, 2)))
    return dict(batch=batch, prompt=prompt, steps=steps,
                prefill_ms=again["prefill_ms"], per_token_ms=again["per_token_ms"],
                first_pass_per_token_ms=first["per_token_ms"],
                max_step_rel_err=errors.max().item())


def _generate(model, prompt, steps, batch, tokens=None) -> dict:
    import time

    import torch

    if tokens is None:
        tokens = torch.randint(0, 50257, (batch, prompt), device="cuda")
    logits, seconds, chosen = {}, {}, []
    for name, attend in (("sdpa", sdpa_attend), ("book", book_attend)):
        cache = model.cache(batch)
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step_logits = [model(tokens, attend, cache)[:, -1]]
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for i in range(steps):
                if name == "sdpa":
                    chosen.append(step_logits[-1].argmax(-1, keepdim=True))
                step_logits.append(model(chosen[i], attend, cache)[:, -1])
            torch.cuda.synchronize()
            seconds[name] = (t1 - t0, (time.perf_counter() - t1) / steps)
        logits[name] = torch.stack(step_logits).double()
    return dict(tokens=tokens, logits=logits,
                prefill_ms={k: v[0] * 1e3 for k, v in seconds.items()},
                per_token_ms={k: v[1] * 1e3 for k, v in seconds.items()})
