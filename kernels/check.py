"""Is a kernel right? The one correctness check of the book.

``check_attention`` draws fresh random inputs, poisons the output, runs the
kernel, and compares with the float64 reference by the relative error
||out - ref|| / ||ref|| and the largest absolute error. It fails, with a message
that says where and by how much, when an output element was never written, is
NaN or Inf, or when either error is over the tolerance of the input dtype.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from .api import BFLOAT16, dtype_name
from .mode import SIMULATED
from .reference import reference_attention


@dataclass(frozen=True)
class Tolerance:
    rel: float  # bound on ||out - ref|| / ||ref||
    max_abs: float  # bound on max |out - ref|, for inputs of unit variance


#: fp16 keeps 11 significant bits (unit roundoff 4.9e-4): an fp32-accumulating
#: kernel that rounds its output once lands near 3e-4 relative error.
#: bfloat16 keeps 8 (unit roundoff 3.9e-3): the same margins, 8x wider.
TOLERANCES = {
    "float16": Tolerance(rel=2e-3, max_abs=1e-2),
    "float32": Tolerance(rel=1e-5, max_abs=1e-4),
    BFLOAT16: Tolerance(rel=1.6e-2, max_abs=8e-2),
}

#: Quiet NaNs with a payload no arithmetic produces: an element still holding
#: this bit pattern after the kernel ran was never written.
POISON_BITS = {"float16": (np.uint16, 0x7EAD), "float32": (np.uint32, 0x7FEDBEEF),
               BFLOAT16: (np.uint16, 0x7FED)}


class AttentionMismatch(AssertionError):
    """A kernel's output failed the check against the float64 reference."""


@dataclass
class CheckResult:
    kernel: str
    B: int
    H: int
    S_q: int
    S_k: int
    D: int
    dtype: str
    causal: bool
    seed: int | None  # None where the inputs were given
    rel_err: float
    max_abs_err: float
    unwritten: int
    nonfinite: int
    tolerance: Tolerance
    worst: str  # where the largest error is, as text
    ok: bool
    lse_err: float | None = None  # logsumexp error, when it was checked
    lse_unwritten: int = 0
    lse_wrong_empty: int = 0  # rows where -inf (no key seen) is wrong or missing

    def summary(self) -> str:
        status = "ok" if self.ok else "FAILED"
        lse = "" if self.lse_err is None else \
            f", lse err {self.lse_err:.1e} (tol {LSE_TOLERANCE:.0e})"
        return (f"{self.kernel} B={self.B} H={self.H} S_q={self.S_q} S_k={self.S_k} "
                f"D={self.D} {'causal' if self.causal else 'full'}: {status}, "
                f"rel err {self.rel_err:.2e} (tol {self.tolerance.rel:.0e}), "
                f"max abs err {self.max_abs_err:.2e} (tol {self.tolerance.max_abs:.0e})"
                + lse)


def random_inputs(B, H, S_q, S_k, D, dtype=np.float16, seed=None, std=1.0):
    """Fresh q, k, v from N(0, std^2), rounded to ``dtype``; returns (q, k, v, seed)."""
    if seed is None:
        seed = secrets.randbits(63)
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, H, S_q, D), dtype=np.float32) * std).astype(dtype)
    k = (rng.standard_normal((B, H, S_k, D), dtype=np.float32) * std).astype(dtype)
    v = rng.standard_normal((B, H, S_k, D), dtype=np.float32).astype(dtype)
    return q, k, v, seed


