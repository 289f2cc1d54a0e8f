"""Reference interpreter: runs any IR, float or quantized, with numpy (bit-exact fixed point in fixed)."""

from qcc.sim.fixed import run_fixed
from qcc.sim.interpreter import Interpreter, run_model

__all__ = ["Interpreter", "run_fixed", "run_model"]
