"""A Llama-3-8B-shaped decoder on the lean call, and what a GPU run measures of it.

``llama_shaped()`` is a decoder of Llama 3 8B's shapes (32 query heads and 8 key/value
heads of 128, width 4096, a SwiGLU MLP of 14336, a vocabulary of 128256, RoPE), with
random weights and 4 layers by default, whose attention is a function passed in:
``sdpa_gqa_attend`` (PyTorch's) or ``book_gqa_attend`` (the book's kernels through
:func:`kernels.launch.attention`). Unlike chapter 8's GPT-2-shaped model
(:mod:`kernels.models`), it hands its attention what a real model has at hand, with no
copies: q, k and v are views of the projections' (B, S, H, D) storage, and a decoding
step's k and v are views of a (batch, context, kv_heads, D) cache, with fewer key/value
heads than query heads (grouped-query attention).

``llama_measurements()`` is what a GPU run records of it (``quick=True``: fewer
lengths, batches and tokens): the forward's device time at prefill lengths up to 8192,
and a greedy generation loop with the cache, on each path, with the book's logits
against SDPA's. Each stage reports a line to ``progress`` as it finishes; where a path
cannot run on this GPU, its time is None.

This module is hand-written and sits above the lean call: the chapters' modules never
import it.
"""

from __future__ import annotations

import time

from . import gpus, launch
from .bench import time_alternating, time_gpu
from .check import free_poisoned_block
from .models import (AGAIN_PASSES, checked_attention_times, generation_compared, or_none,
                     per_token_line)

#: these measurements time the host (the generation loop), which other processes on the
#: machine slow: kernels.rerecord runs them with no other job beside them
TIMES_THE_HOST = True
#: its calls go through the lean call, whose choice of form reads this GPU's records:
#: kernels.rerecord measures it after the timings it records again
USES_THE_LEAN_CALL = True


def llama_shaped(*, layers=4, heads=32, kv_heads=8, head_dim=128, width=4096, ffn=14336,
                 vocab=128256, context=8192 + 256, rope_theta=500000.0, device="cuda",
                 dtype=None, seed=0):
    """A Llama-3-8B-shaped decoder with random weights: ``model(tokens, attend,
    cache=None)`` gives the logits (B, S, vocab); ``attend(q, k, v)`` is causal
    grouped-query attention, bottom-right aligned, of (B, heads, S_q, D) and (B,
    kv_heads, S_k, D) views (query head h reads key/value head h // (heads //
    kv_heads)); ``cache`` (from ``model.cache(B)``) holds each layer's keys and values
    for generation. The same ``seed`` gives the same weights at any dtype."""
    import torch
    from torch import nn

    if heads % kv_heads:
        raise ValueError(f"llama_shaped: heads ({heads}) must be a multiple of kv_heads "
                         f"({kv_heads})")
    dtype = dtype or torch.float16

    class Cache:
        def __init__(self, batch):
            # (batch, context, kv_heads, D) a layer: a step's keys land as the
            # projection makes them, (B, S, kv_heads, D), with no transpose
            shape = (layers, batch, context, kv_heads, head_dim)
            self.k = torch.empty(shape, device=device, dtype=dtype)
            self.v = torch.empty_like(self.k)
            self.length = 0

        def append(self, layer, k, v):
            """Write this step's keys and values (B, S, kv_heads, D) in place; views of
            all so far, (B, kv_heads, S_k, D), rows kv_heads * D apart."""
            end = self.length + k.shape[1]
            self.k[layer, :, self.length:end] = k
            self.v[layer, :, self.length:end] = v
            return self.k[layer, :, :end].transpose(1, 2), self.v[layer, :, :end].transpose(1, 2)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            # in fp32, as Llama's reference does: the mean of a 4096-wide row of
            # squares overflows fp16 long before the row does
            x32 = x.float()
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)
            return self.weight * normed.to(x.dtype)

    def rotary(x, cos, sin):
        """RoPE of (B, S, H, D), rotating half as Hugging Face's Llama does: dimension
        i pairs with i + D/2."""
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.q = nn.Linear(width, heads * head_dim, bias=False)
            self.k = nn.Linear(width, kv_heads * head_dim, bias=False)
            self.v = nn.Linear(width, kv_heads * head_dim, bias=False)
            self.o = nn.Linear(heads * head_dim, width, bias=False)
            self.gate = nn.Linear(width, ffn, bias=False)
            self.up = nn.Linear(width, ffn, bias=False)
            self.down = nn.Linear(ffn, width, bias=False)

        def forward(self, x, attend, cache, layer, cos, sin):
            B, S, _ = x.shape
            h = self.attention_norm(x)
            q = rotary(self.q(h).view(B, S, heads, head_dim), cos, sin)
            k = rotary(self.k(h).view(B, S, kv_heads, head_dim), cos, sin)
            v = self.v(h).view(B, S, kv_heads, head_dim)
            if cache is not None:
                k, v = cache.append(layer, k, v)
            else:
                k, v = k.transpose(1, 2), v.transpose(1, 2)
            # (B, H, S, D) views of (B, S, H, D) storage: no copy on the way in, and
            # none on the way out where the output is (B, S, H, D) storage too
            a = attend(q.transpose(1, 2), k, v).transpose(1, 2).reshape(B, S, -1)
            x = x + self.o(a)
            h = self.mlp_norm(x)
            return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()
            self.head = nn.Linear(width, vocab, bias=False)  # untied, as in Llama 3
            # the angles in float64 (position 8447 x frequency 1 keeps its digits),
            # then cast with the weights, as Hugging Face casts them to q's dtype
            frequencies = rope_theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64)
                                          / head_dim)
            angles = torch.arange(context, dtype=torch.float64)[:, None] * frequencies
            angles = torch.cat((angles, angles), dim=-1)  # (context, D)
            self.register_buffer("cos", angles.cos().float(), persistent=False)
            self.register_buffer("sin", angles.sin().float(), persistent=False)
            self.config = dict(layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                               width=width, ffn=ffn, vocab=vocab, context=context,
                               dtype=str(dtype).removeprefix("torch."))

        def forward(self, tokens, attend, cache=None):
            S = tokens.shape[1]
            start = cache.length if cache is not None else 0
            if start + S > context:  # before anything is written to the cache
                raise ValueError(f"llama_shaped: {start} + {S} tokens run past the context "
                                 f"of {context}")
            # (S, 1, D): broadcast over the batch and the heads of (B, S, H, D)
            cos, sin = self.cos[start:start + S, None], self.sin[start:start + S, None]
            x = self.embed(tokens)
            for i, block in enumerate(self.blocks):
                x = block(x, attend, cache, i, cos, sin)
            if cache is not None:
                cache.length += S
            return self.head(self.norm(x))

        def cache(self, batch):
            return Cache(batch)

    with torch.device(device):
        model = Decoder()
    torch.manual_seed(seed)
    with torch.no_grad():  # small weights: finite, unsaturated logits in fp16 at 4 layers
        for p in model.parameters():  # the norms' weights are the vectors
            if p.ndim == 1:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=0.02)
    return model.to(dtype).eval()  # initialised in fp32: the same weights at any dtype


