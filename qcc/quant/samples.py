"""How many calibration samples a pass that runs the model on them reads (numpy-free arithmetic).

equalize (per-channel ranges of the float model) and bias-correct (per-channel mean errors) run
the model on the first calibration samples; what they measure per channel is a statistic over
every position of every sample. A large input gives each channel many positions per sample, so a
few samples hold as many as many small ones, while the runs cost in proportion to the input: the
passes read as many samples as hold a budget of input values (never fewer than `MIN_SAMPLES`,
never more than their `samples` option).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

INPUT_VALUES = 1 << 18
"""The default budget of input values (all samples together): 16 samples of 8x8 digits read all
of them, 96x96 RGB images 8, 224x224 ones 4."""

MIN_SAMPLES = 4
"""The fewest samples the budget leaves (a statistic over fewer images follows the images)."""


def sample_count(samples: int, per_sample: int, budget: int = INPUT_VALUES) -> int:
    """How many of the first `samples` samples to read when each holds `per_sample` input
    values: all while they fit `budget`, else as many as fit rounded down to a multiple of
    `MIN_SAMPLES`, at least `MIN_SAMPLES` (never more than `samples`).

    The multiple: the runs split the samples into contiguous shares, one per thread
    (qcc.sim.split), and wait for the largest; 9 samples on 2 threads cost 5 samples' time for
    9 samples' statistics, 8 cost 4. The count never depends on the machine's cores (the
    statistics, hence the bytes written, would)."""
    fit = budget // max(per_sample, 1)
    return min(samples, max(MIN_SAMPLES, fit - fit % MIN_SAMPLES))


def values_per_sample(feeds: Mapping[str, Any]) -> int:
    """Input values of one sample (every graph input) of `feeds` (arrays, samples first)."""
    return sum(math.prod(int(d) for d in v.shape[1:]) for v in feeds.values())
