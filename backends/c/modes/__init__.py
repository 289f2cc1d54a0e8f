"""Target c's numeric modes, one object each: float, fixed point, affine int8/uint8.

`numeric_mode(model)` picks the mode a model's annotations ask for and checks that every
activation fits it; `MODES` lists them (`{m.name: m.lowered_ops() for m in MODES}` is what each
mode lowers).
"""

from __future__ import annotations

from qcc.backends.c.lower import NumericMode, activations
from qcc.backends.c.modes.affine import AFFINE_MODE
from qcc.backends.c.modes.fixed import FIXED_MODE
from qcc.backends.c.modes.float32 import FLOAT_MODE

from qcc.ir.core import Model

__all__ = ["AFFINE_MODE", "FIXED_MODE", "FLOAT_MODE", "MODES", "NumericMode", "numeric_mode"]

MODES: tuple[NumericMode, ...] = (FLOAT_MODE, FIXED_MODE, AFFINE_MODE)


def numeric_mode(model: Model) -> NumericMode:
    """'affine' when any activation is affine, 'fixed' when any is fixed point, else 'float'; the
    chosen mode then refuses an activation it cannot store, naming it."""
    acts = activations(model)
    mode = next(m for m in (AFFINE_MODE, FIXED_MODE, FLOAT_MODE) if m.claims(acts))
    mode.check(acts)
    return mode
