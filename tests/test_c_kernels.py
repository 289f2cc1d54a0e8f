"""Target c's blocked kernels: every code path bit-exact in the integer modes at any tiling and
instruction set, float within the error bound of its summations, fused epilogues, ARCH_FLAGS.

The kernels choose paths by geometry (panel or direct input rows, band or gather, dot products or
tiles, separable pooling or the window walk) and by the tiling macros (QCC_PB, QCC_KC, QCC_KCI,
QCC_OS, QCC_BAND, QCC_POOLW); tiny tiles force every split, every edge and every fallback. The
oracles are qcc.sim.fixed / qcc.sim.affine_int (bit for bit) and a float64 convolution (float).
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qcc.backends.c import BACKEND
from qcc.backends.c.emit import generate

import qcc.driver
from qcc.ir.core import Graph, Model, Value
from qcc.ir.ops.nn import conv2d
from qcc.ir.types import TensorType
from qcc.plan import ArenaPlan
from qcc.pm import PassContext, PassManager, build_passes
from qcc.sim.affine_int import run_affine_int
from qcc.sim.fixed import run_fixed
from qcc.sim.interpreter import run_model
from tests.fixed_models import annotate_fixed
from tests.test_backend_c import HARNESS, STRICT, make_and_run, run_c

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
TINY = ("-DQCC_PB=2", "-DQCC_KC=16", "-DQCC_KCI=16", "-DQCC_OS=8", "-DQCC_BAND=600", "-DQCC_POOLW=4", "-DQCC_K4=8",
        "-DQCC_OS4=16")
"""Tiles so small that every panel is split, every superblock and k-block has a remainder, the
uint8 column band covers a row in chunks (long_sum: 8 of 13 positions) or not at all (the other
layers gather their taps), the pooling row buffers fall back to their window walks and isa=dot8's
broadcast tiles split their taps (QCC_K4=8: a tap's input channels across panels) and keep 16 output
channels at a time."""
SANITIZE = ("-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all")


def scaled_constants(g: Graph, rng: np.random.Generator) -> Callable[..., Value]:
    """Random float32 weights scaled by 1/sqrt(fan-in), added to `g` as constants (test models)."""

    def const(name: str, *shape: int) -> Value:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        return g.add_constant(name, (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))

    return const


def native_flags() -> tuple[str, ...]:
    """-O3 -march=native when gcc takes it here (the instruction set the bench measures)."""
    probe = subprocess.run(["gcc", "-march=native", "-E", "-x", "c", "-"], input="", capture_output=True, text=True)
    return ("-O3", "-march=native") if probe.returncode == 0 else ("-O3",)


def cpu_has_vnni() -> bool:
    """The CPU runs AVX512-VNNI code (Linux: /proc/cpuinfo's flags), so a -mavx512vnni build can run."""
    try:
        return "avx512_vnni" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


VNNI = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
"""The dot-product instruction whatever -march=native finds (vpdpbusd, vpdpwssd)."""
FLAGS = {"portable": ("-O3",), "native": native_flags(), "vnni": VNNI, "tiny-sanitized": (*SANITIZE, *TINY)}


def needs_flags(flags: str) -> None:
    if flags == "vnni" and not cpu_has_vnni():
        pytest.skip("this CPU has no AVX512-VNNI")


def kernel_model(width: int = 13) -> Model:
    """One layer per kernel path: 3x3 stride-1 (band / panel), strided and dilated (along x: gathered;
    along y: the column band), 1x1 (direct rows; grouped), depthwise, a long sum (dot products),
    Dense; Relu and BatchNorm after convs (fused epilogues); overlapping max and average pooling;
    the global ones."""
    rng = np.random.default_rng(11)
    g = Graph("kernels")
    x = g.add_input("x", TensorType("float32", ("N", 6, 11, width)))

    const = scaled_constants(g, rng)

    c1 = g.add("Conv", x, const("w1", 20, 6, 3, 3), const("b1", 20), name="c3x3", pads=[1, 1, 1, 1])
    r1 = g.add("Relu", c1, name="r1")
    c2 = g.add("Conv", r1, const("w2", 18, 20, 3, 3), const("b2", 18), name="strided", strides=[2, 2],
               pads=[0, 1, 1, 0], dilations=[1, 2])
    c2r = g.add("Conv", r1, const("w2r", 10, 20, 3, 2), const("b2r", 10), name="strided_rows", strides=[2, 2],
                pads=[2, 0, 1, 1], dilations=[2, 1])
    c3 = g.add("Conv", r1, const("w3", 20, 5, 1, 1), name="pw_grouped", group=4)
    c4 = g.add("Conv", c3, const("w4", 20, 1, 3, 3), const("b4", 20), name="depthwise", group=20, pads=[1, 1, 1, 1])
    c5 = g.add("Conv", c4, const("w5", 24, 20, 3, 3), const("b5", 24), name="long_sum", pads=[1, 1, 1, 1])
    r5 = g.add("Relu", c5, name="r5")
    c6 = g.add("Conv", r5, const("w6", 9, 24, 1, 1), const("b6", 9), name="pointwise")
    mp = g.add("MaxPool", r5, name="maxpool", kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=True)
    ap = g.add("AvgPool", r5, name="avgpool", kernel=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
               count_include_pad=False)
    gp = g.add("GlobalAvgPool", c6, name="gap")
    gm = g.add("GlobalMaxPool", c2, name="gmp")
    fc = g.add("Dense", g.add("Flatten", gp, name="flat"), const("wfc", 9, 7), const("bfc", 7), name="fc")
    g.outputs = [c2, c2r, c6, mp, ap, gm, fc]
    return Model(g)


def build(model: Model, directory: Path, flags: tuple[str, ...], isa: str = "portable", **options: Any) -> Path:
    """The batch harness with strict flags and `flags`; target options beside isa."""
    BACKEND.write(model, directory, BACKEND.make_options(isa=isa, **options))
    name = directory.name
    (directory / "harness.c").write_text(HARNESS.replace("NAME", name).replace("UP", name.upper()))
    exe = directory / "harness"
    proc = subprocess.run(["gcc", *STRICT, *flags, "-o", str(exe), str(directory / "harness.c"),
                           str(directory / f"{name}.c"), "-lm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def flat_outputs(model: Model, results: dict[str, np.ndarray], n: int) -> np.ndarray:
    return np.concatenate([results[v.name].reshape(n, -1) for v in model.graph.outputs], axis=1)


def out_size(model: Model) -> int:
    return sum(int(np.prod([d if isinstance(d, int) else 1 for d in v.type.shape])) for v in model.graph.outputs)


def affine(model: Model, calib: dict[str, np.ndarray], dtype: str, options: str = "") -> Model:
    ctx = PassContext()
    ctx.calib_data = calib
    return PassManager(build_passes(f"calibrate,quantize-affine{{dtype={dtype}{options}}}")).run(model, ctx).model


AFFINE_MODES = {"int8": ("int8", "", "portable"), "int8-dot8": ("int8", "", "dot8"), "uint8-dot8": ("uint8", "", "dot8"),
                "int8-asym-weights-dot8": ("int8", ",weight_symmetric=false", "dot8")}
"""The portable default takes int16 dot products; with isa=dot8, symmetric int8 weights take the
uint8 x int8 dot products (inputs offset to uint8), asymmetric weights, centered, need 9 bits:
the int16 dot products still."""


@pytest.mark.parametrize("flags", list(FLAGS))
@pytest.mark.parametrize("mode", ["fixed8", "fixed16", *AFFINE_MODES])
def test_every_kernel_path_is_bit_exact(tmp_path: Path, mode: str, flags: str) -> None:
    needs_flags(flags)
    rng = np.random.default_rng(len(mode) + len(flags))
    model = kernel_model()
    calib = {"x": rng.standard_normal((8, 6, 11, 13)).astype(np.float32)}
    if mode.startswith("fixed"):
        bits = int(mode[5:])
        annotate_fixed(model, calib, bits, bits, jitter=1, seed=bits)
    else:
        model = affine(model, calib, *AFFINE_MODES[mode][:2])
    source = tmp_path / "k" / "k.c"
    isa = AFFINE_MODES[mode][2] if mode in AFFINE_MODES else "portable"
    exe = build(model, tmp_path / "k", FLAGS[flags], isa)
    text = source.read_text()
    if mode in AFFINE_MODES:  # the dot products, band and gathered, and rows
        u8 = isa == "dot8" and "asym" not in mode
        if u8:  # convolutions on the broadcast tiles (intrinsics or C per FLAGS), Dense on a dot product
            assert "qcc_conv4_" in text and "qcc_dot4_u8_i8" in text and "qcc_dot_u8_" in text
            assert "qcc_convf_" not in text and "qcc_dwconv_" in text
        else:
            assert "qcc_dot_i16_" in text and "qcc_band_" in text and "qcc_conv4_" not in text
            assert "qcc_packr_" in text and "qcc_dwconv_" in text
            assert "qcc_convf_" in text  # few taps: integer sums computed exactly in float32
        assert "r = r < clo ? clo" in text  # the fused Relus' tables are clamps: max/min, no lookup
    x = rng.standard_normal((6, 6, 11, 13)).astype(np.float32) * 1.5
    got = run_c(exe, x, out_size(model))
    results = run_fixed(model, {"x": x}) if mode.startswith("fixed") else run_affine_int(model, {"x": x})
    want = flat_outputs(model, results, len(x))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("flags", ["portable", "tiny-sanitized"])
def test_tiles_inside_wide_rows_are_bit_exact(tmp_path: Path, flags: str) -> None:
    """Rows wider than a tile (37 > QCC_OB): tiles inside one row clip their taps at the row's
    edges (padding on the left, on the right, stride 1 and 2), where the 13-wide maps above cross
    rows and gather; the exact-float affine kernel shares the float kernels' panel."""
    rng = np.random.default_rng(37)
    model = affine(kernel_model(37), {"x": rng.standard_normal((8, 6, 11, 37)).astype(np.float32)}, "int8")
    exe = build(model, tmp_path / "w", FLAGS[flags])
    assert "qcc_convf_" in (tmp_path / "w" / "w.c").read_text()
    x = rng.standard_normal((2, 6, 11, 37)).astype(np.float32) * 1.5
    want = flat_outputs(model, run_affine_int(model, {"x": x}), len(x))
    assert np.array_equal(run_c(exe, x, out_size(model)).view(np.uint32), want.view(np.uint32))


DOT8_BUILDS = {"c-loop": ("-O3",), "c-loop-vnni-flags": (*VNNI, "-DQCC_NO_INTRINSICS"), "intrinsics": VNNI,
               "intrinsics-tiny-sanitized": (*SANITIZE, *TINY, *VNNI[1:])}
"""isa=dot8's broadcast tiles: the portable C loop (with and without the VNNI instruction set
allowed) and the vpdpbusd intrinsics (also with tiny panels, sanitized)."""


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("variant", list(DOT8_BUILDS))
def test_dot8_tiles_are_bit_exact_with_and_without_intrinsics(tmp_path: Path, variant: str, dtype: str) -> None:
    """Integer sums, exact in any order: the intrinsics and the C loop give the simulator's bits; rows
    wider than a tile (37) and maps that cross rows (the strided layers), input channels padded to 4."""
    if "vnni" in variant or "intrinsics" in variant:
        needs_flags("vnni")
    rng = np.random.default_rng(19)
    model = affine(kernel_model(37), {"x": rng.standard_normal((8, 6, 11, 37)).astype(np.float32)}, dtype)
    exe = build(model, tmp_path / "d", DOT8_BUILDS[variant], "dot8")
    text = (tmp_path / "d" / "d.c").read_text()
    assert text.count("static void qcc_conv4_") >= 1 and "_mm512_dpbusd_epi32" in text and "qcc_convf_" not in text
    x = rng.standard_normal((2, 6, 11, 37)).astype(np.float32) * 1.5
    want = flat_outputs(model, run_affine_int(model, {"x": x}), len(x))
    assert np.array_equal(run_c(exe, x, out_size(model)).view(np.uint32), want.view(np.uint32))


def dispatching_here() -> bool:
    """gcc on x86-64 Linux with glibc: where the portable build's kernels are multi-versioned."""
    return platform.machine() in ("x86_64", "AMD64") and sys.platform.startswith("linux") and \
        platform.libc_ver()[0] == "glibc"


@pytest.mark.parametrize("mode", ["float32", "int8", "int8-dot8", "fixed8"])
def test_dispatched_kernels_give_the_plain_builds_bytes(tmp_path: Path, mode: str) -> None:
    """The portable build's float convolution kernels (and the int16 dot products: no AVX-512) exist in
    AVX-512, AVX2 and baseline versions, the CPU's picked at load time; -DQCC_NO_DISPATCH builds the baseline alone. Same bytes either way: integer
    sums are exact, and float multiply-adds are fused in neither (QCC_MADD follows the whole build)."""
    rng = np.random.default_rng(23)
    model = kernel_model()
    calib = {"x": rng.standard_normal((8, 6, 11, 13)).astype(np.float32)}
    if mode == "fixed8":
        annotate_fixed(model, calib, 8, 8, jitter=1, seed=8)
    elif mode != "float32":
        model = affine(model, calib, "int8")
    isa = "dot8" if mode.endswith("dot8") else "portable"
    plain = build(model, tmp_path / "plain", ("-O3", "-DQCC_NO_DISPATCH"), isa)
    dispatched = build(model, tmp_path / "disp", ("-O3",), isa)
    assert re.search(r"^QCC_DISPATCH(256)? static void qcc_", (tmp_path / "disp" / "disp.c").read_text(), re.M)
    if dispatching_here():
        symbols = subprocess.run(["nm", str(dispatched)], capture_output=True, text=True).stdout
        assert ".avx2" in symbols and ".avx2" not in subprocess.run(["nm", str(plain)], capture_output=True,
                                                                      text=True).stdout
    x = rng.standard_normal((3, 6, 11, 13)).astype(np.float32) * 1.5
    got = run_c(dispatched, x, out_size(model))
    assert np.array_equal(got.view(np.uint32), run_c(plain, x, out_size(model)).view(np.uint32))


@pytest.mark.parametrize("flags", list(FLAGS))
def test_float_kernels_stay_within_the_bound_of_their_sums(tmp_path: Path, flags: str) -> None:
    """|c - exact| <= gamma_n * sum |x_i w_i| + |b| (n terms, gamma_n = n u / (1 - n u), u = 2^-24):
    Higham's bound for a float32 sum of products in any order, fused or not. The kernels reorder
    and fuse the sums, so this, not bit equality with another program, is what they promise."""
    needs_flags(flags)
    rng = np.random.default_rng(5)
    model = kernel_model()
    convs = [n for n in model.graph.nodes if n.op == "Conv"]
    model.graph.outputs = [n.outputs[0] for n in convs]  # Relu still reads c3x3 and long_sum: not fused
    x = rng.standard_normal((3, 6, 11, 13)).astype(np.float32)
    exe = build(model, tmp_path / "f", FLAGS[flags])
    assert_within_sum_bounds(model, x, run_c(exe, x, out_size(model)), flags)


def assert_within_sum_bounds(model: Model, x: np.ndarray, got: np.ndarray, label: str) -> None:
    """Every Conv output (the graph's outputs, in node order) within Higham's bound of its float32
    sum of products against a float64 convolution of what C computed for its input."""
    u = 2.0**-24
    offset = 0
    values: dict[int, np.ndarray] = {id(model.graph.inputs[0]): x.astype(np.float64)}
    for node in model.graph.nodes:
        inputs = [values.get(id(v)) if v is not None and v.const is None else
                  (v.const.astype(np.float64) if v is not None and v.const is not None else None)
                  for v in node.inputs]
        if node.op == "Conv":
            xin, w, b = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
            assert xin is not None and w is not None
            exact = conv2d(xin, w, b, node.attrs, accumulate=np.float64)
            magnitude = conv2d(np.abs(xin), np.abs(w), np.abs(b) if b is not None else None, node.attrs,
                               accumulate=np.float64)
            terms = int(np.prod(w.shape[1:])) + 1
            gamma = terms * u / (1 - terms * u)
            width = int(np.prod(exact.shape[1:]))
            mine = got[:, offset:offset + width].reshape(exact.shape).astype(np.float64)
            offset += width
            # the layer's own rounding, plus what its (already rounded) input carries from before
            assert np.all(np.abs(mine - exact) <= gamma * magnitude + 1e-30), (node.name, label)
            values[id(node.outputs[0])] = mine  # the next layer reads what C computed
        elif node.op == "Relu":
            values[id(node.outputs[0])] = np.maximum(inputs[0], 0)  # type: ignore[arg-type]


def cpu_has_avx512f() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def float_panel_model() -> Model:
    """Float convolutions for each AVX-512 panel path: 32x32 maps (channel planes 4 KB apart: the
    panel filled channel by channel; 180 taps in two chunks that split a tap), stride 2 (two masked
    loads and a permute; padding on one side), an 8x8 map (tiles across rows), a flattened 1x1 layer
    (whole tiles read in place), output channels of 20 and 17 (a 16-row block, then a short one)."""
    rng = np.random.default_rng(31)
    g = Graph("panels")
    x = g.add_input("x", TensorType("float32", ("N", 6, 32, 32)))

    const = scaled_constants(g, rng)

    c1 = g.add("Conv", x, const("w1", 20, 6, 3, 3), const("b1", 20), name="c1", pads=[1, 1, 1, 1])
    c2 = g.add("Conv", c1, const("w2", 24, 20, 3, 3), name="c2", pads=[1, 1, 1, 1])
    c3 = g.add("Conv", c2, const("w3", 18, 24, 3, 3), const("b3", 18), name="s2", strides=[2, 2], pads=[1, 0, 0, 1])
    c4 = g.add("Conv", c3, const("w4", 16, 18, 3, 3), name="s2b", strides=[2, 2], pads=[1, 1, 1, 1])
    c5 = g.add("Conv", c4, const("w5", 20, 16, 3, 3), const("b5", 20), name="rows8", pads=[1, 1, 1, 1])
    c6 = g.add("Conv", c2, const("w6", 17, 24, 1, 1), const("b6", 17), name="pw")
    g.outputs = [c1, c2, c3, c4, c5, c6]
    return Model(g)


def test_float_panel_paths_give_the_c_loops_bits(tmp_path: Path) -> None:
    """The float tiles' AVX-512 paths (masked-load panels, channel-by-channel fill, in-place 1x1
    tiles) give the bits of the C loops (-DQCC_NO_INTRINSICS -DQCC_FDIRECT=0), of tiny chunks,
    output-channel groups and tap groups, and of a sanitized build: the same terms summed in the
    same order, only copied differently; all within the bound of their sums. Without AVX-512 only
    the bound is checked."""
    model = float_panel_model()
    x = np.random.default_rng(32).standard_normal((2, 6, 32, 32)).astype(np.float32)
    size = out_size(model)
    default = build(model, tmp_path / "d", FLAGS["native"])
    got = run_c(default, x, size)
    assert_within_sum_bounds(model, x, got, "native")
    if not cpu_has_avx512f():
        pytest.skip("this CPU has no AVX-512F: the masked-load paths are not compiled")
    avx512 = ("-O3", "-mavx512f", "-mfma")
    masked = run_c(build(model, tmp_path / "m", avx512), x, size)
    assert_within_sum_bounds(model, x, masked, "avx512")
    for name, flags in (("loops", (*avx512, "-DQCC_NO_INTRINSICS", "-DQCC_FDIRECT=0")),
                        ("tiny", (*avx512, "-DQCC_KC=16", "-DQCC_OS=8", "-DQCC_PKT=2")),
                        ("rows8", (*avx512, "-DQCC_FPB=8", "-DQCC_FDIRECT=1", "-DQCC_KC=40")),
                        ("sanitized", (*SANITIZE, *avx512[1:], "-DQCC_KC=16", "-DQCC_PKT=2"))):
        other = run_c(build(model, tmp_path / name, flags), x, size)
        assert np.array_equal(masked.view(np.uint32), other.view(np.uint32)), name


def residual_model() -> Model:
    """Conv -> BatchNorm -> Add(an earlier Relu) -> Relu (fusable), Conv + Add(the graph input)
    (fusable), and an Add whose other operand is computed after its convolution (not fusable)."""
    rng = np.random.default_rng(19)
    g = Graph("residual")
    x = g.add_input("x", TensorType("float32", ("N", 8, 9, 20)))

    def const(name: str, *shape: int, low: float = -0.4, high: float = 0.4) -> Value:
        return g.add_constant(name, rng.uniform(low, high, shape).astype(np.float32))

    r1 = g.add("Relu", g.add("Conv", x, const("w1", 8, 8, 3, 3), const("b1", 8), name="c1", pads=[1, 1, 1, 1]),
               name="r1")
    c2 = g.add("Conv", r1, const("w2", 8, 8, 3, 3), name="c2", pads=[1, 1, 1, 1])
    bn = g.add("BatchNorm", c2, *(const(f"bn_{k}", 8, low=0.5, high=1.5) for k in "sbmv"), name="bn")
    r2 = g.add("Relu", g.add("Add", bn, r1, name="add"), name="r2")
    c3 = g.add("Conv", r2, const("w3", 8, 8, 1, 1), name="c3")
    late = g.add("Conv", r2, const("w4", 8, 8, 1, 1), name="late")
    add2 = g.add("Add", c3, late, name="add2")
    add3 = g.add("Add", g.add("Conv", x, const("w5", 8, 8, 1, 1), name="c5"), x, name="add3")
    g.outputs = [add2, add3]
    return Model(g)


@pytest.mark.parametrize("flags", ["portable", "tiny-sanitized"])
def test_residual_adds_are_computed_by_the_convolution(tmp_path: Path, flags: str) -> None:
    """A float Conv (-> BatchNorm) -> Add -> Relu is one kernel call when the Add's other operand
    exists before the convolution runs; the values are those of the separate kernels (a + b is
    b + a): within the float32 bound of the convolutions' sums (taps x 2^-24 x the sums' size,
    twice for the two layers in a row, with room for the BatchNorm's rounding)."""
    model = residual_model()
    exe = build(model, tmp_path / "res", FLAGS[flags])
    body = (tmp_path / "res" / "res.c").read_text().split("res_run_with_arena")[1]
    assert "qcc_conv_f32_bn_add_relu(" in body and "qcc_conv_f32_add(" in body
    assert body.count("qcc_add_f32(") == 1 and "add2 (Add) -> float32" in body  # `late` runs after c3
    x = np.random.default_rng(20).standard_normal((2, 8, 9, 20)).astype(np.float32)
    got = run_c(exe, x, out_size(model))
    want = flat_outputs(model, run_model(model, {"x": x}), len(x))
    size = np.abs(want).max()
    assert np.allclose(got, want, rtol=0, atol=4 * 2 * 72 * 2.0**-24 * 8 * size), np.abs(got - want).max()


def test_fused_epilogues_leave_no_separate_pass(tmp_path: Path) -> None:
    """Float Conv -> BatchNorm -> Relu is one kernel call; affine Conv -> Relu applies the Relu's
    table, a clamp, as max/min in the convolution's epilogue; fixed-point Conv -> Relu likewise. (A
    BatchNorm with a buffer of its own: test_kernels_write_concatenated_and_fused_values_in_place.)"""
    out = tmp_path / "d_f32"
    qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out)
    body = (out / "d_f32.c").read_text().split("d_f32_run_with_arena")[1]
    assert "qcc_conv_f32_bn_relu(" in body and "qcc_batchnorm" not in body
    assert "relu1 (Relu): computed by the kernel of bn1" in body
    for scheme, fused in (("int8", "_c("), ("fixed8", "_relu(")):
        out = tmp_path / f"d_{scheme}"
        qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out, quantize=scheme, calib=str(DIGITS / "calib.npz"))
        body = (out / f"d_{scheme}.c").read_text().split(f"d_{scheme}_run_with_arena")[1]
        assert fused in body and "relu1 (Relu): computed by the kernel of " in body


def test_makefile_takes_arch_flags_over_a_portable_default(tmp_path: Path) -> None:
    out = tmp_path / "mk"
    qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out, quantize="int8", calib=str(DIGITS / "calib.npz"))
    portable = subprocess.run(["make", "-n", "-C", str(out)], capture_output=True, text=True, check=True).stdout
    assert "-std=c99 -O3" in portable and "-march" not in portable and "-ffp-contract=off" in portable
    native = subprocess.run(["make", "-n", "-C", str(out), "ARCH_FLAGS=-O3 -march=native"], capture_output=True,
                            text=True, check=True).stdout
    assert "-O3 -march=native" in native
    x = make_and_run(out, f"ARCH_FLAGS={' '.join(native_flags())}")
    model, _ = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), tmp_path / "again", quantize="int8",
                                  calib=str(DIGITS / "calib.npz"))
    want = run_affine_int(model, {"x": x})["logits"].reshape(-1)
    assert np.array_equal(np.fromfile(out / "out.bin", dtype="<f4"), want)


