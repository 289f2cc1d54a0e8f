"""Float against quantized, tensor by tensor: SQNR matched by name, accuracy, agreement.

Used by the report (--eval) and the `sensitivity` pass. Runs stream over batches: only running
sums are kept (signal and noise power per tensor), never the activations of all samples, and
only the outputs' arg-max per sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import numpy as np

from qcc.ir.core import Model, Value
from qcc.ir.samples import count as samples_in
from qcc.ir.samples import to_model
from qcc.sim.engine import Runner, check_feeds
from qcc.sim.interpreter import Interpreter, runner_for


def sqnr_db(signal: float, noise: float) -> float | None:
    """10 log10(signal / noise); None when there is no noise at all (JSON has no infinity)."""
    if noise <= 0.0:
        return None
    if signal <= 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@attrs.define
class Comparison:
    """Running sums of a paired float/quantized run."""

    signal: dict[str, float] = attrs.field(factory=dict)
    noise: dict[str, float] = attrs.field(factory=dict)
    samples: int = 0
    correct_float: int = 0
    correct_quant: int = 0
    agree: int = 0
    labelled: bool = False
    outputs: tuple[str, ...] = ()

    def tensor_sqnr(self, name: str) -> float | None:
        return sqnr_db(self.signal.get(name, 0.0), self.noise.get(name, 0.0))

    @property
    def output_signal(self) -> float:
        return sum(self.signal.get(n, 0.0) for n in self.outputs)

    @property
    def output_noise(self) -> float:
        return sum(self.noise.get(n, 0.0) for n in self.outputs)

    def output_sqnr(self) -> float | None:
        return sqnr_db(self.output_signal, self.output_noise)

    def summary(self) -> dict[str, Any]:
        n = max(self.samples, 1)
        out = self.output_sqnr()
        return {
            "samples": self.samples,
            "float_accuracy": self.correct_float / n if self.labelled else None,
            "quantized_accuracy": self.correct_quant / n if self.labelled else None,
            "agreement": self.agree / n,
            "output_sqnr_db": None if out is None else round(out, 3),
        }


def _accumulate(cmp: Comparison, name: str, ref: np.ndarray, got: np.ndarray) -> None:
    r = ref.astype(np.float64, copy=False)
    d = got.astype(np.float64, copy=False) - r
    cmp.signal[name] = cmp.signal.get(name, 0.0) + float(np.vdot(r, r))
    cmp.noise[name] = cmp.noise.get(name, 0.0) + float(np.vdot(d, d))


def compare(reference: Model, quantized: Model, feeds: dict[str, np.ndarray], labels: np.ndarray | None = None,
            batch_size: int = 32, tensors: bool = True,
            make_interpreter: Callable[[Model, Any], Any] | None = None) -> Comparison:
    """Run `reference` in float and `quantized` with its annotations on the same batches.

    Tensors are matched by name (a name the reference lacks is skipped; a tensor only Relu reads
    is compared after the Relu, as its negative half never matters); top-1 uses the first
    graph output's last axis. `make_interpreter(model, observer)` replaces the quantized
    interpreter (sensitivity uses one that applies only some annotations).
    """
    feeds = check_feeds(reference, feeds, samples=True)
    count = len(next(iter(feeds.values()))) if feeds else 0
    batches = ((to_model(reference, {k: v[start:start + batch_size] for k, v in feeds.items()}),
                None if labels is None else labels[start:start + batch_size]) for start in range(0, count, batch_size))
    return compare_batches(reference, quantized, batches, labels is not None, tensors, make_interpreter)


BatchHook = Callable[[dict[str, np.ndarray], np.ndarray | None, dict[str, np.ndarray], dict[str, np.ndarray]], None]
"""on_batch(feeds, labels, float outputs, quantized outputs): a third party per batch (--eval's runtime)."""


def compare_batches(reference: Model, quantized: Model,
                    batches: Iterable[tuple[dict[str, np.ndarray], np.ndarray | None]], labelled: bool,
                    tensors: bool = True, make_interpreter: Callable[[Model, Any], Any] | None = None,
                    on_batch: BatchHook | None = None) -> Comparison:
    """`compare` over (feeds, labels) batches as they come (a stream is never held whole)."""
    outputs = tuple(v.name for v in quantized.graph.outputs)
    cmp = Comparison(labelled=labelled, outputs=outputs)
    float_arrays: dict[str, np.ndarray] = {}
    ref_names = {v.name for v in reference.graph.values()} if tensors else set(outputs)

    def keep(value: Value, array: np.ndarray) -> None:
        if value.name in ref_names:
            float_arrays[value.name] = array

    relu_read = relu_only_names(quantized)

    def match(value: Value, array: np.ndarray) -> None:
        ref = float_arrays.get(value.name)
        if ref is not None and ref.shape == array.shape and (tensors or value.name in outputs):
            if value.name in relu_read:  # only its positive part matters downstream
                ref, array = np.maximum(ref, 0), np.maximum(array, 0)
            _accumulate(cmp, value.name, ref, array)

    ref_interp = Interpreter(reference, observer=keep, kernels={"Quantize": passthrough})
    q_interp = (make_interpreter or quantized_runner)(quantized, match)
    first_out = reference.graph.outputs[0].name if reference.graph.outputs else None
    for batch, batch_labels in batches:
        float_arrays.clear()
        ref_out = ref_interp.run(batch)
        q_out = q_interp.run(batch)
        for name in outputs:  # outputs that are constants or inputs never reach the observer
            if name in ref_out and name in q_out and name not in float_arrays:
                _accumulate(cmp, name, ref_out[name], q_out[name])
        if first_out is not None and first_out in ref_out and first_out in q_out:
            _top1(cmp, ref_out[first_out], q_out[first_out], batch_labels)
        cmp.samples += samples_in(reference, batch)
        if on_batch is not None:
            on_batch(batch, batch_labels, ref_out, q_out)
    float_arrays.clear()
    return cmp


def relu_only_names(model: Model) -> set[str]:
    """Tensors read only by Relu (and not graph outputs): compared after that Relu."""
    outputs = {id(v) for v in model.graph.outputs}
    names = set()
    for node in model.graph.nodes:
        for v in node.outputs:
            users = v.consumers()
            if users and all(u.op == "Relu" for u in users) and id(v) not in outputs:
                names.add(v.name)
    return names


def passthrough(node: Any, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Quantize as identity: a float run of a model that has annotated Quantize nodes."""
    return [xs[0]]


def quantized_runner(model: Model, observer: Any = None) -> Runner:
    """What run_model(quantized=True) runs: the bit-exact integer kernels for an all-fixed-point
    model stored by truncation (qcc.sim.fixed), fake quantization otherwise."""
    return runner_for(model, quantized=True, observer=observer)


def _top1(cmp: Comparison, ref: np.ndarray, got: np.ndarray, labels: np.ndarray | None) -> None:
    if ref.ndim == 0:
        return
    a = ref.reshape(len(ref), -1).argmax(axis=-1) if ref.ndim > 2 else ref.argmax(axis=-1)
    b = got.reshape(len(got), -1).argmax(axis=-1) if got.ndim > 2 else got.argmax(axis=-1)
    cmp.agree += int(np.count_nonzero(a == b))
    if labels is not None:
        cmp.correct_float += int(np.count_nonzero(a == labels))
        cmp.correct_quant += int(np.count_nonzero(b == labels))
