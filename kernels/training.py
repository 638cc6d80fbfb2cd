"""The backward pass's chapter's training comparison: the same model trained on each path.

``train(attend, ...)`` trains chapter 8's GPT-2-small-shaped decoder
(:func:`kernels.models.gpt2_small`: width 768, 12 heads of 64) from GPT-2's
initialisation (:func:`gpt2_init`), with AdamW on fp32 weights under bf16 autocast, on a
copy task (:func:`copy_task`) whose loss falls within about a hundred steps: each sequence is a
random prefix repeated to fill it, so that every token after the first copy can be read
off an earlier copy by attention. ``attend(q, k, v)`` is the model's causal
attention: ``kernels.models.sdpa_attend`` (PyTorch's) or ``kernels.models.book_attend``
(the book's kernels through the lean call, forward and backward). It gives the loss of
every step, the device and host time of a step and the peak memory.
:func:`step_times` times the paths' steps taking turns, which a comparison of a few
percent needs where the step is bound by the host, whose speed drifts.

``train(attend, model="llama", ...)`` trains a Llama-shaped decoder instead
(:func:`kernels.llama.llama_shaped` at LLAMA's sizes: grouped-query attention, RoPE,
RMSNorm, SwiGLU), whose attention is ``kernels.llama.sdpa_gqa_attend`` or
:func:`book_llama_attend`.

``gpu_measurements()`` is what a GPU run records (``quick=True``: fewer steps, for the
chapter's live run): SDPA from two initialisations (seeds 0 and 1) and the book's
attention twice from the first, all on the same batches in the same order, and
:func:`agreement`: whether the book's curve stays as close to SDPA's as SDPA's own curve
from another seed does. Bit-for-bit equal curves are not to be expected: the two paths
round differently in bf16, and training amplifies any difference; another
initialisation says how far apart two equally good runs may be. But the loss sits near
ln(vocab) for a few dozen steps, then falls steeply, and on that plateau training
amplifies rounding as much as it does another initialisation, so a curve from one other
seed is a loose yardstick and ``within`` may go either way: the book's second run, whose
dQ reductions add in another order, says how far rounding alone moves its curve. So the
record also has what does not depend on the plateau: the first step's gradients, from
the same weights and batch, on each path against fp32 (:func:`gradient_errors`), and the
step at which each run's loss falls below 1 (:func:`first_step_below`). And beside the
step time, which at these sizes the host's speed can set, the step captured whole in a
CUDA graph, which runs with no host between its kernels (:func:`graphed_step_times`):
what a step costs the GPU. Not torch's profiler: with torch 2.11's CUPTI buffers, a
process that had profiled training aborted at exit (a double free, pytorch#195207).

This module is hand-written and sits above the models (which call the lean call): the
chapters' modules never import it.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from . import gpus, launch
from .llama import book_gqa_attend, llama_shaped, sdpa_gqa_attend
from .bench import in_turns, time_alternating
from .models import book_attend, cuda_graph, gpt2_small, sdpa_attend
from .results import smooth

#: this measurement times the host (eager steps, the two paths taking turns), which
#: other processes on the machine slow: kernels.rerecord runs it with no other job
#: beside it
TIMES_THE_HOST = True
#: its calls go through the lean call, whose choice of form reads this GPU's records:
#: kernels.rerecord measures it after the timings it records again
USES_THE_LEAN_CALL = True

#: what gpu_measurements trains: GPT-2 small (12 layers, width 768, 12 heads of 64) on
#: 32 rows of 256 tokens a step, each row a 32-token prefix repeated, with a small
#: vocabulary so that the embedding does not dominate. (Tried on an H200 with SDPA: at
#: 8 x 1024 or 16 x 512 tokens, or with GPT-2's depth-scaled initialisation, 12 layers
#: sat at ln(512) for 100 to more than 1000 steps, or never left it from some seeds.
#: Here every run leaves it within the first hundred steps: the record says where.)
CONFIG = dict(steps=300, batch=32, length=256, period=32, layers=12, vocab=512, lr=1e-3,
              warmup=20, weight_decay=0.1, clip=1.0)
#: the Llama-shaped decoder gpu_measurements also trains (``train(model="llama")``:
#: :func:`kernels.llama.llama_shaped`), with CONFIG's task and optimiser: Llama 3's
#: attention (query heads in groups of four, each group reading one key/value head of
#: 128, RoPE) with RMSNorm and SwiGLU, at a width that trains in seconds a run
LLAMA = dict(layers=8, heads=8, kv_heads=2, head_dim=128, width=1024, ffn=3584)
#: steps of ``gpu_measurements(quick=True)``: the chapter's live run, long enough to
#: see the loss fall
QUICK_STEPS = 150
#: the loss a run has learned the task by (:func:`first_step_below`): from ln(512)
LEARNED_LOSS = 1.0
#: the batches' seed: every run sees the same batches in the same order
DATA_SEED = 1234
#: steps left out of the median step time: the first launches compile and allocate
TIMING_WARMUP = 5
#: the step-time comparison (:func:`step_times`): rounds of turns, steps a turn, and the
#: first steps of each turn left out (a path's first steps after the other's are slower)
STEP_TIME_ROUNDS = 9
STEP_TIME_STEPS = 25
TURN_WARMUP = 5
#: the graphed step's comparison (:func:`graphed_step_times`): rounds of turns, and
#: replays of a path's graph a turn
GRAPH_ROUNDS = 5
GRAPH_REPLAYS = 20
#: the runs gpu_measurements makes, in order: (name, attention, seed of the weights); the
#: book's twice, to see how far its own curve moves from run to run
RUNS = (("sdpa", sdpa_attend, 0), ("sdpa_seed_1", sdpa_attend, 1), ("book", book_attend, 0),
        ("book_again", book_attend, 0))


def book_llama_attend(q, k, v):
    """The book's grouped-query attention as the Llama-shaped model trains with it, under
    bf16 autocast: RoPE multiplies q and k by fp32 angles, which makes them fp32; SDPA
    casts its inputs to autocast's dtype, and the lean call is given them cast the same
    way (strides kept: views of (B, S, H, D) storage still)."""
    import torch

    dtype = (torch.get_autocast_dtype(q.device.type)
             if torch.is_autocast_enabled(q.device.type) else v.dtype)
    return book_gqa_attend(q.to(dtype), k.to(dtype), v.to(dtype))


#: the Llama-shaped model's runs: (name, attention, seed of the weights)
LLAMA_RUNS = (("sdpa", sdpa_gqa_attend, 0), ("sdpa_seed_1", sdpa_gqa_attend, 1),
              ("book", book_llama_attend, 0))


def copy_task(batch, length, vocab, seed, period=None) -> np.ndarray:
    """(batch, length + 1) int64 tokens, deterministic from ``seed`` (an int or a
    sequence of ints, as ``np.random.default_rng`` takes): each row is a random prefix
    of ``period`` tokens (``length // 2`` by default) drawn uniformly from
    ``range(vocab)``, repeated to fill the row. A model reads the first ``length``
    tokens and predicts the next one at each; from position ``period`` on, the next
    token is a copy of the one ``period`` back, which attention can find
    (:func:`copy_loss` scores only those)."""
    period = length // 2 if period is None else period
    if not 1 <= period < length:
        raise ValueError(f"copy_task: period {period} leaves nothing to copy in {length}")
    prefix = np.random.default_rng(seed).integers(0, vocab, (batch, period), dtype=np.int64)
    return np.tile(prefix, (1, -(-(length + 1) // period)))[:, :length + 1]


def copy_loss(logits, tokens, period):
    """Cross-entropy of the predictable positions only: those from ``period`` on, whose
    next token repeats one ``period`` back (the first period's are random, and would
    keep the loss above a floor however well the model copies). ``logits``: (B,
    length, vocab) for ``tokens[:, :-1]``."""
    import torch

    return torch.nn.functional.cross_entropy(
        logits[:, period:].reshape(-1, logits.shape[-1]), tokens[:, period + 1:].reshape(-1))


def gpt2_init(model, seed):
    """GPT-2's initialisation, in place, without its depth scaling: every matrix
    N(0, 0.02) (the embeddings too), biases 0, LayerNorm's gains 1. gpt2_small's
    weights are PyTorch's defaults, made for timing: its tied N(0, 1) embedding starts
    the loss in the hundreds. (GPT-2 also scales the residual branches' output
    projections by 1 / sqrt(2 layers); at 12 layers that made the copy task's plateau
    far longer.)"""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)


def initial_model(model, *, seed, layers, vocab, length, device):
    """The decoder a run trains, in fp32, weights from ``seed`` (:func:`gpt2_init`):
    ``model`` "gpt2", chapter 8's GPT-2-small-shaped one (12 heads of 64), or "llama",
    the Llama-shaped one of LLAMA's sizes (grouped-query attention; its attention
    takes (B, H, S, D) q and (B, H_kv, S, D) k and v)."""
    if model not in ("gpt2", "llama"):
        raise ValueError(f"initial_model: model must be 'gpt2' or 'llama', got {model!r}")
    import torch

    if model == "gpt2":
        net = gpt2_small(layers=layers, vocab=vocab, context=length, device=device,
                         dtype=torch.float32, seed=seed)
    else:
        net = llama_shaped(**dict(LLAMA, layers=layers), vocab=vocab, context=length,
                           device=device, dtype=torch.float32, seed=seed)
    gpt2_init(net, seed)
    return net


def trainer(attend, *, model="gpt2", seed=0, layers=12, vocab=512, length=256, period=32,
            lr=1e-3, warmup=20, weight_decay=0.1, clip=1.0, device="cuda", capturable=False):
    """``step(tokens) -> loss``: one training step of a decoder (:func:`initial_model`,
    weights from ``seed``) with ``attend`` as its attention, as :func:`train` takes
    them: AdamW on fp32 weights (weight decay on matrices only), the learning rate
    rising linearly over ``warmup`` steps then constant, the gradient clipped to norm
    ``clip``; on CUDA under bf16 autocast. ``capturable``: AdamW's step count kept on
    the GPU, so that a step can be captured in a CUDA graph (:func:`graphed_step_times`)."""
    import torch

    cuda = torch.device(device).type == "cuda"
    net = initial_model(model, seed=seed, layers=layers, vocab=vocab, length=length,
                        device=device)
    net.train()  # (it has no dropout: the same as eval)
    matrices = [p for p in net.parameters() if p.dim() == 2]
    others = [p for p in net.parameters() if p.dim() != 2]
    optimizer = torch.optim.AdamW(
        [dict(params=matrices, weight_decay=weight_decay), dict(params=others, weight_decay=0.0)],
        lr=lr, betas=(0.9, 0.95), fused=cuda, capturable=capturable)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))

    def step(tokens):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=cuda):
            loss = copy_loss(net(tokens[:, :-1], attend), tokens, period)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        optimizer.step()
        schedule.step()
        return loss.detach()

    return step


def batches(steps, *, batch, length, vocab, period, data_seed=DATA_SEED, device="cuda"):
    """``steps`` batches of :func:`copy_task` (step i's from ``(data_seed, i)``), all on
    the device before the first step: no copy or sync inside a training loop."""
    import torch

    return torch.from_numpy(np.stack([copy_task(batch, length, vocab, (data_seed, i), period)
                                      for i in range(steps)])).to(device)


def timed_steps(step, data, cuda: bool) -> tuple[list, list, list]:
    """``step`` on each batch of ``data`` in turn: what each step returned, each step's
    time in ms (device time between CUDA events; on the CPU, wall time), and on CUDA the
    host time to queue each (else an empty list). One synchronisation, at the end."""
    import torch

    outputs, times, host = [], [], []
    for tokens in data:
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
        t = time.perf_counter()
        outputs.append(step(tokens))
        elapsed = (time.perf_counter() - t) * 1e3
        if cuda:
            end.record()
            times.append((start, end))
            host.append(elapsed)
        else:
            times.append(elapsed)
    if cuda:
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in times]
    return outputs, times, host


def step_times(paths: dict, *, model="gpt2", rounds=STEP_TIME_ROUNDS,
               steps_a_turn=STEP_TIME_STEPS, turn_warmup=TURN_WARMUP, batch=32, length=256,
               period=32, vocab=512, device="cuda", **config) -> dict:
    """``(ms, turns)``: a model on each of ``paths`` ({name: attend}, the same weights),
    stepped taking turns (:func:`in_turns`), ``steps_a_turn`` steps a turn, ``rounds``
    rounds, on the same batches; each step timed by CUDA events (on the CPU, the wall
    clock), the first round and each turn's first ``turn_warmup`` steps left out as
    warm-ups. ``ms``: each path's median step; ``turns``: each path's median step of each
    counted turn, whose spread shows how far a path's speed moves over the
    run. Runs of two paths made one after the other differ by 10-20% as the host's speed
    drifts (the step is bound by the host); taken in turns, the drift falls on every path
    alike. ``config``: :func:`trainer`'s other settings."""
    import torch

    cuda = torch.device(device).type == "cuda"
    config = {k: v for k, v in config.items() if k not in ("steps", "data_seed")}
    steppers = {name: trainer(attend, model=model, vocab=vocab, length=length, period=period,
                              device=device, **config) for name, attend in paths.items()}
    data = batches(steps_a_turn, batch=batch, length=length, vocab=vocab, period=period,
                   device=device)
    times: dict = {name: [] for name in paths}
    turns: dict = {name: [] for name in paths}
    for r, name in in_turns(list(paths), rounds):
        _, marks, _ = timed_steps(steppers[name], data, cuda)
        if r > 0:
            times[name] += marks[turn_warmup:]
            turns[name].append(statistics.median(marks[turn_warmup:]))
    del steppers, data
    if cuda:
        torch.cuda.empty_cache()
    return {name: statistics.median(t) for name, t in times.items()}, turns


def graphed_step_times(paths: dict, *, model="gpt2", rounds=GRAPH_ROUNDS,
                       replays=GRAPH_REPLAYS, batch=32, length=256, period=32, vocab=512,
                       **config) -> dict:
    """Each path's training step captured whole in one CUDA graph and replayed, in ms:
    the replays timed as every kernel is (kernels.bench.time_alternating: ``rounds``
    rounds taking turns, ``replays`` replays a path a round, L2 emptied before each), each
    path's median of its rounds' medians.
    A replay launches the step's kernels with no Python between them, so it takes what
    the step costs the GPU, gaps included, whatever the host's speed: how a model that
    small is trained where the host would otherwise set the pace. The step is
    :func:`trainer`'s, captured after :data:`TIMING_WARMUP` eager steps
    (kernels.models.cuda_graph); the learning rate of the capture holds for every replay.
    ``config``: :func:`trainer`'s other settings."""
    import torch

    config = {k: v for k, v in config.items() if k not in ("steps", "data_seed")}
    tokens = batches(1, batch=batch, length=length, vocab=vocab, period=period)[0]
    steps, graphs, losses = {}, {}, {}  # each graph writes its own model's memory: keep both
    for name, attend in paths.items():
        steps[name] = trainer(attend, model=model, vocab=vocab, length=length, period=period,
                              capturable=True, **config)
        graphs[name], losses[name] = cuda_graph(lambda s=steps[name]: s(tokens),
                                                warmup=TIMING_WARMUP)
    times = time_alternating({name: graph.replay for name, graph in graphs.items()},
                             rounds=rounds, budget_s=0.0, min_reps=replays)
    for name, loss in losses.items():  # the replays trained: the last loss is a number
        if not torch.isfinite(loss).item():
            raise RuntimeError(f"graphed_step_times: {name}'s replayed step gave a loss of "
                               f"{loss.item()}")
    del graphs, steps, losses, tokens
    torch.cuda.empty_cache()
    return {name: t.median_ms for name, t in times.items()}


def train(attend, *, steps, model="gpt2", seed=0, data_seed=DATA_SEED, batch=32, length=256,
          period=32, layers=12, vocab=512, lr=1e-3, warmup=20, weight_decay=0.1, clip=1.0,
          device="cuda", progress=None) -> dict:
    """Train a decoder (:func:`initial_model`: ``model`` "gpt2", the GPT-2-small-shaped
    one, or "llama"), weights from ``seed``, for ``steps`` steps
    on :func:`copy_task` batches of ``length`` tokens repeating every ``period`` (None:
    ``length // 2``), from ``data_seed`` (step i's from ``(data_seed, i)``),
    with ``attend`` as its attention. AdamW on fp32 weights (weight decay on matrices
    only), the learning rate rising linearly over ``warmup`` steps then constant, the
    gradient clipped to norm ``clip``; on CUDA under bf16 autocast (on the CPU, for
    trying it without a GPU, in fp32). Gives the loss of every step, the median time
    of a step after TIMING_WARMUP (device time between CUDA events; on the CPU, wall
    time), on CUDA the median host time to queue a step (``host_ms``: where it is as
    long as the step, the host sets the pace, not the GPU), and the peak memory
    allocated (CUDA only, else None). Reports one line to ``progress`` when done."""
    import torch

    progress = progress or (lambda line: None)
    cuda = torch.device(device).type == "cuda"
    t0 = time.perf_counter()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    period = length // 2 if period is None else period
    step = trainer(attend, model=model, seed=seed, layers=layers, vocab=vocab, length=length,
                   period=period, lr=lr, warmup=warmup, weight_decay=weight_decay, clip=clip,
                   device=device)
    data = batches(steps, batch=batch, length=length, vocab=vocab, period=period,
                   data_seed=data_seed, device=device)
    losses, times, host = timed_steps(step, data, cuda)
    losses = torch.stack(losses).float().cpu().tolist()
    out = dict(losses=losses, step_ms=statistics.median(times[TIMING_WARMUP:] or times),
               host_ms=statistics.median(host[TIMING_WARMUP:] or host) if cuda else None,
               peak_memory_bytes=torch.cuda.max_memory_allocated() if cuda else None,
               seconds=time.perf_counter() - t0)
    del step, data
    if cuda:
        torch.cuda.empty_cache()
    progress(f"{steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
             f"{out['step_ms']:.1f} ms a step"
             + (f" ({out['host_ms']:.1f} ms of host time to queue it)" if cuda else "")
             + (f", peak {out['peak_memory_bytes'] / 2**30:.2f} GiB" if cuda else "")
             + f" [{out['seconds']:.1f} s]")
    return out


def agreement(losses_book, losses_sdpa, losses_sdpa_other_seed, *, window=10, skip=10,
              until=None, losses_book_again=None) -> dict:
    """Whether the book's loss curve stays as close to SDPA's (same weights, same
    batches) as SDPA's from other weights does: each curve smoothed over ``window``
    steps (:func:`smooth`), the averages of windows that start at step ``skip`` or
    later (and before ``until``, where given) compared. ``book_vs_sdpa``: the largest
    |book - SDPA|; ``seed_spread``: the largest |SDPA other seed - SDPA|; ``within``:
    the first is at most the second. Also each curve's last average compared
    (``final``); and, given the book's run repeated from the same weights
    (``losses_book_again``), ``book_repeat``: the largest |book again - book|, how far
    the book's curve moves from one run to the next (dQ's atomic additions round in
    another order each run)."""
    named = dict(book=losses_book, sdpa=losses_sdpa, other=losses_sdpa_other_seed)
    if losses_book_again is not None:
        named["again"] = losses_book_again
    curves = {name: np.asarray(c, dtype=np.float64) for name, c in named.items()}
    if len({len(c) for c in curves.values()}) != 1:
        raise ValueError(f"agreement: curves of {[len(c) for c in curves.values()]} steps")
    smoothed = {name: smooth(c, window)[skip:until] for name, c in curves.items()}
    book, sdpa, other = smoothed["book"], smoothed["sdpa"], smoothed["other"]
    if not len(sdpa):
        raise ValueError(f"agreement: nothing left of {len(curves['sdpa'])} steps after "
                         f"skip={skip} and window={window} (until={until})")
    book_gap, seed_gap = np.abs(book - sdpa), np.abs(other - sdpa)
    out = dict(window=window, skip=skip, until=until, book_vs_sdpa=float(book_gap.max()),
               seed_spread=float(seed_gap.max()),
               within=bool(book_gap.max() <= seed_gap.max()),
               final=dict(book=float(book[-1]), sdpa=float(sdpa[-1]),
                          sdpa_other_seed=float(other[-1])))
    if "again" in smoothed:
        out["book_repeat"] = float(np.abs(smoothed["again"] - book).max())
    return out


def first_step_below(losses, level, window=10):
    """The first step (counted from 1) at which the mean of the last ``window`` steps'
    losses is below ``level``; None if none is."""
    below = np.flatnonzero(smooth(losses, window) < level)
    return int(below[0]) + window if len(below) else None


def gradient_errors(attends, *, seed=0, data_seed=DATA_SEED, batch=32, length=256, period=32,
                    layers=12, vocab=512, **_) -> dict:
    """The first training step's gradients through each of ``attends`` ({name:
    attend}), under bf16 autocast, against the same step in fp32 through SDPA's math
    backend (TF32 off): the relative error (2-norm over every parameter's gradient) of
    each, and of each against the first. The weights and batch are ``train``'s first
    for the same seeds and sizes; CUDA only."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = initial_model("gpt2", seed=seed, layers=layers, vocab=vocab, length=length,
                          device="cuda")
    tokens = torch.from_numpy(copy_task(batch, length, vocab, (data_seed, 0), period)).cuda()

    def gradient(attend, autocast=True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = copy_loss(model(tokens[:, :-1], attend), tokens, period)
        loss.backward()
        return torch.cat([p.grad.flatten().double() for p in model.parameters()])

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            want = gradient(sdpa_attend, autocast=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    got = {name: gradient(attend) for name, attend in attends.items()}
    first = next(iter(got))
    out = {name: ((g - want).norm() / want.norm()).item() for name, g in got.items()}
    out.update({f"{name}_vs_{first}": ((g - got[first]).norm() / got[first].norm()).item()
                for name, g in got.items() if name != first})
    del model, got, want
    torch.cuda.empty_cache()
    return out


def python_function_alone():
    """A ``torch.autograd.Function`` with no work in it, shaped as the lean call's: its
    forward saves q, k and v and allocates the output, its backward hands the output's
    gradient back as theirs. What it costs the host is what any attention written in
    Python pays to be differentiable, before its own code runs."""
    import torch

    class Alone(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, dout):
            ctx.saved_tensors
            return dout, dout, dout

    return Alone.apply


def attention_call_costs(*, batch=32, length=256, heads=12, head_dim=64, **_) -> dict:
    """One layer's attention, forward and backward, as training calls it (causal, bf16,
    q, k and v (B, H, S, D) views of one (B, S, 3, H, D) projection, the output's
    gradient a view of (B, S, H, D) storage, as the model's reshape hands it back): for
    SDPA, the book's lean call
    (eager: through its ``torch.autograd.Function``), the same through the custom op
    that torch.compile traces, and a Python autograd function with no work in it
    (:func:`python_function_alone`), the device time (:func:`kernels.bench.time_gpu`)
    and the host time of a call with the GPU idle (:func:`kernels.bench.host_time_alone`),
    in microseconds."""
    import torch

    from .bench import host_time_alone, time_gpu

    x = torch.randn(batch, length, 3, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    dout = torch.randn(batch, length, heads, head_dim, device="cuda",
                       dtype=torch.bfloat16).transpose(1, 2)
    op = launch.register_torch_op(differentiable=True)
    paths = {"sdpa": sdpa_attend, "book": book_attend,
             "book_custom_op": lambda q, k, v: op(q, k, v, True, None)[0],
             "python_function_alone": python_function_alone()}
    out = {}
    for name, attend in paths.items():
        def call():
            attend(*x.permute(2, 0, 3, 1, 4)).backward(dout)
        out[name] = dict(device_us=time_gpu(call).median_ms * 1e3,
                         host_us=host_time_alone(call, reps=500))
    del x, dout
    return out


def compared_runs(runs_to_make, config, progress, t0, label="") -> dict:
    """Each run of ``runs_to_make`` ((name, attention, seed)) trained at ``config``, one
    line to ``progress`` as each finishes, with the step at which its loss fell below
    LEARNED_LOSS, by name."""
    runs = {}
    for name, attend, seed in runs_to_make:
        runs[name] = dict(seed=seed, **train(
            attend, seed=seed, data_seed=DATA_SEED, **config,
            progress=lambda line: progress(f"{label}{name}, seed {seed}: {line} "
                                           f"({time.perf_counter() - t0:.0f} s in all)")))
        runs[name]["learned_at"] = first_step_below(runs[name]["losses"], LEARNED_LOSS)
    return runs


def gpu_measurements(progress=None, quick=False) -> dict:
    """The runs of RUNS at CONFIG (``quick``: QUICK_STEPS steps), one line to
    ``progress`` as each finishes; their :func:`agreement`; the step at which each
    run's loss fell below LEARNED_LOSS; and the first step's :func:`gradient_errors`
    on each path; each path's step taken in turns (:func:`step_times`) and captured in
    a CUDA graph (:func:`graphed_step_times`); and what one layer's attention costs the
    device and the host (:func:`attention_call_costs`); then, under "llama", the same
    comparison of the Llama-shaped model (LLAMA_RUNS, LLAMA's sizes, CONFIG's task). The
    book's runs are not guarded: where its attention cannot train (no backward), this
    raises."""
    progress = progress or (lambda line: None)
    config = dict(CONFIG, steps=QUICK_STEPS if quick else CONFIG["steps"])
    t0 = time.perf_counter()
    runs = compared_runs(RUNS, config, progress, t0)
    gradients = gradient_errors({"sdpa": sdpa_attend, "book": book_attend}, seed=0,
                                data_seed=DATA_SEED, **config)
    progress("the first step's gradients against fp32: " + ", ".join(
        f"{name} {err:.2e}" for name, err in gradients.items())
        + f" ({time.perf_counter() - t0:.0f} s in all)")
    step_ms, step_turns = step_times({"sdpa": sdpa_attend, "book": book_attend}, **config)
    progress(f"a step, taken in turns: book {step_ms['book']:.1f} ms, SDPA "
             f"{step_ms['sdpa']:.1f} ms ({time.perf_counter() - t0:.0f} s in all)")
    graphed_ms = graphed_step_times({"sdpa": sdpa_attend, "book": book_attend}, **config)
    progress(f"a step in a CUDA graph: book {graphed_ms['book']:.2f} ms, SDPA "
             f"{graphed_ms['sdpa']:.2f} ms ({time.perf_counter() - t0:.0f} s in all)")
    calls = attention_call_costs(**config)
    progress("one layer's attention, forward and backward: " + ", ".join(
        f"{name} {c['device_us']:.0f} us on the device, {c['host_us']:.0f} us of host time"
        for name, c in calls.items()) + f" ({time.perf_counter() - t0:.0f} s in all)")
    llama_config = dict(config, model="llama", layers=LLAMA["layers"])
    llama_runs = compared_runs(LLAMA_RUNS, llama_config, progress, t0, "Llama-shaped, ")
    llama_step_ms, llama_turns = step_times(
        {"sdpa": sdpa_gqa_attend, "book": book_llama_attend}, **llama_config)
    progress(f"Llama-shaped, a step, taken in turns: book {llama_step_ms['book']:.1f} ms, SDPA "
             f"{llama_step_ms['sdpa']:.1f} ms ({time.perf_counter() - t0:.0f} s in all)")
    llama_graphed_ms = graphed_step_times(
        {"sdpa": sdpa_gqa_attend, "book": book_llama_attend}, **llama_config)
    progress(f"Llama-shaped, a step in a CUDA graph: book {llama_graphed_ms['book']:.2f} ms, "
             f"SDPA {llama_graphed_ms['sdpa']:.2f} ms ({time.perf_counter() - t0:.0f} s in all)")
    llama = dict(config=dict(llama_config, **LLAMA), runs=llama_runs, step_ms=llama_step_ms,
                 step_turns_ms=llama_turns, graphed_ms=llama_graphed_ms,
                 agreement=agreement(llama_runs["book"]["losses"], llama_runs["sdpa"]["losses"],
                                     llama_runs["sdpa_seed_1"]["losses"]))
    return dict(gpu=gpus.current().name, quick=quick, config=config, data_seed=DATA_SEED,
                learned_loss=LEARNED_LOSS, runs=runs, step_ms=step_ms, step_turns_ms=step_turns,
                graphed_ms=graphed_ms,
                gradients=gradients,
                calls=calls,
                agreement=agreement(runs["book"]["losses"], runs["sdpa"]["losses"],
                                    runs["sdpa_seed_1"]["losses"],
                                    losses_book_again=runs["book_again"]["losses"]),
                llama=llama)


#: what the recorded training depends on (kernels.results.measured_hash follows their
#: code from these): the lean call's kernels, forward and backward, and its choices,
#: this module's task, training loop, comparison (its curves smoothed by results.smooth)
#: and settings, and the turn order of its step times (kernels.bench)
MEASURES = (*launch.launched(), gpu_measurements, in_turns, smooth, CONFIG, LLAMA,
            QUICK_STEPS, LEARNED_LOSS, DATA_SEED, TIMING_WARMUP, STEP_TIME_ROUNDS, STEP_TIME_STEPS,
            TURN_WARMUP, GRAPH_ROUNDS, GRAPH_REPLAYS, RUNS, LLAMA_RUNS)
