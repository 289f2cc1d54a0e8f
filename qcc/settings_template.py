"""`qcc settings MODEL.nnp -o settings.yaml`: nnabla's `nnabla_cli nnb_template`, from qcc.

Without data every variable is FLOAT32 and every function `implement: 0`, as nnb_template
writes. With `--calib`, qcc calibrates the model as it is (no BN folding: the names must stay
the .nnp's) and assigns fixed-point positions under the rules of the target that writes .nnb
files (its legalization included), so `nnabla_cli convert -s settings.yaml` builds the .nnb with qcc's positions.
"""

from __future__ import annotations

import os
from typing import Any

from qcc.errors import UsageError


def write_settings(model: str, out: str, calib: Any = None, quantize: str = "fixed8", method: str | None = None,
                   network: str | None = None, executor: str | None = None, progress: bool = False) -> int:
    """Write the template; returns the number of variables listed."""
    from qcc.driver import load
    from qcc.formats.settings_yaml import export_settings
    from qcc.io import atomic_write_bytes
    from qcc.pipelines import FIXED, default_method

    if not model.lower().endswith((".nnp", ".nntxt")):
        raise UsageError(f"{model}: qcc settings writes nnabla's settings.yaml for an .nnp model")
    if calib is None and method is not None:
        raise UsageError("--method has no effect without --calib")
    if calib is not None and FIXED.get(quantize, (8, 8))[1] < 8:
        raise UsageError(f"--quantize {quantize}: settings.yaml has no 4-bit type (nnabla's converter would round "
                         "the weights to FIXED8); compile the .nnb with qcc instead")
    from qcc.outputs import check_outputs

    check_outputs(out, None, {"model": model, "calibration data": calib})  # never over an input, before any work
    loaded = load(model, network=network, executor=executor)
    if calib is not None:
        if quantize not in FIXED:
            from qcc.options import choice_error

            raise choice_error("--quantize", quantize, tuple(FIXED))
        from qcc.data import open_data
        from qcc.plugins import backend_for
        from qcc.pm.base import PassContext
        from qcc.pm.manager import PassManager, build_passes
        from qcc.target import as_backend

        backend = as_backend(backend_for(os.path.splitext(out)[0] + ".nnb"))
        bits, weight_bits = FIXED[quantize]
        spec = (f"calibrate,assign-fixed-point{{bits={bits},weight_bits={weight_bits},"
                f"method={method or default_method(quantize)}}}")
        options = backend.make_options()
        ctx = PassContext(target=backend.constraints(options), progress=progress)
        ctx.calib_data, ctx.calib_name = open_data(calib, "calibration data", [v.name for v in loaded.graph.inputs])
        # the target's legalization too: the positions a `qcc compile -o x.nnb` of this pipeline writes
        passes = [*build_passes(spec), *backend.legalization(options)]
        loaded = PassManager(passes).run(loaded, ctx).model
    text = export_settings(loaded)
    atomic_write_bytes(out, text.encode())
    return text.split("\nvariables:", 1)[-1].count("\n  ")
