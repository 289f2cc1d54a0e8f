"""Target c: the generated C compiles strictly, runs under ASan/UBSan, and computes what it must.

Float models are compared with onnxruntime (max error <= 1e-4 of the output's largest
magnitude); fixed-point models must equal qcc.sim.fixed.run_fixed bit for bit.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from qcc.backends.c import BACKEND, generate

import qcc.driver
from qcc.errors import UnsupportedError
from qcc.ir.core import Graph, Model, Value
from qcc.ir.types import FixedPoint, TensorType
from qcc.plan import ArenaPlan, verify_arena
from qcc.plan.memory_plan import MemoryPlan
from qcc.sim.fixed import run_fixed
from qcc.sim.interpreter import run_model
from tests.fixed_models import annotate_fixed
from tests.onnx_zoo import ort_run, randomized_bytes

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
STRICT = ("-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-Wvla")
SANITIZE = ("-O2", "-fsanitize=address,undefined", "-fno-sanitize-recover=all")

HARNESS = r"""
#include <stdio.h>
#include "NAME.h"
static float in[UP_IN_SIZE];
static float out[UP_OUT_SIZE];
static NAME_arena_t arena[(UP_ARENA_SIZE + sizeof(NAME_arena_t) - 1) / sizeof(NAME_arena_t)];
int main(void)
{
    unsigned long k = 0;
    while (fread(in, sizeof(float), UP_IN_SIZE, stdin) == UP_IN_SIZE) {
        /* alternate the static and the caller's arena: no state may survive a call */
        int rc = (k++ % 2) ? NAME_run(in, out) : NAME_run_with_arena(in, out, arena);
        if (rc != UP_OK) {
            return 3;
        }
        fwrite(out, sizeof(float), UP_OUT_SIZE, stdout);
    }
    if (UP_ARENA_ALIGN > 1 && NAME_run_with_arena(in, out, (unsigned char *)arena + 1) != UP_ERR_ARENA) {
        return 4;
    }
    return NAME_run_with_arena(in, out, NULL) == UP_ERR_ARENA ? 0 : 5;
}
"""


def build(model: Model, directory: Path, sanitize: bool = True) -> Path:
    """Write the model with target c and compile the batch harness against its API."""
    BACKEND.write(model, directory)
    name = directory.name
    (directory / "harness.c").write_text(HARNESS.replace("NAME", name).replace("UP", name.upper()))
    flags = [*STRICT, *(SANITIZE if sanitize else ("-O2",))]
    exe = directory / "harness"
    proc = subprocess.run(["gcc", *flags, "-o", str(exe), str(directory / "harness.c"), str(directory / f"{name}.c"),
                           "-lm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def run_c(exe: Path, batch: np.ndarray, out_size: int) -> np.ndarray:
    proc = subprocess.run([str(exe)], input=np.ascontiguousarray(batch, dtype="<f4").tobytes(), capture_output=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    return np.frombuffer(proc.stdout, dtype="<f4").reshape(len(batch), out_size)


def outputs_of(model: Model, feeds: dict[str, np.ndarray], fixed: bool) -> np.ndarray:
    """Reference outputs per sample, concatenated as the C code writes them."""
    results = run_fixed(model, feeds) if fixed else run_model(model, feeds)
    n = len(next(iter(feeds.values())))
    return np.concatenate([results[v.name].reshape(n, -1) for v in model.graph.outputs], axis=1)


def assert_close_to(reference: np.ndarray, got: np.ndarray) -> None:
    scale = float(np.max(np.abs(reference)))
    assert np.max(np.abs(got - reference)) <= 1e-4 * scale, (np.max(np.abs(got - reference)), scale)


# ---------------------------------------------------------------- digits CNN


def test_digits_float_matches_onnxruntime(tmp_path: Path) -> None:
    model, _ = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), tmp_path / "digits_f32")
    exe = build(model, tmp_path / "digits_f32")
    x = np.load(DIGITS / "test.npz")["x"][:64]
    got = run_c(exe, x, 10)
    (ref,) = ort_run(str(DIGITS / "digits_cnn.onnx"), {"x": x})
    assert_close_to(ref, got)
    assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("scheme", ["fixed16", "fixed8", "fixed8-16"])
def test_digits_fixed_point_is_bit_exact(tmp_path: Path, scheme: str) -> None:
    out = tmp_path / "digits_q"
    model, _ = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out, quantize=scheme,
                                  calib=str(DIGITS / "calib.npz"))
    source = (out / "digits_q.c").read_text()
    act_bits = 8 if scheme == "fixed8" else 16
    # nnb rules: one type per conv (kernel names may add the sum width and what the epilogue fused)
    assert re.search(rf"qcc_conv_i{act_bits}_i{act_bits}_i{act_bits}(_\w+)?\(", source)
    exe = build(model, out)
    data = np.load(DIGITS / "test.npz")
    got = run_c(exe, data["x"], 10)
    want = outputs_of(model, {"x": data["x"]}, fixed=True)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    accuracy = float(np.mean(got.argmax(1) == data["labels"]))
    assert accuracy > 0.9, accuracy


def test_quantized_run_model_dispatches_to_the_integer_kernels() -> None:
    model = qcc.driver.load(str(DIGITS / "digits_cnn.onnx"))
    x = np.load(DIGITS / "test.npz")["x"][:16]
    annotate_fixed(model, {"x": x}, 8)
    exact = run_fixed(model, {"x": x})["logits"]
    assert np.array_equal(run_model(model, {"x": x}, quantized=True)["logits"], exact)
    # the fake-quantizing interpreter rounds where the runtime truncates: it must differ somewhere
    from qcc.sim.interpreter import Interpreter

    assert not np.array_equal(Interpreter(model, quantized=True).run({"x": x})["logits"], exact)


# ---------------------------------------------------------------- op coverage


def coverage_model(fixed_only: bool) -> Model:
    """Every op target c lowers (fixed_only: those with bit-exact integer kernels)."""
    rng = np.random.default_rng(7)
    g = Graph("coverage")
    x = g.add_input("x", TensorType("float32", ("N", 4, 9, 9)))

    def const(name: str, *shape: int, scale: float = 0.4) -> Value:
        return g.add_constant(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    c1 = g.add("Conv", x, const("w1", 8, 4, 3, 3), const("b1", 8), name="conv", pads=[1, 0, 2, 1], strides=[2, 1])
    bn = g.add("BatchNorm", c1, *(g.add_constant(f"bn_{k}", rng.uniform(0.5, 1.5, 8).astype(np.float32))
                                  for k in ("scale", "bias", "mean", "var")), name="bn")
    r = g.add("Relu", bn, name="relu")
    dw = g.add("Conv", r, const("w2", 8, 1, 3, 3), const("b2", 8), name="depthwise", group=8, pads=[1, 1, 1, 1])
    gc = g.add("Conv", dw, const("w3", 8, 4, 3, 3), name="grouped", group=2, dilations=[2, 1], pads=[2, 1, 2, 1])
    lk = g.add("LeakyRelu", gc, name="leaky", alpha=0.1)
    mp = g.add("MaxPool", lk, name="maxpool", kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=True)
    ap = g.add("AvgPool", lk, name="avgpool", kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 2],
               count_include_pad=True)
    ap2 = g.add("AvgPool", lk, name="avgpool_x", kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=True)
    s = g.add("Add", mp, ap, name="add")
    d = g.add("Sub", s, ap2, name="sub")
    m = g.add("Mul", d, mp, name="mul")
    bc = g.add("Add", m, const("bias_c", 1, 8, 1, 1), name="add_bcast")
    cat = g.add("Concat", bc, s, name="concat", axis=1)
    sg = g.add("Sigmoid", cat, name="sigmoid")
    th = g.add("Tanh", cat, name="tanh")
    cl = g.add("Clip", th, name="clip", min=-0.5, max=0.6)
    tr = g.add("Transpose", sg, name="transpose", perm=[0, 2, 3, 1])
    gap = g.add("GlobalAvgPool", cl, name="gap")
    gmp = g.add("GlobalMaxPool", cl, name="gmp")
    both = g.add("Concat", gap, gmp, name="concat2", axis=1)
    fl = g.add("Flatten", both, name="flatten")
    fc = g.add("Dense", fl, const("wfc", 32, 10), const("bfc", 10), name="fc")
    sm = g.add("Softmax", fc, name="softmax", axis=-1)
    rs = g.add("Reshape", tr, name="reshape", shape=[0, -1])
    outputs = [sm, fc, rs]
    if not fixed_only:
        lrn = g.add("LRN", cat, name="lrn", size=3, alpha=0.01, beta=0.75, bias=1.0)
        hs = g.add("HardSigmoid", lrn, name="hardsigmoid")
        hw = g.add("HardSwish", hs, name="hardswish")
        dv = g.add("Div", hw, g.add("Abs", lrn, name="abs"), name="div")
        mx = g.add("Max", dv, g.add("Exp", hw, name="exp"), name="max")
        hi = g.add("Clip", mx, name="clip_hi", max=1.5)  # one-sided: the other bound is HUGE_VALF
        outputs.append(g.add("Silu", g.add("Min", hi, g.add("Neg", lrn, name="neg"), name="min"), name="silu"))
    g.outputs = outputs
    return Model(g)


def _out_size(model: Model) -> int:
    return sum(int(np.prod([d if isinstance(d, int) else 1 for d in v.type.shape])) for v in model.graph.outputs)


def test_float_coverage_matches_onnxruntime(tmp_path: Path) -> None:
    from qcc.formats.onnx_export import to_onnx

    model = coverage_model(fixed_only=False)
    exe = build(model, tmp_path / "cov_f32")
    x = np.random.default_rng(0).standard_normal((6, 4, 9, 9)).astype(np.float32)
    got = run_c(exe, x, _out_size(model))
    proto = to_onnx(model).SerializeToString()
    ref = ort_run(proto, {"x": x})
    offset = 0
    for array in ref:
        width = int(np.prod(array.shape[1:]))
        assert_close_to(array.reshape(len(x), -1), got[:, offset:offset + width])
        offset += width


@pytest.mark.parametrize(("bits", "w_bits", "jitter"), [(16, 16, 2), (8, 8, 1), (16, 8, 3)])
def test_fixed_coverage_is_bit_exact(tmp_path: Path, bits: int, w_bits: int, jitter: int) -> None:
    model = coverage_model(fixed_only=True)
    rng = np.random.default_rng(bits + jitter)
    calib = {"x": rng.standard_normal((8, 4, 9, 9)).astype(np.float32)}
    annotate_fixed(model, calib, bits, w_bits, jitter=jitter, seed=bits)
    # positions that make Add/Sub align, pools and Relu rescale both ways, Concat requantize
    for node in model.graph.nodes:
        out = node.outputs[0]
        if node.op in ("MaxPool", "Relu", "Transpose") and isinstance(out.quant, FixedPoint):
            out.quant = FixedPoint(bits, out.quant.frac + int(rng.integers(-1, 2)))
        if node.name == "depthwise":  # fy > fx + fw: the rescale multiplies (nnb never emits this)
            fx, fw = node.input(0).quant, node.input(1).quant
            assert isinstance(fx, FixedPoint) and isinstance(fw, FixedPoint)
            out.quant = FixedPoint(bits, fx.frac + fw.frac + 1)
    exe = build(model, tmp_path / "cov_fixed")
    x = rng.standard_normal((40, 4, 9, 9)).astype(np.float32) * 1.5  # some saturation
    got = run_c(exe, x, _out_size(model))
    want = outputs_of(model, {"x": x}, fixed=True)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_runtime_saturation_quirks_and_two_inputs(tmp_path: Path) -> None:
    """nnabla-c-runtime's saturating add returns 0 for MIN + MIN and MIN for 0 - MIN."""
    g = Graph('quirks */ "??/')  # hostile names must not break comments or strings
    a = g.add_input('a */ "??/', TensorType("float32", (1, 4)))
    b = g.add_input("b\n\\", TensorType("float32", (1, 4)))
    g.outputs = [g.add("Add", a, b, name="sum */ ??="), g.add("Sub", a, b, name="diff")]
    model = Model(g)
    for value in [a, b, *g.outputs]:
        value.quant = FixedPoint(8, 4)
    feeds = {a.name: np.array([[-100.0, 0.0, 7.0, -8.0]], np.float32),
             b.name: np.array([[-100.0, -100.0, 7.0, 0.5]], np.float32)}
    want = outputs_of(model, feeds, fixed=True)
    assert want[0].tolist() == [0.0, -8.0, 7.9375, -7.5, 0.0, -8.0, 0.0, -8.0]
    exe = build(model, tmp_path / "quirks")
    got = run_c(exe, np.concatenate([feeds[a.name], feeds[b.name]], axis=1), 8)
    assert np.array_equal(got, want)


