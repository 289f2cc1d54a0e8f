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

INTEGER_INPUT_VALUES = 1 << 17
"""bias-correct's input-value budget (qcc.quant.samples) when the model runs on nnabla-c-runtime's
integer kernels: half the float runs' (96x96 RGB images: 4 samples instead of 8). A value costs
24-85x a float product there (the convolution truncates per input channel), and the error it
measures is mostly the truncation's, a bias set by few samples: torchvision mobilenet_v2 96x96,
logits SQNR with 8 / 4 samples, fixed8 .nnb 20.43 / 20.44 dB, fixed16 64.67 / 64.48 dB (7.13 and
47.86 uncorrected), for 0.25-0.5 s less (docs/benchmarks.md, "Compile time")."""


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
                   ranges: Ranges | None = None, offset: np.ndarray | None = None,
                   bounds: tuple[int, int] | None = None) -> None:
        """add_difference(read(got) - target, mask) with mask = lo < target < hi (`inside`; None:
        no mask), one sample at a time: a sample's float64 differences (a tenth of the batch's)
        stay in cache through the subtraction, the select and the sum, where the batch's went to
        memory three times. `step`: `got` holds integers that read as got * step (fixed point:
        exact in float64), no float copy of them made first; `offset`: per channel (axis 1),
        integers added to `got` first (a fixed-point bias whose addition cannot saturate: the
        stored output without the array of it), then clipped to `bounds` (its saturation, when
        it may saturate). `read`: an elementwise function applied to
        `got` first (a fake quantization), on the same samples. `ranges`: runs the samples'
        sums on contiguous ranges of samples (threads: qcc.sim.split); they are added here in
        sample order, the additions one range makes.

        The same bits as add_difference: numpy sums a channel of an (N, C, ...) array as one
        pairwise sum per sample (the contiguous trailing axes) added in sample order, which is
        what summing each sample alone and adding the parts in order computes (`_sample_sums`:
        the same terms, counts in any order: integers)."""
        if got.ndim < 2 or len(got) == 0:
            assert offset is None, "an offset is per channel (axis 1)"
            diff = got * np.float64(step) if step is not None else got
            diff = read(diff) if read is not None else diff
            mask = None if inside is None else _inside(target, *inside)
            self.add_difference(diff, target, mask)
            return

        def sums(start: int, stop: int) -> tuple[list[np.ndarray], np.ndarray]:
            return _sample_sums(got[start:stop], target[start:stop], inside, step, read, offset, bounds)

        for parts, seen in (ranges(sums, len(got)) if ranges is not None else [sums(0, len(got))]):
            for total in parts:
                self.sums = total if self.sums is None else self.sums + total
            self.counts = seen if self.counts is None else self.counts + seen

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


Ranges = Callable[[Callable[[int, int], tuple[list[np.ndarray], np.ndarray]], int],
                  list[tuple[list[np.ndarray], np.ndarray]]]
"""runs fn(start, stop) over contiguous ranges that cover `count` samples; results in sample order."""

MAGIC = 1.5 * 2.0 ** 52
"""In [2**52, 2**53) a float64's step is 1: the bits of MAGIC + v are MAGIC's bits plus v (|v| < 2**51)."""


