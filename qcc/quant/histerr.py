"""Quantization error of a histogram, evaluated for many candidate quantizers at once.

Values are taken as uniform inside each bin, and the squared error of that uniform piece is
integrated exactly (a closed form of the periodic rounding error plus the clipping tail), so the
result stays right when a quantization step is wider or narrower than a bin. Exact zeros are
taken out: every scheme qcc uses represents 0 exactly.
"""

from __future__ import annotations

import numpy as np

from qcc.quant.stats import TensorStats


def row_dots(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`a @ x` in numpy's own loops (einsum never calls BLAS): the chosen ranges and positions must
    be the same bytes on every machine, and OpenBLAS's dgemv sums in another order at 2 threads than
    at 1 (and per CPU kernel), which moved a candidate's error in its last bits."""
    return np.einsum("...j,j->...", a, x)


def _antiderivative(u: np.ndarray, step: np.ndarray, bound: np.ndarray, trunc: bool) -> np.ndarray:
    """H(u) with H' = e(u)^2, the squared error of quantizing magnitude u >= 0.

    The grid is the multiples of `step`; magnitudes beyond `bound` (a grid point) clip to it.
    Rows are candidates (step, bound of shape (M, 1)); columns are the edges u of shape (E,).
    """
    v = np.minimum(u, bound)
    if trunc:  # toward zero: error in [0, step), s^3/3 per period
        n = np.floor(v / step)
        r = v - n * step
        h = n * step**3 / 3.0 + r**3 / 3.0
    else:  # to nearest: error in [-step/2, step/2), s^3/12 per period
        n = np.floor(v / step + 0.5)
        r = v - n * step
        h = n * step**3 / 12.0 + (r**3 + (step / 2.0) ** 3) / 3.0
    tail = np.maximum(u - bound, 0.0)
    np.power(tail, 3.0, out=tail, where=tail > 0.0)  # pow only past the bound (0**3 is 0 as it stands)
    return h + tail / 3.0


def expected_sq_error(
    stats: TensorStats,
    step: np.ndarray,
    pos_bound: np.ndarray,
    neg_bound: np.ndarray,
    rounding: str = "half_even",
) -> np.ndarray:
    """Total squared error, one entry per candidate (step[i], pos_bound[i], neg_bound[i]).

    Candidates quantize to multiples of step (any grid aligned at 0: fixed point, or affine with
    an integer zero point), clipping positives at pos_bound and negatives at -neg_bound.
    """
    pos, neg, edges = _signed_counts(stats)
    w = stats.bin_width
    step = np.asarray(step, dtype=np.float64).reshape(-1, 1)
    trunc = rounding == "trunc"
    total = np.zeros(step.shape[0])
    for counts, bound in ((pos, pos_bound), (neg, neg_bound)):
        used = np.flatnonzero(counts)
        if not used.size:
            continue
        b = np.asarray(bound, dtype=np.float64).reshape(-1, 1)
        if 2 * used.size < counts.size:  # sparse: only the edges of occupied bins
            h = _antiderivative(np.concatenate([edges[used], edges[used + 1]]), step, b, trunc)
            total += row_dots((h[:, used.size:] - h[:, :used.size]) / w, counts[used])
        else:
            h = _antiderivative(edges, step, b, trunc)
            total += row_dots(np.diff(h, axis=1) / w, counts)
    return total


def signal_power(stats: TensorStats) -> float:
    """Sum of x**2 over the histogram (values uniform in each bin)."""
    pos, neg, edges = _signed_counts(stats)
    a, b = edges[:-1], edges[1:]
    return float(row_dots((a * a + a * b + b * b) / 3.0, pos + neg))


def _signed_counts(stats: TensorStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positive counts, negative counts) by |x| bin without the exact zeros, and the bin edges."""
    n = max(stats.used_bins, 1)
    edges = np.arange(n + 1, dtype=np.float64) * stats.bin_width
    pos = stats.positive_hist()[:n].astype(np.float64)
    neg = stats.negative_hist()[:n].astype(np.float64)
    zeros = float(stats.zero_count)
    taken = min(zeros, pos[0])
    pos[0] -= taken
    neg[0] -= min(zeros - taken, neg[0])
    return pos, neg, edges


def approx_sq_error(stats: TensorStats, step: np.ndarray, pos_bound: np.ndarray,
                    neg_bound: np.ndarray) -> np.ndarray:
    """expected_sq_error's rounding-to-nearest case in O(bins + candidates), for screening many
    candidates before the exact integration of the few best.

    Values below half a step round to 0 (error x**2, from the bins' second moments); the other
    values inside the bounds cost step**2 / 12; the clipping tail is integrated exactly (values
    uniform in each bin, the bin holding the bound split at it).
    """
    pos, neg, edges = _signed_counts(stats)
    w = stats.bin_width
    mid = edges[:-1] + 0.5 * w
    second = mid * mid + w * w / 12.0  # E[x^2] over a bin
    step = np.asarray(step, dtype=np.float64)
    total = np.zeros(step.shape)
    finite = bool(np.isfinite(step).all())
    for counts, bound in ((pos, pos_bound), (neg, neg_bound)):
        b = np.asarray(bound, dtype=np.float64)
        if finite and not counts.any() and np.isfinite(b).all():
            continue  # no values on this side: _side_error is +0.0 everywhere (0 times finite terms)
        total += _side_error(counts, b, step, mid, second, w)
    return total


def _side_error(counts: np.ndarray, b: np.ndarray, step: np.ndarray, mid: np.ndarray, second: np.ndarray,
                w: float) -> np.ndarray:
    """approx_sq_error's terms for the values of one sign (counts by |x| bin), per candidate."""
    n = counts.size
    c0 = np.concatenate([[0.0], np.cumsum(counts)])  # prefix sums
    c1 = np.concatenate([[0.0], np.cumsum(counts * mid)])
    c2 = np.concatenate([[0.0], np.cumsum(counts * second)])
    jb = np.clip(np.floor(b / w).astype(np.int64), 0, n)  # bin holding the bound
    jh = np.minimum(np.clip(np.floor(0.5 * step / w).astype(np.int64), 0, n), jb)  # below half a step
    small = c2[jh]
    rounded = (c0[jb] - c0[jh]) * step * step / 12.0
    beyond = (c2[n] - c2[np.minimum(jb + 1, n)]) - 2.0 * b * (c1[n] - c1[np.minimum(jb + 1, n)]) \
        + b * b * (c0[n] - c0[np.minimum(jb + 1, n)])
    inside_bin = jb < n
    cb = np.where(inside_bin, counts[np.minimum(jb, n - 1)], 0.0)
    top = (jb + 1) * w
    part = cb * np.maximum(top - b, 0.0) ** 3 / (3.0 * w)  # the bound's bin: its part beyond b
    rest = cb * np.clip((b - jb * w) / w, 0.0, 1.0) * step * step / 12.0  # and its part inside
    return small + rounded + beyond + part + rest  # type: ignore[no-any-return]


def kl_divergences(hist: np.ndarray, kept_bins: np.ndarray, quantized_bins: int) -> np.ndarray:
    """TensorRT's entropy criterion for each candidate count of kept |x| bins.

    For kept bins i: P is hist[:i] with every outlier added to its last bin; Q merges hist[:i]
    into `quantized_bins` groups (edges floor(g*i/quantized_bins)) and spreads each group's sum
    evenly over its non-empty bins. Returns KL(P||Q), inf where Q misses mass of P. Computed from
    prefix sums, so all candidates cost O(len(kept_bins) * quantized_bins).
    """
    h = hist.astype(np.float64)
    total = h.sum()
    i = np.asarray(kept_bins, dtype=np.int64)
    if len(h) < i.max():
        h = np.concatenate([h, np.zeros(int(i.max()) - len(h))])
    hlogh = np.where(h > 0, h * np.log(np.where(h > 0, h, 1.0)), 0.0)
    csum = np.concatenate([[0.0], np.cumsum(h)])
    cnz = np.concatenate([[0.0], np.cumsum(h > 0)])  # counts of non-empty bins, exact in float64
    chl = np.concatenate([[0.0], np.cumsum(hlogh)])

    levels = int(quantized_bins)
    g = np.arange(levels + 1)
    bounds = g[None, :] * i[:, None]
    if levels & (levels - 1):
        bounds //= levels  # (M, Q+1), last column = i
    else:  # a power of two (8 bits' 128 or 256 levels): the same floor of non-negatives, by a shift
        bounds >>= levels.bit_length() - 1
    sums = np.diff(np.take(csum, bounds), axis=1)
    nonzero = np.diff(np.take(cnz, bounds), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        # sums * log(sums / max(nonzero, 1)) in one buffer; 0 for the groups without mass
        per_group = np.maximum(nonzero, 1.0)
        np.divide(sums, per_group, out=per_group)
        np.log(per_group, out=per_group)
        per_group *= sums
        np.copyto(per_group, 0.0, where=~(sums > 0))
        kept = csum[i]
        outliers = total - kept
        last = h[i - 1]
        p_last = last + outliers
        # sum_j P_j log P_j and sum_j P_j log Q_j (Q_j = group sum / group's non-empty bins)
        a = chl[i - 1] + np.where(
            p_last > 0, p_last * np.log(np.where(p_last > 0, p_last, 1.0)), 0.0
        )
        q_last = sums[:, -1] / np.maximum(nonzero[:, -1], 1)
        b = per_group.sum(axis=1) + np.where(
            outliers > 0, outliers * np.log(np.where(q_last > 0, q_last, 1.0)), 0.0
        )
        kl = a / total - np.log(total) - b / total + np.log(kept)
    return np.where((last == 0) & (outliers > 0), np.inf, np.maximum(kl, 0.0))
