"""--eval: the written artifact measured in its runtime, and qcc's simulator of the same model.

One pass over the data (batch by batch, a stream never held whole) runs three things on each
batch: the float source model (qcc's interpreter), qcc's simulator of the compiled model (the
integer kernels where the target computes in integers), and the file that was written, in the
runtime its target declares (`Backend.runtime`: onnxruntime, the gcc-built binary, nnablart or
its emulation, nnabla). The report's `eval` section says which runtime measured what:

- `float_accuracy`, `quantized_accuracy`, `agreement`, `output_sqnr_db`: qcc's simulator against
  the float model (what the passes chose), with `arithmetic` naming the simulator;
- `runtime`: the written file in `runtime.name`: `accuracy`, `agreement_with_float`,
  `agreement_with_simulator` (top-1), `sqnr_vs_simulator_db` (the runtime's outputs against the
  simulator's), `sqnr_vs_float_db`, and the `tolerance` its runtime declares. A difference beyond
  the tolerance is a warning line (report `warnings`).

Per tensor, the simulator's SQNR against the float model goes into each tensor's `eval_sqnr_db`.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from qcc.ir.core import Model, Value
from qcc.runtimes.base import Runtime, bind_by_position
from qcc.sim.compare import compare_batches, sqnr_db

EVAL_BATCH = 32


@attrs.define
class RuntimeTally:
    """Running sums of the runtime's outputs against the simulator's and the float model's."""

    samples: int = 0
    correct: int = 0
    agree_float: int = 0
    agree_sim: int = 0
    signal: float = 0.0
    noise_sim: float = 0.0
    signal_float: float = 0.0
    noise_float: float = 0.0

    def add(self, got: dict[str, np.ndarray], sim: dict[str, np.ndarray], ref: dict[str, np.ndarray],
            labels: np.ndarray | None) -> None:
        for name in sim:
            r, s = ref[name].astype(np.float64), sim[name].astype(np.float64)
            g = got[name].astype(np.float64).reshape(s.shape)
            self.signal += float(np.vdot(s, s))
            self.noise_sim += float(np.vdot(g - s, g - s))
            self.signal_float += float(np.vdot(r, r))
            self.noise_float += float(np.vdot(g - r, g - r))
        first = next(iter(sim))
        top = _top1(got[first].reshape(sim[first].shape))
        self.agree_sim += int(np.count_nonzero(top == _top1(sim[first])))
        self.agree_float += int(np.count_nonzero(top == _top1(ref[first])))
        if labels is not None:
            self.correct += int(np.count_nonzero(top == labels))
        self.samples += len(top)


def _top1(a: np.ndarray) -> np.ndarray:
    return a.reshape(len(a), -1).argmax(axis=-1)


def evaluate(reference: Model, compiled: Model, batches: Any, source: str, labelled: bool,
             integer_affine: bool = False, runtime: Runtime | None = None, progress: Any = None) -> dict[str, Any]:
    """The report's `eval` section (see the module doc); `batches` yields (feeds, labels)."""
    from qcc.ir.samples import count as samples_in
    from qcc.sim.affine_int import AffineRunner, is_affine_model

    integer = integer_affine and is_affine_model(compiled)
    runner = (lambda model, observer: AffineRunner(model, observer=observer)) if integer else None
    tally = RuntimeTally()
    outputs = [v.name for v in compiled.graph.outputs]

    seen_labels: list[bool] = []

    def on_batch(feeds: dict[str, np.ndarray], labels: np.ndarray | None, ref: dict[str, np.ndarray],
                 sim: dict[str, np.ndarray]) -> None:
        if labels is not None and not seen_labels:
            seen_labels.append(True)
        if runtime is not None:
            got = runtime.run(bind_by_position(runtime, feeds))
            tally.add(dict(zip(outputs, got.values())), {n: sim[n] for n in outputs}, ref, labels)
        if progress is not None:
            progress(samples_in(compiled, feeds))

    cmp = compare_batches(reference, compiled, batches, labelled, make_interpreter=runner, on_batch=on_batch)
    labelled = bool(seen_labels)  # a stream tells only as it is read
    cmp.labelled = labelled
    for value in compiled.graph.values():
        if value.name in cmp.noise:
            _report_of(value)["eval_sqnr_db"] = _rounded(cmp.tensor_sqnr(value.name))
    result = cmp.summary()
    result["data"] = source
    result["arithmetic"] = "integer affine (qcc.sim.affine_int)" if integer else "qcc.sim.run_model(quantized=True)"
    result["simulator"] = result["arithmetic"]
    if runtime is not None:
        result["runtime"] = runtime_section(runtime, tally, labelled)
    return result