def fire_model() -> Model:
    """Conv -> BatchNorm -> Relu, then a SqueezeNet fire module (two Conv -> Relu branches into a
    Concat): the memory plan gives the BatchNorm and the Concat buffers of their own."""
    rng = np.random.default_rng(3)
    g = Graph("fire")
    x = g.add_input("x", TensorType("float32", ("N", 3, 12, 12)))

    const = scaled_constants(g, rng)

    c0 = g.add("Conv", x, const("w0", 8, 3, 3, 3), const("b0", 8), name="c0", pads=[1, 1, 1, 1])
    bn = g.add("BatchNorm", c0, *(g.add_constant(f"bn_{k}", rng.uniform(0.5, 1.5, 8).astype(np.float32))
                                  for k in ("scale", "bias", "mean", "var")), name="bn")
    sq = g.add("Relu", g.add("Conv", g.add("Relu", bn, name="r0"), const("ws", 4, 8, 1, 1), const("bs", 4),
                             name="squeeze"), name="rs")
    e1 = g.add("Relu", g.add("Conv", sq, const("we1", 6, 4, 1, 1), const("be1", 6), name="e1"), name="re1")
    e3 = g.add("Relu", g.add("Conv", sq, const("we3", 6, 4, 3, 3), const("be3", 6), name="e3", pads=[1, 1, 1, 1]),
               name="re3")
    cat = g.add("Concat", e1, e3, name="cat", axis=1)
    g.outputs = [g.add("Conv", cat, const("wo", 5, 12, 1, 1), name="head")]
    return Model(g)