def sdpa_gqa_attend(q, k, v):
    """SDPA's causal grouped-query attention; PyTorch aligns its mask top-left, which is
    the book's bottom-right where S_q = S_k, and one query row sees every key either way."""
    import torch

    causal = q.shape[2] == k.shape[2]
    if not causal and q.shape[2] != 1:
        raise ValueError("sdpa_gqa_attend: S_q must be S_k (prefill) or 1 (decoding)")
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            enable_gqa=True)


def book_gqa_attend(q, k, v):
    """The book's kernels through the lean call, given the views as they are: q a view
    of the projection's storage, k and v of the projection's or of the cache's, with
    fewer heads than q."""
    return launch.attention(q, k, v, causal=True)


#: what a GPU run measures: prefill lengths (batch 1), generation batches, the prompt
#: and the tokens generated after it; ``quick=True`` measures QUICK instead
FULL = dict(lengths=(1024, 2048, 4096, 8192), batches=(1, 4), prompt=1024, steps=64)
QUICK = dict(lengths=(1024, 4096), batches=(1,), prompt=512, steps=16)
#: the last positions of a prefill whose logits are compared (all of them, (S, 128256)
#: in fp64 on each path, would be gigabytes at S = 8192)
COMPARED_POSITIONS = 64
PATHS = {"sdpa": sdpa_gqa_attend, "book": book_gqa_attend}


def llama_measurements(progress=None, quick=False, dtype="float16") -> dict:
    """The Llama-3-8B-shaped decoder (4 layers) on each of PATHS: the prefill's device
    time and logits at FULL's lengths, then greedy generation at FULL's batches
    (``quick``: QUICK's sizes); ``dtype``: "float16" or "bfloat16"."""
    import torch

    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"llama_measurements: dtype must be float16 or bfloat16, got {dtype!r}")
    progress = progress or (lambda line: None)
    sizes = QUICK if quick else FULL
    t0 = time.perf_counter()
    model = llama_shaped(dtype=getattr(torch, dtype))
    config = model.config
    progress(f"Llama-3-8B-shaped decoder, {config['layers']} layers, {dtype}: "
             f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} G parameters "
             f"[{time.perf_counter() - t0:.1f} s]")
    out = dict(gpu=gpus.current().name, quick=quick,
               config={key: config[key]
                       for key in ("layers", "heads", "kv_heads", "head_dim", "dtype")},
               prefill=[prefill_measurements(model, S, progress) for S in sizes["lengths"]],
               generation=[generation_measurements(model, batch, sizes["prompt"], sizes["steps"],
                                                   progress) for batch in sizes["batches"]])
    del model
    torch.cuda.empty_cache()  # give the memory back to what is measured after
    return out


