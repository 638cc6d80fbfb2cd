"""The models of chapter 8, on the lean call, and what chapter 8 measures of them.

``gpt2_small()`` is a GPT-2-small-shaped decoder with random weights whose attention
is a function passed in: ``sdpa_attend`` (PyTorch's) or ``book_attend`` (the book's
kernels through :func:`kernels.launch.attention`); both read the projection's views in
place. ``gpu_measurements()`` is what
``python -m kernels.record`` runs on a GPU for chapter 8, and what the chapter runs live
there (``quick=True``: fewer batches and tokens): the lean call's host time, the small
shapes' choice of kernel, the model's forward, eager and graphed, and a generation loop
with a key/value cache. Each stage reports a line to ``progress`` as it finishes. They
run on every GPU the book does: where a kernel or an SDPA backend cannot run, its time
is None.

This module is hand-written and sits above the lean call (which launches the chapters'
kernels): the chapters' modules never import it.
"""

from __future__ import annotations

import statistics
import time

from . import gpus, launch
from .bench import host_call_times, host_time_alone, time_alternating, time_gpu
from .check import TOLERANCES, free_poisoned_block
from .reference import sdpa

#: chapter 8's measurements here time the host (a call's Python, eager forwards,
#: generation), which other processes on the machine slow: kernels.rerecord runs them
#: with no other job beside them
TIMES_THE_HOST = True
#: its calls go through the lean call, whose choice of form reads this GPU's records:
#: kernels.rerecord measures it after the timings it records again
USES_THE_LEAN_CALL = True


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
    """The book's kernels through the lean call, on the views as they come: q, k and v
    of the projection's (B, S, 3, H, D) output, or k and v of the cache; the output
    comes back in (B, S, H, D) storage, so the caller's reshape copies nothing. (Eager
    code and CUDA graphs call it directly; torch.compile needs the custom op,
    ``launch.register_torch_op()``, which costs tens of microseconds a call eagerly.)"""
    return launch.attention(q, k, v, causal=True)


SMALL_SHAPES = [(1, 8, 512, 64), (1, 8, 1024, 64), (1, 16, 512, 128), (2, 8, 2048, 64),
                (4, 16, 512, 64), (1, 32, 1024, 128)]
MODEL_BATCHES = (1, 4, 8)
GENERATED_TOKENS = 64
#: what ``quick=True`` measures of the model: fewer batches and generated tokens
QUICK_MODEL = dict(batches=(1, 4), steps=32)
#: the shape the lean call's host time is measured at (B, H, S, D)
CALL_SHAPE = (1, 8, 512, 64)


def gpu_measurements(progress=None, quick=False) -> dict:
    """The lean call's host time and its parts, the small shapes' choice, and the
    model, eager and graphed, with a generation loop; ``quick``: the model at fewer
    batches, generating fewer tokens (QUICK_MODEL)."""
    progress = progress or (lambda line: None)
    gpu = gpus.current()
    return dict(gpu=gpu.name, compute_capability=list(gpu.compute_capability),
                multiprocessors=gpu.multiprocessors, quick=quick,
                **call_measurements(progress), small_shapes=small_shape_measurements(progress),
                model=model_measurements(**(QUICK_MODEL if quick else {}), progress=progress))


def or_none(measure):
    """``measure()``, or None where it cannot run here (an SDPA backend or a kernel
    this GPU does not have raises RuntimeError)."""
    try:
        return measure()
    except RuntimeError:
        return None


def call_measurements(progress=None) -> dict:
    """At CALL_SHAPE, fp16: the host time of a call (:func:`kernels.bench.host_call_times`)
    of the lean call, of SDPA's default and FlashAttention-2 backends, and of the
    chapters' API launching the kernel the lean call launches (``api_kernel``); and the
    lean call's parts, each timed alone on the host."""
    import torch

    progress = progress or (lambda line: None)
    t0 = time.perf_counter()
    q, k, v = (torch.randn(*CALL_SHAPE, device="cuda", dtype=torch.float16) for _ in range(3))
    plan = launch.plan_for(q, k, v)
    B, H, S, D = CALL_SHAPE
    chapter, name = launch.rows_kernel(gpus.current(), B * H, S, D)
    api = launch.CHAPTER_MODULES[chapter].KERNELS[name]
    calls = {"lean call": lambda: launch.attention(q, k, v),
             "SDPA default": lambda: sdpa(q, k, v, False, None, "default"),
             "SDPA flash": lambda: sdpa(q, k, v, False, None, "flash"),
             "the chapters' API": lambda: api(q, k, v)}
    host_calls = {call: or_none(lambda: host_call_times(fn)) for call, fn in calls.items()}
    stream = torch.cuda.current_stream().cuda_stream
    raw_stream = launch.torch_functions()[0]  # what a call asks for its stream
    breakdown = {
        "plan lookup": host_time_alone(lambda: launch.plan_for(q, k, v)),
        "output (torch.empty_like)": host_time_alone(lambda: torch.empty_like(q)),
        "stream": host_time_alone(lambda: raw_stream(0)),
        "cuLaunchKernel": host_time_alone(lambda: plan.launch(stream)),
        "whole call": host_time_alone(lambda: launch.attention(q, k, v))}
    progress(f"the call at B={B} H={H} S={S} D={D}, back to back: " + ", ".join(
        f"{call} {t['back_to_back_us']:.1f} µs" for call, t in host_calls.items() if t)
        + f" [{time.perf_counter() - t0:.1f} s]")
    return dict(host_calls=host_calls, call_breakdown=breakdown, api_kernel=plan.kernel)