def test_kernels_write_concatenated_and_fused_values_in_place(tmp_path: Path) -> None:
    """Conv -> Relu branches write their slices of a float Concat, and a convolution whose fused
    BatchNorm got a buffer of its own writes there: no copy after them, unless something the kernel
    reads, or something live until the consumer runs, overlaps those bytes (then the copy stays).
    Outputs stay the float interpreter's (1e-4 of their largest magnitude: summation order)."""
    x = np.random.default_rng(4).standard_normal((3, 3, 12, 12)).astype(np.float32)
    model = fire_model()
    buffers = generate(model, "fire").layout.buffers
    ends = np.cumsum([0] + [-(-b.size // 64) * 64 for b in buffers])
    offsets = {b.name: int(e) for b, e in zip(buffers, ends)}
    apart = ArenaPlan(offsets, int(ends[-1]), 0, "apart", False, 64)
    # the Concat over the squeeze output (across both slices), which both branches read: e3 reads it
    # for the last time at the step that would write the second slice
    top = int(ends[-1])
    over = ArenaPlan({**offsets, "squeeze": top + 2304, "cat": top}, top + 6912, 0, "over", False, 64)
    for plan, in_place in ((over, 0), (apart, 2)):
        model = fire_model()
        model.products.put(plan)
        exe = build(model, tmp_path / f"fire{in_place}", FLAGS["tiny-sanitized"])
        body = (tmp_path / f"fire{in_place}" / f"fire{in_place}.c").read_text().split("_run_with_arena")[1]
        assert body.count("written in place by its producer") == in_place
        assert body.count("qcc_concat_f32_f32(") == 2 - in_place
        want = flat_outputs(model, run_model(model, {"x": x}), len(x))
        assert np.max(np.abs(run_c(exe, x, out_size(model)) - want)) <= 1e-4 * np.max(np.abs(want))
    out = tmp_path / "d_f32"
    # plan-memory: a BatchNorm (trait inplace) over its convolution's dying output, so the fused kernel
    # writes it where the plan put it, whatever buffer the convolution reads (bn1 was a copy before)
    digits, _ = qcc.driver.compile(str(DIGITS / "digits_cnn.onnx"), out)
    body = (out / "d_f32.c").read_text().split("d_f32_run_with_arena")[1]
    for k in (1, 2, 3):
        assert f"bn{k} (BatchNorm): computed by the kernel of conv{k} */" in body
    assert "a copy" not in body and "into its own buffer" not in body
    exe = build(digits, tmp_path / "d_san", FLAGS["tiny-sanitized"])
    xd = np.load(DIGITS / "test.npz")["x"][:20]
    want = flat_outputs(digits, run_model(digits, {"x": xd}), len(xd))
    assert np.max(np.abs(run_c(exe, xd, out_size(digits)) - want)) <= 1e-4 * np.max(np.abs(want))


def depthwise_model() -> Model:
    """Depthwise layers for both of the kernel's paths and a channel shuffle: 3x3 stride 2 on odd
    maps, 5x5 and 3x2 with asymmetric pads, a stride-2 window wider than the stride (all on the
    zero-padded phase planes unless -DQCC_DWPLANE says otherwise), a dilated one (rows only); the
    shuffle's Reshape-Transpose-Reshape and a Slice with axes of one element (merged walks)."""
    rng = np.random.default_rng(19)
    g = Graph("dw")
    x = g.add_input("x", TensorType("float32", ("N", 8, 13, 11)))

    def weights(name: str, *shape: int) -> Value:
        return g.add_constant(name, (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32))

    d1 = g.add("Conv", x, weights("w1", 8, 1, 3, 3), weights("b1", 8), name="dw_s2", group=8, strides=[2, 2],
               pads=[1, 1, 1, 1])
    d2 = g.add("Conv", x, weights("w2", 8, 1, 5, 5), name="dw_5x5", group=8, pads=[2, 1, 2, 3])
    d3 = g.add("Conv", d2, weights("w3", 8, 1, 3, 2), weights("b3", 8), name="dw_3x2_s2", group=8, strides=[2, 2],
               pads=[0, 1, 2, 0])
    d4 = g.add("Conv", x, weights("w4", 8, 1, 3, 3), name="dw_dilated", group=8, pads=[2, 2, 2, 2],
               dilations=[2, 2])
    view = g.add("Reshape", d2, name="groups", shape=[0, 2, 4, 13, 11])
    shuffled = g.add("Transpose", view, name="shuffle", perm=[0, 2, 1, 3, 4])
    merged = g.add("Reshape", shuffled, name="merged", shape=[0, 8, 13, 11])
    part = g.add("Slice", merged, starts=[3, 2], ends=[4, 11], axes=[1, 2], name="part")
    g.outputs = [d1, d3, d4, merged, part]
    return Model(g)


def test_walk_fields_merge_axes_in_reading_order() -> None:
    from qcc.backends.c.params import walk_fields

    pad = [0] * 4
    # a shuffle (1, 4, 2, 13, 9) read with the groups swapped: three walked axes, h*w contiguous
    assert walk_fields([1, 4, 2, 13, 9], [936, 117, 468, 9, 1]) == [3, [4, 2, 117, *pad[1:]], [117, 468, 1, *pad[1:]]]
    assert walk_fields([2, 1, 3], [3, 7, 1]) == [1, [6, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert walk_fields([1, 1], [5, 1]) == [1, [1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert walk_fields([3, 0, 2], [2, 2, 1])[:2] == [1, [0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("mode", ["float32", "int8-dot8", "fixed8"])
def test_depthwise_planes_and_merged_walks_give_the_row_paths_bits(tmp_path: Path, mode: str) -> None:
    """The phase-plane depthwise path gives the bits of the row path (-DQCC_DWPLANE=0) and of the
    simulators; float within the bound of its sums is test_float_kernels_...'s job, here the two
    paths of one build must agree to the bit (the same terms in the same order, +-0 aside)."""
    rng = np.random.default_rng(3)
    model = depthwise_model()
    calib = {"x": rng.standard_normal((8, 8, 13, 11)).astype(np.float32)}
    isa = "portable"
    if mode == "fixed8":
        annotate_fixed(model, calib, 8, 8, jitter=1, seed=8)
    elif mode != "float32":
        model, isa = affine(model, calib, "int8"), "dot8"
    x = rng.standard_normal((3, 8, 13, 11)).astype(np.float32) * 1.5
    plane = build(model, tmp_path / "p", ("-O3",), isa)
    text = (tmp_path / "p" / "p.c").read_text()
    assert "QCC_DWPLANE" in text and re.search(r"qcc_perm_t qcc_p_\w+ = \{3, \{4, 2, 143,", text)
    rows = build(model, tmp_path / "r", ("-O3", "-DQCC_DWPLANE=0"), isa)
    sanitized = build(model, tmp_path / "s", SANITIZE, isa)
    got = run_c(plane, x, out_size(model))
    assert np.array_equal(got.view(np.uint32), run_c(rows, x, out_size(model)).view(np.uint32))
    assert np.array_equal(got.view(np.uint32), run_c(sanitized, x, out_size(model)).view(np.uint32))
    if mode == "float32":
        want = flat_outputs(model, run_model(model, {"x": x}), len(x))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        return
    results = run_fixed(model, {"x": x}) if mode == "fixed8" else run_affine_int(model, {"x": x})
    assert np.array_equal(got.view(np.uint32), flat_outputs(model, results, len(x)).view(np.uint32))


@pytest.mark.parametrize("mode", ["float32", "int8"])
def test_broadcast_rows_follow_each_operands_strides(tmp_path: Path, mode: str) -> None:
    """Binary ops whose second operand is one value per channel, one scalar, one value per row (a
    strided inner walk) or broadcast along the batch of rows: merged axes, rows per stride pattern;
    the simulator's bits (float: the same single operation per element, so bit equality too)."""
    rng = np.random.default_rng(23)
    g = Graph("bc")
    x = g.add_input("x", TensorType("float32", ("N", 5, 7, 9)))

    def const(name: str, *shape: int) -> Value:
        return g.add_constant(name, rng.uniform(0.5, 1.5, shape).astype(np.float32))

    per_channel = g.add("Mul", x, const("c", 1, 5, 1, 1), name="per_channel")
    scalar = g.add("Add", per_channel, const("s", 1), name="scalar")
    per_row = g.add("Sub", scalar, const("r", 5, 7, 1), name="per_row")
    columns = g.add("Mul", const("k", 1, 1, 9), per_row, name="columns")
    g.outputs = [per_channel, per_row, columns]
    model = Model(g)
    if mode == "int8":
        model = affine(model, {"x": rng.standard_normal((8, 5, 7, 9)).astype(np.float32)}, "int8")
    exe = build(model, tmp_path / "b", ("-O3",))
    text = (tmp_path / "b" / "b.c").read_text()
    assert re.search(r"qcc_bcast_t qcc_p_per_channel = \{2, \{5, 63,", text)
    x_in = rng.standard_normal((2, 5, 7, 9)).astype(np.float32)
    got = run_c(exe, x_in, out_size(model))
    results = run_model(model, {"x": x_in}) if mode == "float32" else run_affine_int(model, {"x": x_in})
    assert np.array_equal(got.view(np.uint32), flat_outputs(model, results, len(x_in)).view(np.uint32))


def small_map_model() -> Model:
    """Fixed-point convolutions on 8x8-ish maps (the digits CNN's sizes) for the plane path: 3x3
    pad 1 (16 -> 16: whole blocks of QCC_FB), asymmetric pads on a 5x3 window, a dilated one, a
    grouped 1x1 with 5 outputs per group (single output channels), an unpadded 3x3 (oh < h) with 20
    outputs (8 + 8 + 4 singles), and a stride-2 layer (the row path)."""
    rng = np.random.default_rng(29)
    g = Graph("small")
    x = g.add_input("x", TensorType("float32", ("N", 4, 8, 7)))

    const = scaled_constants(g, rng)

    c1 = g.add("Conv", x, const("w1", 16, 4, 3, 3), const("b1", 16), name="c3x3", pads=[1, 1, 1, 1])
    r1 = g.add("Relu", c1, name="r1")
    c2 = g.add("Conv", r1, const("w2", 16, 16, 5, 3), const("b2", 16), name="asym", pads=[2, 0, 2, 2])
    c3 = g.add("Conv", r1, const("w3", 8, 16, 3, 3), name="dilated", pads=[2, 2, 2, 2], dilations=[2, 2])
    c4 = g.add("Conv", r1, const("w4", 10, 8, 1, 1), const("b4", 10), name="grouped", group=2)
    c5 = g.add("Conv", c4, const("w5", 20, 10, 3, 3), const("b5", 20), name="valid")
    c6 = g.add("Conv", c2, const("w6", 8, 16, 3, 3), name="strided", strides=[2, 2], pads=[1, 1, 1, 1])
    g.outputs = [c2, c3, c5, c6]
    return Model(g)


def plane_elements(c: int, oh: int, ow: int, kh: int, kw: int, dh: int, dw: int, fxv: int) -> int:
    """What conv_fixed's plane path pads (all input channels): the padded rows of ow + (kw-1)dw
    columns, the positions rounded up to QCC_FXV, the reach of the last tap."""
    pw = ow + (kw - 1) * dw
    return c * (-(-oh * pw // fxv) * fxv + (kh - 1) * dh * pw + (kw - 1) * dw)


PLANE_OFF = {"fixed8": "-DQCC_FXPLANE=0", "fixed16": "-DQCC_FXPLANE=0", "int8-dot8": "-DQCC_A8PLANE=0",
             "uint8-dot8": "-DQCC_A8PLANE=0"}


@pytest.mark.parametrize("mode", list(PLANE_OFF))
def test_small_map_plane_paths_give_the_row_paths_bits(tmp_path: Path, mode: str) -> None:
    """The small-map plane paths: the fixed-point convolution's (native flags, blocks of 32 or 16;
    blocks of 8, sanitized) against its row path (-DQCC_FXPLANE=0) and qcc.sim.fixed's bits
    (nnabla-c-runtime's per-input-channel truncation, done in the same channel order); isa=dot8's
    (tiles of 16 padded positions, by default only with the VNNI intrinsics; its panel interleaved
    by SSE2 unpacks or, -DQCC_NO_INTRINSICS, in C) against its gathering tiles (-DQCC_A8PLANE=0)
    and qcc.sim.affine_int's."""
    rng = np.random.default_rng(31)
    model = small_map_model()
    calib = {"x": rng.standard_normal((8, 4, 8, 7)).astype(np.float32)}
    fixed = mode.startswith("fixed")
    if fixed:
        bits = int(mode[5:])
        annotate_fixed(model, calib, bits, bits, jitter=1, seed=bits)
    else:
        model = affine(model, calib, mode.split("-")[0])
    # every stride-1 layer fits the default planes (4096 elements; dot8: input channels padded to
    # 4, blocks of 16) even in blocks of 32: the plane paths are what the default builds run
    for c, oh, ow, kh, kw, d in ((4, 8, 7, 3, 3, 1), (16, 8, 7, 5, 3, 1), (16, 8, 7, 3, 3, 2), (4, 8, 7, 1, 1, 1),
                                 (12, 6, 5, 3, 3, 1)):
        assert plane_elements(c, oh, ow, kh, kw, d, d, 32) <= 4096
    x = rng.standard_normal((3, 4, 8, 7)).astype(np.float32) * 1.5
    results = run_fixed(model, {"x": x}) if fixed else run_affine_int(model, {"x": x})
    want = flat_outputs(model, results, len(x))
    small = ("-DQCC_FXV=8",) if fixed else ("-DQCC_NO_INTRINSICS", "-DQCC_A8PLANE=4096")
    vnni = () if fixed or not cpu_has_vnni() else VNNI[1:]  # dot8's plane path is on by default with VNNI
    builds = {"plane": (*FLAGS["native"], *vnni, *(() if vnni or fixed else ("-DQCC_A8PLANE=4096",))),
              "plane-small-sanitized": (*SANITIZE, *small),
              "rows": (*FLAGS["native"], PLANE_OFF[mode])}
    isa = "portable" if fixed else "dot8"
    for name, flags in builds.items():
        exe = build(model, tmp_path / name.replace("-", "_"), flags, isa)
        if name == "plane":
            text = (tmp_path / "plane" / "plane.c").read_text()
            assert PLANE_OFF[mode][4:-2] in text and (fixed or "qcc_pack4p(" in text)
        got = run_c(exe, x, out_size(model))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def test_add32_form_is_the_simulators_integer_in_wrapping_uint32() -> None:
    """kernels/add32.py's bounds: its statements run in numpy uint32 (wrapping, as C's would if a bound
    were wrong) on every stored pair give ai.rshift of the 64-bit sum, for random multipliers, zero
    points, shifts and both types; and the form is taken for the usual shifts (the test can fail)."""
    from qcc.backends.c.ctype import CType
    from qcc.backends.c.kernels.add32 import add32_params

    from qcc.ir.types import Affine
    from qcc.sim import affine_int as ai

    rng = np.random.default_rng(5)
    taken = 0
    for trial in range(300):
        op = ("Add", "Sub")[trial % 2]
        ta, tb = (CType(affine=Affine((1.0,), (0,), d)) for d in rng.choice(["int8", "uint8"], 2))
        za, zb = int(rng.integers(ta.lo, ta.hi + 1)), int(rng.integers(tb.lo, tb.hi + 1))
        s = int(rng.integers(0, 63)) if trial % 10 == 0 else int(rng.integers(14, 40))
        ma = int(rng.integers(1 << 30, 1 << 31)) if trial % 3 else int(rng.integers(0, 1 << 31))
        mb = int(rng.integers(0, ma + 1))
        if trial % 4 == 3:
            ma, mb = mb, ma
        zy = int(rng.integers(-128, 256))
        p = add32_params(op, ta, tb, za, zb, ma, mb, s, zy)
        if p is None:
            continue
        taken += 1
        qa = np.arange(ta.lo, ta.hi + 1, dtype=np.int64)[:, None]
        qb = np.arange(tb.lo, tb.hi + 1, dtype=np.int64)[None, :]
        u32 = np.uint32
        ua = (qa - ta.lo).astype(u32)
        ub = ((qb - tb.lo) if op == "Add" else (tb.hi - qb)).astype(u32)
        with np.errstate(over="ignore"):
            pl = ua * u32(p.mal) + ub * u32(p.mbl) + u32(p.cl)
            e = ua * u32(p.mah) + ub * u32(p.mbh) + u32(p.ch) + (pl >> u32(p.k))
            fix = ((e < u32(p.theta)) & ((pl & u32((1 << p.k) - 1)) == 0)).astype(u32)
            r = ((e - fix) >> u32(p.sk)).astype(np.int64) + p.zb
        sign = 1 if op == "Add" else -1
        want = zy + ai.rshift((qa - za) * ma + sign * ((qb - zb) * mb), s)
        assert np.array_equal(r, want), (op, za, zb, ma, mb, s, zy)
    assert taken > 200


@pytest.mark.parametrize("flags", ["native", "tiny-sanitized"])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_residual_adds_requantize_in_32_bits(tmp_path: Path, dtype: str, flags: str) -> None:
    """Affine Add -> Relu (the clamp fused into the Add), Sub, and an Add broadcast per channel on the
    32-bit form; the simulator's bits."""
    rng = np.random.default_rng(31)
    g = Graph("res")
    x = g.add_input("x", TensorType("float32", ("N", 4, 6, 7)))

    const = scaled_constants(g, rng)

    c = g.add("Conv", x, const("w", 4, 4, 3, 3), const("b", 4), name="c", pads=[1, 1, 1, 1])
    r = g.add("Relu", g.add("Add", c, x, name="add"), name="r")
    d = g.add("Sub", x, r, name="sub")
    e = g.add("Add", d, g.add_constant("k", rng.uniform(-2, 2, (1, 4, 1, 1)).astype(np.float32)), name="bc")
    g.outputs = [r, e]
    model = affine(Model(g), {"x": rng.standard_normal((8, 4, 6, 7)).astype(np.float32) * 2}, dtype)
    exe = build(model, tmp_path / "r", FLAGS[flags], "dot8")
    text = (tmp_path / "r" / "r.c").read_text()
    assert text.count("qcc_add32_") >= 3 and "qcc_sub32_" in text and "qcc_add_" not in text
    assert "qcc_clamp_" not in text and "qcc_table_" not in text  # the Relu is the Add's saturation
    x_in = rng.standard_normal((5, 4, 6, 7)).astype(np.float32) * 2.5
    got = run_c(exe, x_in, out_size(model))
    want = flat_outputs(model, run_affine_int(model, {"x": x_in}), len(x_in))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
