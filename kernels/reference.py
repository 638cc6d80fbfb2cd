"""What attention computes, in float64: the yardstick for every kernel.

``reference_attention`` works on NumPy arrays (the CPU) or torch tensors (a GPU,
in float64 there too, so that full-size checks take seconds, not hours). It
processes all heads and a block of query rows at a time, so the B x H x S_q x
S_k score tensor never has to fit in memory whole.

``sdpa`` calls PyTorch's ``scaled_dot_product_attention`` with a named backend,
for timing against the kernels on a GPU.
"""

from __future__ import annotations

import math

import numpy as np

_BLOCK_ELEMS = 1 << 24  # scores held at once: 128 MiB of float64


def _ops(x):
    if isinstance(x, np.ndarray):
        return (lambda a: a.astype(np.float64), np.exp, np.log,
                lambda a: a.max(axis=-1, keepdims=True),
                lambda a: a.sum(axis=-1, keepdims=True), np.zeros, np.full, np.where)
    import torch

    dev = x.device

    def zeros(shape, dtype=None):
        return torch.zeros(shape, dtype=torch.float64, device=dev)

    def full(shape, value, dtype=None):
        return torch.full(shape, value, dtype=torch.float64, device=dev)

    return (lambda a: a.to(torch.float64), torch.exp, torch.log,
            lambda a: a.amax(dim=-1, keepdim=True),
            lambda a: a.sum(dim=-1, keepdim=True), zeros, full, torch.where)


def causal_mask(rows, cols, S_q: int, S_k: int):
    """True where query row ``rows[i]`` may see key ``cols[j]`` (bottom-right)."""
    return cols[None, :] <= rows[:, None] + (S_k - S_q)


def reference_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """Float64 attention: returns ``(out, lse)``.

    q: (B, H, S_q, D); k, v: (B, H_kv, S_k, D) with H a multiple of H_kv (grouped-query
    attention: query head h reads key/value head h // (H / H_kv)), NumPy arrays or torch
    tensors of any float dtype. ``out`` is (B, H, S_q, D) and ``lse`` (B, H, S_q), the
    natural-log logsumexp of each row of scaled scores, both float64, of the same
    library as the inputs. Causal masking is bottom-right aligned; rows that see
    no key get ``out = 0`` and ``lse = -inf``.
    """
    f64, exp, log, rowmax, rowsum, zeros, full, where = _ops(q)
    B, H, S_q, D = q.shape
    S_k = k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    out = zeros((B, H, S_q, D), np.float64)
    lse = full((B, H, S_q), -np.inf, np.float64)
    # all heads at once, a block of query rows at a time
    is_np = isinstance(q, np.ndarray)
    block = _BLOCK_ELEMS if is_np else 8 * _BLOCK_ELEMS  # 1 GiB of scores on a GPU
    rows_per_block = max(1, block // (B * H * S_k))
    arange = np.arange if is_np else (lambda n: _torch_arange(n, q.device))
    cols = arange(S_k)
    kk, vv = f64(k), f64(v)
    group = H // k.shape[1]
    if group > 1:  # each key/value head to its group of query heads
        kk, vv = ((np.repeat(x, group, axis=1) if is_np else x.repeat_interleave(group, dim=1))
                  for x in (kk, vv))
    kt = kk.swapaxes(-1, -2) if is_np else kk.transpose(-1, -2)
    for r0 in range(0, S_q, rows_per_block):
        r1 = min(S_q, r0 + rows_per_block)
        s = (f64(q[:, :, r0:r1]) @ kt) * scale
        if causal:
            visible = causal_mask(arange(S_q)[r0:r1], cols, S_q, S_k)
            s = where(visible, s, -np.inf)
        m = rowmax(s)
        empty = m == -np.inf  # rows that see no key
        m = where(empty, 0.0, m)
        p = exp(s - m)
        l = rowsum(p)
        safe_l = where(empty, 1.0, l)
        out[:, :, r0:r1] = (p @ vv) / safe_l
        lse[:, :, r0:r1] = where(empty, -np.inf, m + log(safe_l))[..., 0]
    return out, lse


def reference_gradients(q, k, v, dout, causal: bool = False, scale: float | None = None):
    """Float64 gradients of attention: returns ``(dq, dk, dv)`` for the output gradient
    ``dout``, from the same formulas the book's backward kernels use (chapter 9)::

        P = softmax(scale * q k^T)   (masked; a row that sees no key is all 0)
        dV = P^T dO     dP = dO V^T     delta = rowsum(dO * O)
        dS = P * (dP - delta)     dQ = scale * dS K     dK = scale * dS^T Q

    Shapes and libraries as :func:`reference_attention` (grouped-query attention: each
    key/value head's gradient is the sum over its group of query heads). One (batch,
    head) at a time, so the scores never hold more than one S_q x S_k matrix.
    """
    f64, exp, _, rowmax, rowsum, zeros, _, where = _ops(q)
    B, H, S_q, D = q.shape
    H_kv, S_k = k.shape[1], k.shape[2]
    group = H // H_kv
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    is_np = isinstance(q, np.ndarray)
    arange = np.arange if is_np else (lambda n: _torch_arange(n, q.device))
    visible = causal_mask(arange(S_q), arange(S_k), S_q, S_k) if causal else None
    dq = zeros((B, H, S_q, D), np.float64)
    dk = zeros((B, H_kv, S_k, D), np.float64)
    dv = zeros((B, H_kv, S_k, D), np.float64)
    for b in range(B):
        for h in range(H):
            qh, kh, vh, doh = (f64(x[b, i]) for x, i in ((q, h), (k, h // group),
                                                         (v, h // group), (dout, h)))
            s = (qh @ kh.T) * scale
            if causal:
                s = where(visible, s, -np.inf)
            m = rowmax(s)
            m = where(m == -np.inf, 0.0, m)  # a row that sees no key: exp(-inf) = 0
            p = exp(s - m)
            l = rowsum(p)
            p = p / where(l == 0, 1.0, l)
            delta = rowsum(doh * (p @ vh))
            ds = p * (doh @ vh.T - delta)
            dq[b, h] = scale * (ds @ kh)
            dk[b, h // group] += scale * (ds.T @ qh)
            dv[b, h // group] += p.T @ doh
    return dq, dk, dv


def _torch_arange(n, device):
    import torch

    return torch.arange(n, device=device)


#: SDPA backends by the names the book uses.
SDPA_BACKENDS = ("default", "flash", "cudnn", "efficient", "math")


def sdpa(q, k, v, causal: bool = False, scale: float | None = None,
         backend: str = "default"):
    """PyTorch's scaled_dot_product_attention with a named backend.

    ``default`` lets PyTorch choose; the others force FlashAttention-2
    (``flash``), cuDNN, the memory-efficient kernel or the math fallback.
    PyTorch aligns causal masks top-left: use square shapes for causal timing.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend not in SDPA_BACKENDS:
        raise ValueError(f"backend must be one of {SDPA_BACKENDS}, got {backend!r}")
    q, k, v = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
    if backend == "default":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    chosen = {"flash": SDPBackend.FLASH_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "math": SDPBackend.MATH}[backend]
    with sdpa_kernel(chosen):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
