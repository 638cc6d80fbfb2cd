"""What dev's GPU experiments share (not part of the book or the package): a log line
with the seconds since the start, the checks at odd shapes before anything is timed, and
rounds of timings over shapes, each line logged and the rows written to $OUT as they
come. A script in a folder here imports it after
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
