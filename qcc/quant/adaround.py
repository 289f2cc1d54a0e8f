"""Learned rounding of weights (AdaRound, Nagel et al. 2020), numpy only.

Rounding each weight to the nearest grid point minimizes the weight error, not the layer's
output error: with 4-bit weights the rounding errors of one output channel add up along the
input's correlations. AdaRound chooses, per weight, floor or ceil so that the layer output on
calibration data stays close to the float one:

    min over h in [0, 1]:  ||W~ X_q - W X_f||^2 / P  +  lambda * sum(1 - |2h - 1|^beta)
    W~ = step * (clip(floor(W/step) + zp + h, qmin, qmax) - zp),  h = rectified sigmoid(V)

X_q are the layer's inputs in the quantized model, X_f in the float one (the paper's
asymmetric reconstruction; with X_f = X_q the target is the float weights on the quantized
input, which measured better on the digits nets: the weights cannot undo the input's rounding
noise, and chasing it overfits), P the number of input patches. The reconstruction
term only needs the Gram matrices G_qq = X_q X_q^T and G_fq = X_f X_q^T (K x K per group, K =
inputs per output), accumulated batch by batch: memory and each step's cost do not depend on
the amount of data. beta anneals from 20 to 2 after a warm-up, pushing h to 0 or 1; the result
is thresholded at 1/2. The reconstruction term is divided by its value for nearest rounding
and the regularizer averaged over the weights, so lambda means the same for every layer (the
defaults, lambda 3 and Adam at 0.05 for 1000 steps, were the best of a small sweep on the
digits CNN at W4A8: docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

ZETA, GAMMA = 1.1, -0.1  # rectified sigmoid stretch (AdaRound)


def patches(x: np.ndarray, kernel: tuple[int, int], attrs_: dict[str, Any], group: int) -> np.ndarray:
    """Conv input patches per group: (group, K, P) with K ordered like w.reshape(O, -1)'s rows."""
    n, c, h, w = x.shape
    kh, kw = kernel
    strides, pads, dil = attrs_["strides"], attrs_["pads"], attrs_["dilations"]
    oh = (h + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    xp = np.zeros((n, c, h + pads[0] + pads[2], w + pads[1] + pads[3]), dtype=np.float64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + w] = x
    cols = np.empty((n, c, kh, kw, oh, ow))
    for i in range(kh):
        for j in range(kw):
            top, left = i * dil[0], j * dil[1]
            cols[:, :, i, j] = xp[:, :, top:top + (oh - 1) * strides[0] + 1:strides[0],
                                  left:left + (ow - 1) * strides[1] + 1:strides[1]]
    cg = c // group
    return cols.reshape(n, group, cg * kh * kw, oh * ow).transpose(1, 2, 0, 3).reshape(group, cg * kh * kw, -1)


@attrs.define
class Gram:
    """Running G_qq = X_q X_q^T, G_fq = X_f X_q^T, G_ff = X_f X_f^T per group, and the patch count."""

    qq: np.ndarray | None = None
    fq: np.ndarray | None = None
    ff: np.ndarray | None = None
    count: int = 0
    sum_q: np.ndarray | None = None  # (group, K): for the layer's mean output error
    sum_f: np.ndarray | None = None

    def add(self, xq: np.ndarray, xf: np.ndarray) -> None:
        """xq, xf: (group, K, P) patches of the same positions."""
        parts = (xq @ xq.transpose(0, 2, 1), xf @ xq.transpose(0, 2, 1), xf @ xf.transpose(0, 2, 1))
        if self.qq is None or self.fq is None or self.ff is None or self.sum_q is None or self.sum_f is None:
            self.qq, self.fq, self.ff = parts
            self.sum_q, self.sum_f = xq.sum(axis=2), xf.sum(axis=2)
        else:
            self.qq, self.fq, self.ff = self.qq + parts[0], self.fq + parts[1], self.ff + parts[2]
            self.sum_q, self.sum_f = self.sum_q + xq.sum(axis=2), self.sum_f + xf.sum(axis=2)
        self.count += xq.shape[2]

    def mean_error(self, w_hat: np.ndarray, w: np.ndarray) -> np.ndarray:
        """E[W~ x_q - W x_f] per output (group, outputs per group): the layer's systematic error."""
        assert self.sum_q is not None and self.sum_f is not None
        n = max(self.count, 1)
        return np.einsum("gok,gk->go", w_hat, self.sum_q / n) - np.einsum("gok,gk->go", w, self.sum_f / n)


@attrs.frozen
class RoundingResult:
    q: np.ndarray  # integers (zero point included), the weight's shape as given
    nearest_error: float  # reconstruction error (sum over outputs, per patch) with nearest rounding
    learned_error: float
    flipped: float  # fraction of weights rounded the other way than to nearest


def reconstruction_error(w_hat: np.ndarray, w: np.ndarray, gram: Gram) -> float:
    """||W~ X_q - W X_f||^2 / P, from the Gram matrices alone."""
    assert gram.qq is not None and gram.fq is not None and gram.ff is not None
    a = np.einsum("gok,gkl,gol->", w_hat, gram.qq, w_hat)
    b = np.einsum("gok,glk,gol->", w_hat, gram.fq, w)
    c = np.einsum("gok,gkl,gol->", w, gram.ff, w)
    return float(max(a - 2.0 * b + c, 0.0) / max(gram.count, 1))


def output_power(w: np.ndarray, gram: Gram) -> float:
    """||W X_f||^2 / P: the float layer output's power (for an SQNR)."""
    assert gram.ff is not None
    return float(np.einsum("gok,gkl,gol->", w, gram.ff, w) / max(gram.count, 1))


def learn_rounding(w: np.ndarray, step: np.ndarray, zero_point: np.ndarray, qmin: int, qmax: int,
                   gram: Gram, iterations: int = 1000, lr: float = 0.05, reg: float = 3.0,
                   warmup: float = 0.2, beta: tuple[float, float] = (20.0, 2.0)) -> RoundingResult:
    """Rounding of w (group, O/group, K) on the grid step * (q - zp), q in [qmin, qmax].

    step and zero_point broadcast against w (one per output channel: (group, O/group, 1)).
    Adam on V; returns the integers q and the reconstruction errors before and after.
    """
    assert gram.qq is not None and gram.fq is not None
    w = w.astype(np.float64)
    step = np.broadcast_to(np.asarray(step, np.float64), w.shape)
    zp = np.broadcast_to(np.asarray(zero_point, np.float64), w.shape)
    scaled = w / step
    base = np.floor(scaled)
    rest = scaled - base
    nearest = np.clip(np.rint(scaled) + zp, qmin, qmax)
    base_q = base + zp
    target = w @ gram.fq  # (group, O/g, K): W G_fq
    qq = gram.qq
    count = max(gram.count, 1)

    def soft(h: np.ndarray) -> np.ndarray:
        return (np.clip(base_q + h, qmin, qmax) - zp) * step

    nearest_err = reconstruction_error(soft(nearest - base_q), w, gram)
    scale = 1.0 / max(nearest_err, 1e-30)  # the reconstruction loss starts at 1
    p = np.clip((rest - GAMMA) / (ZETA - GAMMA), 1e-4, 1 - 1e-4)
    v = np.log(p / (1.0 - p))
    m1, m2 = np.zeros_like(v), np.zeros_like(v)
    b1, b2 = 0.9, 0.999
    start = int(warmup * iterations)
    inside = (base_q >= qmin) & (base_q + 1 <= qmax)
    for it in range(iterations):
        sig = 1.0 / (1.0 + np.exp(-v))
        raw = sig * (ZETA - GAMMA) + GAMMA
        h = np.clip(raw, 0.0, 1.0)
        w_soft = soft(h)
        grad_w = 2.0 * (w_soft @ qq - target) / count * scale
        grad_h = grad_w * step * inside
        if it >= start:
            frac = (it - start) / max(iterations - start, 1)
            b = beta[1] + (beta[0] - beta[1]) * (1.0 - frac)
            d = 2.0 * h - 1.0
            grad_h = grad_h - reg / h.size * b * np.abs(d) ** (b - 1.0) * np.sign(d) * 2.0
        grad_v = grad_h * ((raw > 0) & (raw < 1)) * sig * (1.0 - sig) * (ZETA - GAMMA)
        m1 = b1 * m1 + (1 - b1) * grad_v
        m2 = b2 * m2 + (1 - b2) * grad_v * grad_v
        v = v - lr * (m1 / (1 - b1 ** (it + 1))) / (np.sqrt(m2 / (1 - b2 ** (it + 1))) + 1e-8)
    sig = 1.0 / (1.0 + np.exp(-v))
    hard = (np.clip(sig * (ZETA - GAMMA) + GAMMA, 0.0, 1.0) >= 0.5).astype(np.float64)
    q = np.clip(base_q + hard, qmin, qmax)
    learned_err = reconstruction_error((q - zp) * step, w, gram)
    if learned_err > nearest_err:  # never worse than nearest on the data it learned from
        q, learned_err = nearest, nearest_err
    return RoundingResult(q.astype(np.int64), nearest_err, learned_err,
                          float(np.count_nonzero(q != nearest)) / max(q.size, 1))