def small_shape_measurements(progress=None) -> list[dict]:
    """Device time (µs) on each of SMALL_SHAPES, fp16, not causal: the lean call (and
    which kernel it picked), SDPA's default and FlashAttention-2 backends, and on sm_90
    each of the chapter 7 kernels it picks between there (launch.forms)."""
    import torch

    progress = progress or (lambda line: None)
    hopper = launch.CHAPTER_MODULES[7]
    on_hopper = gpus.current().compute_capability == (9, 0)
    small = []
    for B, H, S, D in SMALL_SHAPES:
        t0 = time.perf_counter()
        choices = launch.forms(D, causal=False) if on_hopper else ()
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
        us = {name: time_gpu(lambda: hopper.KERNELS[name](q, k, v)).median_ms * 1e3
              for name in choices}
        us["lean call"] = time_gpu(lambda: launch.attention(q, k, v)).median_ms * 1e3
        for backend in ("default", "flash"):
            t = or_none(lambda: time_gpu(lambda: sdpa(q, k, v, False, None, backend)))
            us[f"SDPA {backend}"] = t.median_ms * 1e3 if t else None
        row = dict(shape=f"B={B} H={H} S={S} D={D}", us=us, picked=launch.plan_for(q, k, v).kernel)
        small.append(row)
        progress(f"{row['shape']}: " + ", ".join(
            f"{name} {t:.1f} µs" for name, t in us.items() if t is not None)
            + f"; the lean call picks {row['picked']} [{time.perf_counter() - t0:.1f} s]")
    return small


def model_measurements(batches=MODEL_BATCHES, S=1024, prompt=128, steps=GENERATED_TOKENS,
                       progress=None) -> dict:
    """The GPT-2-small-shaped decoder, fp16, on each path: the forward at ``batches`` x
    ``S`` tokens, its logits against the fp32 model's and its device time, eager and
    graphed (the four timed taking turns: they differ by a few percent), and one layer's
    attention alone (:func:`attention_alone`); then generation at batch 4
    (:func:`_generation`)."""
    import torch

    progress = progress or (lambda line: None)
    model = gpt2_small()
    reference = gpt2_small(dtype=torch.float32)  # the same weights (the same seed), fp32
    paths = {"sdpa": sdpa_attend, "book": book_attend}
    forward = []
    for batch in batches:
        t0 = time.perf_counter()
        tokens = torch.randint(0, model.embed.num_embeddings, (batch, S), device="cuda")
        with torch.no_grad():
            want = reference(tokens, sdpa_attend).double()
            row = dict(batch=batch, S=S, ms={}, rel_err={})
            timed = {}
            for name, attend in paths.items():
                got = model(tokens, attend).double()
                row["rel_err"][name] = ((got - want).norm() / want.norm()).item()
                del got
                timed[f"{name} eager"] = lambda a=attend: model(tokens, a)
                timed[f"{name} graphed"] = cuda_graph(lambda a=attend: model(tokens, a))[0].replay
            row["ms"] = {path: t.median_ms for path, t in time_alternating(timed).items()}
            row["attention_us"] = attention_alone(batch, S)
            del want, timed
        forward.append(row)
        progress(f"forward, batch {batch} x {S} tokens: " + ", ".join(
            f"{path} {ms:.2f} ms" for path, ms in row["ms"].items())
            + "; one layer's attention: " + ", ".join(
                f"{path} {us:.1f} us" for path, us in row["attention_us"].items())
            + f" [{time.perf_counter() - t0:.1f} s]")
    del reference
    generation = _generation(model, prompt, steps, progress=progress)
    del model
    torch.cuda.empty_cache()  # give the memory back: a 16 GB GPU has more to measure after
    return dict(forward=forward, generation=generation)


