"""`qcc run` and `qcc eval`: any model qcc reads or writes, run in its runtime.

A path is opened by the target that writes its kind of file (`Backend.runtime`: .onnx in
onnxruntime, .nnb in nnablart or its emulation, a target-c directory as the gcc-built binary,
.nnp in nnabla); what no target writes (.pt2) runs in qcc's simulator. `qcc eval` measures top-1
accuracy (with `labels`) and, against `--reference` (the float source), top-1 agreement, output
SQNR and a layer-by-layer table: every tensor both runtimes can show, matched by name
(onnxruntime.quantization.qdq_loss_debug matches a QDQ model to its float model the same way;
qcc's QDQ writer gives each DequantizeLinear output the name of the float tensor it stands for).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from qcc.errors import InvalidInputError, UnsupportedError, UsageError
from qcc.runtimes.base import Runtime
from qcc.sim.compare import sqnr_db

RUN_BATCH = 32


def open_runtime(path: str | os.PathLike[str], network: str | None = None) -> Runtime:
    """The runtime for a model file or a target-c directory (see the module doc)."""
    from qcc.plugins import backend_for
    from qcc.target import as_backend

    text = os.fspath(path)
    if not os.path.exists(text):
        raise UsageError(f"{text}: no such file or directory")
    if network is not None and not text.lower().endswith((".nnp", ".nntxt")):
        raise UsageError(f"--network applies to .nnp models; {text} is not one")
    backend = None
    if os.path.isdir(text):  # the target that writes directories (c)
        from qcc.plugins import registry

        backend = next((b for b in (as_backend(registry().backend(n)) for n in registry().names("backend"))
                        if b.writes_directory), None)
    else:
        try:
            backend = as_backend(backend_for(text))
        except UsageError:
            pass  # no target writes this kind of file (.pt2): qcc's simulator runs it
        if backend is not None and backend.writes_directory:
            backend = None
    if backend is not None:
        if network is not None and backend.name == "nnp":
            from qcc.runtimes.nnabla import NnablaRuntime

            return NnablaRuntime(text, network)
        runtime = backend.runtime(text, backend.make_options(), None)
        if runtime is None:
            raise UnsupportedError(f"{text}: target {backend.name!r} has no runtime on this machine")
        return runtime
    from qcc.driver import load
    from qcc.runtimes.simulator import SimRuntime
    from qcc.target import is_quantized

    model = load(text)
    return SimRuntime(model, quantized=is_quantized(model), name=f"qcc simulator (no runtime runs {Path(text).suffix} "
                      "files here)")


def bind(runtime: Runtime, arrays: dict[str, np.ndarray], source: str) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Arrays by the runtime's input names (one array feeds a one-input model whatever its key)."""
    arrays = dict(arrays)
    labels = arrays.pop("labels", None)
    if len(arrays) == 1 and len(runtime.inputs) == 1:
        arrays = {runtime.inputs[0]: next(iter(arrays.values()))}
    missing = [n for n in runtime.inputs if n not in arrays]
    if missing:
        raise InvalidInputError(f"{source}: no array for model input(s) {missing} (file has {sorted(arrays)})")
    feeds = {n: np.asarray(arrays[n], np.float32) for n in runtime.inputs}
    count = {len(a) for a in feeds.values()}
    if len(count) > 1:
        raise InvalidInputError(f"{source}: arrays have different sample counts")
    if labels is not None and (labels.ndim != 1 or len(labels) != count.pop()):
        raise InvalidInputError(f"{source}: 'labels' must be a 1-D integer array with one label per sample")
    return feeds, labels


def batches(runtime: Runtime, feeds: dict[str, np.ndarray], source: str) -> Iterator[tuple[int, int]]:
    """(start, stop) per batch: the runtime's static batch, else RUN_BATCH."""
    count = len(next(iter(feeds.values()))) if feeds else 0
    size = runtime.batch or RUN_BATCH
    usable = count
    if runtime.batch:  # a static batch: whole batches only
        if count < size:
            raise InvalidInputError(f"{source}: {count} sample(s), but the model's batch dimension is {size}")
        usable = count - count % size
    for start in range(0, usable, size):
        yield start, start + size


def run_file(model: str, data: str, out: str, network: str | None = None, progress: bool = False) -> dict[str, Any]:
    """`qcc run`: every output for every sample, written to OUT.npz (atomically)."""
    import io

    from qcc.data import load_npz
    from qcc.io import atomic_write_bytes
    from qcc.progress import progress_bar

    arrays = load_npz(data)
    with open_runtime(model, network) as runtime:
        feeds, _ = bind(runtime, arrays, data)
        parts: dict[str, list[np.ndarray]] = {}
        with progress_bar(len(next(iter(feeds.values()))), "run", progress) as bar:
            for start, stop in batches(runtime, feeds, data):
                for name, array in runtime.run({k: v[start:stop] for k, v in feeds.items()}).items():
                    parts.setdefault(name, []).append(array)
                if bar:
                    bar(stop - start)
        name = runtime.name
    outputs = {k: np.concatenate(v) for k, v in parts.items()}
    buffer = io.BytesIO()
    np.savez(buffer, **outputs)
    atomic_write_bytes(out, buffer.getvalue())
    return {"model": model, "runtime": name, "outputs": {k: list(v.shape) for k, v in outputs.items()}}