def test_generated_code_has_no_heap_vla_or_recursion(tmp_path: Path) -> None:
    model = coverage_model(fixed_only=False)
    BACKEND.write(model, tmp_path / "net")
    assert_no_heap_vla_or_recursion(tmp_path / "net" / "net.c")


def assert_no_heap_vla_or_recursion(c_file: Path) -> None:
    source = c_file.read_text()
    assert not re.search(r"\b(malloc|calloc|realloc|free|alloca)\s*\(", source)
    bodies = dict(re.findall(r"^static \w+ (qcc_\w+)\(.*?\)\n\{(.*?)^\}", source, re.S | re.M))
    assert len(bodies) > 10
    calls = {fn: set(re.findall(r"\b(qcc_\w+)\(", body)) & set(bodies) for fn, body in bodies.items()}
    for fn in calls:  # no function reaches itself through the call graph
        seen, todo = set(), list(calls[fn])
        while todo:
            callee = todo.pop()
            assert callee != fn, f"{fn} is recursive"
            if callee not in seen:
                seen.add(callee)
                todo += calls[callee]
    # -Wvla turns any variable-length array into an error; -c is enough to prove it
    proc = subprocess.run(["gcc", *STRICT, "-c", "-o", str(c_file.with_suffix(".o")), str(c_file)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- arena plan


def test_arena_follows_the_plan_and_honours_views_and_in_place() -> None:
    model = coverage_model(fixed_only=True)
    gen = generate(model, "net")
    lay = gen.layout
    assert not verify_arena(list(lay.buffers), lay.plan)
    graph = model.graph
    by_name = {n.name: n for n in graph.nodes}
    flat = by_name["flatten"].outputs[0]
    assert lay.roots[id(flat)] is by_name["concat2"].outputs[0]  # a view owns no storage
    relu = by_name["relu"].outputs[0]
    assert lay.roots[id(relu)] is by_name["conv"].outputs[0]  # Relu runs in place on the dying BN/conv
    assert gen.files["net.h"].count(f"#define NET_ARENA_SIZE {lay.plan.total} ") == 1
    assert lay.plan.total <= lay.naive
    # a plan from the memory_plan product is used when valid for these buffers ...
    offsets, top = {}, 0
    for b in lay.buffers:
        offsets[b.name], top = top, top + -(-b.size // 4) * 4
    model.products.put(ArenaPlan(offsets, top, 0, "naive", False, 4))
    gen2 = generate(model, "net")
    assert gen2.layout.source == "memory_plan" and gen2.arena_bytes == top
    # ... and ignored when it overlaps live tensors
    model.products.put(ArenaPlan({b.name: 0 for b in lay.buffers}, 4, 0, "broken", False, 4))
    assert generate(model, "net").layout.source == "qcc.plan.plan_arena"


@pytest.mark.parametrize("options", ["kind=arena", "kind=both,aliases=true,inplace=true,alignment=4"])
def test_plan_memory_offsets_are_used(tmp_path: Path, options: str) -> None:
    """With plan-memory in the pipeline the arena is its plan (views it did not alias are copied)."""
    spec = ("fold-bn,calibrate,assign-fixed-point{bits=16,weight_bits=16,rules=nnabla-c-runtime},"
            f"plan-memory{{{options}}}")
    out = tmp_path / "planned"
    model, _ = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out, passes=spec, calib=str(DIGITS / "calib.npz"))
    gen = generate(model, "planned")
    stored = model.products[MemoryPlan]
    assert gen.layout.source == "memory_plan"
    assert gen.arena_bytes == stored.arena.total
    for value in [*model.graph.inputs, *(v for n in model.graph.nodes for v in n.outputs)]:
        assert gen.layout.offset(value) == stored.offset_of(value.name)
    assert ("a copy, the memory plan gave it its own buffer" in gen.files["planned.c"]) == ("aliases" not in options)
    exe = build(model, out)
    x = np.load(DIGITS / "test.npz")["x"][:50]
    assert np.array_equal(run_c(exe, x, 10), outputs_of(model, {"x": x}, fixed=True))


# ---------------------------------------------------------------- light zoo model at full size


def test_squeezenet_float_matches_onnxruntime(tmp_path: Path) -> None:
    data = randomized_bytes("squeezenet")
    src = tmp_path / "squeezenet.onnx"
    src.write_bytes(data)
    model, _ = qcc.driver.compile(str(src), tmp_path / "squeeze")
    exe = build(model, tmp_path / "squeeze", sanitize=False)
    x = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)
    got = run_c(exe, x, 1000)
    ref = np.concatenate([ort_run(data, {model.graph.inputs[0].name: x[i:i + 1]})[0].reshape(1, -1)
                          for i in range(len(x))])
    assert_close_to(ref, got)


def quantized_squeezenet(tmp_path: Path, out: Path, scheme: str) -> tuple[Path, str, Model, np.random.Generator]:
    """light SqueezeNet compiled with 4 random calibration samples; its logits added as an output
    (the softmax alone saturates). Returns the source file, input name, model and the rng."""
    src = tmp_path / "squeezenet.onnx"
    src.write_bytes(randomized_bytes("squeezenet"))
    rng = np.random.default_rng(2)
    name = qcc.driver.load(str(src)).graph.inputs[0].name
    np.savez(tmp_path / "calib.npz", **{name: rng.standard_normal((4, 3, 224, 224)).astype(np.float32)})
    model, _ = qcc.driver.compile(str(src), out, quantize=scheme, calib=str(tmp_path / "calib.npz"))
    softmax = next(n for n in model.graph.nodes if n.op == "Softmax")
    model.graph.outputs.append(softmax.input(0))
    return src, name, model, rng


def test_squeezenet_fixed8_is_bit_exact(tmp_path: Path) -> None:
    _, name, model, rng = quantized_squeezenet(tmp_path, tmp_path / "first", "fixed8")
    exe = build(model, tmp_path / "squeeze8", sanitize=False)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    got = run_c(exe, x, 2000)
    want = outputs_of(model, {name: x}, fixed=True)
    assert len(np.unique(want[0, 1000:])) > 10
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------- errors and CLI


def test_unsupported_op_fails_before_writing(tmp_path: Path) -> None:
    g = Graph("bad")
    x = g.add_input("x", TensorType("float32", (1, 4)))
    g.outputs = [g.add("LogSoftmax", g.add("Relu", x, name="r"), name="log_it")]
    out = tmp_path / "bad"
    with pytest.raises(UnsupportedError, match=r"LogSoftmax \(node 'log_it'\)"):
        BACKEND.write(Model(g), out)
    assert not out.exists()


def test_mixed_models_are_rejected_with_the_tensor_name(tmp_path: Path) -> None:
    model = qcc.driver.load(str(DIGITS / "digits_cnn.onnx"))
    annotate_fixed(model, {"x": np.load(DIGITS / "calib.npz")["x"][:8]}, 16)
    model.graph.node_map()["relu2"].outputs[0].quant = None
    with pytest.raises(UnsupportedError, match=r"'relu2'.*fixed point"):
        generate(model, "m")


def make_and_run(out: Path, make_arg: str) -> np.ndarray:
    """`make` in a generated directory, then `./model in.bin out.bin` on the first digits test
    sample (written to in.bin); that sample."""
    make = subprocess.run(["make", "-s", "-C", str(out), make_arg], capture_output=True, text=True)
    assert make.returncode == 0, make.stderr
    x = np.load(DIGITS / "test.npz")["x"][:1]
    x.astype("<f4").tofile(out / "in.bin")
    run = subprocess.run([str(out / "model"), str(out / "in.bin"), str(out / "out.bin")], capture_output=True)
    assert run.returncode == 0, run.stderr
    return x


def test_cli_directory_output_selects_c_and_make_builds(tmp_path: Path) -> None:
    from tests.cli_util import qcc as run_qcc

    out = tmp_path / "digits_cli"
    proc = run_qcc("compile", str(DIGITS / "digits_cnn.onnx"), "-o", str(out), "--quantize", "fixed16",
               "--calib", str(DIGITS / "calib.npz"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [".qcc-output", "Makefile", "digits_cli.c", "digits_cli.h", "main.c"]
    x = make_and_run(out, "CFLAGS=" + " ".join((*STRICT, "-O2")))
    bad = subprocess.run([str(out / "model"), str(out / "out.bin"), str(out / "x.bin")], capture_output=True)
    assert bad.returncode == 1 and b"expected exactly 64 float32 values" in bad.stderr
    model, _ = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), tmp_path / "again", quantize="fixed16",
                                  calib=str(DIGITS / "calib.npz"))
    want = run_fixed(model, {"x": x})["logits"].reshape(-1)
    assert np.array_equal(np.fromfile(out / "out.bin", dtype="<f4"), want)