def gpu_measurements(progress=None, quick=False) -> dict:
    """What ``python -m kernels.record`` records: :func:`llama_measurements` in fp16,
    with the same in bf16 under "bfloat16" (``quick``: fp16 only)."""
    out = llama_measurements(progress, quick)
    if not quick:
        bf16 = llama_measurements(progress, quick, "bfloat16")
        out["bfloat16"] = {key: bf16[key] for key in ("config", "prefill", "generation")}
    return out


def _device_ms(fn):
    """:func:`kernels.bench.time_gpu`'s median of ``fn()`` in ms, or None where it
    cannot run here."""
    timing = or_none(lambda: time_gpu(fn))
    return timing.median_ms if timing else None


def attention_alone(config, S) -> dict:
    """{path: µs} of one layer's causal attention at one sequence of ``S`` tokens, on
    views as the model hands them over ((B, S, H, D) storage), checked on one group's
    heads against the float64 reference and timed by
    :func:`kernels.models.checked_attention_times`."""
    import torch

    dtype = getattr(torch, config["dtype"])
    q = torch.randn(1, S, config["heads"], config["head_dim"], device="cuda", dtype=dtype)
    k, v = (torch.randn(1, S, config["kv_heads"], config["head_dim"], device="cuda",
                        dtype=dtype) for _ in "kv")
    group = config["heads"] // config["kv_heads"]
    return checked_attention_times(*(x.transpose(1, 2) for x in (q, k, v)), PATHS,
                                   heads_checked=group)


def prefill_measurements(model, S, progress=None) -> dict:
    """A forward of one sequence of ``S`` tokens, no cache, on each path: its device
    time (the paths that run taking turns: they differ by less than the clocks drift
    over a measurement), the book's logits of the last COMPARED_POSITIONS positions
    against SDPA's (relative error of the whole block, and the largest difference),
    and one layer's attention alone (:func:`attention_alone`)."""
    import torch

    progress = progress or (lambda line: None)
    t0 = time.perf_counter()
    tokens = torch.randint(0, model.config["vocab"], (1, S), device="cuda")
    row, last = dict(batch=1, S=S, ms={}, rel_err=None, max_abs_err=None), {}
    with torch.no_grad():
        for name, attend in PATHS.items():
            logits = or_none(lambda: model(tokens, attend))
            if logits is not None:  # this first run made the lean call's plans: untimed
                last[name] = logits[:, -COMPARED_POSITIONS:].double()
            del logits  # one path's (S, vocab) logits at a time
        timed = time_alternating({name: lambda attend=attend: model(tokens, attend)
                                  for name, attend in PATHS.items() if name in last})
        row["ms"] = {name: timed[name].median_ms if name in timed else None for name in PATHS}
    if len(last) == len(PATHS):
        want = last["sdpa"]
        row["rel_err"] = ((last["book"] - want).norm() / want.norm()).item()
        row["max_abs_err"] = (last["book"] - want).abs().max().item()
        row["attention_us"] = attention_alone(model.config, S)
    progress(f"prefill, 1 x {S} tokens: " + ", ".join(
        f"{path} {ms:.2f} ms" for path, ms in row["ms"].items() if ms is not None)
        + (f"; book vs sdpa rel err {row['rel_err']:.1e}" if row["rel_err"] is not None else "")
        + ("; one layer's attention: " + ", ".join(
            f"{path} {us:.1f} us" for path, us in row["attention_us"].items())
           if "attention_us" in row else "")
        + f" [{time.perf_counter() - t0:.1f} s]")
    return row


def generation_measurements(model, batch, prompt, steps, progress=None) -> dict:
    """Greedy generation with the cache, eager: a ``prompt``-token prefill (its device
    time on each path), then ``steps`` tokens one at a time (:func:`generation_compared`):
    in the first pass SDPA's path picks the tokens and every step meets a cache length
    for the first time; the later passes, timed, feed each path the same tokens again,
    so that the logits of every step can be compared (the largest relative error of a
    step, book vs SDPA)."""
    import torch

    progress = progress or (lambda line: None)
    t0 = time.perf_counter()
    tokens = torch.randint(0, model.config["vocab"], (batch, prompt), device="cuda")
    with torch.no_grad():
        prefill_ms = {name: _device_ms(lambda: model(tokens, attend, model.cache(batch)))
                      for name, attend in PATHS.items()}
    out = dict(batch=batch, prompt=prompt, steps=steps, prefill_ms=prefill_ms,
               **generation_compared(model, tokens, steps, PATHS))
    error = out["max_step_rel_err"]
    progress(f"generation, batch {batch}, {prompt}-token prompt, {steps} tokens: "
             + per_token_line(out)
             + (f"; book vs sdpa max step rel err {error:.1e}" if error is not None else "")
             + f" [{time.perf_counter() - t0:.1f} s]")
    return out


#: what the measurements depend on (kernels.results.measured_hash follows their code
#: from these): the kernels the lean call launches and its choices, the measuring code
#: and its sizes
MEASURES = (*launch.launched(), gpu_measurements, free_poisoned_block, FULL, QUICK,
            COMPARED_POSITIONS, PATHS, AGAIN_PASSES)
