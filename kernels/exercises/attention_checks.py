"""What the checkers of attention kernels share: a reader's kernel run through the book's
check, its failure said as problems to fix, and the causal sliding window that some
exercises add to the mask (defined once here, in float64, for every chapter's checker).
"""

from __future__ import annotations

import math

import numpy as np

from kernels.check import LSE_TOLERANCE, POISON_BITS, check_attention, to_host
from kernels.reference import reference_attention


def window_mask(S_q: int, S_k: int, window: int) -> np.ndarray:
    """(S_q, S_k) booleans: True where query row i sees key j under a causal sliding
    window of ``window`` keys, aligned bottom-right: the ``window`` keys that end at
    its diagonal, ``i + S_k - S_q - window < j <= i + S_k - S_q``."""
    diagonal = np.arange(S_q)[:, None] + (S_k - S_q)
    keys = np.arange(S_k)[None, :]
    return (keys <= diagonal) & (keys > diagonal - window)


def windowed_reference(window: int):
    """The float64 reference of attention under :func:`window_mask`, as
    ``check_attention(reference=...)`` takes it: (q, k, v, causal, scale) -> (out,
    lse), rows that see no key giving 0 and -inf (``causal`` is implied)."""
    def reference(q, k, v, causal, scale):
        q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
        S_q, D, S_k = q.shape[2], q.shape[3], k.shape[2]
        scale = 1.0 / math.sqrt(D) if scale is None else scale
        s = np.where(window_mask(S_q, S_k, window), q @ k.swapaxes(-1, -2) * scale, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        empty = np.isneginf(m)  # rows that see no key
        m = np.where(empty, 0.0, m)
        p = np.exp(s - m)
        l = np.where(empty, 1.0, p.sum(axis=-1, keepdims=True))
        out = np.where(empty, 0.0, (p @ v) / l)
        return out, np.where(empty, -np.inf, m + np.log(l))[..., 0]

    return reference


class Captured:
    """An attention function that remembers the arrays the check handed it (inputs,
    output, logsumexp), so that a failure can say which rows are wrong and why."""

    def __init__(self, attention):
        self.attention, self.inputs, self.out, self.lse = attention, None, None, None
        self.__name__ = getattr(attention, "__name__", "kernel")

    def __call__(self, q, k, v, causal=False, scale=None, out=None, lse=None):
        self.inputs, self.out, self.lse = (q, k, v), out, lse
        if lse is None:
            return self.attention(q, k, v, causal=causal, scale=scale, out=out)
        return self.attention(q, k, v, causal=causal, scale=scale, out=out, lse=lse)


def _ranges(values) -> str:
    """Sorted integers as runs: 0-8, 12, 15-16."""
    runs, start = [], None
    for x, nxt in zip(values, list(values[1:]) + [None]):
        start = x if start is None else start
        if nxt != x + 1:
            runs.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(runs)


def keys_text(keys) -> str:
    """Sorted key indices as text: 'no key', 'key 3', 'keys 0..5', 'keys 0..2, 7'."""
    keys = [int(j) for j in keys]
    if not keys:
        return "no key"
    if len(keys) == 1:
        return f"key {keys[0]}"
    if keys[-1] - keys[0] + 1 == len(keys):
        return f"keys {keys[0]}..{keys[-1]}"
    return "keys " + _ranges(keys)


def _rows(mask: np.ndarray, heads: int = 3) -> str:
    """Where a (B, H, S_q) mask is true, as 'rows 0-8 of (b, h) = (0, 0)' text."""
    parts = []
    for b, h in np.ndindex(*mask.shape[:2]):
        rows = [int(i) for i in np.flatnonzero(mask[b, h])]
        if rows:
            parts.append(f"row{'s' if len(rows) > 1 else ''} {_ranges(rows)} of "
                         f"(b, h) = ({b}, {h})")
    return "; ".join(parts[:heads]) + (f"; and in {len(parts) - heads} more heads"
                                        if len(parts) > heads else "")


def expected(captured: Captured, reference, causal: bool):
    """The float64 (out, lse) for a captured run's inputs, from ``reference`` (as
    ``check_attention`` takes it; None: the book's)."""
    q, k, v = (to_host(x).astype(np.float64) for x in captured.inputs)
    return (reference or reference_attention)(q, k, v, causal, None)


def wrong_rows(captured: Captured, reference, causal: bool, tolerance: float) -> list:
    """(b, h, i) of the output rows of a captured run that differ from ``reference``
    by more than ``tolerance``, or hold NaN or a value never written."""
    want = expected(captured, reference, causal)[0]
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(to_host(captured.out).astype(np.float64) - want) <= tolerance)
    return [tuple(int(x) for x in w) for w in np.argwhere(bad.any(axis=-1))]


