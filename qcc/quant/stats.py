"""Streaming, mergeable per-tensor statistics for calibration.

Calibration must not keep activations (onnxruntime #10503, #11020, #21979), so a tensor's
statistics live in a fixed-size object: counts, min/max, and a signed histogram whose edges are
multiples of a power of two. The histogram covers (-2**k, 2**k) with 2*num_bins bins; when a
batch exceeds it, k grows and pairs of bins merge. Because the edges of level k+1 are a subset of
those of level k and the bin index is computed exactly (multiplication by a power of two, then
floor), merging is exact: stats(a).merge(stats(b)) equals stats(a ++ b) bin for bin, and workers
can calibrate in parallel.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from qcc.errors import InvalidInputError, UsageError

MIN_LOG2_EXTENT = -100
"""The histogram never covers less than [-2**-100, 2**-100): smaller magnitudes share the bins
next to zero. Keeps every scale factor a normal float32; ranges treat such tensors as zero."""

DEFAULT_NUM_BINS = 2048
"""Bins per sign. |x| spans at least half of them (the extent is the next power of two)."""

_CHUNK = 1 << 16  # elements per vectorized step: the temporaries stay in L2


def extent_for(absmax: float) -> int:
    """Smallest k with absmax < 2**k (exact, from the float's exponent), at least MIN_LOG2_EXTENT."""
    if absmax <= 0.0:
        return MIN_LOG2_EXTENT
    return max(math.frexp(absmax)[1], MIN_LOG2_EXTENT)


def rebin(hist: np.ndarray, factor_log2: int) -> np.ndarray:
    """A signed histogram (2N bins over [-2**k, 2**k)) re-expressed over [-2**(k+d), 2**(k+d))."""
    n = hist.size // 2
    if factor_log2 <= 0:
        return hist.copy()
    out = np.zeros_like(hist)
    f = 1 << factor_log2
    if f > n:  # everything lands in the two bins around zero
        out[n - 1] = hist[:n].sum()
        out[n] = hist[n:].sum()
        return out
    out[n - n // f : n + n // f] = hist.reshape(-1, f).sum(axis=1)
    return out


@attrs.frozen(eq=False)
class BatchCounts:
    """What one all-finite batch added to a TensorStats (its histogram at `log2_extent`)."""

    log2_extent: int
    counts: np.ndarray
    count: int
    zero_count: int
    negative_zeros: int  # -0.0 values, binned with the negatives
    min: float
    max: float


@attrs.define(eq=False)
class TensorStats:
    """Statistics of every value seen for one tensor; memory does not depend on the sample count.

    NaN and Inf are counted and kept out of everything else; `check_finite` (called by every range
    function) turns them into an InvalidInputError naming the tensor. `channel_axis` adds
    per-channel min/max along that axis of each batch.
    """

    name: str = ""
    num_bins: int = DEFAULT_NUM_BINS
    channel_axis: int | None = None
    count: int = 0  # finite values
    zero_count: int = 0  # exact zeros (ReLU outputs): they carry no quantization error
    nan_count: int = 0
    inf_count: int = 0
    min: float = math.inf
    max: float = -math.inf
    log2_extent: int = MIN_LOG2_EXTENT
    hist: np.ndarray = attrs.field(
        default=attrs.Factory(lambda s: np.zeros(2 * s.num_bins, dtype=np.int64), takes_self=True)
    )
    channel_min: np.ndarray | None = None
    channel_max: np.ndarray | None = None

    def __attrs_post_init__(self) -> None:
        n = self.num_bins
        if n < 2 or n & (n - 1) or n > 1 << 24:
            raise UsageError(
                f"tensor {self.name!r}: num_bins must be a power of two in 2..2**24, not {n}"
            )
        if self.hist.shape != (2 * n,):
            raise UsageError(f"tensor {self.name!r}: histogram must have {2 * n} bins")

    # ------------------------------------------------------------------ derived views

    @property
    def bin_width(self) -> float:
        return math.ldexp(1.0, self.log2_extent) / self.num_bins

    @property
    def absmax(self) -> float:
        return max(-self.min, self.max) if self.count else 0.0

    @property
    def used_bins(self) -> int:
        """Number of |x| bins up to the one holding absmax."""
        if not self.count:
            return 0
        return min(int(self.absmax / self.bin_width) + 1, self.num_bins)

    def positive_hist(self) -> np.ndarray:
        """Counts of x >= 0 by |x| bin [j*w, (j+1)*w)."""
        return self.hist[self.num_bins :].copy()

    def negative_hist(self) -> np.ndarray:
        """Counts of x < 0 (and -0.0) by |x| bin [j*w, (j+1)*w)."""
        return self.hist[self.num_bins - 1 :: -1].copy()

    def abs_hist(self) -> np.ndarray:
        """Histogram of |x| over [0, 2**log2_extent), bins [j*w, (j+1)*w)."""
        return self.positive_hist() + self.negative_hist()

    def signed_edges(self) -> np.ndarray:
        n = self.num_bins
        return np.arange(-n, n + 1, dtype=np.float64) * self.bin_width

    def nbytes(self) -> int:
        """Memory held by the arrays (constant in the number of updates)."""
        arrays = [self.hist, self.channel_min, self.channel_max]
        return sum(a.nbytes for a in arrays if a is not None)

    def check_finite(self) -> None:
        if self.nan_count or self.inf_count:
            raise InvalidInputError(
                f"tensor {self.name!r}: calibration data contains {self.nan_count} NaN and "
                f"{self.inf_count} Inf value(s) (of {self.count + self.nan_count + self.inf_count}); "
                "no range can be chosen"
            )

    # ------------------------------------------------------------------ accumulation

    def update(self, batch: Any) -> TensorStats:
        """Add every value of `batch`; returns self so calls chain."""
        self.add(batch)
        return self

    def add(self, batch: Any) -> BatchCounts | None:
        """update(), returning what the batch added when it was all finite (None otherwise).

        The result lets `add_relu_of` account for max(batch, 0) without another pass.
        """
        x = np.asarray(batch)
        if x.dtype.kind not in "fiub":
            raise InvalidInputError(f"tensor {self.name!r}: cannot calibrate dtype {x.dtype}")
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        elif x.dtype.itemsize < 4:
            x = x.astype(np.float32)
        if x.size == 0:
            return None
        flat = x.reshape(-1)
        lo, hi = flat.min(), flat.max()
        finite = None
        if not (math.isfinite(lo) and math.isfinite(hi)):
            finite = np.isfinite(x)
            nans = int(np.count_nonzero(np.isnan(flat)))
            self.nan_count += nans
            self.inf_count += int(flat.size - np.count_nonzero(finite)) - nans
            flat = x[finite]
            if flat.size == 0:
                return None
            lo, hi = flat.min(), flat.max()
        if self.channel_axis is not None:
            self._update_channels(x, finite)
        self.count += int(flat.size)
        self.min = min(self.min, float(lo))
        self.max = max(self.max, float(hi))
        self._grow(extent_for(max(-float(lo), float(hi))))
        counts, zeros, negative_zeros = self._accumulate(flat)
        if finite is not None:
            return None
        return BatchCounts(self.log2_extent, counts, int(flat.size), zeros, negative_zeros, float(lo), float(hi))

    def add_relu_of(self, source: BatchCounts) -> bool:
        """Add max(x, 0) for the batch x that `source` describes, without reading the data.

        Exact (the same as update(np.maximum(x, 0))) when x was binned at the level this
        tensor's histogram needs after the batch; otherwise nothing is added and the result is
        False: observe the output itself then. ReLU outputs are a third of what a ResNet computes.
        """
        n = self.num_bins
        hi = max(source.max, 0.0)
        level = max(self.log2_extent, extent_for(hi))
        if (self.channel_axis is not None or source.counts.size != 2 * n or level != source.log2_extent
                or source.negative_zeros):  # max(-0.0, 0) is either zero, depending on numpy's loop
            return False
        self._grow(level)
        negatives = int(source.counts[:n].sum())  # all become +0.0
        self.hist[n:] += source.counts[n:]
        self.hist[n] += negatives
        self.count += source.count
        self.zero_count += source.zero_count + negatives
        self.min = min(self.min, source.min if source.min > 0 else 0.0)
        self.max = max(self.max, hi)
        return True

    def _grow(self, k: int) -> None:
        if k > self.log2_extent:
            self.hist = rebin(self.hist, k - self.log2_extent)
            self.log2_extent = k

    def _accumulate(self, flat: np.ndarray) -> tuple[np.ndarray, int, int]:
        """Bin `flat` into the histogram; (its counts, exact zeros, negative zeros)."""
        n = self.num_bins
        # |x| < 2**k, so t = x * 2**(log2 n - k) lies in (-n, n) and is exact (an underflow to
        # -0.0 keeps its sign). With j = floor(|t|) = |trunc(t)|, x >= 0 goes to bin n + j and
        # x < 0 to bin n - 1 - j: |x| in [j*w, (j+1)*w) on both sides, so pairs merge exactly.
        e = n.bit_length() - 1 - self.log2_extent
        if flat.dtype.itemsize < 8 and not -126 <= e <= 127:
            flat = flat.astype(np.float64)
        mult = flat.dtype.type(math.ldexp(1.0, e))
        size = min(flat.size, _CHUNK)
        tbuf = np.empty(size, dtype=flat.dtype)
        ibuf = np.empty(size, dtype=np.int32)  # |index| < 2**31; faster than intp here
        sbuf = np.empty(size, dtype=np.bool_)
        zeros = negative_zeros = 0
        total = np.zeros(2 * n, dtype=np.int64)
        for start in range(0, flat.size, _CHUNK):
            chunk = flat[start : start + _CHUNK]
            m = chunk.size
            t, idx, neg = tbuf[:m], ibuf[:m], sbuf[:m]
            np.multiply(chunk, mult, out=t)
            np.copyto(idx, t, casting="unsafe")
            np.signbit(t, out=neg)
            idx += n
            np.subtract(idx, neg, out=idx, casting="unsafe")
            counts = np.bincount(idx, minlength=2 * n)
            if counts[n] or counts[n - 1]:  # only these bins can hold (signed) zeros
                is_zero = chunk == 0
                found = int(np.count_nonzero(is_zero))
                if found and counts[n - 1]:
                    negative_zeros += int(np.count_nonzero(np.signbit(chunk[is_zero])))
                zeros += found
            total += counts
        self.hist += total
        self.zero_count += zeros
        return total, zeros, negative_zeros

    def _update_channels(self, x: np.ndarray, finite: np.ndarray | None) -> None:
        axis = self.channel_axis
        assert axis is not None
        if not -x.ndim <= axis < x.ndim:
            raise InvalidInputError(
                f"tensor {self.name!r}: channel axis {axis} out of range for shape {x.shape}"
            )
        others = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
        if finite is None and axis % x.ndim == 1:
            cmin, cmax = channel_min_max(x)
        elif finite is None:
            cmin, cmax = x.min(axis=others), x.max(axis=others)
        else:
            cmin = np.where(finite, x, np.inf).min(axis=others)
            cmax = np.where(finite, x, -np.inf).max(axis=others)
        cmin, cmax = cmin.astype(np.float64), cmax.astype(np.float64)
        if self.channel_min is None or self.channel_max is None:
            self.channel_min, self.channel_max = cmin, cmax
            return
        if cmin.shape != self.channel_min.shape:
            raise InvalidInputError(
                f"tensor {self.name!r}: {cmin.size} channels on axis {axis}, "
                f"earlier batches had {self.channel_min.size}"
            )
        np.minimum(self.channel_min, cmin, out=self.channel_min)
        np.maximum(self.channel_max, cmax, out=self.channel_max)

    def merge(self, other: TensorStats) -> TensorStats:
        """Statistics of both inputs together (associative and commutative; inputs unchanged)."""
        if other.num_bins != self.num_bins or other.channel_axis != self.channel_axis:
            raise UsageError(
                f"tensor {self.name!r}: cannot merge statistics with different num_bins or channel axis"
            )
        if other.name != self.name:
            raise UsageError(f"cannot merge statistics of tensors {self.name!r} and {other.name!r}")
        k = max(self.log2_extent, other.log2_extent)
        hist = rebin(self.hist, k - self.log2_extent) + rebin(other.hist, k - other.log2_extent)
        cmin, cmax = _merge_channels(self, other)
        return TensorStats(
            name=self.name,
            num_bins=self.num_bins,
            channel_axis=self.channel_axis,
            count=self.count + other.count,
            zero_count=self.zero_count + other.zero_count,
            nan_count=self.nan_count + other.nan_count,
            inf_count=self.inf_count + other.inf_count,
            min=min(self.min, other.min),
            max=max(self.max, other.max),
            log2_extent=k,
            hist=hist,
            channel_min=cmin,
            channel_max=cmax,
        )

    def absorb(self, other: TensorStats) -> None:
        """Become `self.merge(other)` in place: the same values, without a new histogram when
        `other` is at this level or below (calibration's threads fold one batch after another)."""
        if other.num_bins != self.num_bins or other.channel_axis != self.channel_axis or other.name != self.name:
            self.merge(other)  # raises the error merge names
        k = max(self.log2_extent, other.log2_extent)
        self._grow(k)
        self.hist += other.hist if other.log2_extent == k else rebin(other.hist, k - other.log2_extent)
        self.channel_min, self.channel_max = _merge_channels(self, other)
        self.count += other.count
        self.zero_count += other.zero_count
        self.nan_count += other.nan_count
        self.inf_count += other.inf_count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML/JSON-able); the histogram is stored sparsely."""
        nz = np.flatnonzero(self.hist)
        out: dict[str, Any] = {
            "name": self.name,
            "num_bins": self.num_bins,
            "channel_axis": self.channel_axis,
            "count": self.count,
            "zero_count": self.zero_count,
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
            "min": self.min,
            "max": self.max,
            "log2_extent": self.log2_extent,
            "hist": {int(i): int(self.hist[i]) for i in nz},
        }
        if self.channel_min is not None and self.channel_max is not None:
            out["channel_min"] = self.channel_min.tolist()
            out["channel_max"] = self.channel_max.tolist()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorStats:
        n = int(data["num_bins"])
        hist = np.zeros(2 * n, dtype=np.int64)
        for i, c in data["hist"].items():
            hist[int(i)] = int(c)
        cmin, cmax = data.get("channel_min"), data.get("channel_max")
        return cls(
            name=str(data["name"]),
            num_bins=n,
            channel_axis=data["channel_axis"],
            count=int(data["count"]),
            zero_count=int(data["zero_count"]),
            nan_count=int(data["nan_count"]),
            inf_count=int(data["inf_count"]),
            min=float(data["min"]),
            max=float(data["max"]),
            log2_extent=int(data["log2_extent"]),
            hist=hist,
            channel_min=None if cmin is None else np.asarray(cmin, dtype=np.float64),
            channel_max=None if cmax is None else np.asarray(cmax, dtype=np.float64),
        )


def _merge_channels(a: TensorStats, b: TensorStats) -> tuple[np.ndarray | None, np.ndarray | None]:
    if a.channel_min is None or a.channel_max is None:
        return _copy(b.channel_min), _copy(b.channel_max)
    if b.channel_min is None or b.channel_max is None:
        return _copy(a.channel_min), _copy(a.channel_max)
    if a.channel_min.shape != b.channel_min.shape:
        raise InvalidInputError(
            f"tensor {a.name!r}: cannot merge {a.channel_min.size} and {b.channel_min.size} channels"
        )
    return np.minimum(a.channel_min, b.channel_min), np.maximum(a.channel_max, b.channel_max)


def _copy(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else a.copy()


def channel_min_max(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per channel (axis 1), the minimum and the maximum over every other axis: the values (and
    dtype) of `array.min(axis=axes)` / `array.max(axis=axes)`.

    numpy reduces axes (0, 2, 3) of a small feature map slowly (a short inner loop per sample and
    channel: equalize's data run on MobileNetV2 at 96x96 spent 16 of its 18 ms on the 28 clamp inputs of 12x12 and
    smaller), so where each sample's map is small the samples are reduced first, elementwise over
    contiguous rows, then each channel's taps (5.5 ms for all 35). A minimum or maximum is
    one of the values whatever the order, except for the sign of a zero (-0.0 == 0.0) and which
    NaN: where some channel's result is zero or NaN the whole-array reduction gives it instead."""
    axes = tuple(a for a in range(array.ndim) if a != 1)
    n = int(array.shape[0]) if array.ndim >= 2 else 0
    if n < 2 or array.ndim < 3 or array[0, 0].size > _SMALL_MAP or not array.flags.c_contiguous \
            or array.dtype.kind != "f":
        return array.min(axis=axes), array.max(axis=axes)
    rows = array.reshape(n, int(array.shape[1]), -1)
    lo = np.minimum.reduce(rows, axis=0).min(axis=1)
    hi = np.maximum.reduce(rows, axis=0).max(axis=1)
    if np.any((lo == 0) | np.isnan(lo)) or np.any((hi == 0) | np.isnan(hi)):
        return array.min(axis=axes), array.max(axis=axes)
    return lo, hi


_SMALL_MAP = 255
"""Values per sample and channel up to which `channel_min_max` reduces the samples first (the
whole-array reduction is as fast from 16x16 on)."""
