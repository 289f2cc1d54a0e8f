"""Reference interpreter: runs any IR, float or quantized, with numpy."""

from qcc.sim.interpreter import Interpreter, run_model

__all__ = ["Interpreter", "run_model"]