def eval_file(model: str, data: str, reference: str | None = None, network: str | None = None,
              progress: bool = False) -> dict[str, Any]:
    """`qcc eval`: accuracy, and against `reference` agreement, output SQNR and per-layer SQNR."""
    from qcc.data import load_npz
    from qcc.progress import progress_bar

    arrays = load_npz(data)
    result: dict[str, Any] = {"model": model, "data": data}
    with open_runtime(model, network) as runtime:
        feeds, labels = bind(runtime, arrays, data)
        ref = open_runtime(reference) if reference else None
        tally = _Tally()
        try:
            with progress_bar(len(next(iter(feeds.values()))), "eval", progress) as bar:
                size = max(runtime.batch or RUN_BATCH, 1)
                if ref is not None and ref.batch and ref.batch != size:
                    raise InvalidInputError(f"{reference}: its batch dimension {ref.batch} differs from {model}'s {size}")
                for start, stop in batches(runtime, feeds, data):
                    batch = {k: v[start:stop] for k, v in feeds.items()}
                    got = list(runtime.run(batch).values())
                    want = None
                    if ref is not None:
                        ref_batch = dict(zip(ref.inputs, batch.values()))
                        want = list(ref.run(ref_batch).values())
                        tally.layers(ref.tensors(ref_batch), runtime.tensors(batch))
                    tally.add(got, want, None if labels is None else labels[start:stop])
                    if bar:
                        bar(stop - start)
        finally:
            if ref is not None:
                ref.close()
        result["runtime"] = runtime.name
        if ref is not None:
            result["reference"] = {"model": reference, "runtime": ref.name}
    result.update(tally.summary(labels is not None, ref is not None))
    return result


class _Tally:
    def __init__(self) -> None:
        self.samples = 0
        self.correct = 0
        self.correct_ref = 0
        self.agree = 0
        self.signal = 0.0
        self.noise = 0.0
        self.layer_sums: dict[str, list[float]] = {}
        self.layer_shapes: dict[str, list[int]] = {}

    def add(self, got: list[np.ndarray], want: list[np.ndarray] | None, labels: np.ndarray | None) -> None:
        top = got[0].reshape(len(got[0]), -1).argmax(axis=-1)
        self.samples += len(top)
        if labels is not None:
            self.correct += int(np.count_nonzero(top == labels))
        if want is None:
            return
        ref_top = want[0].reshape(len(want[0]), -1).argmax(axis=-1)
        self.agree += int(np.count_nonzero(top == ref_top))
        if labels is not None:
            self.correct_ref += int(np.count_nonzero(ref_top == labels))
        for g, w in zip(got, want):
            r = w.astype(np.float64)
            d = g.astype(np.float64).reshape(r.shape) - r
            self.signal += float(np.vdot(r, r))
            self.noise += float(np.vdot(d, d))

    def layers(self, ref: dict[str, np.ndarray] | None, got: dict[str, np.ndarray] | None) -> None:
        if ref is None or got is None:
            return
        for name, array in got.items():
            want = ref.get(name)
            if want is None or want.shape != array.shape or array.dtype.kind != "f":
                continue
            r = want.astype(np.float64)
            d = array.astype(np.float64) - r
            sums = self.layer_sums.setdefault(name, [0.0, 0.0])
            sums[0] += float(np.vdot(r, r))
            sums[1] += float(np.vdot(d, d))
            self.layer_shapes[name] = list(array.shape[1:])

    def summary(self, labelled: bool, referenced: bool) -> dict[str, Any]:
        n = max(self.samples, 1)
        out: dict[str, Any] = {"samples": self.samples, "accuracy": self.correct / n if labelled else None}
        if referenced:
            out["reference_accuracy"] = self.correct_ref / n if labelled else None
            out["agreement"] = self.agree / n
            out["output_sqnr_db"] = _round(sqnr_db(self.signal, self.noise))
            out["layers"] = [{"tensor": name, "shape": self.layer_shapes[name], "sqnr_db": _round(sqnr_db(*sums))}
                             for name, sums in self.layer_sums.items()]
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def print_layer_table(layers: list[dict[str, Any]]) -> None:
    """Per-layer SQNR, names in full (docs/debugging.md explains the columns)."""
    if not layers:
        return
    width = max(len("tensor"), *(len(e["tensor"]) for e in layers))
    print(f"  {'tensor':<{width}}  {'SQNR dB':>8}  shape")
    for e in layers:
        db = "exact" if e["sqnr_db"] is None else f"{e['sqnr_db']:.1f}"
        print(f"  {e['tensor']:<{width}}  {db:>8}  {'x'.join(map(str, e['shape']))}")
