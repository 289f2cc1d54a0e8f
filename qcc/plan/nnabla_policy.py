"""nnabla's own shared-object policy, reimplemented so qcc can reproduce (and beat) it.

Reference: nnabla 1.39, `nnabla/utils/converter/nnablart/save_variable_buffer.py`
(`save_variable_buffer(info)`, used by `nnb.py` and `csrc.py`). Its rules:
- lifetimes are inclusive [first, last] function indices (the caller builds them: graph inputs
  from 0, graph outputs to the end);
- number of buffers = peak live count; buffer k (ascending) gets the largest (N-1-k)-th biggest
  live size over all steps, i.e. the positional maxima in ascending order;
- step by step, each newly live variable (in variable order) takes the first vacant buffer that
  is large enough, else the first vacant buffer is grown to its size.
nnabla walks every function and every buffer (O(F * B)); this walks the start steps only, which
gives the same sizes and ids because a live set only grows between starts. nnabla keeps sizes in
int32; the reimplementation uses Python ints (identical below 2**31).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qcc.plan.bounds import positional_maxima_arrays
from qcc.plan.intervals import Buffer, as_arrays
from qcc.plan.shared import SharedPlan


def nnabla_shared_plan(buffers: Sequence[Buffer]) -> SharedPlan:
    """The plan nnabla's converter would write for these lifetimes (buffer order matters)."""
    arr = as_arrays(buffers)
    maxima = positional_maxima_arrays(arr)
    slot_sizes = maxima[::-1].tolist()
    slot_free_after = [np.iinfo(np.int64).min] * len(slot_sizes)  # last step of occupant
    ids = [0] * arr.n
    firsts, lasts, sizes = arr.firsts.tolist(), arr.lasts.tolist(), arr.sizes.tolist()
    order = np.lexsort((np.arange(arr.n), arr.firsts)).tolist()
    for i in order:
        step, needed = firsts[i], sizes[i]
        vacant = [k for k, end in enumerate(slot_free_after) if end < step]
        chosen = next((k for k in vacant if slot_sizes[k] >= needed), -1)
        if chosen < 0:
            chosen = vacant[0]
            slot_sizes[chosen] = needed
        slot_free_after[chosen] = lasts[i]
        ids[i] = chosen
    assignment = {name: slot for name, slot in zip(arr.names, ids)}
    total = sum(slot_sizes)
    return SharedPlan(assignment, tuple(slot_sizes), total, int(maxima.sum()), "nnabla")
