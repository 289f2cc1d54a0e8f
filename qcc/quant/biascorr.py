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

from collections.abc import Callable

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
        """add(got - target in float64, mask) without the float64 copy of `got` (one array of the
        whole batch fewer; the same differences, so the same bits)."""
        self.add(np.subtract(got, target, dtype=np.float64), mask)

    def add_errors(self, got: np.ndarray, target: np.ndarray, inside: tuple[float | None, float | None] | None = None,
                   step: float | None = None, read: Callable[[np.ndarray], np.ndarray] | None = None,
                   ranges: Ranges | None = None) -> None:
        """add_difference(read(got) - target, mask) with mask = lo < target < hi (`inside`; None:
        no mask), one sample at a time: a sample's float64 differences (a tenth of the batch's)
        stay in cache through the subtraction, the select and the sum, where the batch's went to
        memory three times. `step`: `got` holds integers that read as got * step (fixed point:
        exact in float64), no float copy of them made first. `read`: an elementwise function
        applied to `got` first (a fake quantization), on the same samples. `ranges`: runs the
        samples' sums on contiguous ranges of samples (threads: qcc.sim.split); they are added
        here in sample order, the additions one range makes.

        The same bits as add_difference: numpy sums a channel of an (N, C, ...) array as one
        pairwise sum per sample (the contiguous trailing axes) added in sample order, which is
        what summing each sample alone and adding the parts in order computes."""
        if got.ndim < 2 or len(got) == 0:
            diff = got * np.float64(step) if step is not None else got
            diff = read(diff) if read is not None else diff
            mask = None if inside is None else _inside(target, *inside)
            self.add_difference(diff, target, mask)
            return

        def sums(start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
            return _sample_sums(got[start:stop], target[start:stop], inside, step, read)

        for part in (ranges(sums, len(got)) if ranges is not None else [sums(0, len(got))]):
            for total, seen in part:
                self._accumulate(total, seen)

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


def storable(bias: np.ndarray, step: np.ndarray, qmin: int, qmax: int,
             zero_point: np.ndarray | int = 0) -> tuple[np.ndarray, int]:
    """(bias clipped to [(qmin - zp) * step, (qmax - zp) * step], how many entries were clipped)."""
    step = np.asarray(step, np.float64)
    zp = np.asarray(zero_point, np.float64)
    clipped = np.clip(bias, (qmin - zp) * step, (qmax - zp) * step)
    return clipped, int(np.count_nonzero(clipped != bias))


def _inside(target: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """lo < target < hi (a missing bound: no limit on that side)."""
    return (target > (-np.inf if lo is None else lo)) & (target < (np.inf if hi is None else hi))


Ranges = Callable[[Callable[[int, int], list[tuple[np.ndarray, np.ndarray]]], int],
                  list[list[tuple[np.ndarray, np.ndarray]]]]
"""runs fn(start, stop) over contiguous ranges that cover `count` samples; results in sample order."""


def _sample_sums(got: np.ndarray, target: np.ndarray, inside: tuple[float | None, float | None] | None,
                 step: float | None, read: Callable[[np.ndarray], np.ndarray] | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sample: the per-channel sums of (got - target) inside the mask, and the counts."""
    if read is not None:
        got = read(got)
    channels = got.shape[1]
    diff = np.empty(got.shape[1:], np.float64)
    scaled = np.empty(got.shape[1:], np.float64) if step is not None else None
    mask = np.empty(got.shape[1:], bool) if inside is not None else None
    below = np.empty(got.shape[1:], bool) if inside is not None else None
    out = []
    for k in range(len(got)):
        sample = got[k]
        if scaled is not None and step is not None:
            sample = np.multiply(sample, step, out=scaled, dtype=np.float64)
        if mask is None or below is None or inside is None:
            np.subtract(sample, target[k], out=diff, dtype=np.float64)
            part = diff.reshape(channels, -1).sum(axis=1)
            seen = np.full(channels, diff.size // max(channels, 1), dtype=np.float64)
        else:
            lo, hi = inside
            np.greater(target[k], -np.inf if lo is None else lo, out=mask)  # _inside's comparisons
            np.logical_and(mask, np.less(target[k], np.inf if hi is None else hi, out=below), out=mask)
            diff.fill(0.0)  # np.where(mask, difference, 0.0)'s values
            np.subtract(sample, target[k], out=diff, where=mask, dtype=np.float64)
            part = diff.reshape(channels, -1).sum(axis=1)
            seen = np.count_nonzero(mask.reshape(channels, -1), axis=1).astype(np.float64)
        out.append((part, seen))
    return out
