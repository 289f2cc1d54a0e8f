"""Bias correction: the numbers (numpy only).

Quantization errors are not zero-mean: weight rounding times a nonzero mean input, truncation
toward zero (nnabla-c-runtime stores every value it computes that way, and its convolution
truncates once per input channel) and the bias's own rounding all shift each output channel by
a constant. That constant moves into the bias (Nagel et al. 2019, section 4.2): empirically as
the mean of (quantized layer - float layer) over calibration data, per output channel, or
analytically as (W_q - W) E[x] with E[x] from the BatchNorm statistics before the layer.

The corrected bias must still fit the target's bias storage: int32 on the accumulator scale
for affine, the output's width and position for nnb fixed point (nnabla-c-runtime adds the
bias with saturation in the output's type). `storable` clips to what that storage holds.
"""

from __future__ import annotations

import attrs
import numpy as np

SAMPLES = 16
"""bias-correct's default sample count (calibrate keeps the float outputs of as many for it)."""


@attrs.define
class ChannelMean:
    """Running mean per channel (axis 1) of arrays shaped (N, C, ...), optionally over a mask.

    The mask keeps the positions where a shift of the bias shifts what the model computes:
    before a ReLU, where the float output is positive (the rest is clamped to 0 anyway, and a
    runtime that stores the output at the ReLU's range clips it there)."""

    sums: np.ndarray | None = None
    counts: np.ndarray | None = None

    def add(self, diff: np.ndarray, mask: np.ndarray | None = None) -> None:
        axes = tuple(a for a in range(diff.ndim) if a != 1)
        if mask is None:
            part = diff.sum(axis=axes, dtype=np.float64)
            seen = np.full(diff.shape[1], diff.size // max(diff.shape[1], 1), dtype=np.float64)
        else:  # no float64 copies of the mask and the masked product: one select, one reduction
            part = np.where(mask, diff, 0.0).sum(axis=axes, dtype=np.float64)
            seen = np.count_nonzero(mask, axis=axes).astype(np.float64)
        self._accumulate(part, seen)

    def add_difference(self, got: np.ndarray, target: np.ndarray, mask: np.ndarray | None = None) -> None:
        """add(got - target in float64, mask) masking the one float64 difference in place (no
        cast copy of `got`, no masked copy): the same values summed in the same layout."""
        diff = np.subtract(got, target, dtype=np.float64)
        if mask is None:
            self.add(diff)
            return
        axes = tuple(a for a in range(diff.ndim) if a != 1)
        self._accumulate(masked(diff, mask).sum(axis=axes, dtype=np.float64), _counts(mask, axes))

    def merge(self, other: ChannelMean) -> None:
        """Add another run's sums: the same additions `add` makes, so merging per-batch means in
        batch order gives the bits of one mean fed batch by batch."""
        if other.sums is not None and other.counts is not None:
            self._accumulate(other.sums, other.counts)

    def _accumulate(self, part: np.ndarray, seen: np.ndarray) -> None:
        self.sums = part if self.sums is None else self.sums + part
        self.counts = seen if self.counts is None else self.counts + seen

    @property
    def count(self) -> int:
        return 0 if self.counts is None else int(self.counts.sum())

    def mean(self) -> np.ndarray:
        assert self.sums is not None and self.counts is not None
        return np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), 0.0)


def masked(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """np.where(mask, values, 0.0) for float64 values, in place: the bits ANDed with all ones
    where the mask holds and with zero (+0.0) where it does not. np.where's per-element select
    pays branch misses where the mask is irregular (1.7x on a random mask); on torchvision
    mobilenet_v2's clamp masks the two cost the same."""
    if values.dtype != np.float64 or mask.shape != values.shape or not values.flags.c_contiguous:
        return np.where(mask, values, 0.0)
    keep = mask.astype(np.int64)
    np.negative(keep, out=keep)  # 1 -> all bits set
    bits = values.view(np.int64)
    np.bitwise_and(bits, keep, out=bits)
    return values


def _counts(mask: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Per channel, how many entries the mask holds (integer sums: count_nonzero's values)."""
    return mask.sum(axis=axes, dtype=np.int64).astype(np.float64)  # type: ignore[no-any-return]


def storable(bias: np.ndarray, step: np.ndarray, qmin: int, qmax: int,
             zero_point: np.ndarray | int = 0) -> tuple[np.ndarray, int]:
    """(bias clipped to [(qmin - zp) * step, (qmax - zp) * step], how many entries were clipped)."""
    step = np.asarray(step, np.float64)
    zp = np.asarray(zero_point, np.float64)
    clipped = np.clip(bias, (qmin - zp) * step, (qmax - zp) * step)
    return clipped, int(np.count_nonzero(clipped != bias))
