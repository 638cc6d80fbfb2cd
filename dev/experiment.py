"""What dev's GPU experiments share (not part of the book or the package): a log line
with the seconds since the start, the checks at odd shapes before anything is timed, and
rounds of timings over shapes, each line logged and the rows written to $OUT as they
come; for decoding, chapter 8's split kernel in variants beside the lean call and SDPA
(:func:`decoding_probe`). A script in a folder here imports it after
`sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))`."""
import functools
import json
import os
import time

_START = time.time()


def log(text: str) -> None:
    print(f"[{time.time() - _START:4.0f} s] {text}", flush=True)


def check_at(fns: dict, cases) -> None:
    """Each of ``fns`` ({name: kernel}) checked against the float64 reference, with its
    logsumexp, at each (B, H, S_q, S_k, D, causal, dtype) of ``cases``; the call stops at
    the first that fails, so that nothing is timed after a failed check."""
    from kernels.check import check_attention

    for name, fn in fns.items():
        for B, H, S_q, S_k, D, causal, dtype in cases:
            c = check_attention(fn, B, H, S_q, S_k, D, causal, lse=True, dtype=dtype,
                                raise_on_fail=False)
            log(f"check {name} {B},{H},{S_q},{S_k},{D},{causal},{dtype}: {c.summary()}")
            if not c.ok:
                raise SystemExit("a check failed: nothing timed")


def beside(contenders: dict, unchecked=()):
    """A ``measure`` for :func:`rounds`: chapter 7's timed_beside (each contender checked
    at the shape, unless labelled in ``unchecked``, then all timed in turns with SDPA's
    default); ``contenders(shape)`` gives {label: kernel}."""
    from kernels.chapters import ch07_hopper_attention as ch

    return lambda shape: ch.timed_beside(contenders(shape), shape, unchecked=unchecked)


def beside_flash_attention_4(contenders):
    """A ``measure`` for :func:`rounds`: ``contenders(shape)`` ({label: kernel}, checked
    before at odd shapes), SDPA's default and, where it imports, FlashAttention-4 on its
    own (B, S, H, D) layout, timed in turns (kernels.bench.time_alternating), fresh inputs
    each."""
    from kernels.bench import device_inputs, tflops, time_alternating
    from kernels.flash_attention_4 import flash_attn_func
    from kernels.reference import sdpa

    fa4 = flash_attn_func()
    log(f"FlashAttention-4: {'imported' if fa4 else 'not installed'}")

    def measure(shape):
        calls = {}
        for label, fn in contenders(shape).items():
            q, k, v, out = device_inputs(shape)
            calls[label] = functools.partial(fn, q, k, v, causal=shape.causal, out=out)
        q, k, v, _ = device_inputs(shape)
        calls["SDPA default"] = functools.partial(sdpa, q, k, v, shape.causal, None, "default")
        if fa4 is not None:
            q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in device_inputs(shape)[:3])
            calls["FlashAttention-4"] = functools.partial(fa4, q4, k4, v4, causal=shape.causal)
        times = time_alternating(calls)
        return dict(shape=shape.as_dict(), status="ok",
                    tflops={label: tflops(shape, t.median_ms) for label, t in times.items()})

    return measure


def rounds(shapes, measure, out_name: str, reps: int = 2, relative_to="SDPA default") -> list:
    """``measure(shape)`` (a row with "status" and "tflops" or "note") at each of
    ``shapes``, ``reps`` times over: a line a shape logged, each path's TFLOPS and its
    speed over ``relative_to``'s, and the rows written to $OUT/``out_name``."""
    rows = []
    for rep in range(reps):
        for shape in shapes:
            row = dict(measure(shape), rep=rep)
            rows.append(row)
            tf = row.get("tflops", {})
            log(f"{shape.label():28s} {row['status']} " + (" ".join(
                f"{n}={v:.0f}({v / tf[relative_to]:.3f})" for n, v in tf.items())
                if tf else row.get("note", "")))
            with open(os.path.join(os.environ.get("OUT", "."), out_name), "w") as f:
                json.dump(rows, f, indent=1)
    return rows