def fresh_inputs(B, H, S_q, S_k, D, dtype=np.float16, seed=None, std=1.0):
    """As :func:`random_inputs`, but where the kernels run: drawn on the GPU with
    torch when there is one (host generation of full-size inputs takes seconds),
    else host arrays. Returns (q, k, v, seed)."""
    if seed is None:
        seed = secrets.randbits(63)
    torch = _gpu_torch()
    if torch is None:
        if dtype_name(dtype) == BFLOAT16:
            raise RuntimeError("bfloat16 inputs are torch tensors: they need torch on a GPU")
        q, k, v, seed = random_inputs(B, H, S_q, S_k, D, dtype, seed, std)
        return (*to_device(q, k, v), seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    draw = [((B, H, S_q, D), std), ((B, H, S_k, D), std), ((B, H, S_k, D), 1.0)]
    return (*(torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
              .mul_(sd).to(getattr(torch, dtype_name(dtype))) for shape, sd in draw), seed)


def _gpu_torch():
    """torch, when kernels run on a GPU that torch can use too; else None."""
    if SIMULATED:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def poisoned(shape, dtype):
    """A host array whose every element holds the poison bit pattern."""
    utype, bits = POISON_BITS[dtype_name(dtype)]
    return np.full(shape, bits, dtype=utype).view(dtype)


def poisoned_device(shape, dtype):
    """The poisoned output array, where the kernels run (bfloat16: a torch tensor)."""
    if dtype_name(dtype) != BFLOAT16:
        return to_device(poisoned(shape, dtype))[0]
    import torch

    bits = torch.full(shape, POISON_BITS[BFLOAT16][1], dtype=torch.int16, device="cuda")
    return bits.view(torch.bfloat16)


def free_poisoned_block(like) -> None:
    """Fill a block of ``like``'s size with NaN and free it at once. torch's caching
    allocator is likely to hand that block to the next new tensor of the size, so a path
    that returns a new output without writing it returns NaN, which fails its check,
    rather than another path's answer left in that memory."""
    import torch

    torch.empty_like(like).fill_(float("nan"))


def to_device(*arrays):
    """Host arrays to the GPU (Numba device arrays), or unchanged in the simulator."""
    if SIMULATED:
        return arrays
    from numba import cuda

    return tuple(cuda.to_device(a) for a in arrays)


def to_host(x) -> np.ndarray:
    """A GPU array on the host; bfloat16 tensors come back as their uint16 bits."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if str(getattr(x, "dtype", "")) == "torch.bfloat16":
        import torch

        return x.view(torch.int16).cpu().numpy().view(np.uint16)
    from numba import cuda

    return cuda.as_cuda_array(x).copy_to_host()


def _reference(q, k, v, causal, scale, reference=None):
    """Float64 reference (out, lse); on a GPU with torch, computed there. A
    ``reference`` of one's own (an exercise's variant of attention) is given host
    arrays: (q, k, v, causal, scale) -> (out, lse) in float64."""
    if reference is not None:
        host = []
        for x in (q, k, v):
            h = to_host(x)
            host.append(bfloat16_to_float(h) if h.dtype == np.uint16 else h)
        return reference(*host, causal, scale)
    torch = _gpu_torch()
    if torch is not None:
        qt, kt, vt = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
        out, lse = reference_attention(qt, kt, vt, causal, scale)
        return out.cpu().numpy(), lse.cpu().numpy()
    if not SIMULATED:
        q, k, v = (to_host(x) for x in (q, k, v))
    return reference_attention(q, k, v, causal, scale)


#: bound on |lse - ref| / max(1, |ref|) for a logsumexp computed in fp32
LSE_TOLERANCE = 1e-4


def compare_lse(got: np.ndarray, ref: np.ndarray) -> dict:
    """Errors of a logsumexp: -inf exactly where the reference has it (rows that
    see no key), finite and within LSE_TOLERANCE everywhere else."""
    utype, bits = POISON_BITS["float32"]
    unwritten = int((got.view(utype) == bits).sum())
    empty = np.isneginf(ref)
    wrong_empty = int((np.isneginf(got) != empty).sum())
    g = got.astype(np.float64)
    bad = ~empty & ~np.isfinite(g)
    with np.errstate(invalid="ignore"):  # -inf - (-inf) where both rows are empty
        err = np.abs(g - ref) / np.maximum(1.0, np.abs(ref))
    err = np.where(empty, 0.0, np.where(bad, np.inf, err))
    return dict(lse_err=float(err.max()) if err.size else 0.0,
                lse_unwritten=unwritten, lse_wrong_empty=wrong_empty)


def bfloat16_to_float(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values, given as their uint16 bits, as float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def compare(out: np.ndarray, ref: np.ndarray, tol: Tolerance, dtype) -> dict:
    """Errors of ``out`` against ``ref``; the unwritten and non-finite counts
    (bfloat16 ``out`` as uint16 bits, as :func:`to_host` gives it)."""
    utype, bits = POISON_BITS[dtype_name(dtype)]
    unwritten_mask = out.view(utype) == bits
    if dtype_name(dtype) == BFLOAT16:
        out = bfloat16_to_float(out)
    o = out.astype(np.float64)
    finite = np.isfinite(o)
    nonfinite = int((~finite & ~unwritten_mask).sum())
    diff = np.where(finite, np.abs(o - ref), np.inf)
    ref_norm = float(np.linalg.norm(ref))
    if finite.all():
        rel = float(np.linalg.norm(o - ref)) / max(ref_norm, 1e-300)
    else:
        rel = float("inf")
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    where = (f"at (b, h, row, d) = {tuple(int(i) for i in worst)}: got {float(o[worst]):.6g}, "
             f"expected {ref[worst]:.6g}")
    return dict(rel_err=rel, max_abs_err=float(diff[worst]),
                unwritten=int(unwritten_mask.sum()), nonfinite=nonfinite, worst=where)


def check_attention(attention, B, H, S_q, S_k, D, causal=False, *,
                    dtype=np.float16, scale=None, seed=None, std=1.0, lse=False,
                    name=None, raise_on_fail=True, inputs=None,
                    reference=None) -> CheckResult:
    """Run ``attention`` once on fresh random inputs and check every element.

    ``std`` scales q and k (logits grow as std^2 * sqrt(D)). ``inputs`` (q, k, v
    where the kernel runs, of that shape and dtype) replaces the random inputs, for
    inputs built to take a kernel down one path. With ``lse=True`` the
    kernel's logsumexp (its ``lse=`` argument, poisoned too) is checked as well.
    ``reference`` replaces the float64 reference with a variant of one's own (see
    :func:`_reference`). Raises :class:`AttentionMismatch` on failure unless
    ``raise_on_fail`` is False.
    """
    name = name or getattr(attention, "__name__", "kernel")
    if inputs is None:
        dq, dk, dv, seed = fresh_inputs(B, H, S_q, S_k, D, dtype, seed, std)
    else:
        dq, dk, dv = inputs
        if [tuple(x.shape) for x in inputs] != [(B, H, S_q, D), (B, H, S_k, D), (B, H, S_k, D)]:
            raise ValueError(f"inputs of shapes {[tuple(x.shape) for x in inputs]} for "
                             f"B={B}, H={H}, S_q={S_q}, S_k={S_k}, D={D}")
    dout = poisoned_device((B, H, S_q, D), dtype)
    if lse:
        dlse, = to_device(poisoned((B, H, S_q), np.float32))
        attention(dq, dk, dv, causal=causal, scale=scale, out=dout, lse=dlse)
    else:
        attention(dq, dk, dv, causal=causal, scale=scale, out=dout)
    got = to_host(dout)
    ref, ref_lse = _reference(dq, dk, dv, causal, scale, reference)
    tol = TOLERANCES[dtype_name(dtype)]
    errs = compare(got, ref, tol, dtype)
    ok = (errs["unwritten"] == 0 and errs["nonfinite"] == 0
          and errs["rel_err"] <= tol.rel and errs["max_abs_err"] <= tol.max_abs)
    if lse:
        errs.update(compare_lse(to_host(dlse), ref_lse))
        ok = ok and errs["lse_unwritten"] == 0 and errs["lse_wrong_empty"] == 0 \
            and errs["lse_err"] <= LSE_TOLERANCE
    result = CheckResult(kernel=name, B=B, H=H, S_q=S_q, S_k=S_k, D=D,
                         dtype=dtype_name(dtype), causal=bool(causal), seed=seed,
                         tolerance=tol, ok=ok, **errs)
    if not ok and raise_on_fail:
        problems = []
        if errs["unwritten"]:
            problems.append(f"{errs['unwritten']} of {got.size} output elements "
                            "were never written")
        if errs["nonfinite"]:
            problems.append(f"{errs['nonfinite']} output elements are NaN or Inf")
        problems.append(f"largest error {errs['max_abs_err']:.3g} {errs['worst']}")
        if errs.get("lse_unwritten"):
            problems.append(f"{errs['lse_unwritten']} logsumexp elements were never written")
        if errs.get("lse_wrong_empty"):
            problems.append(f"{errs['lse_wrong_empty']} rows have -inf logsumexp where "
                            "the reference does not, or the other way round")
        raise AttentionMismatch(result.summary() + "\n  " + "\n  ".join(problems)
                                + ("\n  (inputs: given)" if inputs is not None
                                   else f"\n  (inputs: seed={seed}, std={std})"))
    return result


#: the shapes chapters check their kernels on inline: ragged lengths, S_q != S_k both
#: ways (with S_q > S_k, causal rows that see no key), more rows than one block and
#: more keys than one tile, a single token; tiny in the simulator, larger on a GPU
CHAPTER_SHAPES = {
    "sim": [(1, 2, 37, 37, 16, False), (1, 1, 37, 37, 16, True), (1, 1, 40, 7, 16, True),
            (1, 1, 5, 40, 32, True), (1, 1, 1, 1, 16, False), (1, 1, 7, 7, 64, True)],
    "gpu": [(2, 4, 257, 257, 64, False), (2, 4, 257, 257, 64, True),
            (1, 3, 300, 129, 64, True), (1, 3, 129, 300, 128, True),
            (1, 1, 1, 1, 64, False), (4, 8, 1024, 1024, 128, False)],
}


def check_all(attention, shapes=None, **kw) -> list[CheckResult]:
    """check_attention on every chapter shape (or on ``shapes``, (B, H, S_q, S_k, D,
    causal) each), printing one line each; raises on the first failure."""
    out = []
    for shape in CHAPTER_SHAPES["sim" if SIMULATED else "gpu"] if shapes is None else shapes:
        out.append(check_attention(attention, *shape, **kw))
        print(out[-1].summary())
    return out


def check_inline(attention, dtypes=("float16",), *, shapes=None, note="", **kw) -> list[CheckResult]:
    """The check each chapter runs beside its kernel: :func:`check_all` in each of
    ``dtypes`` where the kernel runs (on a GPU; in the simulator too, unless its
    chapter says ``RUNS_IN_SIMULATOR = False``); elsewhere one line saying what checked
    it instead (the recorded run), then ``note``."""
    from .mode import MODE

    if MODE == "gpu" or (SIMULATED and _runs_in_simulator(attention)):
        return [r for dtype in dtypes for r in check_all(attention, shapes, dtype=dtype, **kw)]
    name = kw.get("name") or getattr(attention, "__name__", "the kernel")
    print(f"no GPU here: {name} runs on a GPU only. The recorded run checked it: its GPU "
          "test suite, and each shape at full size before timing it."
          + (f" {note}" if note else ""))
    return []


def _runs_in_simulator(attention) -> bool:
    """What the kernel's chapter says (its module's ``RUNS_IN_SIMULATOR``; True where
    it says nothing), read through the chapter's own function: the kernel, or the
    launch function of a step that :func:`kernels.api.kernel_function` made."""
    fn = getattr(attention, "py_func", attention)
    fn = getattr(fn, "launch", fn)
    return bool(getattr(fn, "__globals__", {}).get("RUNS_IN_SIMULATOR", True))