def _sample_sums(got: np.ndarray, target: np.ndarray, inside: tuple[float | None, float | None] | None,
                 step: float | None, read: Callable[[np.ndarray], np.ndarray] | None,
                 offset: np.ndarray | None = None, bounds: tuple[int, int] | None = None
                 ) -> tuple[list[np.ndarray], np.ndarray]:
    """Per sample, the per-channel sums of (got - target) inside the mask; the counts of all.

    Fewer passes than a select per sample, the same sums bit for bit:
    - integers (`step`) become floats with one integer add and one float subtraction (MAGIC
      scaled by the step: its float step is `step`, so its bits plus v read as MAGIC * step +
      v * step, and subtracting MAGIC * step is exact): no int64-to-float64 conversion, and the
      per-channel `offset` rides along in that add (and the clip to `bounds` moves by MAGIC's bits);
    - the differences are computed everywhere and multiplied by the mask: each term outside it
      is +-0 instead of +0, and x + (+-0) == x for every x != 0, so each pairwise sum is the
      same number or a zero of either sign. A sum's sign of zero is set as the select gives it
      (-0 only when every term is -0, which needs the whole channel inside the mask); a sum
      that is not finite (NaN or infinity outside the mask, times 0) is computed by the select;
    - the mask is computed a sample at a time into one buffer (in cache for the product); its
      counts are integers, accumulated per position in bytes and summed once."""
    count, channels = len(got), got.shape[1]
    flat = target.reshape(count, channels, -1)
    mask = None if inside is None else np.empty(flat.shape[1:], bool)
    below = None if inside is None else np.empty(flat.shape[1:], bool)
    counted = None if inside is None else np.zeros(flat.shape[1:], np.uint8 if count < 256 else np.uint32)
    lo, hi = (None, None) if inside is None else inside
    lo, hi = -np.inf if lo is None else lo, np.inf if hi is None else hi  # _inside's bounds
    # integers: |got + offset| < 2**51, the caller's word (`step`: at most 24-bit fixed point;
    # an offset only where the sums cannot saturate)
    integers = step is not None and got.dtype.kind == "i" and read is None
    if read is not None and step is None and offset is None:  # one call on the range: fewer, larger passes
        got, read = read(got), None
    diff = np.empty(flat.shape[1:], np.float64)
    origin = np.float64(MAGIC * step) if step is not None else np.float64(0.0)
    base = origin.view(np.int64) + (np.zeros((channels, 1), np.int64) if offset is None
                                    else offset.astype(np.int64).reshape(channels, 1))
    clip = None if bounds is None else (origin.view(np.int64) + bounds[0], origin.view(np.int64) + bounds[1])
    parts = []
    for k in range(count):
        if integers:
            np.add(got[k].reshape(channels, -1), base, out=diff.view(np.int64))
            if clip is not None:  # two reductions cost a third of an int64 clip: clip only what saturates
                ints = diff.view(np.int64)
                if int(ints.min()) < clip[0] or int(ints.max()) > clip[1]:
                    np.clip(ints, *clip, out=ints)
            np.subtract(diff, origin, out=diff)
            np.subtract(diff, flat[k], out=diff)
        else:
            sample = _read(got, k, step, read, offset, bounds)
            np.subtract(sample.reshape(channels, -1), flat[k], out=diff, dtype=np.float64)
        if mask is not None and below is not None and counted is not None:
            np.greater(flat[k], lo, out=mask)  # _inside(target[k], *inside)
            np.logical_and(mask, np.less(flat[k], hi, out=below), out=mask)
            np.add(counted, mask.view(np.uint8), out=counted)
            with np.errstate(invalid="ignore"):  # infinity times 0 outside the mask: that sum is redone
                np.multiply(diff, mask, out=diff)
        part = diff.sum(axis=1)
        if not np.isfinite(part).all():
            part = _selected_sum(diff, got, k, flat[k], inside, step, read, offset, bounds)
        elif mask is not None:
            for c in np.flatnonzero((part == 0) & np.signbit(part)):
                if not mask[c].all():  # the select's -0 needs every term -0: none outside the mask
                    part[c] = 0.0
        parts.append(part)
    seen = np.full(channels, flat.shape[2] * count, dtype=np.float64) if counted is None else \
        counted.sum(axis=1, dtype=np.int64).astype(np.float64)
    return parts, seen


def _read(got: np.ndarray, k: int, step: float | None, read: Callable[[np.ndarray], np.ndarray] | None,
          offset: np.ndarray | None, bounds: tuple[int, int] | None = None) -> np.ndarray:
    """Sample k of `got` (kept 1 x C x ...: `read` sees the layout it was given) as it reads."""
    sample = got[k:k + 1]
    if offset is not None:
        sample = sample + offset.reshape(1, -1, *([1] * (got.ndim - 2)))
    if bounds is not None:
        sample = np.clip(sample, *bounds)
    if step is not None:
        sample = np.multiply(sample, step, dtype=np.float64)
    return read(sample) if read is not None else sample


def _selected_sum(diff: np.ndarray, got: np.ndarray, k: int, target: np.ndarray,
                  inside: tuple[float | None, float | None] | None, step: float | None,
                  read: Callable[[np.ndarray], np.ndarray] | None, offset: np.ndarray | None,
                  bounds: tuple[int, int] | None) -> np.ndarray:
    """One sample's sums with the select (0 outside the mask): NaN and infinities kept out."""
    sample = _read(got, k, step, read, offset, bounds)
    diff.fill(0.0)
    where = True if inside is None else _inside(target, *inside)
    np.subtract(sample.reshape(len(diff), -1), target, out=diff, where=where, dtype=np.float64)
    return diff.sum(axis=1)