def decoding_probe(shapes, variants, out_name: str = "probe.json", flush=None) -> dict:
    """Chapter 8's tensor-core split kernel at grouped decoding shapes, in variants: at
    each (B, S_k, dtype) of ``shapes`` (:func:`grouped_decoding_call`), the launches of
    ``variants(kernel as committed, the prepared call, the GPU)`` ((name, kernel) pairs,
    each launch planned as it is yielded, so a variant may set a planning global before
    it and restore it after the last; a kernel met before with the same plan is skipped),
    the lean call and SDPA's default (enable_gqa), each checked, then timed in turns
    (kernels.layouts.checked_then_timed, L2 emptied by ``flush`` as time_gpu takes it);
    a line a shape logged, the rows written to $OUT/``out_name`` as they come."""
    import torch.nn.functional as F

    from kernels import gpus, launch, layouts

    gpu = gpus.current()
    found = dict(gpu=gpu.name, multiprocessors=gpu.multiprocessors, rows=[])
    for B, S_k, dtype in shapes:
        q, k, v, out, kv_bytes, a, base = grouped_decoding_call(B, S_k, dtype, gpu)
        plans, paths, scratch, launched = {}, {}, [], set()
        for name, kernel in variants(base, a, gpu):
            plan, fn, buffers = split_launch(a, gpu, kernel, S_k)
            if (plan, kernel.function) not in launched:
                launched.add((plan, kernel.function))
                plans[name], paths[name] = plan, fn
                scratch.append(buffers)
        paths["lean call"] = lambda: launch.attention(q, k, v, out=out)
        paths["SDPA default"] = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        plans["lean call"] = launch.plan_for(q, k, v).split["for_keys"](S_k)[2:]
        us, errors = layouts.checked_then_timed(paths, q, k, v, dtype, out, flush)
        failed = [name for name in paths if name not in us]
        found["rows"].append(dict(B=B, S_k=S_k, dtype=dtype, kv_bytes=kv_bytes, plans=plans,
                                  errors=errors, us=us, failed=failed))
        log(decoding_line(B, S_k, dtype, us, plans, failed))
        with open(os.path.join(os.environ.get("OUT", "."), out_name), "w") as f:
            json.dump(found, f, indent=1, default=str)
    return found


def configured_variants(configs: dict):
    """A ``variants`` for :func:`decoding_probe`: the kernel as committed, then chapter 8's
    tensor-core split kernel built with each of ``configs`` ({name: MmaConfig})."""
    def variants(base, a, gpu):
        from kernels.chapters import ch08_in_a_real_model as ch08

        yield "as committed", base
        for name, cfg in configs.items():
            yield name, ch08.mma_split_kernel(a, gpu, cfg)
    return variants


def split_launch(a, gpu, kernel, S_k: int):
    """Chapter 8's split-keys ``kernel`` on the call ``a`` (kernels.api.prepare_cuda) as
    planned now for ``S_k`` keys: ((splits, keys a split), its launch, the scratch it
    writes: keep that while launching)."""
    import torch

    from kernels.chapters import ch08_in_a_real_model as ch08

    plan = ch08.split_planner(kernel, a, gpu)(S_k)
    rows = a.B * a.H * a.S_q
    scratch = (torch.empty(plan[0], rows, a.D, device="cuda", dtype=torch.float32),
               torch.empty(plan[0], rows, device="cuda", dtype=torch.float32),
               torch.zeros(ch08.blocks_a_split(a, kernel.rows), device="cuda",
                           dtype=torch.int32))
    return plan, ch08.split_launches(a, gpu, kernel, *scratch)[0], scratch


def grouped_decoding_call(B: int, S_k: int, dtype: str, gpu):
    """kernels.layouts' grouped decoding case (GQA_HEADS: one query row a head against a
    (B, S_k, kv heads, D) cache, read through views) prepared for chapter 8's tensor-core
    split kernel: (q, k, v, out, the cache's bytes, the call, the kernel as committed)."""
    import torch

    from kernels import layouts
    from kernels.api import prepare_cuda
    from kernels.chapters import ch08_in_a_real_model as ch08

    heads, kv_heads, D = layouts.GQA_HEADS
    q, k, v, kv_bytes = layouts.decoding_case(B, heads, kv_heads, S_k, D, dtype)
    out = torch.empty_like(q)
    a = prepare_cuda(q, k, v, causal=False, scale=None, out=out, lse=None, return_lse=False,
                     kernel="split_keys_mma_attention", head_dims=ch08.HEAD_DIMS,
                     dtypes=ch08.DTYPES, strided=True)
    return q, k, v, out, kv_bytes, a, ch08.mma_split_kernel(a, gpu)


def decoding_line(B: int, S_k: int, dtype: str, us: dict, plans: dict, failed=()) -> str:
    """One decoding shape's timings as a log line: each path's plan where it has one, its
    microseconds and its speed over SDPA's default."""
    sdpa = us.get("SDPA default")
    return (f"B={B:2d} S_k={S_k:6d} {dtype}: " + "; ".join(
        f"{n} {plans.get(n, '')} {t:.1f} us" + (f" ({sdpa / t:.3f}x SDPA)" if sdpa else "")
        for n, t in us.items()) + (f"; FAILED {list(failed)}" if failed else ""))