def runtime_section(runtime: Runtime, tally: RuntimeTally, labelled: bool) -> dict[str, Any]:
    n = max(tally.samples, 1)
    tol = runtime.tolerance
    return {
        "name": runtime.name,
        "samples": tally.samples,
        "accuracy": tally.correct / n if labelled else None,
        "agreement_with_float": tally.agree_float / n,
        "agreement_with_simulator": tally.agree_sim / n,
        "sqnr_vs_simulator_db": _rounded(sqnr_db(tally.signal, tally.noise_sim)),
        "sqnr_vs_float_db": _rounded(sqnr_db(tally.signal_float, tally.noise_float)),
        "tolerance": {"min_sqnr_vs_simulator_db": tol.min_sqnr_db, "min_agreement_with_simulator": tol.min_agreement,
                      "why": tol.why},
    }


def disagreement(section: dict[str, Any]) -> str | None:
    """A warning line when the runtime is farther from the simulator than it declared."""
    rt = section.get("runtime")
    if not rt:
        return None
    tol = rt["tolerance"]
    sqnr, agree = rt["sqnr_vs_simulator_db"], rt["agreement_with_simulator"]
    exact = tol["min_sqnr_vs_simulator_db"] is None
    off_sqnr = (sqnr is not None) if exact else (sqnr is not None and sqnr < tol["min_sqnr_vs_simulator_db"])
    if not off_sqnr and agree >= tol["min_agreement_with_simulator"]:
        return None
    want = "bit-exact" if exact else f">= {tol['min_sqnr_vs_simulator_db']} dB"
    return (f"--eval: {rt['name']} differs from qcc's simulator beyond its tolerance: output SQNR "
            f"{'exact' if sqnr is None else f'{sqnr:.1f} dB'} (declared {want}), top-1 agreement {agree:.4f} "
            f"(declared >= {tol['min_agreement_with_simulator']}); {tol['why']}")


def _report_of(value: Value) -> dict[str, Any]:
    entry: dict[str, Any] = value.meta.setdefault("report", {})
    return entry


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def check_eval_data(reference: Model, data: Any, source: str) -> None:
    """Arrays that cannot feed the model fail before anything is written (a stream is read once,
    when evaluated)."""
    from qcc.data import batching, bind_inputs

    if isinstance(data, dict):
        feeds, _ = bind_inputs(reference, data, source)
        batching(reference, len(next(iter(feeds.values()))) if feeds else 0, EVAL_BATCH, source, "--eval")


def eval_written(reference: Model, compiled: Model, data: Any, source: str, backend: Any, out: str, options: Any,
                 integer_affine: bool, progress: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The `eval` section for the file `backend` wrote to `out`, and its warning lines."""
    from qcc.data import DataStream, bound_batches
    from qcc.errors import QccError
    from qcc.progress import progress_bar

    warnings: list[str] = []
    runtime: Runtime | None = None
    reason = f"target {backend.name!r} declares no runtime"
    try:
        runtime = backend.runtime(out, options, compiled)
    except QccError as exc:
        reason = str(exc)
    if runtime is None:
        warnings.append(f"--eval: {out} was not run in a runtime ({reason}); only qcc's simulator measured it")
    total = None if isinstance(data, DataStream) else len(next(iter(data.values()))) if data else 0
    batch = (runtime.batch if runtime is not None and runtime.batch else None) or EVAL_BATCH
    with progress_bar(total, "eval", progress) as bar:
        try:
            batches = bound_batches(reference, data, source, batch, "--eval")
            labelled = isinstance(data, DataStream) or "labels" in data
            section = evaluate(reference, compiled, batches, source, labelled, integer_affine, runtime, bar)
        finally:
            if runtime is not None:
                runtime.close()
    section["measured_in"] = {"simulator": section["arithmetic"],
                              "written_file": runtime.name if runtime is not None else None}
    line = disagreement(section)
    if line:
        warnings.append(line)
    return section, warnings