def _worst_lse_row(captured: Captured, reference, causal: bool) -> str:
    """The row whose logsumexp is furthest from the reference, as text."""
    got = to_host(captured.lse).astype(np.float64)
    want = expected(captured, reference, causal)[1]
    with np.errstate(invalid="ignore"):
        err = np.where(np.isneginf(got) & np.isneginf(want), 0.0,
                       np.abs(got - want) / np.maximum(1.0, np.abs(want)))
    b, h, i = np.unravel_index(int(np.argmax(np.where(np.isnan(err), np.inf, err))),
                               err.shape)
    return (f"row {i} of (b, h) = ({b}, {h}): lse {got[b, h, i]:.6g}, expected "
            f"{want[b, h, i]:.6g}" + (" (the row sees no key)"
                                      if np.isneginf(want[b, h, i]) else ""))


def failure(result, captured: Captured, reference=None) -> list[str]:
    """What is wrong in a failed check (a CheckResult of a run of ``captured``, against
    ``reference``), the first line the one to fix first: rows never written, NaN, the
    logsumexp, the largest error and where."""
    shape = (f"at B={result.B} H={result.H} S_q={result.S_q} S_k={result.S_k} "
             f"D={result.D}{' causal' if result.causal else ''}")
    problems = []
    if result.unwritten:
        utype, bits = POISON_BITS[result.dtype]
        never = (to_host(captured.out).view(utype) == bits).all(axis=-1)
        problems.append(f"{shape}: {result.unwritten} output elements were never written"
                        + (f": all of {_rows(never)}" if never.any() else ""))
    if result.nonfinite:
        problems.append(f"{shape}: {result.nonfinite} output elements are NaN or Inf")
    if result.lse_unwritten:
        utype, bits = POISON_BITS["float32"]
        never = to_host(captured.lse).view(utype) == bits
        problems.append(f"{shape}: the logsumexp of {_rows(never)} was never written")
    elif result.lse_wrong_empty:
        problems.append(f"{shape}: {result.lse_wrong_empty} rows have a -inf logsumexp "
                        "where the reference does not, or the other way round (a row "
                        "that sees no key has lse = -inf): "
                        + _worst_lse_row(captured, reference, result.causal))
    elif result.lse_err is not None and result.lse_err > LSE_TOLERANCE:
        problems.append(f"{shape}: logsumexp off by {result.lse_err:.3g} (tolerance "
                        f"{LSE_TOLERANCE:.0e}, relative where |lse| > 1) at "
                        + _worst_lse_row(captured, reference, result.causal))
    if result.max_abs_err > result.tolerance.max_abs or result.rel_err > result.tolerance.rel:
        problems.append(f"{shape}: largest error {result.max_abs_err:.3g} (tolerance "
                        f"{result.tolerance.max_abs:.0e}) {result.worst}")
    return problems or [f"{shape}: {result.summary()}"]


def check_kernel(attention, shapes, *, lse=False, reference=None, explain=None):
    """Run ``attention`` through :func:`kernels.check.check_attention` on each shape
    (B, H, S_q, S_k, D, causal), stopping at the first failure, against ``reference``
    (a float64 reference of one's own, or None for the book's). ``explain(shape,
    captured)`` gives lines that come first in a failure. Returns (problems, what was
    checked)."""
    checked = []
    for shape in shapes:
        captured = Captured(attention)
        result = check_attention(captured, *shape, lse=lse, raise_on_fail=False,
                                 reference=reference)
        if not result.ok:
            return (explain(shape, captured) if explain else []) \
                + failure(result, captured, reference), checked
        checked.append(result.summary())
    return [], checked
