"""`qcc.write` and `qcc.run`: the two public verbs that are not in the compile driver.

`write` enforces the backend's ordering contract on a model built or transformed from Python,
the same contract `qcc compile` checks before it runs a pipeline.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from qcc.errors import UsageError
from qcc.ir.core import Model


def write(model: Model, out: str | os.PathLike[str], target: str | None = None, **options: Any) -> Any:
    """Write `model` with a backend chosen by name or by OUT's extension; returns the backend.

    `options` are the target's typed options (`qcc targets` lists them). The target's legalization
    passes run on the model first (as at the end of a `qcc compile` pipeline), then the backend
    writes atomically (temp file + rename). Passes the backend `requires` must have run on the
    model already (`model.passes_run`); otherwise this fails naming both.
    """
    from qcc.plugins import backend_for
    from qcc.pm.base import PassContext
    from qcc.pm.manager import PassManager
    from qcc.target import as_backend

    if not isinstance(model, Model):
        raise UsageError(f"qcc.write: expected a qcc.ir.Model, got {type(model).__name__}")
    path = os.fspath(out)
    backend = as_backend(backend_for(path, target))
    typed = backend.make_options(**options)
    check_backend_requirements(backend, model)
    legalization = list(backend.legalization(typed))
    if legalization:  # what `qcc compile` runs at the end of its pipeline
        PassManager(legalization).run(model, PassContext(target=backend.constraints(typed)))
    backend.write(model, path, typed)
    return backend


def check_backend_requirements(backend: Any, model: Model) -> None:
    """A backend's `requires` are pass names that must be in the model's pass history."""
    ran = set(model.passes_run)
    missing = [name for name in getattr(backend, "requires", ()) if name not in ran]
    if missing:
        history = ",".join(model.passes_run) or "none"
        raise UsageError(
            f"target {backend.name!r} requires pass {missing[0]!r}, which has not run on model "
            f"{model.graph.name!r} (passes run: {history}); run it first, e.g. with qcc.PassManager"
        )


def run(model: Model, feeds: dict[str, Any], quantized: bool = False) -> dict[str, np.ndarray]:
    """Run the reference interpreter once; `quantized=True` simulates the annotations."""
    from qcc.sim.interpreter import run_model

    return run_model(model, feeds, quantized=quantized)
