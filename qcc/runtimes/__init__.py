"""Runtimes: a written artifact run where it will really run (issue 16, item 1).

One module per runtime behind one interface (`base.Runtime`): onnxruntime for ONNX and QDQ
files, the gcc-built binary for target c, `nnablart` (nnabla-c-runtime) for .nnb, nnabla for
.nnp, and qcc's simulator for what has no runtime here (a .pt2, a .nnb without nnablart).
A backend says how its files are run (`Backend.runtime`); `open_runtime` finds the runtime for
any path `qcc run` / `qcc eval` are given.
"""

from qcc.runtimes.base import Runtime, Tolerance, run_batches

__all__ = ["Runtime", "Tolerance", "run_batches"]
