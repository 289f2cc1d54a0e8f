"""Reference interpreter: runs any IR, float or quantized, with numpy (bit-exact fixed point in fixed).

One loop (`engine.Runner`) runs every simulator: `interpreter` (float kernels, fake quantization),
`fixed` (nnabla-c-runtime fixed point) and `affine_int` (affine int8 with integer requantization).
"""

from qcc.sim.fixed import run_fixed
from qcc.sim.interpreter import Interpreter, run_model

__all__ = ["Interpreter", "run_fixed", "run_model"]