def attention_alone(batch, S, heads=12, head_dim=64) -> dict:
    """{path: µs} of one layer's causal attention on the model's views (q, k and v of a
    (B, S, 3, H, D) projection, as ``gpt2_small`` hands them to ``attend``), by
    :func:`checked_attention_times`."""
    import torch

    qkv = torch.randn(batch, S, 3, heads, head_dim, device="cuda", dtype=torch.float16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    return checked_attention_times(q, k, v, {"sdpa": sdpa_attend, "book": book_attend})


def checked_attention_times(q, k, v, paths, heads_checked=None) -> dict:
    """{path: µs} of causal attention through each of ``paths`` ({name: attend(q, k,
    v)}), the paths taking turns, each checked against the float64 reference first
    (on q's first ``heads_checked`` heads and their key/value heads, where the whole
    reference would not fit). Before each check a block of q's size is left NaN for the
    path's new output (kernels.check.free_poisoned_block), and the outputs are held
    until every path is checked, so that none is handed another's answer."""
    from .reference import reference_attention

    n = heads_checked or q.shape[1]
    kv = max(1, n * k.shape[1] // q.shape[1])
    want, _ = reference_attention(q[:, :n], k[:, :kv], v[:, :kv], causal=True)
    tol = TOLERANCES[str(q.dtype).removeprefix("torch.")].rel
    held = []
    for name, attend in paths.items():
        free_poisoned_block(q)
        held.append(attend(q, k, v))
        err = ((held[-1][:, :n].double() - want).norm() / want.norm()).item()
        if not err <= tol:
            raise RuntimeError(f"checked_attention_times: {name}'s attention is {err:.2e} "
                               "off the float64 reference")
    del want, held
    return {path: t.median_ms * 1e3 for path, t in time_alternating(
        {name: lambda attend=attend: attend(q, k, v) for name, attend in paths.items()}).items()}


def cuda_graph(fn, warmup: int = 1):
    """``(graph, result)``: ``fn()`` captured in a CUDA graph, after ``warmup`` calls on a
    side stream (as torch asks: they make the allocations and plans outside the capture).
    Each ``graph.replay()`` runs ``fn``'s kernels again and writes into ``result``."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def _generation(model, prompt, steps, batch=4, progress=None) -> dict:
    """Greedy generation with a cache, eager: a ``prompt``-token prefill's device time on
    each path, the paths taking turns (a prefill this short is near the host's pace, which
    drifts), then ``steps`` tokens one at a time (:func:`generation_compared`)."""
    import torch

    progress = progress or (lambda line: None)
    t0 = time.perf_counter()
    tokens = torch.randint(0, model.embed.num_embeddings, (batch, prompt), device="cuda")
    paths = {"sdpa": sdpa_attend, "book": book_attend}
    with torch.no_grad():
        prefill_ms = {name: t.median_ms for name, t in time_alternating(
            {name: lambda attend=attend: model(tokens, attend, model.cache(batch))
             for name, attend in paths.items()}).items()}
    out = dict(batch=batch, prompt=prompt, steps=steps, prefill_ms=prefill_ms,
               **generation_compared(model, tokens, steps, paths))
    progress(f"generation, batch {batch}, {prompt}-token prompt, {steps} tokens: "
             + per_token_line(out) + f" [{time.perf_counter() - t0:.1f} s]")
    return out


def per_token_line(generation: dict) -> str:
    """A progress line's account of :func:`generation_compared`'s times a token."""
    return "per token " + ", ".join(
        f"{path} {ms:.3f} ms" for path, ms in generation["per_token_ms"].items()
        if ms is not None) + "; the device's time a token " + ", ".join(
        f"{path} {ms:.3f} ms" for path, ms in generation["device_per_token_ms"].items()
        if ms is not None)


#: passes of generation timed again, taking turns (:func:`generation_compared`)
AGAIN_PASSES = 5


def generation_compared(model, prompt_tokens, steps, paths) -> dict:
    """:func:`generate` on ``paths`` ({"sdpa": ..., "book": ...}): in the first pass
    SDPA's path picks the tokens and every step meets a cache length for the first time;
    then AGAIN_PASSES passes feed both paths those tokens again, taking turns, the
    order reversed every other pass (a step is bound by the host, whose speed drifts).
    The first pass's time per token on each path and the median of the later passes',
    the device's time a token with the host out of the way (:func:`step_device_ms`), and
    the largest relative error of a step's logits, book against SDPA, in the second pass
    (None where a path could not run)."""
    first = generate(model, prompt_tokens, steps, paths)
    passes = [generate(model, prompt_tokens, steps,
                       paths if i % 2 == 0 else dict(reversed(paths.items())), first["chosen"])
              for i in range(AGAIN_PASSES)]
    logits, error = passes[0]["logits"], None
    if len(logits) == len(paths):
        error = ((logits["book"] - logits["sdpa"]).norm(dim=(1, 2))
                 / logits["sdpa"].norm(dim=(1, 2))).max().item()
    per_token = {name: None if any(p["per_token_ms"][name] is None for p in passes) else
                 statistics.median(p["per_token_ms"][name] for p in passes) for name in paths}
    device = {name: None if per_token[name] is None else
              step_device_ms(model, prompt_tokens, first["chosen"], paths[name])
              for name in paths}
    return dict(per_token_ms=per_token, first_pass_per_token_ms=first["per_token_ms"],
                device_per_token_ms=device, max_step_rel_err=error)


def graphed_steps(model, prompt_tokens, picks, attend):
    """The generation steps that feed ``picks`` one a step after the prompt, captured in
    one CUDA graph (:func:`cuda_graph`): the graph, each step's logits at its one position
    (written by every replay) and the cache. A replay runs the steps from the prompt's
    cache length again, writing the same keys and values at the same places."""
    import torch

    cache = model.cache(prompt_tokens.shape[0])
    with torch.no_grad():
        model(prompt_tokens, attend, cache)
        prompt = cache.length

        def steps():
            cache.length = prompt
            return [model(token, attend, cache)[:, -1] for token in picks]

        graph, logits = cuda_graph(steps)
    return graph, logits, cache


def step_device_ms(model, prompt_tokens, picks, attend) -> float:
    """The device's time a generation step, in ms, with the host out of the way: the
    steps that feed ``picks`` after the prompt, captured in one CUDA graph
    (:func:`graphed_steps`), its replays timed on the device (kernels.bench.time_gpu),
    divided by the steps. Run eagerly, a step takes what the host needs to issue it; a
    replay issues every kernel of every step at once. (Not torch's profiler, which sums
    the kernels' own times: with torch 2.11, a process that had profiled aborted at exit
    in a double free of CUPTI's buffers, pytorch#195207.)"""
    graph, _, _ = graphed_steps(model, prompt_tokens, picks, attend)
    return time_gpu(graph.replay).median_ms / len(picks)


def generate(model, prompt_tokens, steps, paths, chosen=None) -> dict:
    """One pass of greedy generation on each of ``paths`` ({name: attend}), each from an
    empty cache (``model.cache(batch)``). Where ``chosen`` (a list of tokens) is None,
    the first path that runs picks the tokens and the others are fed its picks, so that
    their logits can be compared step by step. A path that cannot run here gets None
    for its time and no logits."""
    logits, per_token_ms, picks = {}, {}, chosen
    for name, attend in paths.items():
        run = or_none(lambda: greedy_pass(model, prompt_tokens, steps, attend, picks))
        if run is None:
            per_token_ms[name] = None
        else:
            logits[name], per_token_ms[name], picks = run
    return dict(chosen=picks, logits=logits, per_token_ms=per_token_ms)


def greedy_pass(model, prompt_tokens, steps, attend, picks=None):
    """(the logits of the prompt's last position and of each step, (steps + 1, B,
    vocab) in fp64; ms a step; the tokens fed): the prompt, then ``steps`` steps of one
    token, each the argmax of the last logits where ``picks`` is None, else the next of
    ``picks``. The steps are timed on the host: queued back to back, one synchronize."""
    import torch

    cache = model.cache(prompt_tokens.shape[0])
    picking = picks is None
    picks = [] if picking else picks
    with torch.no_grad():
        step_logits = [model(prompt_tokens, attend, cache)[:, -1]]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(steps):
            if picking:  # on the device: no synchronize between steps
                picks.append(step_logits[-1].argmax(-1, keepdim=True))
            step_logits.append(model(picks[i], attend, cache)[:, -1])
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) / steps * 1e3
    return torch.stack(step_logits).double(), ms, picks


#: what chapter 8's measurements depend on (kernels.results.measured_hash follows their
#: code from these): the kernels the lean call launches and its choices, and the
#: measuring code and its settings
MEASURES = (*launch.launched(), gpu_measurements, free_poisoned_block, AGAIN_PASSES,
            SMALL_SHAPES, MODEL_BATCHES, GENERATED_TOKENS, QUICK_MODEL, CALL_SHAPE)
