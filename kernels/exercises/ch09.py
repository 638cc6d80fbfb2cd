"""Chapter 9's exercises: the backward's formulas by hand, and what the two tensor-core
kernels multiply, and a prediction of the backward's time against the forward's."""

from __future__ import annotations

import numpy as np

from . import exercise, verdict
from .. import results
from ..bench import Shape
from .predictions import Band, Measured, prediction

# ---- 9.1: the gradients by hand -------------------------------------------------------


def _loss_gradient_numerically(q, k, v, dout, scale, eps=1e-6):
    """Central finite differences of sum(dout * attention(q, k, v)), one element at a time."""
    def loss(q, k, v):
        s = scale * q @ k.T
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return float((dout * ((p / p.sum(axis=1, keepdims=True)) @ v)).sum())

    grads = []
    for i, x in enumerate((q, k, v)):
        g = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            args = [q.copy(), k.copy(), v.copy()]
            args[i][idx] += eps
            up = loss(*args)
            args[i][idx] -= 2 * eps
            g[idx] = (up - loss(*args)) / (2 * eps)
        grads.append(g)
    return grads


def _cases():
    rng = np.random.default_rng(9)
    out = []
    for S_q, S_k, D, scale in ((5, 7, 4, 0.5), (6, 3, 8, 1 / np.sqrt(8)), (4, 4, 2, -0.7)):
        q, k, v, dout = (rng.standard_normal(s) for s in ((S_q, D), (S_k, D), (S_k, D), (S_q, D)))
        out.append((q, k, v, dout, scale))
    return out


def _no_delta(q, k, v, dout, scale):  # the softmax's Jacobian without its outer product
    s = scale * q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ds = p * (dout @ v.T)
    return scale * ds @ k, scale * ds.T @ q, p.T @ dout


def _unscaled(q, k, v, dout, scale):  # dS times K and Q, the scale forgotten
    s = scale * q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ds = p * (dout @ v.T - (dout * (p @ v)).sum(axis=1, keepdims=True))
    return ds @ k, ds.T @ q, p.T @ dout


@exercise("9.1", "dQ, dK and dV of one head from the recomputed P and delta",
          wrong_answers={"delta left out": _no_delta, "the scale left out of dQ and dK": _unscaled})
def check_attention_gradients(attention_gradients):
    """``attention_gradients(q, k, v, dout, scale)`` -> (dq, dk, dv), against finite
    differences of the forward at three small shapes (S_q != S_k, a negative scale)."""
    for q, k, v, dout, scale in _cases():
        got = attention_gradients(q.copy(), k.copy(), v.copy(), dout.copy(), scale)
        if got is None or len(got) != 3:
            return verdict("9.1", ["return three arrays: (dq, dk, dv)"])
        want = _loss_gradient_numerically(q, k, v, dout, scale)
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            g = np.asarray(g, np.float64)
            if g.shape != w.shape:
                return verdict("9.1", [f"{name} has shape {g.shape}; it should be {w.shape}"])
            err = np.abs(g - w).max()
            if not err <= 1e-6 * max(1.0, np.abs(w).max()):
                hint = {"dq": "dQ = scale * dS K, with dS = P * (dP - delta)",
                        "dk": "dK = scale * dS^T Q", "dv": "dV = P^T dO"}[name]
                return verdict("9.1", [f"{name} is off by up to {err:.2e} at S_q={q.shape[0]}, "
                                       f"S_k={k.shape[0]}, D={q.shape[1]}, scale={scale:.3g}",
                                       hint])
    return verdict("9.1", [], ["dq, dk and dv match finite differences of the forward at "
                               "3 shapes (S_q != S_k, a negative scale)"])


# ---- 9.2: what the two kernels multiply -----------------------------------------------


def _book_count(B, H, S_q, S_k, D):  # the nominal 2.5x forward: five products
    return 2.5 * 4 * B * H * S_q * S_k * D


def _one_kernel(B, H, S_q, S_k, D):  # S and dP recomputed once only: five products
    return 5 * 2 * B * H * S_q * S_k * D


@exercise("9.2", "the FLOPs mma_backward's two kernels execute",
          wrong_answers={"the book's nominal count": _book_count,
                         "five products, as one kernel would": _one_kernel,
                         "products counted as M N K": lambda B, H, S_q, S_k, D:
                         7 * B * H * S_q * S_k * D})
def check_executed_flops(executed_flops):
    """``executed_flops(B, H, S_q, S_k, D)``: seven S_q x S_k x D products."""
    shapes = [(1, 1, 64, 64, 64), (4, 16, 1000, 3000, 128), (2, 3, 5, 7, 64)]
    for shape in shapes:
        want, got = 14 * np.prod(shape, dtype=np.float64), executed_flops(*shape)
        if not isinstance(got, (int, float, np.integer, np.floating)) or not np.isclose(got, want):
            ratio = f" ({float(got) / want * 7:.2f} products where the kernels run 7)" \
                if isinstance(got, (int, float, np.integer, np.floating)) else ""
            return verdict("9.2", [f"at B, H, S_q, S_k, D = {shape}: {got!r}, expected "
                                   f"{want:.4g}{ratio}",
                                   "count the products of both kernels: the dK/dV kernel's "
                                   "S^T, dP^T, dV and dK, the dQ kernel's S, dP and dQ"])
    return verdict("9.2", [], [f"{len(shapes)} shapes: 7 products of 2 S_q S_k D FLOPs each, "
                               "2.8 times the forward's 2 and 1.4 times the book's count of 5"])


# ---- 9.3: predict the measurement ------------------------------------------------------

#: a suite shape of the recorded backward timings
BACKWARD_SHAPE = Shape(4, 32, 4096, 4096, 64)


def backward_over_forward(recorded: dict) -> Measured | None:
    """The time of the backward the book's call takes at BACKWARD_SHAPE (fp16), over
    chapter 7's forward kernel's at the same shape."""
    s = BACKWARD_SHAPE
    m = recorded.get("measurements", {}).get("backward_pass")
    forward = results.timed(recorded["records"], "hopper_attention", s)
    timing = next((t for t in (m or {}).get("timings", [])
                   if t["dtype"] == "float16" and t["shape"] == [s.B, s.H, s.S_q, s.D, s.causal]),
                  None)
    if timing is None or forward is None:
        return None
    back = timing["ms"][timing["book"]]
    return Measured(back / forward["median_ms"], m["provenance"]["gpu"],
                    f"the backward ({timing['book']}) {back:.3g} ms, the forward "
                    f"(hopper_attention) {forward['median_ms']:.3g} ms, at {s.label()}")


check_backward_prediction = prediction(
    "9.3", "Predict: the backward's time against the forward's",
    measure=backward_over_forward, band=Band(0.3, side_of=1.0,
                                             sides=("faster than the forward",
                                                    "slower than the forward")),
    wrong_answers={"as long as the forward": 1.0, "ten times the forward": 10.0})
